"""``ggml-bridge ladder``: run a ladder file's rungs and write report.json + report.md. Its options are
:class:`ggml_bridge.experiments.ladder.orchestrate.LadderOptions`'s fields, each declared once there, but the sides
(``--side NAME=DIR`` and ``--bin-dir-NAME DIR``), which this module reads."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..experiments.ladder.orchestrate import LadderOptions
from ..foundations.config import Settings
from ..foundations.errors import UsageError
from . import argtypes, cmdoptions, optionset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, LadderOptions, sides=_sides)


def _sides(parser: argparse.ArgumentParser) -> None:
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


def sides_of(ns: argparse.Namespace) -> dict[str, Path]:
    """``--side NAME=DIR`` and its older spelling ``--bin-dir-NAME DIR`` (one folder per side)."""
    out: dict[str, Path] = {}
    for name, folder in [*cmdoptions.bin_dirs_of(ns).items(), *ns.side]:
        if out.get(name, folder) != folder:
            raise UsageError(f"side {name} is given two folders: {out[name]} and {folder}", fix="give it one")
        out[name] = folder
    return out


def options(ns: argparse.Namespace) -> LadderOptions:
    return optionset.options(LadderOptions, ns, sides=sides_of(ns))


def run(opts: LadderOptions, settings: Settings) -> int:
    from ..experiments.ladder import orchestrate

    return orchestrate.run(opts, settings)
