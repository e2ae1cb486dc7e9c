"""Configure and build llama-server (plus llama-bench, llama-perplexity and our test programs) with CMake + Ninja.

Build directories are keyed by (upstream tree, patch series, CMake options, backend, compilers):
``<cache>/builds/<variant>-<backend>-<key>/``. When the key and the completed marker match, nothing is configured
or compiled ("up to date"). Each build writes ``manifest.json`` into its directory and the pointer
``<cache>/latest-<variant>-<backend>.json`` that :func:`find_binary` reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__, cache, modes
from . import fetch as fetchmod
from . import patch as patchmod
from . import ui as uimod
from .config import Settings
from .errors import BuildError, NotBuiltError, ToolchainError, UsageError
from .runner import log, run, step

#: Targets built when the tree defines them, in this order. llama-server is required.
WANTED_TARGETS = (
    "llama-server", "llama-bench", "llama-perplexity", "test-batched-transfers", "test-mapped-host-bridge",
    "ggml-rpc-server",
)
REQUIRED_TARGETS = ("llama-server",)
#: CMake options each variant adds (DESIGN.md "Build variants").
VARIANT_OPTIONS: dict[str, dict[str, str]] = {v.name: dict(v.cmake) for v in modes.VARIANTS.values()}
#: Turned OFF when the tree's CMakeLists mention them. The web UI is never built by CMake (npm) nor downloaded
#: (LLAMA_USE_PREBUILT_UI): :mod:`ggml_bridge.ui` builds it from the tree and places it where upstream embeds it.
OFF_IF_PRESENT = ("LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_UI",
                  "LLAMA_USE_PREBUILT_UI")
MIN_CMAKE = (3, 21)
MIN_NINJA = (1, 10)
COMPLETE_MARKER = "ggml-bridge-complete.json"
_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
_ERROR_LINE = re.compile(r"(error[: ]|FAILED:|CMake Error|undefined reference|fatal)", re.IGNORECASE)


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


@dataclass(frozen=True)
class BuildResult:
    variant: str
    backend: str
    build_dir: Path
    bin_dir: Path
    manifest_path: Path
    binaries: dict[str, Path] = field(default_factory=dict)
    up_to_date: bool = False

    @property
    def server(self) -> Path:
        return self.binaries["llama-server"]


# --------------------------------------------------------------------------------------------- public API


def ensure(settings: Settings, variant: str | None = None, *, source_spec: str | None = None,
           allow_unpinned: bool = False, series: patchmod.Series | None = None,
           record_latest: bool = True, discard_changes: bool = False) -> BuildResult:
    """Fetch, patch (for ``patched``), configure and build; reuse an up-to-date build. Returns the binaries.

    ``source_spec``/``allow_unpinned`` are passed to :func:`ggml_bridge.fetch.obtain`; ``series`` replaces the
    project's ``patches/`` (e.g. a rebased series); ``record_latest=False`` leaves the
    ``latest-<variant>-<backend>.json`` pointer (what :func:`find_binary` returns) alone; ``discard_changes``
    lets :func:`ggml_bridge.patch.apply_series` delete a patched work tree holding edits.
    """
    variant = variant or settings.build.variant
    if variant not in VARIANT_OPTIONS:
        raise UsageError(f"unknown variant {variant!r}", fix=f"use one of: {', '.join(VARIANT_OPTIONS)}")
    backend, cuda = resolve_backend(settings.build.backend)
    if variant == "upstream-nopeer" and backend != "cuda":
        raise UsageError("variant upstream-nopeer only exists for the CUDA backend",
                         why=f"the backend is {backend}", fix="use --backend cuda, or --variant upstream")

    tree = fetchmod.obtain(settings, source_spec, allow_unpinned)
    if variant == "patched":
        patched = patchmod.apply_series(settings, tree, series, discard_changes=discard_changes)
        series, src = patched.series, patched.path
        head = patched.head
    else:
        src, head, series = tree.path, None, None

    tools = find_toolchain(cuda)
    ui = uimod.ensure(settings, src)
    args = cmake_args(settings, src, variant, backend, tools)
    key = build_key(tree, series, variant, backend, args, tools, ui)
    build_dir = settings.cache_dir / "builds" / f"{variant}-{backend}-{key[:16]}"
    pointer = latest_path(settings, variant, backend) if record_latest else None

    done = _completed(build_dir, key)
    if done is not None:
        log(f"build {variant}/{backend} is up to date: {build_dir}")
        result = BuildResult(variant, backend, build_dir, build_dir / "bin", build_dir / "manifest.json", done, True)
        _write_pointer(pointer, result, key)
        return result

    cache.ensure_writable(settings.cache_dir)
    with cache.entry_lock(build_dir.with_name(build_dir.name + ".lock")):
        done = _completed(build_dir, key)  # another process may have finished it while we waited
        if done is not None:
            result = BuildResult(variant, backend, build_dir, build_dir / "bin", build_dir / "manifest.json", done,
                                 True)
            _write_pointer(pointer, result, key)
            return result
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / COMPLETE_MARKER).unlink(missing_ok=True)
        log_file = build_dir / "build.log"
        log_file.write_text("")
        # a pristine tree has no .git: keep git (llama.cpp's build-info) from finding a repository above the cache
        env = {"GIT_CEILING_DIRECTORIES": str(src.parent)}
        with step(f"configure {variant}/{backend} ({len(args)} CMake options) in {build_dir}"):
            _cmake(tools, src, build_dir, args, log_file, env)
        targets = _select_targets(tools, build_dir, log_file)
        jobs = settings.build.jobs or os.cpu_count() or 1
        with step(f"build {', '.join(targets)} with {jobs} job(s)"), uimod.placed(settings, src, ui):
            _ninja(tools, build_dir, targets, jobs, log_file, env)
        uimod.check_embedded(build_dir, ui)
        return _finish(tree, series, head, src, variant, backend, key, build_dir, args, tools, targets, pointer,
                       ui)


def _finish(tree: fetchmod.Tree, series: patchmod.Series | None, head: str | None, src: Path, variant: str,
            backend: str, key: str, build_dir: Path, args: list[str], tools: Toolchain, targets: list[str],
            pointer: Path | None, ui: uimod.UiAssets) -> BuildResult:
    log_file = build_dir / "build.log"
    binaries = {t: build_dir / "bin" / t for t in targets}
    missing = [t for t, p in binaries.items() if not p.is_file()]
    if missing:
        raise BuildError(f"the build finished but {', '.join(missing)} is missing from {build_dir / 'bin'}",
                         why=f"full log: {log_file}", fix="check the log; the tree may place binaries elsewhere")
    manifest = _manifest(tree, series, head, src, variant, backend, key, build_dir, args, tools, binaries, ui)
    manifest_path = build_dir / "manifest.json"
    cache.write_json_atomic(manifest_path, manifest)
    cache.write_json_atomic(build_dir / COMPLETE_MARKER,
                            {"key": key, "binaries": {n: b["sha256"] for n, b in manifest["binaries"].items()}})
    result = BuildResult(variant, backend, build_dir, build_dir / "bin", manifest_path, binaries, False)
    _write_pointer(pointer, result, key)
    log(f"manifest: {manifest_path}")
    return result


def find_binary(settings: Settings, name: str, variant: str | None = None, backend: str | None = None) -> Path:
    """Path of ``name`` (e.g. "llama-server") from the latest build of ``variant``/``backend``.

    Defaults come from ``settings.build``; backend ``auto`` is resolved as for a build. Raises NotBuiltError.
    """
    variant = variant or settings.build.variant
    backend = backend or settings.build.backend
    if backend == "auto":
        backend = resolve_backend("auto")[0]
    pointer = latest_path(settings, variant, backend)
    fix = f"run `ggml-bridge build --variant {variant} --backend {backend}` first"
    try:
        data = json.loads(pointer.read_text())
    except (OSError, ValueError):
        raise NotBuiltError(f"no {variant}/{backend} build found", why=f"{pointer} does not exist", fix=fix) from None
    path = data.get("binaries", {}).get(name)
    if not path:
        raise NotBuiltError(f"the {variant}/{backend} build has no {name}",
                            why=f"it built {', '.join(data.get('binaries', {})) or 'nothing'}", fix=fix)
    if not Path(path).is_file():
        raise NotBuiltError(f"{name} of the {variant}/{backend} build is gone", why=f"{path} does not exist", fix=fix)
    return Path(path)


def locate(settings: Settings, variant: str, name: str, override_dir: Path | str | None = None, *,
           backend: str | None = None, installed: bool = False) -> Path:
    """The one binary locator: ``name`` of build ``variant`` in ``override_dir`` when the user gave one (a
    ``--bin-dir-*`` option), else from the latest build (:func:`find_binary`), else, with ``installed`` and the
    patched variant, from an installed ggml-bridge-server wheel. Raises NotBuiltError."""
    if override_dir is not None:
        path = Path(override_dir) / name
        if not path.is_file():
            raise NotBuiltError(f"{name} not found in {override_dir}",
                                fix=f"point the option at a directory holding the {variant} build's {name}")
        return path
    try:
        return find_binary(settings, name, variant=variant, backend=backend)
    except NotBuiltError:
        if not (installed and variant == "patched"):
            raise
        from . import wheel  # no build: an installed ggml-bridge-server wheel, if any

        found = wheel.installed_server(settings, name)
        if found is None:
            raise
        return found


def latest_path(settings: Settings, variant: str, backend: str) -> Path:
    return settings.cache_dir / f"latest-{variant}-{backend}.json"


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
            raise ToolchainError("the CUDA backend was requested but nvcc was not found",
                                 why="no nvcc on PATH, $CUDACXX, $CUDA_HOME or /usr/local/cuda",
                                 fix="install the CUDA toolkit (and put nvcc on PATH), or use --backend cpu")
        raise ToolchainError(f"the CUDA backend was requested but CUDA {cuda.version} at {cuda.root} has no cuBLAS",
                             why="cublas_v2.h was not found in its include directories; ggml-cuda needs cuBLAS",
                             fix="install the toolkit's cuBLAS development package (e.g. libcublas-dev), "
                             "or use --backend cpu")
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
    roots = _unique([real.parent.parent] + [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")
                                             if os.environ.get(v)])
    header = None
    for root in roots:
        cands = [root / "include" / "cublas_v2.h", *sorted(root.glob("targets/*/include/cublas_v2.h"))]
        header = next((c for c in cands if c.is_file()), None)
        if header:
            break
    return CudaToolkit(real, roots[0], version, header)


def find_toolchain(cuda: CudaToolkit | None = None) -> Toolchain:
    return Toolchain(find_cmake(), find_ninja(), _compiler("CC", ("cc", "gcc", "clang")),
                     _compiler("CXX", ("c++", "g++", "clang++")), cuda)


def find_cmake() -> Tool:
    """The system cmake if >= 3.21, else the one of the ``cmake`` PyPI package."""
    return _find_tool("cmake", MIN_CMAKE, _pypi_bin("cmake", "CMAKE_BIN_DIR"), "pip install 'cmake>=3.21'")


def find_ninja() -> Tool:
    return _find_tool("ninja", MIN_NINJA, _pypi_bin("ninja", "BIN_DIR"), "pip install ninja")


def cmake_args(settings: Settings, src: Path, variant: str, backend: str, tools: Toolchain) -> list[str]:
    """The full CMake option list for a build (order matters: later options win)."""
    text = _cmakelists_text(src)
    opts: dict[str, str] = {"CMAKE_BUILD_TYPE": "Release"}
    for name in OFF_IF_PRESENT:
        if re.search(rf"\b{name}\b", text):
            opts[name] = "OFF"
    opts["CMAKE_C_COMPILER"] = str(tools.cc.path)
    opts["CMAKE_CXX_COMPILER"] = str(tools.cxx.path)
    opts["GGML_NATIVE"] = "ON" if settings.build.native else "OFF"
    opts["GGML_RPC"] = "ON"  # every variant: llama-server --rpc and ggml-rpc-server (docs/rpc.md)
    if backend == "cuda":
        assert tools.cuda is not None
        opts["GGML_CUDA"] = "ON"
        opts["CMAKE_CUDA_COMPILER"] = str(tools.cuda.nvcc)
        opts["CMAKE_CUDA_ARCHITECTURES"] = settings.build.cuda_arch
    else:
        opts["GGML_CUDA"] = "OFF"
    for name, value in VARIANT_OPTIONS[variant].items():
        if not re.search(rf"\b{name}\b", text):
            log(f"note: {name} is not defined by this tree's CMakeLists (yet); passing it anyway")
        opts[name] = value
    return [f"-D{k}={v}" for k, v in opts.items()] + list(settings.build.cmake_args)


def build_key(tree: fetchmod.Tree, series: patchmod.Series | None, variant: str, backend: str, args: list[str],
              tools: Toolchain, ui: uimod.UiAssets | None = None) -> str:
    ident = {"ui": ui.sha256 if ui else None,
        "tree": tree.key, "content": tree.content_sha256, "series": series.hash if series else None,
        "variant": variant, "backend": backend, "cmake_args": args, "generator": "Ninja",
        "cc": tools.cc.version, "cxx": tools.cxx.version, "nvcc": tools.cuda.version if tools.cuda else None,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- steps


def _cmake(tools: Toolchain, src: Path, build_dir: Path, args: list[str], log_file: Path,
           env: dict[str, str] | None = None) -> None:
    argv = [str(tools.cmake.path), "-S", str(src), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={tools.ninja.path}", *args]
    _note(log_file, argv)
    res = run(argv, check=False, log_file=log_file, error=BuildError, env=env)
    if res.returncode != 0:
        raise build_failed("CMake configure failed", res.returncode, log_file,
                      "check the options above (an unknown -D value, a missing dependency); CMAKE_ARGS adds options")


def _select_targets(tools: Toolchain, build_dir: Path, log_file: Path) -> list[str]:
    res = run([tools.ninja.path, "-C", build_dir, "-t", "targets", "all"], error=BuildError)
    defined = {line.split(":", 1)[0].strip() for line in res.stdout.splitlines() if ":" in line}
    missing = [t for t in REQUIRED_TARGETS if t not in defined]
    if missing:
        raise BuildError(f"the tree defines no {', '.join(missing)} target",
                         why="`ninja -t targets all` after configure does not list it",
                         fix="check that --source is a llama.cpp tree with tools/server (LLAMA_BUILD_SERVER)")
    chosen = [t for t in WANTED_TARGETS if t in defined]
    skipped = [t for t in WANTED_TARGETS if t not in defined]
    if skipped:
        log(f"    not defined by this tree, skipped: {', '.join(skipped)}")
    return chosen


def _ninja(tools: Toolchain, build_dir: Path, targets: list[str], jobs: int, log_file: Path,
           env: dict[str, str] | None = None) -> None:
    progress = Progress()
    argv = [str(tools.ninja.path), "-C", str(build_dir), "-j", str(jobs), *targets]
    _note(log_file, argv)
    res = run(argv, check=False, log_file=log_file, on_line=progress, error=BuildError, env=env)
    if res.returncode != 0:
        raise build_failed("the compile failed", res.returncode, log_file, "fix the error above; the build resumes where "
                      "it stopped when re-run")
    if progress.total == 0:
        log("    ninja: nothing to do")


def _note(log_file: Path, argv: list[str]) -> None:
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write("+ " + " ".join(shlex.quote(a) for a in argv) + "\n")


class Progress:
    """Logs ``[ 40%] 88/220`` once per 10% of ninja's ``[n/N]`` lines."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self.decile = 0
        self.total = 0

    def __call__(self, line: str) -> None:
        m = _PROGRESS.match(line)
        if not m:
            return
        n, total = int(m.group(1)), int(m.group(2))
        self.total = total
        decile = n * 10 // total
        if decile > self.decile:
            self.decile = decile
            log(f"    [{decile * 10:3d}%] {n}/{total} ({self.clock() - self.t0:.0f}s)")


def build_failed(what: str, rc: int, log_file: Path, fix: str) -> BuildError:
    """A BuildError quoting the log from its first error line (``FAILED:``, ``CMake Error``...) on."""
    lines = log_file.read_text(errors="replace").splitlines()[-300:]
    first = next((i for i, line in enumerate(lines) if _ERROR_LINE.search(line)), None)
    shown = lines[first:first + 25] if first is not None else lines[-15:]
    return BuildError(what, why=f"exit status {rc}; full log: {log_file}; last error lines:\n    "
                      + "\n    ".join(line.rstrip() for line in shown or ["(no output)"]), fix=fix)


def _completed(build_dir: Path, key: str) -> dict[str, Path] | None:
    """The binaries of a finished build with this key, if they are all still there and unchanged."""
    try:
        marker = json.loads((build_dir / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("key") != key or not marker.get("binaries"):
        return None
    out = {}
    for name, sha in marker["binaries"].items():
        path = build_dir / "bin" / name
        if not path.is_file() or cache.file_sha256(path) != sha:
            return None
        out[name] = path
    return out


def _manifest(tree: fetchmod.Tree, series: patchmod.Series | None, head: str | None, src: Path, variant: str,
              backend: str, key: str, build_dir: Path, args: list[str], tools: Toolchain,
              binaries: dict[str, Path], ui: uimod.UiAssets) -> dict:
    toolchain = {
        "cc": {"path": str(tools.cc.path), "version": tools.cc.version},
        "cxx": {"path": str(tools.cxx.path), "version": tools.cxx.version},
        "cmake": {"path": str(tools.cmake.path), "version": tools.cmake.version},
        "ninja": {"path": str(tools.ninja.path), "version": tools.ninja.version},
    }
    if tools.cuda:
        toolchain["nvcc"] = {"path": str(tools.cuda.nvcc), "version": tools.cuda.version}
    return {
        "schema": 1,
        "ggml_bridge_version": __version__,
        "variant": variant,
        "backend": backend,
        "key": key,
        **source_manifest(tree, series, head),
        "source_dir": str(src),
        "build_dir": str(build_dir),
        "cmake_args": args,
        "ui": ui.manifest(),
        "toolchain": toolchain,
        "binaries": {n: {"path": str(p), "sha256": cache.file_sha256(p)} for n, p in binaries.items()},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def source_manifest(tree: fetchmod.Tree, series: patchmod.Series | None, head: str | None) -> dict:
    """What a manifest says about the sources: the upstream tree and the patch series applied to it."""
    return {
        "upstream": {
            "commit": tree.commit, "id": tree.commit_or_id, "origin": tree.origin, "pinned": tree.pinned,
            "archive_sha256": tree.archive_sha256, "content_sha256": tree.content_sha256, "cache_key": tree.key,
        },
        "patches": [{"name": p.name, "sha256": p.sha256} for p in series.patches] if series else [],
        "series_hash": series.hash if series else None,
        "patched_head": head,
    }


def _write_pointer(pointer: Path | None, result: BuildResult, key: str) -> None:
    if pointer is None:
        return
    cache.write_json_atomic(pointer, {
        "variant": result.variant, "backend": result.backend, "key": key, "build_dir": str(result.build_dir),
        "manifest": str(result.manifest_path), "binaries": {n: str(p) for n, p in result.binaries.items()},
    })


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
    raise ToolchainError(f"no usable {name} >= {'.'.join(map(str, minimum))}",
                         why="found: " + (", ".join(seen) if seen else "none"), fix=fix)


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
            raise ToolchainError(f"{lang} compiler ${var}={os.environ[var]} not found",
                                 fix=f"fix ${var} or unset it to use the system compiler")
    else:
        path = next((p for p in map(shutil.which, names) if p), None)
        if not path:
            raise ToolchainError(f"no {lang} compiler found", why=f"none of {', '.join(names)} is on PATH",
                                 fix="install gcc and g++ (Debian: apt-get install build-essential) or set CC/CXX")
    res = run([path, "--version"], check=False)
    first = (res.stdout or res.stderr).strip().splitlines()
    if res.returncode != 0 or not first:
        raise ToolchainError(f"{lang} compiler {path} does not run", why=f"`{path} --version` exited {res.returncode}",
                             fix=f"fix the compiler installation or set ${var}")
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


def _cmakelists_text(src: Path) -> str:
    parts = []
    for rel in ("CMakeLists.txt", "ggml/CMakeLists.txt"):
        try:
            parts.append((src / rel).read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(parts)


def _unique(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out


# --------------------------------------------------------------------------------------------- one tree, several variants

#: The order in which a shared tree passes through the variants: the upstream sources first, NO_PEER_COPY as a
#: recompile of the one object that reads the macro, then the series applied on top (only its files recompile).
SHARED_ORDER = ("upstream", "upstream-nopeer", "patched")
#: The one upstream source that reads GGML_CUDA_NO_PEER_COPY, and its static library.
NOPEER_OBJECT = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o"
NOPEER_LIBRARY = "ggml/src/ggml-cuda/libggml-cuda.a"


def ensure_shared(settings: Settings, variants: list[str], *, source_spec: str | None = None,
                  allow_unpinned: bool = False, series: patchmod.Series | None = None,
                  discard_changes: bool = False) -> list[BuildResult]:
    """Build several variants in one static CMake tree, so that the objects they share compile once.

    The tree is configured once (with the patched variant's options, which upstream's CMakeLists ignore) and
    built with the upstream sources; ``upstream-nopeer`` recompiles only ggml-cuda.cu with
    ``-DGGML_CUDA_NO_PEER_COPY`` into a copy of libggml-cuda.a and relinks the tools with ninja's own link
    commands; ``patched`` copies the files the series changes into the tree and lets ninja rebuild what depends on
    them. Each variant gets ``<dir>/<variant>/bin``, its own ``manifest.json`` (with ``shared_tree`` saying how it
    was made) and the usual ``latest-<variant>-<backend>.json`` pointer. Static linking keeps each variant's
    binaries independent of the libraries the next variant rebuilds.
    """
    unknown = [v for v in variants if v not in VARIANT_OPTIONS]
    if unknown or not variants:
        raise UsageError(f"unknown variant {', '.join(unknown) or '(none)'}",
                         fix=f"use one or more of: {', '.join(VARIANT_OPTIONS)}")
    order = [v for v in SHARED_ORDER if v in variants]
    backend, cuda = resolve_backend(settings.build.backend)
    if "upstream-nopeer" in order and backend != "cuda":
        raise UsageError("variant upstream-nopeer only exists for the CUDA backend",
                         why=f"the backend is {backend}", fix="use --backend cuda, or leave upstream-nopeer out")

    tree = fetchmod.obtain(settings, source_spec, allow_unpinned)
    patched = (patchmod.apply_series(settings, tree, series, discard_changes=discard_changes)
               if "patched" in order else None)
    tools = find_toolchain(cuda)
    # each variant is configured with its own options (the tree is re-configured when they change); static
    # libraries, so that a variant's binaries do not load the libraries the next variant rebuilds
    args = {v: [a for a in cmake_args(settings, patched.path if v == "patched" and patched else tree.path,
                                      "upstream" if v == "upstream-nopeer" else v, backend, tools)
                if not a.startswith("-DBUILD_SHARED_LIBS=")] + ["-DBUILD_SHARED_LIBS=OFF"] for v in order}
    ui = uimod.ensure(settings, tree.path)  # the series leaves tools/ui alone: one UI for every variant
    key = build_key(tree, patched.series if patched else None, "shared:" + ",".join(order), backend,
                    [a for v in order for a in [v, *args[v]]], tools, ui)
    root = settings.cache_dir / "builds" / f"shared-{backend}-{key[:16]}"

    results = _shared_completed(root, order, backend, key)
    if results is None:
        cache.ensure_writable(settings.cache_dir)
        with cache.entry_lock(root.with_name(root.name + ".lock")):
            results = _shared_completed(root, order, backend, key) or _shared_build(
                settings, tree, patched, order, backend, key, root, args, tools, ui)
    for r in results:
        _write_pointer(latest_path(settings, r.variant, backend), r, key)
    return results


def _shared_completed(root: Path, order: list[str], backend: str, key: str) -> list[BuildResult] | None:
    out = []
    for v in order:
        d = root / v
        done = _completed(d, key)
        if done is None:
            return None
        out.append(BuildResult(v, backend, d, d / "bin", d / "manifest.json", done, True))
    log(f"shared build of {', '.join(order)} is up to date: {root}")
    return out


def _shared_build(settings: Settings, tree: fetchmod.Tree, patched: patchmod.PatchedTree | None, order: list[str],
                  backend: str, key: str, root: Path, args: dict[str, list[str]],
                  tools: Toolchain, ui: uimod.UiAssets) -> list[BuildResult]:
    src, build_dir = root / "src", root / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    log_file = build_dir / "build.log"
    log_file.write_text("")
    for v in order:
        (root / v / COMPLETE_MARKER).unlink(missing_ok=True)
    # the sources start as the pristine tree; a tree left by an interrupted run may hold the patched files
    if src.exists():
        shutil.rmtree(src)
    with step(f"copy the upstream tree to {src}"):
        shutil.copytree(tree.path, src, symlinks=True)
    env = {"GIT_CEILING_DIRECTORIES": str(root)}
    jobs = settings.build.jobs or os.cpu_count() or 1
    results = []
    upstream_built = False
    configured: list[str] | None = None
    for v in order:
        if v == "patched":
            assert patched is not None
            changed = _overlay_series(patched, src)
            log(f"    the series changes {len(changed)} file(s) of the tree")
        if args[v] != configured:
            with step(f"configure {v}/{backend} ({len(args[v])} CMake options) in {build_dir}"):
                _cmake(tools, src, build_dir, args[v], log_file, env)
            configured = args[v]
        if v == "upstream-nopeer":
            if not upstream_built:  # nopeer alone: the upstream objects first
                with uimod.placed(settings, src, ui):
                    _ninja(tools, build_dir, _select_targets(tools, build_dir, log_file), jobs, log_file, env)
            targets = _select_targets(tools, build_dir, log_file)
            with step(f"upstream-nopeer: recompile ggml-cuda.cu with -DGGML_CUDA_NO_PEER_COPY, relink"):
                bins = _nopeer_relink(tools, build_dir, root / v / "bin", targets, log_file, env)
        else:
            targets = _select_targets(tools, build_dir, log_file)
            with step(f"{v}: build {', '.join(targets)} with {jobs} job(s)"), uimod.placed(settings, src, ui):
                _ninja(tools, build_dir, targets, jobs, log_file, env)
            uimod.check_embedded(build_dir, ui)
            upstream_built = upstream_built or v == "upstream"
            bins = _copy_binaries(build_dir / "bin", root / v / "bin", targets)
        how = {"tree": str(root), "order": order,
               "made": {"upstream": "built from the pristine sources",
                        "upstream-nopeer": f"upstream objects, {NOPEER_OBJECT} recompiled with "
                                           "-DGGML_CUDA_NO_PEER_COPY, tools relinked",
                        "patched": "the series' files copied over the upstream sources, ninja rebuilt what "
                                   "depends on them"}[v]}
        vargs = args[v] + (["-DGGML_CUDA_NO_PEER_COPY=ON"] if v == "upstream-nopeer" else [])
        results.append(_finish_shared(tree, patched if v == "patched" else None, v, backend, key, root / v, src,
                                      vargs, tools, bins, how, ui))
    return results


def _overlay_series(patched: patchmod.PatchedTree, src: Path) -> list[str]:
    """Copy the files the series adds or modifies into ``src`` (and delete the ones it deletes)."""
    base = run(["git", "-C", patched.path, "rev-list", "--max-parents=0", "HEAD"], error=BuildError).stdout.split()[0]
    diff = run(["git", "-C", patched.path, "diff", "--name-status", "--no-renames", "-z", base, "HEAD"],
               error=BuildError).stdout.split("\0")
    changed = []
    for status, rel in zip(diff[0::2], diff[1::2]):
        dest = src / rel
        if status == "D":
            dest.unlink(missing_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(patched.path / rel, dest)
            os.utime(dest)  # newer than every object built from the upstream version
        changed.append(rel)
    return changed


def _nopeer_relink(tools: Toolchain, build_dir: Path, bin_dir: Path, targets: list[str], log_file: Path,
                   env: dict[str, str]) -> dict[str, Path]:
    side = build_dir.parent / "nopeer-objs"
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    bin_dir.mkdir(parents=True, exist_ok=True)

    def command(target: str) -> str:
        res = run([tools.ninja.path, "-C", build_dir, "-t", "commands", target], error=BuildError)
        return res.stdout.strip().splitlines()[-1]

    compile_cmd = command(NOPEER_OBJECT)
    if f"-o {NOPEER_OBJECT}" not in compile_cmd or " -c " not in compile_cmd:
        raise BuildError("cannot derive the NO_PEER_COPY compile of ggml-cuda.cu",
                         why=f"ninja's command for {NOPEER_OBJECT} has an unexpected form: {compile_cmd[:200]}",
                         fix="build upstream-nopeer without --shared-tree")
    compile_cmd = (compile_cmd.replace(" -c ", " -DGGML_CUDA_NO_PEER_COPY -c ", 1)
                   .replace(f"-o {NOPEER_OBJECT}", f"-o {side}/ggml-cuda.cu.o", 1)
                   .replace(f"-MF {NOPEER_OBJECT}.d", f"-MF {side}/ggml-cuda.cu.o.d", 1))
    _shell(compile_cmd, build_dir, log_file, env)
    shutil.copy2(build_dir / NOPEER_LIBRARY, side / "libggml-cuda.a")
    run(["ar", "r", "libggml-cuda.a", "ggml-cuda.cu.o"], cwd=side, error=BuildError)
    out = {}
    for t in targets:
        link = command(f"bin/{t}")
        if NOPEER_LIBRARY not in link or f"-o bin/{t}" not in link:
            raise BuildError(f"cannot relink {t} for NO_PEER_COPY",
                             why=f"its link command does not name {NOPEER_LIBRARY} and bin/{t}",
                             fix="build upstream-nopeer without --shared-tree")
        link = link.replace(NOPEER_LIBRARY, str(side / "libggml-cuda.a")).replace(f"-o bin/{t}",
                                                                                 f"-o {bin_dir / t}", 1)
        _shell(link, build_dir, log_file, env)
        out[t] = bin_dir / t
    return out


def _shell(command: str, cwd: Path, log_file: Path, env: dict[str, str]) -> None:
    """One compile or link command exactly as ninja would run it (``ninja -t commands``)."""
    _note(log_file, ["sh", "-c", command])
    res = run(["sh", "-c", command], cwd=cwd, check=False, log_file=log_file, error=BuildError, env=env)
    if res.returncode != 0:
        raise build_failed("a NO_PEER_COPY compile or link failed", res.returncode, log_file,
                      "check the log; or build upstream-nopeer without --shared-tree")


def _copy_binaries(src_bin: Path, dest_bin: Path, targets: list[str]) -> dict[str, Path]:
    dest_bin.mkdir(parents=True, exist_ok=True)
    out = {}
    for t in targets:
        if not (src_bin / t).is_file():
            raise BuildError(f"the build finished but {t} is missing from {src_bin}",
                             fix="check the build log; the tree may place binaries elsewhere")
        shutil.copy2(src_bin / t, dest_bin / t)
        out[t] = dest_bin / t
    return out


def _finish_shared(tree: fetchmod.Tree, patched: patchmod.PatchedTree | None, variant: str, backend: str, key: str,
                   out_dir: Path, src: Path, args: list[str], tools: Toolchain, binaries: dict[str, Path],
                   how: dict, ui: uimod.UiAssets) -> BuildResult:
    manifest = _manifest(tree, patched.series if patched else None, patched.head if patched else None,
                         patched.path if patched else src, variant, backend, key, out_dir, args, tools, binaries, ui)
    manifest["shared_tree"] = how
    cache.write_json_atomic(out_dir / "manifest.json", manifest)
    cache.write_json_atomic(out_dir / COMPLETE_MARKER,
                            {"key": key, "binaries": {n: b["sha256"] for n, b in manifest["binaries"].items()}})
    log(f"    {variant}: {out_dir / 'bin'} (manifest {out_dir / 'manifest.json'})")
    return BuildResult(variant, backend, out_dir, out_dir / "bin", out_dir / "manifest.json", binaries, False)
