"""``ggml-bridge build``: fetch, patch and build one or more variants; prints each llama-server path (or, with
``--print-manifest`` / ``--print-bin-dir``, where the latest build of each variant is, building nothing)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import files, flags, runner
from ..foundations.config import Settings
from ..foundations.errors import BuildError, UsageError
from ..runtime import modes
from . import cmdoptions, optionset
from .cmdoptions import BuildSettingsOptions
from .fetch import SourceOptions, add_source_arguments, source_options


def variant_list(text: str, option: str) -> tuple[modes.Variant, ...]:
    """``--variant a,b``: the variants named, each looked up before any build (blanks dropped, at least one)."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise UsageError(
            f"{option} {text!r} names no variant",
            why="nothing would be built",
            fix=f"use one or more of {', '.join(modes.VARIANTS)}, comma-separated",
        )
    return tuple(modes.variant(v, option) for v in names)


@dataclass(frozen=True)
class BuildOptions:
    """``ggml-bridge build``'s options: the sources (:class:`SourceOptions`, which fetch declares), which variants, in
    one tree or one each, the [build] settings given (:class:`BuildSettingsOptions`, already in the settings the
    build gets); or where the latest build of each is; or every prefix of the series."""

    source: SourceOptions
    variants: tuple[modes.Variant, ...] | None = field(
        default=None, metadata=flags.checked(cmdoptions.VARIANT, variant_list)
    )
    """``--variant a,b``, looked up; None: the settings' one."""
    shared_tree: bool = field(
        default=False,
        metadata=flags.flag(
            "--shared-tree", help="build the listed variants in one static tree, compiling shared objects once"
        ),
    )
    settings: BuildSettingsOptions = BuildSettingsOptions()
    discard_changes: bool = field(default=False, metadata=cmdoptions.DISCARD_CHANGES)
    print_manifest: bool = field(
        default=False,
        metadata=flags.one_of(
            "located",
            flags.flag(
                "--print-manifest",
                help="build nothing: print the manifest.json path of the latest build of each --variant",
            ),
        ),
    )
    print_bin_dir: bool = field(
        default=False,
        metadata=flags.one_of(
            "located",
            flags.flag(
                "--print-bin-dir",
                help="build nothing: print the folder holding the binaries of the latest build of each --variant",
            ),
        ),
    )
    series_prefixes: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--series-prefixes",
            parse=flags.path,
            metavar="DIR",
            help="build the tree with patches 1..k of the series for every k in one CMake tree in DIR (the patched "
            "variant's options, tests on) and run the ctest labels each prefix registers; prints DIR/prefixes.md",
        ),
    )
    """``--series-prefixes DIR``: build and test every prefix of the series there instead."""


#: the [build] settings build's command line overrides, besides --variant (its own option too: ``variants``)
SETTINGS = ("backend", "cuda_arch", "jobs", "native", "ui")


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, BuildSettingsOptions, only=SETTINGS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, BuildOptions, source=add_source_arguments, settings=add_settings_arguments)


def options(ns: argparse.Namespace) -> BuildOptions:
    opts = optionset.options(
        BuildOptions, ns, source=source_options(ns), settings=optionset.options(BuildSettingsOptions, ns)
    )
    other = opts.shared_tree or opts.print_manifest or opts.print_bin_dir
    variants = opts.variants
    if opts.series_prefixes is not None and (other or (variants and [v.name for v in variants] != [modes.PATCHED])):
        raise UsageError(
            "--series-prefixes builds the patched variant in its own tree",
            why="it goes with none of --shared-tree, --print-manifest, --print-bin-dir and another --variant",
            fix="leave those out",
        )
    return opts


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
