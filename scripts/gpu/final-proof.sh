#!/usr/bin/env bash
# Second GPU proof, for the lent 2-GPU machine (no network there): batched transfers (test program, logits),
# the CUDA ladder (subset of rungs that fits one call), and the interleaved side-by-side bench.
# Writes at most 8 files under $OUT (the device tool's limit); Markdown is re-rendered from the JSON.
# Usage (repo root): OUT=/tmp/out scripts/gpu/final-proof.sh [rung ...]
set -uo pipefail
source scripts/gpu/common.sh
rungs=("$@")
[ ${#rungs[@]} -eq 0 ] && rungs=(2gpu-wide-ub4096-128MiB 6card-small-ub256 1gpu-small-ub512)
rung_timeout=(80 60 45)

build_variants
python_env

write_models tiny small
T=$V/patched/test-batched-transfers
if [ -x "$T" ]; then
    for cfg in "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu" "2gpu-bridge GGML_CUDA_MAPPED_HOST_BRIDGE=force"; do
        set -- $cfg; name=$1; shift
        log "test-batched-transfers $name"
        env "$@" timeout 60 "$T" --model /tmp/tiny.gguf > /tmp/tb-$name.txt 2>&1; rc=$?
        log "  rc=$rc $(tail -n 1 /tmp/tb-$name.txt)"
        grep -E "FAIL|main: |stats|logits" /tmp/tb-$name.txt | head -10 | tee -a "$OUT/summary.txt"
        { echo "== $name rc=$rc"; cat /tmp/tb-$name.txt; } >> "$OUT/tests.txt"
    done
else
    log "no test-batched-transfers target in the series"
fi

log "logits: batched off/on (1 and 2 GPUs), with the bridge"
python3 -c "
import random
random.seed(7)
words=open('$repo/ggml_bridge/model.py').read().split()
print(' '.join(random.choice(words) for _ in range(12000)))" > /tmp/text.txt
ppl() { local tag=$1 bin=$2; shift 2
    env "$@" GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 SAM3D_BATCHED_TRANSFERS_STATS=1 timeout 120 "$bin/llama-perplexity" \
        -m /tmp/small.gguf -f /tmp/text.txt -c 512 -b 512 -ub 128 -ngl 99 -sm layer --chunks 4 -lv 4 \
        --kl-divergence-base "/tmp/kl-$tag.bin" > "/tmp/ppl-$tag.log" 2>&1
    log "  $tag rc=$? sha=$(sha256sum /tmp/kl-$tag.bin | cut -c1-16) $(grep -E '(mapped_host_bridge|batched_transfers): (enabled|inactive|stats)' /tmp/ppl-$tag.log | sed 's/^.*\(ggml_cuda_mapped\|llama_batched\)/\1/' | tr '\n' ' ')"
}
ppl 1gpu-upstream $V/upstream CUDA_VISIBLE_DEVICES=0
ppl 1gpu-off      $V/patched  CUDA_VISIBLE_DEVICES=0 SAM3D_BATCHED_TRANSFERS=0
ppl 1gpu-batched  $V/patched  CUDA_VISIBLE_DEVICES=0 SAM3D_BATCHED_TRANSFERS=1
ppl 2gpu-upstream $V/upstream
ppl 2gpu-batched  $V/patched  SAM3D_BATCHED_TRANSFERS=1
ppl 2gpu-both     $V/patched  SAM3D_BATCHED_TRANSFERS=1 GGML_CUDA_MAPPED_HOST_BRIDGE=1
ppl 6v-both       $V/patched  SAM3D_BATCHED_TRANSFERS=1 GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_DEVICES=6

log "CUDA ladder: ${rungs[*]}"
i=0
for r in "${rungs[@]}"; do
    i=$((i+1)); t=${rung_timeout[$((i-1))]:-60}
    timeout $t python3 -m ggml_bridge ladder --ladder ladders/cuda.toml --bin-dir-patched $V/patched \
        --bin-dir-upstream $V/upstream --vocab "$vocab" --report /tmp/ladder-$i --rung "$r" > /tmp/ladder-$i.out 2>&1
    log "  ladder $r rc=$? $(grep -E 'PASS|FAIL|INVALID|MISMATCH' /tmp/ladder-$i.out | tail -n 3 | tr '\n' ' ')"
    cp /tmp/ladder-$i/report.json "$OUT/ladder-$i.json" 2>/dev/null || tail -n 25 /tmp/ladder-$i.out >> "$OUT/summary.txt"
done

log "bench multi-gpu (interleaved)"
run_bench multi 100 --suite multi-gpu --cases p2p,staged,nopeer,bridge --rounds 2 --reps 3 --vocab "$vocab"

log "bench batched (1 GPU, interleaved)"
run_bench batched 60 --suite batched --rounds 3 --reps 3 --vocab "$vocab"
log "done"
