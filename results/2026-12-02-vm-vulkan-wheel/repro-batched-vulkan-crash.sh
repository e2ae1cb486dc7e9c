#!/usr/bin/env bash
# Reproducer of the open defect found on 2026-12-02: the patched Vulkan llama-server with batching on
# (LLAMA_BATCHED_TRANSFERS=1) segfaults intermittently on Mesa lavapipe, inside lavapipe's queue thread, on a
# 68-token prompt (-b 64 -ub 16: ubatches 16, 16, 16, 16 then 4) with 24 tokens generated; with batching off and
# with the unpatched build it never does.
# Usage: repro-batched-vulkan-crash.sh PATCHED_BIN_DIR MODEL.gguf [RUNS]
set -u
bin=$1 model=$2 runs=${3:-3}
prompt=$(python3 -c "print('The quick brown fox jumps over the lazy dog ' * 6)")
for i in $(seq "$runs"); do
    for sel in 1 0; do
        GGML_VK_VISIBLE_DEVICES=0 LLAMA_BATCHED_TRANSFERS=$sel "$bin/llama-server" -m "$model" --port 18181 -c 256 \
            -t 2 --no-webui -ngl 2 -b 64 -ub 16 > /tmp/repro-$i-$sel.log 2>&1 &
        pid=$!
        sleep 6
        python3 - "$prompt" <<'PY' || true
import json, sys, urllib.request
b = json.dumps({"prompt": sys.argv[1], "n_predict": 24, "temperature": 0, "seed": 1, "cache_prompt": False}).encode()
try:
    urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:18181/completion", b,
                                                  {"Content-Type": "application/json"}), timeout=120).read()
except Exception as e:
    print("request failed:", e)
PY
        kill "$pid" 2>/dev/null; wait "$pid"; echo "run $i, LLAMA_BATCHED_TRANSFERS=$sel: exit status $?"
    done
done
