"""Command line: ``ggml-bridge COMMAND``, one module per command in :mod:`ggml_bridge.commands`.

Progress goes to stderr; stdout carries only results (a path, a report). :func:`main` is the only place that turns
a :class:`~ggml_bridge.foundations.errors.FatalError` into an exit status.

Parsing is the same for every command: the global options and the command name first, then the command's own
parser; a command with ``passthrough`` collects what its parser does not know (and everything after ``--``) into
that attribute, in order (``serve`` hands it to llama-server). Options left unset take the value of the command's
settings section; then the command turns the namespace into its frozen options dataclass (:func:`parse_command`),
which is all the rest of the package sees.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from typing import Any, Sequence

from . import __version__
from .commands import COMMANDS as COMMANDS
from .commands import Command as Command
from .commands import cmdoptions
from .commands import stage as stage
from .foundations import config, errors, runner, signals
from .foundations.errors import FatalError, UsageError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ggml-bridge`` console script; returns the exit status. The one error boundary: a
    :class:`FatalError` and any OSError no stage turned into one (a full disk, a name too long, no permission, a
    file where a folder was expected) become one ``ggml-bridge: <kind>: ...`` line and their exit code."""
    parser = build_parser()
    known: dict[str, Any] = {}  # the settings once loaded: where the cache is, for an OSError's exit code
    try:
        with signals.stop_children_on_signals():
            return _main(parser, argv, known)
    except signals.Interrupted as e:
        print(f"ggml-bridge: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ggml-bridge: interrupted", file=sys.stderr)
        return 130
    except FatalError as e:
        return _fatal(e)
    except OSError as e:
        settings = known.get("settings")
        return _fatal(errors.from_os_error(e, settings.cache_dir if settings is not None else None))


def _fatal(e: FatalError) -> int:
    print(f"ggml-bridge: {e.kind}: {e}", file=sys.stderr)
    return e.exit_code


def _main(parser: argparse.ArgumentParser, argv: Sequence[str] | None, known: dict[str, Any]) -> int:
    try:
        args, rest = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return UsageError.exit_code
        signals.stop_grace()  # a bad GGML_BRIDGE_STOP_GRACE is a usage error now, not at the first signal
        command = COMMANDS[args.command]
        # the settings are checked before the command parses (a bad config file or CMAKE_ARGS is an error even
        # with --help), and loaded again when the command's own options override some of them
        overrides: dict[str, Any] = {"cache_dir": getattr(args, "cache_dir", None)}
        config_path = getattr(args, "config", None)
        known["settings"] = settings = config.load(overrides, config_path=config_path)
        ns = parse_namespace(command, rest, args, settings)
        runner.set_quiet(bool(getattr(args, "quiet", False)))
        if command.overrides is not None:
            overrides.update(command.overrides(ns))
            known["settings"] = settings = config.load(overrides, config_path=config_path)
        opts = command.options(ns) if command.options is not None else ns
        return int(command.run(opts, settings))
    except SystemExit as e:  # argparse: --help, --version, usage errors (already printed)
        return e.code if isinstance(e.code, int) else UsageError.exit_code


def build_parser() -> argparse.ArgumentParser:
    """The first pass: global options and the command name (each command's options are :func:`parse_command`'s)."""
    parser = argparse.ArgumentParser(
        prog="ggml-bridge",
        description="Fetch the pinned llama.cpp, apply the patch series, build, launch and verify llama-server.",
        epilog=errors.epilog(),
    )
    parser.add_argument("--version", action="version", version=f"ggml-bridge {__version__}")
    cmdoptions.common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        cmdoptions.common(sub.add_parser(command.name, help=command.help, add_help=False))  # -h: its own parser
    return parser


def command_parser(command: Command) -> argparse.ArgumentParser:
    """The parser of one command (``ggml-bridge NAME -h`` shows it)."""
    parser = argparse.ArgumentParser(
        prog=f"ggml-bridge {command.name}", description=command.help, allow_abbrev=command.passthrough is None
    )
    cmdoptions.common(parser)
    command.add_arguments(parser)
    return parser


def parse_namespace(
    command: Command,
    argv: Sequence[str],
    namespace: argparse.Namespace | None = None,
    settings: config.Settings | None = None,
) -> argparse.Namespace:
    """Parse a command's arguments (into ``namespace``, which keeps the global options already parsed); options
    left unset take their value from the command's settings section (of ``settings``, else its defaults)."""
    parser = command_parser(command)
    argv = list(argv)
    if command.passthrough is None:
        ns = parser.parse_args(argv, namespace)
    else:
        theirs: list[str] = []
        if "--" in argv:
            i = argv.index("--")
            argv, theirs = argv[:i], argv[i + 1 :]
        ns, extra = parser.parse_known_args(argv, namespace)
        setattr(ns, command.passthrough, list(extra) + theirs)
    if command.section is not None:
        section = getattr(settings if settings is not None else config.Settings(), command.section)
        for f in dataclasses.fields(section):
            if getattr(ns, f.name, None) is None:
                setattr(ns, f.name, getattr(section, f.name))
    return ns


def parse_command(
    command: Command,
    argv: Sequence[str],
    namespace: argparse.Namespace | None = None,
    settings: config.Settings | None = None,
) -> Any:
    """A command's arguments as the frozen options its stage takes (the namespace where it has none)."""
    ns = parse_namespace(command, argv, namespace, settings)
    return command.options(ns) if command.options is not None else ns


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
