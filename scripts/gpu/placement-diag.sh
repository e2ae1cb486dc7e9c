#!/usr/bin/env bash
# GPU call (2-GPU machine): does the ub4096 slow mode (docs/bench.md, "What happens at ub4096") follow where the
# process runs? The multi-gpu bench once per NUMA node, every case pinned to that node's CPUs (--cpus), then once
# unpinned, with the node layout and nvidia-smi's GPU topology in the summary. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/placement-diag.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || build_variants
python_env
[ -f /tmp/bench-3b.gguf ] || python3 -c "from ggml_bridge.model import write_model; write_model('/tmp/bench-3b.gguf','bench-3b',1234,'$vocab',threads=16)"
{ nvidia-smi topo -m; for n in /sys/devices/system/node/node*; do echo "$(basename $n): cpus $(cat $n/cpulist)"; done; } \
    2>&1 | tee -a "$OUT/summary.txt"
i=0
for n in /sys/devices/system/node/node*; do
    cpus=$(cat $n/cpulist); i=$((i+1)); [ -n "$cpus" ] || continue
    log "bench pinned to $(basename $n) (CPUs $cpus)"
    timeout 150 python3 -m ggml_bridge bench --variants-dir $V --suite multi-gpu --cases p2p,staged,bridge --rounds 3 --reps 4 \
        --no-microbench --model /tmp/bench-3b.gguf --cpus "$cpus" --report /tmp/place-$i > /tmp/place-$i.out 2>&1
    log "  rc=$? $(grep -E 'round|NOT ENGAGED|rror' /tmp/place-$i.out | tail -n 9 | tr '\n' ' ')"
    cp /tmp/place-$i/bench.json "$OUT/bench-node$i.json" 2>/dev/null
done
log "bench unpinned"
timeout 150 python3 -m ggml_bridge bench --variants-dir $V --suite multi-gpu --cases p2p,staged,bridge --rounds 3 --reps 4 \
    --no-microbench --model /tmp/bench-3b.gguf --report /tmp/place-all > /tmp/place-all.out 2>&1
log "  rc=$? $(grep -E 'round|NOT ENGAGED|rror' /tmp/place-all.out | tail -n 9 | tr '\n' ' ')"
cp /tmp/place-all/bench.json "$OUT/bench-unpinned.json" 2>/dev/null
log "done"
