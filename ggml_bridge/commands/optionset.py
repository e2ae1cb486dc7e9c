"""The options an options dataclass declares on its fields (:mod:`ggml_bridge.foundations.flags`, nox's
``_option_set``) as argparse arguments, and the parsed namespace back as that dataclass: a command whose options are
declared adds them with :func:`add` and makes its options with :func:`options`, writing each option once."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from ..foundations import flags
from . import argtypes

T = TypeVar("T")


def add(parser: argparse.ArgumentParser | argparse._ActionsContainer, cls: type) -> None:
    """One argument per option ``cls`` declares, in the order of its fields; the field's default is the option's
    (a bool: ``--X`` / ``--no-X`` on by default, else ``--X`` alone turns it on)."""
    for f, spec in flags.declared(cls):
        for name, option in spec.named():
            parser.add_argument(option, **_keywords(f, spec, name))


def _keywords(f: dataclasses.Field[Any], spec: flags.Flag, name: str) -> dict[str, Any]:
    text = spec.help.format(name) if spec.each else spec.help
    if isinstance(f.default, bool):
        action = argparse.BooleanOptionalAction if f.default else "store_true"
        return {"action": action, "default": f.default, "help": text}
    kw: dict[str, Any] = {"help": text}
    if spec.parse is not None:
        kw["type"] = argtypes.typed(spec.parse)
    if spec.many:
        kw["nargs"] = "+"
    elif spec.const is not None:
        kw.update(nargs="?", const=spec.const)
    if spec.metavar is not None:
        kw["metavar"] = spec.metavar
    if f.default is not dataclasses.MISSING and f.default is not None:
        kw["default"] = f.default
    return kw


def options(cls: type[T], ns: argparse.Namespace) -> T:
    """The options ``cls`` declares, from what argparse parsed (:func:`add`'s arguments), each given one checked."""
    result: T = flags.typed(cls, vars(ns))
    return result
