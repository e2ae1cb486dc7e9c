"""The files the tool reads and the folders it writes, each through one door: :func:`read_json` (every JSON file:
build pointers, state and records in the cache, reports given back to it), checked against a shape of
:class:`ggml_bridge.foundations.tomlfile.Key` (the TOML files' schema, read by :func:`ggml_bridge.foundations.tomlfile.read`), and
:func:`output_dir` / :func:`plain_name` (every output folder a user names, and every name joined to one), resolved
and checked before any work starts. A file of the wrong kind or shape is one line naming it, never a traceback
later."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from .errors import FatalError, UsageError, os_reason
from .tomlfile import Key, check


def read_json(
    path: Path,
    what: str,
    *,
    shape: Mapping[str, Key] | None = None,
    required: tuple[str, ...] = (),
    error: type[FatalError] = UsageError,
    fix: str | None = None,
) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` names it: "build pointer", "rebase state", "bench report" ...), its keys
    in ``required`` present and those of ``shape`` of their kind (other keys are left alone: the writers may add
    some); ``error`` with one line otherwise: missing, a folder, unreadable, not UTF-8, not JSON, not an object."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} not found", fix=fix) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder, not a file", fix=fix) from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text", why=f"byte {e.start}: {e.reason}", fix=fix) from None
    except OSError as e:
        raise error(f"cannot read the {what} {path}", why=os_reason(e), fix=fix) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise error(f"{what} {path} is not valid JSON", why=str(e), fix=fix) from None
    if not isinstance(data, dict):
        raise error(f"{what} {path} is not a JSON object", why=f"it holds a {type(data).__name__}", fix=fix)
    missing = [k for k in required if k not in data]
    if missing:
        raise error(f"{path} is not a {what}", why=f"it has no {', '.join(missing)}", fix=fix)
    if shape:
        check({k: v for k, v in data.items() if k in shape}, shape, f"{what} {path}", error)
    return data


def read_record(
    path: Path, *, shape: Mapping[str, Key] | None = None, required: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """A record the tool itself writes and can make again (``tree.json``, a build's marker, a cached listing): the
    object :func:`read_json` would return, or None when it is missing, unreadable or of the wrong shape (the caller
    then makes it again; a damaged record is never trusted nor a traceback)."""
    try:
        return read_json(path, "record", shape=shape, required=required)
    except UsageError:
        return None


def output_dir(path: Path | str, flag: str) -> Path:
    """An output folder the user named (``--report``, ``--out``, ``--build-dir``): absolute, created when missing,
    writable; a :class:`UsageError` naming ``flag`` otherwise (empty, a file, cannot be created, read-only). Called
    before any work, so a bad folder is refused at once, not after minutes of building or checking."""
    out = _not_empty(path, flag)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(
            f"{flag} {path} is a file, not a folder", fix="pass a folder (it is created if missing)"
        ) from None
    except OSError as e:
        raise UsageError(
            f"{flag} {path}: cannot create the folder", why=os_reason(e), fix="pass a folder you can write"
        ) from None
    if not out.is_dir():
        raise UsageError(f"{flag} {path} is not a folder", fix="pass a folder (it is created if missing)")
    _writable(out, flag, path)
    return out


def _writable(folder: Path, flag: str, path: Path | str) -> None:
    """A file can be made in ``folder`` (tried, not guessed from the mode bits: root passes every ``access``
    check, and /proc or a read-only mount refuse even root); a UsageError naming ``flag`` otherwise."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".ggml-bridge-writable-")
    except OSError as e:
        raise UsageError(
            f"{flag} {path} is not writable",
            why=f"{os_reason(e) if e.errno != errno.ENOENT else 'no file can be made there'}; nothing was written",
            fix="pass a folder you can write, or fix its permissions",
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _not_empty(path: Path | str, flag: str) -> Path:
    if not str(path).strip():
        raise UsageError(
            f"{flag} is empty",
            why="an empty value would silently mean the current folder",
            fix=f"leave {flag} out, or give a path",
        )
    return Path(os.path.abspath(os.path.expanduser(path)))


def input_file(path: Path | str, flag: str, *, fix: str = "pass a file") -> Path:
    """A file the user named to be read (``--probe-output``, ``--model``, ``--microbench``): absolute, an existing
    regular file or a device that reads (a FIFO, /dev/stdin); a UsageError naming ``flag`` otherwise (empty,
    missing, a folder)."""
    given = _not_empty(path, flag)
    if given.is_dir():
        raise UsageError(f"{flag} {path} is a folder, not a file", fix=fix)
    if not given.exists():
        raise UsageError(f"{flag} {path}: no such file", fix=fix)
    return given


def input_dir(path: Path | str, flag: str, *, fix: str = "pass a folder") -> Path:
    """A folder the user named to be read (``--variants-dir``, ``--bin-dir-<variant>``): absolute and an existing
    folder; a UsageError naming ``flag`` otherwise (empty, missing, a file)."""
    given = _not_empty(path, flag)
    if not given.exists():
        raise UsageError(f"{flag} {path}: no such folder", fix=fix)
    if not given.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder", fix=fix)
    return given


def output_file(path: Path | str, flag: str, *, suffixes: tuple[str, ...] = ()) -> Path:
    """A file the user named to be written (``--plot``, ``model --out``): absolute, not a folder, its name ending in
    one of ``suffixes`` (when given: a plot's format), in a folder that exists (a typo in it is not made into a new
    folder) and is writable; a UsageError naming ``flag`` otherwise. A device (/dev/null, /dev/stderr) is taken. Nothing is written to it here."""
    out = _not_empty(path, flag)
    if out.is_dir():
        raise UsageError(f"{flag} {path} is a folder, not a file", fix="pass a file name in that folder")
    if suffixes and out.suffix.lower() not in suffixes:
        raise UsageError(
            f"{flag} {path} does not end in {', '.join(suffixes)}",
            why="the file name's extension chooses the format",
            fix=f"name the file with one of {', '.join(suffixes)}",
        )
    if not out.parent.is_dir():
        raise UsageError(
            f"{flag} {path}: the folder {out.parent} does not exist",
            fix="create it first, or name a file in an existing folder",
        )
    if out.is_file():  # opened to append, nothing written: the file itself may be read-only
        try:
            os.close(os.open(out, os.O_WRONLY | os.O_APPEND))
        except OSError as e:
            raise UsageError(
                f"{flag} {path} is not writable", why=os_reason(e), fix="pass a file you can write"
            ) from None
    elif not out.exists():
        _writable(out.parent, flag, path)
    return out


def plain_name(name: str, what: str, error: type[FatalError] = UsageError) -> str:
    """``name`` when it can be one file or folder name inside an output folder (a rung's name in ``--report``):
    not empty, no ``/``, not ``.`` or ``..``, no NUL, at most 200 bytes; ``error`` naming ``what`` otherwise."""
    if (
        not name.strip()
        or "/" in name
        or "\0" in name
        or name in (".", "..")
        or len(name.encode("utf-8", "surrogateescape")) > 200
    ):
        raise error(
            f"{what} {name!r} is not a plain name",
            why="it names a file in the report folder: no '/', not '.' or '..', at most 200 bytes",
            fix="use letters, digits, '-', '_' and '.'",
        )
    return name
