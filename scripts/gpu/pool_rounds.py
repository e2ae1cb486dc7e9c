#!/usr/bin/env python3
"""Pool one test of several `ggml-bridge bench` reports (bench.json) and take its figures apart by this machine's
two speed modes: per case the median, 90th percentile and best sample, the share of samples and of processes in
the fast mode, and against a reference case the ratio of medians, the paired ratio (median over rounds of the
ratio within a round), the ratio of 90th percentiles and the ratio within each mode, each with a 95 % bootstrap
interval that resamples whole rounds (a process's samples are not independent). With --smi (the CSV that
scripts/gpu/ub4096-rounds.sh records), every process is matched with the GPUs' clocks, power, temperatures and
throttle reasons while it ran, and fast processes are set against slow ones.

Usage: pool_rounds.py [--test pp4096/ub4096] [--ref p2p] [--split 38000] [--smi smi.csv[.gz] ...] bench.json ...
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import json
import random
import statistics
import sys
from collections import defaultdict


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def load(paths: list[str], test: str) -> tuple[dict, dict]:
    """samples[(file, round, case)] = [t/s...]; runs[(file, round, case)] = run record"""
    samples: dict = {}
    runs: dict = {}
    for i, p in enumerate(paths):
        rep = json.load(open(p))
        for s in rep["samples"]:
            if s["test"] == test:
                samples[(i, s["round"], s["case"])] = s["values"]
        for r in rep["runs"]:
            runs[(i, r["round"], r["case"])] = r
    return samples, runs


def measures(samples: dict, keys: list, case: str, ref: str, split: float) -> dict[str, float]:
    def vals(c: str, mode: str | None = None) -> list[float]:
        out = [v for k in keys for v in samples.get((k[0], k[1], c), [])]
        if mode == "fast":
            out = [v for v in out if v >= split]
        elif mode == "slow":
            out = [v for v in out if v < split]
        return out
    m: dict[str, float] = {}
    a, b = vals(case), vals(ref)
    if not a or not b:
        return m
    m["median"] = statistics.median(a) / statistics.median(b)
    m["p90"] = pct(a, 0.9) / pct(b, 0.9)
    within = [statistics.median(samples[(k[0], k[1], case)]) / statistics.median(samples[(k[0], k[1], ref)])
              for k in keys if (k[0], k[1], case) in samples and (k[0], k[1], ref) in samples]
    if within:
        m["paired"] = statistics.median(within)
    for mode in ("fast", "slow"):
        a, b = vals(case, mode), vals(ref, mode)
        if a and b:
            m[mode] = statistics.median(a) / statistics.median(b)
    return m


def read_smi(paths: list[str]) -> tuple[list[str], list[tuple[float, int, list[str]]]]:
    header: list[str] = []
    rows: list[tuple[float, int, list[str]]] = []
    for p in paths:
        f = gzip.open(p, "rt") if p.endswith(".gz") else open(p)
        with f:
            lines = f.read().splitlines()
        header = [h.strip() for h in lines[0].split(",")]
        for row in csv.reader(lines[1:]):
            row = [x.strip() for x in row]
            if len(row) != len(header):
                continue
            try:
                t = dt.datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
            except ValueError:
                continue
            rows.append((t, int(row[1]), row[2:]))
    return header[2:], rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--test", default="pp4096/ub4096")
    ap.add_argument("--ref", default="p2p")
    ap.add_argument("--split", type=float, default=38000.0, help="t/s between the slow and the fast mode")
    ap.add_argument("--smi", action="append", default=[], help="nvidia-smi CSV recorded alongside (repeatable)")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    args = ap.parse_args()

    samples, runs = load(args.reports, args.test)
    if not samples:
        print(f"no samples of {args.test} in {', '.join(args.reports)}", file=sys.stderr)
        return 2
    cases = sorted({k[2] for k in samples}, key=lambda c: (c != args.ref, c))
    keys = sorted({(k[0], k[1]) for k in samples})
    print(f"## {args.test}: {len(args.reports)} report(s), {len(keys)} rounds, split at {args.split:.0f} t/s\n")
    print("| case | processes | samples | median | p90 | best | fast samples | fast processes | median fast | median slow |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        procs = [samples[k] for k in sorted(samples) if k[2] == c]
        v = [x for p in procs for x in p]
        fast = [x for x in v if x >= args.split]
        slow = [x for x in v if x < args.split]
        fp = sum(statistics.median(p) >= args.split for p in procs)
        print(f"| {c} | {len(procs)} | {len(v)} | {statistics.median(v):.0f} | {pct(v, .9):.0f} | {max(v):.0f} | "
              f"{100 * len(fast) / len(v):.0f} % | {fp}/{len(procs)} | "
              f"{statistics.median(fast) if fast else float('nan'):.0f} | "
              f"{statistics.median(slow) if slow else float('nan'):.0f} |")

    rng = random.Random(1234)
    print(f"\n| case / {args.ref} | median | paired | p90 | fast mode | slow mode |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        if c == args.ref:
            continue
        point = measures(samples, keys, c, args.ref, args.split)
        boots: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.boot):
            res = [keys[rng.randrange(len(keys))] for _ in keys]
            for k, x in measures(samples, res, c, args.ref, args.split).items():
                boots[k].append(x)
        cells = []
        for k in ("median", "paired", "p90", "fast", "slow"):
            if k not in point:
                cells.append("—")
                continue
            b = boots[k]
            cells.append(f"{point[k]:.3f} [{pct(b, .025):.3f}, {pct(b, .975):.3f}]")
        print(f"| {c} | " + " | ".join(cells) + " |")
    print("\n(brackets: 95 % bootstrap interval over rounds)")

    if not args.smi:
        return 0
    fields, rows = read_smi(args.smi)
    rows.sort()
    if not rows:
        print("\nno nvidia-smi samples")
        return 0
    num = [i for i, f in enumerate(fields) if "reasons" not in f]
    rsn = [i for i, f in enumerate(fields) if "reasons" in f]
    util = fields.index("utilization.gpu") if "utilization.gpu" in fields else None
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    reasons: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for k, vals in samples.items():
        r = runs.get(k)
        if not r or not r.get("started"):
            continue
        t0, t1 = r["started"], r["started"] + r["seconds"]
        mode = "fast" if statistics.median(vals) >= args.split else "slow"
        for gpu in (0, 1):
            w = [x for t, g, x in rows if g == gpu and t0 <= t <= t1]
            if util is not None:   # the process is mostly loading: keep the samples where the GPU computed
                w = [x for x in w if x[util].replace(".", "", 1).isdigit() and float(x[util]) >= 50]
            if not w:
                continue
            rec: dict[str, float] = {}
            for i in num:
                xs = []
                for x in w:
                    try:
                        xs.append(float(x[i]))
                    except ValueError:
                        pass
                if xs:
                    rec[fields[i]] = max(xs) if "power" in fields[i] or "temperature" in fields[i] else statistics.median(xs)
            groups[f"{mode} gpu{gpu}"].append(rec)
            for x in w:
                for i in rsn:
                    reasons[f"{mode} gpu{gpu}"][x[i]] += 1
    print(f"\n## GPU state while the processes ran (median over processes of: the median clock and utilisation, "
          f"the peak power and temperatures in the process, over the samples with utilisation >= 50 %)\n")
    names = [fields[i] for i in num]
    print("| processes | n | " + " | ".join(names) + " | throttle reasons (share of samples) |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for g in sorted(groups):
        recs = groups[g]
        cells = []
        for n in names:
            xs = [r[n] for r in recs if n in r]
            cells.append(f"{statistics.median(xs):.0f}" if xs else "—")
        tot = sum(reasons[g].values()) or 1
        rs = ", ".join(f"{k} {100 * v / tot:.0f} %" for k, v in sorted(reasons[g].items(), key=lambda kv: -kv[1])[:3])
        print(f"| {g} | {len(recs)} | " + " | ".join(cells) + f" | {rs or '—'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
