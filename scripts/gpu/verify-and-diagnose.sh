#!/usr/bin/env bash
# GPU call 1 of a session on the 2-GPU machine: build the three CUDA variants, run both model-free test
# programs, diagnose the large-ubatch (128 MiB boundary) figures case by case with nvidia-smi sampled
# alongside, and bench batched transfers on 1 and 2 GPUs. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/verify-and-diagnose.sh
set -uo pipefail
source scripts/gpu/common.sh

build_variants
python_env

log "models"
python3 -c "
from ggml_bridge.model import write_model
write_model('/tmp/tiny.gguf','tiny',1,'$vocab')
write_model('/tmp/bench-1b.gguf','bench-1b',1234,'$vocab',threads=16)
write_model('/tmp/bench-3b.gguf','bench-3b',1234,'$vocab',threads=16)" 2>&1 | tail -3
log "models written"

test_batched $V/patched/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"
test_bridge $V/patched/test-mapped-host-bridge "2gpu" "4virt GGML_CUDA_DEVICES=4"

log "ub4096 diagnosis (nvidia-smi sampled every 50 ms)"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
date +%s.%N > /tmp/smi-start
timeout 200 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 3 --reps 6 \
    --cases p2p,bridge,bridge-c8M,bridge-c64M,bridge-force-p2p,staged 2>&1 | tee -a "$OUT/summary.txt"
kill $smi 2>/dev/null

log "bench batched (1 GPU, interleaved)"
timeout 70 python3 -m ggml_bridge bench --variants-dir $V --suite batched --rounds 4 --reps 3 --no-microbench \
    --model /tmp/bench-1b.gguf --report /tmp/bench-batched > /tmp/bench-batched.out 2>&1
log "  rc=$? $(grep -E 'round|NOT ENGAGED|error' /tmp/bench-batched.out | tail -n 8 | tr '\n' ' ')"
cp /tmp/bench-batched/bench.json "$OUT/bench-batched.json" 2>/dev/null
log "bench batched-multi (2 GPUs, interleaved)"
timeout 90 python3 -m ggml_bridge bench --variants-dir $V --suite batched-multi --rounds 2 --reps 3 --no-microbench \
    --model /tmp/bench-1b.gguf --report /tmp/bench-bm > /tmp/bench-bm.out 2>&1
log "  rc=$? $(grep -E 'round|NOT ENGAGED|error' /tmp/bench-bm.out | tail -n 8 | tr '\n' ' ')"
cp /tmp/bench-bm/bench.json "$OUT/bench-batched-multi.json" 2>/dev/null
log "done"
