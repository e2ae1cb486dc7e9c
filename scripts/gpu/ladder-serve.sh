#!/usr/bin/env bash
# GPU call 2 of a session, on the warm 2-GPU machine that verify-and-diagnose.sh built on: `ggml-bridge serve
# --check` in the configurations users meet, then the whole CUDA ladder (its report is rewritten after every
# rung, so a cut-off run still reports the rungs it finished). At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/ladder-serve.sh [rung ...]
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-server ] || { log "no build in $V: run verify-and-diagnose.sh first on this machine"; exit 2; }
python_env
[ -f /tmp/small.gguf ] || python3 -c "from ggml_bridge.model import write_model; write_model('/tmp/small.gguf','small',1234,'$vocab',threads=16)"

serve() { # name, expected rc, "ENV=.. ENV=..", serve args...
    local name=$1 want=$2 envs=$3; shift 3
    env $envs timeout 120 python3 -m ggml_bridge serve --server $V/patched/llama-server --check --startup-timeout 90 "$@" \
        -- -m /tmp/small.gguf -ngl 99 -sm layer --port 8093 > /tmp/serve-$name.txt 2>&1; local rc=$?
    log "serve $name rc=$rc (want $want): $(grep -vE '^[0-9.]+ [IWE] |^\s*$' /tmp/serve-$name.txt | tail -n 5 | tr '\n' ' ' | cut -c1-700)"
    { echo "== serve $name rc=$rc want=$want"; cat /tmp/serve-$name.txt; } >> "$OUT/serve.txt"
}
serve 2gpu-bridge-on-batched 0 "" --bridge on --batched on
serve 6card-bridge-force 0 "GGML_CUDA_DEVICES=6" --bridge force --batched on
serve 1gpu-bridge-on 0 "CUDA_VISIBLE_DEVICES=0" --bridge on
serve 2gpu-p2p-bridge-on-declines 40 "GGML_CUDA_P2P=1" --bridge on

rungs=("$@")
args=(); for r in "${rungs[@]}"; do args+=(--rung "$r"); done
log "CUDA ladder ${rungs[*]:-(all rungs)}"
timeout ${LADDER_TIMEOUT:-440} python3 -m ggml_bridge ladder --ladder ladders/cuda.toml --bin-dir-patched $V/patched \
    --bin-dir-upstream $V/upstream --vocab "$vocab" --report "$OUT/ladder" "${args[@]}" 2>&1 | tee /tmp/ladder.out \
    | grep -E '^\[|==>' | tee -a "$OUT/summary.txt"
log "ladder rc=${PIPESTATUS[0]}"
ls "$OUT/ladder" | head; rm -rf "$OUT/ladder/"*/ 2>/dev/null
log "done"
