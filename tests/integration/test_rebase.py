"""rebase onto the real llama.cpp trees of llama-cpp-python 0.3.35 and 0.3.34 (slow; the synthetic upstreams are in
tests/unit/upstream/test_rebase.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import RebaseConflict
from ggml_bridge.upstream import patch
from ggml_bridge.upstream import pin as pinmod
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.rebase.job import rebase
from ggml_bridge.upstream.rebase.report import Options

from helpers import expected_outcomes as _expected
from helpers import rebase_statuses as _statuses

# --------------------------------------------------------------------------------------------- slow: real trees


@pytest.fixture
def _real_binaries_for_slow_tests() -> None:
    """Override conftest's autouse fixture: this slow test builds nothing."""


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.3.35", "0.3.34"])
def test_real_llama_cpp_python_sdists(version: str, real_settings: config.Settings, tmp_path: Path) -> None:
    onto = f"llama-cpp-python=={version}"
    rep = rebase(
        real_settings, onto, Options(check=True, base_source=os.environ.get("GGML_BRIDGE_TEST_SOURCE") or None)
    )
    series = patch.read_series(real_settings.patches_dir)
    new = obtain(real_settings, onto, allow_unpinned=True)
    old = obtain(real_settings, os.environ.get("GGML_BRIDGE_TEST_SOURCE") or None)
    expected = _expected(new.path, old.path, [p.path for p in series.patches], tmp_path)
    got = _statuses(rep)
    print(f"\nllama-cpp-python {version} ({new.commit}):")
    for r in rep.results:
        print(f"  {r.status:<9} {r.name} {'; '.join(r.hunks[:4])}")
    assert got == expected
    assert rep.target_commit == new.commit and rep.target_commit.startswith(
        {"0.3.35": "4df29be4f", "0.3.34": "e3546c794"}[version]
    )
    # and in write mode on a copy of the project: it writes exactly when the check says everything applies
    proj = tmp_path / "project"
    proj.mkdir()
    shutil.copy(real_settings.pin_file, proj / "pin.toml")
    shutil.copytree(real_settings.patches_dir, proj / "patches")
    s = config.load({"cache_dir": str(real_settings.cache_dir), "project_dir": str(proj)}, env={}, cwd=tmp_path)
    opts = Options(
        build=False,
        cuda_check=False,
        report_dir=tmp_path / "rep",
        base_source=os.environ.get("GGML_BRIDGE_TEST_SOURCE") or None,
    )
    if rep.ok:
        assert rebase(s, onto, opts).state == "rebased"
        assert pinmod.load(proj / "pin.toml").commit == new.commit
    else:
        with pytest.raises(RebaseConflict):
            rebase(s, onto, opts)
        assert (proj / "pin.toml").read_bytes() == real_settings.pin_file.read_bytes()
