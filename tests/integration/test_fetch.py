"""fetch of the real pinned llama.cpp (slow; the fake upstream ones are in tests/unit/upstream/test_fetch.py)."""

from __future__ import annotations

import socket

import pytest
import requests

from ggml_bridge.foundations import config
from ggml_bridge.upstream import pin
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.fetch.tree import Tree

# --------------------------------------------------------------------------------------------- slow: the real thing


@pytest.mark.slow
def test_real_fetch_of_the_pinned_tree(
    real_tree: Tree, real_settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pinned upstream from the real sources (GitHub is tried first; the PyPI sdist where it is unreachable)."""
    p = pin.load(real_settings.pin_file)
    assert real_tree.pinned and real_tree.commit == p.commit
    for f in p.expect_files:
        assert (real_tree.path / f).is_file(), f
    assert not (real_tree.path / ".git").exists()
    assert real_tree.origin.split()[0] in ("git", "archive", "pypi-sdist")
    if real_tree.origin.startswith("pypi-sdist"):
        assert real_tree.archive_sha256 == next(s.sha256 for s in p.sources if s.kind == "pypi-sdist")
    monkeypatch.setattr(requests, "get", lambda *a, **k: pytest.fail("network on a cache hit"))
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network on a cache hit"))
    assert obtain(real_settings) == real_tree
