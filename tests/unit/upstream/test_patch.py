from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest

from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import PatchError, WorkTreeModified
from ggml_bridge.upstream import patch
from ggml_bridge.upstream.fetch.resolve import obtain
from ggml_bridge.upstream.fetch.tree import Tree

from conftest import FakeUpstream


def _add_conflict(settings: config.Settings, upstream: FakeUpstream) -> str:
    name = upstream.patches.conflicting.name
    shutil.copy(upstream.patches.conflicting, settings.patches_dir / name)
    with open(settings.patches_dir / "series", "a") as fh:
        fh.write(f"# the next one conflicts with 0001\n{name}\n")
    return name


def test_read_series_follows_series_file(tmp_path: Path) -> None:
    for n in ("0001-a.patch", "0002-b.patch"):
        (tmp_path / n).write_text(n)
    (tmp_path / "series").write_text("# order\n0002-b.patch\n\n0001-a.patch  # first really\n")
    s = patch.read_series(tmp_path)
    assert s.names == ["0002-b.patch", "0001-a.patch"]
    (tmp_path / "series").write_text("0001-a.patch\n0002-b.patch\n")
    assert patch.read_series(tmp_path).hash != s.hash, "order is part of the series hash"


def test_read_series_without_series_file_uses_numeric_order(tmp_path: Path) -> None:
    for n in ("10-late.patch", "2-early.patch", "notes.txt"):
        (tmp_path / n).write_text(n)
    assert patch.read_series(tmp_path).names == ["2-early.patch", "10-late.patch"]


def test_read_series_missing_dir_is_empty(tmp_path: Path) -> None:
    s = patch.read_series(tmp_path / "none")
    assert s.names == [] and len(s.hash) == 64


def test_series_listing_missing_or_duplicate_patch(tmp_path: Path) -> None:
    (tmp_path / "0001-a.patch").write_text("a")
    (tmp_path / "series").write_text("0001-a.patch\n0002-gone.patch\n")
    with pytest.raises(PatchError, match="0002-gone.patch"):
        patch.read_series(tmp_path)
    (tmp_path / "series").write_text("0001-a.patch\n0001-a.patch\n")
    with pytest.raises(PatchError, match="more than once"):
        patch.read_series(tmp_path)


def test_series_hash_changes_with_content(tmp_path: Path) -> None:
    (tmp_path / "0001-a.patch").write_text("a")
    h1 = patch.read_series(tmp_path).hash
    (tmp_path / "0001-a.patch").write_text("b")
    assert patch.read_series(tmp_path).hash != h1


def test_apply_series_makes_one_commit_per_patch(settings: config.Settings, upstream: FakeUpstream) -> None:
    tree = obtain(settings)
    p = patch.apply_series(settings, tree)
    repo = git.Repo(p.path)
    subjects = [c.summary for c in repo.iter_commits()]
    assert subjects == ["add extra source", "bump version number", f"upstream {upstream.commit}"]
    assert "= 2;" in (p.path / "src" / "llama.cpp").read_text()
    assert (p.path / "src" / "extra.c").is_file()
    assert not repo.is_dirty(untracked_files=True)
    assert p.head == repo.head.commit.hexsha
    marker = (p.path.parent / patch.MARKER).read_text()
    assert p.series.hash in marker
    # the pristine tree is untouched
    assert "= 1;" in (tree.path / "src" / "llama.cpp").read_text()


def test_apply_is_reproducible(make_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    heads = set()
    for i in range(2):
        s = make_settings(cache_dir=str(tmp_path / f"cache{i}"))
        heads.add(patch.apply_series(s, obtain(s)).head)
    assert len(heads) == 1


def test_rerun_with_unchanged_series_does_nothing(settings: config.Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = obtain(settings)
    first = patch.apply_series(settings, tree)
    monkeypatch.setattr(patch, "_apply_into", lambda *a: pytest.fail("re-applied an unchanged series"))
    assert patch.apply_series(settings, tree) == first


def test_changed_series_gets_a_new_work_tree(settings: config.Settings) -> None:
    tree = obtain(settings)
    first = patch.apply_series(settings, tree)
    (settings.patches_dir / "series").write_text((settings.patches_dir / "series").read_text().splitlines()[0] + "\n")
    second = patch.apply_series(settings, tree)
    assert second.path != first.path and second.series.hash != first.series.hash
    assert not (second.path / "src" / "extra.c").exists()


def test_modified_work_tree_is_refused_until_discarded(settings: config.Settings) -> None:
    tree = obtain(settings)
    first = patch.apply_series(settings, tree)
    (first.path / "src" / "llama.cpp").write_text("scribbled\n")
    (first.path / "NOTES.md").write_text("my notes\n")
    with pytest.raises(WorkTreeModified) as e:
        patch.apply_series(settings, tree)
    msg = str(e.value)
    assert e.value.exit_code == 21 and "src/llama.cpp" in msg and "NOTES.md" in msg and "--discard-changes" in msg
    assert (first.path / "NOTES.md").read_text() == "my notes\n", "nothing deleted"
    again = patch.apply_series(settings, tree, discard_changes=True)
    assert "= 2;" in (again.path / "src" / "llama.cpp").read_text() and not (again.path / "NOTES.md").exists()


def test_commit_added_in_the_work_tree_is_refused(settings: config.Settings) -> None:
    tree = obtain(settings)
    first = patch.apply_series(settings, tree)
    repo = git.Repo(first.path)
    (first.path / "new.c").write_text("int n;\n")
    repo.git.add("new.c")
    repo.git.commit("-q", "-m", "mine")
    with pytest.raises(WorkTreeModified, match=r"new\.c.*HEAD moved"):
        patch.apply_series(settings, tree)


def test_stale_work_tree_without_marker_is_recreated(settings: config.Settings) -> None:
    tree = obtain(settings)
    first = patch.apply_series(settings, tree)
    (first.path.parent / patch.MARKER).unlink()  # e.g. left by an older version: not ours to keep
    again = patch.apply_series(settings, tree)
    assert (again.path.parent / patch.MARKER).is_file()


def test_conflicting_patch_is_reported_and_not_marked(settings: config.Settings, upstream: FakeUpstream) -> None:
    name = _add_conflict(settings, upstream)
    tree = obtain(settings)
    with pytest.raises(PatchError) as e:
        patch.apply_series(settings, tree)
    msg = str(e.value)
    assert name in msg and "src/llama.cpp" in msg
    assert e.value.exit_code == 20
    work = settings.layout.work
    assert not work.exists() or not any(work.iterdir()), "a failed series must not leave a patched tree"
    assert not any(settings.layout.tmp.iterdir())


def test_patch_that_cannot_apply_at_all(settings: config.Settings) -> None:
    bad = settings.patches_dir / "0009-bogus.patch"
    bad.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: X <x@y>\nDate: Thu, 1 Jan 2000 00:00:00 +0000\nSubject: [PATCH] bogus\n\n---\n"
        "diff --git a/nope.c b/nope.c\nindex 1111111..2222222 100644\n--- a/nope.c\n+++ b/nope.c\n"
        "@@ -1 +1 @@\n-a\n+b\n"
    )
    (settings.patches_dir / "series").write_text(bad.name + "\n")
    with pytest.raises(PatchError, match="0009-bogus.patch") as e:
        patch.apply_series(settings, obtain(settings))
    assert "nope.c" in str(e.value)


def test_check_reports_without_writing(settings: config.Settings, upstream: FakeUpstream) -> None:
    tree = obtain(settings)
    ok = patch.check_series(settings, tree)
    assert ok.ok and [r.status for r in ok.results] == ["applied", "applied"]
    name = _add_conflict(settings, upstream)
    # a fourth patch after the conflict is "not tried"
    extra = settings.patches_dir / "0004-after.patch"
    shutil.copy(upstream.patches.series[1], extra)
    with open(settings.patches_dir / "series", "a") as fh:
        fh.write("0004-after.patch\n")
    report = patch.check_series(settings, tree)
    assert not report.ok
    assert [r.status for r in report.results] == ["applied", "applied", "failed", "not tried"]
    text = report.render()
    assert name in text and "src/llama.cpp" in text and "does NOT apply" in text
    assert not settings.layout.work.exists()


@pytest.mark.parametrize("how", ["empty series", "no series, no patches"])
def test_empty_series_is_an_error(settings: config.Settings, how: str) -> None:
    if how == "empty series":
        (settings.patches_dir / "series").write_text("# nothing\n")
    else:
        shutil.rmtree(settings.patches_dir)
    tree = obtain(settings)
    for attempt in (patch.apply_series, patch.check_series):
        with pytest.raises(PatchError, match="is empty") as e:
            attempt(settings, tree)
        assert e.value.exit_code == 20 and "--variant upstream" in str(e.value)
    assert not settings.layout.work.exists()


def test_patch_export_writes_a_work_tree_back_as_the_series(tmp_path: Path, monkeypatch, capsys) -> None:
    """``ggml-bridge patch --export WORKTREE``: one commit per patch after the root (or --base), format-patch'd
    under the series' names; a count that does not match writes nothing."""
    from ggml_bridge import cli

    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "pin.toml").write_text("")
    (proj / "patches" / "series").write_text("0001-one.patch\n0002-two.patch\n")
    wt = tmp_path / "wt"
    repo = git.Repo.init(wt)
    with repo.config_writer() as c:
        c.set_value("user", "name", "t").set_value("user", "email", "t@t")
    for i, text in enumerate(["base\n", "one\n", "two\n"]):
        (wt / "f.txt").write_text(text)
        repo.index.add(["f.txt"])
        repo.index.commit(f"commit {i}")
    repo.close()
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(proj))
    assert cli.main(["patch", "--export", str(wt)]) == 0
    assert capsys.readouterr().out.strip() == str(proj / "patches")
    one = (proj / "patches" / "0001-one.patch").read_text()
    assert one.startswith("From 0000000000000000000000000000000000000000") and "-base\n+one" in one
    assert "Subject: [PATCH] commit 1" in one and "-one\n+two" in (proj / "patches" / "0002-two.patch").read_text()
    assert patch.read_series(proj / "patches").names == ["0001-one.patch", "0002-two.patch"]
    (proj / "patches" / "series").write_text("0001-one.patch\n")
    assert cli.main(["patch", "--export", str(wt)]) == PatchError.exit_code
    assert "has 2 commit(s) after" in capsys.readouterr().err
    base = git.Repo(wt).git.rev_parse("HEAD~1")
    assert cli.main(["patch", "--export", str(wt), "--base", base]) == 0
    assert "-one\n+two" in (proj / "patches" / "0001-one.patch").read_text()


# --------------------------------------------------------------------------------------------- a tree git cannot read


def _hand_edited(settings: config.Settings) -> tuple[Tree, Path]:
    """The patched work tree with an edit to CMakeLists.txt and an untracked notes file, as a user leaves it."""
    tree = obtain(settings)
    wt = patch.apply_series(settings, tree).path
    (wt / "CMakeLists.txt").write_text((wt / "CMakeLists.txt").read_text() + "# my edit\n")
    (wt / "NOTES.md").write_text("my notes\n")
    return tree, wt


def _damage_head(wt: Path) -> None:
    (wt / ".git" / "HEAD").write_bytes(b"\0garbage")


def _damage_index(wt: Path) -> None:
    index = wt / ".git" / "index"
    index.write_bytes(index.read_bytes()[:40])


def _remove_git(wt: Path) -> None:
    shutil.rmtree(wt / ".git")


@pytest.mark.parametrize("damage", [_damage_head, _damage_index, _remove_git], ids=["head", "index", "no-git"])
def test_a_work_tree_whose_state_cannot_be_read_is_kept(settings: config.Settings, damage) -> None:  # type: ignore[no-untyped-def]
    """A work tree git cannot read may hold edits nobody can list: it is refused (exit 21, how to keep or discard it),
    never deleted as "stale"; --discard-changes still deletes it."""
    tree, wt = _hand_edited(settings)
    damage(wt)
    with pytest.raises(WorkTreeModified) as e:
        patch.apply_series(settings, tree)
    msg = str(e.value)  # (git reads a truncated index as an empty one: then every file is listed as changed)
    assert e.value.exit_code == 21 and ("cannot tell" in msg or "NOTES.md" in msg) and "--discard-changes" in msg, msg
    assert (wt / "NOTES.md").read_text() == "my notes\n" and "# my edit" in (wt / "CMakeLists.txt").read_text()
    again = patch.apply_series(settings, tree, discard_changes=True)
    assert not (again.path / "NOTES.md").exists()
