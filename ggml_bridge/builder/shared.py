"""Several variants built in one static CMake tree, so that the objects they share compile once
(``ggml-bridge build --shared-tree``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .. import cache, gitrepo, modes
from .. import fetch as fetchmod
from .. import patch as patchmod
from .. import ui as uimod
from ..config import Settings
from ..errors import BuildError, UsageError
from ..runner import log, run, step
from . import steps
from .steps import (
    COMPLETE_MARKER,
    BuildResult,
    build_failed,
    build_key,
    cmake_args,
    completed,
    latest_path,
    manifest_for,
    note,
    select_targets,
    write_pointer,
)
from .toolchain import Toolchain, find_toolchain, resolve_backend

#: How a shared tree makes each variant it can build, in the order it passes through them: the upstream sources
#: first, NO_PEER_COPY as a recompile of the one object that reads the macro, then the series applied on top (only
#: its files recompile). A variant of :data:`ggml_bridge.modes.VARIANTS` missing here is refused.
SHARED_RECIPES: dict[str, str] = {
    modes.UPSTREAM: "built from the pristine sources",
    modes.UPSTREAM_NOPEER: "upstream objects, {object} recompiled with -DGGML_CUDA_NO_PEER_COPY, tools relinked",
    modes.PATCHED: "the series' files copied over the upstream sources, ninja rebuilt what depends on them",
}
SHARED_ORDER = tuple(SHARED_RECIPES)
#: The one upstream source that reads GGML_CUDA_NO_PEER_COPY, and its static library.
NOPEER_OBJECT = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o"
NOPEER_LIBRARY = "ggml/src/ggml-cuda/libggml-cuda.a"


def ensure_shared(
    settings: Settings,
    variants: list[str],
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
    for name in variants:
        if modes.variant(name).name not in SHARED_RECIPES:
            raise UsageError(
                f"variant {name} cannot be built in a shared tree",
                why=f"the shared tree knows how to make {', '.join(SHARED_ORDER)}",
                fix=f"build {name} without --shared-tree",
            )
    order = [v for v in SHARED_ORDER if v in variants]
    backend, cuda = resolve_backend(settings.build.backend)
    for name in order:
        modes.check_backend(modes.variant(name), backend, fix=f"use --backend cuda, or leave {name} out")
    tools = find_toolchain(cuda, backend)  # before minutes of fetching: a missing tool fails at once

    tree = fetchmod.obtain(settings, source_spec, allow_unpinned)
    patched = (
        patchmod.apply_series(settings, tree, series, discard_changes=discard_changes)
        if modes.PATCHED in order
        else None
    )
    # each variant is configured with its own options (the tree is re-configured when they change); static
    # libraries, so that a variant's binaries do not load the libraries the next variant rebuilds
    args = {
        v: [
            a
            for a in cmake_args(
                settings,
                patched.path if v == modes.PATCHED and patched else tree.path,
                modes.UPSTREAM if v == modes.UPSTREAM_NOPEER else v,
                backend,
                tools,
            )
            if not a.startswith("-DBUILD_SHARED_LIBS=")
        ]
        + ["-DBUILD_SHARED_LIBS=OFF"]
        for v in order
    }
    ui = uimod.ensure(settings, tree.path)  # the series leaves tools/ui alone: one UI for every variant
    key = build_key(
        tree,
        patched.series if patched else None,
        "shared:" + ",".join(order),
        backend,
        [a for v in order for a in [v, *args[v]]],
        tools,
        ui,
        settings.build.targets,
    )
    root = settings.cache_dir / "builds" / f"shared-{backend}-{key[:16]}"

    results = _shared_completed(root, order, backend, key)
    if results is None:
        cache.ensure_writable(settings.cache_dir)
        with cache.entry_lock(root.with_name(root.name + ".lock")):
            results = _shared_completed(root, order, backend, key) or _shared_build(
                settings, tree, patched, order, backend, key, root, args, tools, ui
            )
    for r in results:
        write_pointer(latest_path(settings, r.variant, backend), r, key)
    return results


def _shared_completed(root: Path, order: list[str], backend: str, key: str) -> list[BuildResult] | None:
    out = []
    for v in order:
        d = root / v
        done = completed(d, key)
        if done is None:
            return None
        out.append(BuildResult(v, backend, d, d / "bin", d / "manifest.json", done, True))
    log(f"shared build of {', '.join(order)} is up to date: {root}")
    return out


def _shared_build(
    settings: Settings,
    tree: fetchmod.Tree,
    patched: patchmod.PatchedTree | None,
    order: list[str],
    backend: str,
    key: str,
    root: Path,
    args: dict[str, list[str]],
    tools: Toolchain,
    ui: uimod.UiAssets,
) -> list[BuildResult]:
    src, build_dir = root / "src", root / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    log_file = build_dir / "build.log"
    log_file.write_text("")
    for v in order:
        (root / v / COMPLETE_MARKER).unlink(missing_ok=True)
    _pristine_sources(tree, patched, src)
    env = {"GIT_CEILING_DIRECTORIES": str(root)}
    jobs = settings.build.jobs or os.cpu_count() or 1
    results = []
    upstream_built = False
    configured: list[str] | None = None
    for v in order:
        if v == modes.PATCHED:
            assert patched is not None
            changed = _overlay_series(patched, src)
            log(f"    the series changes {len(changed)} file(s) of the tree")
        if args[v] != configured:
            with step(f"configure {v}/{backend} ({len(args[v])} CMake options) in {build_dir}"):
                steps.configure(tools, src, build_dir, args[v], log_file, env)
            configured = args[v]
        if v == modes.UPSTREAM_NOPEER:
            if not upstream_built:  # nopeer alone: the upstream objects first
                with uimod.placed(settings, src, ui):
                    steps.compile_targets(
                        tools,
                        build_dir,
                        select_targets(tools, build_dir, log_file, settings.build.targets),
                        jobs,
                        log_file,
                        env,
                    )
            targets = select_targets(tools, build_dir, log_file, settings.build.targets)
            with step("upstream-nopeer: recompile ggml-cuda.cu with -DGGML_CUDA_NO_PEER_COPY, relink"):
                bins = _nopeer_relink(tools, build_dir, root / v / "bin", targets, log_file, env)
        else:
            targets = select_targets(tools, build_dir, log_file, settings.build.targets)
            with step(f"{v}: build {', '.join(targets)} with {jobs} job(s)"), uimod.placed(settings, src, ui):
                steps.compile_targets(tools, build_dir, targets, jobs, log_file, env)
            uimod.check_embedded(build_dir, ui)
            upstream_built = upstream_built or v == modes.UPSTREAM
            bins = _copy_binaries(build_dir / "bin", root / v / "bin", targets)
        how = {"tree": str(root), "order": order, "made": SHARED_RECIPES[v].format(object=NOPEER_OBJECT)}
        vargs = args[v] + (["-DGGML_CUDA_NO_PEER_COPY=ON"] if v == modes.UPSTREAM_NOPEER else [])
        vpatched = patched if v == modes.PATCHED else None
        results.append(_finish_shared(tree, vpatched, v, backend, key, root / v, src, vargs, tools, bins, how, ui))
    return results


def _pristine_sources(tree: fetchmod.Tree, patched: patchmod.PatchedTree | None, src: Path) -> None:
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
    tools: Toolchain, build_dir: Path, bin_dir: Path, targets: list[str], log_file: Path, env: dict[str, str]
) -> dict[str, Path]:
    side = build_dir.parent / "nopeer-objs"
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    bin_dir.mkdir(parents=True, exist_ok=True)

    def command(target: str) -> str:
        res = run([tools.ninja.path, "-C", build_dir, "-t", "commands", target], error=BuildError)
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
    _shell(compile_cmd, build_dir, log_file, env)
    shutil.copy2(build_dir / NOPEER_LIBRARY, side / "libggml-cuda.a")
    run(["ar", "r", "libggml-cuda.a", "ggml-cuda.cu.o"], cwd=side, error=BuildError)
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
    res = run(["sh", "-c", command], cwd=cwd, check=False, log_file=log_file, error=BuildError, env=env)
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


def _finish_shared(
    tree: fetchmod.Tree,
    patched: patchmod.PatchedTree | None,
    variant: str,
    backend: str,
    key: str,
    out_dir: Path,
    src: Path,
    args: list[str],
    tools: Toolchain,
    binaries: dict[str, Path],
    how: dict[str, Any],
    ui: uimod.UiAssets,
) -> BuildResult:
    manifest = manifest_for(
        tree,
        patched.series if patched else None,
        patched.head if patched else None,
        patched.path if patched else src,
        variant,
        backend,
        key,
        out_dir,
        args,
        tools,
        binaries,
        ui,
    )
    manifest["shared_tree"] = how
    cache.write_json_atomic(out_dir / "manifest.json", manifest)
    cache.write_json_atomic(
        out_dir / COMPLETE_MARKER, {"key": key, "binaries": {n: b["sha256"] for n, b in manifest["binaries"].items()}}
    )
    log(f"    {variant}: {out_dir / 'bin'} (manifest {out_dir / 'manifest.json'})")
    return BuildResult(variant, backend, out_dir, out_dir / "bin", out_dir / "manifest.json", binaries, False)
