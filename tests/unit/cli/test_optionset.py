"""Options declared on an options dataclass's fields (foundations/flags.py) as argparse arguments and back
(commands/optionset.py): a flag's aliases, and a field without a default as a required option."""

from __future__ import annotations

import argparse
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
