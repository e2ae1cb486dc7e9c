"""The Vulkan backend for real, on Mesa lavapipe (slow, vulkan): upstream and patched built for Vulkan in one shared
tree, the batched-transfer test program on two Vulkan devices, and ladders/vulkan.toml byte for byte.

lavapipe is a CPU-type Vulkan device, which ggml uses only when GGML_VK_VISIBLE_DEVICES names it; "0,0" presents
it twice, so that a model split by layer has a cross-device boundary and the second device's host buffer type
belongs to device zero (the rule the batched path must respect). Under .ci/run (GGML_BRIDGE_TEST_REQUIRE_VULKAN=1)
these tests fail rather than skip when a Vulkan piece is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ggml_bridge.experiments import model
from ggml_bridge.experiments.bench import inproc
from ggml_bridge.experiments.ladder import orchestrate
from ggml_bridge.foundations import config, net
from ggml_bridge.foundations.errors import ServeError
from ggml_bridge.runtime import llama_server

from helpers import ladder_options

ROOT = Path(__file__).resolve().parents[2]
TWO_DEVICES = {"GGML_VK_VISIBLE_DEVICES": "0,0"}
#: 68 tokens with the tiny model's vocabulary: with -b 64 -ub 16 a first batch of four ubatches, then one of 4 tokens
MULTI_BATCH_PROMPT = "The quick brown fox jumps over the lazy dog " * 6

pytestmark = [pytest.mark.slow, pytest.mark.vulkan]


def _manifest(result) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(Path(result.manifest_path).read_text())


def test_vulkan_build_upstream_and_patched_in_one_shared_tree(real_vulkan_build) -> None:  # type: ignore[no-untyped-def]
    up, pa = real_vulkan_build["upstream"], real_vulkan_build["patched"]
    mu, mp = _manifest(up), _manifest(pa)
    for m in (mu, mp):
        assert m["backend"] == "vulkan" and "-DGGML_VULKAN=ON" in m["cmake_args"]
        assert "VkLayerSettingEXT" not in json.dumps(m) and m["toolchain"]["vulkan"]["glslc"]
    assert mu["shared_tree"]["tree"] == mp["shared_tree"]["tree"], "one CMake tree for both variants"
    assert mu["patches"] == [] and len(mp["patches"]) >= 4
    assert up.server != pa.server and up.server.read_bytes() != pa.server.read_bytes()
    assert "test-batched-transfers" in pa.binaries and "llama-perplexity" in up.binaries
    # the binaries see the Vulkan device (lavapipe here, named explicitly)
    out = subprocess.run(
        [str(pa.server), "--list-devices"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **TWO_DEVICES},
    )
    listed = out.stdout + out.stderr
    assert "Vulkan0" in listed and "Vulkan1" in listed, listed[-2000:]


def _tiny_model(real_settings, real_tree) -> Path:  # type: ignore[no-untyped-def]
    vocab = Path(real_tree.path) / "models" / model.VOCAB_FILE
    return model.ensure_model(real_settings.cache_dir, "tiny", 1234, vocab)


def _run_program(real_vulkan_build, real_settings, real_tree, tmp_path: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    """test-batched-transfers of the patched Vulkan build with the tiny model, ``args`` and ``env`` added; it must exit
    0 with over 1000 checks passed and none failed. Returns the result and stdout + stderr (also kept in tmp_path)."""
    prog = real_vulkan_build["patched"].binaries["test-batched-transfers"]
    res = subprocess.run(
        [str(prog), "--model", str(_tiny_model(real_settings, real_tree)), *args],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, **env},
    )
    out = res.stdout + res.stderr
    (tmp_path / "test-batched-transfers.log").write_text(out)
    assert res.returncode == 0, out[-4000:]
    summary = re.search(r"^(\d+) passed, (\d+) failed$", res.stdout, re.MULTILINE)
    assert summary and int(summary[1]) > 1000 and summary[2] == "0", out[-2000:]
    return res, out


def test_batched_transfer_program_on_two_vulkan_devices(
    real_vulkan_build, real_settings, real_tree, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """test-batched-transfers (what `ctest -L batched` runs, plus a real model) on lavapipe presented twice: every
    payload and guard byte, batching off vs on, on Vulkan0 (staged through Vulkan's host buffer type) and on
    Vulkan1, whose host buffer type belongs to device zero: there nothing may be counted as a batch, every
    transfer as upstream's own. The model part runs eight times on Vulkan0: graphs that followed one another without
    ggml-vulkan's per-graph recycle crashed lavapipe's queue thread (without the fix 6 of 7 such processes died,
    after 1 to 6 rounds)."""
    res, out = _run_program(real_vulkan_build, real_settings, real_tree, tmp_path, TWO_DEVICES, "--rounds", "8")
    assert "test-batched-transfers: 2 GPU device(s)" in res.stdout
    assert re.search(r"^llama Vulkan0: 8 round\(s\)$", res.stdout, re.MULTILINE), out[-3000:]
    assert re.search(r"^main: Vulkan0, batched transfers available$", res.stdout, re.MULTILINE), out[-3000:]
    assert re.search(
        r"^second-gpu: Vulkan1, batched transfers not available: .*Vulkan1: its pinned host buffer type is pinned "
        r"for Vulkan0",
        res.stdout,
        re.MULTILINE,
    ), out[-3000:]

    def stats(name: str) -> dict[str, int]:
        m = re.search(rf"^{name}: stats: (.*)$", res.stdout, re.MULTILINE)
        assert m, f"no {name} stats line"
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[1])}

    main, second = stats("main"), stats("second-gpu")
    assert main["async_uploads"] > 0 and main["async_downloads"] > 0, main
    assert second["async_uploads"] == second["async_downloads"] == 0 and second["upstream_uploads"] > 0, second
    assert second["sync_uploads"] == second["fallbacks"] == 0 and second["pool"] == 0, second
    # the llama end-to-end part on the first Vulkan device: off and on identical, batching engaged
    assert re.search(r"^llama Vulkan0 logits: .*llama_batched_transfers: stats: .*async_uploads=[1-9]", out, re.M)


def test_vulkan_ladder_on_lavapipe(real_vulkan_build, real_tree, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ladders/vulkan.toml: upstream-Vulkan vs patched-Vulkan with batching off and on, full logits and greedy
    responses identical byte for byte, the model split over two Vulkan devices; the batched mode engaged by its own
    counters (stats line and /metrics), its pools as the device-zero rule says, also under GGML_VK_PERF_LOGGER."""
    a = ladder_options(
        [
            "--ladder",
            str(ROOT / "ladders" / "vulkan.toml"),
            "--report",
            str(tmp_path / "rep"),
            "--vocab",
            str(Path(real_tree.path) / "models" / model.VOCAB_FILE),
            "--bin-dir-patched",
            str(real_vulkan_build["patched"].bin_dir),
            "--bin-dir-upstream",
            str(real_vulkan_build["upstream"].bin_dir),
            "--threads",
            "2",
        ]
    )
    rc = orchestrate.run(a, config.Settings(cache_dir=tmp_path / "cache"))
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    bad = {r["name"]: r["problems"] for r in rep["rungs"] if r["status"] != "pass"}
    assert rc == 0 and not bad, bad
    assert rep["backend"] == "vulkan" and rep["binaries"]["same_build"] is False
    assert len(rep["rungs"]) >= 2
    for r in rep["rungs"]:
        for name in ("off", "batched"):
            c = r["modes"][name]["compare"]
            assert c["logits"]["identical"] and c["logits"]["bytes_compared"] > 100_000, (r["name"], name, c)
            assert c["responses"]["identical"], (r["name"], name, c)
        b = r["modes"]["batched"]["validity"]["batched"]
        assert b["state"] == "engaged" and b["async_uploads"] > 0 and b["metrics_async_uploads"] > 0, b
        for pools in b["pools"].values():
            assert pools["Vulkan0"] == "Vulkan_Host" and pools["Vulkan1"].startswith("none (its pinned host"), pools
        assert all(n == 2 for n in r["modes"]["batched"]["validity"]["devices_used"].values())
    # the perf-logger rung ran ggml-vulkan's timestamp logger (its per-graph table) with batching on: the drain
    logged = (tmp_path / "rep" / "tiny-f16-2dev-perf-logger" / "batched" / "server.log").read_text(errors="replace")
    assert "Vulkan Timings:" in logged and "llama_batched_transfers: stats:" in logged


def test_batched_transfer_program_under_the_vulkan_perf_logger(
    real_vulkan_build, real_settings, real_tree, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """test-batched-transfers with ggml-vulkan's timestamp logger on (GGML_VK_PERF_LOGGER): batching drains its
    uploads before compute, so every case passes, except the pipeline-parallel CPU-computed input, which upstream's
    own path aborts on (see the next test); the program says it skips that one. Before the skip, the program
    aborted there (GGML_ASSERT(ctx->compute_ctx.expired()), on lavapipe and on an H200, Dec 2) with batching off."""
    res, out = _run_program(
        real_vulkan_build,
        real_settings,
        real_tree,
        tmp_path,
        {"GGML_VK_VISIBLE_DEVICES": "0", "GGML_VK_PERF_LOGGER": "1"},
    )
    assert "Vulkan Timings:" in out  # the logger ran
    main = re.search(r"^main: stats: .*\bdrains=(\d+)", res.stdout, re.MULTILINE)
    assert main and int(main[1]) > 0, out[-3000:]  # the drain before compute happened
    assert "pipeline: CPU-computed inputs skipped: with GGML_VK_PERF_LOGGER upstream's own path aborts" in res.stdout
    assert re.search(r"^pipeline: stats: .*async_uploads=[1-9]", res.stdout, re.MULTILINE), out[-3000:]


def test_upstream_aborts_under_the_perf_logger_with_pipeline_parallelism(
    real_vulkan_build, real_settings, real_tree, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Why the program above skips a case: the unpatched llama-perplexity, two Vulkan devices, every layer offloaded
    (pipeline parallelism: the scheduler waits for input events with ggml_backend_event_wait, which opens Vulkan's
    compute context), aborts when GGML_VK_PERF_LOGGER is set. When a rebase brings upstream's fix, this fails: then
    the skip goes."""
    ppl = real_vulkan_build["upstream"].binaries["llama-perplexity"]
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 60))
    argv = [str(ppl), "-m", str(_tiny_model(real_settings, real_tree)), "-f", str(text), "-t", "2"]
    argv += ["-c", "64", "-b", "64", "-ub", "16", "-ngl", "99", "-dev", "Vulkan0,Vulkan1"]
    env = {**os.environ, **TWO_DEVICES, "GGML_VK_PERF_LOGGER": "1"}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "GGML_ASSERT(ctx->compute_ctx.expired())" in out, out[-3000:]
    # and the same run without the logger completes: the abort is the logger's
    clean = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**os.environ, **TWO_DEVICES})
    assert clean.returncode == 0 and "Final estimate: PPL" in clean.stdout + clean.stderr, clean.stderr[-3000:]


def _multi_batch_completion(binary: Path, model_path: Path, batched: str) -> tuple[dict, dict[str, int]]:
    """One fresh llama-server on Vulkan0 (the tiny model's layers on lavapipe, its output layer on the CPU), the
    multi-batch prompt, 24 greedy tokens with their top-4 probabilities; returns the answer and /metrics."""
    args = ["-m", str(model_path), "--port", str(net.free_port()), "-c", "256", "-t", "2", "--no-webui"]
    args += ["-ngl", "2", "-b", "64", "-ub", "16", "--metrics"]
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0", "LLAMA_BATCHED_TRANSFERS": batched}
    with llama_server.Server(binary, args, env=env, startup_timeout=300) as srv:
        payload = {"prompt": MULTI_BATCH_PROMPT, "n_predict": 24, "temperature": 0, "seed": 1}
        answer = json.loads(srv.post("/completion", {**payload, "cache_prompt": False, "n_probs": 4}, timeout=300))
        metrics = srv.metrics() or {}
    return answer, metrics


def test_batched_server_answers_a_prompt_of_several_batches(real_vulkan_build, real_settings, real_tree) -> None:  # type: ignore[no-untyped-def]
    """The defect of Dec 2: the patched Vulkan llama-server with batching on died (SIGSEGV in lavapipe's queue
    thread) in 2 of 3 processes on this request: a prompt of two batches (ubatches 16, 16, 16, 16, then 4) where
    the last one needs pipelines ggml-vulkan compiles on first use, while the staged uploads it had just submitted
    were still executing. Six fresh processes must each answer, with the completion and top-4 probabilities of
    batching off and of the unpatched build, byte for byte, with batched uploads engaged."""
    tiny = _tiny_model(real_settings, real_tree)
    reference, _ = _multi_batch_completion(real_vulkan_build["upstream"].binaries["llama-server"], tiny, "0")
    off, _ = _multi_batch_completion(real_vulkan_build["patched"].binaries["llama-server"], tiny, "0")
    assert reference["tokens_predicted"] == 24 and off["content"] == reference["content"]
    assert off["completion_probabilities"] == reference["completion_probabilities"]
    died = []
    for run in range(6):
        try:
            on, metrics = _multi_batch_completion(real_vulkan_build["patched"].binaries["llama-server"], tiny, "1")
        except ServeError as e:
            died.append(f"process {run + 1}: {e}")
            continue
        assert on["content"] == reference["content"], (run, on["content"], reference["content"])
        assert on["completion_probabilities"] == reference["completion_probabilities"], run
        assert metrics.get("batched_async_uploads_total", 0) > 0, metrics
    assert not died, "\n".join(died)


def _bench_program(prog: Path, model_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """test-batched-transfers --bench on the tiny model: 2 rounds, prompts of 16 and 64 tokens in ubatches of 16, 2
    decodes each, 4 generated tokens."""
    argv = [str(prog), "--model", str(model_path), "--bench", "--rounds", "2", "--reps", "2", "--prompts", "16,64"]
    argv += ["--n-gen", "4", "--ubatch", "16", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **env})


def test_the_in_process_bench_times_both_selectors_on_a_vulkan_device(
    real_vulkan_build, real_settings, real_tree
) -> None:  # type: ignore[no-untyped-def]
    """test-batched-transfers --bench on lavapipe: every round times a context with batching off and one with it on,
    in alternating order, batching enabled in the second kind only; a CSV line per round, selector and measure, and
    the table of medians and per-round speed ratios over both rounds."""
    prog = real_vulkan_build["patched"].binaries["test-batched-transfers"]
    res = _bench_program(prog, _tiny_model(real_settings, real_tree), {"GGML_VK_VISIBLE_DEVICES": "0"})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and re.search(r"^\d+ passed, 0 failed$", res.stdout, re.MULTILINE), out[-3000:]
    measures = ["context", "pp16 #1", "pp16 #2", "pp64 #1", "pp64 #2", "tg4"]
    rows = re.findall(r"^bench,(\d),([01]),([^,]+),([\d.]+)$", res.stdout, re.MULTILINE)
    assert sorted((r, s, m) for r, s, m, _ in rows) == sorted(
        (str(r), str(s), m) for r in range(2) for s in range(2) for m in measures
    ), out[-3000:]
    order = [(r, s) for r, s, m, _ in rows if m == "context"]
    assert order == [("0", "0"), ("0", "1"), ("1", "1"), ("1", "0")]  # off first in even rounds, on first in odd
    assert re.search(r"^bench context 1: .*llama_batched_transfers: enabled", res.stdout, re.MULTILINE), out[-3000:]
    assert "bench context 0:" not in res.stdout
    table = dict(re.findall(r"^\| (context|pp\d+ #\d|tg\d+) \| (.*) \|$", res.stdout, re.MULTILINE))
    assert list(table) == measures and all(r.endswith("| 2") for r in table.values()), res.stdout[-2000:]
    # what `ggml-bridge bench --measure inproc` reads of it: per case and test, one figure per round
    samples = inproc.samples(res.stdout, "batched", "off", 0, 16)
    assert sorted((s.case, s.test, len(s.values)) for s in samples) == sorted(
        (c, t, 2)
        for c in ("batched", "off")
        for t in ["context@inproc", "pp16/ub16@inproc1", "pp16/ub16@inproc2", "pp64/ub16@inproc1"]
        + ["pp64/ub16@inproc2", "tg4@inproc"]
    )
