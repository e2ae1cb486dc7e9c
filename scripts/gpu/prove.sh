#!/usr/bin/env bash
# The GPU proof in one call on a lent machine without network, through the product's own CLI:
#   1. `ggml-bridge build` of the three CUDA variants of the pinned upstream in one tree (--shared-tree), each with
#      its manifest;
#   2. the series' test programs (bridge on 2 GPUs, rejected selector values; batched transfers);
#   3. CUDA ladder rungs (ladders/cuda.toml), the most telling first, one report each;
#   4. `ggml-bridge bench` suites (bridge vs upstream P2P / NO_PEER_COPY on 2 GPUs, batched on 1 GPU);
#   5. the RPC rungs (2+ GPUs: ladders/cuda.toml's; one GPU: the one-GPU topologies of ladders/cuda-1gpu.toml);
#   6. on any GPU count: rpc1 (RPC topologies of one GPU), split1 (-sm row with the bridge on two GPUs), link (bench suite rpc-link: rpc-servers behind shaped 10/25 Gbit/s links), serve-rpc
#      (the launcher's RPC mode: serve --rpc-local-devices ... --rpc-local-only, --check and serving);
#   7. tensor (-sm tensor rungs of ladders/cuda-tensor.toml on 2, 3, 4, 6 virtual devices, the all-reduce path
#      proved; serve --check with -sm tensor on 4) and tensor-bench (bench suites tensor-virt and layer-nopeer-virt
#      against the test-only upstream-nopeer-virtual baseline; docs/tensor.md);
# each step only when the time left (BUDGET seconds from the start) allows it, so that a short call still returns
# complete reports of what it ran. $OUT gets summary.txt and results.tar.gz (every report, log and manifest).
#
# Carry (git-ignored, see scripts/gpu/README.md): .carry/<sdist named in pin.toml> and .whl/ (gitpython, gitdb,
# smmap, gguf wheels for Python 3.12).
# Usage, from the repository root:  OUT=/tmp/out BUDGET=560 bash scripts/gpu/prove.sh [STEP ...]
#   STEP: build tests inproc sweep ladder bench noise batched rpc rpc1 split1 link serve-rpc tensor tensor-bench ladder-rest
#   (default: build tests ladder bench rpc ladder-rest; steps run in this order whatever the order given);
#   TENSOR_RUNGS="R ..." narrows tensor, TENSOR_PARTS="tensor:N|layer:N ..." tensor-bench; RPC1_RUNGS="R ..." narrows rpc1,
#   FIRST_RUNGS="R ..." the ladder step; BENCH_ARGS (e.g. --smi) goes to every bench
# The cache (builds, models) is .cache-gpu/ in the checkout (git-ignored): a second call on the same machine finds
# the first call's builds there (`build` then says "up to date"), so a long proof can be split over several calls.
set -uo pipefail
repo=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-580}
STEPS=${*:-build tests ladder bench rpc ladder-rest}

# shellcheck source=scripts/gpu/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
trap bundle EXIT

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
    # upstream-nopeer-virtual: the TEST-ONLY no-peer baseline on virtual devices (patches/baseline/nopeer-virtual:
    # one more compile of ggml-cuda.cu in the shared tree, ~1-2 min), for the tensor-bench step
    variants=upstream,upstream-nopeer-virtual,patched ladder_file=ladders/cuda-1gpu.toml
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
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && { [ -n "${PREBUILT:-}" ] || cp .carry/*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"; }

if want build; then
    step build 300 580 "${gb[@]}" build --backend cuda --cuda-arch 90 --no-ui --shared-tree \
        --variant "$variants"
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build.txt" | tail -n 30 | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/manifests"
    for v in upstream upstream-nopeer upstream-nopeer-virtual patched; do
        m=$("${gb[@]}" build --backend cuda --variant "$v" --print-manifest 2>/dev/null) \
            && cp "$m" "$OUT/manifests/$v.json"
    done
fi
# PREBUILT=DIR instead: builds made elsewhere and carried (steps.sh's prebuilt; scripts/gpu/README.md), no build
# step, no sdist; without upstream's build the ladder's steps are skipped
if [ -n "${PREBUILT:-}" ]; then
    nbin=
    prebuilt "$repo/$PREBUILT" || exit 1
else
    pbin=$(bindir patched) && ubin=$(bindir upstream) || { log "the CUDA builds are not there: stopping"; exit 1; }
    nbin=$(bindir upstream-nopeer) || nbin=
    vbin=  # bench finds the upstream-nopeer-virtual build of the cache itself
    pinned_vocab || exit 1
fi
bins=(--bin-dir-patched "$pbin" ${ubin:+--bin-dir-upstream "$ubin"})

if want tests; then
    # the bridge on both GPUs (every size class, both pipelines, ordering, pool release), then a rejected value
    # after a muted first set of backends
    step test-bridge 25 90 env "${bridge_test_env[@]}" "$pbin/test-mapped-host-bridge"
    tail -n 1 "$OUT/test-bridge.txt" | tee -a "$OUT/summary.txt"
    step test-bridge-rejected 8 60 env "${bridge_test_env[@]}" GGML_CUDA_MAPPED_HOST_BRIDGE=yes \
        "$pbin/test-mapped-host-bridge" --quick
    grep -E "rejected|FAIL|passed" "$OUT/test-bridge-rejected.txt" | tee -a "$OUT/summary.txt"
    "${gb[@]}" model --shape tiny --vocab "$vocab" --out /tmp/tiny.gguf > /dev/null 2>&1
    step test-batched 10 60 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
    grep -E "passed|FAIL" "$OUT/test-batched.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
fi

if want inproc; then
    # batching off against on inside one process (test-batched-transfers --bench): the ratios without the spread
    # between processes (the H200's fast and slow processes). INPROC_PARTS ("DEVICES:SHAPE ...": 1gpu, 2virt, 6virt,
    # and 2virt-force / 6virt-force with the bridge forced between the virtual devices), INPROC_ROUNDS (10);
    # INPROC_BIN: another build of the test program (e.g. one compiled against the carried patched libraries);
    # INPROC_CONTROL=1: after each part the same with --control (both contexts off, an A/A run: the range an
    # unchanged path gives in one process on this machine, to read the part's ratios against), inproc-control-*
    for part in ${INPROC_PARTS:-1gpu:bench-2b-6l 1gpu:bench-1b 2virt-force:bench-2b-6l 6virt-force:bench-2b-6l 2virt:bench-2b-6l 6virt:bench-2b-6l}; do
        devs=${part%%:*} shape=${part#*:} env=()
        case $devs in
            2virt|6virt) env=("GGML_CUDA_DEVICES=${devs%virt}") ;;
            2virt-force|6virt-force) env=("GGML_CUDA_DEVICES=${devs%virt-force}" GGML_CUDA_MAPPED_HOST_BRIDGE=force) ;;
        esac
        [ -f "/tmp/$shape.gguf" ] || "${gb[@]}" model --shape "$shape" --vocab "$vocab" --out "/tmp/$shape.gguf" > /dev/null 2>&1
        for kind in inproc ${INPROC_CONTROL:+inproc-control}; do
            ctl=(); if [ $kind = inproc-control ]; then ctl=(--control); fi
            step "$kind-$devs-$shape" 40 150 env "${env[@]}" "${INPROC_BIN:-$pbin/test-batched-transfers}" --model "/tmp/$shape.gguf" \
                --bench --rounds "${INPROC_ROUNDS:-10}" "${ctl[@]}"
            { echo "$kind $devs $shape (${env[*]:-one GPU}):"; grep -E "^\||passed|FAIL|context 1: .*(enabled|stats)" "$OUT/$kind-$devs-$shape.txt"; } \
                | tee -a "$OUT/summary.txt"
        done
    done
fi

if want sweep; then
    # the boundary copy per size, every pipeline, one-way and both-directions-at-once limits, interleaved rounds
    step sweep 60 240 env GGML_CUDA_DEVICES=2 "$pbin/test-mapped-host-bridge" --bench --rounds "${SWEEP_ROUNDS:-3}"
    grep -E "^\|" "$OUT/sweep.txt" | tee -a "$OUT/summary.txt"
fi

# one ladder report per rung, so that a rung cut short by the budget leaves the others' reports whole
ladder_rung() {
    local r=$1 need=$2 name=${3:-$1}   # name: the report's (a rung of another ladder file may share the name)
    if [ -z "$ubin" ]; then log "SKIPPED ladder-$name: no upstream build (PREBUILT without upstream)"; return 0; fi
    step "ladder-$name" "$need" 200 "${gb[@]}" ladder --ladder "$ladder_file" --rung "$r" --vocab "$vocab" \
        "${bins[@]}" --report "$OUT/ladder/$name"
    grep -E "^\[|==> ladder" "$OUT/ladder-$name.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
    # a rung that did not pass: the end of every process log it left, in the summary (it always comes back)
    if ! grep -q "PASS" "$OUT/ladder-$name.txt" || grep -qE "ERROR|FAIL" "$OUT/ladder-$name.txt"; then
        find "$OUT/ladder/$name" -name "*.log" | sort | while read -r f; do
            echo "--- ${f#"$OUT"/} (last 15 lines)"; grep -v "^\s*$" "$f" | tail -n 15
        done | cut -c1-300 >> "$OUT/summary.txt"
    fi
    rm -f "$OUT"/ladder/"$name"/*.bin 2>/dev/null
}
if want ladder; then
    for r in ${FIRST_RUNGS:-$first_rungs}; do ladder_rung "$r" 45; done
fi

bench_suite() {  # NAME NEED_S BUDGET_S bench-options...: the bench with --time-budget BUDGET_S, cut 90 s after it
    local name=$1 need=$2 budget=$3; shift 3
    step "bench-$name" "$need" $((budget + 90)) "${gb[@]}" bench --no-build --no-microbench --time-budget "$budget" \
        --vocab "$vocab" "${bins[@]}" ${nbin:+--bin-dir-upstream-nopeer "$nbin"} \
        ${vbin:+--bin-dir-upstream-nopeer-virtual "$vbin"} --report "$OUT/bench/$name" "$@" \
        ${BENCH_ARGS:-}
    grep "^|" "$OUT/bench/$name/bench.md" 2>/dev/null | tee -a "$OUT/summary.txt"
}
if want bench; then
    # the targets: bridge >= 0.95x P2P and >= 1.9x NO_PEER_COPY at pp4096 (ub512, ub4096), tg >= 0.98x
    [ "$ngpu" -ge 2 ] && bench_suite multi-gpu 80 100 --suite multi-gpu --cases upstream-p2p,upstream-nopeer,off,bridge --rounds 6
    # batching on one GPU: token generation gains, nothing >= 1 % slower
    bench_suite batched 45 45 --suite batched --rounds 10
fi

# seconds one round of a short-run suite takes, per shape (a round runs, per case, llama-bench -r 1, -r 3 and -r 10,
# llama-perplexity and llama-server, and per batched case the in-process measure; scripts/gpu/README.md): the
# slowest machine measured, one H100 of 2026-12-06 05:00 UTC whose processes ran about 1.6x those of the H100 of
# 01:45 (1gpu bench-1b 29 s, 2virt bench-1b 65 s, 6virt 70-72 s; results/2026-12-06-h100x1-batched-6virt), the
# parts not measured there scaled from the earlier H100 by that factor, all with a quarter of slack, plus the
# in-process control (about 8 s per baseline: one process per baseline case with both contexts off)
runs_round_s() {
    case "$1:$2" in
        1gpu:bench-1b) echo 48 ;; 1gpu:bench-2b-6l) echo 52 ;;
        2virt:bench-1b) echo 104 ;; 2virt:bench-2b-6l) echo 108 ;;
        6virt:bench-1b) echo 112 ;; 6virt:bench-2b-6l) echo 110 ;;
        *) echo 90 ;;
    esac
}
if want noise; then
    # the spread of the machine's processes (on the H200, fast and slow ones, +-15-20 %) with and without one CPU
    # placement for all: prompt processing only (llama-bench -p 512,4096 -r 3, no token generation), batching off and
    # on interleaved, NOISE_ROUNDS rounds unpinned, then the same on NOISE_CPUS (default 4-7); the reports' per-round
    # ratios and samples say whether a fixed placement narrows the spread (--smi: the clocks of each process)
    for pin in "" "${NOISE_CPUS:-4-7}"; do
        bench_suite "noise${pin:+-cpus-$pin}" 60 120 --suite batched-runs-1gpu --shapes bench-2b-6l --measure bench \
            --run-lengths 3 --tg 0 --rounds "${NOISE_ROUNDS:-6}" ${pin:+--cpus "$pin"}
    done
fi
if want batched; then
    # batching against its baseline in one-shot, short and long runs (llama-bench -r 1, 3, 10, every repetition
    # kept), on bench-1b and the 5120-wide bench-2b-6l, on one GPU and on 2 and 6 virtual devices of it (bridge
    # forced there), with llama-perplexity's wall time and llama-server's throughput under 4 concurrent requests,
    # interleaved rounds; the goal: no paired ratio below 0.99, tg128 >= +3 % on one GPU. One report per part
    # (suite and shape; a round that would not end within the time left is not started), the parts of a suite
    # pooled when this call ran more than one. BATCHED_PARTS ("SUITE:SHAPE ...", default every one of
    # BATCHED_SUITES (1gpu 2virt 6virt) x BATCHED_SHAPES (bench-1b bench-2b-6l)), BATCHED_ROUNDS (5),
    # BATCHED_RUN_LENGTHS (e.g. 1,10) and BATCHED_MEASURE (e.g. bench,server) choose a part of the matrix, so that
    # it can be split over calls and pooled afterwards (bench --pool; scripts/gpu/README.md)
    rounds=${BATCHED_ROUNDS:-5}
    parts=${BATCHED_PARTS:-$(for s in ${BATCHED_SUITES:-1gpu 2virt 6virt}; do
        for h in ${BATCHED_SHAPES:-bench-1b bench-2b-6l}; do echo "$s:$h"; done; done)}
    for part in $parts; do
        suite=${part%%:*} shape=${part#*:}
        per=$(runs_round_s "$suite" "$shape")
        # the part's rounds and half a round of slack, within the call's time left less a minute (the report)
        budget=$((per * rounds + per / 2)); [ "$budget" -gt $(($(left) - 60)) ] && budget=$(($(left) - 60))
        bench_suite "runs-$suite-$shape" $((per + 60)) "$budget" --suite "batched-runs-$suite" --shapes "$shape" \
            --rounds "$rounds" ${BATCHED_RUN_LENGTHS:+--run-lengths "$BATCHED_RUN_LENGTHS"} \
            ${BATCHED_MEASURE:+--measure "$BATCHED_MEASURE"}
    done
    for suite in $(for part in $parts; do echo "${part%%:*}"; done | sort -u); do
        reports=("$OUT"/bench/runs-"$suite"-*/bench.json)
        [ -f "${reports[0]}" ] && [ "${#reports[@]}" -ge 2 ] || continue
        "${gb[@]}" bench --pool "${reports[@]}" --report "$OUT/bench/runs-$suite" > "$OUT/bench-runs-$suite-pool.txt" 2>&1
        grep -A 40 "^## Batching against" "$OUT/bench/runs-$suite/bench.md" 2>/dev/null | tee -a "$OUT/summary.txt"
    done
fi

# the one-GPU topologies run from ladders/cuda-1gpu.toml on any machine (its rungs use one GPU)
one_gpu_rung() {
    local saved=$ladder_file; ladder_file=ladders/cuda-1gpu.toml; ladder_rung "$1" "$2" "1gpu-$1"; ladder_file=$saved
}
if want rpc && [ "$ngpu" -ge 2 ]; then
    for r in rpc1x2gpu-small-ub512 rpc2x1gpu-small-ub512; do ladder_rung "$r" 40; done
fi
# RPC1_RUNGS chooses among them (e.g. to split them over two calls)
rpc1_rungs=${RPC1_RUNGS:-rpc1x2virt-small-ub512 rpc2x1gpu-small-ub512 rpcfront-small-ub512 rpcfront-shaped-small-ub512 rpc1x2virt-1b-ub512}
if want rpc1 || { want rpc && [ "$ngpu" -lt 2 ]; }; then
    for r in $rpc1_rungs; do one_gpu_rung "$r" 45; done
fi
if want split1; then
    # -sm row needs distinct GPUs (b11434 refuses split buffers on virtual devices); -sm tensor aborts in b11434's
    # meta backend on these shapes with both mechanisms off (ladders/cuda-1gpu.toml says what was measured)
    if [ "$ngpu" -ge 2 ]; then ladder_rung 2gpu-row-small-ub512 40; else log "SKIPPED split1: -sm row needs 2 GPUs"; fi
fi
if want link; then
    # rpc-servers behind shaped links (10/25 Gbit/s, 0.1-0.5 ms) against the local run: pp512, pp4096, tg128;
    # the report's bench.json is what ggml-bridge paper-model --bench checks the scale model against
    bench_suite rpc-link 90 150 --suite rpc-link --rounds 3
    grep -E "shaper_ceiling|bounded_by_shaper" -A0 "$OUT/bench/rpc-link/bench.json" | tee -a "$OUT/summary.txt"
    "${gb[@]}" paper-model --bench "$OUT/bench/rpc-link/bench.json" --shape bench-1b > "$OUT/bench/rpc-link/predicted-vs-measured.md" 2>&1 \
        && tee -a "$OUT/summary.txt" < "$OUT/bench/rpc-link/predicted-vs-measured.md"
fi
if want serve-rpc; then
    # the launcher's RPC mode on the GPU: one rpc-server owning two virtual devices, llama-server without a GPU;
    # --check (engagement from the rpc-server's counters)
    "${gb[@]}" model --shape small --vocab "$vocab" --out /tmp/small.gguf > /dev/null 2>&1
    step serve-rpc-check 20 90 env GGML_CUDA_DEVICES=2 "${gb[@]}" serve --check --bridge force --server "$pbin/llama-server" \
        --rpc-local-devices CUDA0,CUDA1 --rpc-local-only -- -m /tmp/small.gguf -ngl 99 --port 18080
    grep -E "ggml-bridge:" "$OUT/serve-rpc-check.txt" | tail -n 8 | tee -a "$OUT/summary.txt"
    # then serving: ladders/rpc-greedy.toml, greedy responses and full logits against the local server on one GPU
    step serve-rpc-greedy 30 180 "${gb[@]}" ladder --ladder ladders/rpc-greedy.toml --side patched="$pbin" \
        --vocab "$vocab" --report "$OUT/serve-rpc"
    tail -n 3 "$OUT/serve-rpc-greedy.txt" | tee -a "$OUT/summary.txt"
fi

# -sm tensor (docs/tensor.md): the rungs of ladders/cuda-tensor.toml, one report each, the most telling first; about
# 2.5 min for all twelve on one H100 (measured 2026-12-06: 6-16 s a rung):
# TENSOR_RUNGS splits them over calls; then serve --check with -sm tensor on 4 virtual devices (the all-reduce path
# named: the bridge's, forced)
tensor_rungs=${TENSOR_RUNGS:-2virt-tensor-none-ub512 2virt-tensor-internal-ub512 4virt-tensor-none-ub512 \
3virt-tensor-bridge-allreduce-ub512 2virt-tensor-f32-paths-ub512 4virt-tensor-internal-fallback-ub512 \
3virt-tensor-none-ub512 6virt-tensor-none-ub256 2virt-tensor-internal-f32-ub512 2virt-tensor-default-ub512 \
3virt-tensor-default-ub512 4virt-tensor3k-none-ub512}
if want tensor; then
    for r in $tensor_rungs; do
        saved=$ladder_file; ladder_file=ladders/cuda-tensor.toml; ladder_rung "$r" 40 "tensor-$r"; ladder_file=$saved
    done
    "${gb[@]}" model --shape tensor-small --vocab "$vocab" --out /tmp/tensor-small.gguf > /dev/null 2>&1
    step serve-tensor-check 25 120 env GGML_CUDA_DEVICES=4 GGML_CUDA_ALLREDUCE=none "${gb[@]}" serve --check \
        --bridge force --server "$pbin/llama-server" -- -m /tmp/tensor-small.gguf -ngl 99 -sm tensor --port 18081
    grep -E "ggml-bridge:" "$OUT/serve-tensor-check.txt" | tail -n 8 | tee -a "$OUT/summary.txt"
fi
# seconds one round of a tensor-bench part takes on one H100 (llama-bench -r 1 and -r 10 of pp512, pp4096, tg128 on
# tensor-3k), with a margin: a part's budget is five rounds and a half, so that it is not stopped at four (2026-12-06/07,
# four cases: tensor:3 34 s, tensor:4 42 s, tensor:6 66 s; layer 18 s; with the butterfly through the bridge's copies
# as a fifth case, 2026-12-07: tensor:2 (six cases) 31 s, tensor:4 50 s, tensor:6 62-68 s; tensor:2 has a seventh,
# internal in F32, since that evening). Two parts of 4 and 6
# devices do not fit one call: one part a call, the last part of a call gets all the time left
tensor_round_s() { case "$1" in tensor:2) echo 50 ;; tensor:3) echo 55 ;; tensor:6) echo 85 ;; tensor:*) echo 65 ;; layer:*) echo 45 ;; *) echo 80 ;; esac; }
if want tensor-bench; then
    # tensor split against upstream's internal all-reduce (2 devices), its butterfly over device-local copies and the
    # emulated no-peer baseline (twice: the A/A range), the butterfly through the bridge's copies and the bridge's
    # all-reduce (both forced); then layer split beside the bridge
    # against the same baseline. One part per device count; TENSOR_ROUNDS (5); a part of 5 rounds fits one 10 min call
    rounds=${TENSOR_ROUNDS:-5}
    read -ra parts <<< "${TENSOR_PARTS:-tensor:2 tensor:4 tensor:3 tensor:6 layer:2 layer:4}"
    for part in "${parts[@]}"; do
        kind=${part%%:*} n=${part#*:} per=$(tensor_round_s "$part")
        # the estimate leaves time to the parts after it; the last part gets all that is left (it stops at its rounds)
        budget=$((per * rounds + per / 2))
        if [ "$part" = "${parts[-1]}" ] || [ "$budget" -gt $(($(left) - 60)) ]; then budget=$(($(left) - 60)); fi
        cases=()
        if [ "$kind" = tensor ] && [ "$n" != 2 ]; then  # internal is for exactly 2 devices (else: the butterfly)
            # shellcheck disable=SC2054  # one comma-separated value
            cases=(--cases tensor-upstream,tensor-nopeer-virtual,tensor-nopeer-virtual-aa,tensor-bridge-force-butterfly,tensor-bridge-force)
        fi
        suite=tensor-virt; [ "$kind" = layer ] && suite=layer-nopeer-virt
        bench_suite "$kind-${n}virt" $((per + 60)) "$budget" --suite "$suite" --virtual-devices "$n" \
            --rounds "$rounds" "${cases[@]}"
    done
fi

if want ladder-rest; then
    for r in $rest_rungs; do ladder_rung "$r" 45; done
fi
log "done, $(left)s of the budget left"
