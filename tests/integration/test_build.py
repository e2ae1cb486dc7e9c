"""Build tests on the real pinned llama.cpp (slow; the fake llama.cpp ones are in tests/unit/distribution/test_build.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ggml_bridge.distribution.builder import locate, single, steps
from ggml_bridge.foundations import config
from ggml_bridge.upstream import patch as patchmod

# --------------------------------------------------------------------------------------------- slow: the real thing


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}


@pytest.mark.slow
def test_real_cpu_build_serves_a_request(
    real_build,
    real_settings: config.Settings,
    real_tree,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    res = real_build("patched")
    assert {"llama-server", "llama-bench", "llama-perplexity"} <= set(res.binaries)
    m = json.loads(res.manifest_path.read_text())
    assert m["upstream"]["commit"] == real_tree.commit and m["series_hash"]
    assert [p["name"] for p in m["patches"]] == patchmod.read_series(real_settings.patches_dir).names
    monkeypatch.setattr(steps, "configure", lambda *a: pytest.fail("configured again"))
    assert single.ensure(real_settings, "patched").up_to_date
    assert locate.find_binary(real_settings, "llama-server", "patched", "cpu") == res.server

    model = pytest.importorskip(
        "ggml_bridge.experiments.model", reason="ggml_bridge.experiments.model (write_model) is not written yet"
    )
    vocab = model.find_vocab(real_tree.path)
    assert vocab is not None, "the upstream tree ships models/ggml-vocab-llama-spm.gguf"
    gguf = model.ensure_model(real_settings.cache_dir, "tiny", 1, vocab)
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [res.server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-t", "2", "-np", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if _http(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.5)
        status, out = _http(
            f"http://127.0.0.1:{port}/completion", {"prompt": "Hello", "n_predict": 4, "temperature": 0, "seed": 1}
        )
        assert status == 200 and isinstance(out.get("content"), str)
        assert out.get("tokens_predicted", 0) >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_real_upstream_build(real_build, real_settings: config.Settings) -> None:  # type: ignore[no-untyped-def]
    res = real_build("upstream")
    m = json.loads(res.manifest_path.read_text())
    assert m["patches"] == [] and m["series_hash"] is None
    assert "-DGGML_CUDA_MAPPED_HOST_BRIDGE=ON" not in m["cmake_args"]
    assert res.server != real_build("patched").server
    assert locate.find_binary(real_settings, "llama-server", "upstream", "cpu") == res.server


@pytest.mark.slow
@pytest.mark.gpu
def test_real_cuda_build_is_picked_by_auto(real_settings: config.Settings, real_tree) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    s = dataclasses.replace(real_settings, build=dataclasses.replace(real_settings.build, backend="auto"))
    res = single.ensure(s, "patched")
    assert res.backend == "cuda"
    m = json.loads(res.manifest_path.read_text())
    assert "-DGGML_CUDA=ON" in m["cmake_args"] and "nvcc" in m["toolchain"]
    devices = subprocess.run([res.server, "--list-devices"], capture_output=True, text=True, timeout=120)
    assert "CUDA0" in devices.stdout + devices.stderr


@pytest.mark.slow
def test_the_in_process_bench_fails_where_batching_cannot_engage(real_build, real_settings, real_tree) -> None:  # type: ignore[no-untyped-def]
    """test-batched-transfers --bench on the CPU build: the CPU backend has no pinned pool, so the contexts asking for
    batching run upstream's path; a bench that did not exercise the mechanism must fail, not print ratios as if it
    had. --control (both contexts off, the A/A run) asks for no batching, so there it passes, with a table of the
    second context against the first and no batched-transfers line. Bad arguments exit 2 with the usage (--rounds,
    which also repeats the check's model part, needs a model)."""
    from ggml_bridge.experiments import model

    prog = real_build("patched").binaries["test-batched-transfers"]
    gguf = model.ensure_model(real_settings.cache_dir, "tiny", 1, model.find_vocab(real_tree.path))
    argv = [str(prog), "--model", str(gguf), "--bench", "--rounds", "1", "--prompts", "16", "--n-gen", "2"]
    res = subprocess.run([*argv, "--ubatch", "16"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "bench round 0, context 1: batching was not enabled" in res.stderr, res.stderr
    res = subprocess.run([*argv, "--ubatch", "16", "--control"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "bench control: both contexts of every round with batching off" in res.stdout, (
        res.stdout + res.stderr
    )
    assert "| measure | off ms (median) | off again ms (median) | speed off again / off: median |" in res.stdout
    assert len(re.findall(r"^bench,0,[01],pp16 #1,", res.stdout, re.MULTILINE)) == 2 and "batched" not in res.stdout
    for bad in (["--prompts", "16,x"], ["--rounds", "0"], ["--ubatch"]):
        res = subprocess.run([*argv, *bad], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and ("usage: " in res.stderr or "--prompts as sizes" in res.stderr), res.stderr
    res = subprocess.run([str(prog), "--model", str(gguf), "--control"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--control: only with --bench" in res.stderr, res.stderr
    res = subprocess.run([str(prog), "--rounds", "2"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--rounds: only with --model" in res.stderr, res.stderr


@pytest.mark.slow
def test_the_test_only_baseline_applies_to_the_pinned_tree(real_settings: config.Settings, real_tree) -> None:  # type: ignore[no-untyped-def]
    """patches/baseline/nopeer-virtual (the upstream-nopeer-virtual variant, never the series) applies to the pinned
    tree with git am -3, as the build applies it, and changes ggml-cuda.cu only."""
    from ggml_bridge.runtime import modes
    from ggml_bridge.upstream import patch as patchmod

    v = modes.VARIANTS[modes.UPSTREAM_NOPEER_VIRTUAL]
    assert v.test_patches is not None
    series = patchmod.read_series(real_settings.patches_dir / v.test_patches)
    report = patchmod.check_series(real_settings, real_tree, series)
    assert report.ok, report.render()
    text = series.patches[0].path.read_text()
    assert re.findall(r"^diff --git a/(\S+)", text, re.M) == ["ggml/src/ggml-cuda/ggml-cuda.cu"]
    assert "GGML_CUDA_NO_PEER_COPY" in text and "test-only" in text.lower()
