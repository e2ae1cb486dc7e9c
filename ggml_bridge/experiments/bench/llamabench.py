"""llama-bench (``--measure bench``): one process per case, round and run length (or kept repetitions after the
discarded ones), with its own rpc-server for the rpc modes, over a shaped link where the case has one; its figures:
llama-bench's own tokens per second per test."""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from ...foundations import runner
from ...foundations.errors import BenchError
from ...foundations.tomlfile import Key
from ...runtime import logparse, modes, netbench, rpc
from .measure import Job, Plain, Process, device_args
from .proof import engagement, rpc_engagement
from .stats import CaseRun, Sample, test_key

Case = modes.Mode


class LlamaBench(Plain):
    name = "bench"
    program = "llama-bench"
    table: Mapping[str, Key] | None = None
    remote = True

    def groups(self, run_lengths: tuple[int, ...]) -> list[Job]:
        return [Job("", "", self.name, n) for n in run_lengths] or [Job("", "")]

    def needs_program(self, case: modes.Mode) -> bool:
        return False  # found with the build itself (bench's resolve_bins)

    def run(self, proc: Process, job: Job) -> tuple[CaseRun, list[Sample]]:
        reps, warmup = (job.run_length, 0) if job.run_length else (proc.reps, proc.warmup)
        return run_case(proc, reps, warmup)

    def describe(self, settings: Mapping[str, Any]) -> str | None:
        return None  # the report's header says how llama-bench ran


def run_case(proc: Process, reps: int, warmup: int = 0) -> tuple[CaseRun, list[Sample]]:
    """One llama-bench process for a case: reps + warmup repetitions per test, the first ``warmup`` of each
    discarded (llama-bench's own warm-up is a short prompt, so the first full-size repetition still pays
    first-call costs: measured on H200, the first pp512 repetition of a process ran at about half speed)."""
    bin_dir, case, suite, rnd, out_dir = proc.bin_dir, proc.case, proc.suite, proc.rnd, proc.out_dir
    ub = ",".join(str(u) for u in suite.ubatch)
    argv = [
        str(bin_dir / "llama-bench"),
        "-m",
        str(proc.model),
        "-p",
        str(suite.pp),
        "-n",
        str(suite.tg),
        "-b",
        str(suite.batch),
        "-ub",
        ub,
        "-r",
        str(reps + warmup),
        "-o",
        "json",
        "-v",
    ]
    argv += device_args(suite, case)
    env = {**proc.base_env, **case.env()}
    err_path = out_dir / f"{case.name}-r{rnd}.log"
    topo = None
    if case.rpc:  # the server gets the GPUs and the selectors, llama-bench neither GPU nor bridge (unless the
        # suite keeps its GPU: netbench.py), over a shaped link when the case has one
        topo = netbench.topology(case, bin_dir, env, suite.rpc_servers, suite.threads, out_dir, rnd)
        topo.start(rpc.expected_version(bin_dir / "llama-bench"))
        argv += topo.server_args()
        env = netbench.front_env(env, suite.rpc_front_gpu)

    started = time.time()
    t0 = time.monotonic()
    try:
        res = runner.run(argv, env=env, check=False, timeout=proc.timeout, failure=runner.Failure(BenchError))
        seconds = time.monotonic() - t0
        err_path.write_text(res.stderr)
        virtual = modes.CUDA_DEVICES in env
        engaged, what = engagement(case, res.stderr, virtual) if topo is None else rpc_engagement(case, topo)
        if topo is not None and topo.shapers:
            through, how = netbench.link_engagement(topo)
            engaged, what = (
                (through if engaged is None else engaged and through),
                "; ".join(x for x in (what, how) if x),
            )
    finally:
        if topo:
            topo.stop()
    tail = logparse.tail(res.stderr)
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
