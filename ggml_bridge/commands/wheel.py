"""``ggml-bridge wheel``: write the sdist (or take ``--sdist``) and build its platform wheel, repaired; prints the
wheel's path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import files, flags
from ..foundations.config import Settings
from . import cmdoptions, optionset
from .sdist import SdistOptions, add_dist_arguments


def cpu_variants(text: str) -> tuple[str, ...]:
    """``--cpu-variants``: the comma-separated names, empty ones dropped (none: every CPU variant)."""
    return tuple(v for v in text.split(",") if v)


#: the wheel's words for the [build] settings it overrides (a portable wheel's backends and architectures)
WORDS: dict[str, optionset.Words] = {
    "backend": (
        "{cpu,cuda,vulkan}",
        "cpu (default: portable, every CPU variant), cuda (every architecture of "
        "build_support/cuda_runtime.json the toolkit accepts, NVIDIA runtime wheels as deps) or vulkan "
        "(ggml's Vulkan backend; the system's Vulkan loader at run time)",
    ),
    "cuda_arch": ("LIST", "CMAKE_CUDA_ARCHITECTURES instead of the wheel's list, e.g. '86-real;90-real;120-virtual'"),
}


@dataclass(frozen=True)
class WheelOptions:
    """``ggml-bridge wheel``'s options: its sdist's (:class:`SdistOptions`), which CPU variants, from which sdist,
    where the build and the index go."""

    dist: SdistOptions
    cpu_variants: tuple[str, ...] = field(
        default=(),
        metadata=flags.flag(
            "--cpu-variants",
            parse=cpu_variants,
            metavar="LIST",
            help="only these CPU variants, comma-separated (e.g. x64,haswell; default: all)",
        ),
    )
    sdist: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--sdist",
            parse=flags.path,
            metavar="PATH",
            help="build from this sdist (from `ggml-bridge sdist`) instead of making one",
        ),
    )
    build_dir: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--build-dir",
            parse=flags.path,
            metavar="DIR",
            help="keep the unpacked sdist and CMake's build folder in DIR: a stopped build, or a rebuild of the "
            "same sdist, continues where it stopped (default: a temporary folder, removed)",
        ),
    )
    index: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--index",
            parse=flags.path,
            metavar="DIR",
            help="also write the wheel and the sdist into a PEP 503 simple index DIR/simple",
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dist_arguments(parser)
    optionset.add(parser, cmdoptions.BuildSettingsOptions, only=("jobs", "backend", "cuda_arch"), words=WORDS)
    optionset.add(parser, WheelOptions)  # dist: its sdist's, added above with the [build] settings' options


def options(ns: argparse.Namespace) -> WheelOptions:
    from .sdist import options as sdist_options

    return optionset.options(WheelOptions, ns, dist=sdist_options(ns))


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
