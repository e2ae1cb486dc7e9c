"""scikit-build-core metadata plugin: the version with a local tag naming the backend (+cpu, +cu130, +vulkan), and
the dependencies: none for CPU and Vulkan (the system's Vulkan loader and driver), NVIDIA's runtime wheels
(cuda_runtime.json beside this file) for CUDA.

The backend follows CMAKE_ARGS as CMake sees it: -DGGML_CUDA=ON (any CMake true value) builds for CUDA, and
the tag carries the CUDA toolkit's release (nvcc from $CUDACXX, PATH, $CUDA_HOME or /usr/local/cuda);
-DGGML_VULKAN=ON (without CUDA) builds for Vulkan.
CMakeLists.txt checks that the tag agrees with what CMake actually built.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

_TRUE = ("1", "on", "yes", "true", "y")
_CUDA_ARG = re.compile(r"^-DGGML_CUDA(?::BOOL)?=(.*)$", re.IGNORECASE)
_VULKAN_ARG = re.compile(r"^-DGGML_VULKAN(?::BOOL)?=(.*)$", re.IGNORECASE)


CUDA_RUNTIME = Path(__file__).resolve().parent / "cuda_runtime.json"


def _requested(pattern: re.Pattern[str], cmake_args: str | None) -> bool:
    value = None
    for arg in shlex.split(os.environ.get("CMAKE_ARGS", "") if cmake_args is None else cmake_args):
        m = pattern.match(arg)
        if m:
            value = m.group(1)
    return value is not None and value.strip().lower() in _TRUE


def cuda_requested(cmake_args: str | None = None) -> bool:
    return _requested(_CUDA_ARG, cmake_args)


def vulkan_requested(cmake_args: str | None = None) -> bool:
    return _requested(_VULKAN_ARG, cmake_args)


def backend_tag(cmake_args: str | None = None) -> str:
    if cuda_requested(cmake_args):
        return "cu" + "".join(_cuda_release())
    return "vulkan" if vulkan_requested(cmake_args) else "cpu"


def dependencies(cmake_args: str | None = None) -> list[str]:
    """NVIDIA's runtime wheels of the toolkit's major, at least its minor; nothing for CPU."""
    if not cuda_requested(cmake_args):
        return []
    major, minor = _cuda_release()
    table = json.loads(CUDA_RUNTIME.read_text())
    if major not in table:
        raise RuntimeError(f"CUDA {major}.{minor}: {CUDA_RUNTIME.name} names the runtime wheels of CUDA "
                           f"{', '.join(k for k in table if k.isdigit())} only; build with one of those toolkits")
    return [r.format(minor=minor) for r in table[major]["requires"]]


def _cuda_release() -> tuple[str, str]:
    cands = [os.environ.get("CUDACXX"), shutil.which("nvcc"),
             os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc") if os.environ.get("CUDA_HOME") else None,
             "/usr/local/cuda/bin/nvcc"]
    for nvcc in cands:
        if nvcc and Path(nvcc).is_file():
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
            m = re.search(r"release (\d+)\.(\d+)", out)
            if m:
                return m.group(1), m.group(2)
    raise RuntimeError("CMAKE_ARGS asks for -DGGML_CUDA=ON but no nvcc was found (looked at $CUDACXX, PATH, "
                       "$CUDA_HOME/bin, /usr/local/cuda/bin): install the CUDA toolkit or drop -DGGML_CUDA=ON")


def dynamic_metadata(field: str, settings: dict | None = None) -> str | list[str]:
    if field == "dependencies":
        return dependencies()
    if field != "version":
        raise RuntimeError(f"this plugin provides the version and the dependencies, not {field!r}")
    base = (settings or {}).get("base")
    if not isinstance(base, str) or not base:
        raise RuntimeError("[tool.scikit-build.metadata.version] needs base = \"X.Y.Z\"")
    return f"{base}+{backend_tag()}"
