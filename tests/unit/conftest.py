"""Fixtures of the unit tests of several wings: bench on fake variants whose programs record their command lines
(``bench_env``: runtime's rpc tests, experiments' rpc topologies); ``cli.main`` on the fake project
(``cli_settings``: the cli and fetch tests); bench's plots only where asked for (``plots`` marker). A fixture that
one wing's tests use is in that wing's conftest.py, one that one module uses is in that module."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ggml_bridge.foundations import config
from ggml_bridge.runtime import rpc
from ggml_bridge.upstream.fetch import archive

from helpers import BenchEnv, write_fake_variants


@pytest.fixture(autouse=True)
def _bench_plots(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench renders its report's PNG plots with matplotlib, a third of a CPU-second each. Tests marked ``plots``
    render them (one per kind of suite: throughput with the microbenchmark, rpc, link); the others read no plot,
    and there bench's plot step makes none."""
    orchestrate = sys.modules.get("ggml_bridge.experiments.bench.orchestrate")
    if orchestrate is not None and request.node.get_closest_marker("plots") is None:
        monkeypatch.setattr(orchestrate, "plot", lambda report, out_dir: [])


@pytest.fixture(autouse=True)
def retry_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses fetch's ``retrying`` took, in order, without taking them: a GET that keeps failing (a registry
    the test stopped) is tried as often as ever, but costs no 2.5 s of sleep. The retry tests read them."""
    pauses: list[float] = []
    monkeypatch.setattr(archive, "time", SimpleNamespace(sleep=pauses.append))
    return pauses


@pytest.fixture
def cli_settings(settings: config.Settings, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    """``cli.main`` on the fake project and its PyPI (as ``settings``), on the CPU backend."""
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(settings.project_dir))
    monkeypatch.setenv("GGML_BRIDGE_PYPI_URL", settings.fetch.pypi_url)
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    return settings


#: The line each fake program of ``bench_env`` starts with: it records who ran, on which GPUs, with what.
_RECORD = (
    'import os, sys\nopen(os.environ["FAKE_RPC_ORDER"], "a").write('
    '"%s cvd=%r %s\\n" % (os.path.basename(os.path.dirname(os.path.abspath(__file__))), '
    'os.environ.get("CUDA_VISIBLE_DEVICES"), " ".join(sys.argv[1:])))\n'
)


@pytest.fixture
def bench_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BenchEnv:
    """bench on a rig of two (fake) GPUs with fake llama-bench, llama-server and rpc-server builds; each program
    also appends its folder, CUDA_VISIBLE_DEVICES and argv to ``tmp/rpc-order.txt``."""
    from ggml_bridge.experiments.bench import orchestrate

    for var in [v for v in os.environ if v.startswith("FAKE_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("FAKE_ORDER", str(tmp_path / "order.txt"))
    monkeypatch.setenv("FAKE_RPC_ORDER", str(tmp_path / "rpc-order.txt"))
    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 2)
    monkeypatch.setattr(orchestrate, "gpu_env", lambda: {})
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    return BenchEnv(
        variants=write_fake_variants(tmp_path / "variants", prefix=_RECORD, rpc_server=rpc.RPC_SERVER),
        model=tmp_path / "m.gguf",
        tmp=tmp_path,
        settings=config.Settings(cache_dir=tmp_path / "cache"),
    )
