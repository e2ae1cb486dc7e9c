"""The embedded web UI in a real browser: Debian's headless chromium, driven by selenium through chromedriver,
opens the page `ggml-bridge serve` serves for a random-weight model, sends a chat message and waits for the
streamed reply. The screenshot goes to $GGML_BRIDGE_TEST_REPORT_DIR (default: test-reports/ of the checkout)."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_serve import real_bin_dir, real_vocab

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MESSAGE = "Hello from the ggml-bridge browser test"


def report_dir() -> Path:
    d = Path(os.environ.get("GGML_BRIDGE_TEST_REPORT_DIR") or ROOT / "test-reports")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def served_ui(tmp_path: Path):  # type: ignore[no-untyped-def]
    """`ggml-bridge serve` (a subprocess, as a user runs it) on a tiny random-weight model; yields its URL."""
    from ggml_bridge import model, serve

    bd, vocab = real_bin_dir(), real_vocab()
    if bd is None or vocab is None:
        pytest.skip("no llama-server build (set GGML_BRIDGE_TEST_BIN_DIR) or no vocab GGUF")
    gguf = model.ensure_model(tmp_path, "tiny", 1, vocab)
    port = serve.free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ggml_bridge", "serve", "--server", str(bd / "llama-server"),
                             "--", "-m", str(gguf), "--port", str(port), "-c", "512", "-np", "1", "-t", "2",
                             "-n", "24"],
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once the server is ready and checked
        assert url.startswith("http://"), (tmp_path / "serve.log").read_text()[-3000:]
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
@pytest.mark.xfail(strict=False, reason="NOT DONE: on 30 Nov selenium did not find the chat input "
                   "(.chat-form-input-rich) within 60 s although the screenshot shows the UI loaded with the model")
def test_web_ui_loads_in_headless_chromium(served_ui: str, tmp_path: Path) -> None:
    _drive(served_ui, tmp_path, chat=False)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
@pytest.mark.xfail(strict=False, reason="NOT DONE: text typed by chromedriver into the UI's contenteditable chat input does not "
                   "reach the app yet (seen 30 Nov: the box stays empty); the chat round trip is not proven")
def test_web_ui_chat_in_headless_chromium(served_ui: str, tmp_path: Path) -> None:
    _drive(served_ui, tmp_path, chat=True)


def _drive(served_ui: str, tmp_path: Path, *, chat: bool) -> None:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    # the embedded assets are gzip-compressed; the server refuses clients that do not accept gzip (415)
    req = urllib.request.Request(served_ui + "/", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
        ctype = r.headers.get("Content-Type", "")
        page = (gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body).decode(errors="replace")
    assert "text/html" in ctype and "<script" in page and len(page) > 1000, \
        f"not the web UI at {served_ui}/ ({ctype}, {len(page)} bytes): {page[:300]}"

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=opts)
    shot = report_dir() / ("web-ui-chat.png" if chat else "web-ui-loaded.png")
    try:
        driver.get(served_ui + "/")
        wait = WebDriverWait(driver, 60, poll_frequency=0.5)
        box = wait.until(lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, ".chat-form-input-rich[role=textbox]")),
                                        None))
        time.sleep(2)  # the app hydrates after the first paint
        model_name = driver.execute_script("return document.body.innerText")
        if not chat:
            driver.save_screenshot(str(shot))
            assert "tiny-s1-" in model_name, f"the UI does not show the served model: {model_name[:500]!r}"
            print(f"screenshot: {shot}")
            return
        ActionChains(driver).move_to_element(box).click().send_keys(MESSAGE).perform()
        wait.until(lambda d: MESSAGE in box.text)
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        user = wait.until(lambda d: [e for e in d.find_elements(By.CSS_SELECTOR,
                                                                 '[aria-label="User message with actions"]')
                                     if MESSAGE in e.text])
        assert user

        def reply(d):  # type: ignore[no-untyped-def]
            msgs = d.find_elements(By.CSS_SELECTOR, '[aria-label="Assistant message with actions"]')
            text = msgs[-1].text.strip() if msgs else ""
            return text or None

        first = wait.until(reply)
        time.sleep(3)  # let the stream finish (-n 24 tokens)
        final = reply(driver) or ""
        driver.save_screenshot(str(shot))
        print(f"screenshot: {shot}\nreply: {final[:200]!r}")
        assert first and final, "no streamed reply in the page"
        assert MESSAGE not in final
    except Exception:
        driver.save_screenshot(str(shot))
        print(f"screenshot (failure): {shot}")
        raise
    finally:
        driver.quit()
