#!/usr/bin/env bash
# Build the CUDA variants the GPU proofs and benchmarks compare, in one static build tree, so the
# heavy kernel objects are compiled once:
#   $VARIANTS/upstream   pinned upstream, unmodified
#   $VARIANTS/nopeer     pinned upstream with GGML_CUDA_NO_PEER_COPY (ggml-cuda.cu is the only source
#                        that reads the macro, so only that object is recompiled with it; the binary
#                        reports NO_PEER_COPY = 1 in its CUDA features)
#   $VARIANTS/patched    our series applied (GGML_CUDA_MAPPED_HOST_BRIDGE=ON, SAM3D_BATCHED_TRANSFERS=ON)
# Usage: build-cuda-variants.sh UPSTREAM_TARBALL PATCH_DIR VARIANTS_DIR [cuda-arch]
# For GPU machines without network: everything comes from the arguments.
set -euo pipefail
tarball=$1; patches=$(readlink -f "$2"); variants=$3; arch=${4:-90}
src=${BUILD_ROOT:-/tmp/ggml-bridge}/src
build=${BUILD_ROOT:-/tmp/ggml-bridge}/build
targets=(llama-server llama-perplexity llama-bench ggml-rpc-server)
jobs=${JOBS:-$(nproc)}

rm -rf "$src" && mkdir -p "$src" "$variants"
tar xzf "$tarball" -C "$src" --strip-components=1
cd "$src"

t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DLLAMA_USE_PREBUILT_UI=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_CUDA_MAPPED_HOST_BRIDGE=ON -DSAM3D_BATCHED_TRANSFERS=ON -DGGML_RPC=ON -Wno-dev > "$variants/cmake-upstream.log" 2>&1
ninja -C "$build" -j "$jobs" "${targets[@]}" > "$variants/build-upstream.log" 2>&1
mkdir -p "$variants/upstream" && cp "${targets[@]/#/$build/bin/}" "$variants/upstream/"
echo "upstream built in $(( $(date +%s) - t0 ))s"

# NO_PEER_COPY: compile ggml-cuda.cu alone with the macro into a side directory, swap that object
# into a copy of libggml-cuda.a and relink the tools against it with their own link commands
# (ninja's tree is left untouched, so the patched build below stays incremental)
np=${BUILD_ROOT:-/tmp/ggml-bridge}/nopeer-objs; rm -rf "$np"; mkdir -p "$np" "$variants/nopeer"
obj=ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o
cmd=$(ninja -C "$build" -t commands "$obj" | tail -n 1)
cmd=${cmd/ -c / -DGGML_CUDA_NO_PEER_COPY -c }
cmd=${cmd/-o $obj/-o $np/ggml-cuda.cu.o}
cmd=${cmd/-MF $obj.d/-MF $np/ggml-cuda.cu.o.d}
( cd "$build" && eval "$cmd" )
cp "$build/ggml/src/ggml-cuda/libggml-cuda.a" "$np/"
( cd "$np" && ar r libggml-cuda.a ggml-cuda.cu.o )
for t in "${targets[@]}"; do
    link=$(ninja -C "$build" -t commands "bin/$t" | tail -n 1)
    link=${link//ggml\/src\/ggml-cuda\/libggml-cuda.a/$np/libggml-cuda.a}
    link=${link/-o bin\/$t/-o $variants/nopeer/$t}
    ( cd "$build" && eval "$link" )
done
grep -q "NO_PEER_COPY" "$variants/nopeer/llama-bench" || { echo "nopeer variant lacks NO_PEER_COPY" >&2; exit 1; }
if grep -q "NO_PEER_COPY" "$variants/upstream/llama-bench"; then echo "upstream variant has NO_PEER_COPY" >&2; exit 1; fi
echo "nopeer built in $(( $(date +%s) - t0 ))s"

# patched: apply the series in order, rebuild (only the patched sources recompile)
while read -r p; do
    [ -z "$p" ] && continue
    git apply --whitespace=nowarn "$patches/$p"
done < "$patches/series"

ninja -C "$build" -j "$jobs" "${targets[@]}" > "$variants/build-patched.log" 2>&1
extra=$(ninja -C "$build" -t targets all | grep -oE '^test-(mapped-host-bridge|batched-transfers):' | tr -d ':' || true)
[ -n "$extra" ] && ninja -C "$build" -j "$jobs" $extra >> "$variants/build-patched.log" 2>&1
mkdir -p "$variants/patched" && cp "${targets[@]/#/$build/bin/}" "$variants/patched/"
for t in $extra; do cp "$build/bin/$t" "$variants/patched/"; done
echo "patched built in $(( $(date +%s) - t0 ))s (extra targets: ${extra:-none})"
