"""Options declared on an options dataclass's fields (foundations/flags.py) as argparse arguments and back
(commands/optionset.py): a flag's aliases, a field without a default as a required option, some options of a shared
class in a command's order and words, a --no-X switch that leaves a setting standing, one option read by two fields;
and the [build] settings each command line overrides."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ggml_bridge.commands import optionset
from ggml_bridge.foundations import flags


@dataclass(frozen=True)
class _Options:
    to: str = field(metadata=flags.flag("--to", metavar="HOST:PORT", help="where"))
    out: Path | None = field(
        default=None, metadata=flags.also("-o", flags.flag("--out", parse=flags.path, metavar="PATH", help="here"))
    )


def _parse(argv: list[str]) -> _Options:
    parser = argparse.ArgumentParser(prog="t")
    optionset.add(parser, _Options)
    return optionset.options(_Options, parser.parse_args(argv))


def test_an_alias_is_the_same_option_and_its_value_is_parsed_alike() -> None:
    assert _parse(["--to", "h:1", "-o", "x"]) == _Options("h:1", Path("x"))
    assert _parse(["--to", "h:1", "--out", "x"]) == _Options("h:1", Path("x"))
    assert _parse(["--to", "h:1"]) == _Options("h:1", None)


def test_the_alias_follows_the_flag_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["--help"])
    assert "--out PATH, -o PATH" in capsys.readouterr().out


def test_a_field_without_a_default_is_a_required_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(["-o", "x"])
    assert e.value.code == 2
    assert "the following arguments are required: --to" in capsys.readouterr().err


def test_a_bad_value_of_the_alias_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(["--to", "h:1", "-o", ""])
    assert e.value.code == 2
    assert "the path is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "variants"),
    [([], ()), (["--cpu-variants", "x64,haswell"], ("x64", "haswell")), (["--cpu-variants", ",x64,,"], ("x64",))],
)
def test_wheel_cpu_variants_are_the_names_given_empty_ones_dropped(argv: list[str], variants: tuple[str, ...]) -> None:
    from ggml_bridge.commands import wheel

    parser = argparse.ArgumentParser(prog="t")
    wheel.add_arguments(parser)
    opts = wheel.options(parser.parse_args(argv))
    assert opts.cpu_variants == variants
    assert opts.dist.out == Path("dist") and opts.sdist is None


@dataclass(frozen=True)
class _Either:
    left: bool = field(default=False, metadata=flags.one_of("side", flags.flag("--left", help="l"), needed=True))
    right: bool = field(default=False, metadata=flags.one_of("side", flags.flag("--right", help="r")))


def test_a_needed_group_wants_one_of_its_options_and_takes_no_two(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="t")
    optionset.add(parser, _Either)
    assert optionset.options(_Either, parser.parse_args(["--right"])) == _Either(right=True)
    for argv, said in (([], "one of the arguments --left --right is required"), (["--left", "--right"], "not allowed")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2
        assert said in capsys.readouterr().err


@dataclass(frozen=True)
class _Shared:
    first: str | None = field(default=None, metadata=flags.flag("--first", metavar="A", help="the first"))
    second: int | None = field(default=None, metadata=flags.flag("--second", parse=flags.count(), help="the second"))
    third: str | None = field(default=None, metadata=flags.flag("--third", help="the third"))


def test_a_command_adds_some_of_a_shared_class_in_its_order_and_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="t")
    optionset.add(parser, _Shared, only=("third", "first"), words={"first": ("B", "told here")})
    assert [a.option_strings for a in parser._actions[1:]] == [["--third"], ["--first"]]
    assert optionset.options(_Shared, parser.parse_args(["--first", "x"])) == _Shared(first="x")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert re.search(r"--first B +told here\n", out) and "the first" not in out and "--second" not in out


@dataclass(frozen=True)
class _Switch:
    native: bool | None = field(default=None, metadata=flags.turns_off("--no-native", help="off"))


@pytest.mark.parametrize(("argv", "value"), [([], None), (["--no-native"], False), (["--no-native"] * 2, False)])
def test_a_switch_that_turns_a_setting_off_is_false_when_given_else_none(argv: list[str], value: bool | None) -> None:
    parser = argparse.ArgumentParser(prog="t")
    optionset.add(parser, _Switch)
    assert optionset.options(_Switch, parser.parse_args(argv)) == _Switch(value)
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-native", "x"])


def _upper(text: str, option: str) -> str:
    return text.upper()


_ONCE = flags.flag("--name", metavar="N", help="one option")


@dataclass(frozen=True)
class _Twice:
    raw: str | None = field(default=None, metadata=_ONCE)
    loud: str | None = field(default=None, metadata=flags.checked(_ONCE, _upper))


def test_one_option_read_by_two_fields_keeps_what_each_check_makes_of_it() -> None:
    parser = argparse.ArgumentParser(prog="t")
    optionset.add(parser, _Twice, only=("raw",))
    assert optionset.options(_Twice, parser.parse_args(["--name", "ab"])) == _Twice("ab", "AB")
    assert optionset.options(_Twice, parser.parse_args([])) == _Twice()


_SETTINGS = ("variant", "backend", "cuda_arch", "jobs", "native", "ui")


@pytest.mark.parametrize(
    ("name", "argv", "given"),
    [
        (
            "build",
            ["--variant", "upstream", "-j", "4", "--no-native", "--no-ui", "--backend", "cpu", "--cuda-arch", "90"],
            {"variant": "upstream", "jobs": 4, "native": False, "ui": False, "backend": "cpu", "cuda_arch": "90"},
        ),
        ("build", ["--variant", "patched,upstream"], {}),
        (
            "wheel",
            ["--jobs", "2", "--no-ui", "--backend", "cuda", "--cuda-arch", "86"],
            {"jobs": 2, "ui": False, "backend": "cuda", "cuda_arch": "86"},
        ),
        ("sdist", ["--no-ui"], {"ui": False}),
        ("fetch", [], {}),
        ("patch", ["--check"], {}),
    ],
)
def test_the_build_settings_a_command_line_overrides(name: str, argv: list[str], given: dict[str, object]) -> None:
    from ggml_bridge import cli

    command = cli.COMMANDS[name]
    assert command.overrides is not None
    assert command.overrides(cli.parse_namespace(command, argv)) == {f"build.{k}": given.get(k) for k in _SETTINGS}


def test_build_looks_up_its_variants_and_keeps_the_settings_given() -> None:
    from ggml_bridge import cli
    from ggml_bridge.runtime import modes

    opts = cli.parse_command(cli.COMMANDS["build"], ["--variant", "patched, upstream,", "--shared-tree", "-j", "3"])
    assert opts.variants == (modes.VARIANTS["patched"], modes.VARIANTS["upstream"]) and opts.shared_tree
    assert opts.settings.jobs == 3 and opts.settings.variant is None and opts.settings.ui is None
    assert cli.parse_command(cli.COMMANDS["build"], []).variants is None
