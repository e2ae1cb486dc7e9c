#!/usr/bin/env bash
# GPU call: is the slow mode of pp4096/ub4096 (all paths drop from ~42k to ~33k t/s in some processes) CPU
# oversubscription? The same cases with llama-bench's default threads and with -t 8, rotating, nvidia-smi alongside;
# then a longer interleaved batched-transfers tg bench on one GPU. At most 8 files under $OUT.
set -uo pipefail
source scripts/gpu/common.sh
build_variants
python_env
python3 -c "
from ggml_bridge.model import write_model
write_model('/tmp/bench-1b.gguf','bench-1b',1234,'$vocab',threads=16)
write_model('/tmp/bench-3b.gguf','bench-3b',1234,'$vocab',threads=16)"
log "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 100 > "$OUT/smi.csv" 2>&1 &
smi=$!
for i in 1 2; do
    timeout 100 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 2 --reps 5 \
        --cases p2p,bridge,staged 2>&1 | tee -a "$OUT/summary.txt"
    timeout 100 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 2 --reps 5 \
        --cases p2p,bridge,staged --extra="-t 8" --tag=-t8 2>&1 | tee -a "$OUT/summary.txt"
done
kill $smi 2>/dev/null
log "bench batched (1 GPU, interleaved)"
timeout 100 python3 -m ggml_bridge bench --variants-dir $V --suite batched --rounds 8 --reps 4 --no-microbench \
    --model /tmp/bench-1b.gguf --report /tmp/bench-batched > /tmp/bench-batched.out 2>&1
log "  rc=$? $(grep -E 'round|NOT ENGAGED|error' /tmp/bench-batched.out | tail -n 16 | tr '\n' ' ')"
cp /tmp/bench-batched/bench.json "$OUT/bench-batched.json" 2>/dev/null
log "done"
