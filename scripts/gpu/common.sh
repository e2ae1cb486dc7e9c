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

# write the random models /tmp/NAME.gguf that are not there yet, in one Python process (tiny: seed 1, others 1234)
write_models() {
    local missing=() n
    for n in "$@"; do [ -f /tmp/$n.gguf ] || missing+=("$n"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "write models ${missing[*]}"
    python3 -c "
import sys
from ggml_bridge.model import write_model
for n in sys.argv[2:]:
    write_model(f'/tmp/{n}.gguf', n, 1 if n == 'tiny' else 1234, sys.argv[1], threads=16)" "$vocab" "${missing[@]}" 2>&1 | tail -3
}

# one `ggml-bridge bench` of the variants in $V, into a fresh report folder (so that a failed run can never hand on
# an earlier call's report): rc and the last round lines to the summary, then the report's table; the report to
# $OUT/bench-NAME.json (its Markdown is rendered from it). usage: run_bench NAME TIMEOUT BENCH-ARGS...
run_bench() {
    local name=$1 limit=$2 rep rc; shift 2
    rep=$(mktemp -d /tmp/bench-$name.XXXXXX)
    timeout "$limit" python3 -m ggml_bridge bench --variants-dir $V --no-microbench --report $rep/report "$@" \
        > $rep/out.txt 2>&1; rc=$?
    log "  bench $name rc=$rc $(grep -E 'round|stopping|NOT ENGAGED|rror' $rep/out.txt | tail -n 20 | tr '\n' ' ')"
    cp $rep/report/bench.json "$OUT/bench-$name.json" 2>/dev/null && grep "^|" $rep/report/bench.md | tee -a "$OUT/summary.txt"
}

# nvidia-smi sampled every MS milliseconds into FILE, a header line first, until stop_smi (throttle reasons left
# out where the driver does not know that field). usage: start_smi FILE MS
start_smi() {
    local q=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active
    nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -c 1 >/dev/null 2>&1 || q=${q%,clocks_event_reasons.active}
    echo "$q" > "$1"
    nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -lms "$2" >> "$1" 2>/dev/null & smi_pid=$!
}
stop_smi() { kill $smi_pid 2>/dev/null; }
