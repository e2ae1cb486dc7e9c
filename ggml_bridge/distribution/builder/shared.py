"""Several variants built in one static CMake tree, so that the objects they share compile once
(``ggml-bridge build --shared-tree``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from ...foundations import cache, gitrepo
from ...foundations.config import Settings
from ...foundations.errors import BuildError, UsageError
from ...foundations.runner import Failure, Output, log, run, step
from ...runtime import modes
from ...upstream import patch as patchmod
from ...upstream.fetch.tree import Tree
from .. import ui as uimod
from . import plan, steps
from .steps import (
    COMPLETE_MARKER,
    BuildResult,
    build_failed,
    completed,
    latest_path,
    note,
    select_targets,
    write_pointer,
)
from .toolchain import Toolchain

#: How a shared tree makes each variant it can build, in the order it passes through them: the upstream sources
#: first, NO_PEER_COPY as a recompile of the one object that reads the macro, then the series applied on top (only
#: its files recompile). A variant of :data:`ggml_bridge.runtime.modes.VARIANTS` missing here is refused.
SHARED_RECIPES: dict[str, str] = {
    modes.UPSTREAM: "built from the pristine sources",
    modes.UPSTREAM_NOPEER: "upstream objects, {object} recompiled with -DGGML_CUDA_NO_PEER_COPY, tools relinked",
    modes.UPSTREAM_NOPEER_VIRTUAL: "TEST-ONLY baseline: upstream objects, {object} recompiled from the test-only "
    "series' ggml-cuda.cu (patches/baseline/nopeer-virtual) with -DGGML_CUDA_NO_PEER_COPY, tools relinked",
    modes.PATCHED: "the series' files copied over the upstream sources, ninja rebuilt what depends on them",
}
SHARED_ORDER = tuple(SHARED_RECIPES)
#: The one upstream source that reads GGML_CUDA_NO_PEER_COPY, and its static library.
NOPEER_OBJECT = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o"
NOPEER_LIBRARY = "ggml/src/ggml-cuda/libggml-cuda.a"
NOPEER_SOURCE = "ggml/src/ggml-cuda/ggml-cuda.cu"


def ensure_shared(
    settings: Settings,
    variants: Sequence[modes.Variant | str],
    *,
    source_spec: str | None = None,
    allow_unpinned: bool = False,
    series: patchmod.Series | None = None,
    discard_changes: bool = False,
) -> list[BuildResult]:
    """Build several variants in one static CMake tree, so that the objects they share compile once.

    The tree is configured once (with the patched variant's options, which upstream's CMakeLists ignore) and
    built with the upstream sources; ``upstream-nopeer`` recompiles only ggml-cuda.cu with
    ``-DGGML_CUDA_NO_PEER_COPY`` into a copy of libggml-cuda.a and relinks the tools with ninja's own link
    commands; ``patched`` copies the files the series changes into the tree and lets ninja rebuild what depends on
    them. Each variant gets ``<dir>/<variant>/bin``, its own ``manifest.json`` (with ``shared_tree`` saying how it
    was made) and the usual ``latest-<variant>-<backend>.json`` pointer. Static linking keeps each variant's
    binaries independent of the libraries the next variant rebuilds.
    """
    if not variants:
        raise UsageError("no variant to build", fix=f"use one or more of: {', '.join(modes.VARIANTS)}")
    wanted = [modes.variant(v) for v in variants]
    for v in wanted:
        if v.name not in SHARED_RECIPES:
            raise UsageError(
                f"variant {v.name} cannot be built in a shared tree",
                why=f"the shared tree knows how to make {', '.join(SHARED_ORDER)}",
                fix=f"build {v.name} without --shared-tree",
            )
    target = plan.resolve(settings, wanted, "use --backend cuda, or leave {variant} out")
    srcs = plan.sources(  # the series leaves tools/ui alone: one UI, the pristine tree's, for every variant
        settings,
        patched=any(v.patched for v in target.variants),
        ui_of_patched=False,
        options=plan.SourceOptions(source_spec, allow_unpinned, series, discard_changes),
        variants=target.variants,
    )
    plans = plan.shared(settings, target, srcs)
    key = plans[0].key
    root = settings.layout.build("shared", target.backend, key)
    results = _shared_completed(root, plans)
    if results is None:
        cache.ensure_writable(settings.layout)
        with cache.entry_lock(root.with_name(root.name + ".lock")):
            results = _shared_completed(root, plans) or _shared_build(settings, plans, root)
    for r in results:
        write_pointer(latest_path(settings, r.variant, target.backend), r, key)
    return results


def _shared_completed(root: Path, plans: Sequence[plan.BuildPlan]) -> list[BuildResult] | None:
    out = []
    for p in plans:
        d = root / p.variant.name
        done = completed(d, p.key)
        if done is None:
            return None
        out.append(BuildResult.at(p.variant.name, p.backend, d, done, up_to_date=True))
    log(f"shared build of {', '.join(p.variant.name for p in plans)} is up to date: {root}")
    return out


def _shared_build(settings: Settings, plans: Sequence[plan.BuildPlan], root: Path) -> list[BuildResult]:
    src, build_dir = root / "src", root / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    log_file = build_dir / "build.log"
    log_file.write_text("")
    for p in plans:
        (root / p.variant.name / COMPLETE_MARKER).unlink(missing_ok=True)
    first = plans[0]
    _pristine_sources(first.tree, first.sources.patched, src)
    env = {"GIT_CEILING_DIRECTORIES": str(root)}
    jobs = plan.jobs(settings)
    order = [p.variant.name for p in plans]
    results = []
    upstream_built = False
    configured: tuple[str, ...] | None = None
    for p in plans:
        v, tools, out_dir = p.variant.name, p.tools, root / p.variant.name
        if p.patched is not None:
            changed = _overlay_series(p.patched, src)
            log(f"    the series changes {len(changed)} file(s) of the tree")
        if p.cmake_args != configured:
            with step(f"configure {v}/{p.backend} ({len(p.cmake_args)} CMake options) in {build_dir}"):
                steps.configure(tools, src, build_dir, list(p.cmake_args), log_file, env)
            configured = p.cmake_args
        if v in (modes.UPSTREAM_NOPEER, modes.UPSTREAM_NOPEER_VIRTUAL):
            if not upstream_built:  # nopeer alone: the upstream objects first
                with uimod.placed(settings, src, p.ui):
                    targets = select_targets(tools, build_dir, log_file, p.targets)
                    steps.compile_targets(tools, build_dir, targets, jobs, log_file, env)
                upstream_built = True
            targets = select_targets(tools, build_dir, log_file, p.targets)
            # the baseline's ggml-cuda.cu is the test-only series' (its work tree); nopeer's the tree's own
            source = (p.baseline.path / NOPEER_SOURCE, src / NOPEER_SOURCE) if p.baseline else None
            with step(f"{v}: recompile ggml-cuda.cu with -DGGML_CUDA_NO_PEER_COPY, relink"):
                bins = _nopeer_relink(tools, build_dir, out_dir / "bin", targets, log_file, env, source)
        else:
            targets = select_targets(tools, build_dir, log_file, p.targets)
            with step(f"{v}: build {', '.join(targets)} with {jobs} job(s)"), uimod.placed(settings, src, p.ui):
                steps.compile_targets(tools, build_dir, targets, jobs, log_file, env)
            uimod.check_embedded(build_dir, p.ui)
            upstream_built = upstream_built or v == modes.UPSTREAM
            bins = _copy_binaries(build_dir / "bin", out_dir / "bin", targets)
        how = {"tree": str(root), "order": order, "made": SHARED_RECIPES[v].format(object=NOPEER_OBJECT)}
        # the variant's own options that the tree was not configured with were applied by a recompile (NO_PEER_COPY)
        own = [f"-D{k}={val}" for k, val in p.variant.cmake.items() if f"-D{k}={val}" not in p.cmake_args]
        made_in = p.patched.path if p.patched else src
        result = steps.finish(p, out_dir, bins, src=made_in, args=[*p.cmake_args, *own], extra={"shared_tree": how})
        log(f"    {v}: {out_dir / 'bin'} (manifest {out_dir / 'manifest.json'})")
        results.append(result)
    return results


def _pristine_sources(tree: Tree, patched: patchmod.PatchedTree | None, src: Path) -> None:
    """The sources start as the pristine tree; a tree left by an interrupted run may hold the patched files."""
    if src.exists():
        shutil.rmtree(src)
    with step(f"copy the upstream tree to {src}"):
        shutil.copytree(tree.path, src, symlinks=True)
        if patched is not None:
            # the copy keeps the pristine files' old times, but the build folder may hold objects compiled from
            # the series' version of them (a run stopped after the patched variant began): ninja would take those
            # objects as up to date and link them into the upstream binaries. The files the series changes are
            # made newer than any such object, so that they are compiled again from upstream's version.
            for _, rel in _series_changes(patched):
                if (src / rel).is_file():
                    os.utime(src / rel)


def _series_changes(patched: patchmod.PatchedTree) -> list[tuple[str, str]]:
    """(status, path) of every file the series adds (A), modifies (M) or deletes (D)."""
    base = gitrepo.run(patched.path, "rev-list", "--max-parents=0", "HEAD", error=BuildError).stdout.split()[0]
    diff = gitrepo.run(
        patched.path, "diff", "--name-status", "--no-renames", "-z", base, "HEAD", error=BuildError
    ).stdout.split("\0")
    return list(zip(diff[0::2], diff[1::2], strict=False))


def _overlay_series(patched: patchmod.PatchedTree, src: Path) -> list[str]:
    """Copy the files the series adds or modifies into ``src`` (and delete the ones it deletes)."""
    changed = []
    for status, rel in _series_changes(patched):
        dest = src / rel
        if status == "D":
            dest.unlink(missing_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(patched.path / rel, dest)
            os.utime(dest)  # newer than every object built from the upstream version
        changed.append(rel)
    return changed


def _nopeer_relink(
    tools: Toolchain,
    build_dir: Path,
    bin_dir: Path,
    targets: list[str],
    log_file: Path,
    env: dict[str, str],
    source: tuple[Path, Path] | None = None,
) -> dict[str, Path]:
    """``source``: (the file to compile instead, the tree's own) for a baseline with a test-only series."""
    side = build_dir.parent / ("nopeer-objs" if source is None else "nopeer-virtual-objs")
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    bin_dir.mkdir(parents=True, exist_ok=True)

    def command(target: str) -> str:
        res = run([tools.ninja.path, "-C", build_dir, "-t", "commands", target], failure=Failure(BuildError))
        return res.stdout.strip().splitlines()[-1]

    compile_cmd = command(NOPEER_OBJECT)
    if f"-o {NOPEER_OBJECT}" not in compile_cmd or " -c " not in compile_cmd:
        raise BuildError(
            "cannot derive the NO_PEER_COPY compile of ggml-cuda.cu",
            why=f"ninja's command for {NOPEER_OBJECT} has an unexpected form: {compile_cmd[:200]}",
            fix="build upstream-nopeer without --shared-tree",
        )
    compile_cmd = (
        compile_cmd.replace(" -c ", " -DGGML_CUDA_NO_PEER_COPY -c ", 1)
        .replace(f"-o {NOPEER_OBJECT}", f"-o {side}/ggml-cuda.cu.o", 1)
        .replace(f"-MF {NOPEER_OBJECT}.d", f"-MF {side}/ggml-cuda.cu.o.d", 1)
    )
    if source is not None:
        instead, own = source
        if compile_cmd.count(str(own)) != 1:
            raise BuildError(
                "cannot derive the baseline's compile of ggml-cuda.cu",
                why=f"ninja's command for {NOPEER_OBJECT} does not name {own} once",
                fix="build the baseline variant without --shared-tree",
            )
        compile_cmd = compile_cmd.replace(str(own), str(instead))
    _shell(compile_cmd, build_dir, log_file, env)
    shutil.copy2(build_dir / NOPEER_LIBRARY, side / "libggml-cuda.a")
    run(["ar", "r", "libggml-cuda.a", "ggml-cuda.cu.o"], cwd=side, failure=Failure(BuildError))
    out = {}
    for t in targets:
        link = command(f"bin/{t}")
        if NOPEER_LIBRARY not in link or f"-o bin/{t}" not in link:
            raise BuildError(
                f"cannot relink {t} for NO_PEER_COPY",
                why=f"its link command does not name {NOPEER_LIBRARY} and bin/{t}",
                fix="build upstream-nopeer without --shared-tree",
            )
        link = link.replace(NOPEER_LIBRARY, str(side / "libggml-cuda.a")).replace(f"-o bin/{t}", f"-o {bin_dir / t}", 1)
        _shell(link, build_dir, log_file, env)
        out[t] = bin_dir / t
    return out


def _shell(command: str, cwd: Path, log_file: Path, env: dict[str, str]) -> None:
    """One compile or link command exactly as ninja would run it (``ninja -t commands``)."""
    note(log_file, ["sh", "-c", command])
    res = run(
        ["sh", "-c", command],
        cwd=cwd,
        check=False,
        env=env,
        output=Output(log_file=log_file),
        failure=Failure(BuildError),
    )
    if res.returncode != 0:
        raise build_failed(
            "a NO_PEER_COPY compile or link failed",
            res.returncode,
            log_file,
            "check the log; or build upstream-nopeer without --shared-tree",
        )


def _copy_binaries(src_bin: Path, dest_bin: Path, targets: list[str]) -> dict[str, Path]:
    dest_bin.mkdir(parents=True, exist_ok=True)
    out = {}
    for t in targets:
        if not (src_bin / t).is_file():
            raise BuildError(
                f"the build finished but {t} is missing from {src_bin}",
                fix="check the build log; the tree may place binaries elsewhere",
            )
        shutil.copy2(src_bin / t, dest_bin / t)
        out[t] = dest_bin / t
    return out
