#!/usr/bin/env bash
# GPU call 1 of a session on the 2-GPU machine: build the three CUDA variants, run both model-free test
# programs, diagnose the large-ubatch (128 MiB boundary) figures case by case with nvidia-smi sampled
# alongside, and bench batched transfers on 1 and 2 GPUs. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/verify-and-diagnose.sh
set -uo pipefail
source scripts/gpu/common.sh

build_variants
python_env

write_models tiny bench-1b bench-3b

test_batched $V/patched/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"
test_bridge $V/patched/test-mapped-host-bridge "2gpu" "4virt GGML_CUDA_DEVICES=4"

log "ub4096 diagnosis (nvidia-smi sampled every 50 ms)"
start_smi "$OUT/smi.csv" 50
timeout 200 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 3 --reps 6 \
    --cases p2p,bridge,bridge-c8M,bridge-c64M,bridge-force-p2p,staged 2>&1 | tee -a "$OUT/summary.txt"
stop_smi

log "bench batched (1 GPU, interleaved)"
run_bench batched 70 --suite batched --rounds 4 --reps 3 --model /tmp/bench-1b.gguf
log "bench batched-multi (2 GPUs, interleaved)"
run_bench batched-multi 90 --suite batched-multi --rounds 2 --reps 3 --model /tmp/bench-1b.gguf
log "done"
