"""The tree cache: :class:`Tree` (a pristine upstream tree under ``<cache>/trees/<key>/``), its lookup and
publication, and the one content digest of a tree (:func:`tree_digest`)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from ...foundations import cache
from ...foundations.config import Settings
from ...foundations.errors import SourceError
from ...foundations.runner import log
from .. import pin as pinmod


@dataclass(frozen=True)
class Tree:
    """A pristine upstream tree in the cache (treat as read-only)."""

    path: Path
    """The llama.cpp source directory."""
    commit_or_id: str
    """The upstream commit if known, else the cache key (``sha256-...`` of the archive, ``tree-...``)."""
    origin: str
    """Where it came from, for people (``pypi-sdist llama-cpp-python==0.3.36 (sha256 832d...)``)."""
    key: str = ""
    """Cache key (directory name under ``<cache>/trees``)."""
    commit: str | None = None
    """Upstream commit, when known."""
    pinned: bool = False
    """True when this is exactly the commit of pin.toml."""
    archive_sha256: str | None = None
    """sha256 of the archive it was extracted from, if any (the identity of sdists)."""
    content_sha256: str = ""
    """Digest of the tree content (paths, exec bits, file hashes); see :func:`tree_digest`."""


class _Failed(Exception):
    """One source did not work; the next one is tried. Not a FatalError: never escapes this module."""


class _NotFound(_Failed):
    """The registry says the release asked for does not exist (an unknown ref, not an unreachable host)."""


def find_cached(settings: Settings, key: str) -> Tree | None:
    """The cached tree with this key, if complete."""
    data = cache.read_tree_record(settings.layout.tree(key))
    if data is None:
        return None
    fields = Tree.__dataclass_fields__
    try:
        return Tree(**{k: v for k, v in data.items() if k in fields})
    except TypeError:  # a record without the fields of a tree: damaged, made again (publish_tree replaces it)
        return None


def publish_tree(settings: Settings, stage: Path, tree: Tree) -> Tree:
    """Record ``tree`` in ``stage/tree.json`` and rename the stage (holding ``src/``) into ``<cache>/trees/<key>``;
    the tree as cached (another run's, when it got there first)."""
    cache.write_tree_record(stage, asdict(tree))
    final = settings.layout.tree(tree.key)
    if final.exists() and cache.read_tree_record(final) is None:  # a damaged entry would never be replaced
        log(f"    the cached tree {final} is damaged ({cache.TREE_RECORD} unreadable or src/ missing): replacing it")
        cache.remove_entry(final, settings.layout)
    cache.publish_dir(stage, final)
    return find_cached(settings, tree.key) or tree


def tree_digest(root: Path) -> str:
    """sha256 over (relative path, executable bit or symlink target, file sha256) of every file, sorted."""
    return cache.dir_digest(root, (full for _, full in _walk(root)), kinds=True)


@dataclass(frozen=True)
class Found:
    """What a source found in ``stage/src``, before the tree is verified and published: its cache key, its commit
    (None: not known), whether it is the pinned tree, where it came from, and the checksums known so far."""

    key: str
    commit: str | None
    pinned: bool
    origin: str
    archive_sha256: str | None = None
    content_sha256: str | None = None


def _finish(
    settings: Settings, pin: pinmod.Pin, stage: Path, found: Found, *, failed: type[Exception] = SourceError
) -> Tree:
    """Verify ``stage/src``, write ``tree.json``, and rename the stage into ``<cache>/trees/<key>``."""
    key, commit = found.key, found.commit
    src = stage / "src"
    gitlink = src / ".git"  # a submodule gitlink file (sdists) or a clone's metadata: never part of a tree
    if gitlink.is_file() or gitlink.is_symlink():
        gitlink.unlink()
    elif gitlink.is_dir():
        shutil.rmtree(gitlink)
    _verify_tree(src, pin, failed, what=found.origin)
    tree = Tree(
        path=settings.layout.tree_src(key),
        commit_or_id=commit or key,
        origin=found.origin,
        key=key,
        commit=commit,
        pinned=found.pinned,
        archive_sha256=found.archive_sha256,
        content_sha256=found.content_sha256 or tree_digest(src),
    )
    published = publish_tree(settings, stage, tree)
    log(f"    tree {key[:16]} cached at {tree.path}")
    return published


def _finish_pinned(
    settings: Settings,
    pin: pinmod.Pin,
    stage: Path,
    *,
    origin: str,
    archive_sha256: str | None = None,
    failed: type[Exception] = SourceError,
) -> Tree:
    """:func:`_finish` of the pinned tree: the pin's key and commit."""
    return _finish(settings, pin, stage, Found(pin.key, pin.commit, True, origin, archive_sha256), failed=failed)


def _verify_tree(root: Path, pin: pinmod.Pin, failed: type[Exception], *, what: str) -> None:
    missing = [f for f in pin.expect_files if not (root / f).is_file()]
    if missing:
        msg = f"{what} is not a llama.cpp tree"
        why = f"missing {', '.join(missing)}"
        if issubclass(failed, SourceError):
            raise SourceError(msg, why=why, fix="point --source at the root of a llama.cpp checkout or archive")
        raise failed(f"{msg}: {why}")


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, full path) of every file and symlink under ``root``, sorted, skipping ``.git``."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d != ".git" and d not in links]
        for name in filenames + links:
            if name != ".git":
                out.append(((base / name).relative_to(root).as_posix(), base / name))
    return iter(sorted(out))


def _copy_files(src_root: Path, dest_root: Path, rels: Iterator[str] | list[str]) -> None:
    for rel in rels:
        s = src_root / rel
        if not (s.is_file() or s.is_symlink()):  # deleted in the work tree, or a submodule directory
            continue
        d = dest_root / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d, follow_symlinks=False)


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
