"""What one measurement of the bench is (:class:`Measure`, one module each, registered in :mod:`.measures`), and
what every one of them gets: its job in a round (:class:`Job`), the process it measures (:class:`Process`, the
case's build, model, suite, environment and inputs) and the deterministic inputs of the run (:class:`Inputs`).

A measure names its program and the suite table of its settings (checked with the suite's other keys), plans its
jobs of a case on a shape in a round, says which cases have a job of their own and need its program, runs a job
into one :class:`~.stats.CaseRun` and its samples, and says in the report how it measured."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from ...foundations import runner
from ...foundations.errors import BenchError
from ...foundations.tomlfile import Key
from ...runtime import modes
from .stats import CaseRun, Sample
from .suite import Suite

#: the seed of the perplexity text and the server's prompts (the ladder's default text seed)
TEXT_SEED = 7


@dataclass(frozen=True)
class Job:
    """One process of a round: a case measured on one shape by llama-bench (with ``-r run_length``, or the kept
    repetitions after the discarded ones when None), llama-perplexity or llama-server."""

    case: str
    shape: str
    measure: str = "bench"
    run_length: int | None = None


@dataclass(frozen=True)
class Inputs:
    """The deterministic inputs: llama-perplexity's text file and llama-server's prompts."""

    text: Path | None = None
    prompts: tuple[str, ...] = ()


def device_args(suite: Suite, case: modes.Mode) -> list[str]:
    """Offload and split flags (every layer on the GPUs, split as the case or else the suite says, a layer split by
    default; none on the CPU) and the suite's threads."""
    split = case.split or suite.split_mode or "layer"
    argv = ["-ngl", "99", "-sm", split] if suite.devices != "cpu" or case.rpc else ["-ngl", "0"]
    return argv + (["-t", str(suite.threads)] if suite.threads else [])


@dataclass(frozen=True)
class Process:
    """One measured process of a round: the programs, the case, the model, the suite, the environment, the inputs,
    where its log goes, the round and how long it may take."""

    bin_dir: Path
    case: modes.Mode
    model: Path
    suite: Suite
    base_env: dict[str, str]
    inputs: Inputs
    out_dir: Path
    rnd: int
    timeout: float
    names: tuple[str, ...] = ()
    """The cases of the run (an in-process job measures a case against its baseline among them)."""
    reps: int = 3
    warmup: int = 1
    """llama-bench's repetitions kept after the discarded ones (a run length keeps every one)."""

    def log_path(self, measure: str) -> Path:
        return self.out_dir / f"{self.case.name}-r{self.rnd}-{measure}.log"

    def timed(self, argv: list[str], selectors: modes.Mode, measure: str) -> Timed:
        """Runs ``argv`` with ``selectors``' environment over the base one, within the process's timeout, and writes
        its stdout and stderr to the log of ``measure``."""
        started, t0 = time.time(), time.monotonic()
        res = runner.run(
            argv,
            env={**self.base_env, **selectors.env()},
            check=False,
            timeout=self.timeout,
            failure=runner.Failure(BenchError),
        )
        seconds = time.monotonic() - t0
        log = self.log_path(measure)
        log.write_text(res.stdout + res.stderr)
        return Timed(res, res.stdout + res.stderr, started, seconds, log)


@dataclass(frozen=True)
class Timed:
    """A run of :meth:`Process.timed`: its result, stdout and stderr together, the wall clock at its start, its
    seconds and its log."""

    res: runner.Result
    text: str
    started: float
    seconds: float
    log: Path


class Measure(Protocol):
    """One measurement of the bench (``--measure NAME``)."""

    @property
    def name(self) -> str:
        """The word of ``--measure`` and of the report's ``measure`` fields."""

    @property
    def program(self) -> str:
        """The program it runs, next to llama-bench in each build it needs."""

    @property
    def table(self) -> Mapping[str, Key] | None:
        """The keys of the suite table of its settings (``[suite.NAME]``); None: it has none (llama-bench, whose
        settings are the suite's own) and every suite can run it."""

    @property
    def remote(self) -> bool:
        """Whether it measures rpc cases (their devices behind rpc-servers)."""

    def check(self, settings: Mapping[str, Any], where: str) -> None:
        """UsageError for settings that its table's keys allow but it cannot run."""

    def groups(self, run_lengths: tuple[int, ...]) -> list[Job]:
        """Its jobs of one case on one shape in a round (``case`` and ``shape`` unset)."""

    def has_job(self, case: modes.Mode, cases: Mapping[str, modes.Mode], suite: Suite) -> bool:
        """Whether ``case`` is a process of its own among ``cases``."""

    def needs_program(self, case: modes.Mode) -> bool:
        """Whether the build of ``case`` must have :attr:`program`."""

    def prepare(self, suite: Suite, out_dir: Path, tokens: list[str] | None, inputs: Inputs) -> Inputs:
        """``inputs`` with what its jobs read (a text, prompts), written under ``out_dir``."""

    def run(self, proc: Process, job: Job) -> tuple[CaseRun, list[Sample]]:
        """One job: its run (return code, seconds, engagement) and its samples."""

    def describe(self, settings: Mapping[str, Any]) -> str | None:
        """The report's line on how it measured with the suite's ``settings`` (None: no line)."""


class Plain:
    """What most measures share: a table, local cases only, one job per case and shape, nothing to check or
    prepare; a measure class states the rest."""

    remote = False

    def check(self, settings: Mapping[str, Any], where: str) -> None:
        return None

    def needs_program(self, case: modes.Mode) -> bool:
        return True

    def has_job(self, case: modes.Mode, cases: Mapping[str, modes.Mode], suite: Suite) -> bool:
        return True

    def prepare(self, suite: Suite, out_dir: Path, tokens: list[str] | None, inputs: Inputs) -> Inputs:
        return inputs
