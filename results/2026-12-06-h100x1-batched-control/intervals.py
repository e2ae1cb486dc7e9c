"""The tables of this folder's README from the CSV lines of `test-batched-transfers --bench` outputs: per measure,
the median of the per-round speed ratio (context 1 against context 0: off ms / on ms, or off ms / off-again ms with
--control) and the 95 % bootstrap interval of that median over whole rounds (ggml_bridge.bench.stats._median_range:
2000 resamples, seed 1234). Several files given: their rounds pooled into one median.
Usage, with the package importable (installed, or PYTHONPATH=. from the repository root):
    python3 results/2026-12-06-h100x1-batched-control/intervals.py FILE [FILE ...]"""
import statistics
import sys

from ggml_bridge.bench.stats import _median_range

ratios: dict[str, list[float]] = {}
for path in sys.argv[1:]:
    rounds: dict[tuple[str, int], dict[int, float]] = {}
    for line in open(path):
        if line.startswith("bench,") and not line.startswith("bench,round"):
            _, r, c, measure, ms = line.strip().split(",")
            rounds.setdefault((measure, int(r)), {})[int(c)] = float(ms)
    for (measure, _), ms_by_context in rounds.items():
        ratios.setdefault(measure, []).append(ms_by_context[0] / ms_by_context[1])
for measure, values in ratios.items():
    lo, hi = _median_range(values, len(values), 2000, 1234) or (float("nan"), float("nan"))
    print(f"{measure:10s} {statistics.median(values):.3f} [{lo:.3f}, {hi:.3f}]  rounds {len(values)}")
