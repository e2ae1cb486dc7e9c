"""rebase: synthetic upstreams for each outcome (clean, offsets, fuzz, already upstream, conflict), dirty trees, bad
input, the CUDA check, the CI script (the real llama.cpp trees: tests/integration/test_rebase.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config, errors
from ggml_bridge.foundations.errors import FetchError, PatchError, RebaseConflict, SourceError, UsageError
from ggml_bridge.upstream import patch
from ggml_bridge.upstream import pin as pinmod
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.rebase import checks, probe
from ggml_bridge.upstream.rebase.checks import cuda_check
from ggml_bridge.upstream.rebase.job import continue_rebase, rebase
from ggml_bridge.upstream.rebase.report import Options, RebaseReport
from ggml_bridge.upstream.rebase.series import sdist_source

from fixtures import fakellama
from helpers import DEMO, REPO_ROOT
from helpers import REBASE_DATE as DATE
from helpers import RebaseUpstream as Up
from helpers import project_snapshot as _snapshot
from helpers import rebase_statuses as _statuses


def _check(rebase_settings: config.Settings, onto: str, **kw: object) -> RebaseReport:
    return rebase(rebase_settings, onto, Options(check=True, date=DATE, **kw))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- outcomes


def test_check_clean_writes_nothing(rebase_settings: config.Settings, rebase_project: Path) -> None:
    before = _snapshot(rebase_project)
    rep = _check(rebase_settings, "b2")
    assert _statuses(rep) == ["clean", "clean"] and rep.ok
    assert rep.target_commit and "preimage blobs from the current pin" in rep.three_way
    assert _snapshot(rebase_project) == before
    assert not (rebase_project / "build").exists()


def test_check_offsets(rebase_settings: config.Settings) -> None:
    rep = _check(rebase_settings, "b3")
    assert _statuses(rep) == ["offsets", "clean"]
    assert rep.results[0].hunks == ["src/demo.c: Hunk #1 succeeded at 12 (offset 5 lines)"]


def test_check_fuzz(rebase_settings: config.Settings) -> None:
    rep = _check(rebase_settings, "b4")
    assert _statuses(rep) == ["fuzz", "clean"]
    assert any("with fuzz" in h for h in rep.results[0].hunks), rep.results[0].hunks


def test_check_already_upstream(rebase_settings: config.Settings) -> None:
    rep = _check(rebase_settings, "b5")
    assert _statuses(rep) == ["upstream", "clean"] and rep.ok


def test_check_conflict_reports_files_and_hunks(rebase_settings: config.Settings, rebase_project: Path) -> None:
    before = _snapshot(rebase_project)
    rc = cli.main(["rebase", "--onto", "b6", "--check", "--cache-dir", str(rebase_settings.cache_dir)])
    assert rc == RebaseConflict.exit_code
    rep = _check(rebase_settings, "b6")
    assert _statuses(rep) == ["conflict", "clean"]
    bad = rep.results[0]
    assert bad.conflicts == ["src/demo.c"]
    assert any(h.startswith("src/demo.c: hunk @@ -7,7 +7,7 @@") for h in bad.hunks), bad.hunks
    assert "tried without" not in " ".join(rep.results[1].detail)
    assert _snapshot(rebase_project) == before


def test_merged_without_preimages_is_a_conflict_when_blobs_are_missing(
    rebase_settings: config.Settings, rebase_upstream: Up, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the old tree (its pinned sources unreachable) the 3-way merge has no blobs: b4 then fails where it
    merges with them. A --base-source the user gave that cannot be obtained is its own error (D30: it was this
    note, and the check went on)."""
    real = obtain

    def pinned_unreachable(settings: config.Settings, source: str | None = None, **kw: object) -> object:
        if source is None:
            raise errors.FetchError("every pinned source is unreachable")
        return real(settings, source, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(probe, "obtain", pinned_unreachable)  # the base tree: rebase/probe.py
    rep = _check(rebase_settings, "b4")
    assert "without preimage blobs" in rep.three_way
    assert rep.results[0].status == "conflict"
    monkeypatch.undo()
    with pytest.raises(errors.SourceError, match="nowhere"):
        _check(rebase_settings, "b4", base_source=str(rebase_settings.cache_dir / "nowhere"))


# --------------------------------------------------------------------------------------------- writing


def test_write_regenerates_series_and_pin(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    rep = rebase(rebase_settings, "b3", Options(build=False, cuda_check=False, date=DATE))
    assert rep.state == "rebased" and _statuses(rep) == ["offsets", "clean"]
    pin = pinmod.load(rebase_project / "pin.toml")
    assert (pin.tag, pin.commit) == ("b3", rebase_upstream.commits["b3"])
    assert [s.kind for s in pin.sources] == ["git"]
    text = (rebase_project / "patches" / "0001-src-demo-ten.patch").read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert f"Last-Update: {DATE}\n" in text and "Last-Update: 2026-11-30" not in text
    assert "Subject: [PATCH] demo: line ten is one hundred\n" in text
    assert "@@ -12,7 +12,7 @@" in text and not text.rstrip().endswith("2.39")  # moved hunk, no signature
    assert (rebase_project / "patches" / "series").read_text() == (rebase_upstream.patches / "series").read_text()
    assert (rebase_project / "build" / "rebase" / "report.json").is_file()
    # the new pin + series applies with plain `ggml-bridge patch`
    tree = obtain(rebase_settings)
    assert tree.commit == rebase_upstream.commits["b3"]
    assert patch.check_series(rebase_settings, tree).ok
    # nothing left behind
    assert not list(rebase_project.glob(".rebase-stage-*")) and not list(rebase_project.glob(".patches.old-*"))


def test_rewrite_onto_same_base_is_stable(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    """Regenerating on the pinned base reproduces our files byte for byte, but for Last-Update."""
    assert rebase(rebase_settings, "b1", Options(build=False, date=DATE)).state == "up-to-date"
    rebase(rebase_settings, "b1", Options(build=False, cuda_check=False, date=DATE, force=True))
    for name in ("0001-src-demo-ten.patch", "0002-ggml-cuda-bridge.patch"):
        old = (rebase_upstream.patches / name).read_text().replace("Last-Update: 2026-11-30", f"Last-Update: {DATE}")
        assert (rebase_project / "patches" / name).read_text() == old


def test_write_drops_patch_already_upstream(rebase_settings: config.Settings, rebase_project: Path) -> None:
    rep = rebase(rebase_settings, "b5", Options(build=False, cuda_check=False, date=DATE))
    assert _statuses(rep) == ["upstream", "clean"]
    assert not (rebase_project / "patches" / "0001-src-demo-ten.patch").exists()
    assert (rebase_project / "patches" / "series").read_text() == "# our series\n0002-ggml-cuda-bridge.patch\n"
    assert any("removed" in w for w in rep.written)


def test_write_conflict_leaves_project_and_reports(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    before = _snapshot(rebase_project)
    rc = cli.main(
        [
            "rebase",
            "--onto",
            "b6",
            "--no-build",
            "--cache-dir",
            str(rebase_settings.cache_dir),
            "--report",
            str(rebase_project.parent / "rep"),
        ]
    )
    assert rc == RebaseConflict.exit_code
    assert _snapshot(rebase_project) == before
    data = json.loads((rebase_project.parent / "rep" / "report.json").read_text())
    assert data["state"] == "conflict" and data["ok"] is False
    assert [r["status"] for r in data["results"]] == ["conflict", "clean"]
    md = (rebase_project.parent / "rep" / "report.md").read_text()
    assert "| `0001-src-demo-ten.patch` | **conflict** | src/demo.c |" in md
    wt = Path(data["worktree"])
    assert (wt / ".git" / "rebase-apply").is_dir(), "the work tree is stopped inside git am"
    assert "<<<<<<<" in (wt / "src" / "demo.c").read_text()
    assert data["commands"][0] == f"cd {wt}"
    assert any(
        c.endswith("ggml-bridge rebase --continue   # applies the remaining patches, rewrites patches/ and pin.toml")
        for c in data["commands"]
    ), data["commands"]


def test_continue_after_resolving_rewrites_series_and_pin(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    """The worked example's flow on a fake tree: stop at the conflict, edit the file, --continue."""
    before = _snapshot(rebase_project)
    rc = cli.main(
        ["rebase", "--onto", "b6", "--no-build", "--date", DATE, "--cache-dir", str(rebase_settings.cache_dir)]
    )
    assert rc == RebaseConflict.exit_code and _snapshot(rebase_project) == before
    data = json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())
    wt = Path(data["worktree"])
    # --continue before the markers are gone: refused, nothing changes, the work tree stays
    rc = cli.main(["rebase", "--continue", "--cache-dir", str(rebase_settings.cache_dir)])
    assert (
        rc == RebaseConflict.exit_code
        and _snapshot(rebase_project) == before
        and (wt / ".git" / "rebase-apply").is_dir()
    )
    text = (wt / "src" / "demo.c").read_text()
    resolved = re.sub(r"<<<<<<<.*?>>>>>>>[^\n]*\n", "int line10 = 100;\n", text, flags=re.S)
    (wt / "src" / "demo.c").write_text(resolved.replace("int line7 = 7;", "int line7 = -7;"))  # no git add
    rc = cli.main(["rebase", "--continue", "--cache-dir", str(rebase_settings.cache_dir)])
    assert rc == 0
    pin = pinmod.load(rebase_project / "pin.toml")
    assert (pin.tag, pin.commit) == ("b6", rebase_upstream.commits["b6"])
    new = (rebase_project / "patches" / "0001-src-demo-ten.patch").read_text()
    assert "-int line10 = -10;\n" in new and "+int line10 = 100;\n" in new and f"Last-Update: {DATE}" in new
    assert (rebase_project / "patches" / "0002-ggml-cuda-bridge.patch").is_file()
    rep = json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())
    assert rep["state"] == "rebased" and [r["status"] for r in rep["results"]] == ["resolved", "clean"]
    assert not wt.exists()
    # the rewritten series applies with the plain patch stage on the new pin
    tree = obtain(rebase_settings)
    patch.apply_series(rebase_settings, tree)
    # and there is nothing left to continue
    rc = cli.main(["rebase", "--continue", "--cache-dir", str(rebase_settings.cache_dir)])
    assert rc == 2


def test_abort_drops_the_work_tree(rebase_settings: config.Settings, rebase_project: Path) -> None:
    before = _snapshot(rebase_project)
    with pytest.raises(RebaseConflict):
        rebase(rebase_settings, "b6", Options(build=False, date=DATE))
    wt = Path(json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())["worktree"])
    assert wt.is_dir()
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0
    assert not wt.exists() and _snapshot(rebase_project) == before


def test_second_onto_while_stopped_refuses_and_abort_keeps_hand_edits(
    rebase_settings: config.Settings, rebase_project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27 D2: a second --onto while a rebase is stopped must not replace its work tree (hand edits), and
    --abort keeps the work tree's changes as a patch file unless --discard."""
    with pytest.raises(RebaseConflict):
        rebase(rebase_settings, "b6", Options(build=False, date=DATE))
    wt = Path(json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())["worktree"])
    (wt / "src" / "demo.c").write_text((wt / "src" / "demo.c").read_text() + "int hand_edit = 42;\n")
    (wt / "src" / "new_by_hand.c").write_text("int by_hand = 1;\n")
    capsys.readouterr()
    for onto in ("b6", "b5"):
        rc = cli.main(["rebase", "--onto", onto, "--no-build", "--cache-dir", str(rebase_settings.cache_dir)])
        err = capsys.readouterr().err
        assert rc == errors.RebaseInProgress.exit_code == 53, err
        assert "--continue" in err and "--abort" in err and err.count("\n") == 1
        assert "int hand_edit = 42;" in (wt / "src" / "demo.c").read_text()
    # --check writes nothing, so it stays allowed
    assert rebase(rebase_settings, "b5", Options(check=True)).state in ("checked", "conflict")
    assert (
        cli.main(["rebase", "--discard", "--cache-dir", str(rebase_settings.cache_dir)]) == 2
    )  # --discard without --abort
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0
    assert not wt.exists()
    saved = sorted((rebase_project / "build" / "rebase").glob("aborted-*.patch"))
    assert len(saved) == 1
    text = saved[0].read_text()
    assert "+int hand_edit = 42;" in text and "+int by_hand = 1;" in text
    # a new rebase may start now; --abort --discard keeps nothing
    with pytest.raises(RebaseConflict):
        rebase(rebase_settings, "b6", Options(build=False, date=DATE))
    assert cli.main(["rebase", "--abort", "--discard", "--cache-dir", str(rebase_settings.cache_dir)]) == 0
    assert len(list((rebase_project / "build" / "rebase").glob("aborted-*.patch"))) == 1


def test_continue_refuses_a_changed_series(rebase_settings: config.Settings, rebase_project: Path) -> None:
    with pytest.raises(RebaseConflict):
        rebase(rebase_settings, "b6", Options(build=False, date=DATE))
    with open(rebase_project / "patches" / "0002-ggml-cuda-bridge.patch", "a") as fh:
        fh.write("\n")
    fakellama.git(rebase_project, "commit", "-q", "-am", "series changed meanwhile")
    with pytest.raises(UsageError, match="patches/ changed since the rebase stopped"):
        continue_rebase(rebase_settings)


# --------------------------------------------------------------------------------------------- dirty trees


def test_dirty_project_refused_but_check_allowed(rebase_settings: config.Settings, rebase_project: Path) -> None:
    with open(rebase_project / "patches" / "0002-ggml-cuda-bridge.patch", "a") as fh:
        fh.write("\n")
    before = _snapshot(rebase_project)
    rc = cli.main(["rebase", "--onto", "b2", "--no-build", "--cache-dir", str(rebase_settings.cache_dir)])
    assert rc == errors.DirtyProjectError.exit_code == 51
    assert _snapshot(rebase_project) == before
    assert _statuses(_check(rebase_settings, "b2")) == ["clean", "clean"]


def test_dirty_target_checkout(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up, tmp_path: Path
) -> None:
    co = tmp_path / "checkout"
    fakellama.git(tmp_path, "clone", "-q", "-b", "b2", str(rebase_upstream.repo), str(co))
    (co / "src" / "demo.c").write_text("// local edit\n" + DEMO)
    before = _snapshot(rebase_project)
    with pytest.raises(SourceError, match="uncommitted changes"):
        rebase(rebase_settings, str(co), Options(build=False, date=DATE))
    assert _snapshot(rebase_project) == before
    assert _statuses(_check(rebase_settings, str(co))) == ["offsets", "clean"]
    fakellama.git(co, "checkout", "-q", "--", ".")  # clean again: now pinnable by its commit
    rep = rebase(rebase_settings, str(co), Options(build=False, cuda_check=False, date=DATE))
    assert rep.state == "rebased" and pinmod.load(rebase_project / "pin.toml").commit == rebase_upstream.commits["b2"]


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("case", ["unknown-ref", "unreachable", "not-llama", "missing-patch"])
def test_bad_input_one_error_each(
    case: str,
    rebase_settings: config.Settings,
    rebase_project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    onto = {
        "unknown-ref": "b999",
        "unreachable": f"git+http://127.0.0.1:{fakellama.closed_port()}/llama.cpp.git@b1",
        "not-llama": str(tmp_path / "notllama"),
        "missing-patch": "b2",
    }[case]
    (tmp_path / "notllama").mkdir()
    (tmp_path / "notllama" / "README").write_text("hello\n")
    if case == "missing-patch":
        with open(rebase_project / "patches" / "series", "a") as fh:
            fh.write("0003-gone.patch\n")
        fakellama.git(rebase_project, "commit", "-q", "-am", "series names a missing patch")
    before = _snapshot(rebase_project)
    rc = cli.main(["rebase", "--onto", onto, "--no-build", "--cache-dir", str(rebase_settings.cache_dir)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    expected = {
        "unknown-ref": errors.UnknownRefError,
        "unreachable": FetchError,
        "not-llama": SourceError,
        "missing-patch": PatchError,
    }[case]
    assert rc == expected.exit_code, err
    assert err.startswith(f"ggml-bridge: {expected.kind}: "), err
    assert _snapshot(rebase_project) == before


def test_exit_codes_are_distinct() -> None:
    codes = [errors.UnknownRefError, FetchError, SourceError, PatchError, RebaseConflict, errors.DirtyProjectError]
    assert len({c.exit_code for c in codes}) == len(codes)


def test_unknown_registry_version(rebase_settings: config.Settings, rebase_project: Path) -> None:
    srv = fakellama.HTTPFixture().start()
    try:
        s = config.load(
            {
                "cache_dir": str(rebase_settings.cache_dir),
                "project_dir": str(rebase_project),
                "fetch.pypi_url": srv.url,
            },
            env={},
            cwd=rebase_project,
        )
        with pytest.raises(errors.UnknownRefError, match="llama-cpp-python==9.9.9"):
            rebase(s, "llama-cpp-python==9.9.9", Options(check=True))
    finally:
        srv.stop()


# --------------------------------------------------------------------------------------------- registry pin


def test_sdist_target_pins_version_and_sha256(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up, tmp_path: Path
) -> None:
    """A registry sdist (served by a fake PyPI) becomes a pypi-sdist source: version + sha256 are its identity."""
    tree = tmp_path / "b3-tree"
    fakellama.git(tmp_path, "clone", "-q", "-b", "b3", str(rebase_upstream.repo), str(tree))
    sdist = fakellama.make_sdist(
        tree, tmp_path / "fake_llama-3.0.tar.gz", "fake_llama-3.0", rebase_upstream.commits["b3"]
    )
    srv = fakellama.HTTPFixture().start()
    try:
        srv.routes[f"/files/{sdist.name}"] = fakellama.Route(sdist.read_bytes())
        srv.json(
            "/pypi/fake-llama/3.0/json",
            {
                "urls": [
                    {
                        "filename": sdist.name,
                        "packagetype": "sdist",
                        "url": f"{srv.url}/files/{sdist.name}",
                        "digests": {"sha256": fakellama.sha256(sdist)},
                    }
                ]
            },
        )
        s = config.load(
            {
                "cache_dir": str(rebase_settings.cache_dir),
                "project_dir": str(rebase_project),
                "fetch.pypi_url": srv.url,
            },
            env={},
            cwd=rebase_project,
        )
        rep = rebase(s, "fake-llama==3.0", Options(build=False, cuda_check=False, date=DATE))
        assert _statuses(rep) == ["offsets", "clean"]
        pin = pinmod.load(rebase_project / "pin.toml")
        assert pin.commit == rebase_upstream.commits["b3"]
        sd = [x for x in pin.sources if x.kind == "pypi-sdist"]
        assert len(sd) == 1 and (sd[0].version, sd[0].sha256) == ("3.0", fakellama.sha256(sdist))
        assert sd[0].filename == sdist.name and sd[0].subdir == "fake_llama-3.0/vendor/llama.cpp"
        # the local sdist file is recognised the same way
        assert sdist_source(obtain(s, str(sdist), allow_unpinned=True), str(sdist)) == pinmod.SdistSource(
            "fake-llama", "3.0", sdist.name, "fake_llama-3.0/vendor/llama.cpp", fakellama.sha256(sdist)
        )
    finally:
        srv.stop()


# --------------------------------------------------------------------------------------------- CUDA check


@dataclass
class _Cuda:
    nvcc: Path
    root: Path
    version: str
    cublas_header: Path | None


def test_cuda_check_skips_and_compiles(
    rebase_settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rep = _check(rebase_settings, "b2")
    wt = tmp_path / "wt"
    (wt / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    for f in ("bridge.cu", "ggml-cuda.cu"):
        (wt / "ggml" / "src" / "ggml-cuda" / f).write_text("int x;\n")
    monkeypatch.setattr(checks, "_detect_cuda", lambda: None)
    assert cuda_check(wt, rep, []).startswith("skipped: nvcc not found")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/nvcc.args\nexit 0\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(checks, "_detect_cuda", lambda: _Cuda(nvcc, tmp_path, "13.0", None))
    line = cuda_check(wt, rep, [])
    assert line.startswith("skipped: nvcc 13.0") and "cublas_v2.h" in line
    inc = tmp_path / "cublas-inc"
    inc.mkdir()
    (inc / "cublas_v2.h").write_text("")
    line = cuda_check(wt, rep, [inc])
    assert line == "compiled with nvcc 13.0: ggml/src/ggml-cuda/bridge.cu, ggml/src/ggml-cuda/ggml-cuda.cu"
    args = (tmp_path / "nvcc.args").read_text().splitlines()
    assert len(args) == 2 and all(" -c " in f" {a} " and f"-I{inc}" in a and f"-I{wt}/ggml/include" in a for a in args)
    nvcc.write_text("#!/bin/sh\necho 'bridge.cu(1): error: boom' >&2\nexit 2\n")
    assert cuda_check(wt, rep, [inc]).startswith("failed: nvcc -c ggml/src/ggml-cuda/bridge.cu")


def test_write_with_cuda_failure_changes_nothing(
    rebase_settings: config.Settings, rebase_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'error: boom' >&2\nexit 2\n")
    nvcc.chmod(0o755)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "cublas_v2.h").write_text("")
    monkeypatch.setattr(checks, "_detect_cuda", lambda: _Cuda(nvcc, tmp_path, "13.0", inc / "cublas_v2.h"))
    before = _snapshot(rebase_project)
    with pytest.raises(errors.BuildError, match="does not build"):
        rebase(rebase_settings, "b2", Options(build=False, cuda_check=True, date=DATE))
    assert _snapshot(rebase_project) == before
    data = json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())
    assert data["state"] == "build-failed" and data["build"]["cuda"].startswith("failed")


# --------------------------------------------------------------------------------------------- CI script


def _ci(rebase_project: Path, rebase_settings: config.Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_BRIDGE_", "GITHUB_"))}
    env.update(
        GGML_BRIDGE_PROJECT_DIR=str(rebase_project),
        GGML_BRIDGE_CACHE_DIR=str(rebase_settings.cache_dir),
        GGML_BRIDGE_PYTHON=sys.executable,
        PYTHONPATH=str(REPO_ROOT),
        GITHUB_OUTPUT=str(rebase_project.parent / "gh-output"),
    )
    return subprocess.run(
        [str(REPO_ROOT / "ci" / "rebase.sh"), "--report", str(rebase_project.parent / "ci"), *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )


def test_ci_script_success_then_up_to_date(
    rebase_settings: config.Settings, rebase_project: Path, rebase_upstream: Up
) -> None:
    cp = _ci(rebase_project, rebase_settings, "--onto", "b3", "--no-build", "--no-ladder")
    assert cp.returncode == 0, cp.stderr[-3000:]
    rep = rebase_project.parent / "ci"
    assert (rep / "outcome").read_text().strip() == "rebased"
    assert "outcome=rebased" in (rebase_project.parent / "gh-output").read_text()
    assert json.loads((rep / "report.json").read_text())["state"] == "rebased"
    assert pinmod.load(rebase_project / "pin.toml").commit == rebase_upstream.commits["b3"]
    fakellama.git(rebase_project, "commit", "-q", "-am", "rebase onto b3")
    cp = _ci(rebase_project, rebase_settings, "--onto", "b3", "--no-build", "--no-ladder")
    assert cp.returncode == 0 and (rep / "outcome").read_text().strip() == "up-to-date"


def test_ci_script_newest_tag_conflict(rebase_settings: config.Settings, rebase_project: Path) -> None:
    """Without --onto the script takes the newest bNNNN tag of the pinned URL: b6, which conflicts."""
    before = _snapshot(rebase_project)
    cp = _ci(rebase_project, rebase_settings, "--no-build", "--no-ladder")
    assert cp.returncode == 50, cp.stderr[-3000:]
    rep = rebase_project.parent / "ci"
    assert (rep / "target").read_text().strip() == "b6"
    assert (rep / "outcome").read_text().strip() == "conflict"
    assert "conflict" in (rep / "report.md").read_text()
    assert _snapshot(rebase_project) == before


def test_workflow_runs_the_script() -> None:
    wf = (REPO_ROOT / ".github" / "workflows" / "rebase-upstream.yml").read_text()
    assert "schedule:" in wf and "ci/rebase.sh" in wf
    assert "gh pr create" in wf and "gh issue create" in wf
    assert "ladders/cpu.toml" in (REPO_ROOT / "ci" / "rebase.sh").read_text()
    radar_wf = (REPO_ROOT / ".github" / "workflows" / "rebase-radar.yml").read_text()
    assert "schedule:" in radar_wf and "ci/rebase.sh --radar" in radar_wf and "upload-artifact" in radar_wf


# --------------------------------------------------------------------------------------------- stopped rebases


def _stopped_with_hand_edit(rebase_settings: config.Settings, rebase_project: Path, edit: str) -> Path:
    """``rebase --onto b6`` of ``rebase_project`` stopped at its conflict, with a hand edit in its work tree."""
    rc = cli.main(
        ["rebase", "--onto", "b6", "--no-build", "--date", DATE, "--cache-dir", str(rebase_settings.cache_dir)]
    )
    assert rc == RebaseConflict.exit_code
    wt = Path(json.loads((rebase_project / "build" / "rebase" / "report.json").read_text())["worktree"])
    (wt / "src" / "demo.c").write_text((wt / "src" / "demo.c").read_text() + edit)
    return wt


def test_two_clones_sharing_a_cache_keep_their_own_stopped_work_trees(
    rebase_settings: config.Settings, rebase_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two checkouts of the project, one cache, the same target: the second clone's rebase must not replace the
    first one's stopped work tree, and each --abort keeps its own clone's hand edits."""
    other = rebase_project.parent / "other-clone"
    fakellama.git(rebase_project.parent, "clone", "-q", str(rebase_project), str(other))
    a = _stopped_with_hand_edit(rebase_settings, rebase_project, "int edit_of_a = 1;\n")
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(other))
    b = _stopped_with_hand_edit(rebase_settings, other, "int edit_of_b = 2;\n")
    assert a != b
    assert "edit_of_a" in (a / "src" / "demo.c").read_text() and "edit_of_b" not in (a / "src" / "demo.c").read_text()
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0  # B's
    saved_b = (other / "build" / "rebase").glob("aborted-*.patch")
    assert "+int edit_of_b = 2;" in next(saved_b).read_text() and not b.exists() and a.is_dir()
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(rebase_project))
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0  # A's
    text = next((rebase_project / "build" / "rebase").glob("aborted-*.patch")).read_text()
    assert "+int edit_of_a = 1;" in text and "edit_of_b" not in text and not a.exists()


def test_a_second_rebase_of_one_project_is_refused_while_the_first_runs(
    rebase_settings: config.Settings,
    rebase_project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two rebases of one project at once (two terminals) would both write its state and work tree: the second
    is refused at once (exit 53), the first finishes."""
    import threading

    from ggml_bridge.upstream.rebase import job

    started, release = threading.Event(), threading.Event()
    real = job.provide_preimages

    def slow_preimages(*a, **kw):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(60)
        return real(*a, **kw)

    monkeypatch.setattr(job, "provide_preimages", slow_preimages)
    outcome: list[object] = []

    def first() -> None:
        try:
            rebase(rebase_settings, "b6", Options(build=False, date=DATE))
        except Exception as e:  # noqa: BLE001 - the conflict it stops at
            outcome.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(60)
        monkeypatch.setattr(job, "provide_preimages", real)
        rc = cli.main(["rebase", "--onto", "b6", "--no-build", "--cache-dir", str(rebase_settings.cache_dir)])
        err = capsys.readouterr().err
    finally:
        release.set()
        t.join(60)
    assert rc == errors.RebaseInProgress.exit_code, err
    assert "is running" in err
    assert isinstance(outcome[0], RebaseConflict)


@pytest.mark.parametrize(
    "damage", [b'{"onto": "b6", "worktr', b"[]", b'{"onto": 5}'], ids=["truncated", "list", "shape"]
)
def test_a_damaged_rebase_state_is_no_dead_end(
    rebase_settings: config.Settings, rebase_project: Path, damage: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged state file: --continue and --onto say so and point at --abort, which keeps the work tree's hand
    edits (found without the state) and clears the rebase; then a new one may start."""
    wt = _stopped_with_hand_edit(rebase_settings, rebase_project, "int kept_by_abort = 3;\n")
    state = next(rebase_settings.layout.rebase.glob("state-*.json"))
    state.write_bytes(damage)
    capsys.readouterr()
    assert cli.main(["rebase", "--continue", "--cache-dir", str(rebase_settings.cache_dir)]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and "--abort" in err and "Traceback" not in err, err
    assert cli.main(["rebase", "--onto", "b6", "--no-build", "--cache-dir", str(rebase_settings.cache_dir)]) == 53
    err = capsys.readouterr().err
    assert "damaged" in err and "onto ?" not in err, err
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0, capsys.readouterr().err
    assert "+int kept_by_abort = 3;" in next((rebase_project / "build" / "rebase").glob("aborted-*.patch")).read_text()
    assert not wt.exists() and not state.exists()
    with pytest.raises(RebaseConflict):  # a new rebase starts
        rebase(rebase_settings, "b6", Options(build=False, date=DATE))


def test_another_user_of_the_same_checkout_cannot_touch_a_stopped_rebase(
    rebase_settings: config.Settings,
    rebase_project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One checkout, one cache, two users: the second user's --abort must not drop (nor --continue pick up) the
    first user's stopped work tree. (The real second user: test_disks_and_users.py.)"""
    wt = _stopped_with_hand_edit(rebase_settings, rebase_project, "int edit_of_a = 1;\n")
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    capsys.readouterr()
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 2
    assert "no stopped rebase" in capsys.readouterr().err
    assert "int edit_of_a = 1;" in (wt / "src" / "demo.c").read_text()
    monkeypatch.undo()
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(rebase_project))
    monkeypatch.setenv("GGML_BRIDGE_CACHE_DIR", str(rebase_settings.cache_dir))
    assert cli.main(["rebase", "--abort", "--cache-dir", str(rebase_settings.cache_dir)]) == 0 and not wt.exists()
