"""llama-server of the pinned llama.cpp with the ggml-bridge patch series (and its web UI), as a wheel.

``get_binary_path()`` gives the path of llama-server (or of another shipped program), ``get_manifest()`` what
was built from what, and the ``ggml-bridge-server`` console script execs llama-server with its arguments.
The programs find their libraries in ``lib/`` next to ``bin/`` ($ORIGIN rpath); ggml's backend modules (the CPU
variants, CUDA) sit beside the programs in ``bin/``, where ggml's loader looks, and find ``lib/`` the same way.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

__all__ = ["BackendUnavailable", "MissingFileError", "check_backend", "get_binary_path", "get_manifest", "main"]

PACKAGE_DIR = Path(__file__).resolve().parent
BIN_DIR = PACKAGE_DIR / "bin"
LIB_DIR = PACKAGE_DIR / "lib"
REINSTALL = "reinstall the wheel: pip install --force-reinstall ggml-bridge-server (or the .whl file)"


class MissingFileError(FileNotFoundError):
    """A file this wheel installed is gone: the installation is damaged."""


class BackendUnavailable(RuntimeError):
    """The wheel was built for a backend this machine does not have (a CUDA wheel without a GPU)."""


def get_manifest() -> dict:
    """The sources (upstream commit, patch series, web UI hash) and the build (backend, programs) of this wheel."""
    out = {}
    for name in ("manifest.json", "build.json"):
        path = PACKAGE_DIR / name
        try:
            data = json.loads(path.read_text())
        except OSError:
            raise MissingFileError(
                f"the ggml-bridge-server installation at {PACKAGE_DIR} is damaged: {path} is missing; {REINSTALL}"
            ) from None
        if name == "build.json":
            out["build"] = data
        else:
            out.update(data)
    return out


def get_binary_path(name: str = "llama-server") -> Path:
    """Absolute path of a program shipped in this wheel; MissingFileError names what is missing."""
    path = BIN_DIR / name
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in BIN_DIR.iterdir())) if BIN_DIR.is_dir() else "nothing"
        raise MissingFileError(
            f"the ggml-bridge-server installation at {PACKAGE_DIR} is damaged: {path} is missing "
            f"(bin/ holds: {shipped}); {REINSTALL}"
        )
    if not os.access(path, os.X_OK):
        raise MissingFileError(
            f"the ggml-bridge-server installation at {PACKAGE_DIR} is damaged: {path} is not executable; {REINSTALL}"
        )
    build = get_manifest()["build"]
    libs = build.get("libraries", [])
    # the exact files the program loads (its DT_NEEDED, e.g. libllama.so.0) when it names ours; else any lib<x>.so*
    # that exists (a dangling link does not count)
    ours = {f"lib{lib}.so" for lib in libs}
    needed = [n for n in _elf_needed(path) if n.split(".so", 1)[0] + ".so" in ours]
    missing = [n for n in needed if not (LIB_DIR / n).exists()]
    named = {n.split(".so", 1)[0] + ".so" for n in needed}
    missing += [
        f"lib{lib}.so"
        for lib in libs
        if f"lib{lib}.so" not in named and not any(p.exists() for p in LIB_DIR.glob(f"lib{lib}.so*"))
    ]
    if missing:
        raise MissingFileError(
            f"the ggml-bridge-server installation at {PACKAGE_DIR} is damaged: "
            f"{', '.join(missing)} missing from {LIB_DIR}; {REINSTALL}"
        )
    # the backend modules (GGML_BACKEND_DL: libggml-cpu-<variant>.so, libggml-cuda.so) live beside the programs;
    # the CPU variants are alternatives (ggml loads the best one this CPU runs): one of them is enough
    modules = build.get("modules", [])
    gone = [mod for mod in modules if not any(p.exists() for p in BIN_DIR.glob(f"lib{mod}.so*"))]
    cpu = [mod for mod in modules if mod.startswith("ggml-cpu-")]
    if set(cpu) - set(gone):  # a CPU variant is there
        gone = [mod for mod in gone if mod not in cpu]
    if gone:
        raise MissingFileError(
            f"the ggml-bridge-server installation at {PACKAGE_DIR} is damaged: "
            f"{', '.join('lib' + m + '.so' for m in gone)} missing from {BIN_DIR}; {REINSTALL}"
        )
    return path


def _elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED names of a 64-bit little-endian ELF file ([] for anything else, or when it cannot be read)."""
    import struct

    try:
        data = path.read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return []
        (phoff,) = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        strtab, offsets = None, []
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:
                offsets.append(val)
            elif tag == 5:
                strtab = next((o + val - v for v, o, n in loads if v <= val < v + n), None)
        if strtab is None:
            return []
        return [data[strtab + o : data.index(b"\0", strtab + o)].decode("utf-8", "replace") for o in offsets]
    except (OSError, struct.error, ValueError, IndexError):
        return []


def cuda_devices() -> int | None:
    """How many CUDA devices the driver reports; None when there is no usable driver (libcuda)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    n = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return None
    return n.value


def check_backend() -> str:
    """The wheel's backend; BackendUnavailable when this machine cannot run it."""
    build = get_manifest()["build"]
    backend = build.get("backend", "unknown")
    if backend == "cuda":
        n = cuda_devices()
        if not n:
            why = "no NVIDIA driver (libcuda.so.1) could be loaded" if n is None else "the driver reports 0 devices"
            raise BackendUnavailable(
                f"this ggml-bridge-server wheel ({build.get('version')}) is built for CUDA "
                f"{build.get('cuda_version')}, and this machine has no usable GPU: {why}; "
                "install the CPU wheel (+cpu) here, or run on a machine with an NVIDIA GPU"
            )
        missing = [lib for lib in build.get("cuda_libs", []) if not _loadable(lib)]
        if missing:
            raise BackendUnavailable(
                f"this ggml-bridge-server wheel ({build.get('version')}) needs NVIDIA's CUDA "
                f"runtime libraries, and {', '.join(missing)} cannot be found (not in "
                f"{PACKAGE_DIR.parent / 'nvidia'}, nor on the system); install the wheel with "
                "its dependencies (pip install nvidia-cuda-runtime nvidia-cublas), not --no-deps"
            )
    if backend == "vulkan" and not _loadable("libvulkan.so.1"):
        raise BackendUnavailable(
            f"this ggml-bridge-server wheel ({build.get('version')}) is built for Vulkan, and this machine has no "
            "Vulkan loader (libvulkan.so.1); install it (Debian/Ubuntu: apt-get install libvulkan1 and a Vulkan "
            "driver such as mesa-vulkan-drivers), or install the CPU wheel (+cpu) here"
        )
    return backend


def _loadable(soname: str) -> bool:
    """A CUDA runtime library where the wheel's RPATH looks (site-packages/nvidia/...), or loadable system-wide."""
    if any((PACKAGE_DIR.parent / "nvidia").glob(f"**/lib/{soname}")):
        return True
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Console script: exec llama-server with the given arguments."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        check_backend()
        path = get_binary_path()
    except (MissingFileError, BackendUnavailable) as e:
        print(f"ggml-bridge-server: error: {e}", file=sys.stderr)
        return 32 if isinstance(e, MissingFileError) else 40
    os.execv(path, [str(path), *args])
    return 1  # not reached
