"""``ggml-bridge doctor``'s run: gather the findings (NVML, the builds and their device lists, the CPU, the model,
the probe, the RPC endpoints), derive the advice, write the report (stdout: text or JSON; ``--out``: report.txt,
doctor.json, probe.txt and pairs.png) and return the exit status.

Nothing to find is a finding: a machine without GPUs, without the NVIDIA driver or without a CUDA build gets a
report of what is there and exit 0. Bad input (an endpoint that is not host:port, a model that is not a GGUF
file, an --out that is a file) is a UsageError before anything runs; RPC endpoints that fail their check get one
line each in the report, then the one-line RpcError (exit 41).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from pathlib import Path

from ...distribution.builder import locate
from ...foundations import cache, files
from ...foundations.config import Settings
from ...foundations.errors import CacheError, NotBuiltError, RpcError, ServeError, ToolchainError, UsageError, os_reason
from ...foundations.runner import log, step
from ...runtime import modes, rpc
from . import inventory, nvml, probe, report
from .facts import WATCHED_ENV, Findings, Options
from .plot import PLOT_SUFFIXES, plot_pairs
from .recommend import recommend

PROBE_PROGRAM = "test-mapped-host-bridge"
#: seconds the probe gets beyond its own budget before it is stopped (CUDA start-up, freeing, a slow machine)
PROBE_GRACE_S = 90.0
#: seconds NVML may take for the whole inventory before the doctor goes on without it (a GPU that fell off the bus
#: hangs nvmlInit); never more than the probe's time budget
NVML_TIMEOUT_S = 20.0
#: the most of a saved probe output the doctor reads (a real one is a few hundred KiB)
PROBE_FILE_MAX = 64 << 20


def _read_saved(path: Path) -> str:
    """A saved probe output, at most PROBE_FILE_MAX bytes of it (undecodable bytes replaced)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(PROBE_FILE_MAX)
    except OSError as e:
        raise UsageError(
            f"cannot read --probe-output {path}", why=os_reason(e), fix="pass a file a probe run wrote"
        ) from None
    return data.decode("utf-8", errors="replace")


def run(opts: Options, settings: Settings) -> int:
    opts = _validate(opts)
    f = gather(opts, settings)
    rec = recommend(f, _default_server(settings))
    text, doc = report.render(f, rec), report.dumps(f, rec)
    plot_file = opts.plot or (opts.out / "pairs.png" if opts.out else None)
    if plot_file is not None and f.probe is not None and _plot(f.probe, plot_file):
        log(f"pair bandwidth plot: {plot_file}")
    if opts.out is not None:
        _write(opts.out / "report.txt", text)
        _write(opts.out / "doctor.json", doc)
        log(f"report: {opts.out / 'report.txt'}, {opts.out / 'doctor.json'}")
    print(doc if opts.json else text, end="", flush=True)
    for w in rec.warnings:
        log(f"ggml-bridge: warning: {report.one_line(w)}")
    _raise_for_rpc(f)
    return 0


def _validate(opts: Options) -> Options:
    """Bad input, before anything runs: one line each (exit 2). The paths come back absolute and checked."""
    for spec in opts.rpc:
        rpc.parse_endpoints(spec)
    if opts.plot is not None and not opts.probe:
        raise UsageError(
            "--plot with --no-probe: there is nothing to plot",
            why="the plot shows the probe's measurements",
            fix="leave --plot out, or run the probe (or pass --probe-output)",
        )
    probe_fix, model_fix = "pass a file a probe run wrote", "pass the GGUF file you will serve"
    return dataclasses.replace(
        opts,
        probe_file=opts.probe_file and files.input_file(opts.probe_file, "--probe-output", fix=probe_fix),
        model=opts.model and files.input_file(opts.model, "--model", fix=model_fix),
        out=opts.out and files.output_dir(opts.out, "--out"),
        plot=opts.plot and files.output_file(opts.plot, "--plot", suffixes=PLOT_SUFFIXES),
    )


def _write(path: Path, text: str) -> None:
    """A file of the report in the user's --out folder: an OS error (a full disk) is a UsageError naming it."""
    try:
        cache.write_text_atomic(path, text)
    except CacheError as e:
        raise UsageError(e.what, why=e.why, fix="free space there, or pass another --out") from None


def _plot(p: probe.ProbeResult, out: Path) -> Path | None:
    try:
        return plot_pairs(p, out)
    except OSError as e:
        raise UsageError(
            f"cannot write the plot {out}", why=os_reason(e), fix="free space there, or pass another --plot"
        ) from None


def gather(opts: Options, settings: Settings) -> Findings:
    with step("inventory: NVML, builds, devices"):
        f = Findings(
            when=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            host=socket.gethostname(),
            options=opts,
            env={k: os.environ[k] for k in WATCHED_ENV if k in os.environ},
            nvml=nvml.read(timeout_s=min(NVML_TIMEOUT_S, opts.budget_s)),
            cpu=inventory.cpu_info([], []),
        )
        f.builds, f.notes = inventory.find_builds(settings, opts.bin_dir)
        f.listings = [inventory.list_devices(b) for b in f.builds]
        f.cpu = inventory.cpu_info(f.builds, f.listings)
        f.model = inventory.read_model(opts.model) if opts.model else None
    f.probe, f.probe_source = _probe(opts, f)
    if opts.rpc:
        with step(f"RPC endpoints: {', '.join(opts.rpc)}"):
            server = f.serving.build.server if f.serving else None
            f.rpc = inventory.check_rpc([e for s in opts.rpc for e in map(str, rpc.parse_endpoints(s))], server)
    return f


def _probe(opts: Options, f: Findings) -> tuple[probe.ProbeResult | None, str]:
    """The measurements: from a saved probe output, from the patched CUDA build's probe, or none and why."""
    if opts.probe_file is not None:
        return probe.parse(_read_saved(opts.probe_file)), f"saved probe output {opts.probe_file}"
    if not opts.probe:
        return None, "not run (--no-probe)"
    if f.nvml.status == "no-driver":
        return None, "no NVIDIA driver, nothing to measure (Vulkan and CPU devices are listed above)"
    if f.nvml.status == "ok" and not f.nvml.gpus:
        return None, "NVML lists no NVIDIA GPU"
    program = next((p for b in f.builds if b.cuda and (p := b.program(PROBE_PROGRAM)) is not None), None)
    if program is None:
        return None, (
            f"no patched CUDA build with {PROBE_PROGRAM} here: `ggml-bridge build --backend cuda` builds it (its "
            "--probe measures the links and checks peer copies)"
        )
    spec = probe.ProbeRun(
        program=program,
        budget_s=opts.budget_s,
        limit_s=opts.budget_s + PROBE_GRACE_S,
        quick=opts.quick,
        log_file=opts.out / "probe.txt" if opts.out else None,
    )
    with step(f"probe: {program.name} --probe (budget {opts.budget_s:g} s)"):
        res = probe.run(spec)
    words = f"{program} --probe" + (" --quick" if opts.quick else "")
    if res.timed_out:
        words += f" (stopped after {spec.limit_s:.0f} s)"
    elif res.exit_status not in (0, None) and not res.ended:
        words += f" (exited with {res.exit_status} before its end)"
    return res, words


def _default_server(settings: Settings) -> str | None:
    """The llama-server `ggml-bridge serve` finds without --server."""
    try:
        return str(locate.locate(settings, modes.PATCHED, "llama-server", installed=True))
    except (NotBuiltError, ServeError, ToolchainError):  # a toolkit that hangs or fails: no default server
        return None


def _raise_for_rpc(f: Findings) -> None:
    bad = [r for r in f.rpc if not r.ok]
    if bad:
        raise RpcError(
            f"{len(bad)} of {len(f.rpc)} RPC endpoint(s) failed the check ({', '.join(r.endpoint for r in bad)})",
            why="each is one line of the report above",
            fix="start or fix those rpc-servers (docs/rpc.md), or leave them out",
        )
