"""Running the cases: the processes of a round (:func:`plan_round`), each job by its measure (:mod:`.measures`),
the interleaved rounds, and the boundary copy microbenchmark."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence, TypeVar

from ...foundations import runner
from ...foundations.errors import BenchError
from ...foundations.runner import log
from ...runtime import modes
from .measure import Inputs, Job, Process
from .measures import MEASURES
from .stats import CaseRun, Sample
from .suite import Suite
from .telemetry import Telemetry

Case = modes.Mode
CASES = modes.MODES
T = TypeVar("T")


def rotate(items: Sequence[T], k: int) -> list[T]:
    k %= max(1, len(items))
    return list(items[k:]) + list(items[:k])


def plan_round(rnd: int, names: Sequence[str], shapes: Sequence[str], groups: Sequence[Job]) -> list[Job]:
    """The processes of round ``rnd`` in order. ``groups`` are the measurements of one case on one shape (one per
    run length, then perplexity and server; ``case`` and ``shape`` unset). Shapes rotate with the round, and so
    do the groups within a shape; within group ``j`` (its place in ``groups``) the cases are rotated by
    ``rnd + j``, so a case and its baseline run next to each other on the same shape and run length, and over
    the rounds every case comes first in every group. One group on one shape is the rotation of the cases by
    ``rnd``."""
    jobs: list[Job] = []
    for shape in rotate(shapes, rnd):
        for j, g in rotate(list(enumerate(groups)), rnd):
            jobs += [replace(g, case=name, shape=shape) for name in rotate(names, rnd + j)]
    return jobs


@dataclass
class Setup:
    """What the rounds run, as values: cases, binaries, models, settings, the matrix and the limits."""

    cases: dict[str, Case]  # by name, in the suite's order (link cases of netbench.expand included)
    bins: dict[str, Path]  # variant -> folder of its programs
    models: dict[str, Path]  # shape -> GGUF
    suite: Suite
    base_env: dict[str, str]
    logs: Path
    rounds: int = 3
    time_budget: float | None = None
    reps: int = 3
    warmup: int = 1
    timeout: float = 600.0
    run_lengths: tuple[int, ...] = ()
    measures: tuple[str, ...] = ("bench",)
    keyed_by_shape: bool = False
    inputs: Inputs = field(default_factory=Inputs)

    def groups(self) -> list[Job]:
        """The measurements of one case on one shape, in a round."""
        return [j for m in MEASURES.values() if m.name in self.measures for j in m.groups(self.run_lengths)]

    def runs(self, job: Job) -> bool:
        """Whether the job is a process of its own (:meth:`.measure.Measure.has_job`)."""
        return MEASURES[job.measure].has_job(self.cases[job.case], self.cases, self.suite)

    def label(self, job: Job) -> str:
        """The job's name in logs and log folders: shape, run length, measurement ("" for plain llama-bench)."""
        parts = [job.shape] if self.keyed_by_shape else []
        parts += [f"r{job.run_length}"] if job.run_length else []
        return "/".join(parts + ([job.measure] if job.measure != "bench" else []))


@dataclass(frozen=True)
class CopyRate:
    """One row of the boundary microbenchmark: a copy path, a boundary size, and how fast it went."""

    path: str  # bridge, peer (upstream's copy), peer-p2p, sync, pinned limits
    bytes: int
    iters: int
    seconds: float
    GBps: float
    us_synced: float


def microbench(bin_dir: Path, base_env: dict[str, str], out_dir: Path) -> list[CopyRate]:
    """Copy throughput per boundary size, from test-mapped-host-bridge --bench (2+ devices)."""
    exe = bin_dir / "test-mapped-host-bridge"
    if not exe.is_file():
        log("    no test-mapped-host-bridge in the patched build: microbenchmark skipped")
        return []
    rows: list[CopyRate] = []
    for label, extra in (("", {}), ("-p2p", {modes.CUDA_P2P: "1"})):
        res = runner.run(
            [str(exe), "--bench"], env={**base_env, **extra}, check=False, failure=runner.Failure(BenchError)
        )
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
            rows.append(CopyRate(path, int(f[2]), int(f[3]), float(f[4]), float(f[5]), float(f[6])))
    return rows


def run_job(setup: Setup, job: Job, rnd: int) -> tuple[CaseRun, list[Sample]]:
    """One process of a round; its tests named with the shape (``SHAPE:``) and run length (``@rN``) where the run
    has them, its logs in a folder of its own (:meth:`Setup.label`)."""
    case = setup.cases[job.case]
    label = setup.label(job)
    out_dir = setup.logs / label if label else setup.logs
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = Process(
        setup.bins[case.variant],
        case,
        setup.models[job.shape],
        setup.suite,
        setup.base_env,
        setup.inputs,
        out_dir,
        rnd,
        setup.timeout,
        names=tuple(setup.cases),
        reps=setup.reps,
        warmup=setup.warmup,
    )
    cr, ss = MEASURES[job.measure].run(proc, job)
    prefix = f"{job.shape}:" if setup.keyed_by_shape else ""
    suffix = f"@r{job.run_length}" if job.run_length else ""
    cr = replace(cr, measure=job.measure, shape=job.shape if setup.keyed_by_shape else "", run_length=job.run_length)
    return cr, [replace(s, test=prefix + s.test + suffix) for s in ss]


def rounds(setup: Setup, runs: list[CaseRun], samples: list[Sample], smi: Telemetry | None) -> str:
    """The interleaved rounds (:func:`plan_round`), until ``setup.rounds`` or its time budget; appends to ``runs``
    and ``samples``; returns why it stopped early ("" if it did not)."""
    names = list(setup.cases)
    shapes = list(setup.models)
    t_start = time.monotonic()
    longest = 0.0
    for rnd in range(setup.rounds):
        elapsed = time.monotonic() - t_start
        if setup.time_budget is not None and rnd > 0 and elapsed + longest > setup.time_budget:
            stopped = (
                f"time budget: {rnd} of {setup.rounds} rounds ran in {elapsed:.0f} s; another would "
                f"take ~{longest:.0f} s of the {setup.time_budget:.0f} s budget"
            )
            log(f"    stopping: {stopped}")
            return stopped
        t_round = time.monotonic()
        for job in filter(setup.runs, plan_round(rnd, names, shapes, setup.groups())):
            cr, ss = run_job(setup, job, rnd)
            if smi is not None:
                cr = replace(cr, gpus=smi.during(cr.started, cr.started + cr.seconds))
            runs.append(cr)
            samples += ss
            figs = " ".join(
                ("" if s.case == job.case else f"{s.case}:") + f"{s.test}={statistics.median(s.values):.1f}" for s in ss
            )
            log(
                f"    round {rnd + 1}/{setup.rounds} {job.case:13s} {setup.label(job):>16s} rc={cr.rc} "
                f"{cr.seconds:5.1f}s {figs}"
                + ("" if cr.engaged is None else f" [{'engaged' if cr.engaged else 'NOT ENGAGED'}]")
            )
        longest = max(longest, time.monotonic() - t_round)
    return ""
