#!/usr/bin/env bash
# GPU checks of the bridge's part of issue 14 (items 1, 5, 6, 7, 9 and the exported counters), on the lent
# 2-GPU machine: builds the variants unless $V has them, then
#   - test-mapped-host-bridge on 2 GPUs, 4 virtual devices, 1 GPU as 2, with GGML_CUDA_P2P=1 (per-pair
#     routing from the peer access actually enabled), with the trace on, and with every rejected selector
#     value of the issue (the test mutes a first set of backends as -fit does; the warning must still come);
#   - llama-server and llama-perplexity (default -fit) with GGML_CUDA_MAPPED_HOST_BRIDGE=yes / _CHUNK_KIB=abc:
#     the warning must be in their logs; GGML_SCHED_DEBUG marks and trace lines of a bridged run;
#   - the CUDA ladder's two rungs with the bridge-typo mode;
#   - test-mapped-host-bridge --bench: the side-by-side table of the bridge pipelines (strategy x chunk)
#     against one-way D2H/H2D and upstream's peer copy, 16 KiB .. 64 MiB.
# Usage (repo root): OUT=/tmp/out scripts/gpu/bridge-issue14.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/test-mapped-host-bridge ] || build_variants
T=$V/patched/test-mapped-host-bridge
python_env

test_bridge $T "2gpu" "4virt GGML_CUDA_DEVICES=4" "1gpu-2virt CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2" \
    "2gpu-p2p GGML_CUDA_P2P=1" "2gpu-force-env GGML_CUDA_MAPPED_HOST_BRIDGE=force" \
    "2gpu-trace GGML_CUDA_MAPPED_HOST_BRIDGE_TRACE=1" "2gpu-stream GGML_CUDA_MAPPED_HOST_BRIDGE_STRATEGY=stream"
# every rejected value of the issue; --quick keeps each run short
i=0
for v in yes 2 FORCE -1; do
    TEST_ARGS=--quick run_test_program $T 90 "rejected selector|stats" "mode-$i GGML_CUDA_MAPPED_HOST_BRIDGE=$v"
    i=$((i+1))
done
for v in abc 0 63 100000000; do
    TEST_ARGS=--quick run_test_program $T 90 "rejected selector|stats" "chunk-$v GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB=$v"
done
# run_test_program splits its configuration on spaces: the values " 1" and "" need env directly
for v in " 1" ""; do
    GGML_CUDA_MAPPED_HOST_BRIDGE="$v" timeout 90 $T --quick > /tmp/t-sp.txt 2>&1
    log "test-mapped-host-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=\"$v\" rc=$? $(grep -E 'rejected selector|FAIL' /tmp/t-sp.txt | head -3 | tr '\n' ' ') $(tail -n 1 /tmp/t-sp.txt)"
done

write_models small
for v in "GGML_CUDA_MAPPED_HOST_BRIDGE=yes" "GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB=abc" "GGML_CUDA_MAPPED_HOST_BRIDGE= "; do
    env "$v" timeout 120 $V/patched/llama-perplexity -m /tmp/small.gguf -f /tmp/ggml-bridge/src/README.md -c 512 --chunks 1 \
        -ngl 99 -sm layer > /tmp/ppl-typo.txt 2>&1
    log "perplexity (default -fit, default verbosity) $v rc=$? warning lines: $(grep -c 'ignoring invalid' /tmp/ppl-typo.txt): $(grep 'ignoring invalid' /tmp/ppl-typo.txt | sort | uniq -c | tr '\n' ' ')"
done
GGML_SCHED_DEBUG=1 GGML_CUDA_MAPPED_HOST_BRIDGE=1 GGML_CUDA_MAPPED_HOST_BRIDGE_TRACE=1 GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 \
    timeout 120 $V/patched/llama-perplexity -m /tmp/small.gguf -f /tmp/ggml-bridge/src/README.md -c 512 --chunks 1 \
    -ngl 99 -sm layer -lv 5 > /tmp/ppl-trace.txt 2>&1
log "perplexity sched-debug+trace rc=$?: $(grep -c 'via mapped-host-bridge' /tmp/ppl-trace.txt) marked split inputs, $(grep -c 'bridge: trace: boundary' /tmp/ppl-trace.txt) trace lines; $(grep -E 'bridge: (enabled|stats)' /tmp/ppl-trace.txt | tr '\n' ' ')"
grep -m3 'via mapped-host-bridge' /tmp/ppl-trace.txt | cut -c1-300 | tee -a "$OUT/summary.txt"
grep -m3 'bridge: trace' /tmp/ppl-trace.txt | tee -a "$OUT/summary.txt"

log "CUDA ladder rungs with bridge-typo"
timeout ${LADDER_TIMEOUT:-300} python3 -m ggml_bridge ladder --ladder ladders/cuda.toml --bin-dir-patched $V/patched \
    --bin-dir-upstream $V/upstream --vocab "$vocab" --report /tmp/ladder14 --rung 1gpu-small-ub512 --rung 2gpu-small-ub512 \
    2>&1 | grep -E '^\[|==>' | tee -a "$OUT/summary.txt"
cp /tmp/ladder14/report.md "$OUT/ladder-typo.md" 2>/dev/null

log "boundary microbenchmark (pipelines side by side)"
timeout 300 $T --bench > "$OUT/microbench.txt" 2>/tmp/bench-err.txt; log "  rc=$?"
grep '^|' "$OUT/microbench.txt" | tee -a "$OUT/summary.txt"
log "done"
