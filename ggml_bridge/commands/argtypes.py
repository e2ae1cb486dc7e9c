"""Checked argparse ``type=`` callables for numeric options: a value out of range is argparse's usage error
(exit 2, one line naming the option), never a traceback later (``--timeout nan``, ``--rounds -1``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable


def count(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], int]:
    """An integer in ``minimum..maximum``."""

    def parse(text: str) -> int:
        try:
            if not text.strip().isascii():  # int() takes any script's digits: '５' would be 5
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range (it must be {minimum}..{maximum})")
        return value

    parse.__name__ = "count"
    return parse


def seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """A finite positive number (or zero with ``allow_zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(
                f"{text!r}: it must be a finite number " + ("of 0 or more" if allow_zero else "above 0")
            )
        return value

    parse.__name__ = "number"
    return parse


#: The smallest size :func:`mebibytes` takes besides 0: one KiB (a smaller one rounded to 0 bytes, i.e. no limit).
MIN_MEBIBYTES = 1 / 1024


def mebibytes(text: str) -> float:
    """A finite size in MiB, 0 meaning no limit; otherwise at least one KiB."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not math.isfinite(value) or value < 0 or 0 < value < MIN_MEBIBYTES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be 0 (no limit) or a number of MiB from {MIN_MEBIBYTES:g} (one KiB)"
        )
    return value


def name_and_path(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` (``--side``)."""
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder or ":" in name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR (e.g. wheel=site-packages/ggml_bridge_server/bin)")
    return name, Path(folder)


def count_list(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of distinct integers in ``minimum..maximum`` (at least one)."""
    one = count(minimum, maximum)

    def parse(text: str) -> tuple[int, ...]:
        items = text.split(",")
        if not text.strip() or any(not x.strip() for x in items):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers")
        values = tuple(one(x.strip()) for x in items)
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(map(str, twice))} more than once")
        return values

    parse.__name__ = "list"
    return parse


def path(text: str) -> Path:
    """A path the user typed, never empty: ``--out ''`` would silently mean the current folder (``Path('')`` is
    ``.``), so it is argparse's usage error like any other bad value."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty (an empty value would mean the current folder)")
    return Path(text)


def shape_name(text: str) -> str:
    """A preset model shape by name (``--shape``)."""
    from ..experiments.model import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown shape {text!r} (one of {', '.join(PRESETS)})")
    return text
