"""What ``ggml-bridge bench`` was asked to do, typed (:class:`BenchOptions`; the command line is
:mod:`ggml_bridge.commands.bench`): what to measure (suite, cases, the part of its matrix), which builds and model,
how to run (rounds, repetitions or run lengths, budget, telemetry), where the report goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...foundations.errors import UsageError


@dataclass(frozen=True)
class BenchOptions:
    suite: str | None = None
    """A suite's name (default: multi-gpu with 2+ GPUs, batched with 1, cpu without)."""
    suite_file: Path | None = None
    """A TOML file of suites instead of the package's (``bench/suites.toml``)."""
    cases: tuple[str, ...] | None = None
    """A subset of the suite's cases (``--cases a,b``)."""
    shapes: str | None = None
    """A comma-separated subset of the suite's model shapes."""
    run_lengths: tuple[int, ...] | None = None
    measure: str | None = None
    """A comma-separated subset of bench, perplexity, server, inproc."""
    links: tuple[str, ...] | None = None
    """Shaped links RATE/DELAY for the suite's rpc cases (``--links l1,l2``)."""
    variants_dir: Path | None = None
    bin_dirs: dict[str, Path] = field(default_factory=dict)
    """Build variant -> the folder of its llama-bench (``--bin-dir-VARIANT``)."""
    build: bool = True
    model: Path | None = None
    vocab: Path | None = None
    rounds: int | None = None
    time_budget: float | None = None
    reps: int | None = None
    warmup_reps: int | None = None
    ubatch: str | None = None
    """ubatch sizes as given, e.g. ``512,4096`` (:func:`ubatch_sizes`)."""
    tg: int | None = None
    cpus: str | None = None
    virtual_devices: int | None = None
    timeout: float = 600.0
    microbench: bool = True
    smi: int | None = None
    pool: tuple[Path, ...] | None = None
    report: Path | None = None


def names(given: str | None) -> tuple[str, ...] | None:
    """A comma list of the command line as its names (None where it is not given or empty)."""
    return tuple(given.split(",")) if given else None


def ubatch_sizes(opts: BenchOptions) -> list[int] | None:
    """``--ubatch`` as sizes; UsageError unless it lists positive whole numbers."""
    if opts.ubatch is None:
        return None
    try:
        sizes = [int(x) for x in str(opts.ubatch).split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(
            f"bad --ubatch {opts.ubatch!r}",
            why="it must list positive ubatch sizes",
            fix="e.g. --ubatch 4096 or --ubatch 512,4096",
        )
    return sizes


def checked(args: BenchOptions) -> BenchOptions:
    """The counts, sizes and limits checked (UsageError naming the option)."""
    bad = [(args.rounds, 1), (args.reps, 1), (args.warmup_reps, 0)]
    if any(value is not None and value < least for value, least in bad):
        raise UsageError(
            f"bad counts: --rounds {args.rounds}, --reps {args.reps}, --warmup-reps {args.warmup_reps}",
            why="a report needs at least one round of at least one kept repetition",
            fix="use --rounds >= 1, --reps >= 1 and --warmup-reps >= 0",
        )
    ubatch_sizes(args)
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(
            f"bad --time-budget {args.time_budget}",
            why="a budget must be a positive number of seconds",
            fix="e.g. --time-budget 500, or leave it out to run every round",
        )
    if args.smi is not None and not 10 <= args.smi <= 60000:
        raise UsageError(
            f"bad --smi {args.smi}",
            why="nvidia-smi samples every 10 ms to 60 s",
            fix="e.g. --smi 100, or --smi alone for every 100 ms",
        )
    if args.tg is not None and args.tg < 0:
        raise UsageError(
            f"bad --tg {args.tg}",
            why="a negative number of generated tokens",
            fix="use --tg 0 to skip token generation, or a positive count",
        )
    return args
