#!/usr/bin/env bash
# scratch (not committed): recompile src/llama-batched-transfers.cpp (a given version, extra flags) and, with
# SAN_TEST=1, tools/transfer-tests/test-batched-transfers.cpp, into copies of the static libraries of a finished
# shared Vulkan tree (patched state), and relink the programs into OUTDIR with ninja's own link commands.
# usage: vk-relink.sh BUILD_DIR SRC_CPP OUTDIR "EXTRA_CFLAGS" "EXTRA_LDFLAGS" target...
set -euo pipefail
B=$1 SRC=$2 OUT=$3 XC=$4 XL=$5; shift 5
mkdir -p "$OUT/obj" "$OUT/bin"
cd "$B"
cmd() { ninja -C "$B" -t commands "$1" | tail -1; }
OBJ=src/CMakeFiles/llama.dir/llama-batched-transfers.cpp.o
c=$(cmd $OBJ)
orig_src=$(echo "$c" | grep -o '\-c [^ ]*' | cut -d' ' -f2)
c=${c/-c $orig_src/-c $SRC}
c=${c/-o $OBJ/-o $OUT/obj/llama-batched-transfers.cpp.o}
c=${c/-MF $OBJ.d/-MF $OUT/obj/bt.d}
c="$c $XC"
sh -c "$c"
cp src/libllama.a "$OUT/obj/libllama.a"
(cd "$OUT/obj" && ar r libllama.a llama-batched-transfers.cpp.o)
TOBJ=tools/transfer-tests/CMakeFiles/test-batched-transfers.dir/test-batched-transfers.cpp.o
if [ "${SAN_TEST:-0}" = 1 ]; then
    t=$(cmd $TOBJ); t=${t/-o $TOBJ/-o $OUT/obj/test.o}; t=${t/-MF $TOBJ.d/-MF $OUT/obj/test.d}; sh -c "$t $XC"
fi
for tgt in "$@"; do
    l=$(cmd bin/$tgt)
    l=${l//src\/libllama.a/$OUT/obj/libllama.a}
    l=${l/-o bin\/$tgt/-o $OUT/bin/$tgt}
    if [ "${SAN_TEST:-0}" = 1 ] && [ "$tgt" = test-batched-transfers ]; then l=${l/$TOBJ/$OUT/obj/test.o}; fi
    sh -c "$l $XL"
    echo "linked $OUT/bin/$tgt"
done
