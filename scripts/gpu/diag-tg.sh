#!/usr/bin/env bash
# GPU call on the warm 2-GPU machine after pipeline-verify.sh: the bridge's test program (2 GPUs, 4 virtual
# devices), the GPUs' power and clock settings, the ub4096 placement question (placement-diag.sh), and more
# interleaved rounds of the 1-GPU token-generation bench (batched against off). At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/diag-tg.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || { log "no build in $V: run pipeline-verify.sh first on this machine"; exit 2; }
python_env

test_bridge $V/patched/test-mapped-host-bridge "2gpu" "4virt GGML_CUDA_DEVICES=4"
nvidia-smi --query-gpu=index,power.limit,enforced.power.limit,power.default_limit,power.max_limit,clocks.max.sm,clocks.applications.graphics \
    --format=csv 2>&1 | tee -a "$OUT/summary.txt"

log "bench batched (1 GPU, tg, interleaved)"
write_models bench-1b
run_bench batched 150 --suite batched --rounds 10 --reps 4 --model /tmp/bench-1b.gguf

OUT=$OUT/placement scripts/gpu/placement-diag.sh
log "done"
