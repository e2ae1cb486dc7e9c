"""The build plan (ggml_bridge/distribution/builder/plan.py) keeps every build key it had before it existed: a changed key makes
every cached build (10-15 minutes each for the real tree) build again.

The keys below were computed on 2026-12-03 by the code before the plan (``builder.cmake_args`` and
``builder.build_key`` called as ``builder.ensure`` and ``builder.ensure_shared`` called them, commit a7df351) for
fixed inputs; the plan must give the same for every variant, backend, target list and shared tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.distribution import ui as uimod
from ggml_bridge.distribution.builder import plan
from ggml_bridge.distribution.builder.toolchain import CudaToolkit, Tool, Toolchain, VulkanKit
from ggml_bridge.foundations import config
from ggml_bridge.runtime import modes
from ggml_bridge.upstream import patch as patchmod
from ggml_bridge.upstream.fetch.tree import Tree

KEYS = {
    "patched/cpu/": "e575d7e2b5908d10825f9bb2d5dcc7a05cd33498cad91205383745a9eb1a4936",
    "patched/cpu/llama-server": "8ec0197d11df096c9750e848a6b90a73d96fc2a750c66a93d750806940335b4c",
    "patched/cuda-vulkan/": "61373ff409e22866c341c5ae3ea8be0827151f5204e0a983a662928cd7352ba2",
    "patched/cuda-vulkan/llama-server": "b34a68e3758b3f3e6b6cdf4252215ac44f4ca1b94e29efd8f74c438e29a6bdc6",
    "patched/cuda/": "3083739c9864aa5cc5a57884d552e7dcbe72e63f0fab8c70d185d4091d8f7cc7",
    "patched/cuda/llama-server": "fbe6d80e269f0744b27d4f87b5f5819294a5953e5a1783bd757dea2550fc4d73",
    "patched/vulkan/": "77c5c3864626c4592b921ba6af7f1b30a5617cb18b9d09144b77df877811421c",
    "patched/vulkan/llama-server": "76d4e03f6f73bee8646b2ef9d4a09427a0425c9a2260ff459dbbcd7081978723",
    "upstream-nopeer/cuda-vulkan/": "8876ca1c78c4c6b46d19cdb8ff9a2d675866bd441adcfaf02175729cdc92fb3d",
    "upstream-nopeer/cuda-vulkan/llama-server": "d8a856ffb704070c77434ab373491a69e33738980f510b41a126d95428d3fd7a",
    "upstream-nopeer/cuda/": "aeb8a4ce3efa02426554b06efda0b16c8c6a37c9930a645344ce9f1f0abd02ab",
    "upstream-nopeer/cuda/llama-server": "0f4f668badb95e3e8f2e21c6a270085959fed4dbb677c9b236449356da340327",
    "upstream/cpu/": "c697e2db3bbebf216903cefe171b8edbbdc794cc817d73e113e5a3e384130124",
    "upstream/cpu/llama-server": "34abbbe67e2a89644dad2f041d9cc5bb8279a3e3fa9367bc155c9088b63c7e41",
    "upstream/cuda-vulkan/": "15bd1bdc71b05c3e41b0ec1173aeabae282f4dc535df121744a305f32bd6b15c",
    "upstream/cuda-vulkan/llama-server": "a936a3b4fb5dfdd11fadc6e8a167fd21bfa96f72b91e11b7bd51d9b2aded7285",
    "upstream/cuda/": "99f5f33e15e5d98ede2c1589ce8df7a91ed178615673512a91132083562e1b6e",
    "upstream/cuda/llama-server": "5ec7d44b6020264bba632c6d154f26540e00e556587894c80800c14c86b1b9ab",
    "upstream/vulkan/": "0007c283637931332e82c6aaf8ca4dccb80af85174bd6e092183e1879baa5566",
    "upstream/vulkan/llama-server": "610d8264dcc5b02cad9c08f20b0c9b170ba1518b314f16609d09a4b1a456bbef",
}
SHARED_KEYS = {
    "upstream,patched/cpu": "6d83ed07433ad5d185753384dde2b766c22ccb5efbccd59946090097729abfc4",
    "upstream,patched/cuda": "ed78bfc2ac532daa4463c0152169fc0622bf127b7ca942499defb6e6929b324f",
    "upstream,upstream-nopeer,patched/cuda": "d354d8b8ce5a6b85d4ed32dd9c79f0a84c7f31211ed45cc8f402381d7d76aa46",
}
#: The patched variant's arguments on the CPU, as the build before the plan passed them to CMake.
PATCHED_CPU_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DCMAKE_C_COMPILER=/usr/bin/cc",
    "-DCMAKE_CXX_COMPILER=/usr/bin/c++",
    "-DGGML_NATIVE=ON",
    "-DGGML_RPC=ON",
    "-DGGML_CUDA=OFF",
    "-DGGML_CUDA_MAPPED_HOST_BRIDGE=ON",
    "-DSAM3D_BATCHED_TRANSFERS=ON",
    "-DEXTRA=1",
)


def _inputs(tmp_path: Path, targets: tuple[str, ...] = ()) -> tuple[config.Settings, Toolchain, plan.Sources]:
    """The inputs the keys above were computed from (no path of them depends on ``tmp_path``)."""
    src = tmp_path / "src"
    (src / "ggml").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "option(LLAMA_BUILD_TESTS x)\noption(LLAMA_CURL x)\noption(GGML_CUDA_MAPPED_HOST_BRIDGE x)\n"
    )
    (src / "ggml/CMakeLists.txt").write_text("option(SAM3D_BATCHED_TRANSFERS x)\noption(GGML_CUDA_NO_PEER_COPY x)\n")
    overrides = {"cache_dir": "/nonexistent/cache", "project_dir": "/nonexistent/proj", "build.backend": "cpu"}
    if targets:
        overrides["build.targets"] = ",".join(targets)
    settings = config.load(overrides, env={"CMAKE_ARGS": "-DEXTRA=1"})
    cuda = CudaToolkit(Path("/opt/cuda/bin/nvcc"), Path("/opt/cuda"), "13.0", Path("/opt/cuda/include/cublas_v2.h"))
    vulkan = VulkanKit(
        Path("/usr/include"),
        "1.4.309",
        Path("/usr/lib/libvulkan.so"),
        Path("/usr/bin/glslc"),
        Path("/usr/lib/cmake/SPIRV-Headers"),
    )
    tools = Toolchain(
        Tool(Path("/usr/bin/cmake"), "3.25.1"),
        Tool(Path("/usr/bin/ninja"), "1.11.1"),
        Tool(Path("/usr/bin/cc"), "gcc 12.2"),
        Tool(Path("/usr/bin/c++"), "g++ 12.2"),
        cuda,
        vulkan,
    )
    tree = Tree(src, "a" * 40, "test", key="a" * 40, commit="a" * 40, pinned=True, content_sha256="c" * 64)
    patched = patchmod.PatchedTree(src, tree, patchmod.Series((), "d" * 64), "f" * 40, "work-key")
    ui = uimod.UiAssets("k" * 64, Path("/ui"), sha256="e" * 64, files=3)
    return settings, tools, plan.Sources(tree, patched, ui)


@pytest.mark.parametrize("case", sorted(KEYS))
def test_a_single_build_keeps_its_key(tmp_path: Path, case: str) -> None:
    name, backend, targets = case.split("/")
    settings, tools, srcs = _inputs(tmp_path, tuple(t for t in targets.split(",") if t))
    variant = modes.variant(name)
    p = plan.single(settings, plan.Target((variant,), backend, tools), variant, srcs)
    assert p.key == KEYS[case]
    assert p.build_dir(settings).name == f"{name}-{backend}-{KEYS[case][:16]}"
    if case == "patched/cpu/":
        assert p.cmake_args == PATCHED_CPU_ARGS and p.series is srcs.patched.series  # type: ignore[union-attr]
    if name != modes.PATCHED:
        assert p.series is None and p.src == srcs.tree.path


@pytest.mark.parametrize("case", sorted(SHARED_KEYS))
def test_a_shared_tree_keeps_its_key(tmp_path: Path, case: str) -> None:
    names, backend = case.split("/")
    settings, tools, srcs = _inputs(tmp_path)
    variants = tuple(modes.variant(n) for n in reversed(names.split(",")))  # the plan orders them
    plans = plan.shared(settings, plan.Target(variants, backend, tools), srcs)
    assert [p.variant.name for p in plans] == names.split(",")
    assert {p.key for p in plans} == {SHARED_KEYS[case]}
    assert all(p.cmake_args[-1] == plan.STATIC for p in plans)


def test_the_wheel_compiles_the_patched_variant_with_the_builds_options(tmp_path: Path) -> None:
    """The sdist's CMakeLists (standalone: pip builds it without ggml-bridge) forces what the patched variant adds,
    and a wheel's GPU backend gets the options a build of that backend gets."""
    import re

    from ggml_bridge.distribution import wheel_plan

    settings, tools, _ = _inputs(tmp_path)
    wp = wheel_plan.plan(settings)
    assert wp.variant is modes.VARIANTS[modes.PATCHED] and wp.backend == "cpu"
    cml = (wheel_plan.TEMPLATES / "CMakeLists.txt").read_text()
    forced = dict(re.findall(r"^gb_force\((\w+) (\w+)\)", cml, re.M))
    assert plan.variant_options(wp.variant).items() <= forced.items()
    cuda = plan.backend_options("cuda", "/opt/cuda/bin/nvcc", "90-real", None)
    assert list(cuda) == ["GGML_CUDA", "CMAKE_CUDA_COMPILER", "CMAKE_CUDA_ARCHITECTURES"]
    built = plan.cmake_args(settings, tmp_path / "src", wp.variant, "cuda", tools)
    assert [f"-D{k}=" for k in cuda] == [a.split("=")[0] + "=" for a in built if a.split("=")[0][2:] in cuda]


def test_the_test_only_baseline_builds_its_own_series_and_says_so(tmp_path: Path) -> None:
    """upstream-nopeer-virtual: the upstream tree with its test-only series (never ours): its own sources, series and
    key, in a single build and in a shared tree, and the keys of the other variants unchanged."""
    import dataclasses
    import shutil

    settings, tools, srcs = _inputs(tmp_path)
    shutil.copytree(srcs.tree.path, tmp_path / "baseline")  # the work tree: the upstream tree plus its series
    base_series = patchmod.Series((), "b" * 64)
    baseline = patchmod.PatchedTree(tmp_path / "baseline", srcs.tree, base_series, "9" * 40, "base-key")
    srcs = dataclasses.replace(srcs, baselines={modes.UPSTREAM_NOPEER_VIRTUAL: baseline})
    v = modes.variant(modes.UPSTREAM_NOPEER_VIRTUAL)
    p = plan.single(settings, plan.Target((v,), "cuda", tools), v, srcs)
    assert p.src == baseline.path and p.series is base_series and p.patched is None and p.baseline is baseline
    nopeer = modes.variant(modes.UPSTREAM_NOPEER)
    other = plan.single(settings, plan.Target((nopeer,), "cuda", tools), nopeer, srcs)
    assert other.key == KEYS["upstream-nopeer/cuda/"] and other.baseline is None and p.key != other.key
    names = ("upstream", "upstream-nopeer", "upstream-nopeer-virtual", "patched")
    plans = plan.shared(settings, plan.Target(tuple(map(modes.variant, names)), "cuda", tools), srcs)
    assert [q.variant.name for q in plans] == list(names)
    assert plans[2].cmake_args == plans[1].cmake_args, "configured as upstream, recompiled with NO_PEER_COPY"
    assert plans[0].key != SHARED_KEYS["upstream,upstream-nopeer,patched/cuda"], "the baseline's series is in the key"
