"""The server distribution ``ggml-bridge-server``: an sdist built by scikit-build-core, and its platform wheel.

``ggml-bridge sdist`` writes ``ggml_bridge_server-<version>.tar.gz`` holding

* ``vendor/llama.cpp``: the patched tree (tracked files, less docs/models/media/CI folders) with the web UI that
  :mod:`ggml_bridge.ui` built from the tree's lockfile at ``tools/ui/dist``, where upstream embeds it from;
* ``pyproject.toml``, ``CMakeLists.txt``, ``build_support/`` and ``src/ggml_bridge_server`` from the templates
  in ``ggml_bridge/server_dist/`` (llama-cpp-python's layout: forced cache options, then add_subdirectory);
* ``src/ggml_bridge_server/manifest.json``: upstream commit, patch series, UI source and hash (or "no UI").

``pip wheel`` of it needs no network (``--no-build-isolation`` with scikit-build-core installed) and gives a
``py3-none-<platform>`` wheel, ``+cpu`` by default, ``+cu130`` with ``CMAKE_ARGS="-DGGML_CUDA=ON"``.
``ggml-bridge wheel`` does both steps. :func:`installed_server` is how ``serve`` finds an installed wheel.
"""

from __future__ import annotations

import calendar
import contextlib
import gzip
import importlib.util
import io
import json
import os
import shlex
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import __version__, cache
from . import fetch as fetchmod
from . import patch as patchmod
from . import ui as uimod
from .build import steps as buildmod
from .build.installed import DIST_NAME
from .build.installed import installed_server as installed_server  # re-exported: the lookup lives below build
from .config import Settings
from .errors import BuildError, ToolchainError, UsageError
from .runner import log, run, step

PACKAGE = "ggml_bridge_server"
TEMPLATES = Path(__file__).resolve().parent / "server_dist"
#: Top-level folders of llama.cpp the build never reads (75 MB of vocab models, docs, images, CI).
EXCLUDED_TOP = ("docs", "models", "media", ".github", ".devops", "benches", "gguf-py")
#: Every member's mtime: the date of the patch series (a fixed value keeps the sdist reproducible).
MTIME = calendar.timegm((2026, 11, 30, 0, 0, 0))


@dataclass(frozen=True)
class Sdist:
    path: Path
    version: str
    files: int
    ui: uimod.UiAssets


def sdist_filename(version: str = __version__) -> str:
    return f"{PACKAGE}-{version}.tar.gz"


def make_sdist(settings: Settings, out_dir: Path, *, source_spec: str | None = None,
               allow_unpinned: bool = False) -> Sdist:
    """Write the sdist into ``out_dir`` (atomically) and return it."""
    ensure_out_dir(out_dir)  # before minutes of fetching and building the UI
    tree = fetchmod.obtain(settings, source_spec, allow_unpinned)
    patched = patchmod.apply_series(settings, tree)
    ui = uimod.ensure(settings, patched.path)
    if ui.managed and ui.dist is None:
        log("warning: the sdist carries no web UI; its wheel's llama-server will serve none")
    version = __version__
    root = f"{PACKAGE}-{version}"
    tracked = _tracked_files(patched.path)
    manifest = {
        "schema": 1, "distribution": DIST_NAME, "ggml_bridge_version": __version__,
        **buildmod.source_manifest(tree, patched.series, patched.head), "ui": ui.manifest(),
    }
    upstream = f"{tree.commit_or_id[:12]}" + (" (pinned)" if tree.pinned else "")
    generated = {
        "pyproject.toml": _template("pyproject.toml").replace("@VERSION@", version).replace("@UPSTREAM@", upstream),
        "ui.cmake": f"set(GGML_BRIDGE_SERVER_UI {'ON' if ui.dist is not None else 'OFF'})\n",
        f"src/{PACKAGE}/manifest.json": json.dumps(manifest, indent=2, sort_keys=True) + "\n",
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {version}\n",
    }
    target = out_dir / sdist_filename(version)
    count = 0
    with step(f"sdist {target.name}: {len(tracked)} files of the patched tree"
              + (f", web UI {(ui.sha256 or '')[:16]} ({ui.files} files)" if ui.dist else ", no web UI")):
        with _writing(target), cache.atomic_path(target) as tmp:
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=MTIME,
                                                      compresslevel=6) as gz, \
                    tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in sorted(generated):
                    _add_bytes(tar, f"{root}/{rel}", generated[rel].encode())
                for src in sorted(p for p in TEMPLATES.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                    rel = src.relative_to(TEMPLATES).as_posix()
                    if rel not in generated:
                        _add_file(tar, src, f"{root}/{rel}")
                        count += 1
                for rel in tracked:
                    _add_file(tar, patched.path / rel, f"{root}/vendor/llama.cpp/{rel}")
                if ui.dist is not None:
                    for p in sorted(q for q in ui.dist.rglob("*") if q.is_file()):
                        _add_file(tar, p, f"{root}/vendor/llama.cpp/{uimod.UI_DIR.as_posix()}/dist/"
                                  f"{p.relative_to(ui.dist).as_posix()}")
                        count += 1
    count += len(generated) + len(tracked)
    log(f"sdist: {target} ({target.stat().st_size / 1e6:.1f} MB, {count} files)")
    return Sdist(target, version, count, ui)


def build_wheel(settings: Settings, sdist: Path, out_dir: Path) -> Path:
    """``pip wheel`` of the sdist with no network and no build isolation; returns the wheel."""
    if importlib.util.find_spec("scikit_build_core") is None:
        raise ToolchainError("building the server wheel needs scikit-build-core in this Python environment",
                             why=f"{sys.executable} cannot import scikit_build_core (the build runs without "
                             "network, so pip may not fetch it)",
                             fix="pip install 'scikit-build-core>=0.10' (or pip install 'ggml-bridge[wheel]')")
    ensure_out_dir(out_dir)
    before = set(out_dir.glob(f"{PACKAGE}-*.whl"))
    env = {"CMAKE_ARGS": shlex.join(settings.build.cmake_args), "PIP_NO_INDEX": "1",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(settings.build.jobs or os.cpu_count() or 1)}
    log_file = out_dir / f"{sdist.name}.wheel.log"
    log_file.write_text("")
    progress = buildmod.Progress()
    argv = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-v",
            "-w", str(out_dir), str(sdist)]
    # pip's build and unpack folders (about 70 MB) go to a folder of ours that is removed however the run ends
    # (an interrupt included); a SIGKILLed run's is removed by the next run's cache clean-up
    with step(f"pip wheel {sdist.name} (scikit-build-core, CMAKE_ARGS={env['CMAKE_ARGS'] or '(none)'})"), \
            cache.staging(settings.cache_dir, "pip-tmp") as pip_tmp:
        res = run(argv, check=False, log_file=log_file, env={**env, "TMPDIR": str(pip_tmp)}, on_line=progress,
                  error=BuildError)
    if res.returncode != 0:
        raise buildmod.build_failed("building the server wheel failed", res.returncode, log_file,
                               "fix the error above; CMAKE_ARGS passes CMake options (e.g. -DGGML_CUDA=ON)")
    made = sorted(set(out_dir.glob(f"{PACKAGE}-*.whl")) - before, key=lambda p: p.stat().st_mtime)
    if not made:
        made = sorted(out_dir.glob(f"{PACKAGE}-*.whl"), key=lambda p: p.stat().st_mtime)
    if not made:
        raise BuildError("pip reported success but wrote no ggml_bridge_server wheel", why=f"log: {log_file}")
    log(f"wheel: {made[-1]} ({made[-1].stat().st_size / 1e6:.1f} MB)")
    return made[-1]


# --------------------------------------------------------------------------------------------- internals


def _tracked_files(tree: Path) -> list[str]:
    res = run(["git", "-C", str(tree), "ls-files", "-z"], error=BuildError)
    files = [f for f in res.stdout.split("\0") if f]
    if not files:
        raise BuildError(f"the patched tree {tree} lists no tracked files")
    kept = [f for f in files if f.split("/", 1)[0] not in EXCLUDED_TOP and (tree / f).exists()]
    if f"{uimod.UI_DIR.as_posix()}/dist/index.html" in kept:
        raise UsageError(f"the patched tree {tree} tracks tools/ui/dist", fix="remove it from the tree")
    return kept


def _template(rel: str) -> str:
    return (TEMPLATES / rel).read_text()


def _info(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_info(name, len(data), 0o644), io.BytesIO(data))


def _add_file(tar: tarfile.TarFile, path: Path, name: str) -> None:
    st = path.lstat()
    if path.is_symlink():
        info = _info(name, 0, 0o777)
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        tar.addfile(info)
        return
    with open(path, "rb") as fh:
        tar.addfile(_info(name, st.st_size, 0o755 if st.st_mode & 0o111 else 0o644), fh)


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[None]:
    """An OSError while writing ``target`` (disk full, folder made read-only meanwhile) is one error line; the
    partial file is gone (cache.atomic_path)."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"cannot write {target}", why=e.strerror or str(e),
                         fix="free space or choose another --out folder; nothing was left behind") from None


def ensure_out_dir(out_dir: Path) -> None:
    """``--out`` is a folder we can write (created when missing); UsageError naming it otherwise."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"--out {out_dir} is a file, not a folder", fix="pass a folder (it is created if missing)"
                         ) from None
    except OSError as e:
        raise UsageError(f"--out {out_dir}: cannot create the folder", why=e.strerror or str(e),
                         fix="pass a folder you can write") from None
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is not a folder", fix="pass a folder (it is created if missing)")
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir} is not writable", why="nothing was written",
                         fix="pass a folder you can write, or fix its permissions")


def default_out_dir() -> Path:
    return Path.cwd() / "dist"
