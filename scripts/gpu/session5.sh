#!/usr/bin/env bash
# Session 5, call 1 (2x H200): the merged series (0001-0006) built as the three CUDA variants, then the two test
# programs and the bridge's side-by-side boundary microbenchmark. Usage (repo root): OUT=/tmp/out scripts/gpu/session5.sh
set -uo pipefail
source scripts/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
build_variants
python_env
write_models tiny
test_bridge $V/patched/test-mapped-host-bridge "2gpu" "2gpu-trace GGML_CUDA_MAPPED_HOST_BRIDGE_TRACE=1" "2gpu-stream GGML_CUDA_MAPPED_HOST_BRIDGE_STRATEGY=stream"
TEST_ARGS=--quick run_test_program $V/patched/test-mapped-host-bridge 60 "rejected selector|stats" "mode-yes GGML_CUDA_MAPPED_HOST_BRIDGE=yes"
test_batched $V/patched/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"
log "boundary microbenchmark"
timeout 120 $V/patched/test-mapped-host-bridge --bench > "$OUT/microbench.txt" 2>&1; log "  rc=$?"
grep '^|' "$OUT/microbench.txt" | tee -a "$OUT/summary.txt"
log done
