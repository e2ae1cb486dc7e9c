"""Orchestration: binaries, one mode's processes, one rung, and the ``ggml-bridge ladder`` command.

The schema, validity and reports are ladder.schema, ladder.validity and ladder.report.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...foundations import files, flags, runner
from ...foundations.config import Settings
from ...foundations.errors import FatalError, LadderSetupError, RpcError, ServeError
from ...foundations.flags import flag
from ...foundations.net import free_port
from ...foundations.runner import log
from ...runtime import logparse, modes, rpc, shaper
from ...runtime.llama_server import Server, ServerLog
from ...runtime.modes import Mode
from .. import model
from .artifact import Comparison, Inputs, Job, Produced, Production, Record, compare
from .binaries import Binaries, find_vocab, resolve_binaries
from .inputs import make_prompts, make_text
from .kinds import RpcFront
from .registry import ARTIFACTS
from .report import progress_line, write_reports
from .results import LadderResult, Link, ModeResult, Prepared, RungResult
from .schema import Ladder, Rung, default_ladder, load_ladder
from .sides import mode_of, side_of
from .validity import validate_front, validate_mode, validate_rpc


@dataclass(frozen=True)
class LadderOptions:
    """What ``ggml-bridge ladder`` was asked to run: every option declared once on its field (:func:`flags.flag`)."""

    ladder: Path | None = field(
        default=None,
        metadata=flag(
            "--ladder",
            parse=flags.path,
            metavar="FILE",
            help="ladder TOML (default: ladders/cpu.toml, ladders/cuda.toml or ladders/vulkan.toml after the backend)",
        ),
    )
    """The ladder file (None: ladders/<backend>.toml)."""
    report: Path | None = field(default=None, metadata=flags.report_dir("<cache>/reports/<ladder>-<time>"))
    sides: dict[str, Path] = field(default_factory=dict)
    """Side -> the folder of its binaries (``--side NAME=DIR``, ``--bin-dir-patched DIR``); a side named after a
    build variant and not given here runs that variant's latest build (the command line's own options)."""
    rungs: tuple[str, ...] = field(
        default=(), metadata=flag("--rung", metavar="NAME", takes="repeat", help="run only this rung (repeatable)")
    )
    """Only these rungs (empty: all)."""
    vocab: Path | None = field(default=None, metadata=flags.vocab(model.VOCAB_FILE))
    threads: int | None = field(
        default=None, metadata=flag("--threads", parse=flags.count(1), help="-t for every process (default: all cores)")
    )
    startup_timeout: float = field(
        default=900.0, metadata=flags.startup_timeout("each llama-server to become ready (default: 900)")
    )
    keep_logits: bool = field(
        default=False,
        metadata=flag("--keep-logits", help="keep the logits dumps of passing rungs (they are kept on mismatch)"),
    )
    allow_same_build: bool = field(
        default=False,
        metadata=flag(
            "--allow-same-build",
            help="allow identical patched and upstream binaries (development only: such a "
            "comparison proves nothing about the patches)",
        ),
    )


@dataclass(frozen=True)
class RunContext:
    """What every rung of one run shares: the ladder, the sides' binaries, the vocabulary the models are made from,
    where models and reports go, the processes' threads and start-up timeout, whether logits are kept."""

    ladder: Ladder
    bins: Binaries
    vocab: Path
    models_dir: Path
    report_dir: Path
    threads: int
    startup_timeout: float
    keep_logits: bool = False


def _device_env(rung: Rung) -> dict[str, str]:
    env: dict[str, str] = {}
    if modes.VK_DEVICES in rung.env:
        return env  # Vulkan devices, named by the rung itself (e.g. "0,0": two devices on one); no CUDA here
    if rung.devices > 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(rung.devices)]
        if len(ids) < rung.devices:
            raise LadderSetupError(f"rung {rung.name} needs {rung.devices} GPUs; CUDA_VISIBLE_DEVICES={visible}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[: rung.devices])
        if rung.virtual_devices:
            env[modes.CUDA_DEVICES] = str(rung.virtual_devices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@dataclass
class ModeRun:
    mode: str
    wall_s: float = 0.0
    artifacts: dict[str, Path] = field(default_factory=dict)  # by artifact name, those the mode produced
    logs: dict[str, logparse.LogInfo] = field(default_factory=dict)
    metrics: dict[str, int] | None = None  # the server's transfer counters on /metrics after the requests
    error: str | None = None
    rpc_servers: dict[str, logparse.RpcServerInfo] = field(default_factory=dict)  # by endpoint, rpc-* modes
    links: dict[str, Link] = field(default_factory=dict)  # by endpoint: what crossed its shaped link


def run_mode(mode: Mode, rung: Rung, side: str, inputs: Inputs, out: Path, ctx: RunContext) -> ModeRun:
    out.mkdir(parents=True, exist_ok=True)
    b, threads = ctx.bins.by_side[side], ctx.threads
    rung = dataclasses.replace(rung, devices=mode.devices, virtual_devices=None) if mode.devices else rung
    allreduce = {modes.ALLREDUCE: modes.ALLREDUCE_VALUES[rung.allreduce]} if rung.allreduce else {}
    env = {**_device_env(rung), **allreduce, **mode.env(), **rung.env}
    lib_dir = str(b["llama-server"].resolve().parent)
    env["LD_LIBRARY_PATH"] = lib_dir + (
        ":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""
    )
    res = ModeRun(mode.name)
    t0 = time.monotonic()
    topo, env = _rpc_topology(mode, rung, b, env, threads, out)
    job = Job(mode, rung, b, env, out, threads)
    try:
        if topo:
            topo.start(rpc.expected_version(b["llama-server"]))
            job = dataclasses.replace(job, extra=(*topo.server_args(), "-ngl", "999"))  # the shapers' ends exist now
        _serve(job, res, inputs, ctx.startup_timeout)
        for a in ARTIFACTS.values():
            if a.stage == "after" and a.name not in rung.skips:
                _keep(res, a.name, a.produce(Production(job, inputs)))
        if topo and mode.variant == "patched":
            topo.counters()  # one counters line per server, parsed below
    except FatalError as e:
        try:
            rpc.raise_if_dead(topo, f"in mode {mode.name}")
            res.error = str(e)
        except RpcError as dead:
            res.error = f"{dead} ({e})"
    finally:
        if topo:
            topo.stop()
            res.rpc_servers = {str(s.endpoint): s.info() for s in topo.local}
            res.links = {ep: Link.of(stats) for ep, stats in topo.link_stats().items()}
    res.wall_s = time.monotonic() - t0
    return res


def _rpc_topology(
    mode: Mode, rung: Rung, b: dict[str, Path], env: dict[str, str], threads: int, out: Path
) -> tuple[rpc.Topology | None, dict[str, str]]:
    """An rpc mode's local rpc-servers (not started) and the front's environment: the GPUs belong to the
    rpc-servers, llama-server and llama-perplexity get none (unless the rung's front is :attr:`RpcFront.GPU`: the
    front keeps the rung's GPUs, as a host with its own GPU plus rpc-servers)."""
    if not mode.rpc:
        return None, env
    topo = rpc.Topology(
        [
            rpc.LocalRpcServer(
                b[rpc.RPC_SERVER],
                devices=d,
                env={**env, **(rung.rpc_env[i] if rung.rpc_env else {})},
                threads=threads,
                log_file=out / f"rpc-server-{i}.log",
            )
            for i, d in enumerate(rung.rpc_servers)
        ],
        link=shaper.parse_link(rung.rpc_link) if rung.rpc_link else None,
    )
    if rung.rpc_front is RpcFront.BARE:
        env = {**env, "CUDA_VISIBLE_DEVICES": ""}
    elif mode.uses_bridge:  # an rpc mode's bridge selector is the rpc-servers'; the front is validated as off
        env = {**env, modes.BRIDGE: "0"}
    return topo, env


def _keep(res: ModeRun, name: str, made: Produced) -> None:
    res.artifacts[name] = made.path
    res.logs.update(made.logs)


def _serve(job: Job, res: ModeRun, inputs: Inputs, startup_timeout: float) -> None:
    """llama-server on a free port, the artifacts of the ``server`` stage (the requests' responses), its /metrics."""
    rung = job.rung
    sargs = [
        "-m",
        str(inputs.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "-c",
        str(rung.server_ctx()),
        "-np",
        "1",
        "--no-webui",
        "--metrics",
        *job.common_args(),
        *job.extra,
        *rung.server_args,
    ]
    slog = job.out / "server.log"
    slog.unlink(missing_ok=True)
    srv = Server(job.programs["llama-server"], sargs, env=job.env, log=ServerLog(slog), startup_timeout=startup_timeout)
    srv.start()
    try:
        for a in ARTIFACTS.values():
            if a.stage == "server" and a.name not in rung.skips:
                _keep(res, a.name, a.produce(Production(job, inputs, srv)))
        res.metrics = srv.metrics()
    finally:
        rc = srv.stop()
    res.logs["server"] = srv.info()
    if rc not in (0, None):
        raise ServeError(
            f"llama-server exited with status {rc} when stopped",
            why="last lines:\n    " + "\n    ".join(srv.tail(10)),
        )


@dataclass
class _Outcome:
    """A rung's status (:data:`~.results.STATUSES`) and problems as its modes run and compare."""

    status: str = "pass"
    problems: list[str] = field(default_factory=list)


def run_rung(rung: Rung, ctx: RunContext) -> RungResult:
    t0 = time.monotonic()
    out = ctx.report_dir / rung.name
    inputs, prepared, failed = _prepare(rung, ctx, out)
    if inputs is None:
        return RungResult(rung, "error", (), {}, prepared, time.monotonic() - t0, error=str(failed))
    runs: dict[str, ModeRun] = {}
    entries: dict[str, ModeResult] = {}
    outcome = _Outcome()
    order = [rung.reference] + [m for m in rung.modes if m != rung.reference]
    for name in order:
        mode, side = mode_of(name), side_of(name)
        runner.log(f"    {rung.name}: mode {name}")
        mr = run_mode(mode, rung, side, inputs, out / name.replace(":", "@"), ctx)
        runs[name] = mr
        entries[name] = _mode_entry(outcome, name, rung, mr)
        if name == rung.reference and mr.error:
            break  # nothing to compare against
    compared = _compare(outcome, rung, runs)
    modes = {n: dataclasses.replace(e, compare=compared[n]) if n in compared else e for n, e in entries.items()}
    if not ctx.keep_logits and outcome.status in ("pass", "invalid"):
        for mr in runs.values():
            for a in ARTIFACTS.values():
                if a.disposable and a.name in mr.artifacts:
                    mr.artifacts[a.name].unlink(missing_ok=True)
    wall = round(time.monotonic() - t0, 2)
    return RungResult(rung, outcome.status, tuple(outcome.problems), modes, prepared, wall)


def _prepare(rung: Rung, ctx: RunContext, out: Path) -> tuple[Inputs | None, Prepared, FatalError | None]:
    """The rung's model (cached), its perplexity text and its prompts, and what they are; on a setup error, what
    was made before it and the error."""
    prepared = Prepared()
    try:
        vt = model.load_vocab(ctx.vocab)
        prepared = Prepared(rung.shape.n_params(len(vt.tokens)), rung.shape.n_embd * rung.ubatch * 4 / (1 << 20))
        mpath = model.ensure_model(ctx.models_dir, rung.shape, rung.seed, ctx.vocab)
        prepared = dataclasses.replace(prepared, model=str(mpath))
        out.mkdir(parents=True, exist_ok=True)
        text = out / "text.txt"
        pc = rung.perplexity_ctx()
        text.write_text(make_text(2 * pc + pc // 2 + 64, ctx.ladder.text_seed, vt.tokens), encoding="utf-8")
        prepared = dataclasses.replace(prepared, prompt_words=tuple(rung.prompts_words()))
        return Inputs(mpath, text, make_prompts(rung, ctx.ladder.text_seed, vt.tokens)), prepared, None
    except FatalError as e:
        return None, prepared, e


def _mode_entry(outcome: _Outcome, name: str, rung: Rung, mr: ModeRun) -> ModeResult:
    """One mode's result: its artifacts, and its error or its validity (which may fail the rung)."""
    mode = mode_of(name)
    artifacts = {a: Record.of(mr.artifacts.get(a)) for a in ARTIFACTS}
    entry = ModeResult(round(mr.wall_s, 2), side_of(name), mode.variant, mode.env(), artifacts)
    if mr.error:
        outcome.status = "error"
        outcome.problems.append(f"{name}: {mr.error}")
        return dataclasses.replace(entry, error=mr.error)
    front = dataclasses.replace(mode, bridge="off" if mode.bridge else None) if mode.rpc else mode
    v = validate_mode(
        front,
        dataclasses.replace(rung, devices=mode.devices, virtual_devices=None) if mode.devices else rung,
        mr.logs,
        mr.metrics,
    )
    if mode.rpc:
        front_problems = tuple(validate_front(rung, mr.logs)) if rung.rpc_front is RpcFront.GPU else ()
        v = v.with_rpc(validate_rpc(mode, mr.rpc_servers, rung, mr.links), front_problems)
    if not v.ok:
        if outcome.status == "pass":
            outcome.status = "invalid"
        outcome.problems += [f"{name}: {p}" for p in v.problems]
    return dataclasses.replace(entry, validity=v)


def _compare(outcome: _Outcome, rung: Rung, runs: dict[str, ModeRun]) -> dict[str, dict[str, Comparison]]:
    """Every mode's artifacts against the reference's, byte for byte, by mode (those compared)."""
    ref = runs.get(rung.reference)
    found: dict[str, dict[str, Comparison]] = {}
    if ref is None or ref.error:
        return found
    for name, mr in runs.items():
        if name == rung.reference or mr.error:
            continue
        cmp = found[name] = {}
        for kind, art in ARTIFACTS.items():
            a, b = ref.artifacts.get(kind), mr.artifacts.get(kind)
            if a is None or b is None:
                continue
            c = cmp[kind] = compare(art, a, b)
            if c.first_difference is not None:
                outcome.status = "mismatch"
                fd = c.first_difference
                outcome.problems.append(
                    f"{name}: {kind} differ from {rung.reference} at byte {fd.get('offset')} ({fd.get('where')})"
                )
    return found


def run(args: LadderOptions, settings: Settings) -> int:
    ladder = load_ladder(args.ladder or default_ladder(settings))
    rungs = ladder.rungs
    if args.rungs:
        unknown = set(args.rungs) - {r.name for r in rungs}
        if unknown:
            raise LadderSetupError(
                f"no rung named {', '.join(sorted(unknown))} in {ladder.path}",
                fix=f"rungs: {', '.join(r.name for r in rungs)}",
            )
        rungs = [r for r in rungs if r.name in args.rungs]
    given_report = files.output_dir(args.report, "--report") if args.report else None  # before any build is looked at
    needed = {side_of(m): ladder.sides[side_of(m)] for r in rungs for m in r.modes}
    unknown_sides = set(args.sides) - set(ladder.sides)
    if unknown_sides:
        raise LadderSetupError(
            f"--side {', '.join(sorted(unknown_sides))}: the ladder {ladder.path} has no such side",
            fix=f"its sides: {', '.join(ladder.sides)}",
        )
    bins = resolve_binaries(
        args.sides, settings, ladder.backend, needed, any(mode_of(m).rpc for r in rungs for m in r.modes)
    )
    if bins.same_build and not args.allow_same_build:
        raise LadderSetupError(
            "the patched and upstream binaries are the same build",
            why="comparing a build with itself proves nothing about the patches",
            fix="point --bin-dir-upstream (--side upstream=DIR) at an unpatched build (or pass --allow-same-build for "
            "development)",
        )
    vocab = find_vocab(args.vocab, settings, bins)
    model.load_vocab(vocab)  # an unreadable vocabulary is a model error (71) now, not a failed rung later
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report_dir = given_report or settings.layout.report(f"{ladder.name}-{stamp}")
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LadderSetupError(f"cannot create report directory {report_dir}", why=str(e)) from None
    threads = args.threads or os.cpu_count() or 1
    ctx = RunContext(
        ladder, bins, vocab, settings.layout.models, report_dir, threads, args.startup_timeout, args.keep_logits
    )
    binaries: dict[str, str | None] = {"patched": None, "upstream": None, **bins.folders()}
    rep = LadderResult(
        ladder.name, str(ladder.path), ladder.backend, stamp, str(vocab), threads, binaries, bins.same_build
    )
    log(f"==> ladder {ladder.name}: {len(rungs)} rung(s) from {ladder.path}; report in {report_dir}")
    t0 = time.monotonic()
    for i, rung in enumerate(rungs, 1):
        r = run_rung(rung, ctx)
        rep = rep.add(r, time.monotonic() - t0)
        log(progress_line(i, len(rungs), r))
        write_reports(rep, report_dir)  # partial report after every rung
    statuses = [r.status for r in rep.rungs]
    if any(s in ("mismatch", "invalid") for s in statuses):
        status, rc = "fail", 1
    elif "error" in statuses:
        status, rc = "error", LadderSetupError.exit_code
    else:
        status, rc = "pass", 0
    rep = dataclasses.replace(rep, status=status, wall_s=round(time.monotonic() - t0, 2))
    write_reports(rep, report_dir)
    log(
        f"==> ladder {ladder.name}: {rep.status.upper()} "
        f"({statuses.count('pass')}/{len(statuses)} rungs passed) in {rep.wall_s:.1f}s"
    )
    if bins.same_build:
        log(
            "    warning: patched and upstream binaries are the same build (--allow-same-build): the upstream "
            "comparisons prove nothing about the patches"
        )
    print(report_dir / "report.md")
    return rc
