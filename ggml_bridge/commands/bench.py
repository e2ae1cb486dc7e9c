"""``ggml-bridge bench``'s command line: what to measure (suite, cases, the part of its matrix), which builds and
model, how to run (rounds, repetitions or run lengths, budget, telemetry), where the report goes."""

from __future__ import annotations

import argparse

from ..bench.options import BenchOptions
from ..bench.suites import MEASURES, SUITES
from ..config import Settings
from ..model import VOCAB_FILE
from . import argtypes, cmdoptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _what(parser)
    _builds(parser)
    _how(parser)
    _report(parser)


def _what(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--suite",
        default=None,
        metavar="NAME",
        help=f"which comparison: {', '.join(SUITES)} (default: multi-gpu with 2+ GPUs, batched with 1, cpu without)",
    )
    parser.add_argument(
        "--suite-file",
        type=argtypes.path,
        default=None,
        metavar="TOML",
        help="suites of this file instead of the package's (ggml_bridge/bench/suites.toml, the same keys)",
    )
    parser.add_argument("--cases", default=None, help="comma-separated subset of the suite's cases")
    parser.add_argument(
        "--shapes",
        default=None,
        metavar="LIST",
        help="comma-separated subset of the suite's model shapes, e.g. bench-2b-6l (default: all of them)",
    )
    parser.add_argument(
        "--run-lengths",
        type=argtypes.count_list(1),
        default=None,
        metavar="LIST",
        help="one llama-bench process per case, run length and round with -r N, every repetition kept, e.g. "
        "1,3,10: what one-shot and short runs see (default: the suite's; without any, --reps after --warmup-reps)",
    )
    parser.add_argument(
        "--measure",
        default=None,
        metavar="LIST",
        help=f"comma-separated subset of {','.join(MEASURES)}: llama-bench, llama-perplexity's wall time, "
        "llama-server's throughput under concurrent requests (default: all the suite has)",
    )
    parser.add_argument(
        "--links",
        default=None,
        metavar="RATE/DELAY,...",
        help="shaped links for the suite's rpc cases, e.g. 10gbit/0.2ms,25gbit/0.1ms (default: the "
        "suite's; each rpc case runs unshaped and once per link)",
    )


def _builds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variants-dir",
        type=argtypes.path,
        default=None,
        metavar="DIR",
        help="DIR/{upstream,nopeer,patched}/llama-bench: one folder per build variant",
    )
    cmdoptions.bin_dirs(parser, "llama-bench")
    parser.add_argument(
        "--build",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the variants that are missing (default; --no-build only reuses builds)",
    )
    parser.add_argument(
        "--model", type=argtypes.path, default=None, help="GGUF to use instead of the suite's random model"
    )
    cmdoptions.model_vocab(parser, VOCAB_FILE)


def _how(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds", type=argtypes.count(1), default=None, help="interleaved rounds (default: the suite's, else 3)"
    )
    parser.add_argument(
        "--time-budget",
        type=argtypes.seconds(),
        default=None,
        metavar="SECONDS",
        help="start no round that would end past this many seconds (judged by the longest round so "
        "far): --rounds becomes a ceiling and the report says how many rounds ran",
    )
    parser.add_argument(
        "--reps",
        type=argtypes.count(1),
        default=None,
        help="llama-bench repetitions kept per round (default 3; not with run lengths)",
    )
    parser.add_argument(
        "--warmup-reps",
        type=argtypes.count(0),
        default=None,
        metavar="N",
        help="repetitions run first and discarded in every llama-bench process (default 1; not with run lengths)",
    )
    parser.add_argument(
        "--ubatch",
        default=None,
        metavar="LIST",
        help="ubatch sizes instead of the suite's, e.g. 4096 (shorter processes, so more rounds fit)",
    )
    parser.add_argument(
        "--tg",
        type=argtypes.count(0),
        default=None,
        metavar="N",
        help="generated tokens instead of the suite's; 0 skips token generation",
    )
    parser.add_argument(
        "--cpus",
        default=None,
        metavar="LIST",
        help="run every case on these CPUs only, e.g. 0-15 (one socket): same placement for all",
    )
    parser.add_argument(
        "--virtual-devices",
        type=argtypes.count(1),
        default=None,
        metavar="N",
        help="GGML_CUDA_DEVICES=N: emulate N cards on the visible GPUs",
    )
    parser.add_argument("--timeout", type=argtypes.seconds(), default=600.0, help="seconds per process")


def _report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--microbench",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="boundary copy microbenchmark (needs 2+ devices)",
    )
    parser.add_argument(
        "--smi",
        nargs="?",
        type=argtypes.count(1),
        const=100,
        default=None,
        metavar="MS",
        help="sample nvidia-smi every MS milliseconds (default 100) while the cases run: every "
        "process's GPU clocks, power, temperature and throttle reasons go into the report",
    )
    parser.add_argument(
        "--pool",
        type=argtypes.path,
        nargs="+",
        default=None,
        metavar="REPORT",
        help="run nothing: pool the rounds of these bench.json reports (same suite and settings, "
        "e.g. two GPU calls, or parts of one suite's matrix) into one report in --report",
    )
    cmdoptions.report_dir(parser, "<cache>/reports/bench-<suite>-<time>")


def options(ns: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        suite=ns.suite,
        suite_file=ns.suite_file,
        cases=ns.cases,
        shapes=ns.shapes,
        run_lengths=ns.run_lengths,
        measure=ns.measure,
        links=ns.links,
        variants_dir=ns.variants_dir,
        bin_dirs=cmdoptions.bin_dirs_of(ns),
        build=ns.build,
        model=ns.model,
        vocab=ns.vocab,
        rounds=ns.rounds,
        time_budget=ns.time_budget,
        reps=ns.reps,
        warmup_reps=ns.warmup_reps,
        ubatch=ns.ubatch,
        tg=ns.tg,
        cpus=ns.cpus,
        virtual_devices=ns.virtual_devices,
        timeout=ns.timeout,
        microbench=ns.microbench,
        smi=ns.smi,
        pool=tuple(ns.pool) if ns.pool else None,
        report=ns.report,
    )


def run(opts: BenchOptions, settings: Settings) -> int:
    from .. import bench

    return bench.run(opts, settings)
