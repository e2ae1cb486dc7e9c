"""ggml-bridge bench's short-run matrix against the fake programs: run lengths (one llama-bench process per case,
run length and round, every repetition kept), shapes named in the tests, llama-perplexity's wall time and
llama-server's throughput under concurrent requests with their engagement proof, the order of a round, the
batched-vs-baseline table, and pooling the parts of a matrix run in separate calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggml_bridge.experiments import model as modelmod
from ggml_bridge.experiments.bench import orchestrate, running, stats
from ggml_bridge.experiments.bench.measure import Job
from ggml_bridge.experiments.bench.running import plan_round
from ggml_bridge.foundations.errors import BenchError, UsageError
from ggml_bridge.runtime import modes

from helpers import bench_args


def _run(one_gpu_bench, report: str, **kw):  # type: ignore[no-untyped-def]
    """Run the bench on the fake variants without the microbenchmark (exit 0 expected) and read its bench.json."""
    return one_gpu_bench.run(one_gpu_bench.args(report, microbench=False, **kw))


def _one_round(one_gpu_bench, measure, cases=("off",)):  # type: ignore[no-untyped-def]
    """The bench's options for one round of batched-runs-1gpu's ``measure`` on ``cases``, no microbenchmark."""
    return one_gpu_bench.args(microbench=False, suite="batched-runs-1gpu", cases=cases, rounds=1, measure=measure)


# --- the order of a round -----------------------------------------------------------------------------------------


def test_one_group_on_one_shape_is_the_rotation_of_the_cases():
    names = ["a", "b", "c"]
    for rnd in range(4):
        assert [j.case for j in plan_round(rnd, names, ["s"], [Job("", "")])] == running.rotate(names, rnd)


def test_a_round_runs_every_case_in_every_group_next_to_each_other():
    names = ["off", "batched"]
    groups = [Job("", "", "bench", 1), Job("", "", "bench", 3), Job("", "", "perplexity")]
    r0 = plan_round(0, names, ["a", "b"], groups)
    r1 = plan_round(1, names, ["a", "b"], groups)
    for r in (r0, r1):  # every (shape, group, case) once, a group's cases one after the other
        assert len(r) == len({(j.shape, j.measure, j.run_length, j.case) for j in r}) == 12
        assert all(r[i].run_length == r[i + 1].run_length and r[i].shape == r[i + 1].shape for i in range(0, 12, 2))
    assert [(j.shape, j.run_length, j.case) for j in r0[:6]] == [
        ("a", 1, "off"),
        ("a", 1, "batched"),
        ("a", 3, "batched"),
        ("a", 3, "off"),
        ("a", None, "off"),
        ("a", None, "batched"),
    ]
    # round 1: shapes and groups rotated, the cases of group j rotated by 1 + j
    assert [(j.shape, j.run_length, j.measure, j.case) for j in r1[:6]] == [
        ("b", 3, "bench", "off"),
        ("b", 3, "bench", "batched"),
        ("b", None, "perplexity", "batched"),
        ("b", None, "perplexity", "off"),
        ("b", 1, "bench", "batched"),
        ("b", 1, "bench", "off"),
    ]


def test_tests_sort_by_shape_kind_size_ubatch_and_run_length():
    keys = [
        "b:server",
        "b:perplexity",
        "b:tg128@r10",
        "b:tg128@r1",
        "b:pp4096/ub512@r3",
        "b:pp512/ub512@r10",
        "b:pp512/ub512@r3",
        "a:pp4096/ub512@r1",
    ]
    assert sorted(keys, key=stats._test_order) == [
        "a:pp4096/ub512@r1",
        "b:pp512/ub512@r3",
        "b:pp512/ub512@r10",
        "b:pp4096/ub512@r3",
        "b:tg128@r1",
        "b:tg128@r10",
        "b:perplexity",
        "b:server",
    ]
    inproc = ["b:context@inproc", "b:tg128@inproc", "b:pp512/ub512@inproc2", "b:pp512/ub512@inproc1", "b:tg128@r3"]
    assert sorted(inproc + ["b:pp512/ub512@r10"], key=stats._test_order) == [
        "b:pp512/ub512@r10",
        "b:pp512/ub512@inproc1",
        "b:pp512/ub512@inproc2",
        "b:tg128@r3",
        "b:tg128@inproc",
        "b:context@inproc",
    ]
    assert sorted(["tg128", "pp4096/ub4096", "pp4096/ub512"], key=stats._test_order) == [
        "pp4096/ub512",
        "pp4096/ub4096",
        "tg128",
    ]


def test_batching_is_paired_with_its_baseline():
    assert modes.baseline(modes.MODES["batched"]).name == "off"
    assert modes.baseline(modes.MODES["bridge-force-batched"]).name == "bridge-force"
    assert modes.baseline(modes.MODES["bridge-batched"]).name == "bridge"
    assert modes.baseline(modes.MODES["bridge-force"]) is None
    names = ["off", "batched", "bridge-force", "bridge-force-batched", "bridge-batched"]
    assert stats.batched_pairs(names) == [("batched", "off"), ("bridge-force-batched", "bridge-force")]


# --- run lengths --------------------------------------------------------------------------------------------------


def test_run_lengths_show_what_a_one_shot_run_costs(one_gpu_bench, monkeypatch):
    """A mechanism whose first repetition in a process is slow: kept repetitions after a discarded one (the bench
    before run lengths) show a gain; run lengths show the loss at -r 1 and none at -r 10."""
    monkeypatch.setenv("FAKE_COLD_WHEN", "LLAMA_BATCHED_TRANSFERS=1")
    kept = _run(one_gpu_bench, "kept", suite="batched", cases=("off", "batched"), rounds=2, reps=3)
    assert kept["ratios"]["off"]["batched"]["pp512/ub512"]["paired"] > 1.0  # the cost is invisible here

    rep = _run(one_gpu_bench, "runs", suite="batched", cases=("off", "batched"), rounds=2, run_lengths=(1, 10))
    assert rep["run_lengths"] == [1, 10] and rep["reps"] is None and rep["warmup_reps"] == 0
    assert rep["tests"] == ["pp512/ub512@r1", "pp512/ub512@r10", "tg128@r1", "tg128@r10"]
    r = rep["ratios"]["off"]["batched"]
    assert r["pp512/ub512@r1"]["paired"] == pytest.approx(0.6 * 103 / 99) and r["tg128@r1"]["paired"] < 0.7
    assert r["pp512/ub512@r10"]["paired"] > 1.0 and r["tg128@r10"]["paired"] > 1.0
    # every repetition kept: -r N gives N samples per process
    for s in rep["samples"]:
        assert len(s["values"]) == int(s["test"].rsplit("@r", 1)[1])
    reps = [re.search(r"reps=(\d+)", x)[1] for x in one_gpu_bench.order.read_text().splitlines()[-8:]]
    assert sorted(reps) == ["1"] * 4 + ["10"] * 4
    md = (one_gpu_bench.tmp / "runs" / "bench.md").read_text()
    assert "every repetition kept" in md and "| pp512/ub512@r1 |" in md
    assert "Batching against its baseline" in md and "Lowest paired ratio: 0.624 (batched / off, pp512/ub512@r1)" in md


@pytest.mark.parametrize("kw", [dict(reps=3), dict(warmup_reps=1), dict(reps=2, warmup_reps=0)])
def test_repetitions_with_run_lengths_are_usage_errors(one_gpu_bench, kw):
    args = one_gpu_bench.args(
        run_lengths=(1,),
        **kw,
    )
    with pytest.raises(UsageError, match="with run lengths") as e:
        orchestrate.bench(args, one_gpu_bench.settings)
    assert e.value.exit_code == 2 and not (one_gpu_bench.tmp / "r").exists()


def test_a_run_length_suite_uses_its_rounds_and_run_lengths(one_gpu_bench):
    rep = _run(one_gpu_bench, "r", suite="batched-runs-1gpu", measure=("bench",), tg=0, ubatch=(512,))
    assert rep["rounds"] == 5 and rep["run_lengths"] == [1, 3, 10]
    assert rep["tests"][:3] == ["user:pp512/ub512@r1", "user:pp512/ub512@r3", "user:pp512/ub512@r10"]
    assert len(one_gpu_bench.order.read_text().splitlines()) == 5 * 3 * 2


# --- shapes and pooling the parts of a matrix ---------------------------------------------------------------------


@pytest.fixture
def shaped(one_gpu_bench, monkeypatch):
    """Random models by shape without writing any: one small file per shape, a vocabulary of the ladder's words."""

    def ensure_model(cache_dir, shape, seed, vocab):  # type: ignore[no-untyped-def]
        p = Path(cache_dir) / f"{shape}.gguf"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"GGUF " + shape.encode())
        return p

    monkeypatch.setattr(modelmod, "ensure_model", ensure_model)
    words = modelmod.Vocab(
        path=str(one_gpu_bench.tmp / "vocab.gguf"),
        sha256="0" * 64,
        tokens=("\u2581the", "\u2581of"),
        scores=(0.0, 0.0),
        token_types=(1, 1),
        model="llama",
        pre=None,
        bos=None,
        eos=None,
        unk=None,
        add_bos=None,
        add_eos=None,
    )
    monkeypatch.setattr(modelmod, "load_vocab", lambda path: words)
    (one_gpu_bench.tmp / "vocab.gguf").write_bytes(b"GGUF")
    return one_gpu_bench


def test_shapes_name_every_figure_and_parts_of_the_matrix_pool(shaped):
    env = shaped
    kw = dict(suite="cpu-runs", cases=("upstream", "off"), rounds=2, model=None, vocab=env.tmp / "vocab.gguf")
    a = _run(env, "a", shapes=("tiny",), measure=("bench",), **kw)
    assert a["shapes"] == ["tiny"] and a["keyed_by_shape"] and a["model"]["shape"] == "tiny"
    assert all(t.startswith("tiny:") for t in a["tests"]) and "tiny:pp64/ub64@r3" in a["tests"]
    assert {re.search(r"model=(\S+)", x)[1] for x in env.order.read_text().splitlines()} == {"tiny.gguf"}
    b = _run(env, "b", shapes=("small",), run_lengths=(3,), measure=("bench", "perplexity"), **kw)
    assert b["run_lengths"] == [3] and "small:perplexity" in b["tests"] and "small:pp256/ub64@r3" in b["tests"]
    assert (env.tmp / "b" / "logs" / "small" / "r3").is_dir() and (
        env.tmp / "b" / "logs" / "small" / "perplexity"
    ).is_dir()

    p = env.run(bench_args(pool=[env.tmp / "a", env.tmp / "b"], report=env.tmp / "p"))
    assert p["shapes"] == ["tiny", "small"] and p["run_lengths"] == [1, 3] and p["measures"] == ["bench", "perplexity"]
    assert p["tests"][3] == "small:perplexity" and p["tests"][-1] == "tiny:tg16@r3"  # by shape, then test
    cmp = p["ratios"]["upstream"]["off"]["small:pp256/ub64@r3"]
    assert cmp["paired_rounds"] == 2  # only b's rounds ran the small shape
    assert "models (tests named SHAPE:TEST): tiny" in (env.tmp / "p" / "bench.md").read_text()


def test_shapes_the_suite_does_not_have_are_usage_errors(shaped):
    env = shaped
    for kw, msg in (
        (dict(shapes=("bench-1b",), model=None), "suite cpu-runs has no bench-1b"),
        (dict(measure=("bench", "nope"), model=None), "suite cpu-runs has no nope"),
        (dict(shapes=("tiny",)), "--shapes and --model together"),
    ):
        args = env.args(suite="cpu-runs", vocab=env.tmp / "vocab.gguf", **kw)
        with pytest.raises(UsageError, match=re.escape(msg)):
            orchestrate.bench(args, env.settings)
    args = env.args(model=None, suite="batched", measure=("server",))
    with pytest.raises(UsageError, match="suite batched has no server"):
        orchestrate.bench(args, env.settings)


# --- llama-perplexity and llama-server ----------------------------------------------------------------------------


def test_perplexity_and_server_figures_and_their_proof(one_gpu_bench, monkeypatch):
    log = one_gpu_bench.tmp / "inflight.txt"
    monkeypatch.setenv("FAKE_INFLIGHT_LOG", str(log))
    monkeypatch.setenv("FAKE_COMPLETION_S", "0.2")
    rep = _run(
        one_gpu_bench,
        "r",
        suite="batched-runs-1gpu",
        cases=("off", "batched"),
        rounds=2,
        measure=("perplexity", "server"),
    )
    assert rep["tests"] == ["user:perplexity", "user:server"] and rep["not_engaged"] == []
    for r in rep["runs"]:
        sample = next(
            s
            for s in rep["samples"]
            if s["case"] == r["case"] and s["round"] == r["round"] and s["test"] == f"user:{r['measure']}"
        )
        if r["measure"] == "perplexity":  # 4 chunks of 512 tokens over the process's wall time
            assert r["detail"].startswith("4 chunks x 512 tokens") and sample["values"] == [
                pytest.approx(2048 / r["seconds"])
            ]
        else:  # 8 requests of min(128, 32) tokens (the fake's longest answer) over the time they took
            n, secs = re.match(r"8 requests, (\d+) tokens generated in ([\d.]+) s", r["detail"]).groups()
            assert int(n) == 8 * 32 and sample["values"][0] * float(secs) == pytest.approx(256, rel=0.05)
    counts = [int(x) for x in log.read_text().split()]
    assert len(counts) == 2 * 2 * 8 and 2 <= max(counts) <= 4  # 4 at a time, never more
    batched = next(c for c in rep["cases"] if c["name"] == "batched")["engagement"]
    assert "llama-perplexity: batched enabled, graphs=4 async_uploads=4" in batched  # its stats line (-lv 4)
    assert "llama-server: batched engaged (/metrics batched_graphs_total=2 batched_async_uploads_total=2)" in batched
    md = (one_gpu_bench.tmp / "r" / "bench.md").read_text()
    assert "llama-perplexity -c 512 --chunks 4 -b 2048" in md and "llama-server -np 4, 8 greedy completions" in md
    assert "| user:server |" in md and "batched / off" in md


def test_bridge_cases_prove_engagement_in_perplexity_and_server(one_gpu_bench, monkeypatch):
    monkeypatch.setenv("FAKE_DEVICES", "2")  # the fake server exports bridge counters with devices
    rep = _run(
        one_gpu_bench,
        "r",
        suite="batched-runs-2virt",
        cases=("bridge-force", "bridge-force-batched"),
        rounds=1,
        measure=("perplexity", "server"),
    )
    eng = {c["name"]: c["engagement"] for c in rep["cases"]}
    assert "bridge enabled (4 slots), boundaries=7" in eng["bridge-force"]
    assert "llama-server: bridge engaged (/metrics bridge_boundaries_total=7" in eng["bridge-force-batched"]
    assert "user:server" in rep["ratios"]["bridge-force"]["bridge-force-batched"]
    assert rep["settings"][modes.CUDA_DEVICES] == 2


def test_mechanism_inactive_in_perplexity_and_server_is_not_engaged(one_gpu_bench, monkeypatch):
    monkeypatch.setenv("FAKE_BATCHED_INACTIVE", "no backend with same-device pinned host memory")
    args = _one_round(one_gpu_bench, ("perplexity", "server"), ("off", "batched"))
    with pytest.raises(BenchError, match="did not engage"):
        orchestrate.bench(args, one_gpu_bench.settings)
    rep = one_gpu_bench.read()
    assert rep["not_engaged"] == ["batched"] and "batched" not in rep["ratios"].get("off", {})
    states = [r["engagement"] for r in rep["runs"] if r["case"] == "batched"]
    assert any("inactive: no backend" in s and s.startswith("batched not enabled") for s in states)
    assert any(s.startswith("batched inactive (/metrics") and "inactive: no backend" in s for s in states)


def test_perplexity_that_evaluates_nothing_is_an_error(one_gpu_bench, monkeypatch):
    from ggml_bridge.experiments.bench import perplexity

    monkeypatch.setattr(perplexity, "make_text", lambda n, seed, tokens: "a text shorter than one chunk\n")
    args = _one_round(one_gpu_bench, ("perplexity",))
    with pytest.raises(BenchError, match="llama-perplexity evaluated nothing"):
        orchestrate.bench(args, one_gpu_bench.settings)


def test_a_failed_server_is_a_failed_case(one_gpu_bench, monkeypatch):
    monkeypatch.setenv("FAKE_DIE_AT_START", "3")
    args = _one_round(one_gpu_bench, ("server",))
    with pytest.raises(BenchError, match="llama-server failed for case"):
        orchestrate.bench(args, one_gpu_bench.settings)
    rep = one_gpu_bench.read()
    assert rep["failed"] == ["off"] and "exited during start-up" in rep["runs"][0]["log_tail"][0]


def test_wall_clock_measurements_need_their_programs_and_local_cases(one_gpu_bench):
    (one_gpu_bench.variants / "patched" / "llama-server").unlink()
    args = one_gpu_bench.args(
        suite="batched-runs-1gpu",
        cases=("off",),
        measure=("server",),
    )
    with pytest.raises(BenchError, match="no llama-server next to llama-bench"):
        orchestrate.bench(args, one_gpu_bench.settings)
    args = one_gpu_bench.args(
        suite="batched-runs-1gpu",
        cases=("off", "rpc-off"),
        measure=("perplexity",),
    )
    with pytest.raises(UsageError, match="rpc case"):
        orchestrate.bench(args, one_gpu_bench.settings)


def test_time_budget_stops_starting_rounds_of_run_lengths(one_gpu_bench):
    rep = _run(
        one_gpu_bench, "r", suite="batched", cases=("off", "batched"), rounds=4, run_lengths=(1, 3), time_budget=1e-6
    )
    assert rep["rounds"] == 1 and "1 of 4 rounds" in rep["stopped"]
    assert {(r["round"], r["run_length"]) for r in rep["runs"]} == {(0, 1), (0, 3)}


@pytest.mark.plots
def test_many_tests_plot_on_rows(shaped):
    env = shaped
    rep = _run(env, "r", suite="cpu-runs", rounds=1, model=None, vocab=env.tmp / "vocab.gguf", measure=("bench",))
    assert len(rep["tests"]) == 12  # 2 shapes x (2 pp + tg) x 2 run lengths: two rows of six
    png = env.tmp / "r" / "throughput.png"
    assert png.stat().st_size > 1000
    from PIL import Image

    width, height = Image.open(png).size
    assert width < 3000 and height > 600  # six columns, two rows (one row of twelve: 5544 x 440 pixels)


def test_the_baseline_against_itself_shows_what_the_processes_spread_alone_gives():
    """A paired median below 0.99 on a path identical to its baseline is the machine's spread when the baseline's
    own processes give ratios as low: the range of a median of k ratios between two of its processes. Fast and slow
    processes (100 / 80) spread it well below 0.99; processes that agree give [1, 1]; under 3 rounds: none."""
    mixed = [stats.Sample("off", "pp512", r, [100.0 if r % 2 else 80.0]) for r in range(6)]
    lo, hi = stats.self_interval(mixed, "off", "pp512", k=5)
    assert lo < 0.9 and hi > 1.1 and lo <= 1.0 <= hi
    steady = [stats.Sample("off", "pp512", r, [100.0, 100.0]) for r in range(6)]
    assert stats.self_interval(steady, "off", "pp512", k=5) == (1.0, 1.0)
    assert stats.self_interval(steady[:2], "off", "pp512", k=5) is None
    batched = [stats.Sample("batched", "pp512", r, [0.96 * (100.0 if r % 2 else 80.0)]) for r in range(6)]
    report = stats.pool(["off", "batched"], mixed + batched, [])
    cmp = report.ratios["off"]["batched"]["pp512"]
    assert cmp.paired == pytest.approx(0.96) and cmp.paired_rounds == 6
    assert cmp.self_ci95 is not None and cmp.self_ci95[0] < 0.96


# --- inside one process (--measure inproc) ---------------------------------------------------------------------


def test_in_process_measures_batching_and_its_baseline_in_one_process(one_gpu_bench, monkeypatch):
    """One test-batched-transfers --bench per batched case and round, with the baseline's selectors (the bridge
    forced here, batching left to the program); its figures are the case's and the baseline's of that round, so
    the paired ratio is within one process. Each baseline runs its control process (--control, both contexts off)
    in the same round, and its ratio of the second context to the first gives every in-process ratio the
    baseline-against-itself range (the fake's control leans 2 % at tg128)."""
    monkeypatch.setenv("FAKE_CONTROL_SPREAD", "0.02")
    cases = ("off", "batched", "bridge-force", "bridge-force-batched")
    rep = _run(one_gpu_bench, "r", suite="batched-runs-1gpu", cases=cases, rounds=3, measure=("inproc",))
    runs = [line for line in one_gpu_bench.order.read_text().splitlines() if line.startswith("inproc ")]
    ab = [r for r in runs if not r.endswith(" control")]
    controls = [r for r in runs if r.endswith(" control")]
    assert len(ab) == len(controls) == 2 * 3  # per round a job per batched case and one control per baseline
    for kind in (ab, controls):
        assert sorted(r.split()[1] for r in kind) == ["bridge=0"] * 3 + ["bridge=force"] * 3
    assert all("batched=0 rounds=4 reps=3 prompts=512,4096 n_gen=128 ubatch=512" in r for r in runs), runs
    assert rep["tests"] == [
        "user:pp512/ub512@inproc1",
        "user:pp512/ub512@inproc2",
        "user:pp512/ub512@inproc3",
        "user:pp4096/ub512@inproc1",
        "user:pp4096/ub512@inproc2",
        "user:pp4096/ub512@inproc3",
        "user:tg128@inproc",
        "user:context@inproc",
    ]
    assert rep["not_engaged"] == [] and rep["failed"] == []
    assert {(r["case"], r["engaged"]) for r in rep["runs"]} == {
        ("batched", True),
        ("bridge-force-batched", True),
        ("off", None),
        ("bridge-force", None),
    }
    for case, base in (("batched", "off"), ("bridge-force-batched", "bridge-force")):
        assert {s["round"] for s in rep["samples"] if s["case"] == base} == {0, 1, 2}
        tg = rep["ratios"][base][case]["user:tg128@inproc"]
        assert tg["paired"] == pytest.approx(1.05) and tg["paired_rounds"] == 3
        assert tg["self_ci95"] == [pytest.approx(1 / 0.98)] * 2  # the control's own lean, not batching's 1.05
        pp = rep["ratios"][base][case]["user:pp4096/ub512@inproc2"]
        assert pp["paired"] == pytest.approx(1.0) and pp["self_ci95"] == [pytest.approx(1.0)] * 2
    # the control's figures stay out of the cases' own: off's values come from the batched case's process
    assert {s["case"] for s in rep["samples"]} == {
        "off", "batched", "bridge-force", "bridge-force-batched",
        "off~control-a", "off~control-b", "bridge-force~control-a", "bridge-force~control-b",
    }  # fmt: skip
    assert set(rep["summary"]) == {"off", "batched", "bridge-force", "bridge-force-batched"}
    # the values: tokens per second (4096 tokens in 40.96 ms), four per process (its inner rounds)
    s = next(s for s in rep["samples"] if s["case"] == "off" and s["test"] == "user:pp4096/ub512@inproc2")
    assert s["values"] == [pytest.approx(100000.0)] * 4
    md = (one_gpu_bench.tmp / "r" / "bench.md").read_text()
    assert "- inproc: test-batched-transfers --bench" in md and "| user:tg128@inproc |" in md
    assert "also a control process (--control: both contexts with batching off)" in md
    assert "| user:tg128@inproc | 1.050 [1.050, 1.050] (3) | [1.020, 1.020] |" in md


def test_in_process_without_the_control_runs_no_control_and_gives_no_range(one_gpu_bench, tmp_path):
    """A suite whose inproc table leaves the control out runs one process per batched case and round, and its
    in-process ratios have no baseline-against-itself range (there is nothing to take it from)."""
    from ggml_bridge.experiments.bench import suites

    body = suites.SUITES_FILE.read_text().split("[batched-runs-1gpu]")[1].split("\n[")[0]
    own = tmp_path / "mine.toml"
    own.write_text("[mine]" + body.replace("inproc = { rounds = 4, control = true }", "inproc = { rounds = 4 }"))
    rep = _run(
        one_gpu_bench, "r", suite="mine", suite_file=own, cases=("off", "batched"), rounds=3, measure=("inproc",)
    )
    runs = [line for line in one_gpu_bench.order.read_text().splitlines() if line.startswith("inproc ")]
    assert len(runs) == 3 and not any(r.endswith(" control") for r in runs), runs
    assert "self_ci95" not in rep["ratios"]["off"]["batched"]["user:tg128@inproc"]


def test_in_process_rounds_are_even_so_that_both_orders_weigh_alike(tmp_path):
    """The program alternates which context of an inner round comes first (off first in even rounds): the shipped
    suites run an even number, and a suite file with an odd one is refused with one line naming suite and key (3
    rounds, the suites' count until 2026-12-06, put off first twice and batching first once)."""
    from ggml_bridge.experiments.bench import suites

    inproc = {n: s.tables["inproc"]["rounds"] for n, s in suites.SUITES.items() if "inproc" in s.tables}
    assert inproc and all(r % 2 == 0 for r in inproc.values()), inproc
    body = (suites.SUITES_FILE.read_text().split("[batched-runs-1gpu]")[1]).split("\n[")[0]
    odd = tmp_path / "odd.toml"
    odd.write_text("[mine]" + body.replace("inproc = { rounds = 4, control = true }", "inproc = { rounds = 3 }"))
    with pytest.raises(UsageError, match=r"odd.toml \[mine\]: inproc rounds = 3 is odd"):
        suites.load_suites(odd)
    odd.write_text("[mine]" + body.replace("inproc = { rounds = 4, control = true }", "inproc = { rounds = 2 }"))
    assert suites.load_suites(odd)["mine"].table("inproc")["rounds"] == 2


def test_in_process_batching_that_did_not_engage_fails(one_gpu_bench, monkeypatch):
    """The program fails when the contexts that asked for batching did not enable it: a failed case, reported
    with its engagement (not engaged, why) and the program named."""
    monkeypatch.setenv("FAKE_INPROC_INACTIVE", "1")
    args = _one_round(one_gpu_bench, ("inproc",), ("off", "batched"))
    with pytest.raises(BenchError, match="test-batched-transfers failed for case"):
        orchestrate.bench(args, one_gpu_bench.settings)
    rep = one_gpu_bench.read()
    (run,) = [r for r in rep["runs"] if r["case"] == "batched"]  # beside it off's control, which passed
    assert run["rc"] == 1 and run["engaged"] is False and "batched inactive" in run["engagement"], run


def test_in_process_measurement_needs_its_program_and_local_cases(one_gpu_bench):
    (one_gpu_bench.variants / "patched" / "test-batched-transfers").unlink()
    args = _one_round(one_gpu_bench, ("inproc",), ("off", "batched"))
    with pytest.raises(BenchError, match="no test-batched-transfers next to llama-bench"):
        orchestrate.bench(args, one_gpu_bench.settings)


def test_the_tensor_suite_splits_by_tensor_and_proves_each_cases_all_reduce(one_gpu_bench, monkeypatch):
    """tensor-virt on 2 virtual devices: every case -sm tensor with its GGML_CUDA_ALLREDUCE, the test-only baseline's
    folder, the all-reduce path each process took (upstream's internal, the butterfly, the bridge's all-reduce)."""
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 1)
    rep = _run(one_gpu_bench, "t", suite="tensor-virt", measure=("bench",), rounds=1, run_lengths=(1,), tg=0)
    lines = one_gpu_bench.order.read_text().splitlines()
    assert len(lines) == 7 and all(" sm=tensor " in x for x in lines)
    assert sum(x.startswith("nopeer-virtual ") for x in lines) == 2, "the baseline and its A/A twin"
    # upstream's internal all-reduce at its BF16 default and in F32 (the byte-exact comparison of two devices)
    assert sorted(re.search(r" bf16=(\S*)", x)[1] for x in lines if " ar=internal " in x) == ["", "0"]  # type: ignore[index]
    assert {re.search(r" ar=(\S*)", x)[1] for x in lines} == {"internal", "none", "butterfly"}  # type: ignore[index]
    runs = {r["case"]: r for r in rep["runs"]}
    assert "internal on 2 devices" in runs["tensor-upstream-internal"]["engagement"]
    assert "bridge on 2 devices" in runs["tensor-bridge-force"]["engagement"]
    assert "butterfly on 2 devices" in runs["tensor-bridge-force-butterfly"]["engagement"]
    assert all(r["engaged"] is not False for r in rep["runs"])
    monkeypatch.setenv("FAKE_NO_META", "1")  # no Meta device: the cases did not split by tensor
    args = one_gpu_bench.args(
        "u",
        microbench=False,
        suite="tensor-virt",
        measure=("bench",),
        rounds=1,
        run_lengths=(1,),
        tg=0,
    )
    with pytest.raises(BenchError, match="tensor-upstream-internal, tensor-upstream-internal-f32 did not engage"):
        orchestrate.bench(args, one_gpu_bench.settings)


def test_the_tensor_suite_reports_ratios_against_its_baselines(one_gpu_bench, monkeypatch):
    """tensor-virt's report: every case against the emulated no-peer baseline and upstream's own paths, in
    bench.json and as well-formed columns of bench.md (its cases used to be no reference at all: no ratio, and a
    table whose header had one column more than its separator)."""
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 1)
    rep = _run(one_gpu_bench, "t", suite="tensor-virt", measure=("bench",), rounds=2, run_lengths=(1,), tg=0)
    ratios = rep["ratios"]
    assert {"tensor-nopeer-virtual", "tensor-upstream", "tensor-upstream-internal"} <= set(ratios)
    assert "pp512/ub512@r1" in ratios["tensor-upstream-internal-f32"]["tensor-bridge-force"]
    assert "pp512/ub512@r1" in ratios["tensor-nopeer-virtual"]["tensor-bridge-force"]
    # the bridge's all-reduce against what it replaces, the butterfly through the bridge's copies
    assert "pp512/ub512@r1" in ratios["tensor-bridge-force-butterfly"]["tensor-bridge-force"]
    md = (one_gpu_bench.tmp / "t" / "bench.md").read_text().splitlines()
    head = next(i for i, x in enumerate(md) if x.startswith("| test |"))
    assert md[head].count("|") == md[head + 1].count("|") == md[head + 2].count("|")
    assert "vs tensor-nopeer-virtual" in md[head] and "tensor-bridge-force " in md[head + 2]
