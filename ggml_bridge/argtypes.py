"""Checked argparse ``type=`` callables for numeric options: a value out of range is argparse's usage error
(exit 2, one line naming the option), never a traceback later (``--timeout nan``, ``--rounds -1``); and
:func:`user_path`, the one way a path the user typed has its ``~`` expanded."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable


def user_path(text: str | os.PathLike[str]) -> Path:
    """``text`` with ``~`` / ``~user`` expanded as the shell does: an unknown user leaves it as it is (a path
    that then does not exist), where ``Path.expanduser`` raises RuntimeError."""
    return Path(os.path.expanduser(text))


def count(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], int]:
    """An integer in ``minimum..maximum``."""

    def parse(text: str) -> int:
        try:
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


def count_list(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of integers in ``minimum..maximum`` (at least one)."""
    one = count(minimum, maximum)

    def parse(text: str) -> tuple[int, ...]:
        items = text.split(",")
        if not text.strip() or any(not x.strip() for x in items):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers")
        return tuple(one(x.strip()) for x in items)

    parse.__name__ = "list"
    return parse
