"""``ggml-bridge doctor``: what this rig is, whether its peer paths are safe, and how to launch on it. Its options,
turned into the frozen :class:`~ggml_bridge.experiments.doctor.facts.Options` the doctor runs on."""

from __future__ import annotations

import argparse

from ..experiments.doctor.facts import Options
from ..foundations.config import Settings
from . import argtypes, cmdoptions
from .argtypes import count, seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cmdoptions.switches(
        parser,
        ("--json", "print the JSON document instead of the report"),
        ("--quick", "the probe's quick mode: one direction per pair, peer checks up to 16 MiB"),
    )
    probe = parser.add_mutually_exclusive_group()
    probe.add_argument("--no-probe", dest="probe", action="store_false", help="no measurements: inventory only")
    cmdoptions.values(
        probe,
        (
            "--probe-output",
            argtypes.path,
            "FILE",
            "read a saved probe output (probe.txt of --out) instead of running the probe",
        ),
    )
    cmdoptions.values(
        parser,
        (
            "--time-budget",
            seconds(),
            "S",
            "seconds the probe may take (default 50, 25 with --quick); it stops measuring when they are spent",
        ),
        (
            "--bin-dir",
            argtypes.path,
            "DIR",
            "ask this build's programs (default: the latest patched build of each backend, then the installed wheel)",
        ),
    )
    parser.add_argument(
        "--rpc",
        action="append",
        default=[],
        metavar="HOST:PORT[,...]",
        help="rpc-servers to check: handshake, protocol, devices (repeatable)",
    )
    cmdoptions.values(
        parser,
        (
            "--model",
            argtypes.path,
            "GGUF",
            "the model to serve: its hidden size prices the boundaries, its size balances -ts by measured speed",
        ),
        ("--hidden", count(1, 1 << 20), "N", "hidden size without --model (default 4096)"),
        (
            "--out",
            argtypes.path,
            "DIR",
            "also write report.txt, doctor.json, probe.txt (the probe's raw output) and pairs.png into DIR",
        ),
        ("--plot", argtypes.path, "PNG", "the pair bandwidth plot here (.png, .svg or .pdf)"),
    )


def options(args: argparse.Namespace) -> Options:
    return Options(
        json=args.json,
        quick=args.quick,
        probe=args.probe,
        probe_file=args.probe_output,
        time_budget_s=args.time_budget,
        bin_dir=args.bin_dir,
        rpc=tuple(args.rpc),
        model=args.model,
        hidden=args.hidden,
        out=args.out,
        plot=args.plot,
    )


def run(opts: Options, settings: Settings) -> int:
    from ..experiments.doctor.checkup import run as checkup

    return checkup(opts, settings)
