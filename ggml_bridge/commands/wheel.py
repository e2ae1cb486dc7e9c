"""``ggml-bridge wheel``: write the sdist (or take ``--sdist``) and build its platform wheel, repaired; prints the
wheel's path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations import files
from ..foundations.config import Settings
from . import argtypes, cmdoptions
from .sdist import SdistOptions, add_dist_arguments


@dataclass(frozen=True)
class WheelOptions:
    dist: SdistOptions
    cpu_variants: tuple[str, ...] = ()
    sdist: Path | None = None
    build_dir: Path | None = None
    index: Path | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dist_arguments(parser)
    cmdoptions.jobs(parser)
    cmdoptions.backend(parser, "wheel")
    cmdoptions.cuda_arch(parser, "wheel")
    cmdoptions.values(
        parser,
        ("--cpu-variants", None, "LIST", "only these CPU variants, comma-separated (e.g. x64,haswell; default: all)"),
        ("--sdist", argtypes.path, "PATH", "build from this sdist (from `ggml-bridge sdist`) instead of making one"),
        (
            "--build-dir",
            argtypes.path,
            "DIR",
            "keep the unpacked sdist and CMake's build folder in DIR: a stopped build, or a rebuild of the "
            "same sdist, continues where it stopped (default: a temporary folder, removed)",
        ),
        ("--index", argtypes.path, "DIR", "also write the wheel and the sdist into a PEP 503 simple index DIR/simple"),
    )


def options(ns: argparse.Namespace) -> WheelOptions:
    from .sdist import options as sdist_options

    return WheelOptions(
        sdist_options(ns), tuple(v for v in (ns.cpu_variants or "").split(",") if v), ns.sdist, ns.build_dir, ns.index
    )


def run(opts: WheelOptions, settings: Settings) -> int:
    from ..distribution import wheel, wheel_plan

    given = opts.sdist and files.input_file(opts.sdist, "--sdist", fix="pass the sdist `ggml-bridge sdist` wrote")
    for flag, folder in (("--build-dir", opts.build_dir), ("--index", opts.index)):
        if folder is not None:
            files.output_dir(folder, flag)  # refused before the fetch and the build, not after
    wplan = wheel_plan.plan(settings, cpu_variants=list(opts.cpu_variants))
    out, src = opts.dist.out, opts.dist.source
    if given is not None:
        sdist = given
    else:
        sdist = wheel.make_sdist(settings, out, source_spec=src.source, allow_unpinned=src.allow_unpinned).path
    raw = wheel.build_wheel(settings, sdist, out / "unrepaired", wplan, build_dir=opts.build_dir)
    repaired = wheel.repair_wheel(raw, out, wplan.runtime)
    if opts.index is not None:
        wheel.write_index(opts.index, [repaired.path, sdist])
    print(repaired.path)
    return 0
