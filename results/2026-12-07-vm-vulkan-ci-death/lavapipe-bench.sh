#!/bin/bash
# interleaved llama-bench rounds on lavapipe: off, batched, off again (A/A), one-shot (-r 1) then long (-r 3)
B=/work/main/.cache-test/builds/shared-vulkan-593beb599aba7a6e/patched/bin
M=/tmp/vkrepro/models/w5120-1l-s1234-7d8a3f4ec22f1370.gguf
out=/tmp/vkrepro/bench.csv; : > $out
run() { # devs reps mode sel round
  local vis=$1 reps=$2 mode=$3 sel=$4 round=$5 dev="Vulkan0"
  [ "$vis" = "0,0" ] && dev="Vulkan0,Vulkan1"
  GGML_VK_VISIBLE_DEVICES=$vis LLAMA_BATCHED_TRANSFERS=$sel LD_LIBRARY_PATH=$B timeout 400 $B/llama-bench -m $M \
    -p 128 -n 16 -r $reps -t 2 -ngl 99 -ub 64 -dev $dev -o csv 2>/dev/null | tail -2 | \
    awk -F'","' -v m=$mode -v v=$vis -v r=$round -v reps=$reps '{print v","reps","r","m","$(NF-7)","$(NF-6)","$(NF-1)}' >> $out
}
for vis in 0 0,0; do
  for r in 1 2 3; do for m in off:0 batched:1 off2:0; do run $vis 1 ${m%%:*} ${m##*:} $r; done; done
done
for m in off:0 batched:1 off2:0; do run 0 3 ${m%%:*} ${m##*:} long; done
GGML_VK_VISIBLE_DEVICES=0,0 LLAMA_BATCHED_TRANSFERS=1 LD_LIBRARY_PATH=$B $B/llama-bench -m $M -p 128 -n 16 -r 1 -t 2 -ngl 99 -ub 64 -dev Vulkan0,Vulkan1 -v 2>&1 | grep -a "llama_batched_transfers" > /tmp/vkrepro/bench-engaged.txt
echo done >> $out.done
