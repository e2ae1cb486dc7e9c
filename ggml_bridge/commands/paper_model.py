"""``ggml-bridge paper-model``: the scale model's tables (docs/paper-model.md), or with ``--bench`` a bench report's
predicted-vs-measured table (the rpc-link suite), or with ``--allreduce-bench`` the bridge's all-reduce's (the
output of ``test-bridge-allreduce --bench``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import files, flags
from ..foundations.config import Settings
from ..foundations.errors import UsageError
from . import argtypes, optionset

#: the H200 microbenchmark the single-boundary check reads (a results folder of the project)
MICROBENCH = Path("results/2026-11-30-h200x2-s1-tests-sanitizers-microbench/microbench.csv")
#: the link the all-reduce's prediction takes (PCIe Gen5 x16, measured on the H200 of 2026-11-30)
LINK = "H200 PCIe Gen5 x16 (measured)"


@dataclass(frozen=True)
class PaperModelOptions:
    """``ggml-bridge paper-model``'s options: which table to print, from what."""

    microbench: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--microbench",
            parse=flags.path,
            metavar="CSV",
            help=f"the boundary microbenchmark to check the single-boundary figures against (default: {MICROBENCH})",
        ),
    )
    bench: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--bench",
            parse=flags.path,
            metavar="BENCH_JSON",
            help="a `ggml-bridge bench --suite rpc-link` report: print only its predicted-vs-measured table",
        ),
    )
    shape: str | None = field(
        default=None,
        metadata=flags.flag(
            "--shape",
            parse=argtypes.shape_name,
            metavar="NAME",
            help="the bench model's shape (default: the report's); with --bench only",
        ),
    )
    allreduce_bench: Path | None = field(
        default=None,
        metadata=flags.flag(
            "--allreduce-bench",
            parse=flags.path,
            metavar="OUTPUT",
            help="what `test-bridge-allreduce --bench` printed: print only the all-reduce's predicted-vs-measured "
            "table",
        ),
    )
    one_link: bool = field(
        default=False,
        metadata=flags.flag(
            "--one-link", help="with --allreduce-bench: the devices share one link (virtual devices of one GPU)"
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, PaperModelOptions)


def options(ns: argparse.Namespace) -> PaperModelOptions:
    if ns.shape is not None and ns.bench is None:
        raise UsageError("--shape goes with --bench", why="it names the bench report's model", fix="add --bench")
    if ns.microbench is not None and ns.bench is not None:
        raise UsageError("--microbench and --bench exclude each other", why="--bench prints only its own table")
    if ns.allreduce_bench is not None and (ns.bench is not None or ns.microbench is not None):
        raise UsageError("--allreduce-bench excludes --bench and --microbench", why="it prints only its own table")
    if ns.one_link and ns.allreduce_bench is None:
        raise UsageError("--one-link goes with --allreduce-bench", why="it says how that output's devices were linked")
    return optionset.options(PaperModelOptions, ns)


def run(opts: PaperModelOptions, settings: Settings) -> int:
    from ..experiments import paper_model

    if opts.allreduce_bench is not None:
        from ..experiments import allreduce_check

        output = files.input_file(
            opts.allreduce_bench, "--allreduce-bench", fix="pass what test-bridge-allreduce --bench printed"
        )
        measured = allreduce_check.read(output)
        print("## The bridge's all-reduce: predicted vs measured\n")
        print(allreduce_check.table(measured, paper_model.LINKS[LINK], one_link=opts.one_link))
        return 0
    if opts.bench is not None:
        print("## Hosts over a shaped link: predicted vs measured\n")
        print(paper_model.check_bench(opts.bench, opts.shape))
        return 0
    given = opts.microbench is not None
    if opts.microbench is not None:
        files.input_file(opts.microbench, "--microbench", fix="pass the microbenchmark's CSV")
    print(paper_model.report(opts.microbench or settings.project_dir / MICROBENCH, given=given))
    return 0
