"""serve: the launcher against the real llama-server (slow; the fake one is in tests/unit/runtime/test_serve.py)."""

from __future__ import annotations

import pytest

from ggml_bridge.foundations.errors import ServeError
from ggml_bridge.runtime import llama_server, logparse, modes

from helpers import busy_port, real_bin_dir, real_vocab

# --- the real llama-server ----------------------------------------------------------------------------


def _real_tiny(tmp_path):
    """The real llama-server's folder and a tiny random-weight model (skips without a build or a vocab)."""
    from ggml_bridge.experiments import model

    bd, vocab = real_bin_dir(), real_vocab()
    if bd is None or vocab is None:
        pytest.skip("no llama-server build (set GGML_BRIDGE_TEST_BIN_DIR) or no vocab GGUF")
    return bd, model.ensure_model(tmp_path, "tiny", 1, vocab)


@pytest.mark.slow
def test_real_server_tiny_model(tmp_path):
    bd, m = _real_tiny(tmp_path)
    port = llama_server.free_port()
    with llama_server.Server(
        bd / "llama-server",
        ["-m", str(m), "--port", str(port), "-c", "256", "-np", "1", "-t", "2"],
        env=modes.selector_env("off", "off"),
        startup_timeout=120,
    ) as s:
        import json

        a = json.loads(
            s.post(
                "/completion",
                {"prompt": "the city of", "n_predict": 6, "temperature": 0, "n_probs": 3, "ignore_eos": True},
            )
        )
        b = json.loads(
            s.post(
                "/completion",
                {
                    "prompt": "the city of",
                    "n_predict": 6,
                    "temperature": 0,
                    "n_probs": 3,
                    "ignore_eos": True,
                    "cache_prompt": False,
                },
            )
        )
    assert a["tokens_predicted"] == 6 and a["content"] == b["content"]
    assert all(-30 < p["logprob"] < 0 for p in a["completion_probabilities"])
    assert s.proc.returncode == 0

    # port already in use, with the real server's own words
    sock, busy = busy_port()
    try:
        with pytest.raises(ServeError, match=f"port {busy}"):
            llama_server.Server(bd / "llama-server", ["-m", str(m), "--port", str(busy)], startup_timeout=60).start()
    finally:
        sock.close()


@pytest.mark.slow
def test_real_server_metrics_grow(tmp_path):
    """patch 0005: llama-server --metrics exports batching's process-wide counters, live, as they grow."""
    bd, m = _real_tiny(tmp_path)
    port = llama_server.free_port()
    with llama_server.Server(
        bd / "llama-server",
        ["-m", str(m), "--port", str(port), "-c", "256", "-np", "1", "-t", "2", "--metrics"],
        env=modes.selector_env("off", "on"),
        startup_timeout=120,
    ) as s:
        before = s.metrics()
        s.post("/completion", {"prompt": "the city of", "n_predict": 8, "temperature": 0, "ignore_eos": True})
        after = s.metrics()
    # every counter of the stats line, the rule per split's included
    names = logparse.BATCHED_STATS_KEYS + logparse.BATCHED_STATS_SPLIT_KEYS
    assert before is not None and after is not None
    assert sorted(after) == sorted(f"batched_{n}_total" for n in names), after

    # every generated token is a graph of one token, counted once as begun (graphs); on the CPU nothing reaches a
    # device, so nothing is counted as an async transfer
    assert after["batched_graphs_total"] >= before["batched_graphs_total"] + 7
    assert after["batched_async_uploads_total"] == 0 and after["batched_async_downloads_total"] == 0
