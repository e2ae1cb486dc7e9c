"""Checked argparse ``type=`` callables: a value out of range is argparse's usage error (exit 2, one line naming
the option), never a traceback later (``--timeout nan``, ``--rounds -1``); the parsers themselves are argparse-free
(:mod:`ggml_bridge.foundations.flags`, which the options dataclasses declare their fields with)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, TypeVar

from ..foundations import flags

T = TypeVar("T")


def typed(parse: Callable[[str], T]) -> Callable[[str], T]:
    """A parser of :mod:`ggml_bridge.foundations.flags` as argparse's ``type=``: its :class:`~flags.BadValue` is
    argparse's usage error, with the parser's one line."""

    def run(text: str) -> T:
        try:
            return parse(text)
        except flags.BadValue as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    run.__name__ = getattr(parse, "__name__", "value")
    return run


def count(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], int]:
    """An integer in ``minimum..maximum``."""
    return typed(flags.count(minimum, maximum))


def seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """A finite positive number (or zero with ``allow_zero``)."""
    return typed(flags.seconds(allow_zero=allow_zero))


def count_list(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of distinct integers in ``minimum..maximum`` (at least one)."""
    return typed(flags.count_list(minimum, maximum))


#: A path the user typed, never empty (:func:`ggml_bridge.foundations.flags.path`).
path: Callable[[str], Path] = typed(flags.path)


def name_and_path(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` (``--side``)."""
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder or ":" in name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR (e.g. wheel=site-packages/ggml_bridge_server/bin)")
    return name, Path(folder)


def shape_name(text: str) -> str:
    """A preset model shape by name (``--shape``)."""
    from ..experiments.model import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown shape {text!r} (one of {', '.join(PRESETS)})")
    return text
