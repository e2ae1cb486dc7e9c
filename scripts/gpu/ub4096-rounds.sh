#!/usr/bin/env bash
# GPU call (2-GPU machine): issue 3's ub4096 figure with as many short processes as fit, so that P2P, the bridge
# and NO_PEER_COPY see the same mix of this machine's two speed modes (docs/bench.md, "the slow mode without any
# transfer"): pp4096 with -ub 4096 only, no tg, interleaved rounds of 3 kept repetitions until the call's time is
# spent (--time-budget; ROUNDS is only a ceiling). CASES adds p2p-patched by default: upstream's P2P path in our
# binary, a control for "is it the binary or the copy". nvidia-smi samples clocks, power, temperatures and
# throttle reasons every 100 ms alongside, so that slow processes can be matched with the GPUs' state.
# Builds the variants first if this machine has none (the budget shrinks accordingly).
# Usage (repo root): OUT=/tmp/out [CALL_LIMIT=590] [ROUNDS=100] [CASES=...] scripts/gpu/ub4096-rounds.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || build_variants
python_env
[ -f /tmp/bench-3b.gguf ] || { log "write bench-3b"; python3 -c "from ggml_bridge.model import write_model; write_model('/tmp/bench-3b.gguf','bench-3b',1234,'$vocab',threads=16)"; }
budget=$(( ${CALL_LIMIT:-590} - SECONDS - 30 ))            # leave room for the report and the copy to $OUT
q=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active,utilization.gpu
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -c 1 >/dev/null 2>&1 || q=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
echo "$q" > "$OUT/smi.csv"
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -lms 100 >> "$OUT/smi.csv" 2>/dev/null & smi=$!
rep=/tmp/ub4096-$(date +%s)
log "bench multi-gpu, ub4096 only, ${CASES:=p2p,p2p-patched,bridge,nopeer}, budget ${budget} s"
python3 -m ggml_bridge bench --variants-dir $V --suite multi-gpu --cases "$CASES" --ubatch 4096 --tg 0 \
    --rounds ${ROUNDS:-100} --time-budget $budget --reps 3 --no-microbench --model /tmp/bench-3b.gguf --report $rep \
    > /tmp/ub4096.out 2>&1
log "  rc=$? $(grep -E 'stopping|NOT ENGAGED|rror' /tmp/ub4096.out | tail -n 3 | tr '\n' ' ')"
kill $smi 2>/dev/null
cp $rep/bench.json "$OUT/bench-ub4096.json" 2>/dev/null
cp $rep/bench.md "$OUT/bench-ub4096.md" 2>/dev/null
gzip -f "$OUT/smi.csv"
grep "^|" $rep/bench.md | tee -a "$OUT/summary.txt"
python3 scripts/gpu/pool_rounds.py --smi "$OUT/smi.csv.gz" "$OUT/bench-ub4096.json" 2>&1 | tee -a "$OUT/summary.txt"
log "done"
