#!/usr/bin/env bash
# GPU call: is the slow mode of pp4096/ub4096 (all paths drop from ~42k to ~33k t/s in some processes) CPU
# oversubscription? The same cases with llama-bench's default threads and with -t 8, rotating, nvidia-smi alongside;
# then a longer interleaved batched-transfers tg bench on one GPU. At most 8 files under $OUT.
set -uo pipefail
source scripts/gpu/common.sh
build_variants
python_env
write_models bench-1b bench-3b
log "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
start_smi "$OUT/smi.csv" 100
for i in 1 2; do
    timeout 100 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 2 --reps 5 \
        --cases p2p,bridge,staged 2>&1 | tee -a "$OUT/summary.txt"
    timeout 100 python3 scripts/gpu/ub-diag.py "$V" /tmp/bench-3b.gguf "$OUT/diag.jsonl" --rounds 2 --reps 5 \
        --cases p2p,bridge,staged --extra="-t 8" --tag=-t8 2>&1 | tee -a "$OUT/summary.txt"
done
stop_smi
log "bench batched (1 GPU, interleaved)"
run_bench batched 100 --suite batched --rounds 8 --reps 4 --model /tmp/bench-1b.gguf
log "done"
