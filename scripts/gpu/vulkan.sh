#!/usr/bin/env bash
# Batched transfers on a GPU through Vulkan, in one call on a lent machine without network (Ubuntu 24.04, NVIDIA
# driver with its Vulkan ICD, but no Vulkan loader, no glslc), through the product's own CLI:
#   1. unpack the carried Debian packages (.carry-vk/, filled by scripts/gpu/carry-vk.sh) into /tmp/vk-root: the
#      loader, glslc, SPIRV-Headers, the 1.4.309 headers, vulkaninfo; nothing is installed;
#   2. `vulkaninfo --summary`: does the GPU appear as a Vulkan device? If not, say so with the output and stop;
#   3. `ggml-bridge build --backend vulkan --shared-tree --variant upstream,patched` (VULKAN_SDK=/tmp/vk-root/usr);
#   4. test-batched-transfers on two Vulkan devices over the one GPU (GGML_VK_VISIBLE_DEVICES=0,0) with a tiny model;
#   5. the Vulkan ladder (ladders/vulkan.toml: upstream vs patched, batching off and on, byte for byte, two devices);
#   6. `ggml-bridge bench --suite batched` (tg128 and pp512, batching off vs on, interleaved rounds) on one device;
# each step only when the time left (BUDGET seconds from the start) allows it. $OUT gets summary.txt and
# results.tar.gz (every log, report and manifest).
#
# Carry (git-ignored): .carry-vk/ (scripts/gpu/carry-vk.sh), .carry/<the pinned sdist>, .whl/ (as prove.sh).
# Usage, from the repository root:  OUT=/tmp/out BUDGET=570 bash scripts/gpu/vulkan.sh [STEP ...]
#   STEP: vulkaninfo build tests ladder bench mixed (default: all but mixed; steps run in the order above, mixed
#   right after build); mixed: ggml-bridge build --backend cuda-vulkan (CUDA and Vulkan in one build, about 400 s on
#   16 cores) and ladders/cuda-vulkan.toml, a model split over CUDA0 and Vulkan0 of the GPU
set -uo pipefail
repo=$(pwd)
export PYTHONUNBUFFERED=1
export GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-570}
STEPS=${*:-vulkaninfo build tests ladder bench}

# shellcheck source=scripts/gpu/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
trap bundle EXIT

nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
ls -l /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ >> "$OUT/summary.txt" 2>&1

# 1. the carried Debian packages, checked and unpacked: the Vulkan pieces into /tmp/vk-root; the libraries only
# vulkaninfo links (X11, wayland) into /tmp/vk-xlibs, used only for the ones the system lacks
(cd .carry-vk && sha256sum -c --quiet SHA256SUMS) || { log "the .carry-vk/ packages do not match SHA256SUMS"; exit 1; }
rm -rf /tmp/vk-root /tmp/vk-xlibs && mkdir -p /tmp/vk-root /tmp/vk-xlibs
for deb in .carry-vk/*.deb; do
    case $(basename "$deb") in
        libvulkan1_* | libvulkan-dev_* | glslc_* | libshaderc1_* | spirv-headers_* | vulkan-tools_*)
            dpkg-deb -x "$deb" /tmp/vk-root ;;
        *) dpkg-deb -x "$deb" /tmp/vk-xlibs ;;
    esac
done
vklib=/tmp/vk-root/usr/lib/x86_64-linux-gnu
export VULKAN_SDK=/tmp/vk-root/usr PATH=/tmp/vk-root/usr/bin:$PATH
export LD_LIBRARY_PATH=$vklib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log "carried: $(basename -a .carry-vk/*.deb | tr '\n' ' ')"
log "glslc: $(glslc --version 2>&1 | head -1); loader: $(ls $vklib/libvulkan.so.1.*)"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$repo || { log "cannot install the carried wheels"; exit 1; }
mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"

# The driver's manifest names libGLX_nvidia.so.0, which needs an X display: on a headless server it loads but
# returns no vkCreateInstance ("Found no drivers"). The same driver's EGL library is a Vulkan ICD that works
# without a display; when the system manifest names GLX and the EGL library is there, use a manifest naming it.
sysicd=$(ls /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json 2>/dev/null | head -1)
egl=$( (ldconfig -p | awk '/libEGL_nvidia\.so\.0 / {print $NF}'; ls /usr/lib/libEGL_nvidia.so.0 /usr/local/nvidia/lib64/libEGL_nvidia.so.0) 2>/dev/null | head -1)
if [ -n "$sysicd" ] && [ -n "$egl" ] && grep -q libGLX_nvidia "$sysicd"; then
    sed 's/libGLX_nvidia\.so\.0/libEGL_nvidia.so.0/' "$sysicd" > /tmp/vk-root/nvidia_egl_icd.json
    export VK_DRIVER_FILES=/tmp/vk-root/nvidia_egl_icd.json VK_ICD_FILENAMES=/tmp/vk-root/nvidia_egl_icd.json
    log "Vulkan ICD: $sysicd names libGLX_nvidia.so.0 (needs X); using libEGL_nvidia.so.0 ($VK_DRIVER_FILES)"
fi

# 2. does the GPU appear as a Vulkan device?
if want vulkaninfo; then
    missing=$(LD_LIBRARY_PATH=$LD_LIBRARY_PATH ldd /tmp/vk-root/usr/bin/vulkaninfo | awk '/not found/ {print $1}')
    mkdir -p /tmp/vk-xonly
    for lib in $missing; do ln -sf /tmp/vk-xlibs/usr/lib/x86_64-linux-gnu/"$lib" /tmp/vk-xonly/; done
    log "vulkaninfo: system lacks: ${missing:-nothing}"
    step vulkaninfo 5 60 env LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/tmp/vk-xonly" vulkaninfo --summary
    grep -E "deviceName|deviceType|driverName|driverInfo|apiVersion|ERROR" "$OUT/vulkaninfo.txt" | tee -a "$OUT/summary.txt"
    if ! grep -q "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\|PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU" "$OUT/vulkaninfo.txt"; then
        log "no GPU among the Vulkan devices (output above and in vulkaninfo.txt): stopping here"
        exit 0
    fi
fi

if want build; then
    step build 150 420 "${gb[@]}" build --backend vulkan --no-ui --shared-tree --variant upstream,patched
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build.txt" | tail -n 20 | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/manifests"
    for v in upstream patched; do
        m=$("${gb[@]}" build --backend vulkan --variant "$v" --print-manifest 2>/dev/null) && cp "$m" "$OUT/manifests/$v.json"
    done
fi
pinned_vocab || exit 1

# a model split over a CUDA and a Vulkan device of the one GPU: ggml-cuda and ggml-vulkan in one build, then
# ladders/cuda-vulkan.toml (upstream vs patched, batching off and on, byte for byte; a pinned pool per backend)
if want mixed; then
    step build-mixed 300 480 "${gb[@]}" build --backend cuda-vulkan --cuda-arch 90 --no-ui --shared-tree \
        --variant upstream,patched
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build-mixed.txt" | tail -n 20 | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/manifests-mixed"
    for v in upstream patched; do
        m=$("${gb[@]}" build --backend cuda-vulkan --variant "$v" --print-manifest 2>/dev/null) &&
            cp "$m" "$OUT/manifests-mixed/$v.json"
    done
    if mp=$(bindir patched cuda-vulkan) && mu=$(bindir upstream cuda-vulkan); then
        "$mp/llama-server" --list-devices 2>&1 | grep -E "CUDA|Vulkan" | tee -a "$OUT/summary.txt"
        step ladder-mixed 40 200 "${gb[@]}" ladder --ladder ladders/cuda-vulkan.toml --vocab "$vocab" \
            --bin-dir-patched "$mp" --bin-dir-upstream "$mu" --report "$OUT/ladder-mixed"
        grep -E "^\[|==> ladder" "$OUT/ladder-mixed.txt" | tail -n 6 | tee -a "$OUT/summary.txt"
        rm -f "$OUT"/ladder-mixed/*/*/*.bin 2>/dev/null
    else
        log "the CUDA + Vulkan builds are not there: no mixed ladder"
    fi
fi

if want tests || want ladder || want bench; then
    pbin=$(bindir patched vulkan) && ubin=$(bindir upstream vulkan) || { log "the Vulkan builds are not there: stopping"; exit 1; }
    bins=(--bin-dir-patched "$pbin" --bin-dir-upstream "$ubin")
    env GGML_VK_VISIBLE_DEVICES=0,0 "$pbin/llama-server" --list-devices 2>&1 | grep -E "Vulkan|ggml_vulkan" |
        tee -a "$OUT/summary.txt"
fi

if want tests; then
    "${gb[@]}" model --shape tiny --vocab "$vocab" --out /tmp/tiny.gguf > /dev/null 2>&1
    step test-batched-2dev 15 120 env GGML_VK_VISIBLE_DEVICES=0,0 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
    grep -E "GPU device|batched transfers (not )?available|^main: stats|^second-gpu: stats|passed|FAIL" \
        "$OUT/test-batched-2dev.txt" | tail -n 12 | tee -a "$OUT/summary.txt"
    # uploads on the GPU's separate transfer queue (lavapipe has one queue, so only a GPU exercises this): the
    # ordering behind earlier compute (ev_prior) is what keeps these outputs exact
    step test-batched-transfer-queue 15 120 env GGML_VK_VISIBLE_DEVICES=0,0 GGML_VK_ASYNC_USE_TRANSFER_QUEUE=1 \
        "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
    grep -E "passed|FAIL" "$OUT/test-batched-transfer-queue.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
    step test-batched-perf-logger 15 120 env GGML_VK_PERF_LOGGER=1 "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
    grep -E "passed|FAIL" "$OUT/test-batched-perf-logger.txt" | tail -n 3 | tee -a "$OUT/summary.txt"
    if grep -q "GGML_ASSERT" "$OUT/test-batched-perf-logger.txt" && command -v gdb > /dev/null; then
        # where it aborted, by function: the build has symbols but no line tables
        step perf-logger-gdb 15 120 env GGML_VK_PERF_LOGGER=1 gdb -q -batch -ex run -ex bt \
            --args "$pbin/test-batched-transfers" --model /tmp/tiny.gguf
        grep -E "^#[0-9]+ " "$OUT/perf-logger-gdb.txt" | head -n 14 | cut -c1-200 | tee -a "$OUT/summary.txt"
    elif grep -q "GGML_ASSERT" "$OUT/test-batched-perf-logger.txt"; then
        # no gdb: the backtrace's offsets by the binary's symbol table (a PIE: nm's addresses are offsets)
        nm -C --defined-only "$pbin/test-batched-transfers" > "$OUT/nm.txt"
        python3 - "$OUT/nm.txt" "$OUT/test-batched-perf-logger.txt" <<'PY' | tee -a "$OUT/summary.txt"
import bisect, re, sys
syms = sorted((int(a, 16), n) for a, _, n in (l.rstrip("\n").split(" ", 2) for l in open(sys.argv[1])) if a)
keys = [a for a, _ in syms]
for off in re.findall(r"test-batched-transfers\(\+(0x[0-9a-f]+)\)", open(sys.argv[2], errors="replace").read()):
    i = bisect.bisect_right(keys, int(off, 16)) - 1
    print(off, syms[i][1][:160] if i >= 0 else "?")
PY
    fi
fi

if want ladder; then
    step ladder 40 150 "${gb[@]}" ladder --ladder ladders/vulkan.toml --vocab "$vocab" "${bins[@]}" --report "$OUT/ladder"
    grep -E "^\[|==> ladder" "$OUT/ladder.txt" | tail -n 6 | tee -a "$OUT/summary.txt"
    # the same rungs with uploads on the transfer queue
    step ladder-transfer-queue 40 150 env GGML_VK_ASYNC_USE_TRANSFER_QUEUE=1 "${gb[@]}" ladder \
        --ladder ladders/vulkan.toml --vocab "$vocab" "${bins[@]}" --report "$OUT/ladder-transfer-queue"
    grep -E "^\[|==> ladder" "$OUT/ladder-transfer-queue.txt" | tail -n 6 | tee -a "$OUT/summary.txt"
    rm -f "$OUT"/ladder*/*/*.bin 2>/dev/null
fi

if want bench; then
    # batching off vs on, one Vulkan device (the GPU), tg128 and pp512, interleaved rounds within the time left
    budget=$(( $(left) - 40 ))
    step bench-batched 60 $((budget + 30)) "${gb[@]}" bench --no-build --no-microbench --suite batched \
        --rounds 10 --time-budget "$budget" --vocab "$vocab" "${bins[@]}" --report "$OUT/bench/batched"
    grep "^|" "$OUT/bench/batched/bench.md" 2>/dev/null | tee -a "$OUT/summary.txt"
fi
log "done"
