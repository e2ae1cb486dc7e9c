"""``ggml-bridge rebase``: the command, the job (check or rebase), ``--continue`` / ``--abort`` and the
hand-off of a work tree stopped at a conflict.

The rebase job as a state machine (check, rebase, stop at a conflict, --continue, --abort) with the state file and
the hand-off of a stopped work tree; what must hold before a rebase starts is rebase.preconditions; probing, series
regeneration, the build checks and the report are rebase.probe, rebase.series, rebase.checks and rebase.report.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from ...foundations import cache, files
from ...foundations.config import Settings
from ...foundations.errors import BuildError, CacheError, RebaseConflict, SourceError, UsageError
from ...foundations.runner import log, step
from .. import patch as patchmod
from .. import pin as pinmod
from ..fetch.registry import Build
from . import state as statemod
from .preconditions import obtain_target, require_clean_checkout, require_clean_project
from .probe import am_3way, apply_all, apply_one, provide_preimages, run_git, subject, touched
from .report import Options, PatchOutcome, RebaseReport, report_from_json, write_report
from .series import Rebased, build_number, write_series_and_pin


@dataclasses.dataclass(frozen=True)
class RebaseRequest:
    """What ``ggml-bridge rebase`` was asked: rebase or check ``onto`` a target (with ``options``), ``--continue``
    a stopped rebase, or ``--abort`` it (``discard``: without keeping its changes)."""

    onto: str | None = None
    cont: bool = False
    abort: bool = False
    discard: bool = False
    json: bool = False
    options: Options = dataclasses.field(default_factory=Options)


def run(args: RebaseRequest, settings: Settings) -> int:
    if args.discard and not args.abort:
        raise UsageError("--discard goes with --abort", fix="ggml-bridge rebase --abort --discard")
    if args.options.report_dir is not None:  # a folder that cannot take the report is refused before any work
        report_dir = files.output_dir(args.options.report_dir, "--report")
        args = dataclasses.replace(args, options=dataclasses.replace(args.options, report_dir=report_dir))
    if args.abort:
        abort(settings, keep=not args.discard)
        return 0
    if args.cont:
        try:
            report = continue_rebase(settings)
        except (RebaseConflict, BuildError) as e:
            _print(getattr(e, "report", None), args.json)
            raise
        _print(report, args.json)
        return 0
    opts = dataclasses.replace(args.options, cuda_include=[*settings.rebase.cuda_include, *args.options.cuda_include])
    if args.onto is None:
        raise UsageError("rebase needs --onto, --continue or --abort", fix="ggml-bridge rebase --onto REF")
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


def rebase(settings: Settings, onto: str | Build, opts: Options | None = None) -> RebaseReport:
    """Check (``opts.check``) or perform the rebase; returns the report or raises (nothing changed then).

    ``onto``: a source spec, or a registry build the caller has listed already (the radar: its tree is fetched
    without asking the registry for the listing again)."""
    opts = dataclasses.replace(opts or Options())
    if opts.report_dir is None and not opts.check:
        opts.report_dir = settings.project_dir / "build" / "rebase"
    if isinstance(onto, str):
        onto = onto.strip()
    if not onto:
        raise UsageError("--onto needs a ref or source")
    date = _date(opts.date)
    if opts.commit is not None and not re.fullmatch(r"[0-9a-f]{40}", opts.commit.lower()):
        raise UsageError(f"--commit {opts.commit!r} is not a 40-digit hex commit")
    pin = pinmod.load(settings.pin_file)
    series = patchmod.read_series(settings.patches_dir)  # PatchError: a series naming a missing patch
    if opts.check:
        return _rebase(settings, onto, opts, pin, series, date)
    with statemod.locked(settings):  # one writing rebase of this project at a time
        statemod.require_none_stopped(settings)
        require_clean_project(settings)
        return _rebase(settings, onto, opts, pin, series, date)


def _rebase(
    settings: Settings, target: str | Build, opts: Options, pin: pinmod.Pin, series: patchmod.Series, date: str
) -> RebaseReport:
    onto = target.spec if isinstance(target, Build) else target
    require_clean_checkout(onto, opts.check)
    tree = obtain_target(settings, target)
    commit = (opts.commit or tree.commit or "").lower() or None
    report = RebaseReport(
        onto=onto,
        target=tree.origin,
        target_commit=commit,
        target_key=tree.key,
        previous=f"{pin.tag or '(no tag)'} {pin.commit or pin.key}",
        date=date,
        mode="check" if opts.check else "write",
    )
    if not opts.check and commit is None and build_number(tree, onto) is None:
        raise SourceError(
            f"cannot pin {tree.origin}",
            why="the commit of its llama.cpp tree is unknown",
            fix="pass --commit SHA (the upstream commit it vendors), or use --check",
        )
    new_key = commit or tree.key
    if not opts.check and new_key == pin.key and not opts.force:
        report.state = "up-to-date"
        report.results = [PatchOutcome(p.name, subject(p.path), "clean", touched(p.path)) for p in series.patches]
        report.three_way = "not needed"
        log(f"the pin is already at {new_key}; nothing to do (--force rewrites anyway)")
        write_report(report, opts.report_dir)
        return report

    # the stage is removed when the block ends unless _handoff moved it to the cache (a stopped rebase)
    with cache.staging(settings.layout, "rebase") as stage:
        wt = stage / "src"
        with step(f"rebase {len(series.patches)} patch(es) onto {tree.commit_or_id[:12]} ({onto})"):
            base = patchmod.init_upstream_repo(wt, tree)
            report.three_way = provide_preimages(settings, wt, series, opts.base_source, stage)
            first_conflict = apply_all(wt, series, report)
        for r in report.results:
            log(f"    {r.status:<9} {r.name}" + (f": {'; '.join(r.hunks[:3])}" if r.hunks else ""))
        if not report.ok:
            report.state = "conflict"
            if not opts.check:
                assert first_conflict is not None
                report.worktree = str(_handoff(settings, stage, wt, series, first_conflict))
                statemod.save(settings, report, series.hash, opts, base=base, stopped=first_conflict[0], date=date)
            report.commands = _commands(settings, onto, report, series, base, opts)
            paths = write_report(report, opts.report_dir)
            if opts.check:
                return report
            raise _conflict_error(report, paths)
        report.state = "checked" if opts.check else "rebased"
        if opts.check:
            write_report(report, opts.report_dir)
            return report
        write_series_and_pin(settings, Rebased(wt, base, series, pin, tree, commit, date), report, opts)
        write_report(report, opts.report_dir)
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


_MARKER_RE = re.compile(r"^(<<<<<<<|>>>>>>>)( |$)", re.M)


def abort(settings: Settings, *, keep: bool = True) -> Path:
    """Drop the work tree of a stopped rebase and its state; the project was never changed. With ``keep`` the work
    tree's changes against the target upstream (patches applied, resolutions and any hand edits) are first saved as
    a patch file in the report folder. A damaged state still finds the work tree (its folder is this project's and
    user's); its changes are taken against the work tree's root commit. Returns the work tree."""
    with statemod.locked(settings):
        try:
            state = statemod.load(settings)
        except statemod.Damaged as e:
            log(f"the rebase state is damaged ({e}); aborting with what the work tree says")
            state = None
        wt = Path(state["worktree"]) if state is not None else statemod.handoff_dir(settings) / "src"
        if state is None and not wt.parent.exists() and not statemod.state_path(settings).exists():
            raise UsageError(
                f"no stopped rebase of {settings.project_dir}", fix="start one with ggml-bridge rebase --onto SPEC"
            )
        if keep and (wt / ".git").exists():
            base = state["base"] if state is not None else _root_commit(wt)
            saved = _save_hand_edits(settings, state or {"base": base, "onto": "(unknown: state damaged)"}, wt)
            if saved is not None:
                log(f"the work tree's changes are kept in {saved} (git apply it onto the target upstream tree)")
        if wt.name == "src" and (wt.parent / "src").is_dir():
            shutil.rmtree(wt.parent)
        statemod.state_path(settings).unlink(missing_ok=True)
        onto = state["onto"] if state is not None else "(unknown)"
        log(f"rebase onto {onto} aborted; removed {wt.parent}")
        return wt


def _root_commit(wt: Path) -> str:
    """The upstream commit a work tree was made from (its first commit): the base of its changes."""
    rc, out = run_git(wt, "rev-list", "--max-parents=0", "HEAD")
    roots = out.split()
    if rc != 0 or not roots:
        raise UsageError(
            f"cannot read the commits of the stopped work tree {wt}",
            why=out.strip()[-300:],
            fix="copy what you need from it, then ggml-bridge rebase --abort --discard",
        )
    return roots[-1]


def _save_hand_edits(settings: Settings, state: dict[str, Any], wt: Path) -> Path | None:
    """Write ``git diff --binary <base>`` of the whole work tree (untracked files included) to
    ``<report dir>/aborted-<UTC time>.patch``; None when there is nothing to keep. Raises (keeping the tree) when
    it cannot be written."""
    run_git(wt, "add", "-A", check=True)
    rc, diff = run_git(wt, "diff", "--cached", "--binary", str(state["base"]))
    if rc != 0:
        raise UsageError(
            f"cannot read the changes of the stopped work tree {wt}",
            why=diff.strip()[-300:],
            fix="copy what you need from it, then ggml-bridge rebase --abort --discard",
        )
    if not diff.strip():
        return None
    report_dir = (state.get("options") or {}).get("report_dir")
    folder = Path(report_dir) if report_dir else settings.project_dir / "build" / "rebase"
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"aborted-{stamp}.patch"
    header = (
        f"# ggml-bridge rebase --abort: the work tree {wt} of the rebase onto {state.get('onto')}\n"
        "# (its changes against the target upstream, hand edits included; git apply them onto that tree)\n"
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        cache.write_text_atomic(path, header + diff if diff.endswith("\n") else header + diff + "\n")
    except OSError as e:
        raise CacheError.of_os(
            e,
            f"cannot keep the stopped work tree's changes in {path}",
            fix=f"nothing was removed: free space or fix permissions, or copy from {wt} and use --abort --discard",
        ) from None
    return path


def continue_rebase(settings: Settings) -> RebaseReport:
    """Finish the ``git am`` the user resolved, apply the rest, then regenerate and write series + pin."""
    with statemod.locked(settings):
        return _continue(settings, _stopped_state(settings))


def _stopped_state(settings: Settings) -> dict[str, Any]:
    try:
        state = statemod.load(settings)
    except statemod.Damaged as e:
        raise statemod.damaged(settings, e, " and clears the rebase; then start it again") from None
    if state is None:
        raise UsageError(
            f"no stopped rebase of {settings.project_dir}", fix="start one with ggml-bridge rebase --onto SPEC"
        )
    return state


def _continue(settings: Settings, state: dict[str, Any]) -> RebaseReport:
    try:
        opts = statemod.options_of(state)
    except statemod.Damaged as e:
        raise statemod.damaged(settings, e) from None
    series = patchmod.read_series(settings.patches_dir)
    if series.hash != state["series_hash"]:
        raise UsageError(
            "patches/ changed since the rebase stopped",
            why="the stopped work tree is for the old series",
            fix="ggml-bridge rebase --abort, then ggml-bridge rebase --onto " + shlex.quote(state["onto"]),
        )
    require_clean_project(settings)
    wt = Path(state["worktree"])
    if not (wt / ".git").is_dir():
        raise UsageError(
            f"the work tree of the stopped rebase is gone: {wt}", fix="ggml-bridge rebase --abort, then start again"
        )
    pin = pinmod.load(settings.pin_file)
    report = report_from_json(state["report"])
    tree = obtain_target(settings, state["onto"])
    idx = int(state["stopped"])
    _resolve_stopped(wt, report.results[idx])
    for i in range(idx + 1, len(series.patches)):
        p = series.patches[i]
        out = apply_one(wt, p.path, PatchOutcome(p.name, subject(p.path), files=touched(p.path)))
        report.results[i] = out
        log(f"    {out.status:<9} {out.name}" + (f": {'; '.join(out.hunks[:3])}" if out.hunks else ""))
        if out.status == "conflict":  # stop again, markers in place
            am_3way(wt, p.path)
            for later in report.results[i + 1 :]:
                later.status, later.hunks, later.detail = "not tried", [], []
            report.commands = _commands(settings, report.onto, report, series, state["base"], opts)
            statemod.save(settings, report, series.hash, opts, base=state["base"], stopped=i, date=state["date"])
            raise _conflict_error(report, write_report(report, opts.report_dir))
    commit = (opts.commit or tree.commit or "").lower() or None
    report.state, report.commands, report.mode = "rebased", [], "write"
    done = Rebased(wt, state["base"], series, pin, tree, commit, state["date"])
    write_series_and_pin(settings, done, report, opts)
    report.worktree = None
    write_report(report, opts.report_dir)
    shutil.rmtree(wt.parent, ignore_errors=True)
    statemod.state_path(settings).unlink(missing_ok=True)
    return report


def _resolve_stopped(wt: Path, out: PatchOutcome) -> None:
    """Commit the user's resolution of the patch ``git am`` stopped at (stage edited files without markers)."""
    if not (wt / ".git" / "rebase-apply").exists():
        raise UsageError(
            f"the work tree {wt} is not stopped inside git am",
            why="the resolution was committed or aborted by hand",
            fix="ggml-bridge rebase --abort, then start again",
        )
    _, unmerged = run_git(wt, "diff", "--name-only", "--diff-filter=U")
    files = sorted({f for f in unmerged.splitlines() if f.strip()} | set(out.conflicts))
    marked = [f for f in files if (wt / f).is_file() and _MARKER_RE.search((wt / f).read_text(errors="replace"))]
    if marked:
        raise RebaseConflict(
            f"{out.name} is not resolved yet",
            why=f"conflict markers left in {', '.join(marked)}",
            fix=f"edit them in {wt}, then run ggml-bridge rebase --continue again",
        )
    run_git(wt, "add", "-u", check=True)
    rc, text = run_git(wt, "am", "--continue", env=patchmod.GIT_IDENTITY)
    if rc != 0 and "No changes" in text:  # the resolution is what upstream has: the patch is obsolete
        run_git(wt, "am", "--skip", check=True, env=patchmod.GIT_IDENTITY)
        out.status, out.detail = "upstream", ["resolved to no change: already upstream; dropped"]
        return
    if rc != 0:
        raise RebaseConflict(
            f"git am --continue failed for {out.name}",
            why=text.strip().splitlines()[-1] if text else "",
            fix=f"fix it in {wt} (git status), then run ggml-bridge rebase --continue again",
        )
    out.status = "resolved"
    out.detail = [f"resolved by hand in the work tree ({', '.join(out.conflicts) or 'no conflicted files'})"]


def _date(value: str | None) -> str:
    if value is None:
        return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    try:
        return _dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise UsageError(f"bad --date {value!r}", fix="use YYYY-MM-DD") from None


def _handoff(settings: Settings, stage: Path, wt: Path, series: patchmod.Series, first: tuple[int, str] | None) -> Path:
    """Move the scratch work tree to this project's and user's ``<cache>/rebase/<key>/src``, reset to just before the
    first conflict and start ``git am --3way`` of that patch again, so it stops with the conflict markers in place.
    Nothing is ever removed to make room: a folder already there is an earlier rebase's (the caller checked under the
    lock that none is stopped), and refused."""
    assert first is not None
    idx, head = first
    run_git(wt, "reset", "-q", "--hard", head, check=True)
    run_git(wt, "clean", "-qfdx")
    am_3way(wt, series.patches[idx].path)
    final = statemod.handoff_dir(settings)
    if final.exists():
        statemod.require_none_stopped(settings)  # raises: a work tree left without its state
    shutil.rmtree(stage / "preimage", ignore_errors=True)
    cache.publish_dir(stage, final)
    if not (final / "src").is_dir():  # publish_dir kept another run's folder
        statemod.require_none_stopped(settings)
    return final / "src"


def _commands(
    settings: Settings, onto: str, report: RebaseReport, series: patchmod.Series, base: str, opts: Options
) -> list[str]:
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
