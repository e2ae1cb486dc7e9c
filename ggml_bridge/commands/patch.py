"""``ggml-bridge patch``: apply the series onto the upstream tree (``--check``: only report whether each applies;
``--export``: write a work tree's commits back as the series' patch files)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import flags
from ..foundations.config import Settings
from ..foundations.errors import PatchError, UsageError
from . import cmdoptions, optionset
from .fetch import SourceOptions, add_source_arguments, source_options


@dataclass(frozen=True)
class PatchOptions:
    """``ggml-bridge patch``'s options: the sources (:class:`SourceOptions`, which fetch declares), check or apply,
    or export a work tree's commits."""

    source: SourceOptions
    check: bool = field(
        default=False, metadata=flags.flag("--check", help="report whether each patch applies, writing nothing")
    )
    discard_changes: bool = field(default=False, metadata=cmdoptions.DISCARD_CHANGES)
    export: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--export",
            parse=flags.path,
            metavar="WORKTREE",
            help="write the commits of WORKTREE after --base into patches/ (format-patch --zero-commit, one commit "
            "per patch, under the series' names, in its order); prints the patches folder",
        ),
    )
    """A work tree whose commits after ``base`` become the series' patch files."""
    base: str | None = field(
        default=None,
        metadata=flags.flag(
            "--base", metavar="REV", help="with --export: the upstream commit (default: the root commit)"
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, PatchOptions, source=add_source_arguments)


def options(ns: argparse.Namespace) -> PatchOptions:
    if ns.base is not None and ns.export is None:
        raise UsageError("--base goes with --export", fix="ggml-bridge patch --export WORKTREE --base REV")
    return optionset.options(PatchOptions, ns, source=source_options(ns))


def run(opts: PatchOptions, settings: Settings) -> int:
    from ..upstream import patch
    from ..upstream.fetch import resolve

    if opts.export is not None:
        return export(opts.export, opts.base, settings)

    tree = resolve.obtain(settings, opts.source.source, opts.source.allow_unpinned)
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
