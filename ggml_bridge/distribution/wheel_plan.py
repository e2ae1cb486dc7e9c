"""What one wheel build compiles: the backend, the CUDA architectures (the CUDA table of
``server_dist/build_support/cuda_runtime.json``: per CUDA major, the architectures, the PTX and the NVIDIA runtime
wheels a CUDA wheel needs), the CPU variants, and the user's CMAKE_ARGS last."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..foundations.config import Settings
from ..foundations.errors import ToolchainError, UsageError
from ..foundations.runner import Failure, run
from ..runtime import modes
from .builder.plan import backend_options
from .builder.toolchain import detect_vulkan, find_nvcc

TEMPLATES = Path(__file__).resolve().parent / "server_dist"
#: The reduced CPU variant set for CI builds (the x86-64 baseline and AVX2); release wheels carry all of them.
CI_CPU_VARIANTS = ("x64", "haswell")
_CUDA_ARG = re.compile(r"^-DGGML_CUDA(?::BOOL)?=(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class CudaRuntime:
    """One row of build_support/cuda_runtime.json: how a wheel for a CUDA major is built and what it needs."""

    major: int
    archs: tuple[str, ...]
    ptx: str
    requires: tuple[str, ...]
    libdirs: tuple[str, ...]
    libs: tuple[str, ...]


def cuda_table() -> dict[int, CudaRuntime]:
    raw = json.loads((TEMPLATES / "build_support" / "cuda_runtime.json").read_text())
    return {
        int(k): CudaRuntime(
            int(k), tuple(v["archs"]), v["ptx"], tuple(v["requires"]), tuple(v["libdirs"]), tuple(v["libs"])
        )
        for k, v in raw.items()
        if k.isdigit()
    }


CUDA_TABLE = cuda_table()


def cuda_architectures(runtime: CudaRuntime, supported: Sequence[str]) -> str:
    """CMAKE_CUDA_ARCHITECTURES for a wheel: real code for each wanted architecture the toolkit lists
    (``supported``: the numbers of ``nvcc --list-gpu-arch``'s compute_<n>), PTX of ``runtime.ptx`` (or of the
    newest kept one) for GPUs newer than the list."""
    have = set(supported)
    kept = [a for a in runtime.archs if re.sub(r"[af]$", "", a) in have]
    if not kept:
        raise ToolchainError(
            f"the CUDA {runtime.major} toolkit lists none of the wheel's architectures",
            why=f"wanted {', '.join(runtime.archs)}; nvcc --list-gpu-arch gives "
            f"{', '.join(sorted(have, key=int)) or 'nothing'}",
            fix="pass --cuda-arch LIST (CMAKE_CUDA_ARCHITECTURES) explicitly",
        )
    ptx = runtime.ptx if runtime.ptx in have else re.sub(r"[af]$", "", kept[-1])
    return ";".join([f"{a}-real" for a in kept] + [f"{ptx}-virtual"])


def nvcc_gpu_archs(nvcc: str) -> tuple[tuple[int, int], list[str]]:
    """(release, architectures) of a CUDA toolkit: ``nvcc --version`` and ``nvcc --list-gpu-arch``."""
    ver = run([nvcc, "--version"], failure=Failure(ToolchainError)).stdout
    m = re.search(r"release (\d+)\.(\d+)", ver)
    if not m:
        raise ToolchainError(f"cannot read the CUDA release from {nvcc} --version", why=ver.strip()[-200:])
    listed = run([nvcc, "--list-gpu-arch"], failure=Failure(ToolchainError)).stdout
    return (int(m.group(1)), int(m.group(2))), re.findall(r"compute_(\d+)", listed)


@dataclass(frozen=True)
class WheelPlan:
    """What one ``pip wheel`` builds: its CMAKE_ARGS and, for CUDA, the runtime row (auditwheel excludes). The
    variant is always the patched one: the sdist's CMakeLists forces its options (``server_dist/CMakeLists.txt``,
    checked against :data:`ggml_bridge.runtime.modes.VARIANTS` by tests/unit/distribution/test_wheel.py)."""

    cmake_args: tuple[str, ...]
    runtime: CudaRuntime | None = None
    backend: str = "cpu"
    variant: modes.Variant = modes.VARIANTS[modes.PATCHED]


def plan(settings: Settings, *, cpu_variants: Sequence[str] = (), nvcc: str | None = None) -> WheelPlan:
    """The CMake arguments of a wheel build: the backend (``settings.build.backend``; auto = CPU, a wheel never
    guesses from the build machine) with the options a build of that backend gets
    (:func:`ggml_bridge.distribution.builder.plan.backend_options`), CUDA architectures (``--cuda-arch`` or the table's list),
    the CPU variants (empty = all), then the user's CMAKE_ARGS last (they win, as in CMake)."""
    b = settings.build
    if b.backend == "cuda-vulkan":
        raise UsageError(
            "a wheel is built for one GPU backend: cuda-vulkan is a build backend only",
            why="the wheel's local version and runtime dependencies name one backend (+cu130 or +vulkan)",
            fix="build a wheel with --backend cuda or --backend vulkan, or use `ggml-bridge build --backend cuda-vulkan`",
        )
    args: list[str] = []
    if cpu_variants:
        args.append(f"-DGGML_BRIDGE_CPU_VARIANTS={';'.join(cpu_variants)}")
    user_cuda = [m.group(1) for a in b.cmake_args if (m := _CUDA_ARG.match(a))]
    runtime, archs = None, None
    if b.backend == "cuda" or (user_cuda and user_cuda[-1].lower() in ("1", "on", "yes", "true", "y")):
        backend = "cuda"
        nvcc, runtime, supported = _cuda_toolkit(nvcc)
        if not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in b.cmake_args):
            archs = b.cuda_arch if b.cuda_arch != "native" else cuda_architectures(runtime, supported)
    else:
        backend = "vulkan" if b.backend == "vulkan" else "cpu"
    vulkan = detect_vulkan() if backend == "vulkan" else None
    args += [f"-D{k}={v}" for k, v in backend_options(backend, nvcc, archs, vulkan).items()]
    return WheelPlan(tuple(args + list(b.cmake_args)), runtime, backend)


def _cuda_toolkit(nvcc: str | None) -> tuple[str, CudaRuntime, list[str]]:
    """(nvcc, the CUDA table's row of its release, the architectures it lists) for a CUDA wheel."""
    found = find_nvcc()
    nvcc = nvcc or (str(found) if found else None)
    if nvcc is None:
        raise ToolchainError(
            "--backend cuda needs the CUDA toolkit's nvcc",
            why="none at $CUDACXX, on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin or /usr/local/cuda/bin",
            fix="install the CUDA toolkit (12 or 13) or build the CPU wheel",
        )
    (major, minor), supported = nvcc_gpu_archs(nvcc)
    runtime = CUDA_TABLE.get(major)
    if runtime is None:
        raise ToolchainError(
            f"CUDA {major}.{minor} is not a toolkit the wheel knows the runtime wheels of",
            why=f"build_support/cuda_runtime.json lists CUDA {', '.join(map(str, CUDA_TABLE))}",
            fix="build with a CUDA 12 or 13 toolkit",
        )
    return nvcc, runtime, supported
