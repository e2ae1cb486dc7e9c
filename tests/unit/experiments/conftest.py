"""Fixtures of the doctor tests: ``doctor`` run on the fake project with no NVIDIA driver (``doctor_bin``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.foundations import config

from helpers import write_exe

#: a llama-server that only lists devices: FAKE_LIST ("Name: description (N MiB, M MiB free);..."), and an RPC device
#: per endpoint of --rpc
FAKE_LISTER = """#!PYTHON
import os, sys
args = sys.argv[1:]
if "--list-devices" not in args:
    sys.exit(3)
print("Available devices:")
for line in os.environ.get("FAKE_LIST", "").split(";"):
    if line:
        print("  " + line)
if "--rpc" in args:
    print("  RPC0[%s]: fake rpc device (1024 MiB, 1000 MiB free)" % args[args.index("--rpc") + 1])
print("load_backend: loaded CPU backend from /opt/x/libggml-cpu-haswell.so", file=sys.stderr)
"""


@pytest.fixture
def doctor_bin(settings: config.Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The fake project, an empty cache, no NVIDIA driver; returns a bin folder with :data:`FAKE_LISTER` as its
    llama-server (FAKE_LIST unset: it lists no device)."""
    import pynvml as p

    def no_library() -> None:
        raise p.NVMLError_LibraryNotFound(p.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(p, "nvmlInit", no_library)
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(settings.project_dir))
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(settings.cache_dir))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    for var in ("GGML_CUDA_DEVICES", "GGML_VK_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GGML_CUDA_P2P", "FAKE_LIST"):
        monkeypatch.delenv(var, raising=False)
    b = tmp_path / "bin"
    b.mkdir()
    write_exe(b / "llama-server", FAKE_LISTER)
    return b
