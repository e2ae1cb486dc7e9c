"""Git probing: apply each patch to a scratch work tree (``git apply --check``, GNU ``patch --dry-run``,
``git am --3way``) and classify it; the preimage blobs the 3-way merge needs.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ...foundations import gitrepo, runner
from ...foundations.config import Settings
from ...foundations.errors import FatalError, PatchError
from ...foundations.runner import log
from .. import patch as patchmod
from ..fetch.resolve import obtain
from .report import PatchOutcome, RebaseReport

_OFFSET_RE = re.compile(r"Hunk #\d+ succeeded at \d+.*\((offset [-\d]+ lines?)\)")


_FUZZ_RE = re.compile(r"Hunk #\d+ succeeded at \d+ with fuzz")


_PATCH_FAILED_RE = re.compile(r"error: patch failed: (?P<file>.+):(?P<line>\d+)$")


_DIFF_RE = re.compile(r"^diff --git a/(?P<a>\S+) b/(?P<b>\S+)$", re.M)


#: Environment of the git commands whose output lands in the series: no user/system config may change it.
GIT_PLAIN = patchmod.GIT_PLAIN


def run_git(wt: Path, *args: str, check: bool = False, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = gitrepo.run(wt, *args, check=check, env=env, error=PatchError)
    return res.returncode, (res.stdout + res.stderr)


def am_3way(wt: Path, patch: Path) -> tuple[int, str]:
    """``git am --3way`` of one patch file onto ``wt``, as every step of a rebase applies one."""
    return run_git(
        wt, "am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(patch), env=patchmod.GIT_IDENTITY
    )


def provide_preimages(
    settings: Settings, wt: Path, series: patchmod.Series, base_source: str | None, stage: Path
) -> str:
    """Put the blobs the patches were made against into ``wt``'s object store (for ``git am --3way``).

    Applies the series onto the files it touches of the current base tree in a small side repository, then fetches
    its objects into ``wt``. Best effort where the pinned sources are unavailable: returns a line for the report
    either way; a ``base_source`` the user gave that cannot be obtained is its own error.
    """
    try:
        base = obtain(settings, base_source, allow_unpinned=base_source is not None)
    except FatalError as e:
        if base_source is not None:  # the user's --base-source: its error, not a note (the check would go on)
            raise
        log(f"note: the tree of the current pin is not available ({e.kind}: {e}); 3-way merge without preimages")
        return f"without preimage blobs (current pin's tree unavailable: {e.what})"
    side = stage / "preimage"
    side.mkdir()
    paths = sorted({f for p in series.patches for f in touched(p.path)})
    for rel in paths:
        src = base.path / rel
        if src.is_file():
            (side / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, side / rel)
    run_git(side, "init", "-q", check=True)
    identity = patchmod.GIT_IDENTITY
    applied = 0
    run_git(side, "add", "-A", "--force", check=True, env=identity)
    run_git(side, "commit", "-q", "--no-verify", "--allow-empty", "-m", "preimages", check=True, env=identity)
    for p in series.patches:
        if run_git(side, "am", "--keep-cr", str(p.path), env=identity)[0] != 0:
            run_git(side, "am", "--abort")
            break
        applied += 1
    run_git(wt, "fetch", "-q", "--no-tags", str(side), "HEAD:refs/ggml-bridge/preimages", check=True)
    n = len(series.patches)
    where = f"{base.commit_or_id[:12]} ({base.origin})"
    if applied == n:
        return f"preimage blobs from the current pin's tree {where}"
    return (
        f"preimage blobs for {applied} of {n} patch(es) from {where}; the rest do not apply there "
        "(already rebased by hand?) and merge without them"
    )


def apply_all(wt: Path, series: patchmod.Series, report: RebaseReport) -> tuple[int, str] | None:
    """Probe and ``git am --3way`` each patch; fills ``report.results``. Returns (index, head before it) of the
    first conflict."""
    first: tuple[int, str] | None = None
    for i, p in enumerate(series.patches):
        head = run_git(wt, "rev-parse", "HEAD", check=True)[1].strip()
        out = apply_one(wt, p.path, PatchOutcome(p.name, subject(p.path), files=touched(p.path)))
        if out.status == "conflict":
            if first is None:
                first = (i, head)
            else:
                out.detail.append(f"tried without {report.results[first[0]].name}")
        report.results.append(out)
    return first


def apply_one(wt: Path, path: Path, out: PatchOutcome) -> PatchOutcome:
    hunks_by_file = _hunk_headers(path)
    rc, text = run_git(wt, "apply", "--check", "-v", str(path))
    if rc == 0:
        out.hunks = _moved_hunks(text)
        out.status = "offsets" if out.hunks else "clean"
    else:
        if run_git(wt, "apply", "--check", "--reverse", str(path))[0] == 0:
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
    rc, text = am_3way(wt, path)
    if rc == 0:
        if out.status == "merged":
            out.detail.append("plain apply fails; the 3-way merge applies it")
        return out
    if "already applied" in text or "No changes" in text:
        run_git(wt, "am", "--abort")
        out.status, out.hunks = "upstream", []
        out.detail.append("the 3-way merge finds every change already upstream; dropped")
        return out
    out.status = "conflict"
    _, unmerged = run_git(wt, "diff", "--name-only", "--diff-filter=U")
    out.conflicts = [f for f in unmerged.splitlines() if f.strip()]
    if not out.hunks:
        out.hunks = _failed_hunks(run_git(wt, "apply", "--check", "-v", str(path))[1], hunks_by_file)
    out.detail += [
        line.strip() for line in text.splitlines() if patchmod.CONFLICT_LINE.search(line) and not line.startswith("+ ")
    ][:10]
    run_git(wt, "am", "--abort")
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


def touched(path: Path) -> list[str]:
    files: list[str] = []
    for m in _DIFF_RE.finditer(path.read_text(errors="replace")):
        for f in (m["a"], m["b"]):
            if f not in files:
                files.append(f)
    return files


def subject(path: Path) -> str:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Subject: "):
            return re.sub(r"^\[PATCH[^]]*\]\s*", "", line[len("Subject: ") :])
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
