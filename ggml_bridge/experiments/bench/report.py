"""The bench report: Markdown (with the --smi table and the microbenchmark), the plots, and ``--pool``'s
pooling of several reports into one."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import platform
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from ...foundations import files
from ...foundations.errors import BenchError, UsageError
from ...foundations.runner import log
from ...foundations.tomlfile import Key
from ...runtime import modes, netbench
from .measures import MEASURES
from .stats import CaseRun, Sample, batched_pairs, pool, references

CASES = modes.MODES


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# ggml-bridge bench: {report['suite']}", "", f"{report['date']} · {report['about']}", ""]
    env = report["environment"]
    for g in env.get("gpus", []):
        lines.append(
            f"- GPU {g['index']}: {g['name']}, driver {g['driver_version']}, PCIe gen "
            f"{g['pcie.link.gen.max']} x{g['pcie.link.width.max']} (max)"
        )
    lines += _models_line(report)
    lines.append(f"- settings: {report['settings']}" + (f"; CPUs {report['cpus']}" if report.get("cpus") else ""))
    lines += _wallclock_lines(report["settings"], report.get("measures") or ["bench"])
    if report.get("links"):
        lines.append(f"- shaped links: {netbench.describe(report['links'])}")
    if report.get("pooled_from"):
        lines.append(f"- pooled from {len(report['pooled_from'])} reports: " + ", ".join(report["pooled_from"]))
    if report.get("stopped"):
        lines.append(f"- stopped early, {report['stopped']}")
    lines.append(
        f"- rounds: {report['rounds']} interleaved, {_repetitions(report)}; "
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
    lines += batched_table(report)
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


def _models_line(report: dict[str, Any]) -> list[str]:
    models = report.get("models") or {report["model"]["shape"]: report["model"]["path"]}
    if not report.get("keyed_by_shape"):
        return [f"- model: {report['model']['shape']} ({report['model']['path']})"]
    return ["- models (tests named SHAPE:TEST): " + "; ".join(f"{k} ({v})" for k, v in models.items())]


def _repetitions(report: dict[str, Any]) -> str:
    """How the llama-bench processes ran: run lengths with every repetition kept, or kept after discarded."""
    if report.get("run_lengths"):
        n = ", ".join(f"-r {x}" for x in report["run_lengths"])
        return (
            f"one llama-bench process per case, run length and round ({n}; test@rN = run length N), every "
            "repetition kept (llama-bench's own warm-up run only, as in a user's run)"
        )
    return f"{report['reps']} llama-bench repetitions kept per round after {report.get('warmup_reps', 0)} discarded"


def _wallclock_lines(settings: dict[str, Any], measures: Sequence[str]) -> list[str]:
    """How each measure besides llama-bench ran, as its module says (:meth:`.measure.Measure.describe`)."""
    described = (m.describe(settings) for m in MEASURES.values() if m.name in measures and m.name in settings)
    return [line for line in described if line]


def batched_table(report: dict[str, Any]) -> list[str]:
    """Markdown: every case with batching against its baseline (the same case with batching off), per test: the
    paired ratio [95 % interval] (rounds), and the lowest of them."""
    names = [c["name"] for c in report["cases"]]
    pairs = [(n, b) for n, b in batched_pairs(names) if n in report["ratios"].get(b, {})]
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
    for t in report["tests"]:
        cells = []
        for n, b in pairs:
            cmp = report["ratios"][b][n].get(t)
            if not cmp or "paired" not in cmp:
                cells += ["—", "—"]
                continue
            ci = " [{:.3f}, {:.3f}]".format(*cmp["paired_ci95"]) if "paired_ci95" in cmp else ""
            cells.append(f"{cmp['paired']:.3f}{ci} ({cmp['paired_rounds']})")
            cells.append("[{:.3f}, {:.3f}]".format(*cmp["self_ci95"]) if "self_ci95" in cmp else "—")
            if lowest is None or cmp["paired"] < lowest[0]:
                lowest = (cmp["paired"], f"{n} / {b}, {t}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    if lowest is not None:
        lines += ["", f"Lowest paired ratio: {lowest[0]:.3f} ({lowest[1]})."]
    return lines


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


#: at most this many tests side by side in the throughput plot; more go on further rows
PLOT_COLUMNS = 6


def _plot_throughput(plt: Any, report: dict[str, Any], names: list[str], tests: list[str], out_dir: Path) -> str:
    cols = min(len(tests), PLOT_COLUMNS)
    rows = -(-len(tests) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(tests) :]:
        ax.set_visible(False)
    for ax, t in zip(axes.flat, tests, strict=False):
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
        ax.set_title(t, fontsize=9)
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
    calls, or calls that each ran a part of the suite's matrix: some shapes, run lengths, measurements or cases)
    pooled into one report, their rounds numbered one after the other; nothing is run."""
    reports = [_read(p) for p in paths]
    _check_distinct(reports)
    _check_alike(reports)
    out_dir = files.output_dir(out_dir, "--report")  # the inputs are good: the folder of the pooled report
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
    first = reports[0][1]
    report = {
        **first,
        **_matrix(rep for _, rep in reports),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "host": platform.node(),
        "pooled_from": [str(f) for f, _ in reports],
        "rounds_planned": offset,
        "stopped": "",
        "cases": list(cases.values()),
        **pooled.to_json(),
        "samples": [asdict(s) for s in samples],
        "runs": [asdict(r) for r in runs],
        "microbench": [],
        "manifests_by_report": {str(f): rep.get("manifests", {}) for f, rep in reports},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1))
    (out_dir / "bench.md").write_text(render_markdown(report))
    log(f"==> pooled {len(reports)} reports, {pooled.rounds} rounds: {out_dir / 'bench.md'}")
    print(out_dir)
    return 0


#: What ``--pool`` reads of a bench.json (a ladder's report.json, or any other JSON, is not one).
POOLED_KEYS = {
    "suite": Key("str"),
    "cases": Key("tables", table=None),
    "samples": Key("tables", table=None),
    "runs": Key("tables", table=None),
    "settings": Key("table"),
}


def _read(p: Path) -> tuple[Path, dict[str, Any]]:
    f = Path(p) / "bench.json" if Path(p).is_dir() else Path(p)
    fix = "pass bench.json files (or their folders) written by ggml-bridge bench"
    data = files.read_json(f, "bench report", shape=POOLED_KEYS, required=tuple(POOLED_KEYS), error=BenchError, fix=fix)
    for key in ("samples", "runs"):
        if any(not isinstance(x.get("round"), int) for x in data[key]):
            raise BenchError(f"{f} is not a bench report", why=f"an entry of {key} has no round number", fix=fix)
    if any(not isinstance(c.get("name"), str) for c in data["cases"]):
        raise BenchError(f"{f} is not a bench report", why="a case has no name", fix=fix)
    return f, data


def _check_distinct(reports: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """UsageError when one report is given twice (the same file, a copy of it, or a pooled report and one of its
    sources): its samples would count twice, and the intervals narrow on duplicated data."""
    seen: dict[object, Path] = {}
    for f, rep in reports:
        samples = hashlib.sha256(json.dumps(rep["samples"], sort_keys=True).encode()).hexdigest()
        run = ("run", str(rep.get("host")), str(rep.get("date")), samples)  # a copy: same machine, time and samples
        keys: list[object] = [("file", f.resolve()), run]
        keys += [("file", Path(src).resolve()) for src in rep.get("pooled_from") or [] if isinstance(src, str)]
        for key in keys:
            if key in seen:
                raise UsageError(
                    f"--pool: {f} and {seen[key]} are the same report",
                    why="its rounds would count twice and narrow the intervals on duplicated samples",
                    fix="pass each report once (a pooled report already holds its sources)",
                )
        for key in keys:
            seen.setdefault(key, f)


def _check_alike(reports: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """BenchError unless every report measured like the first: suite, settings, repetitions, model (or shapes named
    in the tests), and the same environment for every case of the same name."""
    first = reports[0][1]
    envs = {c["name"]: c.get("env") for c in first["cases"]}
    for f, rep in reports[1:]:
        same = {k: rep.get(k) == first.get(k) for k in ("suite", "settings", "reps", "warmup_reps", "keyed_by_shape")}
        if not first.get("keyed_by_shape"):  # (else every test names its shape)
            same["model"] = rep.get("model", {}).get("shape") == first.get("model", {}).get("shape")
        same["cases"] = all(envs.get(c["name"], c.get("env")) == c.get("env") for c in rep["cases"])
        if not all(same.values()):
            raise BenchError(
                f"{f} was not measured like {reports[0][0]}",
                why="they differ in " + ", ".join(k for k, v in same.items() if not v),
                fix="pool only reports of one suite, model, settings and case definitions",
            )


def _matrix(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The parts of the matrix the reports ran together: shapes, models, run lengths, measurements."""
    out: dict[str, Any] = {"shapes": [], "models": {}, "measures": [], "run_lengths": []}
    for rep in reports:
        out["shapes"] += [x for x in rep.get("shapes", []) if x not in out["shapes"]]
        out["models"] |= rep.get("models", {})
        out["measures"] += [x for x in rep.get("measures", ["bench"]) if x not in out["measures"]]
        out["run_lengths"] = sorted({*out["run_lengths"], *(rep.get("run_lengths") or [])})
    out["run_lengths"] = out["run_lengths"] or None
    if out["models"]:
        out["model"] = {"shape": ", ".join(out["models"]), "path": next(iter(out["models"].values()))}
    return out
