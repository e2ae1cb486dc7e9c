"""The build plan: what one build is, resolved once and then only read.

:func:`resolve` turns the variant names into :class:`ggml_bridge.runtime.modes.Variant` entries (the one look-up), resolves
the backend and finds the toolchain, before anything is fetched (a missing tool fails at once); :func:`sources`
obtains the upstream tree, applies the series where a variant needs it and builds (or finds) the web UI;
:func:`single` and :func:`shared` compute each variant's CMake arguments and the build key from them. The build
(:func:`ggml_bridge.distribution.builder.single.ensure`), the shared tree (:mod:`ggml_bridge.distribution.builder.shared`), the wheel
(:mod:`ggml_bridge.distribution.wheel_plan`, :func:`ggml_bridge.distribution.wheel.make_sdist`) and the rebase's build check take what they
need from here, so that each concept (a variant's CMake options, a backend's, the key, the toolchain) has one
definition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...foundations.config import Settings
from ...foundations.runner import log
from ...runtime import modes
from ...upstream import patch as patchmod
from ...upstream.fetch.resolve import obtain
from ...upstream.fetch.tree import Tree
from .. import ui as uimod
from .toolchain import Toolchain, VulkanKit, find_toolchain, resolve_backend

#: Turned OFF when the tree's CMakeLists mention them. The web UI is never built by CMake (npm) nor downloaded
#: (LLAMA_USE_PREBUILT_UI): :mod:`ggml_bridge.distribution.ui` builds it from the tree and places it where upstream embeds it.
OFF_IF_PRESENT = (
    "LLAMA_BUILD_TESTS",
    "LLAMA_BUILD_EXAMPLES",
    "LLAMA_CURL",
    "LLAMA_OPENSSL",
    "LLAMA_BUILD_UI",
    "LLAMA_USE_PREBUILT_UI",
)
#: A shared tree links statically, so that a variant's binaries do not load the libraries the next one rebuilds.
STATIC = "-DBUILD_SHARED_LIBS=OFF"


@dataclass(frozen=True)
class Target:
    """What is resolved before anything is fetched: the variants, the backend, the toolchain."""

    variants: tuple[modes.Variant, ...]
    backend: str
    """A :data:`ggml_bridge.runtime.modes.BACKENDS` name (``auto`` resolved)."""
    tools: Toolchain


def resolve(settings: Settings, variants: Sequence[modes.Variant | str], fix: str) -> Target:
    """The variants (names looked up here, once), the backend (``auto`` resolved) and the toolchain. A CUDA-only
    variant on another backend is a UsageError whose fix is ``fix`` (``{variant}`` names it)."""
    resolved = tuple(modes.variant(v) for v in variants)
    backend, cuda = resolve_backend(settings.build.backend)
    for v in resolved:
        modes.check_backend(v, backend, fix=fix.format(variant=v.name))
    return Target(resolved, backend, find_toolchain(cuda, backend))


@dataclass(frozen=True)
class Sources:
    """The upstream tree, the series applied to it (when a variant wants it) and the web UI."""

    tree: Tree
    patched: patchmod.PatchedTree | None
    ui: uimod.UiAssets
    baselines: Mapping[str, patchmod.PatchedTree] = dataclasses.field(default_factory=dict)
    """The test-only series of the baseline variants (``Variant.test_patches``) applied to the tree, by variant."""


@dataclass(frozen=True)
class SourceOptions:
    """Which tree and which series: ``source_spec``/``allow_unpinned`` as :func:`~ggml_bridge.upstream.fetch.resolve.obtain`
    takes them, ``series`` replacing the project's, and ``discard_changes`` letting
    :func:`ggml_bridge.upstream.patch.apply_series` delete a patched work tree holding edits."""

    source_spec: str | None = None
    allow_unpinned: bool = False
    series: patchmod.Series | None = None
    discard_changes: bool = False


def sources(
    settings: Settings,
    *,
    patched: bool,
    ui_of_patched: bool = True,
    options: SourceOptions = SourceOptions(),
    variants: Sequence[modes.Variant] = (),
) -> Sources:
    """Fetch the tree (:func:`~ggml_bridge.upstream.fetch.resolve.obtain`), apply the series with ``patched`` (``options.series``
    replaces the project's), the test-only series of the baseline ``variants`` among those given, and the UI of the
    patched tree (``ui_of_patched``) or of the pristine one."""
    o = options
    tree = obtain(settings, o.source_spec, o.allow_unpinned)
    applied = patchmod.apply_series(settings, tree, o.series, discard_changes=o.discard_changes) if patched else None
    baselines = {
        v.name: patchmod.apply_series(settings, tree, patchmod.read_series(settings.patches_dir / v.test_patches))
        for v in variants
        if v.test_patches is not None
    }
    ui = uimod.ensure(settings, applied.path if applied is not None and ui_of_patched else tree.path)
    return Sources(tree, applied, ui, baselines)


@dataclass(frozen=True)
class BuildPlan:
    """One build of one variant: the inputs, the CMake arguments it is configured with and the key they give."""

    variant: modes.Variant
    backend: str
    tools: Toolchain
    sources: Sources
    cmake_args: tuple[str, ...]
    key: str
    targets: tuple[str, ...] = ()
    """``build.targets``: empty builds every program the tree defines."""

    @property
    def tree(self) -> Tree:
        return self.sources.tree

    @property
    def patched(self) -> patchmod.PatchedTree | None:
        """The patched work tree, for a variant with the series; None for the upstream ones."""
        return self.sources.patched if self.variant.patched else None

    @property
    def baseline(self) -> patchmod.PatchedTree | None:
        """The test-only series applied to the tree, for a baseline variant; None for the others."""
        return self.sources.baselines.get(self.variant.name) if self.variant.test_patches else None

    @property
    def series(self) -> patchmod.Series | None:
        applied = self.patched or self.baseline
        return applied.series if applied else None

    @property
    def src(self) -> Path:
        applied = self.patched or self.baseline
        return applied.path if applied else self.tree.path

    @property
    def ui(self) -> uimod.UiAssets:
        return self.sources.ui

    def build_dir(self, settings: Settings) -> Path:
        return settings.layout.build(self.variant.name, self.backend, self.key)


def single(settings: Settings, target: Target, variant: modes.Variant, srcs: Sources) -> BuildPlan:
    """The plan of a build of ``variant`` in its own tree."""
    draft = BuildPlan(variant, target.backend, target.tools, srcs, (), "", tuple(settings.build.targets))
    args = cmake_args(settings, draft.src, variant, target.backend, target.tools)
    key = build_key(srcs, draft.series, target, variant.name, args, draft.targets)
    return dataclasses.replace(draft, cmake_args=tuple(args), key=key)


def shared(settings: Settings, target: Target, srcs: Sources) -> tuple[BuildPlan, ...]:
    """The plans of the variants of one static shared tree, in :data:`ggml_bridge.runtime.modes.VARIANTS`' order: each is
    configured with its own options (``upstream-nopeer`` with upstream's: it is made by recompiling one object),
    statically linked; all share one key."""
    targets = tuple(settings.build.targets)
    drafts = [
        BuildPlan(v, target.backend, target.tools, srcs, (), "", targets)
        for v in modes.VARIANTS.values()
        if v in target.variants
    ]
    args = {}
    for d in drafts:
        recompiled = d.variant.name in (modes.UPSTREAM_NOPEER, modes.UPSTREAM_NOPEER_VIRTUAL)
        configured_as = modes.VARIANTS[modes.UPSTREAM] if recompiled else d.variant
        full = cmake_args(settings, d.src, configured_as, target.backend, target.tools)
        args[d.variant.name] = tuple([a for a in full if not a.startswith("-DBUILD_SHARED_LIBS=")] + [STATIC])
    baseline_hashes = ",".join(b.series.hash for b in srcs.baselines.values())
    key = build_key(
        srcs,
        srcs.patched.series if srcs.patched else None,
        target,
        "shared:" + ",".join(args) + (f";baselines:{baseline_hashes}" if baseline_hashes else ""),
        [a for name, vargs in args.items() for a in [name, *vargs]],
        targets,
    )
    return tuple(dataclasses.replace(d, cmake_args=args[d.variant.name], key=key) for d in drafts)


def jobs(settings: Settings) -> int:
    """Parallel compile jobs: ``build.jobs``, else one per CPU."""
    return settings.build.jobs or os.cpu_count() or 1


def backend_options(
    backend: str, nvcc: Path | str | None, cuda_archs: str | None, vulkan: VulkanKit | None
) -> dict[str, str]:
    """The CMake options a GPU backend adds (the one place for them; a build and a wheel): GGML_CUDA with its
    compiler and architectures (none: the caller's or the CUDA table's choice elsewhere), the Vulkan pieces."""
    kind = modes.backend(backend)
    opts: dict[str, str] = {}
    if kind.cuda:
        assert nvcc is not None
        opts["GGML_CUDA"] = "ON"
        opts["CMAKE_CUDA_COMPILER"] = str(nvcc)
        if cuda_archs is not None:
            opts["CMAKE_CUDA_ARCHITECTURES"] = cuda_archs
    if kind.vulkan:
        assert vulkan is not None
        opts.update(vulkan.cmake_args())
    return opts


def cmake_args(
    settings: Settings, src: Path, variant: modes.Variant, backend: str, tools: Toolchain, *, tests: bool = False
) -> list[str]:
    """The full CMake option list for a build (order matters: later options win); ``tests``: with llama.cpp's tests
    (``LLAMA_BUILD_TESTS=ON``: ctest registers the series' test programs), as ``--series-prefixes`` builds."""
    text = _cmakelists_text(src)
    opts: dict[str, str] = {"CMAKE_BUILD_TYPE": "Release"}
    for name in OFF_IF_PRESENT:
        if re.search(rf"\b{name}\b", text):
            opts[name] = "OFF"
    if tests:
        opts["LLAMA_BUILD_TESTS"] = "ON"
    opts["CMAKE_C_COMPILER"] = str(tools.cc.path)
    opts["CMAKE_CXX_COMPILER"] = str(tools.cxx.path)
    opts["GGML_NATIVE"] = "ON" if settings.build.native else "OFF"
    opts["GGML_RPC"] = "ON"  # every variant: llama-server --rpc and ggml-rpc-server (docs/rpc.md)
    opts["GGML_CUDA"] = "OFF"
    nvcc = tools.cuda.nvcc if tools.cuda else None
    opts.update(backend_options(backend, nvcc, settings.build.cuda_arch, tools.vulkan))
    opts.update(variant_options(variant, text))
    return [f"-D{k}={v}" for k, v in opts.items()] + list(settings.build.cmake_args)


def variant_options(variant: modes.Variant, cmakelists: str | None = None) -> dict[str, str]:
    """The CMake options ``variant`` adds (:data:`ggml_bridge.runtime.modes.VARIANTS`); with the tree's CMakeLists text, a
    note for each option the tree does not define (yet)."""
    if cmakelists is not None:
        for name in variant.cmake:
            if not re.search(rf"\b{name}\b", cmakelists):
                log(f"note: {name} is not defined by this tree's CMakeLists (yet); passing it anyway")
    return dict(variant.cmake)


def build_key(
    srcs: Sources,
    series: patchmod.Series | None,
    target: Target,
    variant: str,
    args: Sequence[str],
    targets: Sequence[str] = (),
) -> str:
    """The build's identity: the inputs that change its binaries (the tree and the web UI of ``srcs``, the series
    applied, the backend and the tools' versions of ``target``, the variant's name, its CMake arguments and the
    programs built; ``tests/unit/distribution/test_build_plan.py`` holds the keys of fixed inputs, so that a refactoring cannot
    invalidate every cached build)."""
    tree, tools = srcs.tree, target.tools
    ident: dict[str, Any] = {
        "ui": srcs.ui.sha256 if srcs.ui else None,
        "tree": tree.key,
        "content": tree.content_sha256,
        "series": series.hash if series else None,
        "variant": variant,
        "backend": target.backend,
        "cmake_args": list(args),
        "generator": "Ninja",
        "cc": tools.cc.version,
        "cxx": tools.cxx.version,
        "nvcc": tools.cuda.version if tools.cuda else None,
        "vulkan_headers": tools.vulkan.header_version if tools.vulkan else None,
    }
    if targets:  # (only then: the keys of full builds stay as they were)
        ident["targets"] = sorted(targets)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _cmakelists_text(src: Path) -> str:
    parts = []
    for rel in ("CMakeLists.txt", "ggml/CMakeLists.txt"):
        try:
            parts.append((src / rel).read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(parts)
