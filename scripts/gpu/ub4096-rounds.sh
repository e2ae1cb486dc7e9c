#!/usr/bin/env bash
# GPU call (2-GPU machine): issue 3's ub4096 figure with as many short processes as fit, so that P2P, the bridge
# and NO_PEER_COPY see the same mix of this machine's two speed modes (docs/bench.md, "the slow mode without any
# transfer"): pp4096 with -ub 4096 only, no tg, ROUNDS interleaved rounds (default 30) of 3 kept repetitions.
# Builds the variants first if this machine has none. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out [ROUNDS=30] scripts/gpu/ub4096-rounds.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || build_variants
python_env
[ -f /tmp/bench-3b.gguf ] || python3 -c "from ggml_bridge.model import write_model; write_model('/tmp/bench-3b.gguf','bench-3b',1234,'$vocab',threads=16)"
log "bench multi-gpu, ub4096 only, ${ROUNDS:-30} rounds"
timeout ${BENCH_TIMEOUT:-540} python3 -m ggml_bridge bench --variants-dir $V --suite multi-gpu --cases p2p,bridge,nopeer \
    --ubatch 4096 --tg 0 --rounds ${ROUNDS:-30} --reps 3 --no-microbench --model /tmp/bench-3b.gguf --report /tmp/ub4096 \
    > /tmp/ub4096.out 2>&1
log "  rc=$? $(grep -E 'NOT ENGAGED|rror' /tmp/ub4096.out | tail -n 3 | tr '\n' ' ')"
cp /tmp/ub4096/bench.json "$OUT/bench-ub4096.json" 2>/dev/null
cp /tmp/ub4096/bench.md "$OUT/bench-ub4096.md" 2>/dev/null
grep "^|" /tmp/ub4096/bench.md | tee -a "$OUT/summary.txt"
log "done"
