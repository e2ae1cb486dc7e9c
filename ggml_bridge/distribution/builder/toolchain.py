"""Find the build tools: cmake and ninja (the system ones, else the PyPI packages'), the C/C++ compilers,
the CUDA toolkit (nvcc with cuBLAS) that decides the ``auto`` backend, and the Vulkan pieces of ``--backend
vulkan`` (headers new enough for ggml, the loader, glslc, SPIRV-Headers' CMake config)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...foundations.errors import ToolchainError
from ...foundations.runner import Failure, log, run
from ...runtime import modes

#: seconds a compiler's or nvcc's ``--version`` may take (a hung network mount of the toolkit)
VERSION_TIMEOUT_S = 60.0

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
class VulkanKit:
    """What ggml's Vulkan backend needs at configure time, each found in ``$VULKAN_SDK`` first, then the system."""

    include_dir: Path
    """Holds vulkan/vulkan.hpp and vulkan/vulkan_core.h."""
    header_version: str
    """e.g. 1.4.309 (VK_HEADER_VERSION_COMPLETE)."""
    library: Path
    """The loader: libvulkan.so, or libvulkan.so.1 when no development link is installed."""
    glslc: Path
    spirv_headers_dir: Path
    """The folder of SPIRV-HeadersConfig.cmake."""

    def cmake_args(self) -> dict[str, str]:
        return {
            "GGML_VULKAN": "ON",
            "Vulkan_INCLUDE_DIR": str(self.include_dir),
            "Vulkan_LIBRARY": str(self.library),
            "Vulkan_GLSLC_EXECUTABLE": str(self.glslc),
            "SPIRV-Headers_DIR": str(self.spirv_headers_dir),
        }


#: The Vulkan-Headers feature ggml-vulkan of the pinned tree needs (vk::LayerSettingEXT, VK_EXT_layer_settings).
VULKAN_HEADER_FEATURE = "VkLayerSettingEXT"
#: Newer headers than bookworm's 1.3.239: Debian trixie's libvulkan-dev, pinned by .ci/run (unpack, VULKAN_SDK).
VULKAN_HEADERS_DEB = "http://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb"
#: Debian packages per missing piece (the one error line names them).
VULKAN_PACKAGES = {
    "headers": "libvulkan-dev",
    "loader": "libvulkan1",
    "glslc": "glslc",
    "SPIRV-Headers": "spirv-headers",
}
_VULKAN_FIX = (
    "install them (Debian: apt-get install libvulkan1 libvulkan-dev glslc spirv-headers mesa-vulkan-drivers), "
    "or point $VULKAN_SDK at a Vulkan SDK (include/, lib/, bin/glslc)"
)


@dataclass(frozen=True)
class Toolchain:
    cmake: Tool
    ninja: Tool
    cc: Tool
    cxx: Tool
    cuda: CudaToolkit | None = None
    vulkan: VulkanKit | None = None


def resolve_backend(requested: str) -> tuple[str, CudaToolkit | None]:
    """(a :data:`modes.BACKENDS` name, toolkit). ``auto`` picks cuda only when nvcc is found AND the toolkit has
    cuBLAS headers; vulkan only when asked for (its pieces are checked by :func:`detect_vulkan`)."""
    if requested != "auto" and not modes.backend(requested).cuda:  # (an unknown name: modes.backend's UsageError)
        return requested, None
    cuda = detect_cuda()
    if cuda is not None and cuda.cublas_header is not None:
        if requested == "auto":
            log(f"backend auto: CUDA {cuda.version} with cuBLAS at {cuda.root}: building for cuda")
        return ("cuda" if requested == "auto" else requested), cuda
    if requested != "auto":
        if cuda is None:
            raise ToolchainError(
                f"the {requested} backend was requested but nvcc was not found",
                why="no nvcc on PATH, $CUDACXX, $CUDA_HOME or /usr/local/cuda",
                fix="install the CUDA toolkit (and put nvcc on PATH), or use --backend cpu",
            )
        raise ToolchainError(
            f"the {requested} backend was requested but CUDA {cuda.version} at {cuda.root} has no cuBLAS",
            why="cublas_v2.h was not found in its include directories; ggml-cuda needs cuBLAS",
            fix="install the toolkit's cuBLAS development package (e.g. libcublas-dev), or use --backend cpu",
        )
    reason = "nvcc not found" if cuda is None else f"nvcc {cuda.version} found but no cuBLAS headers in {cuda.root}"
    log(f"backend auto: {reason}: building for cpu")
    return "cpu", None


def detect_cuda() -> CudaToolkit | None:
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    real = _real_nvcc(nvcc)
    res = run(
        [real, "--version"],
        check=False,
        timeout=VERSION_TIMEOUT_S,
        failure=Failure(ToolchainError, what=f"{real} --version did not answer within {VERSION_TIMEOUT_S:g} s"),
    )
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


def find_toolchain(cuda: CudaToolkit | None = None, backend: str | None = None) -> Toolchain:
    """The build tools; for a backend with Vulkan also the Vulkan pieces (ToolchainError when one is missing)."""
    vulkan = detect_vulkan() if backend is not None and modes.backend(backend).vulkan else None
    return Toolchain(
        find_cmake(),
        find_ninja(),
        _compiler("CC", ("cc", "gcc", "clang")),
        _compiler("CXX", ("c++", "g++", "clang++")),
        cuda,
        vulkan,
    )


def detect_vulkan(env: dict[str, str] | None = None, system_roots: tuple[Path, ...] = (Path("/usr"),)) -> VulkanKit:
    """The Vulkan headers, loader, glslc and SPIRV-Headers config, from ``$VULKAN_SDK`` (an SDK, or an unpacked
    Debian package's ``usr``) first, then ``system_roots``. ToolchainError naming every missing piece's Debian
    package, or saying that the headers are too old and where newer ones come from."""
    env = dict(os.environ) if env is None else env
    roots = _unique(([Path(env["VULKAN_SDK"])] if env.get("VULKAN_SDK") else []) + list(system_roots))
    libdirs = [d for r in roots for d in (r / "lib", *sorted(r.glob("lib/*-linux-gnu")), r / "lib64")]
    include = next((r / "include" for r in roots if (r / "include" / "vulkan" / "vulkan.hpp").is_file()), None)
    library = next(
        (d / n for n in ("libvulkan.so", "libvulkan.so.1") for d in libdirs if (d / n).is_file()),
        None,
    )
    glslc_found = shutil.which("glslc", path=os.pathsep.join([str(r / "bin") for r in roots] + [env.get("PATH", "")]))
    spirv = next(
        (
            c.parent
            for r in roots
            for c in (
                *sorted(r.glob("share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake")),
                *sorted(r.glob("lib/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake")),
                *sorted(r.glob("lib/*/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake")),
            )
            if c.is_file()
        ),
        None,
    )
    found = {"headers": include, "loader": library, "glslc": glslc_found, "SPIRV-Headers": spirv}
    missing = [k for k, v in found.items() if v is None]
    where = " and ".join(str(r) for r in roots)
    if missing:
        raise ToolchainError(
            f"the Vulkan backend was requested but its {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing",
            why=f"searched $VULKAN_SDK, {where} and PATH; Debian packages: "
            + ", ".join(VULKAN_PACKAGES[k] for k in missing),
            fix=_VULKAN_FIX,
        )
    assert include is not None and library is not None and glslc_found is not None and spirv is not None
    core = (
        (include / "vulkan" / "vulkan_core.h").read_text(errors="replace")
        if (include / "vulkan" / "vulkan_core.h").is_file()
        else ""
    )
    version = _vulkan_header_version(core)
    if VULKAN_HEADER_FEATURE not in core:
        raise ToolchainError(
            f"the Vulkan headers at {include} ({version}) are too old for ggml's Vulkan backend",
            why=f"vulkan_core.h has no {VULKAN_HEADER_FEATURE} (VK_EXT_layer_settings; Debian bookworm's 1.3.239 "
            "lacks it, trixie's 1.4.309 has it)",
            fix=f"unpack Debian trixie's libvulkan-dev ({VULKAN_HEADERS_DEB}, `dpkg-deb -x`) and set "
            "VULKAN_SDK=<folder>/usr, or install a newer Vulkan SDK",
        )
    return VulkanKit(include, version, library, Path(glslc_found), spirv)


def _vulkan_header_version(core: str) -> str:
    m = re.search(r"#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*\d+,\s*(\d+),\s*(\d+)", core)
    patch = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", core)
    if m and patch:
        return f"{m.group(1)}.{m.group(2)}.{patch.group(1)}"
    return "unknown version"


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
        res = run([path, "--version"], check=False, timeout=VERSION_TIMEOUT_S)
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
    res = run([path, "--version"], check=False, timeout=VERSION_TIMEOUT_S, failure=Failure(ToolchainError))
    first = (res.stdout or res.stderr).strip().splitlines()
    if res.returncode != 0 or not first:
        raise ToolchainError(
            f"{lang} compiler {path} does not run",
            why=f"`{path} --version` exited {res.returncode}",
            fix=f"fix the compiler installation or set ${var}",
        )
    return Tool(Path(path), first[0])


def find_nvcc() -> Path | None:
    """The CUDA compiler, the one finder of the builds and the wheel: ``$CUDACXX`` when set (and then only it),
    else nvcc on PATH, in ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin`` or ``/usr/local/cuda/bin``."""
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
