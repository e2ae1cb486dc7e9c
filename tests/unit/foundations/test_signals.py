"""Stop signals to `ggml-bridge build` and `patch --check` (issue 15 item 2): real process trees.

A fake ninja (or git) on PATH spawns a small tree (a child, a grandchild in a shell, a child in its own process
group, like ninja's compilers) and records the pids; the test then signals the launcher's pid only, as
`kill PID`, `timeout` or a CI cancel do. Nothing of the tree may survive, the build lock must be free and the
temporary trees gone, and the exit status is 128 + the signal.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from ggml_bridge.foundations import config, signals
from ggml_bridge.foundations.errors import UsageError

from conftest import REPO_ROOT

TREE = r'''
sleep 600 & echo $! >> "$PIDS"
sh -c 'sleep 600 & echo $! >> "$PIDS"; wait' & echo $! >> "$PIDS"
setsid sh -c 'echo $$ >> "$PIDS"; trap "" TERM; sleep 600' & echo $! >> "$PIDS"
echo $$ >> "$PIDS"
wait
'''
#: the lines TREE appends to $PIDS: the sleep, the inner sleep and its shell, the setsid shell's $$ and $!, the tool
TREE_PID_LINES = 6


def _tool(bindir: Path, name: str, real: str, hang_when: str) -> None:
    """``name`` on PATH: the real tool, except that a call whose arguments contain ``hang_when`` runs TREE."""
    bindir.mkdir(exist_ok=True)
    p = bindir / name
    p.write_text(
        f'#!/bin/sh\ncase " $* " in *"{hang_when}"*) ;; *) exec {real} "$@";; esac\necho "[1/9] fake step"\n{TREE}'
    )
    p.chmod(0o755)


def _launch(
    settings: config.Settings, tmp_path: Path, argv: list[str], **env: str
) -> tuple[subprocess.Popen[str], Path]:
    pids = tmp_path / "pids"
    full = {k: v for k, v in os.environ.items() if not k.startswith("GGML_BRIDGE_") and k != "CMAKE_ARGS"}
    full.update(
        {
            "PIDS": str(pids),
            "PYTHONPATH": str(REPO_ROOT),
            "GGML_BRIDGE_PROJECT_DIR": str(settings.project_dir),
            "GGML_BRIDGE_PYPI_URL": settings.fetch.pypi_url,
            "GGML_BRIDGE_BACKEND": "cpu",
            "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
            # the tree's setsid child ignores SIGTERM: it is SIGKILLed after this grace (default 10 s)
            signals.STOP_GRACE_VAR: "0.5",
            **env,
        }
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "ggml_bridge", "--cache-dir", str(settings.cache_dir), *argv],
        env=full,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return p, pids


def _tree_of(p: subprocess.Popen[str], pids: Path) -> dict[int, int]:
    """Wait until the fake tool recorded all 6 of its pid lines (the setsid child's may repeat its own); returns
    every process under the launcher then. The pids are read before the scan: a line written after it named a
    process the scan could not have seen."""
    t0 = time.monotonic()
    while not (pids.is_file() and len(pids.read_text().split()) >= TREE_PID_LINES):
        if p.poll() is not None or time.monotonic() - t0 > 120:
            raise AssertionError(f"the fake tree never started: {p.communicate()[1][-3000:]}")
        time.sleep(0.05)
    recorded = {int(x) for x in pids.read_text().split()}
    tree = signals.descendants(p.pid)
    assert recorded <= set(tree), (recorded, tree)
    return tree


def _gone(tree: dict[int, int]) -> list[int]:
    return [pid for pid, started in tree.items() if signals._alive(pid, started)]


def _kill_leftovers(tree: dict[int, int]) -> None:
    for pid in _gone(tree):
        os.kill(pid, signal.SIGKILL)


def _signal_and_wait(
    p: subprocess.Popen[str], pids: Path, sig: int, while_running: Callable[[], object] = lambda: None
) -> str:
    """Once the launcher's process tree is up (and ``while_running`` holds), send ``sig`` to the launcher's pid
    only; the launcher must exit with 128 + sig and leave no process of its tree running. Returns its stderr.
    Whatever happens, nothing of the tree is left behind by the test."""
    tree: dict[int, int] = {}
    try:
        tree = _tree_of(p, pids)
        while_running()
        p.send_signal(sig)
        rc = p.wait(60)
        err = p.stderr.read()
        left = _gone(tree)
    finally:
        if p.poll() is None:
            p.kill()
        _kill_leftovers(tree)
    assert rc == 128 + sig, err
    assert not left, f"still running after the launcher exited: {left}"
    return err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_build_stops_the_whole_tree_before_the_lock_is_released(
    settings: config.Settings, tmp_path: Path, sig: int
) -> None:
    _tool(tmp_path / "bin", "ninja", shutil.which("ninja") or "ninja", "llama-server")
    p, pids = _launch(settings, tmp_path, ["build", "-j", "2"])
    err = _signal_and_wait(p, pids, sig)
    assert f"interrupted by {signal.Signals(sig).name}" in err and "Traceback" not in err
    locks = list(settings.layout.builds.glob("*.lock"))
    assert locks
    for lock in locks:
        with open(lock) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: raises BlockingIOError if held


def test_sigterm_to_patch_check_stops_git_and_removes_the_temporary_tree(
    settings: config.Settings, tmp_path: Path
) -> None:
    _tool(tmp_path / "bin", "git-am-hangs", shutil.which("git") or "git", " am ")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    p, pids = _launch(
        settings,
        tmp_path,
        ["patch", "--check"],
        TMPDIR=str(tmpdir),
        GIT_PYTHON_GIT_EXECUTABLE=str(tmp_path / "bin" / "git-am-hangs"),
    )

    def temporary_tree_exists() -> None:
        assert list(tmpdir.glob("ggml-bridge-check-*"))

    _signal_and_wait(p, pids, signal.SIGTERM, while_running=temporary_tree_exists)
    assert not list(tmpdir.glob("ggml-bridge-check-*")), "temporary tree left behind"


#: A program that starts a git through ``ggml_bridge.foundations.gitrepo`` inside the command line's signal frame: by GitPython's
#: object model (``repo.git.fsck()``) or by :func:`gitrepo.run`; exits 128 + the signal like ``cli.main``.
GIT_THROUGH_THE_FACADE = """
import sys
from ggml_bridge.foundations import gitrepo, signals
try:
    with signals.stop_children_on_signals():
        repo = gitrepo.init(sys.argv[1])
        if sys.argv[2] == "gitpython":
            repo.git.fsck()
        else:
            gitrepo.run(sys.argv[1], "fsck")
except signals.Interrupted as e:
    sys.exit(e.exit_code)
"""


@pytest.mark.parametrize("way", ["gitpython", "run"])
def test_a_stop_signal_reaches_a_git_started_through_the_facade(tmp_path: Path, way: str) -> None:
    """Every git of the package is started by the runner (``ggml_bridge.foundations.gitrepo``): logged, and stopped with its
    whole tree on a stop signal, GitPython's commands included."""
    _tool(tmp_path / "bin", "git-fsck-hangs", shutil.which("git") or "git", " fsck ")
    pids = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_BRIDGE_")}
    env.update(
        {
            "PIDS": str(pids),
            "PYTHONPATH": str(REPO_ROOT),
            "GIT_PYTHON_GIT_EXECUTABLE": str(tmp_path / "bin" / "git-fsck-hangs"),
            signals.STOP_GRACE_VAR: "0.5",
        }
    )
    p = subprocess.Popen(
        [sys.executable, "-c", GIT_THROUGH_THE_FACADE, str(tmp_path / "repo"), way],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err = _signal_and_wait(p, pids, signal.SIGTERM)
    started = [line for line in err.splitlines() if line.startswith("+ LC_ALL=C ") and "/git-fsck-hangs " in line]
    assert [re.sub(r".*/git-fsck-hangs (-C \S+ )?(\w+).*", r"\2", line) for line in started] == ["init", "fsck"], err
    assert "SIGTERM received: stopping child processes" in err


def test_stop_grace_comes_from_the_environment() -> None:
    assert signals.stop_grace({}) == signals.STOP_GRACE_S == 10.0
    assert signals.stop_grace({signals.STOP_GRACE_VAR: "0.5"}) == 0.5
    for bad in ("soon", "-1", "601"):
        with pytest.raises(UsageError, match=signals.STOP_GRACE_VAR):
            signals.stop_grace({signals.STOP_GRACE_VAR: bad})
