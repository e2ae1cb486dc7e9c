"""The content-addressed cache under ``$XDG_CACHE_HOME/ggml-bridge``: how entries are made, published and locked.

Every stage (fetch, patch, build, ui, model, rebase, radar, wheel) writes through these few primitives, so an
interrupted or failing run never leaves a half-made entry that a later run trusts:

* :func:`staging` a fresh directory under ``<cache>/tmp`` (same filesystem as the cache), removed when the block
  ends unless :func:`publish_dir` renamed it into place first;
* :func:`publish_dir` the atomic rename of a finished stage to its final name (first writer wins);
* :func:`atomic_path` / :func:`write_json_atomic` / :func:`write_text_atomic` one file, written beside its final
  name and renamed over it;
* :func:`read_tree_record` / :func:`write_tree_record` the ``tree.json`` of an upstream tree entry;
* :func:`entry_lock` one writer per entry at a time (parallel test runs, two terminals);
* :func:`ensure_writable` proves the cache can be written (:class:`CacheError`, exit 13, otherwise) and drops stale
  stages older than a day.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from . import files
from .errors import CacheError, os_reason
from .layout import Layout
from .runner import log

#: The record of an upstream tree entry, ``<cache>/trees/<key>/tree.json`` (beside ``src/``).
TREE_RECORD = "tree.json"

_CHUNK = 1 << 20
_STALE_TMP_S = 24 * 3600
#: beside each stage in ``<cache>/tmp``: the file its owner holds an flock on while it runs
LOCK_SUFFIX = ".owner"
_FIX = "fix the permissions of the cache directory, or point GGML_BRIDGE_CACHE_DIR (or --cache-dir) at a writable one"


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_digest(root: Path, files: Iterable[Path], *, kinds: bool = False) -> str:
    """The one directory hash: sha256 over ``<path relative to root>\\0<file sha256>\\n`` for each of ``files``,
    in the order given (callers sort). With ``kinds`` each entry also says ``x`` (executable) or ``f``, and a
    symlink counts by its target (``<rel>\\0l\\0<target>``), not its content: the upstream tree digest."""
    h = hashlib.sha256()
    for full in files:
        rel = full.relative_to(root).as_posix()
        if not kinds:
            entry = f"{rel}\0{file_sha256(full)}\n"
        elif stat.S_ISLNK((st := full.lstat()).st_mode):
            entry = f"{rel}\0l\0{os.readlink(full)}\n"
        else:
            entry = f"{rel}\0{'x' if st.st_mode & 0o111 else 'f'}\0{file_sha256(full)}\n"
        h.update(entry.encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def ensure_writable(layout: Layout) -> Path:
    """Create ``<cache>/tmp`` and prove it is writable; raise CacheError otherwise. Returns the tmp dir."""
    tmp = layout.tmp
    try:
        _write_probe(tmp)
    except OSError as e:
        raise CacheError(
            f"cache directory {layout.root} is not writable",
            why=os_reason(e),
            fix="fix its permissions, or point GGML_BRIDGE_CACHE_DIR (or --cache-dir) at a writable directory",
        ) from None
    _clean_stale(tmp)
    return tmp


def _write_probe(folder: Path) -> None:
    """Create ``folder`` and a file in it, then remove the file; OSError where either cannot be done."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
    os.close(fd)
    os.unlink(probe)


@contextmanager
def staging(layout: Layout, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``<cache>/tmp`` for assembling an entry; whatever of it is left when the block ends
    (an exception, an interrupt, or a stage that was not published) is deleted."""
    import fcntl

    fd, lock_name = tempfile.mkstemp(dir=ensure_writable(layout), prefix=prefix + "-", suffix=LOCK_SUFFIX)
    lock = Path(lock_name)
    stage = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process lives: the stage's owner (see _clean_stale)
        stage.mkdir(mode=0o700)
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        lock.unlink(missing_ok=True)
        os.close(fd)


def publish_dir(stage: Path, final: Path) -> Path:
    """Atomically move a finished ``stage`` directory to ``final``; if another run got there first, keep theirs."""
    final.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(stage, 0o755)  # mkdtemp made it private; the cache may be shared
    try:
        os.rename(stage, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(stage, ignore_errors=True)
    return final


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """A temporary name beside ``final`` to write to; renamed over ``final`` when the block succeeds, removed
    otherwise (so ``final`` is either the old file or the complete new one)."""
    tmp = final.with_name(final.name + f".{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file and a rename; CacheError when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    except OSError as e:
        raise CacheError(f"cannot write {path}", why=os_reason(e), fix=_FIX) from None


def write_json_atomic(path: Path, data: object) -> None:
    """:func:`write_text_atomic` of ``data`` as indented, key-sorted JSON."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_tree_record(entry: Path) -> dict[str, Any] | None:
    """The record of a complete tree entry (``tree.json`` and ``src/`` both present), with ``path`` = its src."""
    data = files.read_record(entry / TREE_RECORD, required=("key",))
    if data is None or not (entry / "src").is_dir():
        return None
    data["path"] = entry / "src"
    return data


def remove_entry(entry: Path, layout: Layout) -> None:
    """Remove a damaged cache entry: renamed into ``<cache>/tmp`` first (so no reader sees half of it), then
    deleted."""
    aside = Path(tempfile.mkdtemp(dir=ensure_writable(layout), prefix="damaged-"))
    try:
        os.rename(entry, aside / entry.name)
    except FileNotFoundError:  # another run got there first
        pass
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def write_tree_record(stage: Path, record: dict[str, Any]) -> None:
    """Write ``stage/tree.json`` (paths as strings, a ``created`` UTC timestamp) before the stage is published."""
    meta = {k: str(v) if isinstance(v, Path) else v for k, v in record.items()}
    meta["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (stage / TREE_RECORD).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


@contextmanager
def entry_lock(lock_path: Path, *, busy: Callable[[], Exception] | None = None) -> Iterator[None]:
    """Exclusive lock on ``lock_path`` (an flock; waits, saying so, when another process holds it; with ``busy``,
    raises what it returns instead of waiting)."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if busy is not None:
                raise busy() from None
            log(f"waiting for another process building in {lock_path.with_suffix('')}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _clean_stale(tmp: Path) -> None:
    """Remove what runs that ended without their cleanup (SIGKILL, a power cut) left in ``<cache>/tmp``: a stage
    whose owner's lock no process holds any more, and anything else older than a day."""
    now = time.time()
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            if entry.name.endswith(LOCK_SUFFIX):
                _remove_if_orphaned(entry)
            elif not entry.with_name(entry.name + LOCK_SUFFIX).exists() and now - entry.lstat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        except OSError:
            continue


def _remove_if_orphaned(lock: Path) -> None:
    """The stage of ``lock`` and the lock itself, when no process holds the lock (its owner is gone)."""
    import fcntl

    fd = os.open(lock, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # its owner is alive
        shutil.rmtree(lock.with_name(lock.name.removesuffix(LOCK_SUFFIX)), ignore_errors=True)
        lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
