#!/usr/bin/env bash
# `ggml-bridge doctor` on a lent GPU machine without network, through the product's own CLI:
#   1. (step `build`, not in the default) the patched CUDA build the doctor's probe comes from:
#      `ggml-bridge build --backend cuda --variant patched --cuda-arch 90-real --no-ui` (minutes: its own call);
#   2. `doctor`: the full report with measurements on $DEVICES virtual devices of the GPU (GGML_CUDA_DEVICES, default
#      4: six pairs), the tiny model's hidden size and size; report.txt, doctor.json, probe.txt (the probe's raw
#      output) and pairs.png under $OUT/doctor/; then `doctor --json --quick` on the same devices
#      ($OUT/doctor-quick.json) and `doctor --quick` on the plain GPU ($OUT/doctor-1gpu.txt);
#   3. `serve`: the command line the first doctor run recommends (its doctor.json), with --check added: start, prove
#      what engaged on /metrics, stop.
# Each step only when the time left (BUDGET seconds from the start, default 170) allows it. $OUT gets summary.txt and
# results.tar.gz (steps.sh).
#
# Carry (git-ignored, see scripts/gpu/README.md): .whl/ with the Python packages the machine lacks (gitpython,
# gitdb, smmap, gguf as for prove.sh; nvidia-ml-py only where it is not installed: the H200 machine has it), and,
# only when the cache lacks the pinned tree, .carry/<sdist named in pin.toml>.
# Usage, from the repository root:  OUT=/tmp/out BUDGET=170 bash scripts/gpu/doctor.sh [build] [doctor] [serve]
#   (default: doctor serve). DEVICES=N virtual devices (0: the plain GPUs); BIN_DIR=DIR a build's bin folder instead
#   of the patched CUDA build's; PROBE_OUTPUT=FILE a saved probe output instead of running the probe (a dry run on a
#   machine without a GPU).
set -uo pipefail
repo=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GGML_BRIDGE_CACHE_DIR=${GGML_BRIDGE_CACHE_DIR:-$repo/.cache-gpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-170}
STEPS=${*:-doctor serve}
DEVICES=${DEVICES:-4}

# shellcheck source=scripts/gpu/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
trap bundle EXIT

log "doctor.sh: steps '$STEPS', $DEVICES virtual device(s), budget ${BUDGET}s"
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
    --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1   # the anchor the doctor's topology is compared with
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { log "cannot install the carried wheels"; exit 1; }
    export PYTHONPATH=/tmp/site:$repo
else
    export PYTHONPATH=$repo
fi
for mod in pynvml gguf git matplotlib numpy; do
    python3 -c "import $mod" 2>/dev/null || log "python module $mod is missing: carry its wheel in .whl/ (scripts/gpu/README.md)"
done
python3 -c "import pynvml; print('nvidia-ml-py', pynvml.__file__)" 2>&1 | tee -a "$OUT/summary.txt"
# the pinned sdist, where `ggml-bridge fetch` looks before the network (only needed when the cache lacks the tree)
if compgen -G ".carry/*.tar.gz" > /dev/null; then
    mkdir -p "$GGML_BRIDGE_CACHE_DIR/sdists" && cp .carry/*.tar.gz "$GGML_BRIDGE_CACHE_DIR/sdists/"
fi

if want build; then
    step build 200 590 "${gb[@]}" build --backend cuda --variant patched --cuda-arch 90-real --no-ui
    grep -E "^==>|done in|up to date|error|Error" "$OUT/build.txt" | tail -n 20 | tee -a "$OUT/summary.txt"
fi

bin=${BIN_DIR:-$("${gb[@]}" build --backend cuda --variant patched --print-bin-dir 2>/dev/null)} \
    || { log "no patched CUDA build in $GGML_BRIDGE_CACHE_DIR: run this script with the step 'build' first"; exit 1; }
log "build: $bin"
if [ ! -x "$bin/test-mapped-host-bridge" ]; then
    log "no test-mapped-host-bridge in $bin (not a patched CUDA build): the doctor will report no measurements"
elif [ -z "${PROBE_OUTPUT:-}" ] && [[ $("$bin/test-mapped-host-bridge" --no-such-option 2>&1) != *--probe* ]]; then
    # (its usage line, printed with exit 2, names --probe; not a pipe into grep: pipefail would take that exit 2)
    log "$bin/test-mapped-host-bridge has no --probe: the cached build predates this series; run the step 'build'"
    exit 1
fi
# the tiny random-weight model, from the pinned tree's vocabulary
pinned_vocab || exit 1
"${gb[@]}" model --shape tiny --vocab "$vocab" --out /tmp/tiny.gguf > /dev/null 2>&1 \
    || { log "cannot write /tmp/tiny.gguf"; exit 1; }

devices_env=()
[ "$DEVICES" -gt 0 ] && devices_env=(GGML_CUDA_DEVICES="$DEVICES")
probe_args=()
[ -n "${PROBE_OUTPUT:-}" ] && probe_args=(--probe-output "$PROBE_OUTPUT")
doctor=(env "${devices_env[@]}" "${gb[@]}" doctor --bin-dir "$bin" --model /tmp/tiny.gguf "${probe_args[@]}")

if want doctor; then
    step doctor 60 150 "${doctor[@]}" --out "$OUT/doctor" --time-budget 50
    grep -vE "^\+ |^==>|^    done in" "$OUT/doctor.txt" | tee -a "$OUT/summary.txt"
    # stdout alone is the JSON document (progress goes to doctor-quick.txt)
    step doctor-quick 30 90 bash -c '"$@" > "$0"' "$OUT/doctor-quick.json" "${doctor[@]}" --json --quick --time-budget 25
    if python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$OUT/doctor-quick.json" 2>/dev/null; then
        log "  doctor --json: valid JSON, recommends: $(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['recommendation']['command'])" "$OUT/doctor-quick.json")"
    else
        log "  doctor --json: stdout is not JSON:"; tail -n 5 "$OUT/doctor-quick.json" "$OUT/doctor-quick.txt" | tee -a "$OUT/summary.txt"
    fi
    if [ -z "${PROBE_OUTPUT:-}" ]; then
        step doctor-1gpu 20 60 "${gb[@]}" doctor --bin-dir "$bin" --model /tmp/tiny.gguf --quick --time-budget 15
    fi
fi

if want serve; then
    # the recommended command line from the report's JSON, with --check added after `serve` (and its log beside)
    if [ ! -f "$OUT/doctor/doctor.json" ]; then
        log "no $OUT/doctor/doctor.json: run the step 'doctor' first"; exit 1
    fi
    mapfile -t cmd < <(python3 - "$OUT/doctor/doctor.json" "$OUT/serve.log" <<'PY'
import json, sys
rec = json.load(open(sys.argv[1]))["recommendation"]
argv = rec["argv"]
at = argv.index("serve") + 1
print("env")
for k, v in rec["env"].items():
    print(f"{k}={v}")
print(sys.executable)
print("-m")
print("ggml_bridge")
for a in argv[1:at] + ["--check", "--server-log", sys.argv[2]] + argv[at:]:
    print(a)
PY
)
    log "recommended: $(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['recommendation']['command'])" "$OUT/doctor/doctor.json")"
    step serve-check 20 120 "${cmd[@]}"
    grep -E "^ggml-bridge: " "$OUT/serve-check.txt" | tail -n 12 | tee -a "$OUT/summary.txt"
fi
log "done: $(left)s of ${BUDGET}s left"
