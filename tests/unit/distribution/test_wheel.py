"""The ggml-bridge-server distribution: sdist contents, the version plugin, the installed package's API and errors,
serve's use of an installed wheel (real wheels in a fresh venv: tests/integration/test_wheel.py)."""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.distribution import wheel, wheel_plan
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import BuildError, NotBuiltError, ServeError, ToolchainError, UsageError
from ggml_bridge.upstream import pin

from helpers import REPO_ROOT, fake_model, fake_vulkan_root, write_fake_bin

TEMPLATES = REPO_ROOT / "ggml_bridge" / "distribution" / "server_dist"


def sdist_members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def read_member(path: Path, name: str) -> str:
    with tarfile.open(path) as tar:
        fh = tar.extractfile(name)
        assert fh is not None
        return fh.read().decode()


# --------------------------------------------------------------------------------------------- sdist


def test_sdist_carries_the_patched_tree_templates_and_manifest(
    settings: config.Settings,
    upstream,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    made = wheel.make_sdist(settings, tmp_path / "out")
    assert made.path.name == f"ggml_bridge_server-{made.version}.tar.gz"
    names = sdist_members(made.path)
    root = f"ggml_bridge_server-{made.version}/"
    for rel in (
        "pyproject.toml",
        "build_info.cmake",
        "CMakeLists.txt",
        "ui.cmake",
        "PKG-INFO",
        "build_support/ggml_bridge_server_version.py",
        "src/ggml_bridge_server/__init__.py",
        "src/ggml_bridge_server/__main__.py",
        "src/ggml_bridge_server/manifest.json",
        "vendor/llama.cpp/CMakeLists.txt",
        "vendor/llama.cpp/tools/server/CMakeLists.txt",
    ):
        assert root + rel in names, rel
    assert not [n for n in names if "/.git/" in n or n.endswith("/.git")]
    pyproject = read_member(made.path, root + "pyproject.toml")
    assert 'build-backend = "scikit_build_core.build"' in pyproject and f'base = "{made.version}"' in pyproject
    assert "@" not in pyproject.split("[build-system]")[1].split("[tool.scikit-build]")[0].replace(">=", "")
    manifest = json.loads(read_member(made.path, root + "src/ggml_bridge_server/manifest.json"))
    assert manifest["upstream"]["commit"] == upstream.commit
    assert [p["name"] for p in manifest["patches"]] == [p.name for p in upstream.patches.series]
    assert manifest["ui"] == {"embedded": False, "reason": "the tree has no tools/ui"}
    # --version of the wheel: upstream's identity and the series, not whatever git repository encloses the build
    build = pin.load(settings.pin_file).build
    assert build is not None and read_member(made.path, root + "build_info.cmake") == (
        f'set(LLAMA_BUILD_NUMBER {build})\nset(LLAMA_BUILD_COMMIT "{upstream.commit[:9]}+bridge-{manifest["series_hash"][:8]}")\n'
    )
    # the vendored tree is the patched one, file for file
    from ggml_bridge.upstream import patch
    from ggml_bridge.upstream.fetch.resolve import obtain

    patched = patch.apply_series(settings, obtain(settings))
    assert manifest["patched_head"] == patched.head
    for rel in ("ggml/CMakeLists.txt", "src/llama.cpp", "tools/server/CMakeLists.txt"):
        assert read_member(made.path, root + "vendor/llama.cpp/" + rel) == (patched.path / rel).read_text(), rel


def test_sdist_is_reproducible(settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = wheel.make_sdist(settings, tmp_path / "a").path.read_bytes()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400.5)  # a day later (tar and gzip stamp the clock)
    b = wheel.make_sdist(settings, tmp_path / "b").path.read_bytes()
    assert a == b


def test_sdist_of_a_tree_with_ui_embeds_the_built_assets(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ggml_bridge.distribution import ui

    dist = tmp_path / "built"
    dist.mkdir()
    (dist / "index.html").write_text("<html>ui</html>")
    sha, n = ui.dist_sha256(dist)
    assets = ui.UiAssets("k" * 64, dist, sha, n, "tools/ui of the tree")
    monkeypatch.setattr(wheel.uimod, "ensure", lambda s, tree: assets)
    made = wheel.make_sdist(settings, tmp_path / "out")
    root = f"ggml_bridge_server-{made.version}/"
    assert read_member(made.path, root + "vendor/llama.cpp/tools/ui/dist/index.html") == "<html>ui</html>"
    assert read_member(made.path, root + "ui.cmake") == "set(GGML_BRIDGE_SERVER_UI ON)\n"
    m = json.loads(read_member(made.path, root + "src/ggml_bridge_server/manifest.json"))
    assert m["ui"]["embedded"] and m["ui"]["sha256"] == sha


def test_wheel_without_scikit_build_core_is_a_toolchain_error(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        wheel.importlib.util, "find_spec", lambda name, *a: None if name == "scikit_build_core" else real(name, *a)
    )
    with pytest.raises(ToolchainError, match="scikit-build-core"):
        wheel.build_wheel(settings, tmp_path / "x.tar.gz", tmp_path)


def tiny_sdist(where: Path, body: str = "int main(void) { return 0; }\n") -> Path:
    """An sdist shaped like ggml-bridge-server's (scikit-build-core, one C program installed into the package):
    the real pip, scikit-build-core, CMake and ninja build it in seconds."""
    root = "ggml_bridge_server-0.1.0"
    files = {
        "pyproject.toml": '[build-system]\nrequires = ["scikit-build-core>=0.10"]\n'
        'build-backend = "scikit_build_core.build"\n[project]\nname = "ggml-bridge-server"\nversion = "0.1.0"\n'
        '[tool.scikit-build]\nwheel.packages = ["src/ggml_bridge_server"]\nwheel.py-api = "py3"\n',
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.21)\nproject(tiny C)\nadd_executable(tiny tiny.c)\n"
        "install(TARGETS tiny DESTINATION ggml_bridge_server/bin)\n",
        "tiny.c": body,
        "src/ggml_bridge_server/__init__.py": "",
    }
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime = len(text.encode()), wheel.MTIME
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_a_build_folder_refuses_a_foreign_folder_and_restarts_for_another_sdist(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a wheel build folder"):
        wheel.prepare_build_dir(foreign, tiny_sdist(tmp_path / "a"))
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]  # nothing touched

    bd = tmp_path / "bd"
    src = wheel.prepare_build_dir(bd, tiny_sdist(tmp_path / "a"))
    assert (src / "pyproject.toml").is_file() and (src / "tiny.c").stat().st_mtime == wheel.MTIME
    (bd / "cmake").mkdir()
    (bd / "cmake" / "object.o").write_text("compiled")
    assert wheel.prepare_build_dir(bd, tiny_sdist(tmp_path / "a")) == src  # the same sdist: both folders kept
    assert (bd / "cmake" / "object.o").is_file()
    other = tiny_sdist(tmp_path / "b", "int main(void) { return 1; }\n")
    assert wheel.prepare_build_dir(bd, other) == src
    assert "return 1" in (src / "tiny.c").read_text()
    assert not (bd / "cmake").exists()  # same mtimes, new sources: old objects must go
    assert sorted(p.name for p in bd.iterdir()) == [wheel.BUILD_DIR_STAMP, "src"]  # no unpack folder left
    # a run stopped while unpacking (stamp written, src not yet there, its unpack folder left): the next redoes it
    shutil.rmtree(src)
    (bd / ".unpack-abc" / "half").mkdir(parents=True)
    assert wheel.prepare_build_dir(bd, other) == src and (src / "tiny.c").is_file()
    assert sorted(p.name for p in bd.iterdir()) == [wheel.BUILD_DIR_STAMP, "src"]
    with pytest.raises(UsageError, match="--build-dir .* is a file"):
        wheel.prepare_build_dir(foreign / "notes.txt", other)


def test_the_libraries_auditwheel_grafted_are_listed_with_their_sizes(tmp_path: Path) -> None:
    whl = tmp_path / "ggml_bridge_server-0.1.0+cu130-py3-none-manylinux_2_38_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ggml_bridge_server/bin/llama-server", b"x" * 10)
        z.writestr("ggml_bridge_server.libs/libnccl-2db3d5f5.so.2.28.3", b"n" * 300)
        z.writestr("ggml_bridge_server.libs/libgomp-135f3c8f.so.1.0.0", b"g" * 20)
    assert wheel.grafted_libraries(whl) == (
        ("libgomp-135f3c8f.so.1.0.0", 20),
        ("libnccl-2db3d5f5.so.2.28.3", 300),
    )


def test_a_wheel_build_with_a_build_folder_continues_instead_of_recompiling(
    settings: config.Settings, tmp_path: Path
) -> None:
    """Real pip, scikit-build-core, CMake and the C compiler on a tiny project (about 2 s): a fast test."""
    sdist, bd, out = tiny_sdist(tmp_path / "sd"), tmp_path / "bd", tmp_path / "out"
    first = wheel.build_wheel(settings, sdist, out, build_dir=bd)
    objs = list((bd / "cmake").rglob("tiny.c.o"))
    assert len(objs) == 1, "scikit-build-core did not build in the build folder"
    built = objs[0].stat().st_mtime_ns
    first.unlink()
    second = wheel.build_wheel(settings, sdist, out, build_dir=bd)
    assert second.is_file() and objs[0].stat().st_mtime_ns == built  # nothing recompiled
    with zipfile.ZipFile(second) as z:
        assert "ggml_bridge_server/bin/tiny" in z.namelist()


# --------------------------------------------------------------------------------------------- version plugin


def _plugin():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(TEMPLATES / "build_support"))
    try:
        return importlib.import_module("ggml_bridge_server_version")
    finally:
        sys.path.pop(0)


def test_version_tag_follows_cmake_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _plugin()
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(nvcc))
    assert plugin.backend_tag("") == "cpu"
    assert plugin.backend_tag("-DGGML_CUDA=OFF") == "cpu"
    assert plugin.backend_tag("-DGGML_NATIVE=OFF -DGGML_CUDA=ON") == "cu130"
    assert plugin.backend_tag("-DGGML_CUDA:BOOL=on") == "cu130"
    assert plugin.backend_tag("-DGGML_CUDA=ON -DGGML_CUDA=OFF") == "cpu", "the last one wins, as in CMake"
    assert plugin.backend_tag("-DGGML_VULKAN=ON") == "vulkan"
    assert plugin.backend_tag("-DGGML_VULKAN:BOOL=1 -DGGML_VULKAN=OFF") == "cpu"
    assert plugin.dependencies("-DGGML_VULKAN=ON") == [], "the Vulkan loader and driver come with the system"
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=1")
    assert plugin.dynamic_metadata("version", {"base": "0.1.0"}) == "0.1.0+cu130"
    monkeypatch.setenv("CUDACXX", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    if not Path("/usr/local/cuda/bin/nvcc").is_file():
        with pytest.raises(RuntimeError, match="no nvcc"):
            plugin.backend_tag("-DGGML_CUDA=ON")


# --------------------------------------------------------------------------------------------- installed package


def fake_install(site: Path, *, backend: str = "cpu", bins: tuple[str, ...] = ("llama-server",)) -> Path:
    """An installed ggml_bridge_server as the wheel lays it out, with the fake llama-server of test_serve."""
    pkg = site / "ggml_bridge_server"
    shutil.copytree(TEMPLATES / "src" / "ggml_bridge_server", pkg)
    (pkg / "manifest.json").write_text(json.dumps({"schema": 1, "ui": {"embedded": False, "reason": "test"}}))
    (pkg / "build.json").write_text(
        json.dumps({"backend": backend, "version": f"0.1.0+{backend}", "cuda_version": "13.0", "libraries": ["llama"]})
    )
    (pkg / "lib").mkdir()
    (pkg / "lib" / "libllama.so").write_bytes(b"\x7fELF")
    fake = write_fake_bin(site / "fake-bin")
    (pkg / "bin").mkdir()
    for name in bins:
        shutil.copy(fake / "llama-server", pkg / "bin" / name)
    return pkg


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "ggml_bridge_server", raising=False)
    yield site
    sys.modules.pop("ggml_bridge_server", None)


def test_package_api_and_a_damaged_install(installed: Path) -> None:
    pkg = fake_install(installed)
    import ggml_bridge_server as gbs

    assert gbs.get_binary_path() == pkg / "bin" / "llama-server"
    assert gbs.get_manifest()["build"]["backend"] == "cpu" and gbs.check_backend() == "cpu"
    # a portable wheel's CPU variant modules sit in bin/: none of them left is a damaged install too
    build = json.loads((pkg / "build.json").read_text())
    (pkg / "build.json").write_text(json.dumps({**build, "modules": ["ggml-cpu-x64"]}))
    with pytest.raises(gbs.MissingFileError, match=r"libggml-cpu-x64\.so missing from .*bin"):
        gbs.get_binary_path()
    (pkg / "bin" / "libggml-cpu-x64.so").write_bytes(b"\x7fELF")
    assert gbs.get_binary_path() == pkg / "bin" / "llama-server"
    # the CPU variants are alternatives (ggml loads the best one present): one left is enough, as on a machine
    # whose packager kept the baseline only; other modules (a GPU backend) are each required
    (pkg / "build.json").write_text(json.dumps({**build, "modules": ["ggml-cpu-x64", "ggml-cpu-haswell"]}))
    assert gbs.get_binary_path() == pkg / "bin" / "llama-server"
    (pkg / "build.json").write_text(json.dumps({**build, "modules": ["ggml-cpu-x64", "ggml-cuda"]}))
    with pytest.raises(gbs.MissingFileError, match=r"libggml-cuda\.so missing from .*bin"):
        gbs.get_binary_path()
    (pkg / "build.json").write_text(json.dumps({**build, "modules": ["ggml-cpu-x64"]}))
    (pkg / "lib" / "libllama.so").unlink()
    with pytest.raises(gbs.MissingFileError, match=r"libllama\.so missing from .*lib"):
        gbs.get_binary_path()
    (pkg / "bin" / "llama-server").unlink()
    with pytest.raises(gbs.MissingFileError, match=r"bin/llama-server is missing"):
        gbs.get_binary_path()


def test_console_script_execs_llama_server_or_says_what_is_missing(installed: Path, tmp_path: Path) -> None:
    pkg = fake_install(installed)
    env = {**os.environ, "PYTHONPATH": str(installed)}
    # --help of the fake is not a thing; a missing model makes it print its banner and serve: just run --version
    (pkg / "bin" / "llama-server").write_text("#!/bin/sh\necho \"exec'd with $*\"\n")
    out = subprocess.run(
        [sys.executable, "-m", "ggml_bridge_server", "--port", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout == "exec'd with --port 1\n", out
    (pkg / "bin" / "llama-server").unlink()
    out = subprocess.run(
        [sys.executable, "-m", "ggml_bridge_server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 32 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "bin/llama-server is missing" in out.stderr, out.stderr


def test_serve_uses_an_installed_wheel_when_nothing_is_built(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_install(installed)
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    port = str(__import__("ggml_bridge.foundations.net", fromlist=["free_port"]).free_port())
    rc = cli.main(["serve", "--check", "--batched", "on", "--", "-m", str(fake_model(tmp_path)), "--port", port])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "using llama-server of the installed ggml-bridge-server 0.1.0+cpu wheel" in err
    assert "check passed" in err


def test_serve_with_a_damaged_wheel_is_one_clear_error(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_install(installed, bins=())
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    rc = cli.main(["serve", "--check", "--", "-m", str(fake_model(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == NotBuiltError.exit_code
    assert len(err) == 1 and "bin/llama-server is missing" in err[0] and "reinstall" in err[0], err


def test_serve_with_a_cuda_wheel_and_no_gpu_is_one_clear_error(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_install(installed, backend="cuda")
    import ggml_bridge_server as gbs

    monkeypatch.setattr(gbs, "cuda_devices", lambda: None)  # what this GPU-less machine reports
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    rc = cli.main(["serve", "--check", "--", "-m", str(fake_model(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == ServeError.exit_code
    assert len(err) == 1 and "built for CUDA 13.0" in err[0] and "no usable GPU" in err[0], err


def test_a_cuda_wheel_without_its_runtime_wheels_is_one_clear_error(
    installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = fake_install(installed, backend="cuda")
    # sonames no system has (this machine has a CUDA runtime but no cuBLAS): only the wheel's folders can help
    build = json.loads((pkg / "build.json").read_text())
    (pkg / "build.json").write_text(
        json.dumps({**build, "cuda_libs": ["libgbtest-cudart.so.13", "libgbtest-cublas.so.13"]})
    )
    import ggml_bridge_server as gbs

    monkeypatch.setattr(gbs, "cuda_devices", lambda: 1)  # a GPU is there; its runtime wheels are not (--no-deps)
    with pytest.raises(
        gbs.BackendUnavailable, match=r"libgbtest-cudart\.so\.13, libgbtest-cublas\.so\.13 cannot be found"
    ):
        gbs.check_backend()
    # what nvidia-cuda-runtime / nvidia-cublas 13 install: site-packages/nvidia/cu13/lib/<soname>
    (installed / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    for so in ("libgbtest-cudart.so.13", "libgbtest-cublas.so.13"):
        (installed / "nvidia" / "cu13" / "lib" / so).write_bytes(b"\x7fELF")
    assert gbs.check_backend() == "cuda"


def test_no_gpu_here_is_detected_as_none() -> None:
    sys.path.insert(0, str(TEMPLATES / "src"))
    try:
        gbs = importlib.import_module("ggml_bridge_server")
        n = gbs.cuda_devices()
    finally:
        sys.path.pop(0)
        sys.modules.pop("ggml_bridge_server", None)
    has_gpu = (
        shutil.which("nvidia-smi")
        and "GPU" in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    )
    assert bool(n) == bool(has_gpu)


# --------------------------------------------------------------------------------------------- portable / CUDA plan


def fake_nvcc(tmp_path: Path, release: str, archs: tuple[int, ...]) -> Path:
    """An nvcc that answers --version and --list-gpu-arch like the real one."""
    nvcc = tmp_path / f"nvcc-{release}"
    listing = "\\n".join(f"compute_{a}" for a in archs)
    nvcc.write_text(
        f"#!/bin/sh\ncase \"$1\" in\n--version) echo 'Cuda compilation tools, release {release}, "
        f"V{release}.88';;\n--list-gpu-arch) printf '{listing}\\n';;\nesac\n"
    )
    nvcc.chmod(0o755)
    return nvcc


CUDA13_ARCHS = (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121)  # nvcc 13.0 --list-gpu-arch
CUDA126_ARCHS = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)  # nvcc 12.6: no Blackwell yet


def test_cuda_architectures_are_the_tables_that_the_toolkit_lists() -> None:
    t = wheel_plan.CUDA_TABLE
    assert (
        wheel_plan.cuda_architectures(t[13], [str(a) for a in CUDA13_ARCHS])
        == "75-real;80-real;86-real;89-real;90-real;100-real;120a-real;120-virtual"
    )
    # CUDA 12.6 lists no 100/120: real code up to Hopper, PTX of the newest kept (90) for what comes after
    assert (
        wheel_plan.cuda_architectures(t[12], [str(a) for a in CUDA126_ARCHS])
        == "61-real;70-real;75-real;80-real;86-real;89-real;90-real;90-virtual"
    )
    with pytest.raises(ToolchainError, match="lists none of the wheel's architectures"):
        wheel_plan.cuda_architectures(t[13], ["50", "52"])


def _settings(tmp_path: Path, **over: str) -> config.Settings:
    return config.load({"cache_dir": str(tmp_path / "c"), **over}, env={}, cwd=REPO_ROOT)


def test_the_default_wheel_plan_is_the_portable_cpu_build(tmp_path: Path) -> None:
    p = wheel_plan.plan(_settings(tmp_path))
    assert p.cmake_args == () and p.runtime is None  # portable: the template's defaults (GGML_NATIVE=OFF, ...)
    p = wheel_plan.plan(_settings(tmp_path), cpu_variants=wheel_plan.CI_CPU_VARIANTS)
    assert p.cmake_args == ("-DGGML_BRIDGE_CPU_VARIANTS=x64;haswell",)
    cml = (TEMPLATES / "CMakeLists.txt").read_text()
    for opt in (
        "gb_default(GGML_NATIVE OFF)",
        "gb_default(GGML_BACKEND_DL ON)",
        "gb_default(GGML_CPU_ALL_VARIANTS ${GGML_BACKEND_DL})",
        "gb_default(GGML_CUDA_NCCL OFF)",  # else the build machine's NCCL is grafted in (265.8 vs 77.8 MB)
    ):
        assert opt in cml


def test_the_cuda_wheel_plan_builds_every_architecture_and_excludes_the_runtime(tmp_path: Path) -> None:
    nvcc = fake_nvcc(tmp_path, "13.0", CUDA13_ARCHS)
    p = wheel_plan.plan(_settings(tmp_path, **{"build.backend": "cuda"}), nvcc=str(nvcc))
    assert p.cmake_args == (
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        "-DCMAKE_CUDA_ARCHITECTURES=75-real;80-real;86-real;89-real;90-real;100-real;120a-real;120-virtual",
    )
    assert p.runtime is not None and p.runtime.libs == ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")
    two = wheel_plan.plan(
        _settings(tmp_path, **{"build.backend": "cuda", "build.cuda_arch": "86-real;90-real;120-virtual"}),
        nvcc=str(nvcc),
    )
    assert two.cmake_args[-1] == "-DCMAKE_CUDA_ARCHITECTURES=86-real;90-real;120-virtual"
    # CMAKE_ARGS of the user: CUDA asked there is CUDA (runtime excluded from repair), their architectures win
    s = _settings(tmp_path)
    s.build.cmake_args = ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89"]
    user = wheel_plan.plan(s, nvcc=str(fake_nvcc(tmp_path, "12.8", CUDA126_ARCHS + (100, 120))))
    assert user.runtime is not None and user.runtime.major == 12
    assert [a for a in user.cmake_args if "ARCHITECTURES" in a] == ["-DCMAKE_CUDA_ARCHITECTURES=89"]
    with pytest.raises(ToolchainError, match="CUDA 11.8 is not a toolkit"):
        wheel_plan.plan(_settings(tmp_path, **{"build.backend": "cuda"}), nvcc=str(fake_nvcc(tmp_path, "11.8", (75,))))


def test_a_cuda_wheel_declares_the_nvidia_runtime_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _plugin()
    monkeypatch.setenv("CUDACXX", str(fake_nvcc(tmp_path, "13.0", CUDA13_ARCHS)))
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=ON")
    assert plugin.dynamic_metadata("dependencies", {}) == ["nvidia-cuda-runtime>=13.0,<14", "nvidia-cublas>=13.0,<14"]
    monkeypatch.setenv("CUDACXX", str(fake_nvcc(tmp_path, "12.8", CUDA126_ARCHS)))
    assert plugin.dependencies() == ["nvidia-cuda-runtime-cu12>=12.8,<13", "nvidia-cublas-cu12>=12.8,<13"]
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    assert plugin.dependencies() == []


def test_the_cuda_backend_rpath_points_into_the_runtime_wheels(tmp_path: Path) -> None:
    script = tmp_path / "t.cmake"
    script.write_text(
        f'include("{TEMPLATES}/build_support/cuda_rpath.cmake")\n'
        'foreach (m 13 12)\n  gb_cuda_rpath(r ${m})\n  message("${m}=${r}")\nendforeach()\n'
        'gb_cuda_libs(l 13)\nmessage("libs=${l}")\ngb_cuda_rpath(r 11)\n'
    )
    out = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True)
    assert "13=;$ORIGIN/../../nvidia/cu13/lib\n" in out.stderr
    assert "12=;$ORIGIN/../../nvidia/cuda_runtime/lib;$ORIGIN/../../nvidia/cublas/lib\n" in out.stderr
    assert "libs=libcudart.so.13;libcublas.so.13;libcublasLt.so.13\n" in out.stderr
    assert out.returncode != 0 and "names no runtime wheels for CUDA 11" in " ".join(out.stderr.split())


# --------------------------------------------------------------------------------------------- repair and index


def tiny_wheel(out: Path, version: str = "0.1.0+cpu", tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel of ggml-bridge-server (metadata only) for the index and repair tests."""
    import base64
    import hashlib
    import zipfile

    out.mkdir(parents=True, exist_ok=True)
    name = f"ggml_bridge_server-{version}-{tag}.whl"
    info = f"ggml_bridge_server-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: ggml-bridge-server\nVersion: {version}\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n",
        "ggml_bridge_server/__init__.py": "",
    }
    record = [
        f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},{len(v)}"
        for k, v in files.items()
    ] + [f"{info}/RECORD,,"]
    with zipfile.ZipFile(out / name, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return out / name


def test_the_index_is_pep503_with_sha256_and_pip_installs_from_it(tmp_path: Path) -> None:
    from ggml_bridge.foundations import cache

    cpu = tiny_wheel(tmp_path / "a")
    page = wheel.write_index(tmp_path / "idx", [cpu])
    assert page == tmp_path / "idx" / "simple" / "ggml-bridge-server" / "index.html"
    assert f'href="{cpu.name}#sha256={cache.file_sha256(cpu)}"' in page.read_text()
    assert 'href="ggml-bridge-server/"' in (tmp_path / "idx" / "simple" / "index.html").read_text()
    # a second run adds to the index (CPU and CUDA wheels of separate builds)
    cuda = tiny_wheel(tmp_path / "b", "0.1.0+cu130")
    wheel.write_index(tmp_path / "idx", [cuda])
    assert cpu.name in page.read_text() and cuda.name in page.read_text()
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--index-url",
            f"file://{tmp_path / 'idx' / 'simple'}",
            "ggml-bridge-server==0.1.0+cpu",
            "-d",
            str(tmp_path / "got"),
        ],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == [cpu.name]
    # a file whose bytes no longer match its sha256 fragment is refused by pip
    cpu_in_index = page.parent / cpu.name
    cpu_in_index.write_bytes(cpu_in_index.read_bytes() + b"x")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-cache-dir",
            "--index-url",
            f"file://{tmp_path / 'idx' / 'simple'}",
            "ggml-bridge-server==0.1.0+cpu",
            "-d",
            str(tmp_path / "got2"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "hash" in bad.stderr.lower(), bad.stderr


def test_repair_of_a_wheel_auditwheel_refuses_is_one_build_error(tmp_path: Path) -> None:
    pytest.importorskip("auditwheel")
    with pytest.raises(BuildError, match="auditwheel could not repair the server wheel"):
        wheel.repair_wheel(tiny_wheel(tmp_path / "in", tag="py3-none-linux_x86_64"), tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.whl"))


def test_wheel_from_a_missing_sdist_is_one_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ggml_bridge.foundations.errors import UsageError

    rc = cli.main(
        [
            "--cache-dir",
            str(tmp_path / "c"),
            "wheel",
            "--sdist",
            str(tmp_path / "nope.tar.gz"),
            "--out",
            str(tmp_path / "dist"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == UsageError.exit_code and len(err) == 1 and "nope.tar.gz: no such file" in err[0], err
    assert not (tmp_path / "dist").exists()


def test_a_cuda_vulkan_wheel_is_refused_not_built_as_cpu(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cuda-vulkan is a build backend only"):
        wheel_plan.plan(_settings(tmp_path, **{"build.backend": "cuda-vulkan"}))


def test_the_vulkan_wheel_plan_passes_the_vulkan_pieces_and_the_tag_check_knows_vulkan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ggml_bridge.distribution.builder import toolchain

    usr = fake_vulkan_root(tmp_path / "usr")
    monkeypatch.setattr(
        wheel_plan, "detect_vulkan", lambda: toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    )
    p = wheel_plan.plan(_settings(tmp_path, **{"build.backend": "vulkan"}), cpu_variants=wheel_plan.CI_CPU_VARIANTS)
    assert p.runtime is None
    assert p.cmake_args[:3] == (
        "-DGGML_BRIDGE_CPU_VARIANTS=x64;haswell",
        "-DGGML_VULKAN=ON",
        f"-DVulkan_INCLUDE_DIR={usr / 'include'}",
    )
    assert _plugin().backend_tag(" ".join(p.cmake_args)) == "vulkan"
    cml = (TEMPLATES / "CMakeLists.txt").read_text()
    assert "elseif (GGML_VULKAN)\n    set(backend vulkan)\n    set(tag vulkan)" in cml
    assert wheel.VULKAN_LOADER == "libvulkan.so.1"
    empty = tmp_path / "none"
    empty.mkdir()
    monkeypatch.setattr(
        wheel_plan, "detect_vulkan", lambda: toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(empty,))
    )
    with pytest.raises(ToolchainError, match="Debian packages: libvulkan-dev, libvulkan1, glslc, spirv-headers"):
        wheel_plan.plan(_settings(tmp_path, **{"build.backend": "vulkan"}))
