"""``ggml-bridge sdist``: write the sdist of ggml-bridge-server; prints its path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations.config import Settings
from . import argtypes, cmdoptions
from .fetch import SourceOptions, add_source_arguments, source_options


@dataclass(frozen=True)
class SdistOptions:
    source: SourceOptions
    out: Path = Path("dist")


def add_dist_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument(
        "--out", "-o", metavar="DIR", type=argtypes.path, default=Path("dist"), help="where to write (default: ./dist)"
    )
    cmdoptions.no_ui(parser)


add_arguments = add_dist_arguments


def options(ns: argparse.Namespace) -> SdistOptions:
    return SdistOptions(source_options(ns), ns.out)


def run(opts: SdistOptions, settings: Settings) -> int:
    from ..distribution import wheel

    made = wheel.make_sdist(
        settings, opts.out, source_spec=opts.source.source, allow_unpinned=opts.source.allow_unpinned
    )
    print(made.path)
    return 0
