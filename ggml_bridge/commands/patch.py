"""``ggml-bridge patch``: apply the series onto the upstream tree (``--check``: only report whether each applies;
``--export``: write a work tree's commits back as the series' patch files)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations.config import Settings
from ..foundations.errors import PatchError, UsageError
from . import argtypes, cmdoptions
from .fetch import SourceOptions, add_source_arguments, source_options


@dataclass(frozen=True)
class PatchOptions:
    source: SourceOptions
    check: bool = False
    discard_changes: bool = False
    export: Path | None = None
    """A work tree whose commits after ``base`` become the series' patch files."""
    base: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    cmdoptions.switches(parser, ("--check", "report whether each patch applies, writing nothing"))
    cmdoptions.discard_changes(parser)
    cmdoptions.values(
        parser,
        (
            "--export",
            argtypes.path,
            "WORKTREE",
            "write the commits of WORKTREE after --base into patches/ (format-patch --zero-commit, one commit per "
            "patch, under the series' names, in its order); prints the patches folder",
        ),
        ("--base", None, "REV", "with --export: the upstream commit (default: the root commit)"),
    )


def options(ns: argparse.Namespace) -> PatchOptions:
    if ns.base is not None and ns.export is None:
        raise UsageError("--base goes with --export", fix="ggml-bridge patch --export WORKTREE --base REV")
    return PatchOptions(source_options(ns), ns.check, ns.discard_changes, ns.export, ns.base)


def run(opts: PatchOptions, settings: Settings) -> int:
    from ..upstream import fetch, patch

    if opts.export is not None:
        return export(opts.export, opts.base, settings)

    tree = fetch.obtain(settings, opts.source.source, opts.source.allow_unpinned)
    if opts.check:
        report = patch.check_series(settings, tree)
        print(report.render())
        return 0 if report.ok else PatchError.exit_code
    patched = patch.apply_series(settings, tree, discard_changes=opts.discard_changes)
    print(patched.path)
    return 0


def export(wt: Path, base: str | None, settings: Settings) -> int:
    from ..foundations import gitrepo, runner
    from ..upstream import patch

    if not (wt / ".git").exists():
        raise UsageError(f"--export {wt}: not a git work tree", fix="pass the work tree holding one commit per patch")
    if base is None:
        roots = gitrepo.run(wt, "rev-list", "--max-parents=0", "HEAD", error=PatchError).stdout
        base = roots.split()[0]
    names = patch.series_names(settings.patches_dir)
    patch.format_series(wt, base, names, settings.patches_dir)
    runner.log(f"wrote {len(names)} patch(es) from {wt} ({base[:12]}..HEAD) into {settings.patches_dir}")
    print(settings.patches_dir)
    return 0
