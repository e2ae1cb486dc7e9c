"""The steps of one build (what it is: :mod:`ggml_bridge.distribution.builder.plan`): configure, target selection, the ninja
build with its progress, the completion marker, the manifest and the ``latest-<variant>-<backend>.json`` pointer."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import __version__
from ...foundations import cache, files
from ...foundations.config import BUILD_TARGETS, Settings
from ...foundations.errors import BuildError
from ...foundations.runner import Failure, Output, log, run
from ...foundations.tomlfile import Key
from ...upstream import patch as patchmod
from ...upstream.fetch.tree import Tree
from .plan import BuildPlan
from .toolchain import Toolchain

#: Targets built when the tree defines them, in this order (``build.targets`` may narrow them). llama-server is required.
WANTED_TARGETS = BUILD_TARGETS
REQUIRED_TARGETS = ("llama-server",)
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

    @classmethod
    def at(
        cls, variant: str, backend: str, build_dir: Path, binaries: dict[str, Path], up_to_date: bool
    ) -> BuildResult:
        """The result of a build in ``build_dir`` (binaries in ``bin/``, ``manifest.json`` beside)."""
        return cls(variant, backend, build_dir, build_dir / "bin", build_dir / "manifest.json", binaries, up_to_date)


def latest_path(settings: Settings, variant: str, backend: str) -> Path:
    return settings.layout.latest(variant, backend)


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
    res = run(argv, check=False, env=env, output=Output(log_file=log_file), failure=Failure(BuildError))
    if res.returncode != 0:
        raise build_failed(
            "CMake configure failed",
            res.returncode,
            log_file,
            "check the options above (an unknown -D value, a missing dependency); CMAKE_ARGS adds options",
        )


def select_targets(tools: Toolchain, build_dir: Path, log_file: Path, only: Sequence[str] = ()) -> list[str]:
    res = run([tools.ninja.path, "-C", build_dir, "-t", "targets", "all"], failure=Failure(BuildError))
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
    res = run(
        argv, check=False, env=env, output=Output(log_file=log_file, on_line=progress), failure=Failure(BuildError)
    )
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


def finish(
    plan: BuildPlan,
    out_dir: Path,
    binaries: dict[str, Path],
    *,
    src: Path | None = None,
    args: Sequence[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> BuildResult:
    """Write ``out_dir/manifest.json`` (``src``/``args``: where and how the binaries were really made, when not the
    plan's own; ``extra``: more keys) and the completion marker; the build's result."""
    applied = plan.patched or plan.baseline
    manifest = {
        "schema": 1,
        "ggml_bridge_version": __version__,
        "variant": plan.variant.name,
        "backend": plan.backend,
        "key": plan.key,
        **source_manifest(plan.tree, plan.series, applied.head if applied else None),
        # a baseline with a test-only series (patches/baseline/...): never upstream's build, and it says so
        **({"test_only": plan.variant.about} if plan.variant.test_patches else {}),
        "source_dir": str(src or plan.src),
        "build_dir": str(out_dir),
        "cmake_args": list(plan.cmake_args if args is None else args),
        "ui": plan.ui.manifest(),
        "toolchain": _toolchain_manifest(plan.tools),
        "binaries": {n: {"path": str(p), "sha256": cache.file_sha256(p)} for n, p in binaries.items()},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }
    cache.write_json_atomic(out_dir / "manifest.json", manifest)
    shas = {n: b["sha256"] for n, b in manifest["binaries"].items()}
    cache.write_json_atomic(out_dir / COMPLETE_MARKER, {"key": plan.key, "binaries": shas})
    return BuildResult.at(plan.variant.name, plan.backend, out_dir, binaries, up_to_date=False)


def _toolchain_manifest(tools: Toolchain) -> dict[str, Any]:
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
    return toolchain


def source_manifest(tree: Tree, series: patchmod.Series | None, head: str | None) -> dict[str, Any]:
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
