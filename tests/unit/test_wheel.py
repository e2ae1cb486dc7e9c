"""The ggml-bridge-server distribution: sdist contents, the version plugin, the installed package's API and errors,
serve's use of an installed wheel (real wheels in a fresh venv: tests/integration/test_wheel.py)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from ggml_bridge import cli, config, wheel
from ggml_bridge.errors import NotBuiltError, ServeError, ToolchainError

from helpers import fake_model, write_fake_bin

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "ggml_bridge" / "server_dist"


def sdist_members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def read_member(path: Path, name: str) -> str:
    with tarfile.open(path) as tar:
        fh = tar.extractfile(name)
        assert fh is not None
        return fh.read().decode()


# --------------------------------------------------------------------------------------------- sdist


def test_sdist_carries_the_patched_tree_templates_and_manifest(settings: config.Settings, upstream,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    made = wheel.make_sdist(settings, tmp_path / "out")
    assert made.path.name == f"ggml_bridge_server-{made.version}.tar.gz"
    names = sdist_members(made.path)
    root = f"ggml_bridge_server-{made.version}/"
    for rel in ("pyproject.toml", "CMakeLists.txt", "ui.cmake", "PKG-INFO",
                "build_support/ggml_bridge_server_version.py", "src/ggml_bridge_server/__init__.py",
                "src/ggml_bridge_server/__main__.py", "src/ggml_bridge_server/manifest.json",
                "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/tools/server/CMakeLists.txt"):
        assert root + rel in names, rel
    assert not [n for n in names if "/.git/" in n or n.endswith("/.git")]
    pyproject = read_member(made.path, root + "pyproject.toml")
    assert 'build-backend = "scikit_build_core.build"' in pyproject and f'base = "{made.version}"' in pyproject
    assert "@" not in pyproject.split("[build-system]")[1].split("[tool.scikit-build]")[0].replace(">=", "")
    manifest = json.loads(read_member(made.path, root + "src/ggml_bridge_server/manifest.json"))
    assert manifest["upstream"]["commit"] == upstream.commit
    assert [p["name"] for p in manifest["patches"]] == [p.name for p in upstream.patches.series]
    assert manifest["ui"] == {"embedded": False, "reason": "the tree has no tools/ui"}
    # the vendored tree is the patched one, file for file
    from ggml_bridge import fetch, patch

    patched = patch.apply_series(settings, fetch.obtain(settings))
    assert manifest["patched_head"] == patched.head
    for rel in ("ggml/CMakeLists.txt", "src/llama.cpp", "tools/server/CMakeLists.txt"):
        assert read_member(made.path, root + "vendor/llama.cpp/" + rel) == (patched.path / rel).read_text(), rel


def test_sdist_is_reproducible(settings: config.Settings, tmp_path: Path) -> None:
    a = wheel.make_sdist(settings, tmp_path / "a").path.read_bytes()
    time.sleep(1.1)
    b = wheel.make_sdist(settings, tmp_path / "b").path.read_bytes()
    assert a == b


def test_sdist_of_a_tree_with_ui_embeds_the_built_assets(settings: config.Settings, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from ggml_bridge import ui

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


def test_wheel_without_scikit_build_core_is_a_toolchain_error(settings: config.Settings, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(wheel.importlib.util, "find_spec",
                        lambda name, *a: None if name == "scikit_build_core" else real(name, *a))
    with pytest.raises(ToolchainError, match="scikit-build-core"):
        wheel.build_wheel(settings, tmp_path / "x.tar.gz", tmp_path)


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
    (pkg / "build.json").write_text(json.dumps({"backend": backend, "version": f"0.1.0+{backend}",
                                                "cuda_version": "13.0", "libraries": ["llama"]}))
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
    out = subprocess.run([sys.executable, "-m", "ggml_bridge_server", "--port", "1"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "exec'd with --port 1\n", out
    (pkg / "bin" / "llama-server").unlink()
    out = subprocess.run([sys.executable, "-m", "ggml_bridge_server"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 32 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "bin/llama-server is missing" in out.stderr, out.stderr


def test_serve_uses_an_installed_wheel_when_nothing_is_built(installed: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake_install(installed)
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    port = str(__import__("ggml_bridge.serve", fromlist=["free_port"]).free_port())
    rc = cli.main(["serve", "--check", "--batched", "on", "--", "-m", str(fake_model(tmp_path)), "--port", port])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "using llama-server of the installed ggml-bridge-server 0.1.0+cpu wheel" in err
    assert "check passed" in err


def test_serve_with_a_damaged_wheel_is_one_clear_error(installed: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fake_install(installed, bins=())
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    rc = cli.main(["serve", "--check", "--", "-m", str(fake_model(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == NotBuiltError.exit_code
    assert len(err) == 1 and "bin/llama-server is missing" in err[0] and "reinstall" in err[0], err


def test_serve_with_a_cuda_wheel_and_no_gpu_is_one_clear_error(installed: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    fake_install(installed, backend="cuda")
    import ggml_bridge_server as gbs

    monkeypatch.setattr(gbs, "cuda_devices", lambda: None)  # what this GPU-less machine reports
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    rc = cli.main(["serve", "--check", "--", "-m", str(fake_model(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == ServeError.exit_code
    assert len(err) == 1 and "built for CUDA 13.0" in err[0] and "no usable GPU" in err[0], err


def test_no_gpu_here_is_detected_as_none() -> None:
    sys.path.insert(0, str(TEMPLATES / "src"))
    try:
        gbs = importlib.import_module("ggml_bridge_server")
        n = gbs.cuda_devices()
    finally:
        sys.path.pop(0)
        sys.modules.pop("ggml_bridge_server", None)
    has_gpu = shutil.which("nvidia-smi") and "GPU" in subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                                    text=True).stdout
    assert bool(n) == bool(has_gpu)
