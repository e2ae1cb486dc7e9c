"""Shared fixtures.

Fast tests use a tiny fake llama.cpp (tests/fixtures/fakellama.py): a local git repo, its archive and sdist
served from 127.0.0.1, and a fixture patch series. Nothing touches the network or the user's cache.

Slow tests (``-m slow``) use the real pinned upstream through ``real_settings``/``real_build``; one cache is
shared by the whole session (``GGML_BRIDGE_TEST_CACHE_DIR`` keeps it across sessions). With
``GGML_BRIDGE_TEST_SOURCE`` (e.g. a downloaded llama_cpp_python-0.3.36.tar.gz) the pinned tree is seeded from it
instead of the registry.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ggml_bridge.foundations import config  # noqa: E402

from fixtures import fakellama  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SDIST_NAME = "fake_llama-1.0"


def pytest_configure(config: pytest.Config) -> None:
    """Every git the tests start (theirs and ggml-bridge's) skips work no test looks at: no `git maintenance run
    --auto` process after each commit/am/fetch, no sample hooks copied into each new repository (the suite makes
    a few hundred repositories). Set in os.environ here, so xdist workers and the CLIs they start inherit it."""
    n = int(os.environ.get("GIT_CONFIG_COUNT") or 0)
    have = {os.environ.get(f"GIT_CONFIG_KEY_{i}") for i in range(n)}  # xdist workers inherit the controller's
    for key, value in {"maintenance.auto": "false", "init.templateDir": ""}.items():
        if key not in have:
            os.environ[f"GIT_CONFIG_KEY_{n}"] = key
            os.environ[f"GIT_CONFIG_VALUE_{n}"] = value
            n += 1
    os.environ["GIT_CONFIG_COUNT"] = str(n)


@dataclass
class FakeUpstream:
    repo: Path
    commit: str
    patches: fakellama.PatchSet
    archive: Path
    sdist: Path
    sdist_sha: str
    other_sdist: Path
    """An sdist of "version 2.0": another vendored commit, not pinned."""
    other_commit: str


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> FakeUpstream:
    root = tmp_path_factory.mktemp("fake-upstream")
    repo = root / "llama.cpp"
    commit = fakellama.make_upstream(repo)
    patches = fakellama.make_patches(repo, root / "patch-work", root / "patches")
    archive = fakellama.make_archive(repo, root / f"{commit}.tar.gz", commit)
    sdist = fakellama.make_sdist(repo, root / f"{SDIST_NAME}.tar.gz", SDIST_NAME, commit)
    other_tree = root / "other-tree"
    shutil.copytree(repo, other_tree, ignore=shutil.ignore_patterns(".git"))
    (other_tree / "src" / "newer.c").write_text("int newer = 1;\n")
    other_commit = "ab" * 20
    other = fakellama.make_sdist(other_tree, root / "fake_llama-2.0.tar.gz", "fake_llama-2.0", other_commit)
    return FakeUpstream(repo, commit, patches, archive, sdist, fakellama.sha256(sdist), other, other_commit)


@pytest.fixture
def http(upstream: FakeUpstream) -> Iterator[fakellama.HTTPFixture]:
    """Serves the fake archive, the fake sdist and a PyPI JSON API for fake-llama 1.0 and 2.0."""
    srv = fakellama.HTTPFixture().start()
    srv.routes[f"/archive/{upstream.commit}.tar.gz"] = fakellama.Route(upstream.archive.read_bytes())
    for version, path in (("1.0", upstream.sdist), ("2.0", upstream.other_sdist)):
        srv.routes[f"/files/{path.name}"] = fakellama.Route(path.read_bytes())
        srv.json(
            f"/pypi/fake-llama/{version}/json",
            {
                "urls": [
                    {
                        "filename": "fake_llama-1.0-py3-none-any.whl",
                        "packagetype": "bdist_wheel",
                        "url": "/nope",
                        "digests": {"sha256": "0" * 64},
                    },
                    {
                        "filename": path.name,
                        "packagetype": "sdist",
                        "url": f"../../../files/{path.name}",
                        "digests": {"sha256": fakellama.sha256(path)},
                    },
                ]
            },
        )
    yield srv
    srv.stop()


def write_pin(
    project: Path,
    upstream: FakeUpstream,
    *,
    git_url: str,
    archive_url: str,
    sdist_sha: str,
    archive_sha: str = "unknown",
) -> None:
    expect = ", ".join(f'"{f}"' for f in fakellama.EXPECT_FILES)
    (project / "pin.toml").write_text(f"""\
[upstream]
url = "{git_url}"
tag = "b1"
commit = "{upstream.commit}"
expect_files = [{expect}]

[[source]]
kind = "git"
url = "{git_url}"

[[source]]
kind = "archive"
url = "{archive_url}"
sha256 = "{archive_sha}"
subdir = "llama.cpp-{upstream.commit}"

[[source]]
kind = "pypi-sdist"
package = "fake-llama"
version = "1.0"
filename = "{SDIST_NAME}.tar.gz"
sha256 = "{sdist_sha}"
subdir = "{SDIST_NAME}/vendor/llama.cpp"
""")


@pytest.fixture
def project(tmp_path: Path, upstream: FakeUpstream, http: fakellama.HTTPFixture) -> Path:
    """A project dir: pin.toml pointing at the fake sources, patches/ holding the two-patch series."""
    proj = tmp_path / "project"
    (proj / "patches").mkdir(parents=True)
    for p in upstream.patches.series:
        shutil.copy(p, proj / "patches" / p.name)
    (proj / "patches" / "series").write_text("".join(p.name + "\n" for p in upstream.patches.series))
    write_pin(
        proj,
        upstream,
        git_url=upstream.repo.as_uri(),
        archive_url=f"{http.url}/archive/{upstream.commit}.tar.gz",
        sdist_sha=upstream.sdist_sha,
    )
    return proj


@pytest.fixture
def make_settings(
    tmp_path: Path, project: Path, http: fakellama.HTTPFixture, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., config.Settings]:
    """Settings isolated from the user's environment: cache under tmp_path, the fake project and PyPI."""
    for var in list(os.environ):
        if var.startswith("GGML_BRIDGE_") or var in ("CMAKE_ARGS", "CC", "CXX", "CUDACXX"):
            monkeypatch.delenv(var)

    def make(**overrides: object) -> config.Settings:
        base = {
            "cache_dir": str(tmp_path / "cache"),
            "project_dir": str(project),
            "fetch.pypi_url": http.url,
            "fetch.connect_timeout": 2.0,
            "build.jobs": 2,
            "build.backend": "cpu",
        }
        base.update({k.replace("__", "."): v for k, v in overrides.items()})
        return config.load(base, env={}, cwd=tmp_path)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., config.Settings]) -> config.Settings:
    return make_settings()


def _gpu_unavailable() -> str | None:
    """Why gpu-marked tests cannot run here (None when they can): an NVIDIA GPU and CUDA with cuBLAS are needed."""
    import subprocess

    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        gpus = ""
    if "GPU" not in gpus:
        return "no NVIDIA GPU (nvidia-smi -L lists none)"
    from ggml_bridge.distribution.builder import toolchain

    cuda = toolchain.detect_cuda()
    if cuda is None or cuda.cublas_header is None:
        return "no CUDA toolkit with cuBLAS headers (nvcc + cublas_v2.h)"
    return None


#: Set by .ci/run: the vulkan-marked tests must run (a missing Vulkan piece fails them instead of skipping them).
REQUIRE_VULKAN = "GGML_BRIDGE_TEST_REQUIRE_VULKAN"


def _vulkan_unavailable() -> str | None:
    """Why vulkan-marked tests cannot run here (None when they can): the Vulkan build pieces (headers new enough,
    loader, glslc, SPIRV-Headers; ``$VULKAN_SDK`` first) must be found."""
    from ggml_bridge.distribution.builder import toolchain
    from ggml_bridge.foundations.errors import ToolchainError

    try:
        toolchain.detect_vulkan()
    except ToolchainError as e:
        return str(e)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _gpu_unavailable() if gpu_items else None
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
    vk_items = [item for item in items if item.get_closest_marker("vulkan") is not None]
    reason = _vulkan_unavailable() if vk_items and not os.environ.get(REQUIRE_VULKAN) else None
    if reason:
        for item in vk_items:
            item.add_marker(pytest.mark.skip(reason=f"vulkan test ({REQUIRE_VULKAN} unset): {reason}"))


# --------------------------------------------------------------------------------------------- slow: real tree


@pytest.fixture(scope="session")
def real_settings(tmp_path_factory: pytest.TempPathFactory) -> config.Settings:
    cache = os.environ.get("GGML_BRIDGE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("real-cache"))
    return config.load(
        {"cache_dir": cache, "project_dir": str(REPO_ROOT), "build.backend": "cpu"},
        env={k: v for k, v in os.environ.items() if k == "CMAKE_ARGS"},
        cwd=REPO_ROOT,
    )


@pytest.fixture(scope="session")
def real_tree(real_settings: config.Settings):  # type: ignore[no-untyped-def]
    from ggml_bridge.upstream.fetch.resolve import obtain

    return obtain(real_settings, os.environ.get("GGML_BRIDGE_TEST_SOURCE") or None)


@pytest.fixture(scope="session")
def real_build(real_settings: config.Settings, real_tree: object) -> Callable[[str], object]:
    """``real_build("patched")`` builds (once per session, then cached) the real llama.cpp for CPU."""
    from ggml_bridge.distribution.builder import single

    done: dict[str, object] = {}

    def get(variant: str = "patched"):  # type: ignore[no-untyped-def]
        if variant not in done:
            done[variant] = single.ensure(real_settings, variant)
        return done[variant]

    return get


@pytest.fixture(scope="session")
def real_vulkan_build(real_settings: config.Settings, real_tree: object):  # type: ignore[no-untyped-def]
    """The real llama.cpp built for Vulkan, upstream and patched in one shared tree (``build --backend vulkan
    --variant upstream,patched --shared-tree``), once per session, then cached: ``{"upstream": .., "patched": ..}``."""
    import dataclasses

    from ggml_bridge.distribution.builder import shared

    settings = dataclasses.replace(real_settings, build=dataclasses.replace(real_settings.build, backend="vulkan"))
    results = shared.ensure_shared(settings, ["upstream", "patched"])
    return {r.variant: r for r in results}


@pytest.fixture(autouse=True)
def _real_binaries_for_slow_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow tests of other stages find the real build through GGML_BRIDGE_TEST_BIN_DIR (and the vocab GGUF
    through GGML_BRIDGE_TEST_UPSTREAM). Under `make test` / CI (GGML_BRIDGE_TEST_CACHE_DIR set) it is built here,
    once per session, unless the caller set them; a bare `pytest` leaves them unset (those tests then skip)."""
    if (
        request.node.get_closest_marker("slow") is None
        or os.environ.get("GGML_BRIDGE_TEST_BIN_DIR")
        or not os.environ.get("GGML_BRIDGE_TEST_CACHE_DIR")
    ):
        return
    res = request.getfixturevalue("real_build")("patched")
    monkeypatch.setenv("GGML_BRIDGE_TEST_BIN_DIR", str(res.bin_dir))
    if not os.environ.get("GGML_BRIDGE_TEST_UPSTREAM"):
        monkeypatch.setenv("GGML_BRIDGE_TEST_UPSTREAM", str(request.getfixturevalue("real_tree").path))
