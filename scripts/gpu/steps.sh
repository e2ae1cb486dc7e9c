# shellcheck shell=bash
# Sourced by the GPU scripts (prove.sh, vulkan.sh) after they set OUT, BUDGET and STEPS: time-boxed steps, the log
# that comes back (summary.txt) and the archive of everything else.
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((BUDGET - SECONDS)); }
# run "NAME NEED_S LIMIT_S command...": only when NEED_S seconds are left; killed after min(LIMIT_S, time left)
step() {
    local name=$1 need=$2 limit=$3 rc; shift 3
    if [ "$(left)" -lt "$need" ]; then log "SKIPPED $name: $(left)s left, needs ~${need}s"; return 0; fi
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    log "$name (limit ${limit}s)"
    timeout --kill-after=5 "$limit" "$@" > "$OUT/$name.txt" 2>&1; rc=$?
    log "  $name rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)')"
    return $rc
}
# a lent machine returns only a few files of $OUT: on every exit, everything but the summary becomes one archive
bundle() {
    local archive
    archive=$(mktemp /tmp/gpu-results-XXXXXX.tar.gz)
    # a file over 2 MB would crowd the archive out of what comes back (16 MiB a file): logs keep head and tail
    find "$OUT" -type f -size +2M ! -name summary.txt | while read -r f; do
        case "$f" in
            *.log|*.txt|*.csv) { head -n 200 "$f"; echo "[... $(wc -l < "$f") lines in all, cut before bundling ...]"; tail -n 400 "$f"; } > "$f.cut" && mv "$f.cut" "$f" ;;
            *) echo "dropped $(du -h "$f" | cut -f1) ${f#"$OUT"/}" >> "$OUT/summary.txt"; rm -f "$f" ;;
        esac
    done
    tar czf "$archive" -C "$OUT" --exclude=./summary.txt . \
        && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv "$archive" "$OUT/results.tar.gz" && chmod 644 "$OUT/results.tar.gz"
}
want() { [[ " $STEPS " == *" $1 "* ]]; }
gb=(python3 -m ggml_bridge)  # `timeout` runs programs, not shell functions
# bindir VARIANT [BACKEND]: the bin folder of the variant's latest build (BACKEND: cuda), as the CLI reports it;
# builds nothing
bindir() { "${gb[@]}" build --backend "${2:-cuda}" --variant "$1" --print-bin-dir 2>/dev/null; }
# pinned_vocab: sets vocab to the pinned tree's vocabulary (`ggml-bridge fetch` prints the cached tree, unpacking
# the carried sdist where needed); returns 1, said on the log, where there is none
# shellcheck disable=SC2034  # vocab is the callers'
pinned_vocab() {
    local tree
    tree=$("${gb[@]}" fetch 2>/dev/null) || { log "cannot locate the pinned tree: carry its sdist in .carry/"; return 1; }
    vocab=$tree/models/ggml-vocab-llama-spm.gguf
}
# prebuilt DIR: the builds of DIR/builds.tar.xz (scripts/gpu/pack-prebuilt.sh: a folder per variant with its
# executables, test programs, libraries and manifest.json, RUNPATH $ORIGIN) unpacked into DIR; sets pbin, ubin and
# vbin (patched, upstream, upstream-nopeer-virtual; empty where not packed) and vocab (DIR/ggml-vocab-llama-spm.gguf),
# copies each manifest to $OUT/manifests. Each variant must load its own libggml-cuda or none (a static build):
# checked, or a comparison would prove nothing. Returns 1, said on the log, where that fails or patched is missing.
# shellcheck disable=SC2034  # ubin, vbin and vocab are the callers'
prebuilt() {
    local dir=$1 v b lib
    pbin='' ubin='' vbin='' vocab=$dir/ggml-vocab-llama-spm.gguf
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    mkdir -p "$OUT/manifests"
    # a variant unpacked from an earlier archive must not stand in for one this archive lacks
    rm -rf "$dir/patched" "$dir/upstream" "$dir/upstream-nopeer-virtual"
    tar -xJf "$dir/builds.tar.xz" -C "$dir" || { log "cannot unpack $dir/builds.tar.xz: stopping"; return 1; }
    for v in patched upstream upstream-nopeer-virtual; do
        b=$dir/$v
        [ -f "$b/manifest.json" ] || continue
        lib=$(ldd "$b/llama-bench" | awk '$1 == "libggml-cuda.so.0" { print $3 }')
        [ -z "$lib" ] || [ "$lib" = "$b/libggml-cuda.so.0" ] \
            || { log "$v's llama-bench loads libggml-cuda from '$lib', not $b: stopping"; return 1; }
        cp "$b/manifest.json" "$OUT/manifests/$v.json"
        "$b/llama-bench" --version 2>&1 | tail -n 2 | sed "s/^/$v: /" | tee -a "$OUT/summary.txt"
        case $v in patched) pbin=$b ;; upstream) ubin=$b ;; *) vbin=$b ;; esac
    done
    [ -n "$pbin" ] || { log "no patched build in $dir/builds.tar.xz: stopping"; return 1; }
}
