#!/usr/bin/env python3
"""Where does a large-ubatch boundary lose time? Rotating rounds of llama-bench (one pp test, every
repetition kept) over a set of (variant, selectors) cases, with nvidia-smi sampled alongside so that slow
repetitions can be matched with clocks, power and throttle reasons. GPU machine only; writes JSON lines.

Usage: ub-diag.py VARIANTS MODEL OUT.jsonl [--ub 4096] [--pp 4096] [--rounds 3] [--reps 6] [--cases a,b]
                  [--extra='-t 8' --tag=-t8]   (values that start with '-' need the = form)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

OFF = {"GGML_CUDA_MAPPED_HOST_BRIDGE": "0", "SAM3D_BATCHED_TRANSFERS": "0"}
CASES = {
    "p2p":       ("upstream", {"GGML_CUDA_P2P": "1"}),
    "staged":    ("upstream", {}),
    "nopeer":    ("nopeer", {}),
    "bridge":    ("patched", {**OFF, "GGML_CUDA_MAPPED_HOST_BRIDGE": "1"}),
    "bridge-c8M": ("patched", {**OFF, "GGML_CUDA_MAPPED_HOST_BRIDGE": "1", "GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB": "8192"}),
    "bridge-c64M": ("patched", {**OFF, "GGML_CUDA_MAPPED_HOST_BRIDGE": "1", "GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB": "65536"}),
    "bridge-force-p2p": ("patched", {**OFF, "GGML_CUDA_MAPPED_HOST_BRIDGE": "force", "GGML_CUDA_P2P": "1"}),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--ub", type=int, default=4096)
    ap.add_argument("--pp", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--cases", default="p2p,bridge,bridge-c8M,bridge-c64M,bridge-force-p2p,staged")
    ap.add_argument("--extra", default="", help="more llama-bench arguments, e.g. '-t 8'")
    ap.add_argument("--tag", default="", help="appended to the case names in the output")
    args = ap.parse_args()
    cases = args.cases.split(",")
    for c in cases:
        if c not in CASES:
            print(f"unknown case {c}", file=sys.stderr)
            return 2
    out = open(args.out, "a")
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for c in order:
            variant, env = CASES[c]
            argv = [os.path.join(args.variants, variant, "llama-bench"), "-m", args.model, "-p", str(args.pp), "-n", "0",
                    "-b", str(args.pp), "-ub", str(args.ub), "-ngl", "99", "-sm", "layer", "-r", str(args.reps), "-o", "json"] + args.extra.split()
            t0 = time.time()
            p = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
            t1 = time.time()
            rec = {"case": c + args.tag, "extra": args.extra, "round": r, "rc": p.returncode, "t0": t0, "t1": t1, "env": env}
            try:
                res = json.loads(p.stdout)
                rec["samples_ts"] = res[0]["samples_ts"]
                rec["samples_ns"] = res[0]["samples_ns"]
            except Exception as e:  # keep the failure visible
                rec["error"] = f"{e}: {p.stderr[-800:]}"
            out.write(json.dumps(rec) + "\n")
            out.flush()
            ts = rec.get("samples_ts", [])
            print(f"round {r} {c + args.tag:22s} rc={p.returncode} {t1 - t0:5.1f}s " + " ".join(f"{x:8.0f}" for x in ts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
