#!/usr/bin/env bash
# run llama-server under gdb, batched on; send request; dump all threads on SIGSEGV
bin=$1 model=$2 tag=$3
prompt=$(python3 -c "print('The quick brown fox jumps over the lazy dog ' * 6)")
GGML_VK_VISIBLE_DEVICES=0 LLAMA_BATCHED_TRANSFERS=1 gdb -q -batch -ex "set pagination off" -ex "handle SIGPIPE nostop noprint" -ex run -ex "thread apply all bt 30" --args "$bin/llama-server" -m "$model" --port 18182 -c 256 -t 2 --no-webui ${NGL:--ngl 2} -b 64 -ub 16 > /tmp/gdb-$tag.log 2>&1 &
pid=$!
for i in $(seq 60); do curl -s localhost:18182/health | grep -q ok && break; sleep 0.5; done
python3 - "$prompt" <<'PY' || true
import json, sys, urllib.request
b = json.dumps({"prompt": sys.argv[1], "n_predict": 24, "temperature": 0, "seed": 1, "cache_prompt": False}).encode()
try:
    urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:18182/completion", b, {"Content-Type": "application/json"}), timeout=120).read(); print("ok")
except Exception as e:
    print("request failed:", e)
PY
sleep 2
if grep -q SIGSEGV /tmp/gdb-$tag.log; then wait $pid; echo CRASH; else pkill -f "port 18182"; wait $pid; echo nocrash; fi
