"""The Makefile's test-fast line, as make expands it (``make -n``: printed, not run)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import REPO_ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_the_bytecode_prefix_of_test_fast_is_absolute_for_a_relative_cache_dir() -> None:
    """The tests chdir into scratch folders: a relative PYTHONPYCACHEPREFIX put bytecode there, and the sweep
    (tests/unit/cli/test_sweep.py) then saw files written to the current folder."""
    out = subprocess.run(
        ["make", "-n", "test-fast", "GGML_BRIDGE_TEST_CACHE_DIR=rel/cache"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "GGML_BRIDGE_", "VIRTUAL_ENV"))},
    ).stdout
    line = next(x for x in out.splitlines() if "PYTHONPYCACHEPREFIX=" in x)
    prefix = line.split("PYTHONPYCACHEPREFIX=", 1)[1].split()[0]
    assert os.path.isabs(prefix), line
    assert prefix == str(REPO_ROOT / "rel" / "cache" / "pycache"), line
