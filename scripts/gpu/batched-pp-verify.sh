#!/usr/bin/env bash
# GPU call (2x H200) for issue 14 items 2-4, 6 and 8 on the batched side: build the CUDA variants, run the
# batched-transfers test program (1 GPU, 2 GPUs, 2 GPUs with the bridge forced), the counters of one
# 6-virtual-device pp4096 run (prompt ubatches must be declined: declined_graphs > 0, pool_waits 0), then the
# interleaved benches: batched-pp-6dev (GGML_CUDA_DEVICES=6), batched-pp-2gpu (pp512 + pp4096 at -ub 512 -b 4096,
# tg128) and batched (1 GPU, the token-generation gain). Target: no case of "batched"/"both" >= 1 % slower than
# "off"/"bridge" on pp; tg on 1 GPU still faster. At most 8 files under $OUT.
# One GPU command lasts at most 10 minutes: run the steps as separate calls on the same (warm) machine.
# Usage (repo root): OUT=/tmp/out scripts/gpu/batched-pp-verify.sh STEP   (STEP: tests | pp6 | pp2 | tg)
set -uo pipefail
source scripts/gpu/common.sh
step=${1:-tests}

[ -x $V/patched/llama-bench ] || build_variants
python_env
write_models tiny bench-1b bench-2b-6l

if [ "$step" = tests ]; then
test_batched $V/patched/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"

log "counters of one 6-virtual-device run (pp4096 ub512 b4096, tg16, batched)"
GGML_CUDA_DEVICES=6 SAM3D_BATCHED_TRANSFERS=1 SAM3D_BATCHED_TRANSFERS_STATS=1 timeout 120 $V/patched/llama-bench \
    -m /tmp/bench-2b-6l.gguf -p 4096 -b 4096 -ub 512 -n 16 -r 2 -sm layer -ngl 99 -o md -v > /tmp/pp6-stats.txt 2>&1
log "  rc=$? $(grep -E 'pp4096|tg16' /tmp/pp6-stats.txt | tr -s ' ' | cut -c1-160 | tr '\n' ' ')"
grep -E "llama_batched_transfers: (enabled|stats)" /tmp/pp6-stats.txt | sort | uniq -c | head -4 | tee -a "$OUT/summary.txt"

fi
if [ "$step" = pp6 ]; then
log "bench batched-pp-6dev"
run_bench batched-pp-6dev 560 --suite batched-pp-6dev --rounds 6 --reps 3 --time-budget 540 --model /tmp/bench-2b-6l.gguf
fi
if [ "$step" = pp2 ]; then
log "bench batched-pp-2gpu"
run_bench batched-pp-2gpu 560 --suite batched-pp-2gpu --rounds 6 --reps 3 --time-budget 540 --model /tmp/bench-2b-6l.gguf
fi
if [ "$step" = tg ]; then
log "bench batched (1 GPU: tg gain kept)"
run_bench batched 560 --suite batched --rounds 8 --reps 3 --time-budget 540 --model /tmp/bench-1b.gguf
fi
log "done $step"
