"""The project's TOML files (the config file, pin.toml, ladder files, bench suites): read with one error handling,
and their tables checked against one kind of schema (:class:`Key`), so that a wrong value is one clear line naming
the file, the table and the key, never a traceback later."""

from __future__ import annotations

import math
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import FatalError, UsageError, os_reason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

INT_MAX = 2**31 - 1  # the C ints llama.cpp parses its numbers into


#: the largest TOML file the tool reads (its own are a few KiB), and the deepest nesting of tables and arrays
MAX_BYTES = 4 << 20
MAX_DEPTH = 32


def read(path: Path, what: str, error: type[FatalError] = UsageError, fix: str | None = None) -> dict[str, Any]:
    """The TOML ``path`` (``what`` names it in errors: "config file", "pin file", "ladder file" ...); ``error`` for a
    missing, unreadable, non-UTF-8, invalid, too large or too deeply nested file, or one that is not a regular file
    (a folder, a FIFO: reading one would wait for a writer). A UTF-8 byte order mark is allowed."""
    text = _text(Path(path), what, error, fix)
    try:
        data: dict[str, Any] = tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path} is not valid TOML", why=str(e)) from None
    except RecursionError:  # deeper than the reader can go: refused like any file nested too deep
        data = {}
        deep = True
    else:
        deep = _depth(data) > MAX_DEPTH
    if deep:
        raise error(
            f"{what} {path} nests tables or arrays more than {MAX_DEPTH} deep",
            why="no file of the tool's needs that; a deeper one exhausts the reader",
            fix=fix or "flatten it",
        )
    return data


def _text(path: Path, what: str, error: type[FatalError], fix: str | None) -> str:
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what} {path} is a folder, not a file", fix=fix)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is not a regular file", why="a FIFO or a device", fix=fix or "give a file")
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{what} {path} not found", fix=fix) from None
    except OSError as e:
        raise error(f"cannot read the {what} {path}", why=os_reason(e)) from None
    if len(raw) > MAX_BYTES:
        raise error(f"{what} {path} is larger than {MAX_BYTES >> 20} MiB", why="the tool's TOML files are a few KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(
            f"{what} {path} is not UTF-8 text", why=f"byte {e.start}: {e.reason}", fix="save it as UTF-8"
        ) from None


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(v, dict):
            todo.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            todo.extend((x, d + 1) for x in v)
    return deepest


@dataclass(frozen=True)
class Key:
    """What one key of a table holds: ``int`` (``low``..``high``), ``number`` (finite, above ``low``), ``str``,
    ``bool``, ``strs`` or ``ints`` (lists of them), ``table`` (of the kinds of ``table``), ``tables`` (a list of
    such tables), ``list`` (of anything), or ``int_or_str``."""

    kind: str
    low: float = 0
    high: int = INT_MAX
    choices: tuple[str, ...] = ()
    table: Mapping[str, Key] | None = None


def _ok(key: Key, v: Any) -> bool:
    if key.kind == "int":
        return isinstance(v, int) and not isinstance(v, bool) and key.low <= v <= key.high
    if key.kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > key.low
    if key.kind == "str":
        return isinstance(v, str) and (not key.choices or v in key.choices)
    if key.kind == "bool":
        return isinstance(v, bool)
    if key.kind == "strs":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if key.kind == "ints":
        return isinstance(v, list) and all(_ok(Key("int", key.low, key.high), x) for x in v)
    if key.kind == "int_or_str":
        return _ok(Key("int", key.low, key.high), v) or isinstance(v, str)
    if key.kind == "list":
        return isinstance(v, list)
    if key.kind == "tables":
        return isinstance(v, list) and all(isinstance(x, dict) for x in v)
    return isinstance(v, dict)


def _expected(key: Key) -> str:
    return {
        "int": f"an integer in {key.low:.0f}..{key.high}",
        "number": f"a finite number above {key.low:g}",
        "str": "one of " + ", ".join(key.choices) if key.choices else "a string",
        "bool": "true or false",
        "strs": "a list of strings",
        "ints": f"a list of integers in {key.low:.0f}..{key.high}",
        "int_or_str": "an integer or a string",
        "table": "a table",
        "tables": "a list of tables",
        "list": "a list",
    }[key.kind]


def check(table: Mapping[str, Any], keys: Mapping[str, Key], where: str, error: type[FatalError] = UsageError) -> None:
    """Every key of ``table`` known and of its kind (tables within, recursively); ``error`` naming the first that
    is not."""
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise error(f"{where}: unknown key(s) {', '.join(unknown)}", fix=f"allowed keys: {', '.join(sorted(keys))}")
    for name, v in table.items():
        key = keys[name]
        if not _ok(key, v):
            raise error(
                f"{where}: {name} = {v!r} is not {_expected(key)}",
                fix="write a plain TOML value of that kind (no quotes around numbers)",
            )
        if key.kind == "table" and key.table is not None:
            check(v, key.table, f"{where}.{name}", error)
        if key.kind == "tables" and key.table is not None:
            for i, item in enumerate(v):
                check(item, key.table, f"{where}.{name}[{i}]", error)
