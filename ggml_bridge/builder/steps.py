"""The steps of one build: the CMake option list and key, configure, target selection, the ninja build with
its progress, the completion marker, the manifest and the ``latest-<variant>-<backend>.json`` pointer."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import __version__, cache, files, modes
from .. import fetch as fetchmod
from .. import patch as patchmod
from .. import ui as uimod
from ..config import BUILD_TARGETS, Settings
from ..errors import BuildError
from ..runner import log, run
from ..tomlfile import Key
from .toolchain import Toolchain

#: Targets built when the tree defines them, in this order (``build.targets`` may narrow them). llama-server is required.
WANTED_TARGETS = BUILD_TARGETS
REQUIRED_TARGETS = ("llama-server",)
#: Turned OFF when the tree's CMakeLists mention them. The web UI is never built by CMake (npm) nor downloaded
#: (LLAMA_USE_PREBUILT_UI): :mod:`ggml_bridge.ui` builds it from the tree and places it where upstream embeds it.
OFF_IF_PRESENT = (
    "LLAMA_BUILD_TESTS",
    "LLAMA_BUILD_EXAMPLES",
    "LLAMA_CURL",
    "LLAMA_OPENSSL",
    "LLAMA_BUILD_UI",
    "LLAMA_USE_PREBUILT_UI",
)
COMPLETE_MARKER = "ggml-bridge-complete.json"
_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
_ERROR_LINE = re.compile(r"(error[: ]|FAILED:|CMake Error|undefined reference|fatal)", re.IGNORECASE)


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


def latest_path(settings: Settings, variant: str, backend: str) -> Path:
    return settings.cache_dir / f"latest-{variant}-{backend}.json"


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
    kind = modes.backend(backend)
    if kind.cuda:
        assert tools.cuda is not None
        opts["GGML_CUDA"] = "ON"
        opts["CMAKE_CUDA_COMPILER"] = str(tools.cuda.nvcc)
        opts["CMAKE_CUDA_ARCHITECTURES"] = settings.build.cuda_arch
    else:
        opts["GGML_CUDA"] = "OFF"
    if kind.vulkan:
        assert tools.vulkan is not None
        opts.update(tools.vulkan.cmake_args())
    for name, value in modes.variant(variant).cmake.items():
        if not re.search(rf"\b{name}\b", text):
            log(f"note: {name} is not defined by this tree's CMakeLists (yet); passing it anyway")
        opts[name] = value
    return [f"-D{k}={v}" for k, v in opts.items()] + list(settings.build.cmake_args)


def build_key(
    tree: fetchmod.Tree,
    series: patchmod.Series | None,
    variant: str,
    backend: str,
    args: list[str],
    tools: Toolchain,
    ui: uimod.UiAssets | None = None,
    targets: Sequence[str] = (),
) -> str:
    ident: dict[str, Any] = {
        "ui": ui.sha256 if ui else None,
        "tree": tree.key,
        "content": tree.content_sha256,
        "series": series.hash if series else None,
        "variant": variant,
        "backend": backend,
        "cmake_args": args,
        "generator": "Ninja",
        "cc": tools.cc.version,
        "cxx": tools.cxx.version,
        "nvcc": tools.cuda.version if tools.cuda else None,
        "vulkan_headers": tools.vulkan.header_version if tools.vulkan else None,
    }
    if targets:  # (only then: the keys of full builds stay as they were)
        ident["targets"] = sorted(targets)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def configure(
    tools: Toolchain, src: Path, build_dir: Path, args: list[str], log_file: Path, env: dict[str, str] | None = None
) -> None:
    argv = [
        str(tools.cmake.path),
        "-S",
        str(src),
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={tools.ninja.path}",
        *args,
    ]
    note(log_file, argv)
    res = run(argv, check=False, log_file=log_file, error=BuildError, env=env)
    if res.returncode != 0:
        raise build_failed(
            "CMake configure failed",
            res.returncode,
            log_file,
            "check the options above (an unknown -D value, a missing dependency); CMAKE_ARGS adds options",
        )


def select_targets(tools: Toolchain, build_dir: Path, log_file: Path, only: Sequence[str] = ()) -> list[str]:
    res = run([tools.ninja.path, "-C", build_dir, "-t", "targets", "all"], error=BuildError)
    defined = {line.split(":", 1)[0].strip() for line in res.stdout.splitlines() if ":" in line}
    missing = [t for t in REQUIRED_TARGETS if t not in defined]
    if missing:
        raise BuildError(
            f"the tree defines no {', '.join(missing)} target",
            why="`ninja -t targets all` after configure does not list it",
            fix="check that --source is a llama.cpp tree with tools/server (LLAMA_BUILD_SERVER)",
        )
    wanted = [t for t in WANTED_TARGETS if not only or t in only or t in REQUIRED_TARGETS]
    chosen = [t for t in wanted if t in defined]
    skipped = [t for t in wanted if t not in defined]
    if skipped:
        log(f"    not defined by this tree, skipped: {', '.join(skipped)}")
    return chosen


def compile_targets(
    tools: Toolchain, build_dir: Path, targets: list[str], jobs: int, log_file: Path, env: dict[str, str] | None = None
) -> None:
    progress = Progress()
    argv = [str(tools.ninja.path), "-C", str(build_dir), "-j", str(jobs), *targets]
    note(log_file, argv)
    res = run(argv, check=False, log_file=log_file, on_line=progress, error=BuildError, env=env)
    if res.returncode != 0:
        raise build_failed(
            "the compile failed",
            res.returncode,
            log_file,
            "fix the error above; the build resumes where it stopped when re-run",
        )
    if progress.total == 0:
        log("    ninja: nothing to do")


def note(log_file: Path, argv: list[str]) -> None:
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
        if total < self.total:
            return  # a nested build's line (ggml-vulkan's shader generator is an ExternalProject): not ninja's own
        self.total = total
        decile = n * 10 // total
        if decile > self.decile:
            self.decile = decile
            log(f"    [{decile * 10:3d}%] {n}/{total} ({self.clock() - self.t0:.0f}s)")


def build_failed(what: str, rc: int, log_file: Path, fix: str) -> BuildError:
    """A BuildError quoting the log from its first error line (``FAILED:``, ``CMake Error``...) on."""
    lines = log_file.read_text(errors="replace").splitlines()[-300:]
    first = next((i for i, line in enumerate(lines) if _ERROR_LINE.search(line)), None)
    shown = lines[first : first + 25] if first is not None else lines[-15:]
    return BuildError(
        what,
        why=f"exit status {rc}; full log: {log_file}; last error lines:\n    "
        + "\n    ".join(line.rstrip() for line in shown or ["(no output)"]),
        fix=fix,
    )


def completed(build_dir: Path, key: str) -> dict[str, Path] | None:
    """The binaries of a finished build with this key, if they are all still there and unchanged."""
    marker = files.read_record(build_dir / COMPLETE_MARKER, shape={"key": Key("str"), "binaries": Key("table")})
    if marker is None or marker.get("key") != key or not marker.get("binaries"):
        return None
    if not all(isinstance(sha, str) for sha in marker["binaries"].values()):
        return None
    out = {}
    for name, sha in marker["binaries"].items():
        path = build_dir / "bin" / name
        if not path.is_file() or cache.file_sha256(path) != sha:
            return None
        out[name] = path
    return out


def manifest_for(
    tree: fetchmod.Tree,
    series: patchmod.Series | None,
    head: str | None,
    src: Path,
    variant: str,
    backend: str,
    key: str,
    build_dir: Path,
    args: list[str],
    tools: Toolchain,
    binaries: dict[str, Path],
    ui: uimod.UiAssets,
) -> dict[str, Any]:
    toolchain: dict[str, Any] = {
        "cc": {"path": str(tools.cc.path), "version": tools.cc.version},
        "cxx": {"path": str(tools.cxx.path), "version": tools.cxx.version},
        "cmake": {"path": str(tools.cmake.path), "version": tools.cmake.version},
        "ninja": {"path": str(tools.ninja.path), "version": tools.ninja.version},
    }
    if tools.cuda:
        toolchain["nvcc"] = {"path": str(tools.cuda.nvcc), "version": tools.cuda.version}
    if tools.vulkan:
        toolchain["vulkan"] = {
            "headers": {"path": str(tools.vulkan.include_dir), "version": tools.vulkan.header_version},
            "loader": str(tools.vulkan.library),
            "glslc": str(tools.vulkan.glslc),
        }
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


def source_manifest(tree: fetchmod.Tree, series: patchmod.Series | None, head: str | None) -> dict[str, Any]:
    """What a manifest says about the sources: the upstream tree and the patch series applied to it."""
    return {
        "upstream": {
            "commit": tree.commit,
            "id": tree.commit_or_id,
            "origin": tree.origin,
            "pinned": tree.pinned,
            "archive_sha256": tree.archive_sha256,
            "content_sha256": tree.content_sha256,
            "cache_key": tree.key,
        },
        "patches": [{"name": p.name, "sha256": p.sha256} for p in series.patches] if series else [],
        "series_hash": series.hash if series else None,
        "patched_head": head,
    }


def write_pointer(pointer: Path | None, result: BuildResult, key: str) -> None:
    if pointer is None:
        return
    cache.write_json_atomic(
        pointer,
        {
            "variant": result.variant,
            "backend": result.backend,
            "key": key,
            "build_dir": str(result.build_dir),
            "manifest": str(result.manifest_path),
            "binaries": {n: str(p) for n, p in result.binaries.items()},
        },
    )


def _cmakelists_text(src: Path) -> str:
    parts = []
    for rel in ("CMakeLists.txt", "ggml/CMakeLists.txt"):
        try:
            parts.append((src / rel).read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(parts)
