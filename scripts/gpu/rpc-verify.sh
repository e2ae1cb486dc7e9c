#!/usr/bin/env bash
# GPU call for issue 19 (RPC), on a 2-GPU machine with the variants of build-cuda-variants.sh (which builds
# ggml-rpc-server with GGML_RPC=ON): (1) one rpc-server owning both GPUs with the bridge in mode 1 and default
# flags: its state line, the bridge's own line, counters on SIGUSR1 (before and after a request through it);
# (2) serve --rpc-local in the configurations users meet; (3) the two RPC rungs of the CUDA ladder, byte for byte
# against one local GPU; (4) the RPC bench suite (rpc-staged / rpc-nopeer / rpc-off / rpc-bridge), 2 rounds.
# Usage (repo root): OUT=/tmp/out scripts/gpu/rpc-verify.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/ggml-rpc-server ] || build_variants
python_env
write_models small

# (1) the server alone, default flags, bridge mode 1, both GPUs; a client request through it, then counters
GGML_CUDA_MAPPED_HOST_BRIDGE=1 $V/patched/ggml-rpc-server -p 50152 -d CUDA0,CUDA1 > /tmp/rpcsrv.txt 2>&1 & srv=$!
sleep 5
kill -USR1 $srv; sleep 1
CUDA_VISIBLE_DEVICES= timeout 300 $V/patched/llama-bench -m /tmp/small.gguf -p 2048 -n 8 -b 2048 -ub 512 -r 1 \
    -ngl 99 --rpc 127.0.0.1:50152 > /tmp/rpcbench.txt 2>&1; log "llama-bench through the rpc-server rc=$?"
kill -USR1 $srv; sleep 1; kill $srv; wait $srv 2>/dev/null
log "rpc-server lines:"; grep -E "ggml_bridge_rpc|ggml_cuda_mapped_host_bridge|Starting RPC|CUDA[01]:" /tmp/rpcsrv.txt \
    | tee -a "$OUT/summary.txt"
grep "^|" /tmp/rpcbench.txt | tee -a "$OUT/summary.txt"
{ echo "== rpc-server"; cat /tmp/rpcsrv.txt; echo "== llama-bench"; cat /tmp/rpcbench.txt; } > "$OUT/rpc-server.txt"

# (2) serve: one local rpc-server owning both GPUs (bridge required there), two with one GPU each (nothing for the
# bridge: serving anyway), an unreachable endpoint (exit 41 within seconds)
serve() { # name, expected rc, serve args...
    local name=$1 want=$2; shift 2
    timeout 180 python3 -m ggml_bridge serve --server $V/patched/llama-server --check --startup-timeout 120 "$@" \
        -- -m /tmp/small.gguf -ngl 99 -sm layer --port 8093 > /tmp/serve-$name.txt 2>&1; local rc=$?
    log "serve $name rc=$rc (want $want): $(grep -E 'ggml-bridge|error' /tmp/serve-$name.txt | tail -n 8 | tr '\n' ' ' | cut -c1-900)"
    { echo "== serve $name rc=$rc want=$want"; cat /tmp/serve-$name.txt; } >> "$OUT/serve-rpc.txt"
}
CUDA_VISIBLE_DEVICES=0,1 serve rpc1x2gpu-bridge-on 0 --bridge on --rpc-local-only --rpc-local-devices CUDA0,CUDA1
CUDA_VISIBLE_DEVICES=0,1 serve rpc2x1gpu-bridge-on 0 --bridge on --rpc-local-only --rpc-local-devices CUDA0 --rpc-local-devices CUDA1
serve unreachable 41 --rpc 127.0.0.1:1

# (3) the RPC rungs of the CUDA ladder
log "CUDA ladder, RPC rungs"
timeout ${LADDER_TIMEOUT:-420} python3 -m ggml_bridge ladder --ladder ladders/cuda.toml --bin-dir-patched $V/patched \
    --bin-dir-upstream $V/upstream --vocab "$vocab" --report "$OUT/ladder-rpc" \
    --rung rpc1x2gpu-small-ub512 --rung rpc2x1gpu-small-ub512 2>&1 | tee /tmp/ladder-rpc.out \
    | grep -E '^\[|==>' | tee -a "$OUT/summary.txt"
log "ladder rc=${PIPESTATUS[0]}"
rm -rf "$OUT/ladder-rpc/"*/ 2>/dev/null

# (4) the RPC bench suite
run_bench rpc ${BENCH_TIMEOUT:-500} --suite rpc --rounds 2 --reps 2
log "done"
