"""ladder on the real binaries (slow; parsing, rules and fake-tool ladders are in tests/unit/experiments/test_ladder.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ggml_bridge.experiments import model
from ggml_bridge.experiments.ladder import orchestrate
from ggml_bridge.foundations import config

from helpers import ladder_options, real_bin_dir, real_vocab, write_ladder

ROOT = Path(__file__).resolve().parents[2]


# --- the real binaries --------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_cpu_rung(tmp_path):
    bd = real_bin_dir()
    vocab = real_vocab()
    if bd is None or vocab is None or not (bd / "llama-perplexity").is_file():
        pytest.skip("no llama-server/llama-perplexity build (set GGML_BRIDGE_TEST_BIN_DIR) or no vocab GGUF")
    body = """
[[rung]]
name = "real-tiny"
shape = "tiny"
modes = ["upstream", "off"]
reference = "upstream"
ubatch = 16
batch = 64
ppl_ctx = 64
n_predict = 4
"""
    lf = write_ladder(tmp_path / "l.toml", body)
    a = ladder_options(
        [
            "--ladder",
            str(lf),
            "--report",
            str(tmp_path / "rep"),
            "--vocab",
            str(vocab),
            "--bin-dir-patched",
            str(bd),
            "--bin-dir-upstream",
            str(bd),
            "--allow-same-build",
            "--threads",
            "2",
        ]
    )
    rc = orchestrate.run(a, config.Settings(cache_dir=tmp_path / "cache"))
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    r = rep["rungs"][0]
    assert rc == 0, r["problems"]
    assert rep["binaries"]["same_build"] is True
    c = r["modes"]["off"]["compare"]
    assert c["logits"]["identical"] and c["logits"]["bytes_compared"] > 100_000
    assert c["responses"]["identical"]
    resp = (tmp_path / "rep" / "real-tiny" / "upstream" / "responses.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in resp]
    assert max(x["tokens_evaluated"] for x in recs) > 16  # a prompt longer than the ubatch
    assert all(x["tokens_predicted"] == 4 for x in recs)


@pytest.mark.slow
def test_real_cpu_ladder_upstream_vs_patched(real_build, real_tree, tmp_path):  # type: ignore[no-untyped-def]
    """The shipped CPU ladder (the one CI promises) on the session's real builds: the unpatched upstream build
    against the patched build with every selector 0, byte for byte, every rung."""
    patched, upstream = real_build("patched"), real_build("upstream")
    assert patched.server != upstream.server
    a = ladder_options(
        [
            "--ladder",
            str(ROOT / "ladders" / "cpu.toml"),
            "--report",
            str(tmp_path / "rep"),
            "--vocab",
            str(Path(real_tree.path) / "models" / model.VOCAB_FILE),
            "--bin-dir-patched",
            str(patched.bin_dir),
            "--bin-dir-upstream",
            str(upstream.bin_dir),
        ]
    )
    rc = orchestrate.run(a, config.Settings(cache_dir=tmp_path / "cache"))
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["binaries"]["same_build"] is False
    bad = {r["name"]: r["problems"] for r in rep["rungs"] if r["status"] != "pass"}
    assert rc == 0 and not bad, bad
    assert len(rep["rungs"]) >= 6
    for r in rep["rungs"]:
        c = r["modes"]["rpc-off" if r["split_mode"] == "tensor" else "off"]["compare"]
        assert c["logits"]["identical"] and c["responses"]["identical"]
    # -sm tensor over two CPU rpc-servers: the meta backend over both, its butterfly said (no CUDA communicator)
    (tensor,) = [r for r in rep["rungs"] if r["split_mode"] == "tensor"]
    for name in ("rpc-upstream", "rpc-off"):
        v = tensor["modes"][name]["validity"]
        assert set(v["devices_used"].values()) == {2}, v
        assert {p["expected"] for p in v["allreduce"].values()} == {"butterfly"}
    # the butterfly's exchanges between the two servers: GET_TENSOR into the front, SET_TENSOR to the other (patch
    # 0006's counters: the patched servers only)
    servers = tensor["modes"]["rpc-off"]["validity"]["rpc"].values()
    assert len(servers) == 2 and all(s["counters"]["rpc_get_tensor"] > 0 for s in servers)


def _gpu_count() -> int:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("rung_name", ["2gpu-tiny-ub1", "2gpu-small-ub512"])
def test_real_cuda_rungs(tmp_path, rung_name):
    """Two rungs of the shipped CUDA ladder on real GPUs. Needs GGML_BRIDGE_TEST_CUDA_PATCHED and
    GGML_BRIDGE_TEST_CUDA_UPSTREAM (bin dirs with llama-server and llama-perplexity) and 2 GPUs."""
    pd, ud = os.environ.get("GGML_BRIDGE_TEST_CUDA_PATCHED"), os.environ.get("GGML_BRIDGE_TEST_CUDA_UPSTREAM")
    vocab = os.environ.get("GGML_BRIDGE_VOCAB") or (str(real_vocab()) if real_vocab() else None)
    if not (pd and ud and vocab):
        pytest.skip("set GGML_BRIDGE_TEST_CUDA_PATCHED, GGML_BRIDGE_TEST_CUDA_UPSTREAM and GGML_BRIDGE_VOCAB")
    if _gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    a = ladder_options(
        [
            "--ladder",
            str(ROOT / "ladders" / "cuda.toml"),
            "--rung",
            rung_name,
            "--report",
            str(tmp_path / "rep"),
            "--vocab",
            vocab,
            "--bin-dir-patched",
            pd,
            "--bin-dir-upstream",
            ud,
        ]
    )
    rc = orchestrate.run(a, config.Settings(cache_dir=tmp_path / "cache"))
    r = json.loads((tmp_path / "rep" / "report.json").read_text())["rungs"][0]
    assert rc == 0, r["problems"]
    force = r["modes"]["bridge-force"]["validity"]["bridge"]
    assert force["state"] == "engaged" and force["boundaries"] > 0
    assert all(m.get("compare", {}).get("logits", {}).get("identical", True) for m in r["modes"].values())
