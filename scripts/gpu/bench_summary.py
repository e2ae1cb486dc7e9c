"""One line per llama-bench JSON result: test=throughput+-stddev (used by the GPU scripts)."""
import json
import sys

for r in json.load(open(sys.argv[1])):
    test = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
    print(f"{test}/ub{r['n_ubatch']}={r['avg_ts']:.1f}+-{r['stddev_ts']:.1f}", end=" ")
print()
