"""``ggml-bridge bench``'s command-line options: what to measure (suite, cases, the part of its matrix), which
builds and model, how to run (rounds, repetitions or run lengths, budget, telemetry), where the report goes."""

from __future__ import annotations

import argparse

from ..errors import UsageError


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """The counts, sizes and limits checked (UsageError naming the option), --ubatch parsed; the caller's args
    unchanged."""
    bad = [(args.rounds, 1), (args.reps, 1), (args.warmup_reps, 0)]
    if any(value is not None and value < least for value, least in bad):
        raise UsageError(
            f"bad counts: --rounds {args.rounds}, --reps {args.reps}, --warmup-reps {args.warmup_reps}",
            why="a report needs at least one round of at least one kept repetition",
            fix="use --rounds >= 1, --reps >= 1 and --warmup-reps >= 0",
        )
    if args.ubatch is not None:
        try:
            sizes = [int(x) for x in str(args.ubatch).split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise UsageError(
                f"bad --ubatch {args.ubatch!r}",
                why="it must list positive ubatch sizes",
                fix="e.g. --ubatch 4096 or --ubatch 512,4096",
            )
        args = argparse.Namespace(**{**vars(args), "ubatch": sizes})
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(
            f"bad --time-budget {args.time_budget}",
            why="a budget must be a positive number of seconds",
            fix="e.g. --time-budget 500, or leave it out to run every round",
        )
    if getattr(args, "smi", None) is not None and not 10 <= args.smi <= 60000:
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
