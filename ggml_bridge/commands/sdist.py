"""``ggml-bridge sdist``: write the sdist of ggml-bridge-server; prints its path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import flags
from ..foundations.config import Settings
from . import cmdoptions, optionset
from .fetch import SourceOptions, add_source_arguments, source_options


@dataclass(frozen=True)
class SdistOptions:
    """``ggml-bridge sdist``'s options (and the wheel's sdist's): the sources (:class:`SourceOptions`, which fetch
    declares), where the sdist goes."""

    source: SourceOptions
    out: Path = field(
        default=Path("dist"),
        metadata=flags.also(
            "-o", flags.flag("--out", parse=flags.path, metavar="DIR", help="where to write (default: ./dist)")
        ),
    )


def add_dist_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, SdistOptions, source=add_source_arguments)
    optionset.add(parser, cmdoptions.BuildSettingsOptions, only=("ui",))


add_arguments = add_dist_arguments


def options(ns: argparse.Namespace) -> SdistOptions:
    return optionset.options(SdistOptions, ns, source=source_options(ns))


def run(opts: SdistOptions, settings: Settings) -> int:
    from ..distribution import wheel

    made = wheel.make_sdist(
        settings, opts.out, source_spec=opts.source.source, allow_unpinned=opts.source.allow_unpinned
    )
    print(made.path)
    return 0
