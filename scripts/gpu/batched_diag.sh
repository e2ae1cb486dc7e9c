#!/usr/bin/env bash
# Batched transfers on a GPU: where the staged path's cost comes from, with one patched build.
#   1. the split inputs of a prompt ubatch and of a token step, per device (GGML_SCHED_DEBUG=1: name and size of
#      every input of every split), on 1 device and on N virtual devices;
#   2. one-shot llama-bench runs (-r 1, the run a user makes) interleaved over ROUNDS rounds, three ways:
#        off        LLAMA_BATCHED_TRANSFERS=0 (upstream's copies)
#        rule       LLAMA_BATCHED_TRANSFERS=1 (inputs up to 64 KiB staged, larger ones on upstream's copy)
#        stage-all  LLAMA_BATCHED_TRANSFERS=1 LLAMA_BATCHED_TRANSFERS_STAGE_MAX=33554432 (every input the pool can
#                   hold staged: what the measuring policy staged while it explored)
#      with each process's stats line (bytes_up, async/upstream uploads, pool_waits, pool_drains, fallbacks);
#   3. diag.tsv (one row per process) and diag.md (per devices and way: medians over rounds, ratios to off).
# Usage: OUT=/tmp/out BIN=<patched bin dir> MODEL=<gguf> ROUNDS=5 DEVICES="1 6" BUDGET=250 [WAYS="off rule"] bash scripts/gpu/batched_diag.sh
# (prove.sh's `diag` step runs it on the wide model, bench-2b-6l: n_embd 5120, 6 layers).
set -uo pipefail
: "${OUT:?}" "${BIN:?}" "${MODEL:?}"
ROUNDS=${ROUNDS:-5} DEVICES=${DEVICES:-"1 6"} BUDGET=${BUDGET:-250}
mkdir -p "$OUT/diag"
export NCCL_NVLS_ENABLE=0
# shellcheck disable=SC2054  # llama-bench's lists: the commas are its
args=(-m "$MODEL" -p 512,4096 -n 128 -b 4096 -ub 512 -ngl 99 -sm layer -o json -v)  # -v: the stats lines (INFO)
read -r -a ways <<< "${WAYS:-off rule stage-all}"  # WAYS="off rule": the two a user chooses between
way_env() {
    case $1 in
        off) echo LLAMA_BATCHED_TRANSFERS=0 ;;
        rule) echo LLAMA_BATCHED_TRANSFERS=1 ;;
        stage-all) echo LLAMA_BATCHED_TRANSFERS=1 LLAMA_BATCHED_TRANSFERS_STAGE_MAX=33554432 ;;
    esac
}
dev_env() { [ "$1" -gt 1 ] && echo "GGML_CUDA_DEVICES=$1 GGML_CUDA_MAPPED_HOST_BRIDGE=force" || echo "CUDA_VISIBLE_DEVICES=0"; }

# 1. the split inputs (one process per device count; the first pp4096 graph, the last ubatch's, a token step's)
for n in $DEVICES; do
    # shellcheck disable=SC2046
    env $(dev_env "$n") LLAMA_BATCHED_TRANSFERS=0 GGML_SCHED_DEBUG=1 timeout 120 "$BIN/llama-bench" \
        -m "$MODEL" -p 4096 -n 4 -b 4096 -ub 512 -ngl 99 -sm layer -r 1 -v > /dev/null 2> "$OUT/diag/sched-${n}dev.log"
    grep -E "^## SPLIT" "$OUT/diag/sched-${n}dev.log" | sort | uniq -c | sort -rn > "$OUT/diag/splits-${n}dev.txt"
    echo "splits of $n device(s): $(wc -l < "$OUT/diag/splits-${n}dev.txt") distinct split lines"
    rm -f "$OUT/diag/sched-${n}dev.log"
done

# 2. one-shot runs, interleaved: every round runs every (devices, way), the order rotated per round
printf "round\tdevices\tway\ttest\tts\tgraphs\tasync_uploads\tupstream_uploads\tbytes_up\tpool_waits\tpool_drains\tfallbacks\n" > "$OUT/diag/diag.tsv"
for ((r = 0; r < ROUNDS; r++)); do
    [ $SECONDS -gt "$BUDGET" ] && { echo "budget: stopped after $r rounds"; break; }
    for n in $DEVICES; do
        for ((k = 0; k < ${#ways[@]}; k++)); do
            w=${ways[$(( (k + r) % ${#ways[@]} ))]}
            log=$OUT/diag/r$r-${n}dev-$w.log
            # shellcheck disable=SC2046
            env $(dev_env "$n") $(way_env "$w") timeout 120 "$BIN/llama-bench" "${args[@]}" -r 1 \
                > "$OUT/diag/r$r-${n}dev-$w.json" 2> "$log"
            python3 - "$OUT/diag/r$r-${n}dev-$w.json" "$log" "$r" "$n" "$w" >> "$OUT/diag/diag.tsv" <<'PY'
import json, re, sys
js, log, r, n, w = sys.argv[1:]
stats = {}
for line in open(log, errors="replace"):
    if "llama_batched_transfers: stats:" in line:
        for k, v in re.findall(r"(\w+)=(\d+)", line.split("stats:", 1)[1]):
            stats[k] = stats.get(k, 0) + int(v)  # every context of the process (one per test)
keys = ("graphs", "async_uploads", "upstream_uploads", "bytes_up", "pool_waits", "pool_drains", "fallbacks")
try:
    rows = json.load(open(js))
except (OSError, ValueError):
    rows = []
for t in rows:
    test = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
    print("\t".join([r, n, w, test, f"{t['avg_ts']:.2f}"] + [str(stats.get(k, "")) for k in keys]))
PY
        done
    done
done

# 3. medians over rounds, ratios to off (paired per round)
python3 - "$OUT/diag/diag.tsv" > "$OUT/diag/diag.md" <<'PY'
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
ts = defaultdict(dict)
for x in rows:
    ts[(x["devices"], x["test"], x["way"])][x["round"]] = float(x["ts"])
print("| devices | test | way | t/s median | ratio to off (median of rounds, min-max) | rounds | bytes_up | async | upstream | pool_waits | pool_drains |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (n, test, way), by_round in sorted(ts.items()):
    off = ts.get((n, test, "off"), {})
    ratios = [v / off[r] for r, v in by_round.items() if r in off and off[r] > 0]
    last = [x for x in rows if (x["devices"], x["test"], x["way"]) == (n, test, way)][-1]
    rat = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-"
    print(f"| {n} | {test} | {way} | {statistics.median(by_round.values()):.1f} | {rat} | {len(by_round)} | "
          f"{last['bytes_up']} | {last['async_uploads']} | {last['upstream_uploads']} | {last['pool_waits']} | {last['pool_drains']} |")
PY
cat "$OUT/diag/diag.md"
