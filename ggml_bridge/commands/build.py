"""``ggml-bridge build``: fetch, patch and build one or more variants; prints each llama-server path (or, with
``--print-manifest`` / ``--print-bin-dir``, where the latest build of each variant is, building nothing)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations import files, runner
from ..foundations.config import Settings
from ..foundations.errors import BuildError, UsageError
from ..runtime import modes
from . import argtypes, cmdoptions
from .fetch import SourceOptions, add_source_arguments, source_options


@dataclass(frozen=True)
class BuildOptions:
    source: SourceOptions
    variants: tuple[modes.Variant, ...] | None = None
    """``--variant a,b``, looked up; None: the settings' one."""
    shared_tree: bool = False
    discard_changes: bool = False
    print_manifest: bool = False
    print_bin_dir: bool = False
    series_prefixes: Path | None = None
    """``--series-prefixes DIR``: build and test every prefix of the series there instead."""


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """What every build takes (the [build] settings these override: :func:`ggml_bridge.commands.build_overrides`)."""
    cmdoptions.values(
        parser,
        (
            "--variant",
            None,
            "{" + ",".join(modes.VARIANTS) + "}[,...]",
            "what to build (default: patched); a comma-separated list builds several",
        ),
    )
    cmdoptions.switches(
        parser, ("--shared-tree", "build the listed variants in one static tree, compiling shared objects once")
    )
    cmdoptions.backend(parser, "build")
    cmdoptions.cuda_arch(parser, "build")
    cmdoptions.jobs(parser)
    parser.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        default=None,
        help="do not optimise for this CPU (-DGGML_NATIVE=OFF)",
    )
    cmdoptions.no_ui(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_build_arguments(parser)
    cmdoptions.discard_changes(parser)
    located = parser.add_mutually_exclusive_group()
    cmdoptions.switches(
        located,
        ("--print-manifest", "build nothing: print the manifest.json path of the latest build of each --variant"),
        (
            "--print-bin-dir",
            "build nothing: print the folder holding the binaries of the latest build of each --variant",
        ),
    )
    cmdoptions.values(
        parser,
        (
            "--series-prefixes",
            argtypes.path,
            "DIR",
            "build the tree with patches 1..k of the series for every k in one CMake tree in DIR (the patched "
            "variant's options, tests on) and run the ctest labels each prefix registers; prints DIR/prefixes.md",
        ),
    )


def options(ns: argparse.Namespace) -> BuildOptions:
    variants = None
    if ns.variant is not None:
        names = [v.strip() for v in ns.variant.split(",") if v.strip()]
        if not names:
            raise UsageError(
                f"--variant {ns.variant!r} names no variant",
                why="nothing would be built",
                fix=f"use one or more of {', '.join(modes.VARIANTS)}, comma-separated",
            )
        variants = tuple(modes.variant(v, "--variant") for v in names)  # every name looked up before any build
    prefixes = ns.series_prefixes
    other = ns.shared_tree or ns.print_manifest or ns.print_bin_dir
    if prefixes is not None and (other or (variants and [v.name for v in variants] != [modes.PATCHED])):
        raise UsageError(
            "--series-prefixes builds the patched variant in its own tree",
            why="it goes with none of --shared-tree, --print-manifest, --print-bin-dir and another --variant",
            fix="leave those out",
        )
    return BuildOptions(
        source_options(ns), variants, ns.shared_tree, ns.discard_changes, ns.print_manifest, ns.print_bin_dir, prefixes
    )


def run(opts: BuildOptions, settings: Settings) -> int:
    from ..distribution.builder import locate, shared, single

    variants = list(opts.variants or (modes.variant(settings.build.variant),))
    names = [v.name for v in variants]
    if opts.print_manifest or opts.print_bin_dir:
        # what a build left, for scripts (scripts/gpu/prove.sh): the CLI knows where the cache keeps it
        for name in names:
            manifest = locate.find_manifest(settings, name)
            print(
                manifest if opts.print_manifest else locate.find_binary(settings, "llama-server", variant=name).parent
            )
        return 0
    src = opts.source
    if opts.series_prefixes is not None:
        from ..distribution.builder.prefixes import build_prefixes

        out = files.output_dir(opts.series_prefixes, "--series-prefixes")  # before the fetch and the builds
        report, done = build_prefixes(settings, out, source_spec=src.source, allow_unpinned=src.allow_unpinned)
        print(report)
        return 0 if all(p.ok for p in done) else BuildError.exit_code
    if opts.shared_tree:
        results = shared.ensure_shared(
            settings,
            variants,
            source_spec=src.source,
            allow_unpinned=src.allow_unpinned,
            discard_changes=opts.discard_changes,
        )
    else:
        results = [
            single.ensure(
                settings,
                v,
                source_spec=src.source,
                allow_unpinned=src.allow_unpinned,
                discard_changes=opts.discard_changes,
            )
            for v in variants
        ]
    for result in results:
        for name, path in result.binaries.items():
            runner.log(f"    {result.variant} {name}: {path}")
    # stdout: llama-server's path, one line per variant (the last is the last variant listed)
    for result in sorted(results, key=lambda r: names.index(r.variant)):
        print(result.server)
    return 0
