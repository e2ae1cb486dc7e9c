"""The report model of a rebase (per-patch outcomes, the whole run) and the run's options."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...foundations import cache
from ...foundations.runner import log

#: Per-patch outcomes, in the order the report groups them.
STATUSES = ("clean", "offsets", "fuzz", "merged", "resolved", "upstream", "conflict", "not tried")


APPLIED = ("clean", "offsets", "fuzz", "merged", "resolved")


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
        title = {
            "conflict": "conflicts",
            "rebased": "rebased",
            "up-to-date": "already pinned",
            "build-failed": "build failed",
        }.get(self.state, "check")
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


def report_from_json(data: dict[str, Any]) -> RebaseReport:
    fields = {f.name for f in dataclasses.fields(RebaseReport)}
    rep = RebaseReport(**{k: v for k, v in data.items() if k in fields and k != "results"})
    rep.results = [PatchOutcome(**r) for r in data.get("results", [])]
    return rep


def write_report(report: RebaseReport, report_dir: Path | None) -> list[Path]:
    if report_dir is None:
        return []
    report_dir.mkdir(parents=True, exist_ok=True)
    md, js = report_dir / "report.md", report_dir / "report.json"
    for path, text in ((md, report.to_markdown()), (js, json.dumps(report.to_json(), indent=2) + "\n")):
        cache.write_text_atomic(path, text)
    log(f"report: {md} and {js}")
    return [md, js]


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
