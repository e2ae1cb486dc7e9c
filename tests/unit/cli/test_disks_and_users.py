"""Full disks and shared caches, for real: a small tmpfs (mounted where the machine allows it: root, as on CI) and a
second user (``setpriv`` to a uid of its own), so that these classes of fault cannot come back. Where mounting or
switching users is not permitted these tests skip; the same faults simulated (ENOSPC raised at the write,
``/dev/full``, a second uid given to ``os.getuid``) run everywhere, in the tests of each stage and here
(``test_serve_with_its_log_on_dev_full``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config
from ggml_bridge.foundations.layout import Layout
from ggml_bridge.runtime import llama_server

from helpers import (
    OTHER_UID,
    REPO_ROOT,
    fake_model,
    fill,
    other_user_or_skip,
    run_as_other_user,
    shared_folder,
    small_disk_or_skip,
    unmount,
    write_fake_bin,
)

OFFLINE = {"GGML_BRIDGE_SOURCES": "pypi-sdist", "GGML_BRIDGE_PYPI_URL": "http://127.0.0.1:9"}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (skips where it cannot be mounted)."""
    where = small_disk_or_skip(tmp_path / "disk")
    try:
        yield where
    finally:
        unmount(where)


def _one_error_line(err: str) -> None:
    assert "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("ggml-bridge: ")]) == 1, err


# --------------------------------------------------------------------------------------------- full disks


def test_fetch_onto_a_full_disk_is_exit_13_and_leaves_nothing(
    cli_settings: config.Settings, disk: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    cache = Layout(disk / "cache")
    cache.tmp.mkdir(parents=True)
    fill(disk)
    monkeypatch.setenv("GGML_BRIDGE_SOURCES", "pypi-sdist")
    rc = cli.main(["fetch", "--cache-dir", str(cache.root)])
    err = capfd.readouterr().err
    assert rc == 13 and "the disk is full" in err, err
    _one_error_line(err)
    assert not list(cache.root.rglob("*.part")) and not cache.trees.exists()
    assert [p.name for p in cache.tmp.iterdir()] == []


def test_patch_onto_a_full_disk_is_exit_13_and_keeps_the_tree(
    cli_settings: config.Settings, disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    cache = Layout(disk / "cache")
    assert cli.main(["fetch", "--cache-dir", str(cache.root)]) == 0
    tree_files = sorted(p.relative_to(cache.root) for p in cache.trees.rglob("*"))
    capfd.readouterr()
    fill(disk)
    rc = cli.main(["patch", "--cache-dir", str(cache.root)])
    err = capfd.readouterr().err
    assert rc == 13 and "the disk is full" in err, err
    _one_error_line(err)
    assert not cache.work.exists() or not any(cache.work.iterdir())
    assert sorted(p.relative_to(cache.root) for p in cache.trees.rglob("*")) == tree_files


def test_a_read_only_cache_offline_is_exit_13(
    cli_settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Offline with a read-only cache the fetch said "check the network" (exit 10): the cache comes first."""
    where = small_disk_or_skip(tmp_path / "ro", read_only=True)
    try:
        for k, v in OFFLINE.items():
            monkeypatch.setenv(k, v)
        rc = cli.main(["fetch", "--cache-dir", str(where / "cache")])
    finally:
        unmount(where)
    err = capfd.readouterr().err
    assert rc == 13 and "read-only" in err, err
    _one_error_line(err)


def _serve_check_with_log(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    """``serve --check`` of a fake llama-server that prints 5000 lines (400 kB) before it listens, its log at
    ``log``."""
    bin_dir = write_fake_bin(tmp_path / "bin")
    model = fake_model(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "GGML_BRIDGE_"))}
    env.update(PYTHONPATH=str(REPO_ROOT), FAKE_NOISE="5000")
    argv = ["serve", "--check", "--startup-timeout", "60", "--server", str(bin_dir / "llama-server")]
    argv += ["--server-log", str(log), "--", "-m", str(model), "--port", str(llama_server.free_port())]
    return subprocess.run(
        [sys.executable, "-m", "ggml_bridge", *argv], env=env, capture_output=True, text=True, timeout=120
    )


def test_serve_with_its_log_on_a_full_disk_keeps_serving(tmp_path: Path, disk: Path) -> None:
    """The log pump died at the first ENOSPC: nobody read llama-server's output, the server blocked on its next
    write (here: before it listened, so serve waited for it until the start-up timeout)."""
    fill(disk, leave=16384)
    res = _serve_check_with_log(tmp_path, disk / "server.log")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("stopped: the disk is full") == 1, res.stderr[-2000:]
    assert "check passed" in res.stderr


def test_serve_with_its_log_on_dev_full(tmp_path: Path) -> None:
    """The same with /dev/full (every write fails with ENOSPC): no mount needed, so it runs everywhere."""
    res = _serve_check_with_log(tmp_path, Path("/dev/full"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("/dev/full stopped: the disk is full") == 1 and "check passed" in res.stderr


# --------------------------------------------------------------------------------------------- another user


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    d = shared_folder(tmp_path)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _open_to_all(root: Path) -> None:
    """What a group-writable shared cache is: every folder and file writable by the other user too."""
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            mode = p.stat().st_mode
            p.chmod(mode | stat.S_IRWXO if stat.S_ISDIR(mode) else mode | stat.S_IROTH | stat.S_IWOTH)


def _shared_project(settings: config.Settings, shared: Path) -> Path:
    project = shared / "project"
    shutil.copytree(settings.project_dir, project)
    _open_to_all(project)
    return project


def test_another_users_hand_edits_in_a_shared_cache_are_kept(
    cli_settings: config.Settings, shared: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A group-writable cache shared by two users: git will not read the owner's work tree for the other user
    ("dubious ownership"). The other user's `patch` deleted it as "stale", with the owner's edits."""
    prefix = other_user_or_skip()
    project, cache = _shared_project(cli_settings, shared), shared / "cache"
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(project))
    assert cli.main(["patch", "--cache-dir", str(cache)]) == 0
    wt = Path(capfd.readouterr().out.strip())
    (wt / "CMakeLists.txt").write_text((wt / "CMakeLists.txt").read_text() + "# the owner's edit\n")
    (wt / "NOTES.md").write_text("the owner's notes\n")
    _open_to_all(cache)
    env = {"GGML_BRIDGE_PROJECT_DIR": str(project), "GGML_BRIDGE_PYPI_URL": cli_settings.fetch.pypi_url}
    res = run_as_other_user(prefix, ["patch", "--cache-dir", str(cache)], env, shared / "home")
    assert res.returncode == 21, res.stderr
    assert "--discard-changes" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert (wt / "NOTES.md").read_text() == "the owner's notes\n"
    assert "# the owner's edit" in (wt / "CMakeLists.txt").read_text()


def test_inputs_another_user_cannot_read_are_one_error_each(  # type: ignore[no-untyped-def]
    cli_settings: config.Settings, shared: Path, upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ladder file, a source tarball and a patch of the series that the user cannot read: one line each with the
    stage's exit code, never a traceback."""
    prefix = other_user_or_skip()
    project = _shared_project(cli_settings, shared)
    private = shared / "private"
    private.mkdir()
    (private / "ladder.toml").write_text('[[rung]]\nname = "r"\nshape = "tiny"\n')
    shutil.copy(upstream.sdist, private / "llama.tar.gz")
    private.chmod(0o755)
    for f in private.iterdir():
        f.chmod(0o600)
    patch = next((project / "patches").glob("*.patch"))
    patch.chmod(0o600)
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(project))
    env = {"GGML_BRIDGE_PROJECT_DIR": str(project), "GGML_BRIDGE_PYPI_URL": cli_settings.fetch.pypi_url}
    cache = shared / "cache"
    assert cli.main(["fetch", "--cache-dir", str(cache)]) == 0  # the pinned tree, cached for both
    _open_to_all(cache)
    cases = [
        (["ladder", "--ladder", str(private / "ladder.toml")], 70),
        (["fetch", "--source", str(private / "llama.tar.gz"), "--allow-unpinned"], 12),
    ]
    for argv, code in cases:
        res = run_as_other_user(prefix, [*argv, "--cache-dir", str(cache)], env, shared / "home")
        assert res.returncode == code and "permission denied" in res.stderr, (argv, res.stderr)
        _one_error_line(res.stderr)
    res = run_as_other_user(prefix, ["patch", "--check", "--cache-dir", str(cache)], env, shared / "home")
    assert res.returncode == 20 and patch.name in res.stderr and "permission denied" in res.stderr, res.stderr
    _one_error_line(res.stderr)
    assert OTHER_UID != os.getuid()
