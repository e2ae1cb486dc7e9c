#!/usr/bin/env bash
# Session 5, call 2 (2x H200): the series with the bridge's default pipeline set from call 1's table (stream, 8 MiB
# chunks); the bridge test program and the boundary microbenchmark again, the batched counters of one 6-virtual-device
# pp4096 run (the decline policy), and a short time-budgeted batched-pp-6dev bench. Usage: OUT=/tmp/out scripts/gpu/session5b.sh
set -uo pipefail
source scripts/gpu/common.sh
build_variants
python_env
test_bridge $V/patched/test-mapped-host-bridge "2gpu" "4virt GGML_CUDA_DEVICES=4"
timeout 120 $V/patched/test-mapped-host-bridge --bench > "$OUT/microbench.txt" 2>&1; log "microbench rc=$?"
grep '^|' "$OUT/microbench.txt" | tee -a "$OUT/summary.txt"
write_models bench-2b-6l
log "counters of one 6-virtual-device run (pp4096 ub512 b4096, tg16, batched)"
GGML_CUDA_DEVICES=6 SAM3D_BATCHED_TRANSFERS=1 SAM3D_BATCHED_TRANSFERS_STATS=1 timeout 120 $V/patched/llama-bench \
    -m /tmp/bench-2b-6l.gguf -p 4096 -b 4096 -ub 512 -n 16 -r 2 -sm layer -ngl 99 -o md -v > /tmp/pp6-stats.txt 2>&1
log "  rc=$? $(grep -E 'pp4096|tg16' /tmp/pp6-stats.txt | tr -s ' ' | cut -c1-160 | tr '\n' ' ')"
grep -E "llama_batched_transfers: (enabled|stats)" /tmp/pp6-stats.txt | sort | uniq -c | head -4 | tee -a "$OUT/summary.txt"
left=$(( 560 - SECONDS )); log "bench batched-pp-6dev, budget ${left}s"
[ $left -gt 60 ] && run_bench batched-pp-6dev $left --suite batched-pp-6dev --rounds 6 --reps 2 --time-budget $((left - 20)) --model /tmp/bench-2b-6l.gguf
log done
