"""``ggml-bridge paper-model``: the scale model's tables (docs/paper-model.md), or with ``--bench`` a bench report's
predicted-vs-measured table (the rpc-link suite), or with ``--allreduce-bench`` the bridge's all-reduce's (the
output of ``test-bridge-allreduce --bench``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations import files
from ..foundations.config import Settings
from ..foundations.errors import UsageError
from . import argtypes, cmdoptions

#: the H200 microbenchmark the single-boundary check reads (a results folder of the project)
MICROBENCH = Path("results/2026-11-30-h200x2-s1-tests-sanitizers-microbench/microbench.csv")
#: the link the all-reduce's prediction takes (PCIe Gen5 x16, measured on the H200 of 2026-11-30)
LINK = "H200 PCIe Gen5 x16 (measured)"


@dataclass(frozen=True)
class PaperModelOptions:
    microbench: Path | None = None
    bench: Path | None = None
    shape: str | None = None
    allreduce_bench: Path | None = None
    one_link: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cmdoptions.values(
        parser,
        (
            "--microbench",
            argtypes.path,
            "CSV",
            f"the boundary microbenchmark to check the single-boundary figures against (default: {MICROBENCH})",
        ),
        (
            "--bench",
            argtypes.path,
            "BENCH_JSON",
            "a `ggml-bridge bench --suite rpc-link` report: print only its predicted-vs-measured table",
        ),
        ("--shape", argtypes.shape_name, "NAME", "the bench model's shape (default: the report's); with --bench only"),
        (
            "--allreduce-bench",
            argtypes.path,
            "OUTPUT",
            "what `test-bridge-allreduce --bench` printed: print only the all-reduce's predicted-vs-measured table",
        ),
    )
    cmdoptions.switches(
        parser,
        ("--one-link", "with --allreduce-bench: the devices share one link (virtual devices of one GPU)"),
    )


def options(ns: argparse.Namespace) -> PaperModelOptions:
    if ns.shape is not None and ns.bench is None:
        raise UsageError("--shape goes with --bench", why="it names the bench report's model", fix="add --bench")
    if ns.microbench is not None and ns.bench is not None:
        raise UsageError("--microbench and --bench exclude each other", why="--bench prints only its own table")
    if ns.allreduce_bench is not None and (ns.bench is not None or ns.microbench is not None):
        raise UsageError("--allreduce-bench excludes --bench and --microbench", why="it prints only its own table")
    if ns.one_link and ns.allreduce_bench is None:
        raise UsageError("--one-link goes with --allreduce-bench", why="it says how that output's devices were linked")
    return PaperModelOptions(ns.microbench, ns.bench, ns.shape, ns.allreduce_bench, ns.one_link)


def run(opts: PaperModelOptions, settings: Settings) -> int:
    from ..experiments import paper_model

    if opts.allreduce_bench is not None:
        from ..experiments import allreduce_check

        output = files.input_file(
            opts.allreduce_bench, "--allreduce-bench", fix="pass what test-bridge-allreduce --bench printed"
        )
        timings = allreduce_check.read(output)
        print("## The bridge's all-reduce: predicted vs measured\n")
        print(allreduce_check.table(timings, paper_model.LINKS[LINK], one_link=opts.one_link))
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
