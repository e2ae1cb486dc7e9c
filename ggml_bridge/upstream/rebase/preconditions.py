"""What must hold before a rebase starts: a project without uncommitted edits of what it rewrites, a target
checkout that a commit describes, and a target that exists upstream."""

from __future__ import annotations

import os
from pathlib import Path

from ...foundations import gitrepo
from ...foundations.config import Settings, user_path
from ...foundations.errors import DirtyProjectError, FetchError, SourceError, UnknownRefError
from ...foundations.runner import log
from ..fetch.registry import Build
from ..fetch.resolve import obtain
from ..fetch.tree import Tree

_UNKNOWN_REF_HINTS = (
    "couldn't find remote ref",
    "not our ref",
    "not found on",
    "has no sdist",
    "HTTP 404",
    "unknown revision",
    "no such ref",
    "invalid refspec",
    "bad revision",
)


def require_clean_project(settings: Settings) -> None:
    """Refuse to overwrite uncommitted edits of pin.toml or patches/ (when the project is a git checkout)."""
    try:
        repo = gitrepo.open_repo(settings.project_dir, search_parent=True)
    except gitrepo.NotARepository:
        return
    try:
        root = Path(repo.working_tree_dir or settings.project_dir).resolve()
        rels = [os.path.relpath(p.resolve(), root) for p in (settings.pin_file, settings.patches_dir)]
        out = repo.git.status("--porcelain", "--untracked-files=all", "--", *rels)
    finally:
        repo.close()
    if out.strip():
        lines = [line for line in out.splitlines() if line.strip()]  # not strip(): the status column
        raise DirtyProjectError(
            f"{settings.project_dir} has uncommitted changes in pin.toml or patches/",
            why="the rebase rewrites both: "
            + ", ".join(line[3:] for line in lines[:6])
            + (" ..." if len(lines) > 6 else ""),
            fix="commit or stash them first (git stash -- pin.toml patches), or use --check",
        )


def require_clean_checkout(onto: str, check: bool) -> None:
    """A local checkout with uncommitted changes has no commit to pin: refuse it (allowed, with a note, in --check)."""
    path = user_path(onto)
    if not (path.is_dir() and (path / ".git").exists()):
        return
    try:
        with gitrepo.opened(path) as repo:
            dirty = gitrepo.is_dirty(repo)
    except (gitrepo.NotARepository, ValueError):
        return
    if dirty and not check:
        raise SourceError(
            f"refusing to rebase onto {path}",
            why="the checkout has uncommitted changes or untracked files, so no upstream commit describes it",
            fix="commit or stash them, or use --check",
        )
    if dirty:
        log(f"note: {path} has uncommitted changes; checking against its work tree as it is")


def obtain_target(settings: Settings, onto: str | Build) -> Tree:
    """obtain, with a missing ref/version told apart from an unreachable host (a :class:`Build`: one the caller
    has listed already, fetched without asking the registry again)."""
    try:
        return obtain(settings, onto, allow_unpinned=True)
    except FetchError as e:
        if type(e) is FetchError and any(h.lower() in str(e).lower() for h in _UNKNOWN_REF_HINTS):
            raise UnknownRefError(
                f"{onto.spec if isinstance(onto, Build) else onto} does not exist upstream",
                why=e.why or e.what,
                fix="check the tag/commit or version (e.g. git ls-remote --tags "
                "https://github.com/ggml-org/llama.cpp 'b*')",
            ) from None
        raise
