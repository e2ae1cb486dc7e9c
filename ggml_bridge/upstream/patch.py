"""Apply the patch series (``patches/series``, git format-patch files) onto a git work tree of the upstream tree.

The work tree is a git repository made from the cached pristine tree (one commit ``upstream <commit>`` with a
fixed identity and date, so it is reproducible); each patch is applied with ``git am --3way --keep-cr`` and
becomes a commit. Work trees live in ``<cache>/work/<tree key>-<series hash>/`` (``src/`` + ``patched.json``),
assembled in ``<cache>/tmp`` and renamed into place only when every patch applied: a tree whose series failed is
never marked as patched. Re-running with an unchanged series does nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..foundations import cache, files, gitrepo
from ..foundations.config import Settings
from ..foundations.errors import PatchError, WorkTreeModified, os_reason
from ..foundations.runner import log, step
from ..foundations.tomlfile import Key
from .fetch.tree import Tree

#: Identity and date of every commit we make, so the same inputs give the same commit ids.
GIT_IDENTITY = gitrepo.IDENTITY
_GIT_CONFIG = {
    ("user", "name"): "ggml-bridge",
    ("user", "email"): "ggml-bridge@localhost",
    ("core", "autocrlf"): "false",
    ("core", "filemode"): "true",
    ("gc", "auto"): "0",
    ("maintenance", "auto"): "false",  # no `git maintenance run --auto` process after each `git am`
    ("commit", "gpgsign"): "false",
    ("am", "threeWay"): "true",
}
CONFLICT_LINE = re.compile(
    r"(patch failed|CONFLICT|does not exist in index|does not apply|fake ancestor|already exists|corrupt patch"
    r"|Patch format detection failed|Failed to merge|lacking or useless|No such file)",
)
MARKER = "patched.json"


@dataclass(frozen=True)
class PatchFile:
    name: str
    """File name as listed in patches/series."""
    path: Path
    sha256: str


@dataclass(frozen=True)
class Series:
    """The ordered patch series; its ``hash`` keys patched trees and builds."""

    patches: tuple[PatchFile, ...]
    hash: str
    """sha256 over "<name> <sha256>" lines, in order (so renaming, reordering or editing a patch changes it)."""

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.patches]


@dataclass(frozen=True)
class PatchedTree:
    path: Path
    """The patched git work tree (read-only by convention)."""
    base: Tree
    series: Series
    head: str
    """Commit id of the last applied patch (or of the upstream commit for an empty series)."""
    key: str


@dataclass
class PatchResult:
    name: str
    status: str
    """applied, failed or not tried."""
    detail: list[str] = field(default_factory=list)
    """For a failure: the files/hunks in conflict and git's error lines."""


@dataclass
class CheckReport:
    base: str
    series_hash: str
    results: list[PatchResult]

    @property
    def ok(self) -> bool:
        return all(r.status == "applied" for r in self.results)

    def render(self) -> str:
        lines = [f"series {self.series_hash[:12]} onto {self.base}: {len(self.results)} patch(es)"]
        for r in self.results:
            lines.append(f"  {r.status:<9} {r.name}")
            lines.extend(f"            {d}" for d in r.detail)
        lines.append("all patches apply" if self.ok else "the series does NOT apply")
        return "\n".join(lines)


def read_series(patches_dir: Path) -> Series:
    """Read ``patches_dir/series`` (names in order, ``#`` comments), or take ``*.patch`` in numeric order."""
    series_file = patches_dir / "series"
    if series_file.exists() and not series_file.is_file():  # never silently the *.patch files instead
        raise PatchError(
            f"{series_file} is a folder, not a file",
            fix="restore patches/series (git checkout -- patches/series): one patch file name per line",
        )
    if series_file.is_file():
        names = series_names(patches_dir)
        missing = [n for n in names if not (patches_dir / n).is_file()]
        if missing:
            raise PatchError(
                f"{series_file} lists {', '.join(missing)}, which do not exist in {patches_dir}",
                fix="add the files or fix the series file",
            )
        unlisted = sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in names)
        if unlisted:
            log(f"warning: {', '.join(unlisted)} in {patches_dir} not listed in series; ignored")
    elif patches_dir.is_dir():
        names = sorted((p.name for p in patches_dir.glob("*.patch")), key=_natural_key)
    else:
        names = []
    patches = tuple(PatchFile(n, patches_dir / n, _patch_sha256(patches_dir / n)) for n in names)
    h = hashlib.sha256("".join(f"{p.name} {p.sha256}\n" for p in patches).encode())
    return Series(patches, h.hexdigest())


def _patch_sha256(path: Path) -> str:
    try:
        return cache.file_sha256(path)
    except OSError as e:
        raise PatchError(f"cannot read the patch {path}", why=os_reason(e), fix="fix its permissions") from None


def series_names(patches_dir: Path) -> list[str]:
    """The names ``patches_dir/series`` lists, in order (``#`` comments dropped; the files need not exist yet)."""
    series_file = patches_dir / "series"
    names = []
    for raw in _series_lines(series_file):
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line)
    odd = [n for n in names if "/" in n or "\0" in n or n in (".", "..")]
    if odd:
        raise PatchError(
            f"{series_file} lists {odd[0]!r}, which is not a file name in {patches_dir}",
            fix="list the patch files of that folder by name, one per line",
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PatchError(f"{series_file} lists {', '.join(dupes)} more than once", fix="list each patch once")
    return names


def _series_lines(series_file: Path) -> list[str]:
    """The lines of ``patches/series``; PatchError when it is not UTF-8 text or cannot be read."""
    try:
        return series_file.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PatchError(
            f"{series_file} is not UTF-8 text",
            why=f"byte {e.start}: {e.reason}",
            fix="list one patch file name per line (restore it with git checkout -- patches/series)",
        ) from None
    except OSError as e:
        raise PatchError(f"cannot read {series_file}", why=os_reason(e)) from None


def work_key(tree: Tree, series: Series) -> str:
    return f"{tree.key}-{series.hash[:16]}"


def apply_series(
    settings: Settings, tree: Tree, series: Series | None = None, *, discard_changes: bool = False
) -> PatchedTree:
    """The patched work tree for (``tree``, ``series``): reused if already made, else created in the cache.

    A work tree holding edits (changed, untracked or committed files) is never deleted silently: that is a
    :class:`WorkTreeModified` error naming the files, unless ``discard_changes``."""
    series = series if series is not None else read_series(settings.patches_dir)
    _require_patches(series, settings.patches_dir)
    key = work_key(tree, series)
    final = settings.layout.work_tree(key)
    existing = _load_existing(final, tree, series)
    if existing is not None:
        log(f"patch series {series.hash[:12]} ({len(series.patches)} patch(es)) already applied: {existing.path}")
        return existing
    if final.exists():
        _clear_work_tree(final, series, discard_changes)
    with step(f"apply {len(series.patches)} patch(es) (series {series.hash[:12]}) onto {tree.commit_or_id[:12]}"):
        with cache.staging(settings.layout, "work") as stage:
            report, head = _apply_into(stage / "src", tree, series)
            if not report.ok:
                raise _failure(report)
            marker = {
                "tree_key": tree.key,
                "upstream": tree.commit_or_id,
                "origin": tree.origin,
                "series_hash": series.hash,
                "head": head,
                "patches": [{"name": p.name, "sha256": p.sha256} for p in series.patches],
            }
            (stage / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            cache.publish_dir(stage, final)
    for r in report.results:
        log(f"    applied {r.name}")
    return PatchedTree(final / "src", tree, series, head, key)


def check_series(settings: Settings, tree: Tree, series: Series | None = None) -> CheckReport:
    """Apply the series in a throwaway copy and report per patch; writes nothing to the cache."""
    series = series if series is not None else read_series(settings.patches_dir)
    _require_patches(series, settings.patches_dir)
    with step(f"check {len(series.patches)} patch(es) (series {series.hash[:12]}) against {tree.commit_or_id[:12]}"):
        with tempfile.TemporaryDirectory(prefix="ggml-bridge-check-") as tmp:
            report, _ = _apply_into(Path(tmp) / "src", tree, series)
    return report


def init_upstream_repo(dest: Path, tree: Tree) -> str:
    """Copy ``tree`` to ``dest`` and make it a git repo with one reproducible commit ``upstream <id>``."""
    shutil.copytree(tree.path, dest, symlinks=True)
    with contextlib.closing(gitrepo.init(dest, initial_branch="main")) as repo, repo.config_writer() as cw:
        for (section, option), value in _GIT_CONFIG.items():
            cw.set_value(section, option, value)
    gitrepo.run(dest, "add", "-A", "--force", error=PatchError)
    message = ["-m", f"upstream {tree.commit_or_id}", "-m", f"origin: {tree.origin}"]
    gitrepo.run(dest, "commit", "-q", "--no-verify", "--allow-empty", *message, env=GIT_IDENTITY, error=PatchError)
    return gitrepo.run(dest, "rev-parse", "HEAD", error=PatchError).stdout.strip()


def _apply_into(dest: Path, tree: Tree, series: Series) -> tuple[CheckReport, str]:
    init_upstream_repo(dest, tree)
    report = CheckReport(tree.commit_or_id, series.hash, [PatchResult(p.name, "not tried") for p in series.patches])
    for patch, result in zip(series.patches, report.results, strict=True):
        am = ("am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(patch.path))
        res = gitrepo.run(dest, *am, check=False, env=GIT_IDENTITY)
        if res.returncode != 0:
            result.status = "failed"
            result.detail = _conflict_details(dest, res.stdout + "\n" + res.stderr)
            gitrepo.run(dest, "am", "--abort", check=False)
            break
        result.status = "applied"
    return report, gitrepo.run(dest, "rev-parse", "HEAD", error=PatchError).stdout.strip()


def _conflict_details(wt: Path, out: str) -> list[str]:
    """The files in conflict and the hunks that fail (git's own lines) after ``git am`` stopped in ``wt``."""
    detail: list[str] = []
    unmerged = gitrepo.run(wt, "diff", "--name-only", "--diff-filter=U", check=False).stdout
    for f in unmerged.splitlines():
        if f:
            detail.append(f"conflict in {f}")
    # which hunks fail to apply plainly (file:line), from the patch git am stopped at
    failed_patch = wt / ".git" / "rebase-apply" / "patch"
    if failed_patch.is_file():
        check = gitrepo.run(wt, "apply", "--check", "--verbose", str(failed_patch), check=False)
        out += "\n" + check.stderr
    for line in out.splitlines():
        line = line.strip().strip("'").strip()
        if CONFLICT_LINE.search(line) and line not in detail:
            detail.append(line)
    if not detail:
        detail = [line.strip() for line in out.splitlines() if line.strip()][-5:]
    return detail


def _failure(report: CheckReport) -> PatchError:
    bad = next(r for r in report.results if r.status == "failed")
    return PatchError(
        f"patch {bad.name} does not apply onto {report.base[:12]}",
        why="\n    " + "\n    ".join(bad.detail or ["git am failed"]),
        fix="rebase the patch onto this upstream (git am --3way, resolve, git format-patch), "
        "then re-run; `ggml-bridge patch --check` shows the whole series",
    )


def _require_patches(series: Series, patches_dir: Path) -> None:
    if not series.patches:
        raise PatchError(
            f"the patch series in {patches_dir} is empty",
            why="patches/series lists no patch (or is missing and there is no *.patch); a patched "
            "build without patches would pass for one",
            fix="restore patches/ (e.g. git checkout patches), or build --variant upstream",
        )


class TreeUnreadable(Exception):
    """git cannot read a work tree (no ``.git``, a damaged HEAD or index, another user's tree): nobody can tell
    whether it holds edits."""


def _clear_work_tree(final: Path, series: Series, discard_changes: bool) -> None:
    """Delete the work tree ``final`` so that it can be made again, unless it may hold the user's edits: those (and
    a tree whose state cannot be read) are a :class:`WorkTreeModified` naming them, unless ``discard_changes``."""
    keep = "nothing was deleted; copy what you want to keep elsewhere"
    try:
        changed = local_changes(final, series)
    except TreeUnreadable as e:
        if not discard_changes:
            raise WorkTreeModified(
                f"cannot tell whether the patched work tree {final / 'src'} holds edits",
                why=f"git cannot read it: {e}",
                fix=f"{keep} (or repair it: git -C {final / 'src'} status), then re-run with --discard-changes "
                "(`ggml-bridge patch --discard-changes`) to delete it",
            ) from None
        changed = ["(a work tree git cannot read)"]
    if changed and not discard_changes:
        shown = changed[:20] + ([f"... and {len(changed) - 20} more"] if len(changed) > 20 else [])
        raise WorkTreeModified(
            f"the patched work tree {final / 'src'} has local changes",
            why="changed: " + ", ".join(shown) + "; it would have to be re-created from the series",
            fix="move your edits into a patch (git format-patch) or copy them elsewhere, then re-run with "
            "--discard-changes (`ggml-bridge patch --discard-changes`) to delete them",
        )
    log(f"discarding {'modified' if changed else 'stale'} work tree {final}")
    shutil.rmtree(final)


def local_changes(final: Path, series: Series) -> list[str]:
    """Files of the work tree ``final/src`` that differ from what the series made: modified, deleted or untracked
    files, and files touched by commits added after the series' head (without our marker: commits beyond the
    series' count). [] for a tree without ``src/`` (a half-made one: nothing of the user's). Raises
    :class:`TreeUnreadable` when git cannot read the tree: it may hold edits nobody can list."""
    if not (final / "src").exists():
        return []
    marker = files.read_record(final / MARKER, shape={"head": Key("str")})
    head = marker.get("head") if marker else None
    try:
        repo = gitrepo.open_repo(final / "src")
    except gitrepo.NotARepository as e:
        raise TreeUnreadable(f"it is not a git repository ({e}: .git missing or damaged)") from None
    try:
        now = gitrepo.head(repo)
        if now is None:
            raise TreeUnreadable("its HEAD names no commit")
        changed = [
            line[3:]
            for line in repo.git.status("--porcelain", "--untracked-files=all", "--no-renames").splitlines()
            if line.strip()
        ]
        if head and now != head:
            with contextlib.suppress(gitrepo.GitFailed):
                changed += [f for f in repo.git.diff("--name-only", head, "HEAD").splitlines() if f]
            changed.append(f"(HEAD moved from {head[:12]} to {now[:12]})")
        elif not head and int(repo.git.rev_list("--count", "HEAD")) != len(series.patches) + 1:
            changed.append(f"(commits past the series: {repo.git.rev_list('--count', 'HEAD')} in all)")
    except gitrepo.GitFailed as e:
        raise TreeUnreadable(e.said) from None
    except (ValueError, OSError) as e:  # GitPython reading a damaged object or ref
        raise TreeUnreadable(f"{type(e).__name__}: {e}") from None
    finally:
        repo.close()
    return list(dict.fromkeys(changed))


def _load_existing(final: Path, tree: Tree, series: Series) -> PatchedTree | None:
    marker = files.read_record(final / MARKER, shape={"series_hash": Key("str"), "tree_key": Key("str")})
    if marker is None or marker.get("series_hash") != series.hash or marker.get("tree_key") != tree.key:
        return None
    try:
        with gitrepo.opened(final / "src") as repo:
            clean = gitrepo.head(repo) == marker.get("head") and not gitrepo.is_dirty(repo)
    except (gitrepo.NotARepository, gitrepo.GitFailed, ValueError, OSError):
        return None  # not reusable as it is: _clear_work_tree decides what may be deleted
    if not clean:
        return None
    return PatchedTree(final / "src", tree, series, marker["head"], final.name)


def _natural_key(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


_LAST_UPDATE_RE = re.compile(r"^Last-Update: .*$", re.M)
#: git without the user's or the system's configuration (format-patch output must not depend on them)
GIT_PLAIN = gitrepo.PLAIN


def format_series(wt: Path, base: str, names: list[str], dest: Path, date: str | None = None) -> None:
    """The series' format: ``git format-patch --zero-commit --no-signature --no-numbered`` of every commit of the
    work tree ``wt`` after ``base``, written into ``dest`` under ``names`` (one per commit, in order); with ``date``,
    each patch's ``Last-Update:`` line set to it. The one place the series is written from commits (``rebase``,
    ``patch --export``)."""
    out = Path(tempfile.mkdtemp(prefix="fp-", dir=wt.parent))
    try:
        gitrepo.run(
            wt,
            *("-c", "core.abbrev=7", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false"),
            *("format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "--no-notes"),
            *("--no-cover-letter", "-o", str(out), f"{base}..HEAD"),
            env=GIT_PLAIN,
            error=PatchError,
            what=f"git format-patch {base}..HEAD failed in {wt}",
        )
        files = sorted(out.glob("*.patch"))
        if len(files) != len(names):
            raise PatchError(
                f"{wt} has {len(files)} commit(s) after {base}, the series names {len(names)} patch(es)",
                fix="one commit per patch of the series, in its order (git rebase -i to squash or split)",
            )
        dest.mkdir(parents=True, exist_ok=True)
        for f, name in zip(files, names, strict=True):
            text = f.read_text()
            body_end = text.find("\n---\n")
            head, rest = (text[:body_end], text[body_end:]) if body_end >= 0 else (text, "")
            if date is not None and _LAST_UPDATE_RE.search(head):
                head = _LAST_UPDATE_RE.sub(f"Last-Update: {date}", head, count=1)
            (dest / name).write_text(head + rest)
    finally:
        shutil.rmtree(out, ignore_errors=True)
