# Sourced by the GPU-call scripts in this folder (run from the repo root on a lent GPU machine, no network):
# the environment every call needs, $OUT and log(), and the steps most calls share.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GGML_BRIDGE_CACHE_DIR=/tmp/gb-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
repo=$(pwd)
V=/tmp/variants                                           # upstream/, nopeer/, patched/ (build-cuda-variants.sh)
vocab=/tmp/ggml-bridge/src/models/ggml-vocab-llama-spm.gguf
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/summary.txt"; }

# the three CUDA variants from the carried upstream tarball and this checkout's patches (sm_90)
build_variants() {
    log "build variants"
    scripts/gpu/build-cuda-variants.sh .carry/upstream.tar.gz patches "$V" 90 2>&1 | tee -a "$OUT/summary.txt" \
        || { tail -40 $V/build-patched.log >> "$OUT/summary.txt"; log "BUILD FAILED"; exit 1; }
}

# ggml-bridge's Python dependencies that the machine lacks (the gguf wheel carried in .whl/)
python_env() {
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$repo
}
