#!/usr/bin/env bash
# The bridge's all-reduce for tensor split (patches 0007, 0008) on one GPU split into virtual devices:
#   build    upstream and patched CUDA builds in one tree (as prove.sh's build step); with PREBUILT=DIR the builds
#            carried in DIR/builds.tar.xz instead (scripts/gpu/pack-prebuilt.sh)
#   test     test-bridge-allreduce on AR_DEVICES (default 6) virtual devices: every group of 2..6, byte for byte
#            against ggml's own butterfly; --bench: one all-reduce per call, back to back, beside upstream's internal
#   logits   llama-perplexity's full logits (--kl-divergence-base) with -sm tensor on 2, 3, 4 and 6 virtual devices:
#            upstream's butterfly (GGML_CUDA_ALLREDUCE=none), the patched build with the bridge forced and its
#            all-reduce, with the bridge forced and the butterfly kept (GGML_CUDA_ALLREDUCE=butterfly), auto; two
#            devices also upstream's internal all-reduce at GGML_CUDA_AR_BF16_THRESHOLD=0; compared with cmp
#   sanitize compute-sanitizer memcheck and synccheck over test-bridge-allreduce --quick on AR_SAN_DEVICES (4)
#   bench    llama-bench -sm tensor -p 512 -n 128 (-r AR_REPS, default 1: one-shot), the same cases, AR_ROUNDS
#            (default 5) rounds interleaved, per device count; bench.md: medians, ranges, ratios per round
# OUT=<folder> BUDGET=<s> [PREBUILT=DIR] [AR_SHAPE=name] [AR_COUNTS="2 4"] [AR_BENCH_COUNTS=...] bash scripts/gpu/allreduce.sh [STEP ...]
# (AR_BENCH_COUNTS: the bench's device counts where they differ from the logits')
# Carry: .carry/ (the pinned sdist) and .whl/ (gitpython, gitdb, smmap, gguf), as for prove.sh.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
repo=$PWD
: "${OUT:?set OUT}"
BUDGET=${BUDGET:-570}
STEPS=" ${*:-build test logits bench} "
mkdir -p "$OUT"
# shellcheck source=scripts/gpu/steps.sh
source scripts/gpu/steps.sh
trap bundle EXIT
export GGML_BRIDGE_CACHE_DIR=$repo/.cache-gpu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$repo || { log "cannot install the carried wheels"; exit 1; }
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"

if want build; then
    # AR_VARIANTS=patched: the patched build alone (its selectors off stand for upstream: the cases up-* then run it
    # with the bridge off, and the summary says so)
    step build 300 560 "${gb[@]}" build --backend cuda --cuda-arch 90 --no-ui --shared-tree --variant "${AR_VARIANTS:-upstream,upstream-nopeer-virtual,patched}"
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build.txt" | tail -n 20 | tee -a "$OUT/summary.txt"
fi
# PREBUILT=DIR: builds made elsewhere and carried (steps.sh's prebuilt); else the cache's latest builds
vocab=
if [ -n "${PREBUILT:-}" ]; then
    prebuilt "$repo/$PREBUILT" || exit 1
    nbin=$vbin
else
    pbin=$(bindir patched) || { log "the CUDA builds are not there: stopping"; exit 1; }
    ubin=$(bindir upstream) || ubin=
    nbin=$(bindir upstream-nopeer-virtual) || nbin=
fi
[ -n "$ubin" ] || { ubin=$pbin; log "no upstream build: the up-* cases run the patched build with the bridge off"; }
mkdir -p "$OUT/manifests"
[ -n "${PREBUILT:-}" ] || for v in upstream upstream-nopeer-virtual patched; do
    m=$("${gb[@]}" build --backend cuda --variant "$v" --print-manifest 2>/dev/null) && cp "$m" "$OUT/manifests/$v.json"
done
log "patched: $pbin; upstream: $ubin; emulated no-peer baseline: ${nbin:-none}"
[ -n "$vocab" ] || pinned_vocab || exit 1

if want test; then
    step test-allreduce 30 240 env GGML_CUDA_DEVICES="${AR_DEVICES:-6}" "$pbin/test-bridge-allreduce" --bench \
        --rounds "${AR_TEST_ROUNDS:-5}"
    grep -E "^(FAIL|order|bench)|passed" "$OUT/test-allreduce.txt" | tee -a "$OUT/summary.txt"
fi

# sanitize: compute-sanitizer's memcheck and synccheck over the quick test (AR_SAN_DEVICES, default 4, virtual devices)
if want sanitize; then
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for tool in memcheck synccheck; do
        [ "$(left)" -lt 60 ] && { log "SKIPPED sanitize $tool: $(left)s left"; continue; }
        step "sanitize-$tool" 30 150 env GGML_CUDA_DEVICES="${AR_SAN_DEVICES:-4}" "$san" --tool "$tool" \
            --error-exitcode 3 "$pbin/test-bridge-allreduce" --quick
        grep -E "ERROR SUMMARY|passed|FAIL" "$OUT/sanitize-$tool.txt" | tail -n 3 | sed "s/^/$tool: /" | tee -a "$OUT/summary.txt"
    done
fi

# the model: AR_SHAPE (a preset of ggml_bridge.experiments.model, or tp-2048: n_embd 2048, 16 layers, 32 heads, 8 KV heads)
shape=${AR_SHAPE:-tp-2048}
model=$GGML_BRIDGE_CACHE_DIR/models/$shape.gguf
if want logits || want bench; then
    if [ ! -f "$model" ]; then
        mkdir -p "$(dirname "$model")"
        python3 - "$shape" "$model" "$vocab" <<'PY' >> "$OUT/model.txt" 2>&1 || { log "model $shape not written"; exit 1; }
import sys
from ggml_bridge.experiments import model
name, out, vocab = sys.argv[1:]
custom = {"tp-2048": {"preset": "bench-1b", "name": "tp-2048", "n_layer": 16, "n_head_kv": 8}}
model.write_model(out, model.get_shape(custom.get(name, name)), 1, vocab)
PY
        log "model $shape written ($(du -h "$model" | cut -f1))"
    fi
fi

counts=${AR_COUNTS:-2 3 4 6}
# case NAME: bin dir and environment (each run gets GGML_CUDA_DEVICES=N)
case_env() {
    case $1 in
        up-none)     echo "$ubin GGML_CUDA_ALLREDUCE=none" ;;
        up-internal) echo "$ubin GGML_CUDA_ALLREDUCE=internal GGML_CUDA_AR_BF16_THRESHOLD=0" ;;
        p-ar)        echo "$pbin GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_ALLREDUCE=none GGML_CUDA_BRIDGE_ALLREDUCE_SUMS=devices" ;;
        # three or more devices: the bridge's all-reduce with the host's sums instead of the devices' reduce-scatter
        p-ar-host)   echo "$pbin GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_ALLREDUCE=none GGML_CUDA_BRIDGE_ALLREDUCE_SUMS=host" ;;
        # p-bf2: the A/A control of the bench (AR_CONTROL=1, the default), p-bf again: its ratio to p-bf is the
        # spread an unchanged path gives on that machine in the same rounds
        p-bf|p-bf2)  echo "$pbin GGML_CUDA_MAPPED_HOST_BRIDGE=force GGML_CUDA_ALLREDUCE=butterfly" ;;
        p-auto)      echo "$pbin GGML_CUDA_MAPPED_HOST_BRIDGE=auto" ;;
        p-asked)     echo "$pbin GGML_CUDA_ALLREDUCE=bridge GGML_CUDA_AR_BF16_THRESHOLD=0" ;;
        # the emulated no-peer baseline (test-only variant upstream-nopeer-virtual, docs/tensor.md): upstream's
        # butterfly with every cross-device copy on upstream's own host path, as between GPUs without peer access
        nb-none)     echo "$nbin GGML_CUDA_ALLREDUCE=none" ;;
    esac
}
cases_for() {
    local c
    if [ "$1" -eq 2 ]; then c="up-none up-internal p-ar p-bf p-auto p-asked"; else c="up-none p-ar p-ar-host p-bf p-auto"; fi
    echo "$c${nbin:+ nb-none}${2:+ $2}"
}

if want logits; then
    mkdir -p "$OUT/logits"
    text=/tmp/ar-text.txt
    for _ in 1 2 3 4 5 6; do cat README.md docs/DESIGN.md; done > "$text"
    for n in $counts; do
        [ "$(left)" -lt 40 ] && { log "SKIPPED logits n=$n: $(left)s left"; continue; }
        for c in $(cases_for "$n"); do
            read -r bin envs <<< "$(case_env "$c")"
            # shellcheck disable=SC2086
            timeout 120 env GGML_CUDA_DEVICES="$n" $envs "$bin/llama-perplexity" -m "$model" -f "$text" -c 512 --chunks 3 \
                -b 512 -ngl 99 -sm tensor -lv 4 --kl-divergence-base "/tmp/logits-$n-$c.bin" \
                > "$OUT/logits/$n-$c.txt" 2>&1
            echo "$n $c rc=$? $(grep -E 'ggml_cuda_bridge_allreduce: (enabled|inactive|stats)' "$OUT/logits/$n-$c.txt" | tail -n 2 | tr '\n' ' ')" \
                >> "$OUT/logits/engaged.txt"
            # the bridge's all-reduce proved by its own lines where the case asks for it (-lv 4: INFO lines kept)
            case $c in p-ar|p-ar-host|p-asked)
                grep -qE 'ggml_cuda_bridge_allreduce: stats: .* allreduces=[1-9]' "$OUT/logits/$n-$c.txt" \
                    || log "NOT PROVED: logits n=$n $c has no stats line of the bridge's all-reduce with allreduces > 0" ;;
            esac
        done
        for c in $(cases_for "$n"); do
            [ "$c" = up-none ] && continue
            if cmp -s "/tmp/logits-$n-up-none.bin" "/tmp/logits-$n-$c.bin"; then r=identical; else r=DIFFERENT; fi
            log "logits n=$n $c vs up-none: $r ($(stat -c %s "/tmp/logits-$n-$c.bin" 2>/dev/null) bytes)"
        done
        rm -f /tmp/logits-"$n"-*.bin
    done
    cat "$OUT/logits/engaged.txt" >> "$OUT/summary.txt"
fi

if want bench; then
    mkdir -p "$OUT/bench"
    rounds=${AR_ROUNDS:-5}
    for r in $(seq 1 "$rounds"); do
        [ "$(left)" -lt 60 ] && { log "SKIPPED bench round $r: $(left)s left"; break; }
        for n in ${AR_BENCH_COUNTS:-$counts}; do
            # AR_BENCH_SKIP: cases the bench leaves out (e.g. p-auto, whose path the logits step shows)
            for c in $(cases_for "$n" "$([ "${AR_CONTROL:-1}" = 1 ] && echo p-bf2)"); do
                case " ${AR_BENCH_SKIP:-} " in *" $c "*) continue ;; esac
                read -r bin envs <<< "$(case_env "$c")"
                # shellcheck disable=SC2086
                timeout 90 env GGML_CUDA_DEVICES="$n" $envs "$bin/llama-bench" -m "$model" -sm tensor -ngl 99 \
                    -p 512 -n 128 -r "${AR_REPS:-1}" -o jsonl > "$OUT/bench/$n-$c-$r.jsonl" 2> "$OUT/bench/$n-$c-$r.err"
            done
        done
        log "bench round $r done"
    done
    python3 - "$OUT/bench" <<'PY' | tee "$OUT/bench.md" | tee -a "$OUT/summary.txt"
import json, pathlib, statistics, sys, collections
d = pathlib.Path(sys.argv[1])
ts = collections.defaultdict(dict)   # (n, case, test) -> {round: t/s}
for f in d.glob("*.jsonl"):
    n, case, r = f.stem.split("-", 1)[0], f.stem.rsplit("-", 1)[0].split("-", 1)[1], int(f.stem.rsplit("-", 1)[1])
    for line in f.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        test = f"pp{row['n_prompt']}" if row.get("n_prompt") else f"tg{row['n_gen']}"
        ts[(int(n), case, test)][r] = row["avg_ts"]
print("| devices | test | case | rounds | median t/s | range | median of per-round ratio to p-bf | to up-none | to nb-none | to p-ar-host |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (n, case, test) in sorted(ts):
    v = ts[(n, case, test)]
    def ratio(base):
        b = ts.get((n, base, test), {})
        rs = [v[r] / b[r] for r in v if r in b and b[r]]
        return f"{statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]" if rs else "-"
    print(f"| {n} | {test} | {case} | {len(v)} | {statistics.median(v.values()):.1f} | {min(v.values()):.1f}-{max(v.values()):.1f} | {ratio('p-bf')} | {ratio('up-none')} | {ratio('nb-none')} | {ratio('p-ar-host')} |")
PY
fi
log "done"
