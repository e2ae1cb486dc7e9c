"""The bench report (:class:`.results.Report`) written: bench.json and bench.md (with the --smi table and the
microbenchmark), the plots, and ``--pool``'s pooling of several reports into one."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...foundations import files
from ...foundations.errors import BenchError, UsageError
from ...foundations.runner import log
from ...runtime import modes, netbench
from .measures import MEASURES
from .results import CaseEntry, Model, Report, read
from .running import CopyRate
from .stats import TABLE_REFERENCES, CaseRun, Sample, batched_pairs, pool, references
from .telemetry import GpuState

CASES = modes.MODES


def write(report: Report, out_dir: Path) -> None:
    """bench.json and bench.md into ``out_dir``."""
    (out_dir / "bench.json").write_text(json.dumps(report.to_json(), indent=1))
    (out_dir / "bench.md").write_text(render_markdown(report))


def render_markdown(report: Report) -> str:
    lines = [f"# ggml-bridge bench: {report.suite}", "", f"{report.date} · {report.about}", ""]
    for g in report.environment.get("gpus", []):
        lines.append(
            f"- GPU {g['index']}: {g['name']}, driver {g['driver_version']}, PCIe gen "
            f"{g['pcie.link.gen.max']} x{g['pcie.link.width.max']} (max)"
        )
    lines += _models_line(report)
    lines.append(f"- settings: {report.settings}" + (f"; CPUs {report.cpus}" if report.cpus else ""))
    lines += _wallclock_lines(report.settings, report.measures or ["bench"])
    if report.links:
        lines.append(f"- shaped links: {netbench.describe(report.links)}")
    if report.pooled_from:
        lines.append(f"- pooled from {len(report.pooled_from)} reports: " + ", ".join(report.pooled_from))
    if report.stopped:
        lines.append(f"- stopped early, {report.stopped}")
    lines.append(
        f"- rounds: {report.figures.rounds} interleaved, {_repetitions(report)}; "
        "figure = median of all samples, ± = interquartile range; 'noise' = difference inside the spreads; "
        "'paired' = median over rounds of the ratio within a round [95 % bootstrap interval over rounds]"
    )
    lines.append("")
    for c in report.cases:
        lines.append(
            f"- **{c.name}**: {c.description}; binaries {c.bin_dir}"
            + (f"; engagement: {c.engagement}" if c.engagement else "")
        )
    lines.append("")
    lines += _figures_table(report)
    lines += batched_table(report)
    if report.figures.not_engaged:
        lines += ["", "**Not engaged (figures not used):** " + ", ".join(report.figures.not_engaged)]
    if report.skipped:
        lines += ["", "**Not measured:** " + "; ".join(report.skipped)]
    if report.smi:
        lines += smi_table(report)
    if report.microbench:
        lines += _microbench_table(report.microbench)
    return "\n".join(lines) + "\n"


def _figures_table(report: Report) -> list[str]:
    """Markdown: per test, every case's median ± interquartile range and its ratios against the references."""
    lines = []
    tests = report.figures.tests
    names = [c.name for c in report.cases]
    refs = references(names, TABLE_REFERENCES)
    head = "| " + " | ".join(["test", *names, *(f"vs {r}" for r in refs)]) + " |"
    lines += [head, "|" + "---|" * (1 + len(names) + len(refs))]
    for t in tests:
        row = [t]
        for n in names:
            s = report.figures.summary.get(n, {}).get(t)
            row.append(f"{s.median:.1f} ± {s.q3 - s.q1:.1f}" if s else "—")
        for r in refs:
            cells = []
            for n in names:
                cmp = report.figures.ratios.get(r, {}).get(n, {}).get(t)
                if cmp and n != r:
                    notes = (["noise"] if cmp.noise else []) + (
                        [
                            f"paired {cmp.paired:.3f}"
                            + (" [{:.3f}, {:.3f}]".format(*cmp.paired_ci95) if cmp.paired_ci95 is not None else "")
                        ]
                        if cmp.paired is not None
                        else []
                    )
                    cells.append(f"{n} {cmp.ratio:.3f}" + (f" ({'; '.join(notes)})" if notes else ""))
            row.append("<br>".join(cells) or "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _microbench_table(rows: Sequence[CopyRate]) -> list[str]:
    """Markdown: the boundary microbenchmark, per size the throughput and latency of every copy path."""
    lines = ["", "## Boundary copy throughput (GB/s; one copy + sync latency in µs)", ""]
    paths = sorted({r.path for r in rows})
    sizes = sorted({r.bytes for r in rows})
    lines += ["| bytes | " + " | ".join(paths) + " |", "|" + "---|" * (len(paths) + 1)]
    by = {(r.path, r.bytes): r for r in rows}
    for sz in sizes:
        cells = [f"{by[(p, sz)].GBps:.1f} ({by[(p, sz)].us_synced:.1f} µs)" if (p, sz) in by else "—" for p in paths]
        lines.append(f"| {sz} | " + " | ".join(cells) + " |")
    return lines


def _models_line(report: Report) -> list[str]:
    models = report.models or {report.model.shape: report.model.path}
    if not report.keyed_by_shape:
        return [f"- model: {report.model.shape} ({report.model.path})"]
    return ["- models (tests named SHAPE:TEST): " + "; ".join(f"{k} ({v})" for k, v in models.items())]


def _repetitions(report: Report) -> str:
    """How the llama-bench processes ran: run lengths with every repetition kept, or kept after discarded."""
    if report.run_lengths:
        n = ", ".join(f"-r {x}" for x in report.run_lengths)
        return (
            f"one llama-bench process per case, run length and round ({n}; test@rN = run length N), every "
            "repetition kept (llama-bench's own warm-up run only, as in a user's run)"
        )
    return f"{report.reps} llama-bench repetitions kept per round after {report.warmup_reps} discarded"


def _wallclock_lines(settings: Mapping[str, object], measures: Sequence[str]) -> list[str]:
    """How each measure besides llama-bench ran, as its module says (:meth:`.measure.Measure.describe`)."""
    described = (m.describe(settings) for m in MEASURES.values() if m.name in measures and m.name in settings)
    return [line for line in described if line]


def batched_table(report: Report) -> list[str]:
    """Markdown: every case with batching against its baseline (the same case with batching off), per test: the
    paired ratio [95 % interval] (rounds), and the lowest of them."""
    names = [c.name for c in report.cases]
    ratios = report.figures.ratios
    pairs = [(n, b) for n, b in batched_pairs(names) if n in ratios.get(b, {})]
    if not pairs:
        return []
    lines = [
        "",
        "## Batching against its baseline (paired ratio [95 % interval] (rounds); above 1 = batching faster)",
        "",
        "Beside each: the baseline against itself, the 95 % range of a median over as many rounds of the ratio "
        "between two of its own processes, i.e. where an unchanged path falls by the spread of the processes; for "
        "a test inside one process (@inproc), of the ratio between its two contexts in the baseline's control "
        "process (both off), where an unchanged path falls inside one process.",
        "",
        "| test | " + " | ".join(f"{n} / {b} | {b} / {b}" for n, b in pairs) + " |",
        "|" + "---|" * (2 * len(pairs) + 1),
    ]
    lowest: tuple[float, str] | None = None
    for t in report.figures.tests:
        cells = []
        for n, b in pairs:
            cmp = ratios[b][n].get(t)
            if not cmp or cmp.paired is None:
                cells += ["—", "—"]
                continue
            ci = " [{:.3f}, {:.3f}]".format(*cmp.paired_ci95) if cmp.paired_ci95 is not None else ""
            cells.append(f"{cmp.paired:.3f}{ci} ({cmp.paired_rounds})")
            cells.append("[{:.3f}, {:.3f}]".format(*cmp.self_ci95) if cmp.self_ci95 is not None else "—")
            if lowest is None or cmp.paired < lowest[0]:
                lowest = (cmp.paired, f"{n} / {b}, {t}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    if lowest is not None:
        lines += ["", f"Lowest paired ratio: {lowest[0]:.3f} ({lowest[1]})."]
    return lines


def plot(report: Report, out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("    matplotlib is not installed: no plots")
        return []
    files: list[str] = []
    if report.figures.tests:
        files.append(_plot_throughput(plt, report, out_dir))
    if report.microbench:
        files.append(_plot_microbench(plt, report.microbench, out_dir))
    return files


#: at most this many tests side by side in the throughput plot; more go on further rows
PLOT_COLUMNS = 6


def _plot_throughput(plt: Any, report: Report, out_dir: Path) -> str:
    names = [c.name for c in report.cases]
    tests = report.figures.tests
    cols = min(len(tests), PLOT_COLUMNS)
    rows = -(-len(tests) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(tests) :]:
        ax.set_visible(False)
    for ax, t in zip(axes.flat, tests, strict=False):
        figures = [report.figures.summary.get(n, {}).get(t) for n in names]
        meds = [s.median if s else 0.0 for s in figures]
        errs = [(s.q3 - s.q1) / 2 if s else 0.0 for s in figures]
        grey = [n in CASES and not modes.VARIANTS[CASES[n].variant].patched for n in names]  # upstream builds
        ax.bar(range(len(names)), meds, yerr=errs, color=["#6b7280" if g else "#0f766e" for g in grey])
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set_title(t, fontsize=9)
        ax.set_ylabel("tokens/s")
    fig.suptitle(f"{report.suite}: {report.model.shape} ({report.date[:10]})")
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=110)
    plt.close(fig)
    return "throughput.png"


def _plot_microbench(plt: Any, mb: Sequence[CopyRate], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in sorted({r.path for r in mb}):
        pts = sorted((r.bytes, r.GBps) for r in mb if r.path == p)
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker="o",
            label=p,
            linestyle="--" if p in ("d2h", "h2d") else "-",
        )
    # the physical limit of a host round trip: the slower of the two one-way pinned directions
    peaks = [max(r.GBps for r in mb if r.path == p) for p in ("d2h", "h2d") if any(r.path == p for r in mb)]
    if peaks:
        ax.axhline(min(peaks), color="k", linewidth=0.8, label="physical limit (one-way pinned)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # NVLink peer copies sit an order of magnitude above any host path
    ax.set_xlabel("boundary bytes")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=8)
    ax.set_title("copy throughput per boundary size")
    fig.tight_layout()
    fig.savefig(out_dir / "microbench.png", dpi=110)
    plt.close(fig)
    return "microbench.png"


def smi_table(report: Report) -> list[str]:
    """Markdown: per case and GPU, the median over its processes of what :meth:`Telemetry.during` recorded."""
    keys = ("sm_mhz", "mem_mhz", "util_pct", "power_w_peak", "temp_c_peak")
    lines = [
        "",
        "## GPU state while the cases ran (--smi; median over each case's processes)",
        "",
        "| case | GPU | processes | SM MHz | memory MHz | utilisation % | peak W | peak °C | throttle reasons |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report.cases:
        per_gpu: dict[str, list[GpuState]] = {}
        for r in report.runs:
            if r.case == c.name:
                for g, rec in r.gpus.items():
                    per_gpu.setdefault(g, []).append(rec)
        for g, recs in sorted(per_gpu.items()):
            cells = []
            for k in keys:
                xs = [v for x in recs if (v := getattr(x, k)) is not None]
                cells.append(f"{statistics.median(xs):.0f}" if xs else "—")
            reasons: dict[str, int] = {}
            for x in recs:
                for k, v in (x.reasons or {}).items():
                    reasons[k] = reasons.get(k, 0) + v
            total = sum(reasons.values()) or 1
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            rs = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in top)
            lines.append(f"| {c.name} | {g} | {len(recs)} | " + " | ".join(cells) + f" | {rs or '—'} |")
    return lines


def pool_reports(paths: Sequence[Path], out_dir: Path) -> int:
    """``bench --pool REPORT...``: the rounds of several reports of the same suite and settings (e.g. two GPU
    calls, or calls that each ran a part of the suite's matrix: some shapes, run lengths, measurements or cases)
    pooled into one report, their rounds numbered one after the other; nothing is run."""
    reports = [read(p) for p in paths]
    _check_distinct(reports)
    _check_alike(reports)
    out_dir = files.output_dir(out_dir, "--report")  # the inputs are good: the folder of the pooled report
    samples: list[Sample] = []
    runs: list[CaseRun] = []
    offset = 0
    cases: dict[str, CaseEntry] = {}
    for _, rep in reports:
        samples += [replace(x, round=x.round + offset) for x in rep.samples]
        runs += [replace(x, round=x.round + offset) for x in rep.runs]
        offset += 1 + max([x.round for x in rep.runs], default=-1)
        for c in rep.cases:
            cases.setdefault(c.name, c)
    pooled = pool(list(cases), samples, runs)
    report = replace(
        _matrix(reports[0][1], [rep for _, rep in reports]),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        host=platform.node(),
        pooled_from=tuple(str(f) for f, _ in reports),
        rounds_planned=offset,
        stopped="",
        cases=tuple(cases.values()),
        figures=pooled,
        samples=tuple(samples),
        runs=tuple(runs),
        microbench=(),
        manifests_by_report={str(f): rep.manifests for f, rep in reports},
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write(report, out_dir)
    log(f"==> pooled {len(reports)} reports, {pooled.rounds} rounds: {out_dir / 'bench.md'}")
    print(out_dir)
    return 0


def _check_distinct(reports: Sequence[tuple[Path, Report]]) -> None:
    """UsageError when one report is given twice (the same file, a copy of it, or a pooled report and one of its
    sources): its samples would count twice, and the intervals narrow on duplicated data."""
    seen: dict[object, Path] = {}
    for f, rep in reports:
        samples = [asdict(s) for s in rep.samples]
        digest = hashlib.sha256(json.dumps(samples, sort_keys=True).encode()).hexdigest()
        run = ("run", rep.host, rep.date, digest)  # a copy: same machine, time and samples
        keys: list[object] = [("file", f.resolve()), run]
        keys += [("file", Path(src).resolve()) for src in rep.pooled_from or () if isinstance(src, str)]
        for key in keys:
            if key in seen:
                raise UsageError(
                    f"--pool: {f} and {seen[key]} are the same report",
                    why="its rounds would count twice and narrow the intervals on duplicated samples",
                    fix="pass each report once (a pooled report already holds its sources)",
                )
        for key in keys:
            seen.setdefault(key, f)


def _check_alike(reports: Sequence[tuple[Path, Report]]) -> None:
    """BenchError unless every report measured like the first: suite, settings, repetitions, model (or shapes named
    in the tests), and the same environment for every case of the same name."""
    first = reports[0][1]
    envs = {c.name: c.env for c in first.cases}
    for f, rep in reports[1:]:
        same = {k: getattr(rep, k) == getattr(first, k) for k in ("suite", "settings", "reps", "warmup_reps")}
        same["keyed_by_shape"] = rep.keyed_by_shape == first.keyed_by_shape
        if not first.keyed_by_shape:  # (else every test names its shape)
            same["model"] = rep.model.shape == first.model.shape
        same["cases"] = all(envs.get(c.name, c.env) == c.env for c in rep.cases)
        if not all(same.values()):
            raise BenchError(
                f"{f} was not measured like {reports[0][0]}",
                why="they differ in " + ", ".join(k for k, v in same.items() if not v),
                fix="pool only reports of one suite, model, settings and case definitions",
            )


def _matrix(first: Report, reports: Sequence[Report]) -> Report:
    """``first`` with the parts of the matrix the reports ran together: shapes, models, run lengths, measurements."""
    shapes: list[str] = []
    models: dict[str, str] = {}
    measures: list[str] = []
    run_lengths: set[int] = set()
    for rep in reports:
        shapes += [x for x in rep.shapes if x not in shapes]
        models |= rep.models
        measures += [x for x in rep.measures if x not in measures]
        run_lengths |= set(rep.run_lengths or ())
    model = Model(", ".join(models), next(iter(models.values()))) if models else first.model
    return replace(
        first,
        shapes=tuple(shapes),
        models=models,
        measures=tuple(measures),
        run_lengths=tuple(sorted(run_lengths)) or None,
        model=model,
    )
