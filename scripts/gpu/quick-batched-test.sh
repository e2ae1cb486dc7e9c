#!/usr/bin/env bash
# Short GPU call: build only test-batched-transfers from the carried upstream tree and this checkout's patches
# (CUDA sm_90, flash-attention kernels left out to save compile time: the test does not need them), then run it
# on 1 GPU and on 2 GPUs with the tiny model. For a series change that touches only host code, when there is no
# time for build-cuda-variants.sh. Usage (repo root): OUT=/tmp/out scripts/gpu/quick-batched-test.sh
set -uo pipefail
source scripts/gpu/common.sh
src=/tmp/qb/src; build=/tmp/qb/build; vocab=$src/models/ggml-vocab-llama-spm.gguf
rm -rf /tmp/qb && mkdir -p $src && tar xzf .carry/upstream.tar.gz -C $src --strip-components=1
( cd $src && while read -r p; do [ -n "$p" ] && git apply --whitespace=nowarn "$repo/patches/$p"; done < "$repo/patches/series" ) || { log "patches do not apply"; exit 1; }
t0=$(date +%s)
cmake -S $src -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_CUDA_MAPPED_HOST_BRIDGE=ON -DSAM3D_BATCHED_TRANSFERS=ON -Wno-dev > $OUT/build.log 2>&1 \
    && ninja -C $build -j $(nproc) test-batched-transfers >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; log "BUILD FAILED"; exit 1; }
log "test-batched-transfers built in $(( $(date +%s) - t0 ))s"
python_env
write_models tiny
test_batched $build/bin/test-batched-transfers "1gpu CUDA_VISIBLE_DEVICES=0" "2gpu"
rm -f $OUT/build.log
