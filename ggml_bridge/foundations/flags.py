"""Command-line options declared once, on the fields of the frozen options dataclasses (nox's ``_option_set``):
``field(metadata=flag("--shapes", parse=names, metavar="LIST", help=...))`` says everything the command line needs
(flag, parser, metavar, help; the field's default is the option's), without argparse: the command line
(:mod:`ggml_bridge.commands.optionset`) adds one argument per declared field and turns the parsed namespace back
into the dataclass. The parsers here take the text given and return the typed value (tuples, not comma strings), or
raise :class:`BadValue` with one line naming what is wrong."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

from . import files

#: the key of a field's metadata that holds its :class:`Flag`
KEY = "ggml_bridge.flag"
#: how many values an option takes (:attr:`Flag.takes`)
Takes = Literal["one", "many", "repeat", "none"]


class BadValue(ValueError):
    """A value the command line cannot take: the message is the one line the user sees after the option's name."""


@dataclass(frozen=True)
class Flag:
    """How one field of an options dataclass is given on the command line."""

    flag: str
    help: str
    #: the text given -> the field's value (:class:`BadValue` when it cannot be); None: the text itself
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    #: one value; ``many``: one or more after the flag (``nargs="+"``); ``repeat``: one per flag given, the flag
    #: repeatable (``action="append"``); the field a tuple of them; ``none``: no value, the flag given alone is
    #: :attr:`const` (``store_const``: :func:`turns_off`)
    takes: Takes = "one"
    #: the value of the flag given alone (``nargs="?"``, or ``takes="none"``); None: the flag needs its value
    const: Any = None
    #: a given value checked once parsed, with the flag's name (e.g. ``files.input_file``): the value to keep
    check: Callable[[Any, str], Any] | None = None
    #: one option per name, ``flag`` formatted with it (``--bin-dir-{}``), the field a dict name -> value given
    each: tuple[str, ...] = ()
    #: the options of one name are mutually exclusive (:func:`one_of`)
    exclusive: str | None = None
    #: one of the mutually exclusive options of :attr:`exclusive` must be given
    one_needed: bool = False
    #: other names of the flag (``-o`` for ``--out``: :func:`also`), after it
    aliases: tuple[str, ...] = ()

    def named(self) -> tuple[tuple[str, str], ...]:
        """``(name, flag)`` of every flag of the option: one per name of :attr:`each`, else ``("", flag)``."""
        return tuple((name, self.flag.format(name)) for name in self.each) if self.each else (("", self.flag),)


def flag(
    name: str,
    *,
    help: str,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    takes: Takes = "one",
    const: Any = None,
    check: Callable[[Any, str], Any] | None = None,
) -> dict[str, Flag]:
    """A field's metadata declaring its option (``dataclasses.field(metadata=flag(...))``)."""
    return {KEY: Flag(name, help, parse, metavar, takes, const, check)}


def one_of(group: str, declaration: dict[str, Flag], *, needed: bool = False) -> dict[str, Flag]:
    """``declaration`` (:func:`flag`'s) as one of the mutually exclusive options ``group`` names (``needed``: one of
    them must be given, said on the group's first)."""
    return {KEY: dataclasses.replace(declaration[KEY], exclusive=group, one_needed=needed)}


def checked(declaration: dict[str, Flag], check: Callable[[Any, str], Any]) -> dict[str, Flag]:
    """``declaration`` (:func:`flag`'s, e.g. a constant two fields read) with ``check`` (:attr:`Flag.check`): one
    option, two fields that keep what each makes of it."""
    return {KEY: dataclasses.replace(declaration[KEY], check=check)}


def turns_off(name: str, *, help: str) -> dict[str, Flag]:
    """A flag ``--no-X`` that takes no value and turns a setting off: the field (default None, the setting's value
    stands) is False when the flag is given."""
    return flag(name, help=help, takes="none", const=False)


def also(alias: str, declaration: dict[str, Flag]) -> dict[str, Flag]:
    """``declaration`` (:func:`flag`'s) with one more name for its flag (``also("-o", flag("--out", ...))``)."""
    spec = declaration[KEY]
    return {KEY: dataclasses.replace(spec, aliases=(*spec.aliases, alias))}


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of dataclass ``cls`` that declare an option, in their order, with their :class:`Flag`."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]


def dest(option: str) -> str:
    """The attribute a flag's value is parsed into (``--warmup-reps`` -> ``warmup_reps``)."""
    return option.lstrip("-").replace("-", "_")


def typed(cls: type, given: Mapping[str, Any], **own: Any) -> Any:
    """``cls`` of the values parsed by flag destination (:func:`dest`; None or absent: not given, the field's
    default): several values as a tuple, ``each`` as a dict of the names given, every given value checked; the
    fields the command makes itself from ``own``."""
    values: dict[str, Any] = dict(own)
    for f, spec in declared(cls):
        found = {name: _checked(spec, given[dest(o)], o) for name, o in spec.named() if given.get(dest(o)) is not None}
        if spec.each:
            values[f.name] = found
        elif found:
            values[f.name] = found[""]
    return cls(**values)


def _checked(spec: Flag, value: Any, option: str) -> Any:
    if spec.takes in ("many", "repeat"):
        value = tuple(value)
    return spec.check(value, option) if spec.check is not None else value


# --- the parsers --------------------------------------------------------------------------------------------------


def count(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], int]:
    """An integer in ``minimum..maximum``."""

    def parse(text: str) -> int:
        try:
            if not text.strip().isascii():  # int() takes any script's digits: '５' would be 5
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise BadValue(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise BadValue(f"{value} is out of range (it must be {minimum}..{maximum})")
        return value

    parse.__name__ = "count"
    return parse


def seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """A finite positive number (or zero with ``allow_zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise BadValue(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise BadValue(f"{text!r}: it must be a finite number " + ("of 0 or more" if allow_zero else "above 0"))
        return value

    parse.__name__ = "number"
    return parse


def count_list(minimum: int = 1, maximum: int = 2**31 - 1) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of distinct integers in ``minimum..maximum`` (at least one)."""
    one = count(minimum, maximum)

    def parse(text: str) -> tuple[int, ...]:
        items = text.split(",")
        if not text.strip() or any(not x.strip() for x in items):
            raise BadValue(f"{text!r} is not a comma-separated list of whole numbers")
        values = tuple(one(x.strip()) for x in items)
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise BadValue(f"{text!r} names {', '.join(map(str, twice))} more than once")
        return values

    parse.__name__ = "list"
    return parse


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (``--cases off,batched``): each once, in the order given, blanks dropped;
    at least one."""
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not items:
        raise BadValue(f"{text!r} names nothing (give a comma-separated list of names)")
    return items


@dataclass(frozen=True)
class Choice:
    """One of :attr:`words` (the command line's ``choices``: its usage lists them)."""

    words: tuple[str, ...]

    def __call__(self, text: str) -> str:
        if text not in self.words:
            raise BadValue(f"invalid choice: {text!r} (choose from {', '.join(map(repr, self.words))})")
        return text


def choices(words: Iterable[str]) -> Choice:
    """One of ``words``."""
    return Choice(tuple(words))


#: The smallest size :func:`mebibytes` takes besides 0: one KiB (a smaller one rounded to 0 bytes, i.e. no limit).
MIN_MEBIBYTES = 1 / 1024


def mebibytes(text: str) -> float:
    """A finite size in MiB, 0 meaning no limit; otherwise at least one KiB."""
    try:
        value = float(text)
    except ValueError:
        raise BadValue(f"{text!r} is not a number of MiB") from None
    if not math.isfinite(value) or value < 0 or 0 < value < MIN_MEBIBYTES:
        raise BadValue(f"{text!r}: must be 0 (no limit) or a number of MiB from {MIN_MEBIBYTES:g} (one KiB)")
    return value


def path(text: str) -> Path:
    """A path the user typed, never empty: ``--out ''`` would silently mean the current folder (``Path('')`` is
    ``.``), so it is a bad value like any other."""
    if not text.strip():
        raise BadValue("the path is empty (an empty value would mean the current folder)")
    return Path(text)


# --- options several commands declare -----------------------------------------------------------------------------


def report_dir(default: str) -> dict[str, Flag]:
    """``--report DIR``: where the report goes."""
    return flag("--report", parse=path, metavar="DIR", help=f"report directory (default: {default})")


def startup_timeout(what: str) -> dict[str, Flag]:
    """``--startup-timeout S``: a finite number of seconds above 0 wherever it is taken."""
    return flag("--startup-timeout", parse=seconds(), metavar="S", help=f"seconds to wait for {what}")


def vocab(vocab_file: str) -> dict[str, Flag]:
    """``--vocab GGUF``: an existing file when given."""
    return flag(
        "--vocab",
        parse=path,
        metavar="GGUF",
        help=f"vocabulary GGUF (default: models/{vocab_file} of the upstream tree)",
        check=lambda p, option: files.input_file(p, option, fix="pass the upstream vocabulary GGUF"),
    )


def bin_dirs(variants: tuple[str, ...], programs: str) -> dict[str, Flag]:
    """``--bin-dir-<variant> DIR`` for every build variant: the folder of its binaries instead of the latest build
    (existing folders, by variant name)."""
    text = f"folder with the {{}} build's {programs} (default: its latest build)"
    return {KEY: Flag("--bin-dir-{}", text, path, "DIR", check=files.input_dir, each=variants)}
