#!/usr/bin/env python3
"""Paper model of a host round trip per cross-card boundary: the bridge vs sequential staging.

Prints the Markdown tables of docs/paper-model.md. Inputs are the link's one-way bandwidth B and per-copy
latency L, the model's hidden size h, the ubatch U, the number of cards D, and for sequential staging the
host-side synchronization cost S and the pageable-memory bandwidth Bp of its malloc'd buffer.

    b            = U * h * 4                          bytes of one boundary (f32 activations)
    t_seq(b)     = 2*S + 2*(L + b / min(B, Bp))        NO_PEER_COPY: sync, D2H into malloc, H2D out of it
    t_bridge(b)  = 2*L + E + b/B + min(b, C)/B          D2H of chunk i+1 overlaps H2D of chunk i
    per token    (D-1) * t(h*4)                         token generation: boundaries are latency-bound
    per prompt   sequential: n_ub * (D-1) * t_seq(b)    (no pipeline parallelism: it is switched off)
                 bridge:     ~ (n_ub + D - 1) * k*b/B   link time of the busiest card when transfers overlap
                                                        compute: k = 1 with two cards (one direction each),
                                                        k = 2 with more (a middle card receives and sends)
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

MiB = 1 << 20
CHUNK = 2 * MiB

LINKS = {
    # name: (one-way bandwidth B in bytes/s, per-copy latency L in s)
    "H200 PCIe Gen5 x16 (measured)": (55.2e9, 7.4e-6),
    "PCIe Gen3 x16": (12e9, 10e-6),
    "PCIe Gen1 x1 (six-card riser rig)": (0.25e9, 10e-6),
}
S_SYNC = 10e-6      # one host synchronization + API round trip (upstream fallback), per side
BP_PAGEABLE = 9.7e9  # per-direction pageable staging bandwidth on the H200 host (sync-malloc, 16 MiB: 3.47 ms round trip)
E_EVENT = 3e-6       # cross-device event wait

# Network links between hosts (llama.cpp RPC over TCP, docs/rpc.md): (goodput of one TCP stream in bytes/s,
# round trip of a small request in s). Assumed, not measured here: 10/25 GbE at ~94 % of line rate; 100 GbE
# single-stream TCP without tuning rarely passes ~70 % of line rate.
NETWORKS = {
    "10 GbE": (1.17e9, 50e-6),
    "25 GbE": (2.9e9, 35e-6),
    "100 GbE": (8.75e9, 25e-6),
}


def t_seq(b: float, B: float, L: float) -> float:
    return 2 * S_SYNC + 2 * (L + b / min(B, BP_PAGEABLE))


def t_bridge(b: float, B: float, L: float) -> float:
    return 2 * L + E_EVENT + b / B + min(b, CHUNK) / B


def t_tcp(b: float, Bn: float, rtt: float, B: float, L: float) -> float:
    """One boundary between GPUs of two hosts: GET_TENSOR (a round trip, the data back to llama-server) and
    SET_TENSOR (sent without a reply: ~half a round trip), one after the other, plus each server's own D2H or
    H2D over its PCIe link (B, L); no overlap: the RPC backend has no async copy, so no pipeline parallelism."""
    return 1.5 * rtt + 2 * b / Bn + 2 * (L + b / B)


def fmt(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} µs"


def tables() -> str:
    out = ["| link | hidden | cards | per token: sequential | per token: bridge | prompt 4096 @ ub512: sequential | "
           "prompt 4096 @ ub512: bridge (overlapped) |", "|---|---|---|---|---|---|---|"]
    for name, (B, L) in LINKS.items():
        for h in (4096, 8192):
            for D in (2, 6):
                tok_b = h * 4
                ub_b = 512 * h * 4
                n_ub = 4096 // 512
                seq_tok = (D - 1) * t_seq(tok_b, B, L)
                br_tok = (D - 1) * t_bridge(tok_b, B, L)
                seq_pp = n_ub * (D - 1) * t_seq(ub_b, B, L)
                br_pp = (n_ub + D - 1) * (1 if D == 2 else 2) * ub_b / B
                out.append(f"| {name} | {h} | {D} | {fmt(seq_tok)} | {fmt(br_tok)} | {fmt(seq_pp)} | {fmt(br_pp)} |")
    return "\n".join(out)


def network_tables() -> str:
    """A boundary that crosses TCP next to one the bridge carries inside a host (two cards)."""
    B5, L5 = LINKS["H200 PCIe Gen5 x16 (measured)"]
    out = ["| boundary | link | hidden | per token | prompt 4096 @ ub512 |", "|---|---|---|---|---|"]
    n_ub = 4096 // 512
    for h in (4096, 8192):
        tok_b, ub_b = h * 4, 512 * h * 4
        for name, (Bn, rtt) in NETWORKS.items():
            out.append(f"| between hosts (RPC, TCP; Gen5 x16 in each host) | {name} | {h} | "
                       f"{fmt(t_tcp(tok_b, Bn, rtt, B5, L5))} | {fmt(n_ub * t_tcp(ub_b, Bn, rtt, B5, L5))} |")
        for name, (B, L) in LINKS.items():
            out.append(f"| inside a host, bridge (overlapped) | {name} | {h} | {fmt(t_bridge(tok_b, B, L))} | "
                       f"{fmt((n_ub + 1) * ub_b / B)} |")
            out.append(f"| inside a host, sequential staging | {name} | {h} | {fmt(t_seq(tok_b, B, L))} | "
                       f"{fmt(n_ub * t_seq(ub_b, B, L))} |")
    return "\n".join(out)


def check(microbench: Path | None) -> str:
    """Predicted vs measured single-boundary copy time on the H200 machine (one copy plus synchronization)."""
    B, L = LINKS["H200 PCIe Gen5 x16 (measured)"]
    rows = ["| bytes | bridge predicted | bridge measured | sequential predicted | NO_PEER_COPY path measured |",
            "|---|---|---|---|---|"]
    measured: dict[tuple[str, int], float] = {}
    if microbench and microbench.is_file():
        for r in csv.reader(microbench.read_text().splitlines()):
            if len(r) == 7 and r[0] == "bench" and r[1] != "path":
                measured[(r[1], int(r[2]))] = float(r[6]) * 1e-6
    for b in (4096, 65536, MiB, 16 * MiB, 256 * MiB):
        mb = measured.get(("bridge", b))
        ms = measured.get(("sync-malloc", b))
        rows.append(f"| {b} | {fmt(t_bridge(b, B, L))} | {fmt(mb) if mb else '—'} | {fmt(t_seq(b, B, L))} | "
                    f"{fmt(ms) if ms else '—'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbench", type=Path, default=Path("results/2026-11-30-h200x2-s1-tests-sanitizers-microbench/microbench.csv"))
    a = ap.parse_args()
    print("## Predicted transfer time added by the boundaries\n")
    print(tables())
    print("\n## Network links (RPC between hosts) next to PCIe, one boundary, two cards\n")
    print(network_tables())
    print("\n## Check against the H200 microbenchmark\n")
    print(check(a.microbench))


if __name__ == "__main__":
    main()
