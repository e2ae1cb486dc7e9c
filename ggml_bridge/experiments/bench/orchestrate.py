"""``ggml-bridge bench``'s run (the package's docstring says what it measures and how): the suite, the part of its
matrix, the cases, the builds and the models of a run, the rounds, and the report assembled and written."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
from pathlib import Path

from ...foundations import files
from ...foundations.cache import file_sha256
from ...foundations.config import Settings
from ...foundations.errors import BenchError, UsageError
from ...foundations.runner import log, step
from ...runtime import modes, netbench
from .measures import MEASURES, prepare_inputs
from .options import BenchOptions, checked
from .report import plot, pool_reports, write
from .results import CaseEntry, Model, Report, SmiRecord
from .running import CopyRate, Setup, microbench, rounds
from .stats import CaseRun, Sample, pool
from .suite import Suite
from .suites import SUITES, SUITES_FILE, Selection, load_suites, select
from .telemetry import Telemetry, gpu_env, n_gpus

#: A case is a mode of :mod:`modes` (build variant, selectors, which mechanism must engage): one table for the
#: ladder and the bench. ``rpc`` modes: the model on one local ggml-rpc-server of the case's build owning every
#: GPU (or the CPU), llama-bench with --rpc and no GPU of its own: boundaries between its GPUs are that
#: server's COPY_TENSOR.
Case = modes.Mode
CASES = modes.MODES


def resolve_bins(args: BenchOptions, settings: Settings, variants: set[str]) -> dict[str, Path]:
    """Directory holding llama-bench for each variant: --variants-dir, --bin-dir-*, or the build stage."""
    from ...distribution.builder import locate, single  # the build stage needs git tooling only when it is used
    from ...foundations.errors import NotBuiltError

    dirs: dict[str, Path] = {}
    for v in sorted(variants):
        override = args.bin_dirs.get(v)
        if override is None and args.variants_dir is not None:
            override = Path(args.variants_dir) / modes.VARIANTS[v].subdir
        try:
            dirs[v] = locate.locate(settings, v, "llama-bench", override).parent
            continue
        except NotBuiltError as e:
            if override is not None:
                raise BenchError(f"llama-bench not found in {override}", fix=f"build the {v} variant there") from None
            if not args.build:
                log(f"    no {v} build ({e.what}); --build would make it")
                continue
        try:
            with step(f"build {v}"):
                dirs[v] = single.ensure(settings, v).bin_dir
        except UsageError as e:  # e.g. upstream-nopeer on a CPU-only machine: that case is skipped
            log(f"    cannot build {v}: {e}")
    return dirs


def run(args: BenchOptions, settings: Settings) -> int:
    """Stage entry point (``ggml-bridge bench``)."""
    return bench(args, settings)


def bench(args: BenchOptions, settings: Settings) -> int:
    if args.model is not None and not Path(args.model).is_file():  # before any build, model or measurement
        raise UsageError(f"--model {args.model} not found", fix="give a GGUF file, or leave --model out")
    if args.pool:
        if args.report is None:
            raise UsageError(
                "--pool needs --report DIR",
                why="the pooled report is a new report",
                fix="e.g. --pool a/bench.json b/bench.json --report pooled",
            )
        return pool_reports(list(args.pool), args.report)
    args = checked(args)
    if not args.cpus:
        return _bench(args, settings)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, args.cpus.ids)  # inherited by every llama-bench process of the run
    except (ValueError, OSError) as e:
        raise UsageError(
            f"cannot run on CPUs {args.cpus.given!r}",
            why=str(e),
            fix=f"give CPUs this process may use, e.g. 0-{(os.cpu_count() or 1) - 1}",
        ) from None
    log(f"    every case runs on CPUs {args.cpus.given} ({len(args.cpus.ids)} CPUs)")
    try:
        return _bench(args, settings)
    finally:
        os.sched_setaffinity(0, before)


def _suite(args: BenchOptions, gpus: int) -> tuple[str, Suite]:
    """The suite's name and settings: --suite of --suite-file or of the package's suites (default: multi-gpu with
    2+ GPUs, batched with 1, cpu without)."""
    suites = load_suites(args.suite_file) if args.suite_file is not None else SUITES
    name = args.suite or ("multi-gpu" if gpus >= 2 else "batched" if gpus == 1 else "cpu")
    if name not in suites:
        where = args.suite_file or SUITES_FILE
        raise UsageError(f"no suite {name!r} in {where}", fix=f"suites there: {', '.join(suites)}")
    return name, suites[name]


def _selection(args: BenchOptions, name: str, suite: Suite) -> Selection:
    """The part of the suite's matrix to run; run lengths and kept-after-discarded repetitions are exclusive."""
    sel = select(
        name,
        suite,
        shapes=args.shapes,
        run_lengths=args.run_lengths,
        measures=args.measure,
        user_model=args.model is not None,
    )
    given = [o for o, v in (("--reps", args.reps), ("--warmup-reps", args.warmup_reps)) if v is not None]
    if sel.run_lengths and given:
        raise UsageError(
            f"{' and '.join(given)} with run lengths ({','.join(map(str, sel.run_lengths))})",
            why="a run of -r N keeps every repetition; --reps and --warmup-reps belong to runs without run lengths",
            fix=f"leave out {' and '.join(given)}, or choose a suite without run lengths",
        )
    return sel


def _devices(args: BenchOptions, name: str, suite: Suite, gpus: int) -> tuple[int, list[str]]:
    """(virtual devices or 0, what cannot be measured here); BenchError when the suite cannot run at all."""
    skipped: list[str] = []
    if gpus == 0 and suite.devices != "cpu":
        raise BenchError(
            f"suite {name} needs CUDA GPUs and none is visible", fix="run it on a GPU machine, or use --suite cpu"
        )
    if gpus == 0:
        skipped.append(
            "no CUDA device: P2P, staged, no-peer and bridge throughput, the boundary microbenchmark, "
            "and batched transfers (they need a device with pinned host memory) cannot be measured "
            "here; only the CPU cases ran"
        )
    virtual_devices = args.virtual_devices or suite.virtual_devices
    if suite.devices == "all" and gpus < 2 and not virtual_devices:
        raise BenchError(
            f"suite {name} needs 2+ GPUs (found {gpus})",
            fix="use --virtual-devices N to emulate cards, or --suite batched",
        )
    return virtual_devices, skipped


def _cases(args: BenchOptions, suite: Suite, gpus: int, virtual_devices: int) -> list[Case]:
    """The cases to run (the suite's or --cases), forced where virtual devices share a GPU, one per shaped link."""
    wanted = args.cases or suite.cases
    try:  # current names (older ones with a deprecation note, see modes.ALIASES)
        cases = [modes.lookup(c, "--cases") for c in wanted]
    except UsageError as e:
        raise BenchError(e.what, why=e.why, fix=e.fix) from None
    if virtual_devices and gpus < virtual_devices:
        forced = [c.name for c in cases if c.name in modes.FORCED_ON_VIRTUAL]
        cases = [modes.MODES[modes.FORCED_ON_VIRTUAL.get(c.name, c.name)] for c in cases]
        if forced:
            log(
                f"    {virtual_devices} virtual devices on {gpus} GPU(s): {', '.join(forced)} measured forced (auto "
                "keeps virtual devices of one GPU on upstream's device-local copy)"
            )
    links = list(args.links or suite.links)
    try:
        cases = netbench.expand(cases, links)
    except UsageError as e:
        raise BenchError(e.what, why=e.why, fix=e.fix) from None
    odd = [c.name for c in cases if c.devices or c.rejected]
    if odd:
        raise BenchError(
            f"mode(s) {', '.join(odd)} are ladder checks, not bench cases",
            fix=f"cases: {', '.join(n for n, m in CASES.items() if not (m.devices or m.rejected))}",
        )
    return cases


def _local(cases: list[Case], measures: tuple[str, ...]) -> None:
    """UsageError for measurements other than llama-bench's with rpc cases (before anything is built)."""
    wall = [m for m in measures if not MEASURES[m].remote]
    rpc_cases = [c.name for c in cases if c.rpc]
    if wall and rpc_cases:
        raise UsageError(
            f"--measure {','.join(wall)} with rpc case(s) {', '.join(rpc_cases)}",
            why=f"{', '.join(MEASURES[m].program for m in wall)} measure with local devices only",
            fix="use --measure bench, or cases without rpc-servers",
        )


def _programs(bins: dict[str, Path], cases: list[Case], measures: tuple[str, ...]) -> None:
    """The programs of the measurements next to llama-bench in every build they need (the in-process one: in the
    builds of the cases with batching, whose jobs run it)."""
    for m in (MEASURES[name] for name in measures):
        for v in sorted({c.variant for c in cases if m.needs_program(c)}):
            if not (bins[v] / m.program).is_file():
                raise BenchError(
                    f"no {m.program} next to llama-bench in {bins[v]}",
                    fix=f"build the {v} variant there, or leave {m.name} out of --measure",
                )


def _models(
    args: BenchOptions, settings: Settings, shapes: tuple[str, ...], bins: dict[str, Path]
) -> tuple[dict[str, Path], list[str] | None]:
    """The model of every shape (--model, or the random models, written once into the cache) and the vocabulary's
    tokens (None with --model and no --vocab)."""
    from .. import model as modelmod

    vocab = args.vocab or modelmod.find_vocab(settings.layout.root, *[d.parent.parent for d in bins.values()])
    tokens = list(modelmod.load_vocab(vocab).tokens) if vocab is not None else None
    if args.model is not None:
        return {shapes[0]: args.model}, tokens
    if vocab is None:
        raise BenchError(
            "no vocabulary GGUF for the random model",
            fix=f"pass --vocab PATH/{modelmod.VOCAB_FILE} (in the upstream tree's models/)",
        )
    models = {}
    for shape in shapes:
        with step(f"model {shape}"):
            models[shape] = modelmod.ensure_model(settings.layout.models, shape, 1234, vocab)
    return models, tokens


def _bench(args: BenchOptions, settings: Settings) -> int:
    gpus = n_gpus()
    suite_name, suite = _suite(args, gpus)
    if args.ubatch is not None:
        suite = dataclasses.replace(suite, ubatch=args.ubatch)
    if args.tg is not None:
        suite = dataclasses.replace(suite, tg=args.tg)
    sel = _selection(args, suite_name, suite)
    virtual_devices, skipped = _devices(args, suite_name, suite, gpus)
    cases = _cases(args, suite, 1 if suite.devices == "1" else gpus, virtual_devices)
    _local(cases, sel.measures)
    if args.report is not None:  # the options are checked; the report folder before any build or model
        args = dataclasses.replace(args, report=files.output_dir(args.report, "--report"))
    bins = resolve_bins(args, settings, {c.variant for c in cases})
    runnable = [c for c in cases if c.variant in bins]
    skipped += [f"{c.name}: no {c.variant} build" for c in cases if c not in runnable]
    if not runnable:
        raise BenchError(
            "no case can run: no build of any variant it needs",
            fix="build them (ggml-bridge build --variant ...) or pass --variants-dir",
        )
    _programs(bins, runnable, sel.measures)
    base_env: dict[str, str] = {modes.NCCL_NVLS: "0"}
    if suite.devices == "1":
        base_env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    if virtual_devices:
        base_env[modes.CUDA_DEVICES] = str(virtual_devices)
    models, tokens = _models(args, settings, sel.shapes, bins)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.report or settings.layout.report(f"bench-{suite_name}-{stamp}")
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    setup = Setup(
        {c.name: c for c in runnable},
        bins,
        models,
        suite,
        base_env,
        out_dir / "logs",
        rounds=args.rounds or suite.rounds,
        time_budget=args.time_budget,
        reps=args.reps or 3,
        warmup=1 if args.warmup_reps is None else args.warmup_reps,
        timeout=args.timeout,
        run_lengths=sel.run_lengths,
        measures=sel.measures,
        keyed_by_shape=sel.keyed_by_shape,
        inputs=prepare_inputs(suite, sel.measures, out_dir, tokens),
    )
    micro = args.microbench and (gpus >= 2 or bool(virtual_devices))
    report = _measure(setup, suite_name, sel, args.smi, micro)
    return _write(
        dataclasses.replace(report, cpus=args.cpus.given if args.cpus else None, skipped=tuple(skipped)), out_dir
    )


def _measure(setup: Setup, suite_name: str, sel: Selection, smi_ms: int | None, micro: bool) -> Report:
    """The rounds (with --smi's sampling around them) and the boundary microbenchmark; the report."""
    runs: list[CaseRun] = []
    samples: list[Sample] = []
    smi = Telemetry(setup.logs / "smi.csv", smi_ms).start() if smi_ms is not None else None
    try:
        stopped = rounds(setup, runs, samples, smi)
    finally:
        if smi is not None:
            smi.stop()
    mb: list[CopyRate] = []
    if micro and modes.PATCHED in setup.bins:
        with step("boundary microbenchmark"):
            mb = microbench(setup.bins[modes.PATCHED], setup.base_env, setup.logs)
    suite = setup.suite
    settings: dict[str, object] = {"pp": suite.pp, "batch": suite.batch, "ubatch": list(suite.ubatch), "tg": suite.tg}
    settings["devices"] = suite.devices
    settings |= {m.name: dict(suite.tables[m.name]) for m in MEASURES.values() if m.name in suite.tables}
    if modes.CUDA_DEVICES in setup.base_env:
        settings[modes.CUDA_DEVICES] = int(setup.base_env[modes.CUDA_DEVICES])
    return Report(
        suite=suite_name,
        about=suite.about,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        host=platform.node(),
        rounds_planned=setup.rounds,
        stopped=stopped,
        time_budget=setup.time_budget,
        reps=None if sel.run_lengths else setup.reps,
        warmup_reps=0 if sel.run_lengths else setup.warmup,
        run_lengths=sel.run_lengths or None,
        shapes=sel.shapes,
        keyed_by_shape=sel.keyed_by_shape,
        measures=sel.measures,
        settings=settings,
        model=Model(", ".join(setup.models), str(next(iter(setup.models.values())))),
        models={k: str(v) for k, v in setup.models.items()},
        environment=gpu_env(),
        links=netbench.report(list(setup.cases.values()), suite.rpc_servers, suite.rpc_front_gpu),
        cases=tuple(_case_entry(c, setup.bins, runs) for c in setup.cases.values()),
        manifests=_manifests(setup.bins),
        figures=pool(list(setup.cases), samples, runs),
        samples=tuple(samples),
        runs=tuple(runs),
        microbench=tuple(mb),
        smi=SmiRecord(smi.interval_ms, tuple(smi.fields), len(smi.rows), "logs/smi.csv") if smi is not None else None,
    )


def _case_entry(c: Case, bins: dict[str, Path], runs: list[CaseRun]) -> CaseEntry:
    """A case in the report: what it is, its binaries and what its processes said about engagement (per
    measurement, the first process that did not engage, else the last one)."""
    said: dict[str, CaseRun] = {}
    for r in runs:
        if r.case == c.name and (r.measure not in said or said[r.measure].engaged is not False):
            said[r.measure] = r
    engagement = "; ".join(
        (f"{MEASURES[m].program}: " if len(said) > 1 else "") + r.engagement for m, r in said.items() if r.engagement
    )
    sha256 = file_sha256(bins[c.variant] / "llama-bench")
    return CaseEntry(c.name, c.variant, c.env(), c.link, c.about, str(bins[c.variant]), sha256, engagement)


def _write(report: Report, out_dir: Path) -> int:
    """bench.json, bench.md and the plots; BenchError when a case failed or did not engage."""
    write(report, out_dir)
    plot(report, out_dir)
    log(f"==> report: {out_dir / 'bench.md'}")
    print(out_dir)
    failed, not_engaged = report.figures.failed, report.figures.not_engaged
    if failed:
        programs = sorted({MEASURES[r.measure].program for r in report.runs if r.rc != 0})
        raise BenchError(
            f"{' and '.join(programs)} failed for case(s) {', '.join(failed)}",
            fix=f"see the logs in {out_dir / 'logs'}",
        )
    if not_engaged:
        raise BenchError(
            f"case(s) {', '.join(not_engaged)} did not engage their mechanism",
            why="their figures would be upstream's path under another name",
            fix=f"see the engagement lines in {out_dir / 'bench.md'} and the logs in {out_dir / 'logs'}",
        )
    return 0


def _manifests(bins: dict[str, Path]) -> dict[str, object]:
    """The build manifest of every variant (upstream commit, patches, series hash, cmake_args, ...), from next to
    its binaries where the build stage wrote it: what the figures were measured on."""
    out: dict[str, object] = {}
    for v, d in bins.items():
        for cand in (d / "manifest.json", d.parent / "manifest.json", d.parent.parent / "manifest.json"):
            m = files.read_record(cand) if cand.is_file() else None
            if m is not None:
                out[v] = {"file": str(cand), **m}
                break
    return out
