"""Running the cases: one llama-bench process per case and round (with its own rpc-server for the rpc
modes), whether its mechanism engaged, the interleaved rounds, and the boundary copy microbenchmark."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from .. import logparse, modes, netbench, rpc, runner
from ..engagement import BATCHED, BRIDGE, engaged
from ..errors import BenchError, RpcError
from ..runner import log
from .stats import CaseRun, Sample, test_key
from .telemetry import Telemetry

Case = modes.Mode
CASES = modes.MODES


def rotate(items: Sequence[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return list(items[k:]) + list(items[:k])


def engagement(case: Case, log_text: str) -> tuple[bool | None, str]:
    """Did the mechanism the case is about engage? (None when the case proves nothing.)"""
    if not case.mechanisms:
        return None, ""
    info = logparse.parse(log_text)
    parts: list[str] = []
    ok = True
    if "bridge" in case.mechanisms:
        b = info.bridge
        # the stats line is cumulative per process: the last one holds the run's totals
        last = b.stats[-1] if b.stats else {}
        crossed = last.get("boundaries", 0)
        ok &= engaged(BRIDGE, b, last).engaged
        parts.append(
            f"bridge {'enabled' if b.enabled else 'not enabled'} ({b.slots} slots), "
            f"boundaries={crossed} bytes={last.get('bytes', 0)}"
            + (f", inactive: {b.inactive_reason}" if b.inactive_reason else "")
        )
    if "batched" in case.mechanisms:
        t = info.batched
        last = t.stats[-1] if t.stats else {}
        up, down = last.get("async_uploads", 0), last.get("async_downloads", 0)
        # engaged: it staged uploads (the small inputs of every graph; inputs over the stage limit are upstream's);
        # downloads into llama.cpp's pinned output buffer are upstream's own asynchronous ones (upstream_downloads)
        ok &= engaged(BATCHED, t, last).engaged
        parts.append(
            f"batched {'enabled' if t.enabled else 'not enabled'}, graphs={last.get('graphs', 0)} "
            f"async_uploads={up} async_downloads={down} "
            f"sync_uploads={last.get('sync_uploads', 0)} upstream_uploads={last.get('upstream_uploads', 0)}"
            + (f", inactive: {t.inactive_reason}" if t.inactive_reason else "")
        )
    return ok, "; ".join(parts)


def rpc_engagement(case: Case, topo: rpc.Topology) -> tuple[bool | None, str]:
    """The bridge inside the case's rpc-server: its enabled line and its counters (patch 0006, SIGUSR1)."""
    if not case.mechanisms:
        return None, ""
    srv = topo.local[0]
    try:
        c = srv.counters()
    except RpcError as e:
        return False, str(e)
    info = srv.info()
    crossed = c.get("bridge_boundaries", 0)
    return (
        engaged(BRIDGE, info.bridge, c).engaged,
        f"rpc-server bridge {'enabled' if info.bridge.enabled else 'not enabled'}, boundaries={crossed} "
        f"bytes={c.get('bridge_bytes', 0)} copy_tensor={c.get('rpc_copy_tensor', 0)}"
        + ("" if c.get("bridge") else " (no bridge counters exported)")
        + (f", inactive: {info.bridge.inactive_reason}" if info.bridge.inactive_reason else ""),
    )


def run_case(
    bin_dir: Path,
    case: Case,
    model_path: Path,
    suite: dict[str, Any],
    reps: int,
    base_env: dict[str, str],
    out_dir: Path,
    rnd: int,
    timeout: float,
    warmup: int = 0,
) -> tuple[CaseRun, list[Sample]]:
    """One llama-bench process for a case: reps + warmup repetitions per test, the first ``warmup`` of each
    discarded (llama-bench's own warm-up is a short prompt, so the first full-size repetition still pays
    first-call costs: measured on H200, the first pp512 repetition of a process ran at about half speed)."""
    ub = ",".join(str(u) for u in suite["ubatch"])
    argv = [
        str(bin_dir / "llama-bench"),
        "-m",
        str(model_path),
        "-p",
        str(suite["pp"]),
        "-n",
        str(suite["tg"]),
        "-b",
        str(suite["batch"]),
        "-ub",
        ub,
        "-r",
        str(reps + warmup),
        "-o",
        "json",
        "-v",
    ]
    if suite["devices"] != "cpu" or case.rpc:
        argv += ["-ngl", "99", "-sm", "layer"]
    else:
        argv += ["-ngl", "0"]
    if suite.get("threads"):
        argv += ["-t", str(suite["threads"])]
    env = {**base_env, **case.env()}
    err_path = out_dir / f"{case.name}-r{rnd}.log"
    topo = None
    if case.rpc:  # the server gets the GPUs and the selectors, llama-bench neither GPU nor bridge (unless the
        # suite keeps its GPU: netbench.py), over a shaped link when the case has one
        topo = netbench.topology(case, bin_dir, env, suite, out_dir, rnd)
        topo.start(rpc.expected_version(bin_dir / "llama-bench"))
        argv += topo.server_args()
        env = netbench.front_env(env, suite)

    started = time.time()
    t0 = time.monotonic()
    try:
        res = runner.run(argv, env=env, check=False, error=BenchError, timeout=timeout)
        seconds = time.monotonic() - t0
        err_path.write_text(res.stderr)
        engaged, what = engagement(case, res.stderr) if topo is None else rpc_engagement(case, topo)
        if topo is not None and topo.shapers:
            through, how = netbench.link_engagement(topo)
            engaged, what = (
                (through if engaged is None else engaged and through),
                "; ".join(x for x in (what, how) if x),
            )
    finally:
        if topo:
            topo.stop()
    tail = [logparse.clean(x) for x in res.stderr.splitlines()[-15:]]
    samples: list[Sample] = []
    if res.returncode == 0:
        try:
            for r in json.loads(res.stdout):
                vals = [float(x) for x in r["samples_ts"]]
                samples.append(Sample(case.name, test_key(r), rnd, vals[warmup:] if len(vals) > warmup else vals))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BenchError(
                f"cannot read llama-bench output for case {case.name}", why=str(e), fix=f"see {err_path}"
            ) from None
    return CaseRun(case.name, rnd, res.returncode, seconds, engaged, what, tail, started), samples


def microbench(bin_dir: Path, base_env: dict[str, str], out_dir: Path) -> list[dict[str, Any]]:
    """Copy throughput per boundary size, from test-mapped-host-bridge --bench (2+ devices)."""
    exe = bin_dir / "test-mapped-host-bridge"
    if not exe.is_file():
        log("    no test-mapped-host-bridge in the patched build: microbenchmark skipped")
        return []
    rows: list[dict[str, Any]] = []
    for label, extra in (("", {}), ("-p2p", {modes.CUDA_P2P: "1"})):
        res = runner.run([str(exe), "--bench"], env={**base_env, **extra}, check=False, error=BenchError)
        (out_dir / f"microbench{label}.csv").write_text(res.stdout)
        if res.returncode != 0:
            log(f"    microbenchmark{label} exited {res.returncode}")
            continue
        for line in res.stdout.splitlines():
            f = line.split(",")  # bench,path,bytes,iters,seconds,GB/s,us[,chunks]
            if len(f) < 7 or f[0] != "bench" or f[1] == "path":
                continue
            f[1] = "peer" if f[1] == "upstream" else f[1]  # the bridge off: upstream's copy (named so since issue 26)
            path = f[1] + ("-p2p" if label and f[1] == "peer" else "")
            if label and f[1] != "peer":
                continue  # the P2P run only changes the peer path
            rows.append(
                {
                    "path": path,
                    "bytes": int(f[2]),
                    "iters": int(f[3]),
                    "seconds": float(f[4]),
                    "GBps": float(f[5]),
                    "us_synced": float(f[6]),
                }
            )
    return rows


def rounds(
    args: argparse.Namespace,
    runnable: list[Case],
    bins: dict[str, Path],
    model_path: Path,
    suite: dict[str, Any],
    base_env: dict[str, str],
    logs: Path,
    runs: list[CaseRun],
    samples: list[Sample],
    smi: Telemetry | None,
) -> str:
    """The interleaved rounds (the order rotates each round), until --rounds or the --time-budget; appends to
    ``runs`` and ``samples``; returns why it stopped early ("" if it did not)."""
    names = [c.name for c in runnable]
    by_name = {c.name: c for c in runnable}  # link cases (netbench.expand) are not in CASES
    t_start = time.monotonic()
    longest = 0.0
    stopped = ""
    for rnd in range(args.rounds):
        elapsed = time.monotonic() - t_start
        if args.time_budget is not None and rnd > 0 and elapsed + longest > args.time_budget:
            stopped = (
                f"time budget: {rnd} of {args.rounds} rounds ran in {elapsed:.0f} s; another would "
                f"take ~{longest:.0f} s of the {args.time_budget:.0f} s budget"
            )
            log(f"    stopping: {stopped}")
            break
        t_round = time.monotonic()
        for name in rotate(names, rnd):
            c = by_name[name]
            cr, ss = run_case(
                bins[c.variant],
                c,
                model_path,
                suite,
                args.reps,
                base_env,
                logs,
                rnd,
                args.timeout,
                warmup=args.warmup_reps,
            )
            if smi is not None:
                cr.gpus = smi.during(cr.started, cr.started + cr.seconds)
            runs.append(cr)
            samples += ss
            figs = " ".join(f"{s.test}={statistics.median(s.values):.1f}" for s in ss)
            log(
                f"    round {rnd + 1}/{args.rounds} {name:13s} rc={cr.rc} {cr.seconds:5.1f}s {figs}"
                + ("" if cr.engaged is None else f" [{'engaged' if cr.engaged else 'NOT ENGAGED'}]")
            )
        longest = max(longest, time.monotonic() - t_round)
    return stopped
