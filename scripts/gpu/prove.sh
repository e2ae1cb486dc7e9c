#!/usr/bin/env bash
# The GPU proof in one call on a lent machine without network, through the product's own CLI:
#   1. `ggml-bridge build` of the three CUDA variants of the pinned upstream in one tree (--shared-tree), each with
#      its manifest;
#   2. the series' test programs (bridge on 2 GPUs, rejected selector values; batched transfers);
#   3. CUDA ladder rungs (ladders/cuda.toml), the most telling first, one report each;
#   4. `ggml-bridge bench` suites (bridge vs upstream P2P / NO_PEER_COPY on 2 GPUs, batched on 1 GPU);
#   5. the RPC rungs;
# each step only when the time left (BUDGET seconds from the start) allows it, so that a short call still returns
# complete reports of what it ran. $OUT gets summary.txt and results.tar.gz (every report, log and manifest).
#
# Carry (git-ignored, see scripts/gpu/README.md): .carry/<sdist named in pin.toml> and .whl/ (gitpython, gitdb,
# smmap, gguf wheels for Python 3.12).
# Usage, from the repository root:  OUT=/tmp/out BUDGET=560 bash scripts/gpu/prove.sh [STEP ...]
#   STEP: build tests ladder bench rpc ladder-rest (default: all, in this order)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-/tmp/gb-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-580}
STEPS=${*:-build tests ladder bench rpc ladder-rest}
repo=$(pwd)

log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((BUDGET - SECONDS)); }
# run "NAME NEED_S LIMIT_S command...": only when NEED_S seconds are left; killed after min(LIMIT_S, time left)
step() {
    local name=$1 need=$2 limit=$3 rc; shift 3
    if [ "$(left)" -lt "$need" ]; then log "SKIPPED $name: $(left)s left, needs ~${need}s"; return 0; fi
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    log "$name (limit ${limit}s)"
    timeout --kill-after=5 "$limit" "$@" > "$OUT/$name.txt" 2>&1; rc=$?
    log "  $name rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)')"
    return $rc
}
# a lent machine returns only a few files of $OUT: on every exit, everything but the summary becomes one archive
bundle() {
    tar czf /tmp/prove-results.tar.gz -C "$OUT" --exclude=./summary.txt . \
        && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/prove-results.tar.gz "$OUT/results.tar.gz"
}
trap bundle EXIT
gb=(python3 -m ggml_bridge)  # `timeout` runs programs, not shell functions
want() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader | tee -a "$OUT/summary.txt"
# one GPU: no NO_PEER_COPY variant (nothing to copy between GPUs), virtual cards (GGML_CUDA_DEVICES) with the bridge
# forced stand in for the second card, ladders/cuda-1gpu.toml, and only the one-GPU bench suite
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if [ "$ngpu" -ge 2 ]; then
    variants=upstream,upstream-nopeer,patched ladder_file=ladders/cuda.toml
    first_rungs="2gpu-small-ub512 6card-small-ub256 2gpu-wide-ub4096-128MiB"
    rest_rungs="1gpu-small-ub512 2gpu-tiny-ub1 2gpu-wide-ub2048-64MiB 6card-wide-ub4096-128MiB 2gpu-1b-ub2048 1gpu-1b-ub512 6card-1b-ub1024"
    bridge_test_env=()
else
    variants=upstream,patched ladder_file=ladders/cuda-1gpu.toml
    first_rungs="1gpu-small-ub512 2virt-small-ub512 6virt-small-ub256 2virt-wide-ub4096-128MiB"
    rest_rungs="1gpu-1b-ub512"
    bridge_test_env=(GGML_CUDA_DEVICES=4 GGML_CUDA_MAPPED_HOST_BRIDGE=force)
fi
log "$ngpu GPU(s): variants $variants, ladder $ladder_file"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
# (no `git log` here: the checkout's copy on a lent machine may carry stale git metadata; the manifests say
# exactly what was built: upstream identity, patch hashes and series hash, CMake options)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$repo || { log "cannot install the carried wheels"; exit 1; }
# the pinned sdist, where `ggml-bridge fetch` looks before the network (it checks the sha256 of pin.toml)
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"

if want build; then
    step build 200 400 "${gb[@]}" build --backend cuda --cuda-arch 90 --no-ui --shared-tree \
        --variant "$variants"
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build.txt" | tail -n 30 | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/manifests"
    for v in upstream upstream-nopeer patched; do
        m=$("${gb[@]}" build --backend cuda --variant "$v" --print-manifest 2>/dev/null) \
            && cp "$m" "$OUT/manifests/$v.json"
    done
fi
# the bin folder of a variant's latest build, as the CLI reports it (builds nothing)
bindir() { "${gb[@]}" build --backend cuda --variant "$1" --print-bin-dir 2>/dev/null; }
pbin=$(bindir patched) && ubin=$(bindir upstream) || { log "the CUDA builds are not there: stopping"; exit 1; }
nbin=$(bindir upstream-nopeer) || nbin=
bins=(--bin-dir-patched "$pbin" --bin-dir-upstream "$ubin")
# the vocabulary of the pinned tree (`ggml-bridge fetch` prints the cached tree)
tree=$("${gb[@]}" fetch 2>/dev/null) || { log "cannot locate the pinned tree: stopping"; exit 1; }
vocab=$tree/models/ggml-vocab-llama-spm.gguf

if want tests; then
    # the bridge on both GPUs (every size class, both strategies' paths, ordering), then rejected values after
    # a muted first set of backends, the strategy's rejection naming the strategy in use
    step test-bridge 25 90 env "${bridge_test_env[@]}" "$pbin/test-mapped-host-bridge"
    tail -n 1 "$OUT/test-bridge.txt" | tee -a "$OUT/summary.txt"
    step test-bridge-rejected 8 60 env "${bridge_test_env[@]}" GGML_CUDA_MAPPED_HOST_BRIDGE=yes GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB=abc \
        GGML_CUDA_MAPPED_HOST_BRIDGE_STRATEGY=both "$pbin/test-mapped-host-bridge" --quick
    grep -E "rejected|FAIL|passed" "$OUT/test-bridge-rejected.txt" | tee -a "$OUT/summary.txt"
    python3 -c "from ggml_bridge.model import write_model; import sys; write_model('/tmp/tiny.gguf', 'tiny', 1, sys.argv[1])" \
        "$vocab" > /dev/null 2>&1
    step test-batched 10 60 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
    grep -E "passed|FAIL" "$OUT/test-batched.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
fi

# one ladder report per rung, so that a rung cut short by the budget leaves the others' reports whole
ladder_rung() {
    local r=$1 need=$2
    step "ladder-$r" "$need" 200 "${gb[@]}" ladder --ladder "$ladder_file" --rung "$r" --vocab "$vocab" \
        "${bins[@]}" --report "$OUT/ladder/$r"
    grep -E "^\[|==> ladder" "$OUT/ladder-$r.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
    rm -f "$OUT"/ladder/"$r"/*.bin 2>/dev/null
}
if want ladder; then
    for r in $first_rungs; do ladder_rung "$r" 45; done
fi

bench_suite() {
    local name=$1 need=$2 budget=$3; shift 3
    step "bench-$name" "$need" $((budget + 90)) "${gb[@]}" bench --no-build --no-microbench --time-budget "$budget" \
        --vocab "$vocab" "${bins[@]}" ${nbin:+--bin-dir-upstream-nopeer "$nbin"} --report "$OUT/bench/$name" "$@"
    grep "^|" "$OUT/bench/$name/bench.md" 2>/dev/null | tee -a "$OUT/summary.txt"
}
if want bench; then
    # the targets: bridge >= 0.95x P2P and >= 1.9x NO_PEER_COPY at pp4096 (ub512, ub4096), tg >= 0.98x
    [ "$ngpu" -ge 2 ] && bench_suite multi-gpu 80 100 --suite multi-gpu --cases upstream-p2p,upstream-nopeer,off,bridge --rounds 6
    # batching on one GPU: token generation gains, nothing >= 1 % slower
    bench_suite batched 45 45 --suite batched --rounds 10
fi

if want rpc && [ "$ngpu" -ge 2 ]; then
    for r in rpc1x2gpu-small-ub512 rpc2x1gpu-small-ub512; do ladder_rung "$r" 40; done
fi

if want ladder-rest; then
    for r in $rest_rungs; do ladder_rung "$r" 45; done
fi
log "done, $(left)s of the budget left"
