"""The options an options dataclass declares on its fields (:mod:`ggml_bridge.foundations.flags`, nox's
``_option_set``) as argparse arguments, and the parsed namespace back as that dataclass: a command whose options are
declared adds them with :func:`add` and makes its options with :func:`options`, writing each option once."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Mapping, Sequence, TypeVar

from ..foundations import flags
from . import argtypes

T = TypeVar("T")


#: adds the arguments of a field the command reads itself (not declared on the field)
Own = Callable[[argparse.ArgumentParser], None]
#: ``(metavar, help)``: a command's own words for an option of a class several commands take
Words = tuple[str, str]


def add(
    parser: argparse.ArgumentParser,
    cls: type,
    section: type | None = None,
    *,
    only: Sequence[str] | None = None,
    words: Mapping[str, Words] | None = None,
    **own: Own,
) -> None:
    """One argument per option ``cls`` declares, in the order of its fields, ``own``'s arguments at the place of
    their field (a group of :func:`~flags.one_of` mutually exclusive); the field's default is the option's (a bool:
    on by default ``--X`` / ``--no-X``, or a flag ``--no-X`` alone turns it off; off by default ``--X`` turns it
    on), but a field of the command's settings ``section`` is None when not given, so that the settings' value fills
    it (``cli.parse_namespace``); a field without a default is a required option. A command that takes some of the
    options of a class several commands share names them in ``only``, in its order, and may tell some in its own
    ``words`` (by field name)."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    unset = {f.name for f in dataclasses.fields(section)} if section is not None else set()
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for f in [by_name[name] for name in only] if only is not None else by_name.values():
        spec = f.metadata.get(flags.KEY)
        if spec is not None and words is not None and f.name in words:
            spec = dataclasses.replace(spec, metavar=words[f.name][0], help=words[f.name][1])
        if f.name in own:
            own[f.name](parser)
        elif spec is not None:
            if spec.exclusive is not None and spec.exclusive not in groups:
                groups[spec.exclusive] = parser.add_mutually_exclusive_group(required=spec.one_needed)
            where = parser if spec.exclusive is None else groups[spec.exclusive]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            one(
                where,
                spec,
                None if f.default is dataclasses.MISSING or f.name in unset else f.default,
                required=required,
            )


def one(
    parser: argparse.ArgumentParser | argparse._ActionsContainer,
    spec: flags.Flag,
    default: Any = None,
    *,
    required: bool = False,
) -> None:
    """The arguments of one declared option (one per name of its ``each``, the flag's aliases after the flag), with
    ``default``; a ``required`` one must be given (its field has no default)."""
    for name, option in spec.named():
        kw = _keywords(spec, default, name)
        if required:
            kw["required"] = True
        parser.add_argument(option, *(() if spec.each else spec.aliases), **kw)


def _keywords(spec: flags.Flag, default: Any, name: str) -> dict[str, Any]:
    text = spec.help.format(name) if spec.each else spec.help
    if spec.takes == "none":  # the flag alone: its const (default: the field's, None)
        return {
            "action": "store_const",
            "const": spec.const,
            "help": text,
            **({} if default is None else {"default": default}),
        }
    if isinstance(default, bool):  # on by default: --X / --no-X, or --no-X alone; else --X alone turns it on
        action = (
            ("store_false" if spec.flag.startswith("--no-") else argparse.BooleanOptionalAction)
            if default
            else "store_true"
        )
        return {"action": action, "default": default, "help": text}
    kw: dict[str, Any] = {"help": text}
    if isinstance(spec.parse, flags.Choice):
        kw["choices"] = spec.parse.words
    elif spec.parse is not None:
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
