"""``ggml-bridge fetch``: obtain the upstream tree (cached); prints its path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..foundations.config import Settings
from ..foundations.runner import log
from . import cmdoptions


@dataclass(frozen=True)
class SourceOptions:
    """Where the upstream sources come from (``--source``, ``--allow-unpinned``)."""

    source: str | None = None
    allow_unpinned: bool = False


def source_options(ns: argparse.Namespace) -> SourceOptions:
    return SourceOptions(ns.source, ns.allow_unpinned)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cmdoptions.source(parser)


options = source_options


def run(opts: SourceOptions, settings: Settings) -> int:
    from ..upstream import fetch

    tree = fetch.obtain(settings, opts.source, opts.allow_unpinned)
    log(f"upstream {tree.commit_or_id} from {tree.origin}")
    print(tree.path)
    return 0
