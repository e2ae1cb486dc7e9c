"""scripts/gpu/probes: programs a lent machine compiles with its own nvcc, so that they must compile here too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ggml_bridge.distribution.builder import toolchain

from conftest import REPO_ROOT

PROBES = sorted((REPO_ROOT / "scripts" / "gpu" / "probes").glob("*.cu"))


def test_the_all_reduce_probe_is_there() -> None:
    assert [p.name for p in PROBES] == ["allreduce-latency.cu"]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_probe_compiles_for_hopper(probe: Path, tmp_path: Path) -> None:
    cuda = toolchain.detect_cuda()
    if cuda is None:
        pytest.skip("no nvcc")
    res = subprocess.run(
        [str(cuda.nvcc), "-O3", "-arch=sm_90", "-Werror", "all-warnings", "-o", str(tmp_path / "probe"), str(probe)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "probe").stat().st_size > 0
