"""``ggml-bridge patch``: apply the series onto the upstream tree (``--check``: only report whether each applies)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..config import Settings
from ..errors import PatchError
from . import cmdoptions
from .fetch import SourceOptions, source_options


@dataclass(frozen=True)
class PatchOptions:
    source: SourceOptions
    check: bool = False
    discard_changes: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cmdoptions.source(parser)
    parser.add_argument("--check", action="store_true", help="report whether each patch applies, writing nothing")
    cmdoptions.discard_changes(parser)


def options(ns: argparse.Namespace) -> PatchOptions:
    return PatchOptions(source_options(ns), ns.check, ns.discard_changes)


def run(opts: PatchOptions, settings: Settings) -> int:
    from .. import fetch, patch

    tree = fetch.obtain(settings, opts.source.source, opts.source.allow_unpinned)
    if opts.check:
        report = patch.check_series(settings, tree)
        print(report.render())
        return 0 if report.ok else PatchError.exit_code
    patched = patch.apply_series(settings, tree, discard_changes=opts.discard_changes)
    print(patched.path)
    return 0
