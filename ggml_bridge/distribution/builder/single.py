"""Build one variant in its own build folder: fetch, patch, configure and compile, unless a finished build of its key
is there (:func:`ensure`, :func:`build`)."""

from __future__ import annotations

from pathlib import Path

from ...foundations import cache
from ...foundations.config import Settings
from ...foundations.errors import BuildError
from ...foundations.runner import log, step
from ...runtime import modes
from ...upstream import patch as patchmod
from .. import ui as uimod
from . import plan, steps
from .steps import COMPLETE_MARKER, BuildResult, completed, latest_path, select_targets, write_pointer


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

    ``source_spec``/``allow_unpinned`` are passed to :func:`~ggml_bridge.upstream.fetch.resolve.obtain`; ``series`` replaces the
    project's ``patches/`` (e.g. a rebased series); ``record_latest=False`` leaves the
    ``latest-<variant>-<backend>.json`` pointer (what :func:`~ggml_bridge.distribution.builder.locate.find_binary` returns) alone; ``discard_changes``
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
