#!/usr/bin/env bash
# GPU call (2-GPU machine): issue 3's ub4096 figure with as many short processes as fit, so that P2P, the bridge
# and NO_PEER_COPY see the same mix of this machine's two speed modes (docs/bench.md, "the slow mode without any
# transfer"): pp4096 with -ub 4096 only, no tg, interleaved rounds of 3 kept repetitions until the call's time is
# spent (--time-budget; ROUNDS is only a ceiling). CASES adds p2p-patched by default: upstream's P2P path in our
# binary, a control for "is it the binary or the copy". nvidia-smi samples clocks, power, temperature and
# throttle reasons every 100 ms alongside, so that slow processes can be matched with the GPUs' state.
# Builds the variants first if this machine has none (the budget shrinks accordingly).
# Usage (repo root): OUT=/tmp/out [CALL_LIMIT=590] [ROUNDS=100] [CASES=...] scripts/gpu/ub4096-rounds.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || build_variants
python_env
write_models bench-3b
budget=$(( ${CALL_LIMIT:-590} - SECONDS - 30 ))   # rounds; the last 30 s: the report and the copy to $OUT
start_smi "$OUT/smi.csv" 100
log "bench multi-gpu, ub4096 only, ${CASES:=p2p,p2p-patched,bridge,nopeer}, budget ${budget} s"
run_bench ub4096 $((budget + 30)) --suite multi-gpu --cases "$CASES" --ubatch 4096 --tg 0 --rounds ${ROUNDS:-100} \
    --time-budget $budget --reps 3 --model /tmp/bench-3b.gguf
stop_smi
gzip -f "$OUT/smi.csv"
python3 scripts/gpu/pool_rounds.py --smi "$OUT/smi.csv.gz" "$OUT/bench-ub4096.json" 2>&1 | tee -a "$OUT/summary.txt"
log "done"
