"""The size sweep of patches/README.md from callC-sweep.txt (test-mapped-host-bridge --bench --rounds 3 on one
H200 as two virtual devices, bridge forced; medians of the rounds, [min-max] over rounds) and the driver-staged peer
copy of the 2x H200 microbenchmark of 2026-11-30 (another machine: one H200 has no peer path). Run: python3 sweep.py"""

import statistics
from pathlib import Path

here = Path(__file__).parent
rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
for line in (here / "callC-sweep.txt").read_text().splitlines():
    if line.startswith("bench,") and not line.startswith("bench,path"):
        _, path, n, _, _, gbs, us, *_ = line.split(",")
        rows.setdefault((path, int(n)), []).append((float(gbs), float(us)))
peer = {}
for line in (here.parent / "2026-11-30-h200x2-s5-boundary-microbench" / "microbench.txt").read_text().splitlines():
    if line.startswith("bench,peer,"):
        _, _, n, _, _, gbs, us = line.split(",")[:7]
        peer[int(n)] = (float(gbs), float(us))


def med(path: str, n: int, k: int) -> float:
    return statistics.median(v[k] for v in rows[(path, n)])


def rng(path: str, n: int, k: int) -> str:
    vals = [v[k] for v in rows[(path, n)]]
    return f"[{min(vals):.1f}-{max(vals):.1f}]"


print(
    "| size | one-way min(d2h, h2d) GB/s | d2h + h2d at once GB/s | bridge: GB/s (% one-way, % at-once), us "
    "| previous default (8 MiB chunks) | driver-staged peer, 2x H200 | bridge / previous: latency, throughput |"
)
print("|---|---|---|---|---|---|---|")
for n in sorted({n for (_, n) in rows}):
    one = min(med("d2h", n, 0), med("h2d", n, 0))
    both = med("d2h+h2d", n, 0)

    def cell(p: str) -> str:
        g = med(p, n, 0)
        return f"{g:.1f} {rng(p, n, 0)} ({100 * g / one:.0f} %, {100 * g / both:.0f} %), {med(p, n, 1):.1f} {rng(p, n, 1)}"

    pr = f"{peer[n][0]:.1f}, {peer[n][1]:.1f}" if n in peer else "-"
    size = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
    lat = med("bridge*", n, 1) / med("stream@8192K", n, 1)
    thr = med("bridge*", n, 0) / med("stream@8192K", n, 0)
    print(f"| {size} | {one:.1f} | {both:.1f} | {cell('bridge*')} | {cell('stream@8192K')} | {pr} | {lat:.2f}x, {thr:.2f}x |")
