#!/usr/bin/env bash
# GPU call 1 of a session on the 2-GPU machine: build the three CUDA variants, run the batched-transfers test
# program (1 GPU, 2 GPUs, 2 GPUs with the bridge forced), then the question the pool ring answers: with pipeline
# parallelism (pp2048, ub512: 4 ubatches queued without a synchronization) batched transfers must not be slower
# than off; the counters of one such run (pool waits and drains) go to the summary. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/pipeline-verify.sh
set -uo pipefail
source scripts/gpu/common.sh

build_variants
python_env

write_models tiny bench-1b

test_batched $V/patched/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"

log "counters of one pipeline-parallel run (2 GPUs, pp2048 ub512, batched, then with the bridge)"
for sel in "SAM3D_BATCHED_TRANSFERS=1" "SAM3D_BATCHED_TRANSFERS=1 GGML_CUDA_MAPPED_HOST_BRIDGE=1"; do
    env $sel SAM3D_BATCHED_TRANSFERS_STATS=1 GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 timeout 60 $V/patched/llama-bench \
        -m /tmp/bench-1b.gguf -p 2048 -b 2048 -ub 512 -n 0 -r 3 -o md -v > /tmp/pp-stats.txt 2>&1
    log "  $sel rc=$? $(grep -E 'pp2048' /tmp/pp-stats.txt | tr -s ' ' | cut -c1-160)"
    grep -E "llama_batched_transfers: stats|mapped_host_bridge: stats|pipeline parallel" /tmp/pp-stats.txt | sort | uniq -c | head -6 | tee -a "$OUT/summary.txt"
done

log "bench batched-pipeline (2 GPUs, pp2048 ub512, interleaved)"
run_bench batched-pipeline 200 --suite batched-pipeline --rounds 5 --reps 4 --model /tmp/bench-1b.gguf
log "done"
