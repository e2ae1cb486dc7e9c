"""The options an options dataclass declares on its fields (:mod:`ggml_bridge.foundations.flags`, nox's
``_option_set``) as argparse arguments, and the parsed namespace back as that dataclass: a command whose options are
declared adds them with :func:`add` and makes its options with :func:`options`, writing each option once."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, TypeVar

from ..foundations import flags
from . import argtypes

T = TypeVar("T")


#: adds the arguments of a field the command reads itself (not declared on the field)
Own = Callable[[argparse.ArgumentParser], None]


def add(parser: argparse.ArgumentParser, cls: type, **own: Own) -> None:
    """One argument per option ``cls`` declares, in the order of its fields, ``own``'s arguments at the place of
    their field; the field's default is the option's (a bool: ``--X`` / ``--no-X`` on by default, else ``--X``
    alone turns it on)."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(flags.KEY)
        if f.name in own:
            own[f.name](parser)
        elif spec is not None:
            one(parser, spec, None if f.default is dataclasses.MISSING else f.default)


def one(parser: argparse.ArgumentParser | argparse._ActionsContainer, spec: flags.Flag, default: Any = None) -> None:
    """The arguments of one declared option (one per name of its ``each``), with ``default``."""
    for name, option in spec.named():
        parser.add_argument(option, **_keywords(spec, default, name))


def _keywords(spec: flags.Flag, default: Any, name: str) -> dict[str, Any]:
    text = spec.help.format(name) if spec.each else spec.help
    if isinstance(default, bool):
        action = argparse.BooleanOptionalAction if default else "store_true"
        return {"action": action, "default": default, "help": text}
    kw: dict[str, Any] = {"help": text}
    if spec.parse is not None:
        kw["type"] = argtypes.typed(spec.parse)
    if spec.takes == "many":
        kw["nargs"] = "+"
    elif spec.takes == "repeat":
        kw["action"] = "append"
    elif spec.const is not None:
        kw.update(nargs="?", const=spec.const)
    if spec.metavar is not None:
        kw["metavar"] = spec.metavar
    if default is not None and spec.takes == "one":
        kw["default"] = default
    return kw


def options(cls: type[T], ns: argparse.Namespace, **own: Any) -> T:
    """The options ``cls`` declares, from what argparse parsed (:func:`add`'s arguments), each given one checked;
    the fields the command makes itself from ``own``."""
    result: T = flags.typed(cls, vars(ns), **own)
    return result
