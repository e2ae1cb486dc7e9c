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

# run a model-free test program under each configuration "name [ENV=VALUE ...]": outcome and the lines matching
# PATTERN to the summary, whole output to $OUT/tests.txt
# usage: run_test_program BIN TIMEOUT PATTERN CONFIG... (BIN's extra arguments in $TEST_ARGS)
run_test_program() {
    local bin=$1 limit=$2 pattern=$3 prog cfg name rc; shift 3
    prog=$(basename "$bin")
    for cfg in "$@"; do
        set -- $cfg; name=$1; shift
        env "$@" timeout "$limit" "$bin" ${TEST_ARGS:-} > /tmp/$prog-$name.txt 2>&1; rc=$?
        log "$prog $name rc=$rc $(tail -n 1 /tmp/$prog-$name.txt)"
        grep -E "FAIL|$pattern" /tmp/$prog-$name.txt | head -8 | tee -a "$OUT/summary.txt"
        { echo "== $prog $name"; cat /tmp/$prog-$name.txt; } >> "$OUT/tests.txt"
    done
}
# the two programs of the series, with their usual model and summary lines
test_batched() { TEST_ARGS="--model /tmp/tiny.gguf" run_test_program "$1" 60 "^(main|pipeline|second-gpu|mock-in-flight[a-z-]*): stats" "${@:2}"; }
test_bridge()  { run_test_program "$1" 90 "stats" "${@:2}"; }
