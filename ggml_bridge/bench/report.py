"""The bench report: Markdown (with the --smi table and the microbenchmark), the plots, and ``--pool``'s
pooling of several reports into one."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import platform
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from .. import modes, netbench
from ..errors import BenchError
from ..runner import log
from .stats import CaseRun, Sample, pool, references

CASES = modes.MODES


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# ggml-bridge bench: {report['suite']}", "", f"{report['date']} · {report['about']}", ""]
    env = report["environment"]
    for g in env.get("gpus", []):
        lines.append(
            f"- GPU {g['index']}: {g['name']}, driver {g['driver_version']}, PCIe gen "
            f"{g['pcie.link.gen.max']} x{g['pcie.link.width.max']} (max)"
        )
    lines.append(f"- model: {report['model']['shape']} ({report['model']['path']})")
    lines.append(f"- settings: {report['settings']}" + (f"; CPUs {report['cpus']}" if report.get("cpus") else ""))
    if report.get("links"):
        lines.append(f"- shaped links: {netbench.describe(report['links'])}")
    if report.get("pooled_from"):
        lines.append(f"- pooled from {len(report['pooled_from'])} reports: " + ", ".join(report["pooled_from"]))
    if report.get("stopped"):
        lines.append(f"- stopped early, {report['stopped']}")
    lines.append(
        f"- rounds: {report['rounds']} interleaved, {report['reps']} llama-bench repetitions kept per round "
        f"after {report.get('warmup_reps', 0)} discarded; "
        "figure = median of all samples, ± = interquartile range; 'noise' = difference inside the spreads; "
        "'paired' = median over rounds of the ratio within a round [95 % bootstrap interval over rounds]"
    )
    lines.append("")
    for c in report["cases"]:
        lines.append(
            f"- **{c['name']}**: {c['description']}; binaries {c['bin_dir']}"
            + (f"; engagement: {c['engagement']}" if c['engagement'] else "")
        )
    lines.append("")
    tests = report["tests"]
    names = [c["name"] for c in report["cases"]]
    refs = references(names, ("upstream-p2p", "upstream-nopeer", "off"))
    head = "| test | " + " | ".join(names) + " | " + " | ".join(f"vs {r}" for r in refs) + " |"
    lines += [head, "|" + "---|" * (1 + len(names) + len(refs))]
    for t in tests:
        row = [t]
        for n in names:
            s = report["summary"].get(n, {}).get(t)
            row.append(f"{s['median']:.1f} ± {s['q3'] - s['q1']:.1f}" if s else "—")
        for r in refs:
            cells = []
            for n in names:
                cmp = report["ratios"].get(r, {}).get(n, {}).get(t)
                if cmp and n != r:
                    notes = (["noise"] if cmp["noise"] else []) + (
                        [
                            f"paired {cmp['paired']:.3f}"
                            + (" [{:.3f}, {:.3f}]".format(*cmp["paired_ci95"]) if "paired_ci95" in cmp else "")
                        ]
                        if "paired" in cmp
                        else []
                    )
                    cells.append(f"{n} {cmp['ratio']:.3f}" + (f" ({'; '.join(notes)})" if notes else ""))
            row.append("<br>".join(cells) or "—")
        lines.append("| " + " | ".join(row) + " |")
    if report.get("not_engaged"):
        lines += ["", "**Not engaged (figures not used):** " + ", ".join(report["not_engaged"])]
    if report.get("skipped"):
        lines += ["", "**Not measured:** " + "; ".join(report["skipped"])]
    if report.get("smi"):
        lines += smi_table(report)
    if report.get("microbench"):
        lines += ["", "## Boundary copy throughput (GB/s; one copy + sync latency in µs)", ""]
        paths = sorted({r["path"] for r in report["microbench"]})
        sizes = sorted({r["bytes"] for r in report["microbench"]})
        lines += ["| bytes | " + " | ".join(paths) + " |", "|" + "---|" * (len(paths) + 1)]
        by = {(r["path"], r["bytes"]): r for r in report["microbench"]}
        for sz in sizes:
            cells = [
                f"{by[(p, sz)]['GBps']:.1f} ({by[(p, sz)]['us_synced']:.1f} µs)" if (p, sz) in by else "—"
                for p in paths
            ]
            lines.append(f"| {sz} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("    matplotlib is not installed: no plots")
        return []
    files: list[str] = []
    names = [c["name"] for c in report["cases"]]
    tests = report["tests"]
    if tests:
        files.append(_plot_throughput(plt, report, names, tests, out_dir))
    mb = report.get("microbench") or []
    if mb:
        files.append(_plot_microbench(plt, mb, out_dir))
    return files


def _plot_throughput(plt: Any, report: dict[str, Any], names: list[str], tests: list[str], out_dir: Path) -> str:
    fig, axes = plt.subplots(1, len(tests), figsize=(4.2 * len(tests), 4), squeeze=False)
    for ax, t in zip(axes[0], tests, strict=False):
        meds = [report["summary"].get(n, {}).get(t, {}).get("median", 0.0) for n in names]
        errs = [
            (
                report["summary"].get(n, {}).get(t, {}).get("q3", 0.0)
                - report["summary"].get(n, {}).get(t, {}).get("q1", 0.0)
            )
            / 2
            for n in names
        ]
        grey = [n in CASES and not modes.VARIANTS[CASES[n].variant].patched for n in names]  # upstream builds
        ax.bar(range(len(names)), meds, yerr=errs, color=["#6b7280" if g else "#0f766e" for g in grey])
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set_title(t)
        ax.set_ylabel("tokens/s")
    fig.suptitle(f"{report['suite']}: {report['model']['shape']} ({report['date'][:10]})")
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=110)
    plt.close(fig)
    return "throughput.png"


def _plot_microbench(plt: Any, mb: list[dict[str, Any]], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in sorted({r["path"] for r in mb}):
        pts = sorted((r["bytes"], r["GBps"]) for r in mb if r["path"] == p)
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker="o",
            label=p,
            linestyle="--" if p in ("d2h", "h2d") else "-",
        )
    # the physical limit of a host round trip: the slower of the two one-way pinned directions
    peaks = [max(r["GBps"] for r in mb if r["path"] == p) for p in ("d2h", "h2d") if any(r["path"] == p for r in mb)]
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


def smi_table(report: dict[str, Any]) -> list[str]:
    """Markdown: per case and GPU, the median over its processes of what :meth:`Telemetry.during` recorded."""
    keys = ("sm_mhz", "mem_mhz", "util_pct", "power_w_peak", "temp_c_peak")
    lines = [
        "",
        "## GPU state while the cases ran (--smi; median over each case's processes)",
        "",
        "| case | GPU | processes | SM MHz | memory MHz | utilisation % | peak W | peak °C | throttle reasons |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        per_gpu: dict[str, list[dict[str, Any]]] = {}
        for r in report["runs"]:
            if r["case"] == c["name"]:
                for g, rec in r.get("gpus", {}).items():
                    per_gpu.setdefault(g, []).append(rec)
        for g, recs in sorted(per_gpu.items()):
            cells = []
            for k in keys:
                xs = [x[k] for x in recs if k in x]
                cells.append(f"{statistics.median(xs):.0f}" if xs else "—")
            reasons: dict[str, int] = {}
            for x in recs:
                for k, v in x.get("reasons", {}).items():
                    reasons[k] = reasons.get(k, 0) + v
            total = sum(reasons.values()) or 1
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            rs = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in top)
            lines.append(f"| {c['name']} | {g} | {len(recs)} | " + " | ".join(cells) + f" | {rs or '—'} |")
    return lines


def pool_reports(paths: Sequence[Path], out_dir: Path) -> int:
    """``bench --pool REPORT...``: the rounds of several reports of the same suite and settings (e.g. two GPU
    calls) pooled into one report, their rounds numbered one after the other; nothing is run."""
    reports = []
    for p in paths:
        f = Path(p) / "bench.json" if Path(p).is_dir() else Path(p)
        try:
            reports.append((f, json.loads(f.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(
                f"cannot read the bench report {f}",
                why=str(e),
                fix="pass bench.json files (or their folders) written by ggml-bridge bench",
            ) from None
    first = reports[0][1]
    envs = {c["name"]: c.get("env") for c in first["cases"]}
    for f, rep in reports[1:]:
        same = {k: rep.get(k) == first.get(k) for k in ("suite", "settings", "reps", "warmup_reps")}
        same["model"] = rep.get("model", {}).get("shape") == first.get("model", {}).get("shape")
        same["cases"] = all(envs.get(c["name"], c.get("env")) == c.get("env") for c in rep["cases"])
        if not all(same.values()):
            raise BenchError(
                f"{f} was not measured like {reports[0][0]}",
                why="they differ in " + ", ".join(k for k, v in same.items() if not v),
                fix="pool only reports of one suite, model, settings and case definitions",
            )
    samples: list[Sample] = []
    runs: list[CaseRun] = []
    fields = {f.name for f in dataclasses.fields(CaseRun)}
    offset = 0
    cases: dict[str, dict[str, Any]] = {}
    for _, rep in reports:
        samples += [Sample(**{**x, "round": x["round"] + offset}) for x in rep["samples"]]
        runs += [
            CaseRun(**{k: v for k, v in {**x, "round": x["round"] + offset}.items() if k in fields})
            for x in rep["runs"]
        ]
        offset += 1 + max([x["round"] for x in rep["runs"]], default=-1)
        for c in rep["cases"]:
            cases.setdefault(c["name"], c)
    pooled = pool(list(cases), samples, runs)
    report = {
        **first,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "host": platform.node(),
        "pooled_from": [str(f) for f, _ in reports],
        "rounds_planned": offset,
        "stopped": "",
        "cases": list(cases.values()),
        **pooled,
        "samples": [asdict(s) for s in samples],
        "runs": [asdict(r) for r in runs],
        "microbench": [],
        "manifests_by_report": {str(f): rep.get("manifests", {}) for f, rep in reports},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1))
    (out_dir / "bench.md").write_text(render_markdown(report))
    log(f"==> pooled {len(reports)} reports, {pooled['rounds']} rounds: {out_dir / 'bench.md'}")
    print(out_dir)
    return 0
