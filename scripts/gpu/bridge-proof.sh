#!/usr/bin/env bash
# GPU proof of the mapped pinned host bridge, for the lent 2-GPU machine (no network there).
# Builds the variants, runs the model-free test (2 GPUs, virtual devices, P2P on), the sanitizers,
# and a first logits comparison + throughput sample. Writes everything under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/bridge-proof.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
repo=$(pwd)
V=/tmp/variants
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv > "$OUT/gpus.csv" 2>&1
nvidia-smi topo -m >> "$OUT/gpus.csv" 2>&1
log "gpus: $(grep -c H200 "$OUT/gpus.csv")"

log "build variants"
scripts/gpu/build-cuda-variants.sh .carry/upstream.tar.gz patches "$V" 90 2>&1 | tee -a "$OUT/summary.txt" || { tail -50 $V/*.log > "$OUT/build-fail.txt"; log "BUILD FAILED"; exit 1; }

T=$V/patched/test-mapped-host-bridge
run_test() { # name, env...
    local name=$1; shift
    log "test $name"
    env "$@" timeout 300 "$T" > "$OUT/t-$name.txt" 2>&1; local rc=$?
    log "  rc=$rc $(tail -n 1 "$OUT/t-$name.txt")"
    grep -E "FAIL|producer waits|counters" "$OUT/t-$name.txt" | head -8 | tee -a "$OUT/summary.txt"
}
run_test 2gpu
run_test 2gpu-4virtual GGML_CUDA_DEVICES=4
run_test 1gpu-2virtual CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2
run_test 2gpu-p2p GGML_CUDA_P2P=1
cat "$OUT"/t-*.txt > "$OUT/tests.txt"; rm -f "$OUT"/t-*.txt

log "models"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$repo
vocab=/tmp/ggml-bridge/src/models/ggml-vocab-llama-spm.gguf
python3 - <<PY 2>&1 | tee -a "$OUT/summary.txt"
import time
from ggml_bridge.model import write_model
for name in ("small", "wide", "bench-3b"):
    t=time.time(); write_model(f"/tmp/{name}.gguf", name, 1234, "$vocab", threads=16); print(name, "written in", round(time.time()-t,1), "s")
PY
python3 -c "
import random
random.seed(7)
words=open('$repo/ggml_bridge/model.py').read().split()
print(' '.join(random.choice(words) for _ in range(12000)))" > /tmp/text.txt

ppl() { # tag model ub env...
    local tag=$1 model=$2 ub=$3; shift 3
    env "$@" GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 timeout 240 "$bin/llama-perplexity" -m "$model" -f /tmp/text.txt -c 1024 -b 1024 -ub "$ub" \
        -ngl 99 -sm layer --chunks 4 -lv 4 --kl-divergence-base "/tmp/kl-$tag.bin" > "/tmp/ppl-$tag.log" 2>&1
    local rc=$?
    local sum=$(sha256sum "/tmp/kl-$tag.bin" 2>/dev/null | cut -c1-16)
    log "  ppl $tag rc=$rc sha=$sum $(grep -E 'mapped_host_bridge: (enabled|inactive|stats)|pipeline parallelism' "/tmp/ppl-$tag.log" | tr '\n' ' ')"
}
for m in small wide; do
  for ub in 512 $([ $m = small ] && echo 64); do
    log "logits $m ub=$ub"
    bin=$V/upstream ppl "$m-$ub-upstream" /tmp/$m.gguf $ub
    bin=$V/patched  ppl "$m-$ub-off" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=0
    bin=$V/patched  ppl "$m-$ub-on" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=1
    bin=$V/patched  ppl "$m-$ub-force" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=force
    bin=$V/patched  ppl "$m-$ub-force-4v" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_DEVICES=4
    bin=$V/patched  ppl "$m-$ub-force-6v" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_DEVICES=6
    bin=$V/patched  ppl "$m-$ub-force-1gpu-3v" /tmp/$m.gguf $ub GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_DEVICES=3 CUDA_VISIBLE_DEVICES=0
    bin=$V/nopeer   ppl "$m-$ub-nopeer" /tmp/$m.gguf $ub
    ( cd /tmp && sha256sum kl-$m-$ub-*.bin ) | tee -a "$OUT/summary.txt"
  done
done
tail -n 30 /tmp/ppl-wide-512-force.log > "$OUT/ppl-wide-force-tail.txt"

log "boundary microbenchmark"
"$T" --bench > "$OUT/microbench.csv" 2>/dev/null; log "  rc=$? (no P2P: peer = driver-staged)"
GGML_CUDA_P2P=1 "$T" --bench | sed 's/^bench,peer,/bench,peer-p2p,/' | grep "^bench,peer-p2p" >> "$OUT/microbench.csv"; log "  rc=$? (P2P: peer = NVLink)"

log "bench bench-3b (pp4096 ub512/ub4096, tg128, -sm layer, 2 GPUs)"
bb() { local tag=$1; shift
    env "$@" GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 timeout 240 "$bin/llama-bench" -m /tmp/bench-3b.gguf -ngl 99 -sm layer -p 4096 -b 4096 -ub 512,4096 -n 128 -r 5 -o json -v > "/tmp/bench-$tag.json" 2>"/tmp/bench-$tag.err"
    log "  $tag rc=$? $(python3 scripts/gpu/bench_summary.py /tmp/bench-$tag.json 2>&1) $(grep -E 'mapped_host_bridge: (enabled|inactive|stats)' /tmp/bench-$tag.err | tail -2 | tr '\n' ' ')"
}
bin=$V/upstream bb upstream-p2p GGML_CUDA_P2P=1
bin=$V/upstream bb upstream-staged
bin=$V/nopeer   bb upstream-nopeer
bin=$V/patched  bb bridge-on GGML_CUDA_MAPPED_HOST_BRIDGE=1
bin=$V/patched  bb bridge-force GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_P2P=1
bin=$V/patched  bb patched-off-p2p GGML_CUDA_MAPPED_HOST_BRIDGE=0 GGML_CUDA_P2P=1
python3 - <<PY > "$OUT/bench.json"
import json,glob,os
print(json.dumps({os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob('/tmp/bench-*.json'))}, indent=1))
PY
for tool in memcheck racecheck synccheck; do
    log "compute-sanitizer $tool"
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 "$T" --quick > "$OUT/san-$tool.txt" 2>&1
    log "  rc=$? $(grep -E 'ERROR SUMMARY|passed' "$OUT/san-$tool.txt" | tr '\n' ' ')"
done
cat "$OUT"/san-*.txt > "$OUT/sanitizers.txt"; rm -f "$OUT"/san-*.txt

log "done"
