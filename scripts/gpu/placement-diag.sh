#!/usr/bin/env bash
# GPU call (2-GPU machine): does the ub4096 slow mode (docs/bench.md, "What happens at ub4096") follow where the
# process runs? The multi-gpu bench once per NUMA node, every case pinned to that node's CPUs (--cpus), then once
# unpinned, with the node layout and nvidia-smi's GPU topology in the summary. At most 8 files under $OUT.
# Usage (repo root): OUT=/tmp/out scripts/gpu/placement-diag.sh
set -uo pipefail
source scripts/gpu/common.sh
[ -x $V/patched/llama-bench ] || build_variants
python_env
write_models bench-3b
{ nvidia-smi topo -m; for n in /sys/devices/system/node/node*; do echo "$(basename $n): cpus $(cat $n/cpulist)"; done; } \
    2>&1 | tee -a "$OUT/summary.txt"
i=0
for n in /sys/devices/system/node/node*; do
    cpus=$(cat $n/cpulist); i=$((i+1)); [ -n "$cpus" ] || continue
    log "bench pinned to $(basename $n) (CPUs $cpus)"
    run_bench node$i 150 --suite multi-gpu --cases p2p,staged,bridge --rounds 3 --reps 4 --model /tmp/bench-3b.gguf \
        --cpus "$cpus"
done
log "bench unpinned"
run_bench unpinned 150 --suite multi-gpu --cases p2p,staged,bridge --rounds 3 --reps 4 --model /tmp/bench-3b.gguf
log "done"
