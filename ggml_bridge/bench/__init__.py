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

Over 500 lines: the command (its options, case resolution, the interleaved round loop, the report's assembly);
running one llama-bench, the statistics and the rendering are already bench.running, bench.stats and bench.report.
What is left is the one loop whose order (rotation, time budget, stop on a failed case) must be read in one piece.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import modes, netbench
from ..cache import file_sha256
from ..config import Settings
from ..errors import BenchError, UsageError
from ..runner import log, step
from .report import plot, pool_reports, render_markdown, smi_table
from .running import engagement, microbench, rotate, rounds, rpc_engagement, run_case
from .stats import (
    REFERENCES,
    CaseRun,
    Sample,
    Summary,
    compare,
    paired_interval,
    paired_ratio,
    pool,
    references,
    summarize,
    test_key,
)
from .telemetry import SMI_FIELDS, Telemetry, gpu_env, n_gpus

__all__ = [
    "CASES",
    "REFERENCES",
    "SMI_FIELDS",
    "SUITES",
    "Case",
    "CaseRun",
    "Sample",
    "Summary",
    "Telemetry",
    "add_arguments",
    "bench",
    "compare",
    "engagement",
    "gpu_env",
    "microbench",
    "n_gpus",
    "paired_interval",
    "paired_ratio",
    "parse_cpu_list",
    "plot",
    "pool",
    "pool_reports",
    "references",
    "render_markdown",
    "resolve_bins",
    "rotate",
    "rpc_engagement",
    "run",
    "run_case",
    "smi_table",
    "summarize",
    "test_key",
]

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
        "shape": "bench-3b",
        "devices": "all",
        "pp": 4096,
        "batch": 4096,
        "ubatch": [512, 4096],
        "tg": 128,
        "about": "layer split across every visible GPU: one host round trip per boundary without peer access",
    },
    "batched": {
        "cases": ["off", "batched"],
        "shape": "bench-1b",
        "devices": "1",
        "pp": 512,
        "batch": 512,
        "ubatch": [512],
        "tg": 128,
        "about": "one GPU: per-token graph inputs and logits, batched through the pinned pool or not",
    },
    "batched-multi": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 512,
        "batch": 512,
        "ubatch": [512],
        "tg": 128,
        "about": "layer split: batching composed with the bridge",
    },
    "batched-pipeline": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 2048,
        "batch": 2048,
        "ubatch": [512],
        "tg": 0,
        "about": "layer split with pipeline parallelism (4 ubatches per prompt): staged inputs must not stall it",
    },
    # issue 14 item 2: prompt processing with several ubatches in flight on many-device pipelines; batching
    # must make nothing >= 1 % slower (it declines prompt-sized graphs) and keep its token-generation gain
    "batched-pp-6dev": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l",
        "devices": "all",
        "virtual_devices": 6,
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "6 virtual devices on the visible GPUs (one layer each), -sm layer -ub 512 -b 4096: pipeline parallelism",
    },
    "batched-pp-2gpu": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l",
        "devices": "all",
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "2 GPUs, -sm layer -ub 512 -b 4096: pipeline parallelism over two cards",
    },
    "rpc": {
        "cases": ["rpc-upstream", "rpc-upstream-nopeer", "rpc-off", "rpc-bridge"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 2048,
        "batch": 2048,
        "ubatch": [512, 2048],
        "tg": 32,
        "about": "one rpc-server on localhost owning every GPU, llama-bench --rpc: the copies between its GPUs "
        "are server-side (RPC_CMD_COPY_TENSOR); the activations to and from llama-bench cross TCP",
    },
    "rpc-cpu": {
        "cases": ["off", "rpc-off"],
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 16,
        "threads": 1,
        "about": "CPU: the same build local and behind one localhost rpc-server (the cost of the TCP hops); one "
        "thread in both, so the comparison is not about thread counts (the defaults differ)",
    },
    # issue 29: hosts over a network, on one GPU. llama-bench keeps the GPU and puts part of the layers on one
    # localhost rpc-server on the same GPU (a second host); the link between them is shaped (netbench.py)
    "rpc-link": {
        "cases": ["off", "rpc-off"],
        "links": ["unlimited/0", "10gbit/0.2ms", "25gbit/0.2ms", "10gbit/0.5ms", "25gbit/0.1ms"],
        "rpc_servers": 1,
        "rpc_front_gpu": True,
        "shape": "bench-1b",
        "devices": "1",
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "one GPU as two hosts: llama-bench's GPU plus one rpc-server on it, over loopback TCP, through the "
        "shaper without limits (the scale model's calibration) and over shaped links (rate per direction / "
        "one-way delay), against the local run",
    },
    "rpc-link-cpu": {
        "cases": ["off", "rpc-off"],
        "links": ["unlimited/0", "1gbit/0.2ms", "1gbit/1ms"],
        "rpc_servers": 1,
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 16,
        "threads": 1,
        "about": "CPU: the same build local, behind one localhost rpc-server, and behind it over a shaped link",
    },
    "cpu": {
        "cases": ["upstream", "off"],
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 32,
        "about": "CPU only: the patched build with its selectors off against upstream (the patches must cost nothing)",
    },
}


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


def resolve_bins(args: argparse.Namespace, settings: Settings, variants: set[str]) -> dict[str, Path]:
    """Directory holding llama-bench for each variant: --variants-dir, --bin-dir-*, or the build stage."""
    from .. import builder  # the build stage needs git tooling only when it is used
    from ..errors import NotBuiltError

    dirs: dict[str, Path] = {}
    for v in sorted(variants):
        override = getattr(args, f"bin_dir_{v.replace('-', '_')}", None)
        if override is None and args.variants_dir is not None:
            override = Path(args.variants_dir) / modes.VARIANTS[v].subdir
        try:
            dirs[v] = builder.locate(settings, v, "llama-bench", override).parent
            continue
        except NotBuiltError as e:
            if override is not None:
                raise BenchError(f"llama-bench not found in {override}", fix=f"build the {v} variant there") from None
            if not args.build:
                log(f"    no {v} build ({e.what}); --build would make it")
                continue
        try:
            with step(f"build {v}"):
                dirs[v] = builder.ensure(settings, v).bin_dir
        except UsageError as e:  # e.g. upstream-nopeer on a CPU-only machine: that case is skipped
            log(f"    cannot build {v}: {e}")
    return dirs


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Stage entry point (``ggml-bridge bench``)."""
    return bench(args, settings)


def bench(args: argparse.Namespace, settings: Settings) -> int:
    if getattr(args, "pool", None):
        if args.report is None:
            raise UsageError(
                "--pool needs --report DIR",
                why="the pooled report is a new report",
                fix="e.g. --pool a/bench.json b/bench.json --report pooled",
            )
        return pool_reports(args.pool, args.report)

    if args.rounds < 1 or args.reps < 1 or args.warmup_reps < 0:
        raise UsageError(
            f"bad counts: --rounds {args.rounds}, --reps {args.reps}, --warmup-reps {args.warmup_reps}",
            why="a report needs at least one round of at least one kept repetition",
            fix="use --rounds >= 1, --reps >= 1 and --warmup-reps >= 0",
        )
    if args.ubatch is not None:
        try:
            sizes = [int(x) for x in str(args.ubatch).split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise UsageError(
                f"bad --ubatch {args.ubatch!r}",
                why="it must list positive ubatch sizes",
                fix="e.g. --ubatch 4096 or --ubatch 512,4096",
            )
        args = argparse.Namespace(**{**vars(args), "ubatch": sizes})  # parsed once; the caller's args unchanged
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(
            f"bad --time-budget {args.time_budget}",
            why="a budget must be a positive number of seconds",
            fix="e.g. --time-budget 500, or leave it out to run every round",
        )
    if getattr(args, "smi", None) is not None and not 10 <= args.smi <= 60000:
        raise UsageError(
            f"bad --smi {args.smi}",
            why="nvidia-smi samples every 10 ms to 60 s",
            fix="e.g. --smi 100, or --smi alone for every 100 ms",
        )
    if args.tg is not None and args.tg < 0:
        raise UsageError(
            f"bad --tg {args.tg}",
            why="a negative number of generated tokens",
            fix="use --tg 0 to skip token generation, or a positive count",
        )
    if not args.cpus:
        return _bench(args, settings)
    before = os.sched_getaffinity(0)
    try:
        cpus = parse_cpu_list(args.cpus)
        os.sched_setaffinity(0, cpus)  # inherited by every llama-bench process of the run
    except (ValueError, OSError) as e:
        raise UsageError(
            f"cannot run on CPUs {args.cpus!r}",
            why=str(e),
            fix=f"give CPUs this process may use, e.g. 0-{(os.cpu_count() or 1) - 1}",
        ) from None
    log(f"    every case runs on CPUs {args.cpus} ({len(cpus)} CPUs)")
    try:
        return _bench(args, settings)
    finally:
        os.sched_setaffinity(0, before)


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    gpus = n_gpus()
    suite_name = args.suite or ("multi-gpu" if gpus >= 2 else "batched" if gpus == 1 else "cpu")
    suite = dict(SUITES[suite_name])
    if args.ubatch is not None:
        suite["ubatch"] = list(args.ubatch)
    if args.tg is not None:
        suite["tg"] = args.tg
    skipped: list[str] = []
    if gpus == 0 and suite["devices"] != "cpu":
        raise BenchError(
            f"suite {suite_name} needs CUDA GPUs and none is visible", fix="run it on a GPU machine, or use --suite cpu"
        )
    if gpus == 0:
        skipped.append(
            "no CUDA device: P2P, staged, no-peer and bridge throughput, the boundary microbenchmark, "
            "and batched transfers (they need a device with pinned host memory) cannot be measured "
            "here; only the CPU cases ran"
        )
    virtual_devices = args.virtual_devices or suite.get("virtual_devices")
    if suite["devices"] == "all" and gpus < 2 and not virtual_devices:
        raise BenchError(
            f"suite {suite_name} needs 2+ GPUs (found {gpus})",
            fix="use --virtual-devices N to emulate cards, or --suite batched",
        )
    wanted = args.cases.split(",") if args.cases else suite["cases"]
    try:  # current names (older ones with a deprecation note, see modes.ALIASES)
        cases = [modes.lookup(c, "--cases") for c in wanted]
    except UsageError as e:
        raise BenchError(e.what, why=e.why, fix=e.fix) from None
    if virtual_devices and gpus < virtual_devices:
        forced = [c.name for c in cases if c.name in modes.FORCED_ON_VIRTUAL]
        cases = [modes.MODES[modes.FORCED_ON_VIRTUAL.get(c.name, c.name)] for c in cases]
        if forced:
            log(
                f"    {virtual_devices} virtual devices on {gpus} GPU(s): {', '.join(forced)} measured forced (auto "
                "keeps virtual devices of one GPU on upstream's device-local copy)"
            )
    links = args.links.split(",") if getattr(args, "links", None) else suite.get("links", [])
    try:
        cases = netbench.expand(cases, links)
    except UsageError as e:
        raise BenchError(e.what, why=e.why, fix=e.fix) from None
    odd = [c.name for c in cases if c.devices or c.rejected]
    if odd:
        raise BenchError(
            f"mode(s) {', '.join(odd)} are ladder checks, not bench cases",
            fix=f"cases: {', '.join(n for n, m in CASES.items() if not (m.devices or m.rejected))}",
        )

    bins = resolve_bins(args, settings, {c.variant for c in cases})
    runnable = [c for c in cases if c.variant in bins]
    for c in cases:
        if c not in runnable:
            skipped.append(f"{c.name}: no {c.variant} build")
    if not runnable:
        raise BenchError(
            "no case can run: no build of any variant it needs",
            fix="build them (ggml-bridge build --variant ...) or pass --variants-dir",
        )

    base_env: dict[str, str] = {modes.NCCL_NVLS: "0"}
    if suite["devices"] == "1":
        base_env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    if virtual_devices:
        base_env[modes.CUDA_DEVICES] = str(virtual_devices)

    cache_dir = Path(settings.cache_dir)
    if args.model is not None:
        model_path = args.model
    else:
        from .. import model as modelmod

        vocab = args.vocab or modelmod.find_vocab(cache_dir, *[d.parent.parent for d in bins.values()])
        if vocab is None:
            raise BenchError(
                "no vocabulary GGUF for the random model",
                fix=f"pass --vocab PATH/{modelmod.VOCAB_FILE} (in the upstream tree's models/)",
            )
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
        stopped = rounds(args, runnable, bins, model_path, suite, base_env, logs, runs, samples, smi)
    finally:
        if smi is not None:
            smi.stop()
    pooled = pool(names, samples, runs)

    micro: list[dict[str, Any]] = []
    if args.microbench and modes.PATCHED in bins and (gpus >= 2 or virtual_devices):
        with step("boundary microbenchmark"):
            micro = microbench(bins[modes.PATCHED], base_env, logs)

    report = {
        "suite": suite_name,
        "about": suite["about"],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "host": platform.node(),
        "rounds": pooled["rounds"],
        "rounds_planned": args.rounds,
        "stopped": stopped,
        "time_budget": args.time_budget,
        "reps": args.reps,
        "warmup_reps": args.warmup_reps,
        "cpus": args.cpus,
        "settings": {k: suite[k] for k in ("pp", "batch", "ubatch", "tg", "devices")}
        | ({modes.CUDA_DEVICES: virtual_devices} if virtual_devices else {}),
        "model": {"shape": suite["shape"] if args.model is None else "user", "path": str(model_path)},
        "environment": gpu_env(),
        "links": netbench.report(runnable, suite),
        "cases": [
            {
                "name": c.name,
                "variant": c.variant,
                "env": c.env(),
                "link": c.link,
                "description": c.about,
                "bin_dir": str(bins[c.variant]),
                "llama_bench_sha256": file_sha256(bins[c.variant] / "llama-bench"),
                "engagement": next((r.engagement for r in reversed(runs) if r.case == c.name), ""),
            }
            for c in runnable
        ],
        "manifests": _manifests(bins),
        **pooled,
        "samples": [asdict(s) for s in samples],
        "runs": [asdict(r) for r in runs],
        "skipped": skipped,
        "microbench": micro,
        "smi": (
            {"interval_ms": smi.interval_ms, "fields": smi.fields, "samples": len(smi.rows), "file": "logs/smi.csv"}
            if smi is not None
            else None
        ),
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
        raise BenchError(
            f"case(s) {', '.join(not_engaged)} did not engage their mechanism",
            why="their figures would be upstream's path under another name",
            fix=f"see the engagement lines in {out_dir / 'bench.md'} and the logs in {logs}",
        )
    return 0


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
