"""Build tests on the fake llama.cpp: real CMake + Ninja + cc, a few seconds each."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ggml_bridge.distribution.builder import locate, plan, shared, single, steps, toolchain
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import BuildError, NotBuiltError, ToolchainError, UsageError
from ggml_bridge.runtime import modes
from ggml_bridge.upstream import patch as patchmod

from conftest import FakeUpstream
from helpers import VK_CORE_OLD, fake_vulkan_root


def _run(binary: Path) -> str:
    return subprocess.run([binary], check=True, capture_output=True, text=True).stdout


def test_patched_build_end_to_end(settings: config.Settings, upstream: FakeUpstream) -> None:
    res = single.ensure(settings)
    assert not res.up_to_date and res.variant == "patched" and res.backend == "cpu"
    assert set(res.binaries) == {"llama-server", "llama-bench"}, "llama-perplexity is not defined by the fixture"
    assert _run(res.server) == "fake llama-server bridge=1\n", "the variant's CMake option reached the compile"
    m = json.loads(res.manifest_path.read_text())
    assert m["upstream"]["commit"] == upstream.commit and m["upstream"]["pinned"]
    assert [p["name"] for p in m["patches"]] == [p.name for p in upstream.patches.series]
    assert all(len(p["sha256"]) == 64 for p in m["patches"]) and len(m["series_hash"]) == 64
    assert "-DGGML_CUDA_MAPPED_HOST_BRIDGE=ON" in m["cmake_args"] and "-DSAM3D_BATCHED_TRANSFERS=ON" in m["cmake_args"]
    for opt in ("LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_OPENSSL"):
        assert f"-D{opt}=OFF" in m["cmake_args"]
    assert "-DLLAMA_CURL=OFF" not in m["cmake_args"], "only options the tree knows are passed"
    assert "-DGGML_NATIVE=ON" in m["cmake_args"] and "-DCMAKE_BUILD_TYPE=Release" in m["cmake_args"]
    assert set(m["toolchain"]) == {"cc", "cxx", "cmake", "ninja"}
    assert m["binaries"]["llama-server"]["sha256"] and m["timestamp"].endswith("Z")
    assert (res.build_dir / "build.log").read_text().count("Linking") >= 2
    assert locate.find_binary(settings, "llama-server", variant="patched", backend="cpu") == res.server
    assert locate.find_binary(settings, "llama-bench") == res.binaries["llama-bench"]
    # the patched sources are the work tree, in the cache
    assert Path(m["source_dir"]).parent.parent == settings.layout.work


def test_unchanged_rebuild_configures_and_compiles_nothing(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = single.ensure(settings)
    monkeypatch.setattr(steps, "configure", lambda *a: pytest.fail("configured again"))
    monkeypatch.setattr(steps, "compile_targets", lambda *a: pytest.fail("compiled again"))
    again = single.ensure(settings)
    assert again.up_to_date and again.binaries == first.binaries


def test_concurrent_builds_of_one_key_build_once(settings: config.Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    calls: list[int] = []
    real_cmake = steps.configure

    def slow_cmake(*a):  # type: ignore[no-untyped-def]
        calls.append(threading.get_ident())
        time.sleep(1)
        return real_cmake(*a)

    monkeypatch.setattr(steps, "configure", slow_cmake)
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda _: single.ensure(settings), range(2)))
    assert len(calls) == 1
    assert sorted(r.up_to_date for r in results) == [False, True]
    assert results[0].server == results[1].server


def test_changed_options_get_their_own_build_dir(make_settings) -> None:  # type: ignore[no-untyped-def]
    a = single.ensure(make_settings())
    b = single.ensure(make_settings(build__native=False))
    assert a.build_dir != b.build_dir
    assert "-DGGML_NATIVE=OFF" in json.loads(b.manifest_path.read_text())["cmake_args"]


def test_upstream_variant_has_no_patches(settings: config.Settings) -> None:
    res = single.ensure(settings, "upstream")
    assert _run(res.server) == "fake llama-server bridge=0\n"
    m = json.loads(res.manifest_path.read_text())
    assert m["patches"] == [] and m["series_hash"] is None
    assert "/trees/" in m["source_dir"]
    assert locate.find_binary(settings, "llama-server", variant="upstream") == res.server
    assert locate.find_binary(settings, "llama-server", variant="upstream") != single.ensure(settings).server


def test_explicit_series_without_touching_latest(
    settings: config.Settings, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """What rebase needs: build another series without changing what find_binary returns."""
    import shutil

    main = single.ensure(settings)
    other_dir = tmp_path / "other-series"
    other_dir.mkdir()
    shutil.copy(upstream.patches.series[0], other_dir)
    res = single.ensure(settings, series=patchmod.read_series(other_dir), record_latest=False)
    assert res.build_dir != main.build_dir
    assert [p["name"] for p in json.loads(res.manifest_path.read_text())["patches"]] == [
        upstream.patches.series[0].name
    ]
    assert locate.find_binary(settings, "llama-server") == main.server


def test_upstream_nopeer_needs_cuda(settings: config.Settings) -> None:
    with pytest.raises(UsageError, match="CUDA"):
        single.ensure(settings, "upstream-nopeer")


def test_extra_cmake_args_from_env_reach_cmake(make_settings, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    s = make_settings()
    s2 = config.load(
        {
            "cache_dir": str(s.cache_dir),
            "project_dir": str(s.project_dir),
            "build.backend": "cpu",
            "fetch.pypi_url": s.fetch.pypi_url,
        },
        env={"CMAKE_ARGS": "-DFIXTURE_EXTRA='a b'"},
    )
    res = single.ensure(s2)
    m = json.loads(res.manifest_path.read_text())
    assert m["cmake_args"][-1] == "-DFIXTURE_EXTRA=a b"
    cache = (res.build_dir / "CMakeCache.txt").read_text()
    assert "FIXTURE_EXTRA:UNINITIALIZED=a b" in cache


def test_compile_error_shows_log_path_and_error_lines(
    settings: config.Settings, upstream: FakeUpstream, tmp_path: Path
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(upstream.repo, broken, ignore=shutil.ignore_patterns(".git"))
    (broken / "tools" / "server" / "server.c").write_text("int main(void) { return nonsense_symbol; }\n")
    with pytest.raises(BuildError) as e:
        single.ensure(settings, "upstream", source_spec=str(broken), allow_unpinned=True)
    msg = str(e.value)
    assert "compile failed" in msg and "build.log" in msg and "nonsense_symbol" in msg
    assert e.value.exit_code == 31
    assert not list(settings.cache_dir.glob("builds/*/" + steps.COMPLETE_MARKER))
    with pytest.raises(NotBuiltError):
        locate.find_binary(settings, "llama-server", variant="upstream", backend="cpu")


def test_configure_error(settings: config.Settings, upstream: FakeUpstream, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(upstream.repo, broken, ignore=shutil.ignore_patterns(".git"))
    with open(broken / "CMakeLists.txt", "a") as fh:
        fh.write("message(FATAL_ERROR \"fixture says no\")\n")
    with pytest.raises(BuildError, match="(?s)CMake configure failed.*CMake Error.*fixture says no"):
        single.ensure(settings, "upstream", source_spec=str(broken), allow_unpinned=True)


def test_tree_without_server_target(settings: config.Settings, upstream: FakeUpstream, tmp_path: Path) -> None:
    import shutil

    t = tmp_path / "noserver"
    shutil.copytree(upstream.repo, t, ignore=shutil.ignore_patterns(".git"))
    (t / "tools" / "server" / "CMakeLists.txt").write_text("# nothing\n")
    with pytest.raises(BuildError, match="no llama-server target"):
        single.ensure(settings, "upstream", source_spec=str(t), allow_unpinned=True)


def test_missing_compiler(settings: config.Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(ToolchainError, match="CC=/nonexistent/cc") as e:
        single.ensure(settings)
    assert e.value.exit_code == 30


def test_no_compiler_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    with pytest.raises(ToolchainError, match="no C compiler found"):
        toolchain._compiler("CC", ("cc", "gcc"))


def test_find_binary_before_any_build(settings: config.Settings) -> None:
    with pytest.raises(NotBuiltError, match="ggml-bridge build") as e:
        locate.find_binary(settings, "llama-server", backend="cpu")
    assert e.value.exit_code == 32


def test_find_binary_of_a_target_not_built(settings: config.Settings) -> None:
    single.ensure(settings)
    with pytest.raises(NotBuiltError, match="no llama-perplexity"):
        locate.find_binary(settings, "llama-perplexity")


def test_progress_logs_every_ten_percent(capsys: pytest.CaptureFixture[str]) -> None:
    p = steps.Progress(clock=lambda: 0.0)
    for i in range(1, 201):
        p(f"[{i}/200] Building CXX object x{i}.o")
    p("FAILED: not a progress line")
    lines = [line for line in capsys.readouterr().err.splitlines() if "%]" in line]
    assert [line.split("]")[0].strip("[ ") for line in lines] == [f"{n}%" for n in range(10, 101, 10)]


def test_progress_ignores_a_nested_builds_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """ggml-vulkan builds its shader generator as an ExternalProject whose own ninja prints "[1/2]", "[2/2]" among
    the outer build's lines: they are not the build's progress (they logged "[ 50%] 1/2", "[100%] 2/2")."""
    p = steps.Progress(clock=lambda: 0.0)
    p("[1/900] Creating directories for 'vulkan-shaders-gen'")
    p("[1/2] Building CXX object CMakeFiles/vulkan-shaders-gen.dir/vulkan-shaders-gen.cpp.o")
    p("[2/2] Linking CXX executable vulkan-shaders-gen")
    p("[90/900] Building CXX object x.o")
    lines = [line for line in capsys.readouterr().err.splitlines() if "%]" in line]
    assert lines == ["    [ 10%] 90/900 (0s)"], lines


def _fake_cuda(tmp_path: Path, with_cublas: bool) -> Path:
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    (root / "include").mkdir()
    if with_cublas:
        (root / "include" / "cublas_v2.h").write_text("")
    return root


def test_auto_backend_needs_nvcc_and_cublas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"):
        monkeypatch.delenv(var, raising=False)
    root = _fake_cuda(tmp_path, with_cublas=False)
    monkeypatch.setenv("CUDACXX", str(root / "bin" / "nvcc"))
    assert toolchain.resolve_backend("auto")[0] == "cpu"
    with pytest.raises(ToolchainError, match="cuBLAS"):
        toolchain.resolve_backend("cuda")
    (root / "include" / "cublas_v2.h").write_text("")
    backend, cuda = toolchain.resolve_backend("auto")
    assert backend == "cuda" and cuda is not None and cuda.version == "12.4"
    assert cuda.cublas_header == root / "include" / "cublas_v2.h"


def test_cuda_requested_without_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    assert toolchain.resolve_backend("auto") == ("cpu", None)
    with pytest.raises(ToolchainError, match="nvcc was not found"):
        toolchain.resolve_backend("cuda")


def test_nvcc_wrapper_script_is_resolved(tmp_path: Path) -> None:
    root = _fake_cuda(tmp_path, with_cublas=True)
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {root}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    assert toolchain._real_nvcc(wrapper) == (root / "bin" / "nvcc").resolve()


def _tools_and_tree(
    tmp_path: Path,
    cuda: toolchain.CudaToolkit | None = None,
    vulkan: toolchain.VulkanKit | None = None,
) -> tuple[toolchain.Toolchain, Path]:
    """A fixed toolchain (with the given CUDA toolkit and Vulkan pieces) and a source tree whose CMakeLists defines
    one option: what cmake_args() reads."""
    tools = toolchain.Toolchain(
        toolchain.Tool(Path("cmake"), "3.25"),
        toolchain.Tool(Path("ninja"), "1.11"),
        toolchain.Tool(Path("/usr/bin/cc"), "gcc"),
        toolchain.Tool(Path("/usr/bin/c++"), "g++"),
        cuda,
        vulkan,
    )
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("option(LLAMA_CURL x OFF)\n")
    return tools, src


def test_cuda_options(settings: config.Settings, tmp_path: Path) -> None:
    root = _fake_cuda(tmp_path, with_cublas=True)
    cuda = toolchain.CudaToolkit(root / "bin" / "nvcc", root, "12.4", root / "include" / "cublas_v2.h")
    tools, src = _tools_and_tree(tmp_path, cuda=cuda)
    settings.build.cuda_arch = "90"
    args = plan.cmake_args(settings, src, modes.VARIANTS["upstream-nopeer"], "cuda", tools)
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args
    assert f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}" in args
    assert "-DGGML_CUDA_NO_PEER_COPY=ON" in args and "-DLLAMA_CURL=OFF" in args
    assert "-DLLAMA_BUILD_TESTS=OFF" not in args


def test_old_system_cmake_falls_back_to_pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "cmake"
    old.write_text("#!/bin/sh\necho 'cmake version 3.16.3'\n")
    old.chmod(0o755)
    new_dir = tmp_path / "pypi"
    new_dir.mkdir()
    new = new_dir / "cmake"
    new.write_text("#!/bin/sh\necho 'cmake version 3.31.6'\n")
    new.chmod(0o755)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: str(old))
    monkeypatch.setattr(toolchain, "_pypi_bin", lambda module, attr: new)
    assert toolchain.find_cmake() == toolchain.Tool(new, "3.31.6")
    monkeypatch.setattr(toolchain, "_pypi_bin", lambda module, attr: None)
    with pytest.raises(ToolchainError, match="3.16.3"):
        toolchain.find_cmake()


def test_real_toolchain_is_usable() -> None:
    cmake = toolchain.find_cmake()
    assert toolchain._vtuple(cmake.version) >= toolchain.MIN_CMAKE
    assert os.access(toolchain.find_ninja().path, os.X_OK)


def test_shared_tree_builds_each_variant_once_with_its_own_options(
    settings: config.Settings, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = shared.ensure_shared(settings, ["patched", "upstream"])
    assert [r.variant for r in results] == ["upstream", "patched"], "upstream sources first, the series on top"
    up, pa = results
    assert up.build_dir.parent == pa.build_dir.parent and up.bin_dir != pa.bin_dir
    # each variant's binary keeps its own options, also after the next variant rebuilt the tree
    assert _run(up.server) == "fake llama-server bridge=0\n"
    assert _run(pa.server) == "fake llama-server bridge=1\n"
    mu, mp = (json.loads(r.manifest_path.read_text()) for r in results)
    assert "-DGGML_CUDA_MAPPED_HOST_BRIDGE=ON" in mp["cmake_args"]
    assert not any("MAPPED_HOST_BRIDGE" in a for a in mu["cmake_args"])
    assert "-DBUILD_SHARED_LIBS=OFF" in mu["cmake_args"] and mu["patches"] == [] and len(mp["patches"]) == 2
    assert mu["shared_tree"]["order"] == ["upstream", "patched"] and "series" in mp["shared_tree"]["made"]
    assert mp["binaries"]["llama-server"]["sha256"] != mu["binaries"]["llama-server"]["sha256"]
    # the series' files are in the shared sources, and the upstream variant was built before they were
    shared_src = up.build_dir.parent / "src"
    assert (shared_src / "src" / "extra.c").is_file() and "= 2;" in (shared_src / "src" / "llama.cpp").read_text()
    # the usual pointers: find_binary, the ladder and the bench see these builds
    assert locate.find_binary(settings, "llama-server", variant="upstream", backend="cpu") == up.server
    assert locate.find_binary(settings, "llama-server", variant="patched", backend="cpu") == pa.server
    # unchanged: nothing is configured or compiled again
    monkeypatch.setattr(steps, "configure", lambda *a: pytest.fail("configured again"))
    monkeypatch.setattr(steps, "compile_targets", lambda *a: pytest.fail("compiled again"))
    again = shared.ensure_shared(settings, ["upstream", "patched"])
    assert all(r.up_to_date for r in again) and [r.server for r in again] == [up.server, pa.server]


def test_shared_tree_resumed_after_an_interrupted_run_compiles_the_series_files_again_for_upstream(
    settings: config.Settings, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # found on the GPU (2026-12-02): a run cut during the patched variant left objects of the series' sources in
    # the build folder; the next run copied the pristine tree back with its old file times, so ninja took those
    # objects as up to date and linked them into the "upstream" binaries
    up, _ = shared.ensure_shared(settings, ["upstream", "patched"])
    root = up.build_dir.parent
    for v in ("upstream", "patched"):  # what a stopped run leaves: no variant complete
        (root / v / steps.COMPLETE_MARKER).unlink()
    patched_objects_at = time.time()
    seen: list[float] = []
    real = steps.compile_targets

    def spy(tools, build_dir, targets, jobs, log_file, env):  # type: ignore[no-untyped-def]
        seen.append((build_dir.parent / "src" / "src" / "llama.cpp").stat().st_mtime)  # a file the series changes
        return real(tools, build_dir, targets, jobs, log_file, env)

    monkeypatch.setattr(steps, "compile_targets", spy)
    shared.ensure_shared(settings, ["upstream", "patched"])
    assert len(seen) == 2, "upstream, then patched"
    assert seen[0] >= patched_objects_at, "upstream's version must be newer than the objects built from the series'"


def test_shared_tree_refuses_nopeer_without_cuda_and_unknown_variants(settings: config.Settings) -> None:
    with pytest.raises(UsageError, match="only exists for the CUDA backend"):
        shared.ensure_shared(settings, ["upstream", "upstream-nopeer"])
    with pytest.raises(UsageError, match="unknown variant"):
        shared.ensure_shared(settings, ["upstream", "pached"])


def test_locate_override_build_pointer_and_installed_wheel(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """builder.locate.locate is the one binary locator of ladder, bench, serve and rpc: --bin-dir first, then the
    latest build, then (serve only: installed=True) an installed ggml-bridge-server wheel."""
    import sys
    import types

    d = tmp_path / "bins"
    d.mkdir()
    (d / "llama-bench").write_text("")
    assert locate.locate(settings, "upstream", "llama-bench", d) == d / "llama-bench"
    with pytest.raises(NotBuiltError, match=f"llama-server not found in {d}"):
        locate.locate(settings, "upstream", "llama-server", d)
    with pytest.raises(NotBuiltError, match="no patched/cpu build"):
        locate.locate(settings, "patched", "llama-server", backend="cpu")
    # an installed wheel: used only when asked for, and only for the patched variant
    wheel_bin = tmp_path / "wheel-llama-server"
    wheel_bin.write_text("")
    fake = types.SimpleNamespace(
        check_backend=lambda: "cpu",
        get_binary_path=lambda name: wheel_bin,
        get_manifest=lambda: {"build": {"version": "0+cpu"}},
        MissingFileError=LookupError,
        BackendUnavailable=RuntimeError,
    )
    monkeypatch.setitem(sys.modules, "ggml_bridge_server", fake)
    with pytest.raises(NotBuiltError):
        locate.locate(settings, "patched", "llama-server", backend="cpu")
    with pytest.raises(NotBuiltError):
        locate.locate(settings, "upstream", "llama-server", backend="cpu", installed=True)
    assert locate.locate(settings, "patched", "llama-server", backend="cpu", installed=True) == wheel_bin
    # a build wins over the wheel
    built = tmp_path / "built-llama-server"
    built.write_text("")
    steps.latest_path(settings, "patched", "cpu").parent.mkdir(parents=True, exist_ok=True)
    steps.latest_path(settings, "patched", "cpu").write_text(json.dumps({"binaries": {"llama-server": str(built)}}))
    assert locate.locate(settings, "patched", "llama-server", backend="cpu", installed=True) == built


def test_a_patched_variant_is_decided_by_the_table_not_its_name(
    settings: config.Settings, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second patched variant in modes.VARIANTS is built with the series applied (the build once compared the
    name with "patched") and with its own CMake options."""
    from ggml_bridge.runtime import modes

    monkeypatch.setitem(
        modes.VARIANTS,
        "patched-debug",
        modes.Variant(
            "patched-debug",
            True,
            {**modes.VARIANTS["patched"].cmake, "CMAKE_BUILD_TYPE": "Debug"},
            "patched-debug",
            "the series, a debug build",
        ),
    )
    res = single.ensure(settings, "patched-debug")
    m = json.loads(res.manifest_path.read_text())
    assert [p["name"] for p in m["patches"]] == [p.name for p in upstream.patches.series]
    assert _run(res.server) == "fake llama-server bridge=1\n" and "-DCMAKE_BUILD_TYPE=Debug" in m["cmake_args"]


def test_shared_tree_refuses_a_variant_it_cannot_build(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant the shared tree has no recipe for is an error naming it (it was silently left out)."""
    from ggml_bridge.runtime import modes

    monkeypatch.setitem(
        modes.VARIANTS,
        "upstream-lto",
        modes.Variant("upstream-lto", False, {"GGML_LTO": "ON"}, "lto", "no patches, link-time optimisation"),
    )
    with pytest.raises(UsageError, match="upstream-lto cannot be built in a shared tree"):
        shared.ensure_shared(settings, ["upstream", "upstream-lto"])


# --------------------------------------------------------------------------------------------- Vulkan backend


def test_vulkan_is_a_backend_auto_never_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "detect_cuda", lambda: None)
    assert toolchain.resolve_backend("vulkan") == ("vulkan", None)
    assert toolchain.resolve_backend("auto") == ("cpu", None)
    with pytest.raises(UsageError, match="auto, cpu, cuda, vulkan, cuda-vulkan"):
        toolchain.resolve_backend("metal")
    assert "vulkan" in config.BACKEND_CHOICES


def test_vulkan_pieces_found_in_the_system(tmp_path: Path) -> None:
    usr = fake_vulkan_root(tmp_path / "usr")
    kit = toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    assert kit.include_dir == usr / "include" and kit.header_version == "1.4.309"
    assert kit.library == usr / "lib/x86_64-linux-gnu/libvulkan.so.1", "no dev link: the loader itself"
    assert kit.glslc == usr / "bin" / "glslc"
    assert kit.cmake_args() == {
        "GGML_VULKAN": "ON",
        "Vulkan_INCLUDE_DIR": str(usr / "include"),
        "Vulkan_LIBRARY": str(usr / "lib/x86_64-linux-gnu/libvulkan.so.1"),
        "Vulkan_GLSLC_EXECUTABLE": str(usr / "bin" / "glslc"),
        "SPIRV-Headers_DIR": str(usr / "share/cmake/SPIRV-Headers"),
    }


def test_vulkan_sdk_headers_win_over_the_systems_old_ones(tmp_path: Path) -> None:
    """CI's case: bookworm's loader, glslc and SPIRV-Headers, trixie's headers unpacked under $VULKAN_SDK (whose
    libvulkan.so is a dangling link to a libvulkan.so.1 the .deb does not carry)."""
    usr = fake_vulkan_root(tmp_path / "usr", headers=VK_CORE_OLD)
    sdk = fake_vulkan_root(tmp_path / "deb" / "usr", loader=None, glslc=False, spirv=False)
    (sdk / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    (sdk / "lib" / "x86_64-linux-gnu" / "libvulkan.so").symlink_to("libvulkan.so.1")
    kit = toolchain.detect_vulkan(env={"VULKAN_SDK": str(sdk), "PATH": ""}, system_roots=(usr,))
    assert kit.include_dir == sdk / "include" and kit.header_version == "1.4.309"
    assert kit.library == usr / "lib/x86_64-linux-gnu/libvulkan.so.1"
    assert kit.glslc == usr / "bin" / "glslc" and kit.spirv_headers_dir == usr / "share/cmake/SPIRV-Headers"


def test_vulkan_headers_too_old_name_what_to_do(tmp_path: Path) -> None:
    usr = fake_vulkan_root(tmp_path / "usr", headers=VK_CORE_OLD)
    with pytest.raises(ToolchainError) as e:
        toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    msg = str(e.value)
    assert e.value.exit_code == 30 and "\n" not in msg
    assert "(1.3.239) are too old" in msg and "VkLayerSettingEXT" in msg
    assert "libvulkan-dev_1.4.309.0-1_amd64.deb" in msg and "VULKAN_SDK" in msg


@pytest.mark.parametrize(
    ("missing", "package"),
    [("headers", "libvulkan-dev"), ("loader", "libvulkan1"), ("glslc", "glslc"), ("spirv", "spirv-headers")],
)
def test_each_missing_vulkan_piece_names_its_debian_package(tmp_path: Path, missing: str, package: str) -> None:
    kw: dict[str, object] = (
        {"headers": None} if missing == "headers" else {"loader": None} if missing == "loader" else {missing: False}
    )
    usr = fake_vulkan_root(tmp_path / "usr", **kw)  # type: ignore[arg-type]
    with pytest.raises(ToolchainError) as e:
        toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    msg = str(e.value)
    assert e.value.exit_code == 30 and "\n" not in msg
    assert f"Debian packages: {package}." in msg and "apt-get install libvulkan1 libvulkan-dev glslc" in msg


def test_vulkan_build_fails_before_fetching_without_the_pieces(
    make_settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """`build --backend vulkan` (plain and --shared-tree) on a machine without Vulkan: the toolchain error before
    anything is fetched."""
    empty = tmp_path / "nothing"
    empty.mkdir()
    real = toolchain.detect_vulkan
    monkeypatch.setattr(toolchain, "detect_vulkan", lambda: real(env={"PATH": ""}, system_roots=(empty,)))
    settings = make_settings(build__backend="vulkan")
    for attempt in (lambda: single.ensure(settings, "patched"), lambda: shared.ensure_shared(settings, ["upstream"])):
        with pytest.raises(ToolchainError, match="headers, loader, glslc, SPIRV-Headers are missing") as e:
            attempt()
        assert e.value.exit_code == 30
    assert not settings.layout.trees.exists(), "fetched before checking the toolchain"


def test_vulkan_cmake_options_and_build_key(settings: config.Settings, tmp_path: Path) -> None:
    usr = fake_vulkan_root(tmp_path / "usr")
    kit = toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    tools, src = _tools_and_tree(tmp_path, vulkan=kit)
    args = plan.cmake_args(settings, src, modes.VARIANTS["patched"], "vulkan", tools)
    assert "-DGGML_VULKAN=ON" in args and "-DGGML_CUDA=OFF" in args
    assert f"-DVulkan_INCLUDE_DIR={usr / 'include'}" in args and "-DSAM3D_BATCHED_TRANSFERS=ON" in args
    cpu_args = plan.cmake_args(settings, src, modes.VARIANTS["patched"], "cpu", tools)
    assert not any("VULKAN" in a.upper() for a in cpu_args)


def test_cuda_vulkan_builds_both_gpu_backends_and_needs_both_toolkits(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--backend cuda-vulkan``: ggml-cuda and ggml-vulkan in one build (a model split over a CUDA and a Vulkan
    device); it needs nvcc with cuBLAS like cuda (the error names the backend asked for) and the Vulkan pieces like
    vulkan; the CUDA-only variant exists for it."""
    usr = fake_vulkan_root(tmp_path / "usr")
    kit = toolchain.detect_vulkan(env={"PATH": ""}, system_roots=(usr,))
    cuda = toolchain.CudaToolkit(Path("/opt/cuda/bin/nvcc"), Path("/opt/cuda"), "13.0", Path("/opt/cuda/h"))
    tools, src = _tools_and_tree(tmp_path, cuda=cuda, vulkan=kit)
    args = plan.cmake_args(settings, src, modes.VARIANTS["patched"], "cuda-vulkan", tools)
    assert (
        "-DGGML_CUDA=ON" in args and "-DGGML_VULKAN=ON" in args and "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc" in args
    )
    assert f"-DVulkan_INCLUDE_DIR={usr / 'include'}" in args
    assert not any(
        "VULKAN" in a.upper() for a in plan.cmake_args(settings, src, modes.VARIANTS["patched"], "cuda", tools)
    )
    monkeypatch.setattr(toolchain, "detect_cuda", lambda: None)
    with pytest.raises(ToolchainError, match="the cuda-vulkan backend was requested but nvcc was not found"):
        toolchain.resolve_backend("cuda-vulkan")
    monkeypatch.setattr(toolchain, "detect_cuda", lambda: cuda)
    assert toolchain.resolve_backend("cuda-vulkan") == ("cuda-vulkan", cuda)
    modes.check_backend(modes.variant("upstream-nopeer"), "cuda-vulkan", fix="-")  # no error
    with pytest.raises(UsageError, match="only exists for the CUDA backend"):
        modes.check_backend(modes.variant("upstream-nopeer"), "vulkan", fix="-")


def test_build_targets_narrow_the_programs_and_key_the_build(make_settings) -> None:  # type: ignore[no-untyped-def]
    """``build.targets``: only those programs (llama-server always), a build dir of their own; empty: all, with the
    key of a build made before the setting existed."""
    full = single.ensure(make_settings(), "patched")
    assert "llama-bench" in full.binaries
    few = single.ensure(make_settings(build__targets=["llama-perplexity"]), "patched")
    assert set(few.binaries) == {"llama-server"} and few.build_dir != full.build_dir
    together = shared.ensure_shared(make_settings(build__targets=["llama-server"]), ["upstream", "patched"])
    assert all(set(r.binaries) == {"llama-server"} for r in together)
    assert single.ensure(make_settings(), "patched").up_to_date, "the full build is untouched"
    with pytest.raises(UsageError, match="unknown build target.*llama-cli"):
        make_settings(build__targets=["llama-cli"])


def test_one_nvcc_finder_for_the_builds_and_the_wheel(tmp_path, monkeypatch):
    """The builds and the wheel plan find nvcc the same way: $CUDACXX alone when set, else PATH, $CUDA_HOME,
    $CUDA_PATH (the wheel's own finder used to skip $CUDA_PATH and to fall back past a wrong $CUDACXX)."""
    from ggml_bridge.distribution import wheel_plan

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    for var in ("CUDACXX", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda"))
    assert wheel_plan.find_nvcc is toolchain.find_nvcc
    if not Path("/usr/local/cuda/bin/nvcc").is_file():
        assert toolchain.find_nvcc() == nvcc
        monkeypatch.setenv("CUDACXX", str(tmp_path / "missing"))
        assert toolchain.find_nvcc() is None


def test_an_nvcc_that_never_answers_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor and `build --backend auto` ask nvcc its version: a hung toolkit mount kept them waiting."""
    from ggml_bridge.distribution.builder import toolchain
    from ggml_bridge.foundations.errors import ToolchainError

    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\nexec sleep 60\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(nvcc))
    monkeypatch.setattr(toolchain, "VERSION_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(ToolchainError, match="did not answer within 1 s"):
        toolchain.detect_cuda()
    assert time.monotonic() - t0 < 10
