#!/usr/bin/env bash
# Export a range of commits of an upstream work tree as our patch series format:
# zero-commit format-patch files named NNNN-<subject-prefix>-<slug>.patch, listed in patches/series.
# Usage: scripts/export-patches.sh WORKTREE BASE [NAMES...]
#   NAMES: one file name per commit (in order), e.g. 0001-ggml-cuda-mapped-host-bridge.patch
set -euo pipefail
wt=$1; base=$2; shift 2
out=$(cd "$(dirname "$0")/.." && pwd)/patches
tmp=$(mktemp -d)
git -C "$wt" format-patch -q --zero-commit --no-signature --no-numbered -o "$tmp" "$base..HEAD"
mapfile -t files < <(ls "$tmp"/*.patch | sort)
if [ $# -ne ${#files[@]} ]; then
    echo "export-patches: $# names for ${#files[@]} commits" >&2; exit 2
fi
i=0
for name in "$@"; do
    mv "${files[$i]}" "$out/$name"; i=$((i+1))
done
rm -rf "$tmp"
