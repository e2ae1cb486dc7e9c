"""The size sweep table of patches/README.md from bench.txt (test-mapped-host-bridge --bench, 2 rounds, median
of the rounds per path) and the driver-staged peer copy of the 2x H200 microbenchmark of 2026-11-30 (another
machine: two GPUs without enabled peer access; one H200 has no such path). Run: python3 sweep.py"""
import statistics
from pathlib import Path

here = Path(__file__).parent
rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
for line in (here / "bench.txt").read_text().splitlines():
    if line.startswith("bench,") and not line.startswith("bench,path"):
        _, path, n, _, _, gbs, us, *_ = line.split(",")
        rows.setdefault((path, int(n)), []).append((float(gbs), float(us)))
peer = {}
for line in (here.parent / "2026-11-30-h200x2-s5-boundary-microbench" / "microbench.txt").read_text().splitlines():
    if line.startswith("bench,peer,"):
        _, _, n, _, _, gbs, us = line.split(",")[:7]
        peer[int(n)] = (float(gbs), float(us))
med = lambda path, n, k: statistics.median(v[k] for v in rows[(path, n)])
sizes = sorted({n for (_, n) in rows})
print("| size | one-way d2h / h2d GB/s | new bridge: GB/s (% one-way), us | previous default stream@8192K | "
      "stream@2048K | driver-staged peer (2x H200, 2026-11-30) | new vs previous: latency, throughput |")
print("|---|---|---|---|---|---|---|")
for n in sizes:
    one = min(med("d2h", n, 0), med("h2d", n, 0))
    cell = lambda p: f"{med(p, n, 0):.1f} ({100 * med(p, n, 0) / one:.0f} %), {med(p, n, 1):.1f}"
    pr = f"{peer[n][0]:.1f}, {peer[n][1]:.1f}" if n in peer else "-"
    size = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
    print(f"| {size} | {med('d2h', n, 0):.1f} / {med('h2d', n, 0):.1f} | {cell('bridge*')} | {cell('stream@8192K')} | "
          f"{cell('stream@2048K')} | {pr} | {med('bridge*', n, 1) / med('stream@8192K', n, 1):.2f}x, "
          f"{med('bridge*', n, 0) / med('stream@8192K', n, 0):.2f}x |")
