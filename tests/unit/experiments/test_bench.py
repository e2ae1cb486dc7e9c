"""ggml-bridge bench against fake llama-bench / test-mapped-host-bridge programs: interleaving, statistics,
ratios, engagement proof and report files. The real thing runs on GPU machines (results/2026-11-30-h200x2-bench.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from ggml_bridge.experiments.bench import orchestrate, running, stats
from ggml_bridge.experiments.bench import report as bench_report
from ggml_bridge.experiments.bench.options import BenchOptions, Cpus, cpu_list
from ggml_bridge.experiments.bench.results import Report
from ggml_bridge.experiments.bench.suite import Suite
from ggml_bridge.foundations import flags
from ggml_bridge.foundations.errors import BenchError, UsageError
from ggml_bridge.foundations.flags import BadValue

from helpers import FAKE_SMI, write_exe
from helpers import bench_args as _args


@pytest.fixture
def variants(two_gpu_bench):  # type: ignore[no-untyped-def]
    """The fake variants of ``two_gpu_bench``."""
    return two_gpu_bench.variants


@pytest.mark.plots
def test_interleaved_rounds_ratios_and_report(variants, two_gpu_bench, tmp_path):
    report_dir = tmp_path / "report"
    args = two_gpu_bench.args(report_dir, rounds=3, reps=3)
    assert orchestrate.bench(args, two_gpu_bench.settings) == 0

    order = two_gpu_bench.order.read_text().splitlines()
    # six cases in the multi-gpu suite, three rounds, each round rotated by one
    assert len(order) == 18
    first = [line.split()[0] + line.split()[1] for line in order]
    assert first[0:6] != first[6:12] and sorted(first[0:6]) == sorted(first[6:12])
    assert first[6:12] == first[1:6] + first[0:1]

    rep = two_gpu_bench.read(report_dir)
    assert rep["not_engaged"] == [] and rep["failed"] == []
    s = rep["summary"]
    assert s["upstream-p2p"]["pp4096/ub512"]["median"] == pytest.approx(100.0)
    assert s["upstream-nopeer"]["pp4096/ub4096"]["median"] == pytest.approx(50.0)
    assert s["bridge"]["pp4096/ub512"]["n"] == 9  # 3 rounds x 3 samples
    r = rep["ratios"]
    assert r["upstream-p2p"]["bridge"]["pp4096/ub512"]["ratio"] == pytest.approx(0.97)
    assert r["upstream-p2p"]["bridge"]["pp4096/ub512"]["noise"] is False
    assert r["upstream-nopeer"]["bridge"]["pp4096/ub512"]["ratio"] == pytest.approx(97.0 / 50.0)
    # off (99) vs p2p (100) with IQR 0.25 each: 1.0 apart is outside the spreads
    assert r["upstream-p2p"]["off"]["tg128"]["ratio"] == pytest.approx(0.99)
    # engagement proof is the last (cumulative) stats line
    bridge_case = next(c for c in rep["cases"] if c["name"] == "bridge")
    assert "boundaries=20" in bridge_case["engagement"]
    # microbenchmark rows, with the P2P run labelled separately
    paths = {m["path"] for m in rep["microbench"]}
    assert paths == {"bridge*", "peer", "peer-p2p", "stream@8192K", "d2h", "h2d"}
    md = (report_dir / "bench.md").read_text()
    assert (
        "| pp4096/ub512 |" in md
        and "bridge 0.970 (paired 0.970 [0.970, 0.970])" in md
        and "Boundary copy throughput" in md
    )
    assert r["upstream-p2p"]["bridge"]["pp4096/ub512"]["paired"] == pytest.approx(0.97)
    assert r["upstream-p2p"]["bridge"]["pp4096/ub512"]["paired_rounds"] == 3
    assert r["upstream-p2p"]["bridge"]["pp4096/ub512"]["paired_ci95"] == pytest.approx([0.97, 0.97])
    assert (report_dir / "throughput.png").stat().st_size > 1000
    assert (report_dir / "microbench.png").stat().st_size > 1000


def _quick(two_gpu_bench, report, rounds=1, reps=1, **kw):  # type: ignore[no-untyped-def]
    """The bench's arguments for the fake variants and model: ``rounds`` x ``reps``, no microbenchmark, ``kw`` set."""
    return two_gpu_bench.args(report, rounds=rounds, reps=reps, microbench=False, **kw)


def test_not_engaged_bridge_fails_and_is_reported(variants, two_gpu_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NO_ENGAGE", "1")
    report_dir = tmp_path / "r"
    args = _quick(two_gpu_bench, report_dir, cases=("upstream-p2p", "bridge"))
    with pytest.raises(BenchError, match="did not engage"):
        orchestrate.bench(args, two_gpu_bench.settings)
    rep = two_gpu_bench.read(report_dir)
    assert rep["not_engaged"] == ["bridge"]
    assert "bridge" not in rep["ratios"].get("upstream-p2p", {})
    assert "inactive: single device" in rep["cases"][1]["engagement"]


def test_failed_case_is_an_error(variants, two_gpu_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "nopeer")
    args = _quick(two_gpu_bench, tmp_path / "r", cases=("upstream-p2p", "upstream-nopeer"))
    with pytest.raises(BenchError, match="nopeer"):
        orchestrate.bench(args, two_gpu_bench.settings)


def test_batched_suite_requires_async_counts(variants, two_gpu_bench, tmp_path):
    args = _quick(two_gpu_bench, tmp_path / "r", rounds=2, reps=2, suite="batched")
    rep = two_gpu_bench.run(args)
    assert rep["ratios"]["off"]["batched"]["tg128"]["ratio"] == pytest.approx(103.0 / 99.0)
    order = two_gpu_bench.order.read_text().splitlines()
    assert all("patched" in line for line in order) and len(order) == 4


def test_gpu_suite_without_gpu_says_what_it_cannot_measure(variants, two_gpu_bench, tmp_path, monkeypatch):
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 0)
    with pytest.raises(BenchError, match="needs CUDA GPUs"):
        orchestrate.bench(two_gpu_bench.args(None, suite="multi-gpu"), two_gpu_bench.settings)


def test_missing_variant_is_skipped_not_invented(variants, two_gpu_bench, tmp_path):
    args = _quick(
        two_gpu_bench,
        tmp_path / "r",
        variants_dir=None,
        bin_dirs={"patched": variants / "patched"},
        cases=("off", "bridge"),
    )
    assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    args = _quick(
        two_gpu_bench,
        tmp_path / "r2",
        variants_dir=None,
        bin_dirs={"patched": variants / "patched", "upstream": tmp_path / "nothing-here"},
        cases=("upstream-p2p", "bridge"),
    )
    with pytest.raises(BenchError, match="llama-bench not found"):
        orchestrate.bench(args, two_gpu_bench.settings)


def test_noise_is_called_noise():
    a = stats.summarize("a", "t", [100, 101, 102, 103])
    b = stats.summarize("b", "t", [101, 102, 103, 104])
    assert stats.compare(a, b).noise is True
    c = stats.summarize("c", "t", [120, 121, 122, 123])
    assert stats.compare(c, b).noise is False
    assert stats.compare(c, b).ratio == pytest.approx(121.5 / 102.5)


def test_a_ratio_is_written_with_its_paired_figures_only_where_there_are_some():
    assert stats.Ratio(1.5, False).to_json() == {"ratio": 1.5, "noise": False}
    unpaired = stats.Ratio(1.5, True, paired_ci95=(1.0, 2.0), self_ci95=(1.0, 2.0))
    assert unpaired.to_json() == {"ratio": 1.5, "noise": True}
    few = stats.Ratio(0.9, True, 0.95, 2)
    assert list(few.to_json().items()) == [("ratio", 0.9), ("noise", True), ("paired", 0.95), ("paired_rounds", 2)]
    full = stats.Ratio(0.9, False, 0.95, 4, (0.9, 1.0), (0.97, 1.03))
    assert list(full.to_json()) == ["ratio", "noise", "paired", "paired_rounds", "paired_ci95", "self_ci95"]
    assert full.to_json()["paired_ci95"] == [0.9, 1.0] and full.to_json()["self_ci95"] == [0.97, 1.03]
    samples = [stats.Sample(c, "pp", r, [v]) for r in range(4) for c, v in (("off", 100.0 + r), ("b", 90.0 + r))]
    pooled = stats.pool(["off", "b"], samples, [stats.CaseRun("b", 0, 1, 1.0, None, "")])
    as_json = pooled.to_json()
    assert list(as_json) == ["rounds", "tests", "summary", "ratios", "failed", "not_engaged"]
    assert as_json["failed"] == ["b"] and list(pooled.ratios["off"]) == ["off"] and as_json["rounds"] == 1
    assert as_json["summary"]["off"]["pp"] == dataclasses.asdict(pooled.summary["off"]["pp"])  # type: ignore[index]


def test_rotate():
    assert running.rotate(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert running.rotate(["a", "b", "c"], 3) == ["a", "b", "c"]


@pytest.mark.plots
def test_plot_microbench_only(tmp_path):
    """A report with no throughput figures (every case failed) still plots its microbenchmark."""
    rows = [
        {"path": p, "bytes": n, "iters": 1, "seconds": 1.0, "GBps": g, "us_synced": 1.0}
        for n in (4096, 1 << 20)
        for p, g in (("bridge", 40.0), ("d2h", 50.0), ("h2d", 49.0))
    ]
    rep = {
        "cases": [],
        "tests": [],
        "summary": {},
        "microbench": rows,
        "suite": "x",
        "model": {"shape": "-"},
        "date": "2026-11-30",
    }
    assert bench_report.plot(Report.from_json(rep), tmp_path) == ["microbench.png"]
    assert (tmp_path / "microbench.png").stat().st_size > 1000


def test_missing_builds_are_built_unless_no_build(variants, two_gpu_bench, tmp_path, monkeypatch):
    """Without bin dirs the bench reuses the build stage's builds, builds what is missing (--build, the
    default), and with --no-build skips those cases instead of inventing figures."""
    from ggml_bridge.distribution.builder import locate, single, steps
    from ggml_bridge.foundations.errors import NotBuiltError

    built: list[str] = []

    def find_binary(settings, name, variant=None, backend=None):
        if variant == "patched" and "patched" not in built:
            raise NotBuiltError("no patched build")
        return variants / {"upstream": "upstream", "patched": "patched"}[variant] / name

    def ensure(settings, variant=None, **kw):
        built.append(variant)
        d = variants / "patched"
        return steps.BuildResult(variant, settings.build.backend, d, d, d / "manifest.json")

    monkeypatch.setattr(locate, "find_binary", find_binary)
    monkeypatch.setattr(single, "ensure", ensure)
    args = _quick(two_gpu_bench, tmp_path / "r", variants_dir=None, cases=("upstream-p2p", "bridge"))
    assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    assert built == ["patched"]

    built.clear()
    args = _quick(two_gpu_bench, tmp_path / "r2", variants_dir=None, cases=("upstream-p2p", "bridge"), build=False)
    rep = two_gpu_bench.run(args)
    assert built == [] and [c["name"] for c in rep["cases"]] == ["upstream-p2p"]
    assert any("bridge: no patched build" in s for s in rep["skipped"])


def test_paired_ratio_cancels_drift_between_rounds():
    S = stats.Sample
    # the machine slows by a third in round 1; within each round a runs at 0.96 of ref
    samples = [
        S("ref", "pp", 0, [100.0, 101.0, 99.0]),
        S("a", "pp", 0, [96.0, 96.96, 95.04]),
        S("ref", "pp", 1, [66.0, 67.0, 65.0]),
        S("a", "pp", 1, [63.36, 64.32, 62.4]),
        S("a", "pp", 2, [10.0]),  # a round without ref: not paired
        S("ref", "tg", 0, [5.0]),
        S("a", "tg", 0, [6.0]),
    ]
    ratio, rounds = stats.paired_ratio(samples, "a", "ref", "pp")
    assert rounds == 2 and ratio == pytest.approx(0.96)
    # the pooled medians mix the rounds and miss it
    pooled = stats.compare(
        stats.summarize("a", "pp", [v for s in samples if s.case == "a" and s.test == "pp" for v in s.values]),
        stats.summarize("ref", "pp", [v for s in samples if s.case == "ref" and s.test == "pp" for v in s.values]),
    )
    assert abs(pooled.ratio - 0.96) > 0.05
    assert stats.paired_ratio(samples, "a", "ref", "missing") is None
    assert stats.paired_ratio(samples, "a", "nobody", "pp") is None


def test_warmup_repetitions_are_run_and_discarded(variants, two_gpu_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_COLD_FIRST", "1")
    report_dir = tmp_path / "report"
    args = _quick(two_gpu_bench, report_dir, reps=2, cases=("upstream-p2p", "bridge"))
    rep = two_gpu_bench.run(args)
    assert rep["warmup_reps"] == 1
    pp = [x for x in rep["samples"] if x["case"] == "upstream-p2p" and x["test"] == "pp4096/ub512"][0]
    # llama-bench ran 3 repetitions; the cold first one (50.0) is gone, the two kept are full speed
    assert pp["values"] == pytest.approx([100.0, 100.25])
    assert "after 1 discarded" in (report_dir / "bench.md").read_text()

    args = _quick(two_gpu_bench, tmp_path / "r0", reps=2, cases=("upstream-p2p",), warmup_reps=0)
    rep = two_gpu_bench.run(args)
    pp = [x for x in rep["samples"] if x["case"] == "upstream-p2p" and x["test"] == "pp4096/ub512"][0]
    assert pp["values"] == pytest.approx([50.0, 100.0])  # without warm-up the cold repetition counts


@pytest.mark.parametrize("kw", [dict(rounds=0), dict(reps=0), dict(warmup_reps=-1)])
def test_bad_counts_are_usage_errors(variants, two_gpu_bench, tmp_path, kw):
    from ggml_bridge.foundations.errors import UsageError

    with pytest.raises(UsageError) as e:
        orchestrate.bench(two_gpu_bench.args(tmp_path / "r", **kw), two_gpu_bench.settings)
    assert e.value.exit_code == 2


def test_cpus_pin_every_case_and_are_restored(variants, two_gpu_bench, tmp_path):
    import os

    mine = os.sched_getaffinity(0)
    one = min(mine)
    args = _quick(two_gpu_bench, tmp_path / "r", cases=("upstream-p2p", "bridge"), cpus=cpu_list(str(one)))
    assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    lines = two_gpu_bench.order.read_text().splitlines()
    assert len(lines) == 2 and all(line.endswith(f"cpus={one}") for line in lines)
    assert os.sched_getaffinity(0) == mine
    rep = two_gpu_bench.read(tmp_path / "r")
    assert rep["cpus"] == str(one) and f"CPUs {one}" in (tmp_path / "r" / "bench.md").read_text()


def test_cpus_this_process_cannot_use_are_usage_errors(variants, two_gpu_bench, tmp_path):
    import os

    from ggml_bridge.foundations.errors import UsageError

    mine = os.sched_getaffinity(0)
    args = two_gpu_bench.args(tmp_path / "r", cpus=cpu_list("100000"))
    with pytest.raises(UsageError, match="cannot run on CPUs '100000'"):
        orchestrate.bench(args, two_gpu_bench.settings)
    assert os.sched_getaffinity(0) == mine


def test_cpu_lists_are_parsed_at_the_edge():
    assert cpu_list("0-3,8,10-11") == Cpus("0-3,8,10-11", frozenset({0, 1, 2, 3, 8, 10, 11}))
    for bad, said in (("x", "bad CPU list item 'x'"), ("3-1", "bad CPU range '3-1'"), ("1,,2", "item ''")):
        with pytest.raises(BadValue, match=re.escape(said)):
            cpu_list(bad)


def test_ubatch_and_tg_override_the_suite(variants, two_gpu_bench, tmp_path):
    args = _quick(two_gpu_bench, tmp_path / "r", rounds=2, cases=("upstream-p2p", "bridge"), ubatch=(4096,), tg=0)
    rep = two_gpu_bench.run(args)
    assert rep["tests"] == ["pp4096/ub4096"]  # no ub512, no tg: shorter processes
    assert rep["settings"]["ubatch"] == [4096] and rep["settings"]["tg"] == 0
    assert rep["ratios"]["upstream-p2p"]["bridge"]["pp4096/ub4096"]["ratio"] == pytest.approx(0.97)


def test_a_negative_tg_is_a_usage_error(variants, two_gpu_bench, tmp_path):
    from ggml_bridge.foundations.errors import UsageError

    with pytest.raises(UsageError) as e:
        orchestrate.bench(
            two_gpu_bench.args(tmp_path / "r", tg=-1),
            two_gpu_bench.settings,
        )
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--ubatch", "0"], "argument --ubatch: 0 is out of range (it must be 1..2147483647)"),
        (["--ubatch", "x"], "argument --ubatch: 'x' is not a whole number"),
        (["--ubatch", ""], "argument --ubatch: '' is not a comma-separated list of whole numbers"),
        (["--cpus", "3-1"], "argument --cpus: '3-1': bad CPU range '3-1' (the first CPU comes first)"),
        (["--shapes", ","], "argument --shapes: ',' names nothing (give a comma-separated list of names)"),
        (["--rounds", "0"], "argument --rounds: 0 is out of range (it must be 1..2147483647)"),
        (["--timeout", "nan"], "argument --timeout: 'nan': it must be a finite number above 0"),
        (["--pool", ""], "argument --pool: the path is empty (an empty value would mean the current folder)"),
    ],
)
def test_bad_values_are_one_line_usage_errors_at_the_edge(capsys, argv, said):
    from ggml_bridge import cli

    assert cli.main(["bench", *argv]) == UsageError.exit_code
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"ggml-bridge bench: error: {said}"


def test_time_budget_stops_starting_rounds_and_says_so(variants, two_gpu_bench, tmp_path):
    args = _quick(two_gpu_bench, tmp_path / "r", rounds=5, cases=("upstream-p2p", "bridge"), time_budget=1e-6)
    rep = two_gpu_bench.run(args)
    # the first round always runs; the second would end past the budget
    assert rep["rounds"] == 1 and rep["rounds_planned"] == 5
    assert "1 of 5 rounds" in rep["stopped"]
    assert {r["round"] for r in rep["runs"]} == {0}
    assert "stopped early" in (tmp_path / "r" / "bench.md").read_text()
    assert all(r["started"] > 0 for r in rep["runs"])
    # a budget that is never reached runs every round and says nothing
    args = _quick(two_gpu_bench, tmp_path / "r2", rounds=3, cases=("upstream-p2p",), time_budget=3600)
    rep = two_gpu_bench.run(args)
    assert rep["rounds"] == 3 and rep["stopped"] == ""


@pytest.mark.parametrize("budget", [0, -5])
def test_bad_time_budget_is_a_usage_error(variants, two_gpu_bench, tmp_path, budget):
    from ggml_bridge.foundations.errors import UsageError

    with pytest.raises(UsageError) as e:
        orchestrate.bench(
            two_gpu_bench.args(tmp_path / "r", time_budget=budget),
            two_gpu_bench.settings,
        )
    assert e.value.exit_code == 2


def test_p2p_patched_control_runs_our_binary_on_upstreams_path(variants, two_gpu_bench, tmp_path):
    args = _quick(two_gpu_bench, tmp_path / "r", cases=("upstream-p2p", "off-p2p"))
    assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    lines = two_gpu_bench.order.read_text().splitlines()
    assert any(x.startswith("patched bridge=0 p2p=1 batched=0") for x in lines)
    rep = two_gpu_bench.read(tmp_path / "r")
    assert rep["ratios"]["upstream-p2p"]["off-p2p"]["pp4096/ub512"]["ratio"] == pytest.approx(0.99)


def test_report_carries_the_build_manifests(variants, two_gpu_bench, tmp_path):
    """A GPU report had "manifests": {}: _manifests copied "cmake_options", the build writes "cmake_args"."""
    manifest = {
        "variant": "patched",
        "backend": "cuda",
        "upstream": {"commit": "0c1e570"},
        "series_hash": "ab" * 32,
        "patches": [{"name": "0001-x.patch", "sha256": "cd" * 32}],
        "cmake_args": ["-DGGML_CUDA_MAPPED_HOST_BRIDGE=ON", "-DSAM3D_BATCHED_TRANSFERS=ON", "-DGGML_RPC=ON"],
    }
    (variants / "patched" / "manifest.json").write_text(json.dumps(manifest))
    args = _quick(two_gpu_bench, tmp_path / "r", cases=("upstream-p2p", "bridge"))
    rep = two_gpu_bench.run(args)
    got = rep["manifests"]["patched"]
    assert got["cmake_args"] == manifest["cmake_args"] and got["series_hash"] == manifest["series_hash"]
    assert got["upstream"] == manifest["upstream"] and got["file"] == str(variants / "patched" / "manifest.json")
    assert "upstream" not in rep["manifests"]  # no manifest next to that build: none invented


@pytest.mark.parametrize("reasons", [True, False])
def test_smi_records_the_gpu_state_of_every_process(variants, two_gpu_bench, tmp_path, monkeypatch, reasons):
    bindir = tmp_path / "smi-bin"
    bindir.mkdir()
    write_exe(bindir / "nvidia-smi", FAKE_SMI.read_text())
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLEEP_S", "0.3")
    if not reasons:
        monkeypatch.setenv("FAKE_SMI_NO_REASONS", "1")
    args = _quick(two_gpu_bench, tmp_path / "r", rounds=2, cases=("upstream-p2p", "bridge"), smi=20)
    rep = two_gpu_bench.run(args)
    assert rep["smi"]["samples"] > 0 and rep["smi"]["file"] == "logs/smi.csv"
    assert ("clocks_event_reasons.active" in rep["smi"]["fields"]) == reasons
    assert len(rep["runs"]) == 4
    for r in rep["runs"]:  # every process was sampled while it ran, on both GPUs
        assert set(r["gpus"]) == {"0", "1"}, r
        g = r["gpus"]["0"]
        assert g["n"] >= 1 and g["sm_mhz"] == 1980 and g["power_w_peak"] == 350.5 and g["temp_c_peak"] == 45
        assert (g.get("reasons") == {"0x0000000000000004": g["n"]}) if reasons else "reasons" not in g
    md = (tmp_path / "r" / "bench.md").read_text()
    assert "GPU state while the cases ran" in md and "| bridge | 1 | 2 | 1980 | 2619 | 97 | 350 | 45 |" in md
    assert (tmp_path / "r" / "logs" / "smi.csv").read_text().count("\n") == rep["smi"]["samples"] + 1
    back = Report.from_json(rep)  # the GPU states read back as they were written (--pool)
    assert json.dumps(back.to_json(), indent=1) == (tmp_path / "r" / "bench.json").read_text()
    assert bench_report.render_markdown(back) == md


def test_smi_without_nvidia_smi_is_one_clear_error(variants, two_gpu_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    args = _quick(two_gpu_bench, tmp_path / "r", cases=("upstream-p2p",), smi=100)
    with pytest.raises(BenchError, match="--smi needs nvidia-smi"):
        orchestrate.bench(args, two_gpu_bench.settings)


def test_paired_ratio_interval_resamples_rounds():
    samples = [
        stats.Sample(c, "t", r, [v])
        for r, (a, b) in enumerate([(100, 97), (90, 88), (110, 106), (95, 93)])
        for c, v in (("ref", a), ("x", b))
    ]
    point, n = stats.paired_ratio(samples, "x", "ref", "t")
    lo, hi = stats.paired_interval(samples, "x", "ref", "t")
    ratios = [97 / 100, 88 / 90, 106 / 110, 93 / 95]
    assert n == 4 and min(ratios) <= lo <= point <= hi <= max(ratios)
    assert stats.paired_interval(samples[:4], "x", "ref", "t") is None  # two rounds: no interval


def test_pool_reports_numbers_rounds_one_after_the_other(variants, two_gpu_bench, tmp_path):
    for name in ("a", "b"):
        args = _quick(two_gpu_bench, tmp_path / name, rounds=2, reps=2, cases=("upstream-p2p", "bridge"))
        assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    assert (
        orchestrate.bench(
            _args(pool=[tmp_path / "a", tmp_path / "b" / "bench.json"], report=tmp_path / "p"), two_gpu_bench.settings
        )
        == 0
    )
    rep = two_gpu_bench.read(tmp_path / "p")
    assert rep["rounds"] == 4 and sorted({r["round"] for r in rep["runs"]}) == [0, 1, 2, 3]
    assert rep["summary"]["bridge"]["pp4096/ub512"]["n"] == 8  # 2 reports x 2 rounds x 2 samples
    cmp = rep["ratios"]["upstream-p2p"]["bridge"]["pp4096/ub512"]
    assert cmp["paired_rounds"] == 4 and cmp["ratio"] == pytest.approx(0.97, rel=1e-3) and "paired_ci95" in cmp
    assert len(rep["pooled_from"]) == 2 and set(rep["manifests_by_report"]) == set(rep["pooled_from"])
    assert "pooled from 2 reports" in (tmp_path / "p" / "bench.md").read_text()


def test_pool_refuses_reports_measured_differently(variants, two_gpu_bench, tmp_path):
    for name, ub in (("a", (512,)), ("b", (4096,))):
        args = _quick(two_gpu_bench, tmp_path / name, cases=("upstream-p2p",), ubatch=ub)
        assert orchestrate.bench(args, two_gpu_bench.settings) == 0
    with pytest.raises(BenchError, match="was not measured like") as e:
        orchestrate.bench(_args(pool=[tmp_path / "a", tmp_path / "b"], report=tmp_path / "p"), two_gpu_bench.settings)
    assert "settings" in e.value.why
    with pytest.raises(BenchError, match="bench report .* not found"):
        orchestrate.bench(
            _args(pool=[tmp_path / "a", tmp_path / "nothing"], report=tmp_path / "p"), two_gpu_bench.settings
        )
    assert not (tmp_path / "p").exists()


def test_a_report_reads_back_as_it_was_written(variants, two_gpu_bench, tmp_path):
    """bench.json is written from the report once and read back once (--pool): what is read writes the same
    bytes, and renders the same bench.md."""
    rep = two_gpu_bench.run(_quick(two_gpu_bench, tmp_path / "a", rounds=2, cases=("upstream-p2p", "bridge")))
    back = Report.from_json(rep)
    assert json.dumps(back.to_json(), indent=1) == (tmp_path / "a" / "bench.json").read_text()
    assert bench_report.render_markdown(back) == (tmp_path / "a" / "bench.md").read_text()


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda r: r["samples"][0].update(values=["fast"]), "not a number"),
        (lambda r: r["samples"][0].pop("test"), "has no 'test'"),
        (lambda r: r["cases"][0].update(colour="red"), "not of its kind"),
        (lambda r: r["runs"][0].update(gpus={"0": {"n": "many"}}), "not of its kind"),
        (lambda r: r.update(model="m.gguf"), "not of its kind"),
        (lambda r: r.update(smi={"interval_ms": 100}), "has no 'fields'"),
    ],
)
def test_pool_a_damaged_report_is_one_line(variants, two_gpu_bench, tmp_path, damage, why):
    """A bench.json whose parts are not of their kind is a BenchError naming the file, not a traceback."""
    rep = two_gpu_bench.run(_quick(two_gpu_bench, tmp_path / "a", cases=("upstream-p2p",)))
    damage(rep)
    (tmp_path / "b.json").write_text(json.dumps(rep))
    with pytest.raises(BenchError, match=r"b\.json is not a bench report") as e:
        orchestrate.bench(_args(pool=[tmp_path / "b.json"], report=tmp_path / "p"), two_gpu_bench.settings)
    assert why in e.value.why
    assert not (tmp_path / "p").exists()


def test_pool_refuses_one_report_twice(variants, two_gpu_bench, tmp_path):
    """E22: `--pool R/bench.json R/bench.json` pooled one report twice ("2 rounds" of duplicated samples); a copy
    under another name, and a pooled report with one of its sources, are the same report too."""
    import shutil

    from ggml_bridge.foundations.errors import UsageError

    for name in ("a", "b"):
        assert (
            orchestrate.bench(_quick(two_gpu_bench, tmp_path / name, cases=("upstream-p2p",)), two_gpu_bench.settings)
            == 0
        )
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    for twice in (
        [tmp_path / "a" / "bench.json", tmp_path / "a" / "bench.json"],
        [tmp_path / "a", tmp_path / "a" / "bench.json"],
        [tmp_path / "a", tmp_path / "copy"],
    ):
        with pytest.raises(UsageError, match="are the same report"):
            orchestrate.bench(_args(pool=twice, report=tmp_path / "p"), two_gpu_bench.settings)
    assert (
        orchestrate.bench(_args(pool=[tmp_path / "a", tmp_path / "b"], report=tmp_path / "p"), two_gpu_bench.settings)
        == 0
    )
    with pytest.raises(UsageError, match="are the same report"):
        orchestrate.bench(_args(pool=[tmp_path / "p", tmp_path / "b"], report=tmp_path / "q"), two_gpu_bench.settings)
    assert not (tmp_path / "q").exists()


def test_references_by_current_or_older_name():
    """Reports of earlier runs (pooled with --pool) name the references p2p, nopeer, staged."""
    assert stats.references(["bridge", "off", "upstream-p2p"]) == ["upstream-p2p", "off"]
    assert stats.references(["nopeer", "bridge", "p2p"]) == ["p2p", "nopeer"]
    assert stats.references(["staged", "bridge"], ("upstream-p2p", "upstream-nopeer", "off")) == []


def test_virtual_devices_of_one_gpu_measure_the_bridge_forced(variants, two_gpu_bench, tmp_path, monkeypatch):
    """auto leaves virtual devices of one GPU on upstream's device-local copy: the 6-device suite used to
    measure 'bridge' and 'bridge-batched' there, i.e. no bridge at all; on one GPU they run forced."""
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 1)
    args = _quick(two_gpu_bench, tmp_path / "r", suite="batched-pp-6dev")
    rep = two_gpu_bench.run(args)
    names = [c["name"] for c in rep["cases"]]
    assert set(names) == {"off", "batched", "bridge-force", "bridge-force-batched"}
    forced = next(c for c in rep["cases"] if c["name"] == "bridge-force")
    assert "boundaries=" in forced["engagement"]
    # with as many GPUs as devices, auto is what users run and is measured as such
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 6)
    args = dataclasses.replace(args, report=tmp_path / "r6")
    rep = two_gpu_bench.run(args)
    assert {c["name"] for c in rep["cases"]} == {"off", "batched", "bridge", "bridge-batched"}


def test_suites_are_data_checked_like_the_ladders(variants, two_gpu_bench, tmp_path, monkeypatch):
    """The suites are bench/suites.toml, checked key by key (ggml_bridge.foundations.tomlfile, as the ladder's rungs are);
    --suite-file runs a suite of another file; a wrong value is one line naming file, suite and key."""
    from ggml_bridge.experiments.bench import suites

    assert suites.SUITES == suites.load_suites(suites.SUITES_FILE) and "batched-runs-2virt" in suites.SUITES
    assert suites.SUITES["batched-runs-2virt"].tables["server"]["parallel"] == 4
    own = tmp_path / "mine.toml"
    own.write_text(
        '[tiny-cpu]\nabout = "mine"\ncases = ["upstream", "off"]\nshape = "small"\ndevices = "cpu"\n'
        "pp = 64\nbatch = 64\nubatch = [64]\ntg = 4\n"
    )
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 0)
    rep = two_gpu_bench.run(_quick(two_gpu_bench, tmp_path / "r", suite="tiny-cpu", suite_file=own))
    assert rep["suite"] == "tiny-cpu" and rep["about"] == "mine" and rep["settings"]["pp"] == 64
    with pytest.raises(UsageError, match="no suite 'cpu' in .*mine.toml"):
        orchestrate.bench(_quick(two_gpu_bench, tmp_path / "r2", suite_file=own), two_gpu_bench.settings)
    for text, msg in (
        ("ubatch = [0]", r"\[tiny-cpu\]: ubatch = \[0\] is not a list of integers in 1..2147483647"),
        ('devices = "2"', r"devices = '2' is not one of all, 1, cpu"),
        ("ppp = 1", "unknown key.s. ppp"),
    ):
        key = text.split(" ")[0]
        body = own.read_text()
        body = (
            body.replace("ubatch = [64]", text)
            if key == "ubatch"
            else body.replace('devices = "cpu"', text)
            if key == "devices"
            else body + text + "\n"
        )
        (tmp_path / "bad.toml").write_text(body)
        with pytest.raises(UsageError, match=msg):
            suites.load_suites(tmp_path / "bad.toml")


def test_each_measure_is_one_module_behind_the_protocol_in_one_registry() -> None:
    """The suites' schema, --measure's words and the report read the registry: a measure is its module and a row."""
    from ggml_bridge.experiments.bench import measures, suites

    assert list(measures.MEASURES) == ["bench", "perplexity", "server", "inproc"]
    modules = {type(m).__module__ for m in measures.MEASURES.values()}
    assert len(modules) == len(measures.MEASURES), "one module per measure"
    for name, m in measures.MEASURES.items():
        assert m.name == name and m.program
        if m.table is None:
            assert name not in suites.SUITE_KEYS
        else:
            assert suites.SUITE_KEYS[name].table is m.table
    bare = Suite.of(
        {"about": "", "cases": [], "shape": "tiny", "devices": "cpu", "pp": 1, "batch": 1, "ubatch": [1], "tg": 0}, ()
    )
    assert suites.measures_of(bare) == ("bench",)


def test_a_suite_table_is_parsed_once_into_its_fields_with_their_defaults(tmp_path):
    from ggml_bridge.experiments.bench import suites

    own = tmp_path / "own.toml"
    own.write_text(
        '[one]\nabout = "a"\ncases = ["off", "batched"]\nshape = "tiny"\ndevices = "cpu"\npp = 64\nbatch = 32\n'
        'ubatch = [8, 16]\ntg = 0\n\n[two]\nabout = "b"\ncases = ["off"]\nshapes = ["tiny", "small"]\n'
        'devices = "all"\npp = "64,128"\nbatch = 32\nubatch = [8]\ntg = 4\nvirtual_devices = 2\n'
        'split_mode = "row"\nthreads = 3\nlinks = ["1gbit/0.1ms"]\nrpc_servers = 2\nrpc_front_gpu = true\n'
        "run_lengths = [3, 1]\nrounds = 5\nperplexity = { ctx = 128, chunks = 2, batch = 256 }\n"
    )
    one, two = suites.load_suites(own).values()
    assert one == Suite("a", ("off", "batched"), ("tiny",), False, "cpu", 64, 32, (8, 16), 0)
    assert (one.virtual_devices, one.split_mode, one.threads, one.links, one.rounds) == (0, None, None, (), 3)
    assert (one.rpc_servers, one.rpc_front_gpu, one.run_lengths, one.tables) == (1, False, (), {})
    assert one.table("perplexity") == {} and suites.measures_of(one) == ("bench",)
    assert (two.shapes, two.keyed_by_shape, two.pp, two.ubatch) == (("tiny", "small"), True, "64,128", (8,))
    assert (two.virtual_devices, two.split_mode, two.threads, two.links) == (2, "row", 3, ("1gbit/0.1ms",))
    assert (two.rpc_servers, two.rpc_front_gpu, two.run_lengths, two.rounds) == (2, True, (3, 1), 5)
    assert two.tables == {"perplexity": {"ctx": 128, "chunks": 2, "batch": 256}}
    assert suites.measures_of(two) == ("bench", "perplexity")
    with pytest.raises(dataclasses.FrozenInstanceError):
        two.tg = 1  # type: ignore[misc]


def test_every_option_is_declared_once_on_its_field_and_read_back_checked(tmp_path):
    from ggml_bridge import cli

    assert [f.name for f, _ in flags.declared(BenchOptions)] == [f.name for f in dataclasses.fields(BenchOptions)]
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "p").mkdir()
    argv = ["--model", str(tmp_path / "m.gguf"), "--bin-dir-patched", str(tmp_path / "p"), "--no-build", "--smi"]
    opts = cli.parse_command(cli.COMMANDS["bench"], [*argv, "--pool", "a.json", "b.json"])
    assert (opts.model, opts.bin_dirs, opts.build) == (tmp_path / "m.gguf", {"patched": tmp_path / "p"}, False)
    assert (opts.smi, opts.pool, opts.microbench, opts.timeout) == (100, (Path("a.json"), Path("b.json")), True, 600.0)
    for option in ("--model", "--bin-dir-patched", "--variants-dir", "--vocab"):
        with pytest.raises(UsageError, match=re.escape(option)) as e:
            cli.parse_command(cli.COMMANDS["bench"], [option, str(tmp_path / "missing")])
        assert e.value.exit_code == 2


def test_the_lists_of_the_command_line_are_parsed_into_names_at_the_edge():
    from ggml_bridge import cli

    assert flags.names("off") == ("off",) and flags.names(" off, batched,,off") == ("off", "batched")
    with pytest.raises(BadValue, match="names nothing"):
        flags.names(" , ")
    argv = ["--cases", "off,batched", "--links", "10gbit/0.2ms,25gbit/0.1ms"]
    argv += ["--shapes", "tiny,small", "--measure", "bench", "--ubatch", "512,4096", "--cpus", "0-1,4"]
    opts = cli.parse_command(cli.COMMANDS["bench"], argv)
    assert opts.cases == ("off", "batched") and opts.links == ("10gbit/0.2ms", "25gbit/0.1ms")
    assert (opts.shapes, opts.measure, opts.ubatch) == (("tiny", "small"), ("bench",), (512, 4096))
    assert opts.cpus == Cpus("0-1,4", frozenset({0, 1, 4}))
    plain = cli.parse_command(cli.COMMANDS["bench"], [])
    assert plain == BenchOptions()
