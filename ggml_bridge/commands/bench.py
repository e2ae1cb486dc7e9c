"""``ggml-bridge bench``'s command line: what to measure (suite, cases, the part of its matrix), which builds and
model, how to run (rounds, repetitions or run lengths, budget, telemetry), where the report goes."""

from __future__ import annotations

import argparse

from ..experiments.bench.measures import MEASURES
from ..experiments.bench.options import BenchOptions, names
from ..experiments.bench.suites import SUITES
from ..experiments.model import VOCAB_FILE
from ..foundations import files
from ..foundations.config import Settings
from . import argtypes, cmdoptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _what(parser)
    _builds(parser)
    _how(parser)
    _report(parser)


def _what(parser: argparse.ArgumentParser) -> None:
    cmdoptions.values(
        parser,
        (
            "--suite",
            None,
            "NAME",
            f"which comparison: {', '.join(SUITES)} (default: multi-gpu with 2+ GPUs, batched with 1, cpu without)",
        ),
        (
            "--suite-file",
            argtypes.path,
            "TOML",
            "suites of this file instead of the package's (ggml_bridge/experiments/bench/suites.toml, the same keys)",
        ),
        ("--cases", None, None, "comma-separated subset of the suite's cases"),
        (
            "--shapes",
            None,
            "LIST",
            "comma-separated subset of the suite's model shapes, e.g. bench-2b-6l (default: all of them)",
        ),
        (
            "--run-lengths",
            argtypes.count_list(1),
            "LIST",
            "one llama-bench process per case, run length and round with -r N, every repetition kept, e.g. "
            "1,3,10: what one-shot and short runs see (default: the suite's; without any, --reps after --warmup-reps)",
        ),
        (
            "--measure",
            None,
            "LIST",
            f"comma-separated subset of {','.join(MEASURES)}: llama-bench, llama-perplexity's wall time, "
            "llama-server's throughput under concurrent requests, batching against its baseline inside one process "
            "(default: all the suite has)",
        ),
        (
            "--links",
            None,
            "RATE/DELAY,...",
            "shaped links for the suite's rpc cases, e.g. 10gbit/0.2ms,25gbit/0.1ms (default: the "
            "suite's; each rpc case runs unshaped and once per link)",
        ),
    )


def _builds(parser: argparse.ArgumentParser) -> None:
    cmdoptions.values(
        parser,
        (
            "--variants-dir",
            argtypes.path,
            "DIR",
            "DIR/{upstream,nopeer,patched}/llama-bench: one folder per build variant",
        ),
    )
    cmdoptions.bin_dirs(parser, "llama-bench")
    cmdoptions.on_by_default(
        parser, "--build", "build the variants that are missing (default; --no-build only reuses builds)"
    )
    cmdoptions.values(parser, ("--model", argtypes.path, None, "GGUF to use instead of the suite's random model"))
    cmdoptions.model_vocab(parser, VOCAB_FILE)


def _how(parser: argparse.ArgumentParser) -> None:
    cmdoptions.values(
        parser,
        ("--rounds", argtypes.count(1), None, "interleaved rounds (default: the suite's, else 3)"),
        (
            "--time-budget",
            argtypes.seconds(),
            "SECONDS",
            "start no round that would end past this many seconds (judged by the longest round so "
            "far): --rounds becomes a ceiling and the report says how many rounds ran",
        ),
        ("--reps", argtypes.count(1), None, "llama-bench repetitions kept per round (default 3; not with run lengths)"),
        (
            "--warmup-reps",
            argtypes.count(0),
            "N",
            "repetitions run first and discarded in every llama-bench process (default 1; not with run lengths)",
        ),
        (
            "--ubatch",
            None,
            "LIST",
            "ubatch sizes instead of the suite's, e.g. 4096 (shorter processes, so more rounds fit)",
        ),
        ("--tg", argtypes.count(0), "N", "generated tokens instead of the suite's; 0 skips token generation"),
        ("--cpus", None, "LIST", "run every case on these CPUs only, e.g. 0-15 (one socket): same placement for all"),
        ("--virtual-devices", argtypes.count(1), "N", "GGML_CUDA_DEVICES=N: emulate N cards on the visible GPUs"),
    )
    parser.add_argument("--timeout", type=argtypes.seconds(), default=600.0, help="seconds per process")


def _report(parser: argparse.ArgumentParser) -> None:
    cmdoptions.on_by_default(parser, "--microbench", "boundary copy microbenchmark (needs 2+ devices)")
    parser.add_argument(
        "--smi",
        nargs="?",
        type=argtypes.count(1),
        const=100,
        metavar="MS",
        help="sample nvidia-smi every MS milliseconds (default 100) while the cases run: every "
        "process's GPU clocks, power, temperature and throttle reasons go into the report",
    )
    parser.add_argument(
        "--pool",
        type=argtypes.path,
        nargs="+",
        metavar="REPORT",
        help="run nothing: pool the rounds of these bench.json reports (same suite and settings, "
        "e.g. two GPU calls, or parts of one suite's matrix) into one report in --report",
    )
    cmdoptions.report_dir(parser, "<cache>/reports/bench-<suite>-<time>")


def options(ns: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        suite=ns.suite,
        suite_file=ns.suite_file,
        cases=names(ns.cases),
        shapes=ns.shapes,
        run_lengths=ns.run_lengths,
        measure=ns.measure,
        links=names(ns.links),
        variants_dir=ns.variants_dir and files.input_dir(ns.variants_dir, "--variants-dir"),
        bin_dirs=cmdoptions.bin_dirs_of(ns),
        build=ns.build,
        model=ns.model and files.input_file(ns.model, "--model", fix="give a GGUF file, or leave --model out"),
        vocab=cmdoptions.vocab_of(ns),
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
    from ..experiments.bench import orchestrate

    return orchestrate.run(opts, settings)
