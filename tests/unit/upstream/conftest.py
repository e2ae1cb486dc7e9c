"""Fixtures of the rebase and radar tests: the synthetic upstream of :func:`helpers.make_rebase_upstream`
(``rebase_upstream``), a project checkout pinned to its b1 (``rebase_project``) and its settings
(``rebase_settings``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ggml_bridge.foundations import config

from fixtures import fakellama
from helpers import RebaseUpstream, make_rebase_upstream, rebase_pin_text


@pytest.fixture(scope="module")
def rebase_upstream(tmp_path_factory: pytest.TempPathFactory) -> RebaseUpstream:
    """The upstream of :func:`helpers.make_rebase_upstream`, once per module."""
    return make_rebase_upstream(tmp_path_factory.mktemp("rebase-up"))


@pytest.fixture
def rebase_project(tmp_path: Path, rebase_upstream: RebaseUpstream) -> Path:
    """A project checkout (git, committed) pinned to b1 with the two-patch series."""
    p = tmp_path / "project"
    p.mkdir()
    shutil.copytree(rebase_upstream.patches, p / "patches")
    (p / "pin.toml").write_text(rebase_pin_text(rebase_upstream))
    fakellama.git(p, "init", "-q", "-b", "main")
    fakellama.git(p, "add", "-A")
    fakellama.git(p, "commit", "-q", "-m", "project")
    return p


@pytest.fixture
def rebase_settings(tmp_path: Path, rebase_project: Path, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    for var in list(os.environ):
        if var.startswith("GGML_BRIDGE_"):
            monkeypatch.delenv(var)
    # cli.main() reads these: never the real checkout or the user's cache
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(rebase_project))
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    return config.load(
        {
            "cache_dir": str(tmp_path / "cache"),
            "project_dir": str(rebase_project),
            "fetch.connect_timeout": 2.0,
            "build.backend": "cpu",
        },
        env={},
        cwd=tmp_path,
    )
