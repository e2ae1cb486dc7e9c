"""Configure and build llama-server (plus llama-bench, llama-perplexity and our test programs) with CMake + Ninja.

Build directories are keyed by (upstream tree, patch series, CMake options, backend, compilers):
``<cache>/builds/<variant>-<backend>-<key>/``. When the key and the completed marker match, nothing is configured
or compiled ("up to date"). Each build writes ``manifest.json`` into its directory and the pointer
``<cache>/latest-<variant>-<backend>.json`` that :func:`find_binary` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...foundations import cache, files
from ...foundations.config import Settings
from ...foundations.errors import BuildError, NotBuiltError
from ...foundations.runner import log, step
from ...foundations.tomlfile import Key
from ...runtime import modes
from ...upstream import patch as patchmod
from .. import ui as uimod
from . import plan, steps
from .installed import installed_server
from .plan import OFF_IF_PRESENT, BuildPlan, build_key, cmake_args
from .shared import NOPEER_LIBRARY, NOPEER_OBJECT, SHARED_ORDER, SHARED_RECIPES, ensure_shared
from .steps import (
    COMPLETE_MARKER,
    REQUIRED_TARGETS,
    WANTED_TARGETS,
    BuildResult,
    Progress,
    build_failed,
    completed,
    latest_path,
    select_targets,
    source_manifest,
    write_pointer,
)
from .toolchain import (
    MIN_CMAKE,
    MIN_NINJA,
    CudaToolkit,
    Tool,
    Toolchain,
    detect_cuda,
    find_cmake,
    find_ninja,
    find_toolchain,
    resolve_backend,
)

__all__ = [
    "COMPLETE_MARKER",
    "MIN_CMAKE",
    "MIN_NINJA",
    "NOPEER_LIBRARY",
    "NOPEER_OBJECT",
    "OFF_IF_PRESENT",
    "REQUIRED_TARGETS",
    "SHARED_ORDER",
    "SHARED_RECIPES",
    "WANTED_TARGETS",
    "BuildPlan",
    "BuildResult",
    "CudaToolkit",
    "Progress",
    "Tool",
    "Toolchain",
    "build",
    "build_failed",
    "build_key",
    "cmake_args",
    "detect_cuda",
    "ensure",
    "ensure_shared",
    "find_binary",
    "find_cmake",
    "find_manifest",
    "find_ninja",
    "find_toolchain",
    "installed_server",
    "latest_path",
    "locate",
    "plan",
    "resolve_backend",
    "source_manifest",
]


# --------------------------------------------------------------------------------------------- public API


def ensure(
    settings: Settings,
    variant: modes.Variant | str | None = None,
    *,
    source_spec: str | None = None,
    allow_unpinned: bool = False,
    series: patchmod.Series | None = None,
    record_latest: bool = True,
    discard_changes: bool = False,
) -> BuildResult:
    """Fetch, patch (for ``patched``), configure and build; reuse an up-to-date build. Returns the binaries.

    ``source_spec``/``allow_unpinned`` are passed to :func:`ggml_bridge.upstream.fetch.obtain`; ``series`` replaces the
    project's ``patches/`` (e.g. a rebased series); ``record_latest=False`` leaves the
    ``latest-<variant>-<backend>.json`` pointer (what :func:`find_binary` returns) alone; ``discard_changes``
    lets :func:`ggml_bridge.upstream.patch.apply_series` delete a patched work tree holding edits.
    """
    target = plan.resolve(settings, [variant or settings.build.variant], "use --backend cuda, or --variant upstream")
    v = target.variants[0]
    srcs = plan.sources(
        settings,
        patched=v.patched,
        options=plan.SourceOptions(source_spec, allow_unpinned, series, discard_changes),
        variants=[v],
    )
    return build(settings, plan.single(settings, target, v, srcs), record_latest=record_latest)


def build(settings: Settings, p: plan.BuildPlan, *, record_latest: bool = True) -> BuildResult:
    """Configure and build what ``p`` plans in its own build folder, unless a finished build of its key is there."""
    build_dir = p.build_dir(settings)
    pointer = latest_path(settings, p.variant.name, p.backend) if record_latest else None
    done = completed(build_dir, p.key)
    if done is None:
        cache.ensure_writable(settings.layout)
        with cache.entry_lock(build_dir.with_name(build_dir.name + ".lock")):
            done = completed(build_dir, p.key)  # another process may have finished it while we waited
            if done is None:
                result = _compile(settings, p, build_dir)
                write_pointer(pointer, result, p.key)
                return result
    else:
        log(f"build {p.variant.name}/{p.backend} is up to date: {build_dir}")
    result = BuildResult.at(p.variant.name, p.backend, build_dir, done, up_to_date=True)
    write_pointer(pointer, result, p.key)
    return result


def _compile(settings: Settings, p: plan.BuildPlan, build_dir: Path) -> BuildResult:
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / COMPLETE_MARKER).unlink(missing_ok=True)
    log_file = build_dir / "build.log"
    log_file.write_text("")
    # a pristine tree has no .git: keep git (llama.cpp's build-info) from finding a repository above the cache
    env = {"GIT_CEILING_DIRECTORIES": str(p.src.parent)}
    args = list(p.cmake_args)
    with step(f"configure {p.variant.name}/{p.backend} ({len(args)} CMake options) in {build_dir}"):
        steps.configure(p.tools, p.src, build_dir, args, log_file, env)
    targets = select_targets(p.tools, build_dir, log_file, p.targets)
    jobs = plan.jobs(settings)
    with step(f"build {', '.join(targets)} with {jobs} job(s)"), uimod.placed(settings, p.src, p.ui):
        steps.compile_targets(p.tools, build_dir, targets, jobs, log_file, env)
    uimod.check_embedded(build_dir, p.ui)
    binaries = {t: build_dir / "bin" / t for t in targets}
    missing = [t for t, path in binaries.items() if not path.is_file()]
    if missing:
        raise BuildError(
            f"the build finished but {', '.join(missing)} is missing from {build_dir / 'bin'}",
            why=f"full log: {log_file}",
            fix="check the log; the tree may place binaries elsewhere",
        )
    result = steps.finish(p, build_dir, binaries)
    log(f"manifest: {result.manifest_path}")
    return result


def find_binary(settings: Settings, name: str, variant: str | None = None, backend: str | None = None) -> Path:
    """Path of ``name`` (e.g. "llama-server") from the latest build of ``variant``/``backend``.

    Defaults come from ``settings.build``; backend ``auto`` is resolved as for a build. Raises NotBuiltError.
    """
    variant, backend, data = _latest(settings, variant, backend)
    fix = f"run `ggml-bridge build --variant {variant} --backend {backend}` first"
    path = data.get("binaries", {}).get(name)
    if not path:
        raise NotBuiltError(
            f"the {variant}/{backend} build has no {name}",
            why=f"it built {', '.join(data.get('binaries', {})) or 'nothing'}",
            fix=fix,
        )
    if not Path(path).is_file():
        raise NotBuiltError(f"{name} of the {variant}/{backend} build is gone", why=f"{path} does not exist", fix=fix)
    return Path(path)


def find_manifest(settings: Settings, variant: str | None = None, backend: str | None = None) -> Path:
    """The ``manifest.json`` of the latest build of ``variant``/``backend`` (defaults as :func:`find_binary`)."""
    variant, backend, data = _latest(settings, variant, backend)
    path = Path(str(data.get("manifest", "")))
    if not data.get("manifest") or not path.is_file():
        raise NotBuiltError(
            f"the manifest of the {variant}/{backend} build is gone",
            why=f"{path} does not exist",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` again",
        )
    return path


def _latest(settings: Settings, variant: str | None, backend: str | None) -> tuple[str, str, dict[str, Any]]:
    """(variant, backend, the ``latest-<variant>-<backend>.json`` pointer); NotBuiltError without one."""
    variant = modes.variant(variant or settings.build.variant).name
    backend = backend or settings.build.backend
    if backend == "auto":
        backend = resolve_backend("auto")[0]
    pointer = latest_path(settings, variant, backend)
    if not pointer.is_file():
        raise NotBuiltError(
            f"no {variant}/{backend} build found",
            why=f"{pointer} does not exist",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` first",
        )
    data = files.read_record(pointer, shape=POINTER_KEYS)
    if data is None or not all(isinstance(v, str) for v in data.get("binaries", {}).values()):
        raise NotBuiltError(
            f"the {variant}/{backend} build pointer {pointer} is damaged",
            why="it is not the JSON object a build writes (variant, backend, manifest, binaries by name)",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` again",
        )
    return variant, backend, data


#: What a ``latest-<variant>-<backend>.json`` pointer holds (:func:`ggml_bridge.distribution.builder.steps.write_pointer`).
POINTER_KEYS = {
    "variant": Key("str"),
    "backend": Key("str"),
    "key": Key("str"),
    "build_dir": Key("str"),
    "manifest": Key("str"),
    "binaries": Key("table"),
}


def locate(
    settings: Settings,
    variant: str,
    name: str,
    override_dir: Path | str | None = None,
    *,
    backend: str | None = None,
    installed: bool = False,
) -> Path:
    """The one binary locator: ``name`` of build ``variant`` in ``override_dir`` when the user gave one (a
    ``--bin-dir-*`` option), else from the latest build (:func:`find_binary`), else, with ``installed`` and the
    patched variant, from an installed ggml-bridge-server wheel. Raises NotBuiltError."""
    if override_dir is not None:
        path = Path(override_dir) / name
        if not path.is_file():
            raise NotBuiltError(
                f"{name} not found in {override_dir}",
                fix=f"point the option at a directory holding the {variant} build's {name}",
            )
        return path
    try:
        return find_binary(settings, name, variant=variant, backend=backend)
    except NotBuiltError:
        if not (installed and variant == modes.PATCHED):  # the wheel carries the patched build
            raise
        found = installed_server(settings, name)  # no build: an installed ggml-bridge-server wheel, if any
        if found is None:
            raise
        return found
