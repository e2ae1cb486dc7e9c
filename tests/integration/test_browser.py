"""The embedded web UI in a real browser: Debian's headless chromium, driven by selenium through chromedriver,
opens the page `ggml-bridge serve` serves for a random-weight model, sends a chat message and waits for the
streamed reply. The screenshot goes to $GGML_BRIDGE_TEST_REPORT_DIR (default: test-reports/ of the checkout).

What the test reads (ChatForm/ChatFormInput in the tree's tools/ui): the chat input is a plain <textarea> by
default (a contenteditable ChatFormInputRich only when the user turns rich input on), inside
form.conversation-chat-form; the reply is the .markdown-content of the last [aria-label="Assistant message with
actions"], whose info line shows the model and "N tokens" from the server's timings. chromedriver types into it with
real key events and sends with Enter, as a user does."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from helpers import real_bin_dir, real_vocab

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MESSAGE = "Hello from the ggml-bridge browser test"
FORM = "form.conversation-chat-form"
INPUT = f"{FORM} textarea, {FORM} [role=textbox][contenteditable=true]"
USER_MSG = '[aria-label="User message with actions"]'
ASSISTANT_MSG = '[aria-label="Assistant message with actions"]'
N_PREDICT = 24
TOKENS = re.compile(r"\b(\d+) tokens\b")  # the reply's info line: tokens the server predicted


def report_dir() -> Path:
    d = Path(os.environ.get("GGML_BRIDGE_TEST_REPORT_DIR") or ROOT / "test-reports")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def served_ui(tmp_path: Path):  # type: ignore[no-untyped-def]
    """`ggml-bridge serve` (a subprocess, as a user runs it) on a tiny random-weight model; yields (URL, model
    file). The build is the session's (conftest's real_build through GGML_BRIDGE_TEST_BIN_DIR), not a new one."""
    from ggml_bridge.experiments import model
    from ggml_bridge.runtime import llama_server

    bd, vocab = real_bin_dir(), real_vocab()
    if bd is None or vocab is None:
        pytest.skip("no llama-server build (set GGML_BRIDGE_TEST_BIN_DIR) or no vocab GGUF")
    gguf = model.ensure_model(tmp_path, "tiny", 1, vocab)
    port = llama_server.free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ggml_bridge",
            "serve",
            "--server",
            str(bd / "llama-server"),
            "--",
            "-m",
            str(gguf),
            "--port",
            str(port),
            "-c",
            "512",
            "-np",
            "1",
            "-t",
            "2",
            "-n",
            str(N_PREDICT),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once the server is ready and checked
        assert url.startswith("http://"), (tmp_path / "serve.log").read_text()[-3000:]
        yield url, gguf
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def fetch_page(url: str) -> tuple[int, str, str]:
    """(status, Content-Type, HTML) of the root page; the embedded assets are gzip-only (the server answers 415 to
    a client that does not accept gzip). A build without the UI answers 404."""
    req = urllib.request.Request(url + "/", headers={"Accept-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, body, headers = r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        status, body, headers = e.code, e.read(), e.headers
    page = gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body
    return status, headers.get("Content-Type", ""), page.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
def test_web_ui_chat_in_headless_chromium(
    served_ui: tuple[str, Path], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, gguf = served_ui
    status, ctype, page = fetch_page(url)
    assert status == 200 and "text/html" in ctype and "<script" in page and len(page) > 1000, (
        f"not the web UI at {url}/ (HTTP {status}, {ctype}, {len(page)} bytes): {page[:300]!r}"
    )

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=opts)
    shot = report_dir() / "web-ui-chat.png"
    step = "open the page"
    try:
        driver.get(url + "/")
        # the reply re-renders while it streams: an element read a moment ago may be gone
        wait = WebDriverWait(driver, 90, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,))

        step = f"find the chat input ({INPUT})"
        box = wait.until(lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, INPUT)), None))
        step = "see the served model's name in the UI"
        wait.until(lambda d: gguf.stem in d.execute_script("return document.body.innerText"))

        step = "type the message"
        box.click()
        box.send_keys(MESSAGE)
        wait.until(lambda d: MESSAGE in d.execute_script("return arguments[0].value ?? arguments[0].innerText", box))
        # the app took the value: its send button (disabled while the input is empty) is enabled
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{FORM} button[type=submit]:not([disabled])"))

        step = "send it (Enter)"
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: any(MESSAGE in e.text for e in d.find_elements(By.CSS_SELECTOR, USER_MSG)))

        step = "wait for the streamed reply"
        states: list[str] = []  # what the page showed while the answer was in flight

        def finished(d):  # type: ignore[no-untyped-def]
            msgs = d.find_elements(By.CSS_SELECTOR, ASSISTANT_MSG)
            text = msgs[-1].find_elements(By.CSS_SELECTOR, ".markdown-content") if msgs else []
            reply = text[0].text.strip() if text else ""
            generating = bool(
                d.find_elements(
                    By.XPATH, "//form[contains(@class,'conversation-chat-form')]//button[.//span[text()='Stop']]"
                )
            )
            state = f"{'generating' if generating else 'idle'}: {reply}"
            if not states or states[-1] != state:
                states.append(state)
            stats = TOKENS.search(msgs[-1].text) if msgs else None
            return (reply, int(stats.group(1))) if reply and stats and not generating else None

        reply, tokens = wait.until(finished)
        step = "check the reply"
        driver.save_screenshot(str(shot))
        record_property("screenshot", str(shot))
        print(f"screenshot: {shot}\nreply ({tokens} tokens): {reply[:300]!r}\nstates seen: {len(states)}")
        assert 1 <= tokens <= N_PREDICT, f"the UI reports {tokens} tokens; the server was started with -n {N_PREDICT}"
        assert MESSAGE not in reply, f"the reply echoes the user message, not the model: {reply[:300]!r}"
    except (TimeoutException, AssertionError) as e:
        driver.save_screenshot(str(shot))
        body = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
        record_property("screenshot", str(shot))
        raise AssertionError(f"web UI at {url}: could not {step}; screenshot {shot}; page text: {body[:1500]!r}") from e
    finally:
        driver.quit()
