"""Find the build tools: cmake and ninja (the system ones, else the PyPI packages'), the C/C++ compilers,
and the CUDA toolkit (nvcc with cuBLAS) that decides the ``auto`` backend."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolchainError, UsageError
from ..runner import log, run

MIN_CMAKE = (3, 21)
MIN_NINJA = (1, 10)


@dataclass(frozen=True)
class Tool:
    path: Path
    version: str


@dataclass(frozen=True)
class CudaToolkit:
    nvcc: Path
    """The real nvcc (wrapper scripts resolved)."""
    root: Path
    version: str
    cublas_header: Path | None
    """cublas_v2.h, or None when the toolkit lacks cuBLAS development files."""


@dataclass(frozen=True)
class Toolchain:
    cmake: Tool
    ninja: Tool
    cc: Tool
    cxx: Tool
    cuda: CudaToolkit | None = None


def resolve_backend(requested: str) -> tuple[str, CudaToolkit | None]:
    """(cpu|cuda, toolkit). ``auto`` picks cuda only when nvcc is found AND the toolkit has cuBLAS headers."""
    if requested == "cpu":
        return "cpu", None
    if requested not in ("auto", "cuda"):
        raise UsageError(f"unknown backend {requested!r}", fix="use one of: auto, cpu, cuda")
    cuda = detect_cuda()
    if cuda is not None and cuda.cublas_header is not None:
        if requested == "auto":
            log(f"backend auto: CUDA {cuda.version} with cuBLAS at {cuda.root}: building for cuda")
        return "cuda", cuda
    if requested == "cuda":
        if cuda is None:
            raise ToolchainError(
                "the CUDA backend was requested but nvcc was not found",
                why="no nvcc on PATH, $CUDACXX, $CUDA_HOME or /usr/local/cuda",
                fix="install the CUDA toolkit (and put nvcc on PATH), or use --backend cpu",
            )
        raise ToolchainError(
            f"the CUDA backend was requested but CUDA {cuda.version} at {cuda.root} has no cuBLAS",
            why="cublas_v2.h was not found in its include directories; ggml-cuda needs cuBLAS",
            fix="install the toolkit's cuBLAS development package (e.g. libcublas-dev), or use --backend cpu",
        )
    reason = "nvcc not found" if cuda is None else f"nvcc {cuda.version} found but no cuBLAS headers in {cuda.root}"
    log(f"backend auto: {reason}: building for cpu")
    return "cpu", None


def detect_cuda() -> CudaToolkit | None:
    nvcc = _find_nvcc()
    if nvcc is None:
        return None
    real = _real_nvcc(nvcc)
    res = run([real, "--version"], check=False)
    m = re.search(r"release (\d+\.\d+)", res.stdout)
    version = m.group(1) if m else "unknown"
    # only the toolkit of this nvcc (and one named explicitly) counts: CMake finds cuBLAS next to the compiler
    roots = _unique(
        [real.parent.parent]
        + [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT") if os.environ.get(v)]
    )
    header = None
    for root in roots:
        cands = [root / "include" / "cublas_v2.h", *sorted(root.glob("targets/*/include/cublas_v2.h"))]
        header = next((c for c in cands if c.is_file()), None)
        if header:
            break
    return CudaToolkit(real, roots[0], version, header)


def find_toolchain(cuda: CudaToolkit | None = None) -> Toolchain:
    return Toolchain(
        find_cmake(),
        find_ninja(),
        _compiler("CC", ("cc", "gcc", "clang")),
        _compiler("CXX", ("c++", "g++", "clang++")),
        cuda,
    )


def find_cmake() -> Tool:
    """The system cmake if >= 3.21, else the one of the ``cmake`` PyPI package."""
    return _find_tool("cmake", MIN_CMAKE, _pypi_bin("cmake", "CMAKE_BIN_DIR"), "pip install 'cmake>=3.21'")


def find_ninja() -> Tool:
    return _find_tool("ninja", MIN_NINJA, _pypi_bin("ninja", "BIN_DIR"), "pip install ninja")


# --------------------------------------------------------------------------------------------- tool discovery


def _find_tool(name: str, minimum: tuple[int, ...], fallback: Path | None, fix: str) -> Tool:
    seen = []
    for cand in (shutil.which(name), fallback):
        if not cand or not Path(cand).exists():
            continue
        version = _version(Path(cand))
        seen.append(f"{cand} ({version or 'unusable'})")
        if version and _vtuple(version) >= minimum:
            return Tool(Path(cand), version)
    raise ToolchainError(
        f"no usable {name} >= {'.'.join(map(str, minimum))}",
        why="found: " + (", ".join(seen) if seen else "none"),
        fix=fix,
    )


def _version(path: Path) -> str | None:
    try:
        res = run([path, "--version"], check=False, timeout=60)
    except Exception:  # noqa: BLE001 - an unrunnable candidate is just not usable
        return None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", res.stdout + res.stderr)
    return m.group(1) if res.returncode == 0 and m else None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _pypi_bin(module: str, attr: str) -> Path | None:
    try:
        mod = __import__(module)
        return Path(getattr(mod, attr)) / module
    except (ImportError, AttributeError):
        return None


def _compiler(var: str, names: tuple[str, ...]) -> Tool:
    lang = "C" if var == "CC" else "C++"
    if os.environ.get(var):
        cmd = os.environ[var].split()[0]
        path = shutil.which(cmd)
        if not path:
            raise ToolchainError(
                f"{lang} compiler ${var}={os.environ[var]} not found",
                fix=f"fix ${var} or unset it to use the system compiler",
            )
    else:
        path = next((p for p in map(shutil.which, names) if p), None)
        if not path:
            raise ToolchainError(
                f"no {lang} compiler found",
                why=f"none of {', '.join(names)} is on PATH",
                fix="install gcc and g++ (Debian: apt-get install build-essential) or set CC/CXX",
            )
    res = run([path, "--version"], check=False)
    first = (res.stdout or res.stderr).strip().splitlines()
    if res.returncode != 0 or not first:
        raise ToolchainError(
            f"{lang} compiler {path} does not run",
            why=f"`{path} --version` exited {res.returncode}",
            fix=f"fix the compiler installation or set ${var}",
        )
    return Tool(Path(path), first[0])


def _find_nvcc() -> Path | None:
    if os.environ.get("CUDACXX"):
        return Path(os.environ["CUDACXX"]) if Path(os.environ["CUDACXX"]).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and (Path(os.environ[var]) / "bin" / "nvcc").is_file():
            return Path(os.environ[var]) / "bin" / "nvcc"
    default = Path("/usr/local/cuda/bin/nvcc")
    return default if default.is_file() else None


def _real_nvcc(nvcc: Path) -> Path:
    """Resolve symlinks and one-line ``exec /path/to/nvcc "$@"`` wrapper scripts (CMake needs the real one)."""
    real = nvcc.resolve()
    try:
        head = real.read_bytes()[:4096]
    except OSError:
        return real
    if head.startswith(b"#!"):
        m = re.search(rb"exec\s+(\S+/nvcc)\b", head)
        if m and Path(m.group(1).decode()).is_file():
            return Path(m.group(1).decode()).resolve()
    return real


def _unique(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out
