"""What ``ggml-bridge bench`` was asked to do, typed (:class:`BenchOptions`; the command line is
:mod:`ggml_bridge.commands.bench`): what to measure (suite, cases, the part of its matrix), which builds and model,
how to run (rounds, repetitions or run lengths, budget, telemetry), where the report goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...foundations import files, flags
from ...foundations.errors import UsageError
from ...foundations.flags import flag
from ...runtime.modes import VARIANTS
from ..model import VOCAB_FILE
from .measures import MEASURES
from .suites import SUITES


@dataclass(frozen=True)
class Cpus:
    """The CPUs every case runs on: as given (the report says it so) and as CPU numbers."""

    given: str
    ids: frozenset[int]


def cpu_list(text: str) -> Cpus:
    """``--cpus``: '0-15,32,40-41' -> CPUs 0..15, 32, 40 and 41."""
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            raise flags.BadValue(f"{text!r}: bad CPU list item {part!r} (e.g. 0-15 or 0,2,4)")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise flags.BadValue(f"{text!r}: bad CPU range {part!r} (the first CPU comes first)")
        ids.update(range(first, last + 1))
    return Cpus(text, frozenset(ids))


@dataclass(frozen=True)
class BenchOptions:
    """Every option of ``ggml-bridge bench``, declared once on its field (:func:`flags.flag`: flag, parser, metavar,
    help; the field's default is the option's)."""

    suite: str | None = field(
        default=None,
        metadata=flag(
            "--suite",
            metavar="NAME",
            help=f"which comparison: {', '.join(SUITES)} (default: multi-gpu with 2+ GPUs, batched with 1, cpu without)",
        ),
    )
    suite_file: Path | None = field(
        default=None,
        metadata=flag(
            "--suite-file",
            parse=flags.path,
            metavar="TOML",
            help="suites of this file instead of the package's (ggml_bridge/experiments/bench/suites.toml, the same "
            "keys)",
        ),
    )
    cases: tuple[str, ...] | None = field(
        default=None, metadata=flag("--cases", parse=flags.names, help="comma-separated subset of the suite's cases")
    )
    shapes: tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            "--shapes",
            parse=flags.names,
            metavar="LIST",
            help="comma-separated subset of the suite's model shapes, e.g. bench-2b-6l (default: all of them)",
        ),
    )
    run_lengths: tuple[int, ...] | None = field(
        default=None,
        metadata=flag(
            "--run-lengths",
            parse=flags.count_list(1),
            metavar="LIST",
            help="one llama-bench process per case, run length and round with -r N, every repetition kept, e.g. "
            "1,3,10: what one-shot and short runs see (default: the suite's; without any, --reps after --warmup-reps)",
        ),
    )
    measure: tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            "--measure",
            parse=flags.names,
            metavar="LIST",
            help=f"comma-separated subset of {','.join(MEASURES)}: llama-bench, llama-perplexity's wall time, "
            "llama-server's throughput under concurrent requests, batching against its baseline inside one process "
            "(default: all the suite has)",
        ),
    )
    links: tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            "--links",
            parse=flags.names,
            metavar="RATE/DELAY,...",
            help="shaped links for the suite's rpc cases, e.g. 10gbit/0.2ms,25gbit/0.1ms (default: the "
            "suite's; each rpc case runs unshaped and once per link)",
        ),
    )
    variants_dir: Path | None = field(
        default=None,
        metadata=flag(
            "--variants-dir",
            parse=flags.path,
            metavar="DIR",
            help="DIR/{upstream,nopeer,patched}/llama-bench: one folder per build variant",
            check=files.input_dir,
        ),
    )
    bin_dirs: dict[str, Path] = field(default_factory=dict, metadata=flags.bin_dirs(tuple(VARIANTS), "llama-bench"))
    """Build variant -> the folder of its llama-bench (``--bin-dir-VARIANT``)."""
    build: bool = field(
        default=True,
        metadata=flag("--build", help="build the variants that are missing (default; --no-build only reuses builds)"),
    )
    model: Path | None = field(
        default=None,
        metadata=flag(
            "--model",
            parse=flags.path,
            help="GGUF to use instead of the suite's random model",
            check=lambda p, option: files.input_file(p, option, fix="give a GGUF file, or leave --model out"),
        ),
    )
    vocab: Path | None = field(default=None, metadata=flags.vocab(VOCAB_FILE))
    rounds: int | None = field(
        default=None,
        metadata=flag("--rounds", parse=flags.count(1), help="interleaved rounds (default: the suite's, else 3)"),
    )
    time_budget: float | None = field(
        default=None,
        metadata=flag(
            "--time-budget",
            parse=flags.seconds(),
            metavar="SECONDS",
            help="start no round that would end past this many seconds (judged by the longest round so "
            "far): --rounds becomes a ceiling and the report says how many rounds ran",
        ),
    )
    reps: int | None = field(
        default=None,
        metadata=flag(
            "--reps",
            parse=flags.count(1),
            help="llama-bench repetitions kept per round (default 3; not with run lengths)",
        ),
    )
    warmup_reps: int | None = field(
        default=None,
        metadata=flag(
            "--warmup-reps",
            parse=flags.count(0),
            metavar="N",
            help="repetitions run first and discarded in every llama-bench process (default 1; not with run lengths)",
        ),
    )
    ubatch: tuple[int, ...] | None = field(
        default=None,
        metadata=flag(
            "--ubatch",
            parse=flags.count_list(1),
            metavar="LIST",
            help="ubatch sizes instead of the suite's, e.g. 4096 (shorter processes, so more rounds fit)",
        ),
    )
    tg: int | None = field(
        default=None,
        metadata=flag(
            "--tg",
            parse=flags.count(0),
            metavar="N",
            help="generated tokens instead of the suite's; 0 skips token generation",
        ),
    )
    cpus: Cpus | None = field(
        default=None,
        metadata=flag(
            "--cpus",
            parse=cpu_list,
            metavar="LIST",
            help="run every case on these CPUs only, e.g. 0-15 (one socket): same placement for all",
        ),
    )
    virtual_devices: int | None = field(
        default=None,
        metadata=flag(
            "--virtual-devices",
            parse=flags.count(1),
            metavar="N",
            help="GGML_CUDA_DEVICES=N: emulate N cards on the visible GPUs",
        ),
    )
    timeout: float = field(default=600.0, metadata=flag("--timeout", parse=flags.seconds(), help="seconds per process"))
    microbench: bool = field(
        default=True, metadata=flag("--microbench", help="boundary copy microbenchmark (needs 2+ devices)")
    )
    smi: int | None = field(
        default=None,
        metadata=flag(
            "--smi",
            parse=flags.count(1),
            metavar="MS",
            const=100,
            help="sample nvidia-smi every MS milliseconds (default 100) while the cases run: every "
            "process's GPU clocks, power, temperature and throttle reasons go into the report",
        ),
    )
    pool: tuple[Path, ...] | None = field(
        default=None,
        metadata=flag(
            "--pool",
            parse=flags.path,
            metavar="REPORT",
            takes="many",
            help="run nothing: pool the rounds of these bench.json reports (same suite and settings, "
            "e.g. two GPU calls, or parts of one suite's matrix) into one report in --report",
        ),
    )
    report: Path | None = field(default=None, metadata=flags.report_dir("<cache>/reports/bench-<suite>-<time>"))


def checked(args: BenchOptions) -> BenchOptions:
    """The counts, sizes and limits checked (UsageError naming the option)."""
    bad = [(args.rounds, 1), (args.reps, 1), (args.warmup_reps, 0)]
    if any(value is not None and value < least for value, least in bad):
        raise UsageError(
            f"bad counts: --rounds {args.rounds}, --reps {args.reps}, --warmup-reps {args.warmup_reps}",
            why="a report needs at least one round of at least one kept repetition",
            fix="use --rounds >= 1, --reps >= 1 and --warmup-reps >= 0",
        )
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
