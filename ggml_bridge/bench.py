"""``ggml-bridge bench``: upstream P2P, upstream staged and no-peer paths, and our mechanisms, side by side.

One run, one model, one set of llama-bench settings: every case is a (build variant, selectors) pair, and the
cases are interleaved round by round (the order rotates each round) so that clock ramps and thermal drift fall
on all of them alike. Every sample llama-bench reports is kept; a case's figure is the median of its samples
and its spread the interquartile range. A difference smaller than the two spreads together is called noise.

A mechanism case counts only if the mechanism says it engaged: the bridge's stats line must show boundaries,
batching's must show async uploads and downloads. Otherwise the case is reported as *not engaged* and its
figure is not used for ratios.

On a CPU-only machine the GPU cases cannot be measured; the report says so and runs the CPU cases.
A boundary microbenchmark (``test-mapped-host-bridge --bench``) measures copy throughput per boundary size
for the bridge, upstream's peer copy and synchronous fallback, and the one-way pinned limits.

Pooling: every round runs every case; per case and test the report pools all kept samples into a median and
interquartile range, and per pair of cases the *paired* ratio (median over rounds of the ratio within a round)
with a 95 % bootstrap interval that resamples whole rounds. ``--smi [MS]`` samples nvidia-smi while the cases run
and records, per llama-bench process, the GPUs' clocks, utilisation, peak power and temperature and throttle
reasons (``logs/smi.csv`` and a table in the report). ``--pool REPORT...`` runs nothing and pools the rounds of
several reports of one suite and settings into one. The report carries the build manifest of every variant.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import time
import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import argtypes, logparse, modes, rpc, runner
from .cache import file_sha256
from .errors import BenchError, RpcError, UsageError
from .runner import log, step

#: A case is a mode of :mod:`modes` (build variant, selectors, which mechanism must engage): one table for the
#: ladder and the bench. ``rpc`` modes: the model on one local ggml-rpc-server of the case's build owning every
#: GPU (or the CPU), llama-bench with --rpc and no GPU of its own: boundaries between its GPUs are that
#: server's COPY_TENSOR.
Case = modes.Mode
CASES = modes.MODES

#: Suites: which cases, on which devices, with which model and llama-bench settings.
SUITES: dict[str, dict[str, Any]] = {
    "multi-gpu": {
        "cases": ["upstream-p2p", "upstream", "upstream-nopeer", "off", "bridge", "bridge-force-p2p"],
        "shape": "bench-3b", "devices": "all", "pp": 4096, "batch": 4096, "ubatch": [512, 4096], "tg": 128,
        "about": "layer split across every visible GPU: one host round trip per boundary without peer access",
    },
    "batched": {
        "cases": ["off", "batched"],
        "shape": "bench-1b", "devices": "1", "pp": 512, "batch": 512, "ubatch": [512], "tg": 128,
        "about": "one GPU: per-token graph inputs and logits, batched through the pinned pool or not",
    },
    "batched-multi": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b", "devices": "all", "pp": 512, "batch": 512, "ubatch": [512], "tg": 128,
        "about": "layer split: batching composed with the bridge",
    },
    "batched-pipeline": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b", "devices": "all", "pp": 2048, "batch": 2048, "ubatch": [512], "tg": 0,
        "about": "layer split with pipeline parallelism (4 ubatches per prompt): staged inputs must not stall it",
    },
    # issue 14 item 2: prompt processing with several ubatches in flight on many-device pipelines; batching
    # must make nothing >= 1 % slower (it declines prompt-sized graphs) and keep its token-generation gain
    "batched-pp-6dev": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l", "devices": "all", "virtual_devices": 6, "pp": "512,4096", "batch": 4096,
        "ubatch": [512], "tg": 128,
        "about": "6 virtual devices on the visible GPUs (one layer each), -sm layer -ub 512 -b 4096: pipeline parallelism",
    },
    "batched-pp-2gpu": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l", "devices": "all", "pp": "512,4096", "batch": 4096, "ubatch": [512], "tg": 128,
        "about": "2 GPUs, -sm layer -ub 512 -b 4096: pipeline parallelism over two cards",
    },
    "rpc": {
        "cases": ["rpc-upstream", "rpc-upstream-nopeer", "rpc-off", "rpc-bridge"],
        "shape": "bench-1b", "devices": "all", "pp": 2048, "batch": 2048, "ubatch": [512, 2048], "tg": 32,
        "about": "one rpc-server on localhost owning every GPU, llama-bench --rpc: the copies between its GPUs "
                 "are server-side (RPC_CMD_COPY_TENSOR); the activations to and from llama-bench cross TCP",
    },
    "rpc-cpu": {
        "cases": ["off", "rpc-off"],
        "shape": "small", "devices": "cpu", "pp": 256, "batch": 256, "ubatch": [256], "tg": 16, "threads": 1,
        "about": "CPU: the same build local and behind one localhost rpc-server (the cost of the TCP hops); one "
                 "thread in both, so the comparison is not about thread counts (the defaults differ)",
    },
    "cpu": {
        "cases": ["upstream", "off"],
        "shape": "small", "devices": "cpu", "pp": 256, "batch": 256, "ubatch": [256], "tg": 32,
        "about": "CPU only: the patched build with its selectors off against upstream (the patches must cost nothing)",
    },
}


@dataclass
class Sample:
    case: str
    test: str            # e.g. "pp4096/ub512", "tg128"
    round: int
    values: list[float]  # tokens per second, one per llama-bench repetition


@dataclass
class CaseRun:
    case: str
    round: int
    rc: int
    seconds: float
    engaged: bool | None      # None: nothing to prove
    engagement: str           # what the log said
    log_tail: list[str] = field(default_factory=list)
    started: float = 0.0      # wall clock (epoch seconds) when the process started: lines runs up with GPU telemetry
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)  # --smi: GPU state while it ran, by GPU index


@dataclass
class Summary:
    case: str
    test: str
    n: int
    median: float
    q1: float
    q3: float
    lo: float
    hi: float

    @property
    def spread(self) -> float:
        return self.q3 - self.q1


def summarize(case: str, test: str, values: Sequence[float]) -> Summary:
    vals = sorted(values)
    if not vals:
        raise BenchError(f"no samples for {case} {test}")
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return Summary(case, test, len(vals), statistics.median(vals), q1, q3, vals[0], vals[-1])


def compare(a: Summary, b: Summary) -> dict[str, Any]:
    """a relative to b: ratio of medians, and whether the difference is inside the spreads (noise)."""
    ratio = a.median / b.median if b.median else float("nan")
    noise = abs(a.median - b.median) <= (a.spread + b.spread)
    return {"ratio": ratio, "noise": noise}


def _round_ratios(samples: Sequence[Sample], case: str, ref: str, test: str) -> list[float]:
    """Per round that ran both cases: median of case / median of ref within the round."""
    per: dict[int, dict[str, list[float]]] = {}
    for s in samples:
        if s.test == test and s.case in (case, ref) and s.values:
            per.setdefault(s.round, {}).setdefault(s.case, []).extend(s.values)
    return [statistics.median(v[case]) / statistics.median(v[ref])
            for v in per.values() if case in v and ref in v and statistics.median(v[ref])]


def paired_ratio(samples: Sequence[Sample], case: str, ref: str, test: str) -> tuple[float, int] | None:
    """Median over the rounds that ran both cases of (median of case / median of ref) within the round, and the
    number of such rounds. Cases of one round ran next to each other, so a drift of the machine between rounds
    (clocks, a noisy neighbour) cancels here, while the pooled medians keep it; None without a common round."""
    ratios = _round_ratios(samples, case, ref, test)
    if not ratios:
        return None
    return statistics.median(ratios), len(ratios)


def paired_interval(samples: Sequence[Sample], case: str, ref: str, test: str, resamples: int = 2000,
                    seed: int = 1234) -> tuple[float, float] | None:
    """95 % bootstrap interval of :func:`paired_ratio` that resamples whole rounds (the samples of one process
    are not independent); None with fewer than 3 common rounds."""
    ratios = _round_ratios(samples, case, ref, test)
    if len(ratios) < 3:
        return None
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return boot[int(0.025 * (resamples - 1))], boot[int(0.975 * (resamples - 1))]


def parse_cpu_list(text: str) -> set[int]:
    """'0-15,32,40-41' -> {0..15, 32, 40, 41}; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad CPU list item {part!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return cpus


def rotate(items: Sequence[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return list(items[k:]) + list(items[:k])


def test_key(r: dict[str, Any]) -> str:
    if r.get("n_prompt"):
        return f"pp{r['n_prompt']}/ub{r['n_ubatch']}"
    return f"tg{r['n_gen']}"


def _test_order(test: str) -> tuple[bool, int, int]:
    """pp before tg, then by size and ubatch as numbers: pp4096/ub512 before pp4096/ub4096."""
    head, _, ub = test.partition("/ub")
    return (head[:2] != "pp", int(head[2:]), int(ub or 0))


def engagement(case: Case, log_text: str) -> tuple[bool | None, str]:
    """Did the mechanism the case is about engage? (None when the case proves nothing.)"""
    if not case.mechanisms:
        return None, ""
    info = logparse.parse(log_text)
    parts: list[str] = []
    ok = True
    if "bridge" in case.mechanisms:
        b = info.bridge
        # the stats line is cumulative per process: the last one holds the run's totals
        last = b.stats[-1] if b.stats else {}
        crossed = last.get("boundaries", 0)
        ok &= b.enabled and crossed > 0
        parts.append(f"bridge {'enabled' if b.enabled else 'not enabled'} ({b.slots} slots), "
                     f"boundaries={crossed} bytes={last.get('bytes', 0)}"
                     + (f", inactive: {b.inactive_reason}" if b.inactive_reason else ""))
    if "batched" in case.mechanisms:
        t = info.batched
        last = t.stats[-1] if t.stats else {}
        up, down = last.get("async_uploads", 0), last.get("async_downloads", 0)
        declined = last.get("declined_graphs", 0)
        # engaged: it staged uploads (token generation) or declined prompt-sized graphs by its policy; downloads
        # into llama.cpp's pinned output buffer are upstream's own asynchronous ones (upstream_downloads)
        ok &= t.enabled and (up > 0 or declined > 0)
        parts.append(f"batched {'enabled' if t.enabled else 'not enabled'}, graphs={last.get('graphs', 0)} "
                     f"declined_graphs={declined} async_uploads={up} async_downloads={down} "
                     f"sync_uploads={last.get('sync_uploads', 0)} upstream_uploads={last.get('upstream_uploads', 0)}"
                     + (f", inactive: {t.inactive_reason}" if t.inactive_reason else ""))
    return ok, "; ".join(parts)


def rpc_engagement(case: Case, topo: rpc.Topology) -> tuple[bool | None, str]:
    """The bridge inside the case's rpc-server: its enabled line and its counters (patch 0006, SIGUSR1)."""
    if not case.mechanisms:
        return None, ""
    srv = topo.local[0]
    try:
        c = srv.counters()
    except RpcError as e:
        return False, str(e)
    info = srv.info()
    crossed = c.get("bridge_boundaries", 0)
    return (info.bridge.enabled and crossed > 0,
            f"rpc-server bridge {'enabled' if info.bridge.enabled else 'not enabled'}, boundaries={crossed} "
            f"bytes={c.get('bridge_bytes', 0)} copy_tensor={c.get('rpc_copy_tensor', 0)}"
            + ("" if c.get("bridge") else " (no bridge counters exported)")
            + (f", inactive: {info.bridge.inactive_reason}" if info.bridge.inactive_reason else ""))


def gpu_env() -> dict[str, Any]:
    """GPU, driver and link from nvidia-smi (empty when there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    q = "index,name,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    out = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True)
    if out.returncode != 0:
        return {}
    keys = q.split(",")
    gpus = [dict(zip(keys, [v.strip() for v in line.split(",")])) for line in out.stdout.strip().splitlines()]
    topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True).stdout
    return {"gpus": gpus, "topology": logparse.ANSI.sub("", topo)}


#: what --smi samples (nvidia-smi --query-gpu); the throttle reasons are left out where the driver lacks them
SMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu",
              "clocks_event_reasons.active")


class Telemetry:
    """``--smi``: nvidia-smi sampled every ``interval_ms`` while the cases run, every line stamped with our
    clock when it arrives (written to ``csv``), so each llama-bench process can be matched with the GPUs'
    clocks, power, temperatures and throttle reasons while it ran (:meth:`during`)."""

    def __init__(self, csv: Path, interval_ms: int) -> None:
        self.csv = csv
        self.interval_ms = interval_ms
        self.rows: list[tuple[float, dict[str, str]]] = []
        self.fields: list[str] = []
        self.proc: runner.Process | None = None

    def start(self) -> "Telemetry":
        smi = shutil.which("nvidia-smi")
        if not smi:
            raise BenchError("--smi needs nvidia-smi and there is none on PATH",
                             fix="run on the GPU machine, or leave out --smi")
        fields = list(SMI_FIELDS)
        probe = runner.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-c", "1"],
                           check=False, error=BenchError)
        if probe.returncode != 0:
            fields.remove("clocks_event_reasons.active")
        self.fields = fields
        self.csv.write_text("time," + ",".join(fields) + "\n")
        self.proc = runner.start([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                  "-lms", str(self.interval_ms)], on_line=self._line, keep=False,
                                 error=BenchError)
        deadline = time.monotonic() + 10  # the first process is sampled from its start
        while not self.rows and time.monotonic() < deadline and self.proc.popen.poll() is None:
            time.sleep(0.01)
        if not self.rows:
            self.stop()
            raise BenchError("--smi: nvidia-smi printed no sample", fix=f"see `{smi} --query-gpu=...` by hand, "
                             "or leave out --smi")
        return self

    def _line(self, line: str) -> None:
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(self.fields):
            return
        now = time.time()
        self.rows.append((now, dict(zip(self.fields, values))))
        with open(self.csv, "a", encoding="utf-8") as f:
            f.write(f"{now:.3f}," + ",".join(values) + "\n")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=5)
            self.proc = None

    def during(self, t0: float, t1: float) -> dict[str, dict[str, Any]]:
        """Per GPU over [t0, t1], the samples where it computed (utilisation >= 50 %; all when none did): the
        median SM and memory clocks and utilisation, the peak power and temperature, the throttle reasons."""
        out: dict[str, dict[str, Any]] = {}
        by_gpu: dict[str, list[dict[str, str]]] = {}
        for t, r in self.rows:
            if t0 <= t <= t1:
                by_gpu.setdefault(r.get("index", "?"), []).append(r)
        for gpu, rows in sorted(by_gpu.items()):
            busy = [r for r in rows if _num(r.get("utilization.gpu")) >= 50] or rows
            rec: dict[str, Any] = {"n": len(busy)}
            for key, field_name, agg in (("sm_mhz", "clocks.sm", statistics.median),
                                         ("mem_mhz", "clocks.mem", statistics.median),
                                         ("util_pct", "utilization.gpu", statistics.median),
                                         ("power_w_peak", "power.draw", max),
                                         ("temp_c_peak", "temperature.gpu", max)):
                xs = [_num(r.get(field_name)) for r in busy]
                xs = [x for x in xs if x == x]  # NaN: "[N/A]"
                if xs:
                    rec[key] = agg(xs)
            reasons = [r["clocks_event_reasons.active"] for r in busy if "clocks_event_reasons.active" in r]
            if reasons:
                rec["reasons"] = {k: reasons.count(k) for k in sorted(set(reasons))}
            out[gpu] = rec
        return out


def _num(text: str | None) -> float:
    try:
        return float(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")


def smi_table(report: dict[str, Any]) -> list[str]:
    """Markdown: per case and GPU, the median over its processes of what :meth:`Telemetry.during` recorded."""
    keys = ("sm_mhz", "mem_mhz", "util_pct", "power_w_peak", "temp_c_peak")
    lines = ["", "## GPU state while the cases ran (--smi; median over each case's processes)", "",
             "| case | GPU | processes | SM MHz | memory MHz | utilisation % | peak W | peak °C | throttle reasons |",
             "|---|---|---|---|---|---|---|---|---|"]
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


def resolve_bins(args: argparse.Namespace, settings: Any, variants: set[str]) -> dict[str, Path]:
    """Directory holding llama-bench for each variant: --variants-dir, --bin-dir-*, or the build stage."""
    from . import build  # the build stage needs git tooling only when it is used
    from .errors import NotBuiltError

    dirs: dict[str, Path] = {}
    for v in sorted(variants):
        override = getattr(args, f"bin_dir_{v.replace('-', '_')}", None)
        if override is None and args.variants_dir is not None:
            override = Path(args.variants_dir) / modes.VARIANTS[v].subdir
        try:
            dirs[v] = build.locate(settings, v, "llama-bench", override).parent
            continue
        except NotBuiltError as e:
            if override is not None:
                raise BenchError(f"llama-bench not found in {override}", fix=f"build the {v} variant there") from None
            if not args.build:
                log(f"    no {v} build ({e.what}); --build would make it")
                continue
        try:
            with step(f"build {v}"):
                dirs[v] = build.ensure(settings, v).bin_dir
        except UsageError as e:  # e.g. upstream-nopeer on a CPU-only machine: that case is skipped
            log(f"    cannot build {v}: {e}")
    return dirs


def run_case(bin_dir: Path, case: Case, model_path: Path, suite: dict[str, Any], reps: int,
             base_env: dict[str, str], out_dir: Path, rnd: int, timeout: float,
             warmup: int = 0) -> tuple[CaseRun, list[Sample]]:
    """One llama-bench process for a case: reps + warmup repetitions per test, the first ``warmup`` of each
    discarded (llama-bench's own warm-up is a short prompt, so the first full-size repetition still pays
    first-call costs: measured on H200, the first pp512 repetition of a process ran at about half speed)."""
    ub = ",".join(str(u) for u in suite["ubatch"])
    argv = [str(bin_dir / "llama-bench"), "-m", str(model_path), "-p", str(suite["pp"]), "-n", str(suite["tg"]),
            "-b", str(suite["batch"]), "-ub", ub, "-r", str(reps + warmup), "-o", "json", "-v"]
    if suite["devices"] != "cpu" or case.rpc:
        argv += ["-ngl", "99", "-sm", "layer"]
    else:
        argv += ["-ngl", "0"]
    if suite.get("threads"):
        argv += ["-t", str(suite["threads"])]
    env = {**base_env, **modes.STATS_ON, **case.env()}
    err_path = out_dir / f"{case.name}-r{rnd}.log"
    topo = None
    if case.rpc:  # the server gets the GPUs and the selectors, llama-bench neither GPU nor bridge
        topo = rpc.Topology([rpc.LocalRpcServer(bin_dir / rpc.RPC_SERVER, env=env, threads=suite.get("threads"),
                                                log_file=out_dir / f"{case.name}-r{rnd}-rpc-server.log")])
        topo.start(rpc.expected_version(bin_dir / "llama-bench"))
        argv += topo.server_args()
        env = {**env, "CUDA_VISIBLE_DEVICES": ""}

    started = time.time()
    t0 = time.monotonic()
    try:
        res = runner.run(argv, env=env, check=False, error=BenchError, timeout=timeout)
        seconds = time.monotonic() - t0
        err_path.write_text(res.stderr)
        engaged, what = engagement(case, res.stderr) if topo is None else rpc_engagement(case, topo)
    finally:
        if topo:
            topo.stop()
    tail = [logparse.clean(x) for x in res.stderr.splitlines()[-15:]]
    samples: list[Sample] = []
    if res.returncode == 0:
        try:
            for r in json.loads(res.stdout):
                vals = [float(x) for x in r["samples_ts"]]
                samples.append(Sample(case.name, test_key(r), rnd, vals[warmup:] if len(vals) > warmup else vals))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BenchError(f"cannot read llama-bench output for case {case.name}", why=str(e),
                             fix=f"see {err_path}") from None
    return CaseRun(case.name, rnd, res.returncode, seconds, engaged, what, tail, started), samples


def microbench(bin_dir: Path, base_env: dict[str, str], out_dir: Path) -> list[dict[str, Any]]:
    """Copy throughput per boundary size, from test-mapped-host-bridge --bench (2+ devices)."""
    exe = bin_dir / "test-mapped-host-bridge"
    if not exe.is_file():
        log("    no test-mapped-host-bridge in the patched build: microbenchmark skipped")
        return []
    rows: list[dict[str, Any]] = []
    for label, extra in (("", {}), ("-p2p", {modes.CUDA_P2P: "1"})):
        res = runner.run([str(exe), "--bench"], env={**base_env, **extra}, check=False, error=BenchError)
        (out_dir / f"microbench{label}.csv").write_text(res.stdout)
        if res.returncode != 0:
            log(f"    microbenchmark{label} exited {res.returncode}")
            continue
        for line in res.stdout.splitlines():
            f = line.split(",")
            if len(f) != 7 or f[0] != "bench" or f[1] == "path":
                continue
            path = f[1] + ("-p2p" if label and f[1] == "peer" else "")
            if label and f[1] != "peer":
                continue   # the P2P run only changes the peer path
            rows.append({"path": path, "bytes": int(f[2]), "iters": int(f[3]), "seconds": float(f[4]),
                         "GBps": float(f[5]), "us_synced": float(f[6])})
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# ggml-bridge bench: {report['suite']}", "",
             f"{report['date']} · {report['about']}", ""]
    env = report["environment"]
    for g in env.get("gpus", []):
        lines.append(f"- GPU {g['index']}: {g['name']}, driver {g['driver_version']}, PCIe gen "
                     f"{g['pcie.link.gen.max']} x{g['pcie.link.width.max']} (max)")
    lines.append(f"- model: {report['model']['shape']} ({report['model']['path']})")
    lines.append(f"- settings: {report['settings']}" + (f"; CPUs {report['cpus']}" if report.get("cpus") else ""))
    if report.get("pooled_from"):
        lines.append(f"- pooled from {len(report['pooled_from'])} reports: " + ", ".join(report["pooled_from"]))
    if report.get("stopped"):
        lines.append(f"- stopped early, {report['stopped']}")
    lines.append(f"- rounds: {report['rounds']} interleaved, {report['reps']} llama-bench repetitions kept per round "
                 f"after {report.get('warmup_reps', 0)} discarded; "
                 "figure = median of all samples, ± = interquartile range; 'noise' = difference inside the spreads; "
                 "'paired' = median over rounds of the ratio within a round [95 % bootstrap interval over rounds]")
    lines.append("")
    for c in report["cases"]:
        lines.append(f"- **{c['name']}**: {c['description']}; binaries {c['bin_dir']}"
                     + (f"; engagement: {c['engagement']}" if c['engagement'] else ""))
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
                    notes = (["noise"] if cmp["noise"] else []) + \
                        ([f"paired {cmp['paired']:.3f}" + (" [{:.3f}, {:.3f}]".format(*cmp["paired_ci95"])
                                                           if "paired_ci95" in cmp else "")]
                         if "paired" in cmp else [])
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
            cells = [f"{by[(p, sz)]['GBps']:.1f} ({by[(p, sz)]['us_synced']:.1f} µs)" if (p, sz) in by else "—"
                     for p in paths]
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
    for ax, t in zip(axes[0], tests):
        meds = [report["summary"].get(n, {}).get(t, {}).get("median", 0.0) for n in names]
        errs = [(report["summary"].get(n, {}).get(t, {}).get("q3", 0.0)
                 - report["summary"].get(n, {}).get(t, {}).get("q1", 0.0)) / 2 for n in names]
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
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p,
                linestyle="--" if p in ("d2h", "h2d") else "-")
    # the physical limit of a host round trip: the slower of the two one-way pinned directions
    peaks = [max(r["GBps"] for r in mb if r["path"] == p) for p in ("d2h", "h2d") if any(r["path"] == p for r in mb)]
    if peaks:
        ax.axhline(min(peaks), color="k", linewidth=0.8, label="physical limit (one-way pinned)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")   # NVLink peer copies sit an order of magnitude above any host path
    ax.set_xlabel("boundary bytes")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=8)
    ax.set_title("copy throughput per boundary size")
    fig.tight_layout()
    fig.savefig(out_dir / "microbench.png", dpi=110)
    plt.close(fig)
    return "microbench.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", choices=sorted(SUITES), default=None,
                        help="which comparison (default: multi-gpu with 2+ GPUs, batched with 1, cpu without)")
    parser.add_argument("--cases", default=None, help="comma-separated subset of the suite's cases")
    parser.add_argument("--variants-dir", type=Path, default=None, metavar="DIR",
                        help="DIR/{upstream,nopeer,patched}/llama-bench: one folder per build variant")
    for v in ("upstream", "upstream-nopeer", "patched"):
        parser.add_argument(f"--bin-dir-{v}", type=Path, default=None, metavar="DIR", help=f"llama-bench of {v}")
    parser.add_argument("--build", action=argparse.BooleanOptionalAction, default=True,
                        help="build the variants that are missing (default; --no-build only reuses builds)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF to use instead of the suite's random model")
    parser.add_argument("--vocab", type=Path, default=None, help="vocabulary GGUF for the random model")
    parser.add_argument("--rounds", type=argtypes.count(1), default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--time-budget", type=argtypes.seconds(), default=None, metavar="SECONDS",
                        help="start no round that would end past this many seconds (judged by the longest round so "
                             "far): --rounds becomes a ceiling and the report says how many rounds ran")
    parser.add_argument("--reps", type=argtypes.count(1), default=3, help="llama-bench repetitions kept per round (default 3)")
    parser.add_argument("--ubatch", default=None, metavar="LIST",
                        help="ubatch sizes instead of the suite's, e.g. 4096 (shorter processes, so more rounds fit)")
    parser.add_argument("--tg", type=argtypes.count(0), default=None, metavar="N",
                        help="generated tokens instead of the suite's; 0 skips token generation")
    parser.add_argument("--cpus", default=None, metavar="LIST",
                        help="run every case on these CPUs only, e.g. 0-15 (one socket): same placement for all")
    parser.add_argument("--warmup-reps", type=argtypes.count(0), default=1, metavar="N",
                        help="repetitions run first and discarded in every llama-bench process (default 1)")
    parser.add_argument("--virtual-devices", type=argtypes.count(1), default=None, metavar="N",
                        help="GGML_CUDA_DEVICES=N: emulate N cards on the visible GPUs")
    parser.add_argument("--microbench", action=argparse.BooleanOptionalAction, default=True,
                        help="boundary copy microbenchmark (needs 2+ devices)")
    parser.add_argument("--smi", nargs="?", type=argtypes.count(1), const=100, default=None, metavar="MS",
                        help="sample nvidia-smi every MS milliseconds (default 100) while the cases run: every "
                             "process's GPU clocks, power, temperature and throttle reasons go into the report")
    parser.add_argument("--pool", type=Path, nargs="+", default=None, metavar="REPORT",
                        help="run nothing: pool the rounds of these bench.json reports (same suite and settings, "
                             "e.g. two GPU calls) into one report in --report")
    parser.add_argument("--report", type=Path, default=None, metavar="DIR", help="report directory")
    parser.add_argument("--timeout", type=argtypes.seconds(), default=600.0, help="seconds per llama-bench invocation")


def n_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return len([x for x in out.stdout.splitlines() if x.startswith("GPU ")]) if out.returncode == 0 else 0


def run(args: argparse.Namespace, settings: Any) -> int:
    """Stage entry point (``ggml-bridge bench``)."""
    return bench(args, settings)


def bench(args: argparse.Namespace, settings: Any) -> int:
    if getattr(args, "pool", None):
        if args.report is None:
            raise UsageError("--pool needs --report DIR", why="the pooled report is a new report",
                             fix="e.g. --pool a/bench.json b/bench.json --report pooled")
        return pool_reports(args.pool, args.report)

    if args.rounds < 1 or args.reps < 1 or args.warmup_reps < 0:
        raise UsageError(f"bad counts: --rounds {args.rounds}, --reps {args.reps}, --warmup-reps {args.warmup_reps}",
                         why="a report needs at least one round of at least one kept repetition",
                         fix="use --rounds >= 1, --reps >= 1 and --warmup-reps >= 0")
    if args.ubatch is not None:
        try:
            sizes = [int(x) for x in str(args.ubatch).split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise UsageError(f"bad --ubatch {args.ubatch!r}", why="it must list positive ubatch sizes",
                             fix="e.g. --ubatch 4096 or --ubatch 512,4096")
        args = argparse.Namespace(**{**vars(args), "ubatch": sizes})  # parsed once; the caller's args unchanged
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(f"bad --time-budget {args.time_budget}", why="a budget must be a positive number of seconds",
                         fix="e.g. --time-budget 500, or leave it out to run every round")
    if getattr(args, "smi", None) is not None and not 10 <= args.smi <= 60000:
        raise UsageError(f"bad --smi {args.smi}", why="nvidia-smi samples every 10 ms to 60 s",
                         fix="e.g. --smi 100, or --smi alone for every 100 ms")
    if args.tg is not None and args.tg < 0:
        raise UsageError(f"bad --tg {args.tg}", why="a negative number of generated tokens",
                         fix="use --tg 0 to skip token generation, or a positive count")
    if not args.cpus:
        return _bench(args, settings)
    before = os.sched_getaffinity(0)
    try:
        cpus = parse_cpu_list(args.cpus)
        os.sched_setaffinity(0, cpus)  # inherited by every llama-bench process of the run
    except (ValueError, OSError) as e:
        raise UsageError(f"cannot run on CPUs {args.cpus!r}", why=str(e),
                         fix=f"give CPUs this process may use, e.g. 0-{(os.cpu_count() or 1) - 1}") from None
    log(f"    every case runs on CPUs {args.cpus} ({len(cpus)} CPUs)")
    try:
        return _bench(args, settings)
    finally:
        os.sched_setaffinity(0, before)


def _bench(args: argparse.Namespace, settings: Any) -> int:
    gpus = n_gpus()
    suite_name = args.suite or ("multi-gpu" if gpus >= 2 else "batched" if gpus == 1 else "cpu")
    suite = dict(SUITES[suite_name])
    if args.ubatch is not None:
        suite["ubatch"] = list(args.ubatch)
    if args.tg is not None:
        suite["tg"] = args.tg
    skipped: list[str] = []
    if gpus == 0 and suite["devices"] != "cpu":
        raise BenchError(f"suite {suite_name} needs CUDA GPUs and none is visible",
                         fix="run it on a GPU machine, or use --suite cpu")
    if gpus == 0:
        skipped.append("no CUDA device: P2P, staged, no-peer and bridge throughput, the boundary microbenchmark, "
                       "and batched transfers (they need a device with pinned host memory) cannot be measured "
                       "here; only the CPU cases ran")
    virtual_devices = args.virtual_devices or suite.get("virtual_devices")
    if suite["devices"] == "all" and gpus < 2 and not virtual_devices:
        raise BenchError(f"suite {suite_name} needs 2+ GPUs (found {gpus})",
                         fix="use --virtual-devices N to emulate cards, or --suite batched")
    wanted = args.cases.split(",") if args.cases else suite["cases"]
    try:  # current names (older ones with a deprecation note, see modes.ALIASES)
        cases = [modes.lookup(c, "--cases") for c in wanted]
    except UsageError as e:
        raise BenchError(e.what, why=e.why, fix=e.fix) from None
    odd = [c.name for c in cases if c.devices or c.rejected]
    if odd:
        raise BenchError(f"mode(s) {', '.join(odd)} are ladder checks, not bench cases",
                         fix=f"cases: {', '.join(n for n, m in CASES.items() if not (m.devices or m.rejected))}")

    bins = resolve_bins(args, settings, {c.variant for c in cases})
    runnable = [c for c in cases if c.variant in bins]
    for c in cases:
        if c not in runnable:
            skipped.append(f"{c.name}: no {c.variant} build")
    if not runnable:
        raise BenchError("no case can run: no build of any variant it needs",
                         fix="build them (ggml-bridge build --variant ...) or pass --variants-dir")

    base_env: dict[str, str] = {modes.NCCL_NVLS: "0"}
    if suite["devices"] == "1":
        base_env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    if virtual_devices:
        base_env[modes.CUDA_DEVICES] = str(virtual_devices)

    cache_dir = Path(getattr(settings, "cache_dir"))
    if args.model is not None:
        model_path = args.model
    else:
        from . import model as modelmod

        vocab = args.vocab or modelmod.find_vocab(cache_dir, *[d.parent.parent for d in bins.values()])
        if vocab is None:
            raise BenchError("no vocabulary GGUF for the random model",
                             fix=f"pass --vocab PATH/{modelmod.VOCAB_FILE} (in the upstream tree's models/)")
        with step(f"model {suite['shape']}"):
            model_path = modelmod.ensure_model(cache_dir, suite["shape"], 1234, vocab)

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.report or cache_dir / "reports" / f"bench-{suite_name}-{stamp}"
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    runs: list[CaseRun] = []
    samples: list[Sample] = []
    names = [c.name for c in runnable]
    smi = Telemetry(logs / "smi.csv", args.smi).start() if getattr(args, "smi", None) is not None else None
    stopped = ""
    try:
        stopped = _rounds(args, runnable, bins, model_path, suite, base_env, logs, runs, samples, smi)
    finally:
        if smi is not None:
            smi.stop()
    pooled = pool(names, samples, runs)

    micro: list[dict[str, Any]] = []
    if args.microbench and "patched" in bins and (gpus >= 2 or virtual_devices):
        with step("boundary microbenchmark"):
            micro = microbench(bins["patched"], base_env, logs)

    report = {
        "suite": suite_name, "about": suite["about"], "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "host": platform.node(), "rounds": pooled["rounds"], "rounds_planned": args.rounds, "stopped": stopped,
        "time_budget": args.time_budget, "reps": args.reps, "warmup_reps": args.warmup_reps,
        "cpus": args.cpus,
        "settings": {k: suite[k] for k in ("pp", "batch", "ubatch", "tg", "devices")}
        | ({modes.CUDA_DEVICES: virtual_devices} if virtual_devices else {}),
        "model": {"shape": suite["shape"] if args.model is None else "user", "path": str(model_path)},
        "environment": gpu_env(),
        "cases": [{"name": c.name, "variant": c.variant, "env": c.env(), "description": c.about,
                   "bin_dir": str(bins[c.variant]), "llama_bench_sha256": file_sha256(bins[c.variant] / "llama-bench"),
                   "engagement": next((r.engagement for r in reversed(runs) if r.case == c.name), "")}
                  for c in runnable],
        "manifests": _manifests(bins),
        **pooled, "samples": [asdict(s) for s in samples], "runs": [asdict(r) for r in runs], "skipped": skipped,
        "microbench": micro,
        "smi": ({"interval_ms": smi.interval_ms, "fields": smi.fields, "samples": len(smi.rows),
                 "file": "logs/smi.csv"} if smi is not None else None),
    }
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1))
    (out_dir / "bench.md").write_text(render_markdown(report))
    report["plots"] = plot(report, out_dir)
    log(f"==> report: {out_dir / 'bench.md'}")
    print(out_dir)
    failed, not_engaged = pooled["failed"], pooled["not_engaged"]
    if failed:
        raise BenchError(f"llama-bench failed for case(s) {', '.join(failed)}", fix=f"see the logs in {logs}")
    if not_engaged:
        raise BenchError(f"case(s) {', '.join(not_engaged)} did not engage their mechanism",
                         why="their figures would be upstream's path under another name",
                         fix=f"see the engagement lines in {out_dir / 'bench.md'} and the logs in {logs}")
    return 0


#: reference cases of the ratios, in this order
REFERENCES = ("upstream-p2p", "upstream-nopeer", "off", "upstream", "rpc-upstream-nopeer", "rpc-upstream", "rpc-off")


def references(names: Sequence[str], among: Sequence[str] = REFERENCES) -> list[str]:
    """The reference cases present in ``names``, by their current or older name (reports of earlier runs)."""
    old = {new: [o for o, n in modes.ALIASES.items() if n == new] for new in among}
    return [n for ref in among for n in [ref, *old[ref]] if n in names]


def pool(names: Sequence[str], samples: Sequence[Sample], runs: Sequence[CaseRun]) -> dict[str, Any]:
    """All rounds pooled: per case and test the median and quartiles of every kept sample, and against each
    reference case the ratio of medians and the paired ratio with its interval (cases that failed or did not
    engage are left out of the ratios)."""
    failed = sorted({r.case for r in runs if r.rc != 0})
    not_engaged = sorted({r.case for r in runs if r.engaged is False})
    tests = sorted({s.test for s in samples}, key=_test_order)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        for t in tests:
            vals = [v for s in samples if s.case == name and s.test == t for v in s.values]
            if vals:
                summary.setdefault(name, {})[t] = asdict(summarize(name, t, vals))
    usable = [n for n in names if n not in failed and n not in not_engaged]
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for ref in references(usable):
        for n in usable:
            for t in tests:
                if t in summary.get(n, {}) and t in summary.get(ref, {}):
                    cmp = compare(Summary(**summary[n][t]), Summary(**summary[ref][t]))
                    paired = paired_ratio(samples, n, ref, t)
                    if paired is not None:
                        cmp["paired"], cmp["paired_rounds"] = paired
                        ci = paired_interval(samples, n, ref, t)
                        if ci is not None:
                            cmp["paired_ci95"] = list(ci)
                    ratios.setdefault(ref, {}).setdefault(n, {})[t] = cmp
    return {"rounds": len({r.round for r in runs}), "tests": tests, "summary": summary, "ratios": ratios,
            "failed": failed, "not_engaged": not_engaged}


def pool_reports(paths: Sequence[Path], out_dir: Path) -> int:
    """``bench --pool REPORT...``: the rounds of several reports of the same suite and settings (e.g. two GPU
    calls) pooled into one report, their rounds numbered one after the other; nothing is run."""
    reports = []
    for p in paths:
        f = Path(p) / "bench.json" if Path(p).is_dir() else Path(p)
        try:
            reports.append((f, json.loads(f.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"cannot read the bench report {f}", why=str(e),
                             fix="pass bench.json files (or their folders) written by ggml-bridge bench") from None
    first = reports[0][1]
    envs = {c["name"]: c.get("env") for c in first["cases"]}
    for f, rep in reports[1:]:
        same = {k: rep.get(k) == first.get(k) for k in ("suite", "settings", "reps", "warmup_reps")}
        same["model"] = rep.get("model", {}).get("shape") == first.get("model", {}).get("shape")
        same["cases"] = all(envs.get(c["name"], c.get("env")) == c.get("env") for c in rep["cases"])
        if not all(same.values()):
            raise BenchError(f"{f} was not measured like {reports[0][0]}",
                             why="they differ in " + ", ".join(k for k, v in same.items() if not v),
                             fix="pool only reports of one suite, model, settings and case definitions")
    samples: list[Sample] = []
    runs: list[CaseRun] = []
    fields = {f.name for f in dataclasses.fields(CaseRun)}
    offset = 0
    cases: dict[str, dict[str, Any]] = {}
    for _, rep in reports:
        samples += [Sample(**{**x, "round": x["round"] + offset}) for x in rep["samples"]]
        runs += [CaseRun(**{k: v for k, v in {**x, "round": x["round"] + offset}.items() if k in fields})
                 for x in rep["runs"]]
        offset += 1 + max([x["round"] for x in rep["runs"]], default=-1)
        for c in rep["cases"]:
            cases.setdefault(c["name"], c)
    pooled = pool(list(cases), samples, runs)
    report = {**first, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(), "host": platform.node(),
              "pooled_from": [str(f) for f, _ in reports], "rounds_planned": offset, "stopped": "",
              "cases": list(cases.values()), **pooled, "samples": [asdict(s) for s in samples],
              "runs": [asdict(r) for r in runs], "microbench": [],
              "manifests_by_report": {str(f): rep.get("manifests", {}) for f, rep in reports}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1))
    (out_dir / "bench.md").write_text(render_markdown(report))
    log(f"==> pooled {len(reports)} reports, {pooled['rounds']} rounds: {out_dir / 'bench.md'}")
    print(out_dir)
    return 0


def _rounds(args: argparse.Namespace, runnable: list[Case], bins: dict[str, Path], model_path: Path,
            suite: dict[str, Any], base_env: dict[str, str], logs: Path, runs: list[CaseRun],
            samples: list[Sample], smi: Telemetry | None) -> str:
    """The interleaved rounds (the order rotates each round), until --rounds or the --time-budget; appends to
    ``runs`` and ``samples``; returns why it stopped early ("" if it did not)."""
    names = [c.name for c in runnable]
    t_start = time.monotonic()
    longest = 0.0
    stopped = ""
    for rnd in range(args.rounds):
        elapsed = time.monotonic() - t_start
        if args.time_budget is not None and rnd > 0 and elapsed + longest > args.time_budget:
            stopped = (f"time budget: {rnd} of {args.rounds} rounds ran in {elapsed:.0f} s; another would "
                       f"take ~{longest:.0f} s of the {args.time_budget:.0f} s budget")
            log(f"    stopping: {stopped}")
            break
        t_round = time.monotonic()
        for name in rotate(names, rnd):
            c = CASES[name]
            cr, ss = run_case(bins[c.variant], c, model_path, suite, args.reps, base_env, logs, rnd, args.timeout,
                              warmup=args.warmup_reps)
            if smi is not None:
                cr.gpus = smi.during(cr.started, cr.started + cr.seconds)
            runs.append(cr)
            samples += ss
            figs = " ".join(f"{s.test}={statistics.median(s.values):.1f}" for s in ss)
            log(f"    round {rnd + 1}/{args.rounds} {name:13s} rc={cr.rc} {cr.seconds:5.1f}s {figs}"
                + ("" if cr.engaged is None else f" [{'engaged' if cr.engaged else 'NOT ENGAGED'}]"))
        longest = max(longest, time.monotonic() - t_round)
    return stopped


def _manifests(bins: dict[str, Path]) -> dict[str, Any]:
    """The build manifest of every variant (upstream commit, patches, series hash, cmake_args, ...), from next to
    its binaries where the build stage wrote it: what the figures were measured on."""
    out: dict[str, Any] = {}
    for v, d in bins.items():
        for cand in (d / "manifest.json", d.parent / "manifest.json", d.parent.parent / "manifest.json"):
            if cand.is_file():
                try:
                    m = json.loads(cand.read_text())
                except json.JSONDecodeError:
                    continue
                out[v] = {"file": str(cand), **m}
                break
    return out
