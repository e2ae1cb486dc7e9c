"""The pinned upstream tree, from the pin.toml sources in the configured order (git, GitHub archive, PyPI sdist)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ...foundations import cache
from ...foundations.config import Settings
from ...foundations.errors import ChecksumError, FetchError, SourceError, UsageError
from ...foundations.runner import log, step
from .. import pin as pinmod
from .archive import _download, _extract, _git_fetch, _pypi_sdist_url, _sdist_subdir
from .registry import cached_sdist, set_aside_damaged
from .tree import Tree, _Failed, _finish_pinned, find_cached


def _obtain_pinned(settings: Settings, pin: pinmod.Pin) -> Tree:
    hit = find_cached(settings, pin.key)
    if hit is not None:
        log(f"upstream {pin.ident} found in cache: {hit.path}")
        return hit
    cache.ensure_writable(settings.layout)  # before any source: offline, an unwritable cache is still exit 13
    usable = [s for s in pin.sources if s.kind in settings.fetch.sources]
    if not usable:
        kinds = sorted({s.kind for s in pin.sources})
        raise UsageError(
            f"the enabled source kinds ({', '.join(settings.fetch.sources) or 'none'}) exclude every source of "
            f"pin.toml ({', '.join(kinds) or 'none'})",
            why="nothing was tried: no network was asked",
            fix=f"add {' or '.join(kinds)} to GGML_BRIDGE_SOURCES / [fetch] sources, or pass --source",
        )
    attempts: list[str] = []
    for kind in settings.fetch.sources:
        for src in (s for s in pin.sources if s.kind == kind):
            t0 = time.monotonic()
            try:
                with step(f"fetch upstream {pin.ident} via {src.describe()}"):
                    return PINNED_FETCHERS[kind](settings, pin, src)
            except _Failed as e:
                msg = f"{src.describe()}: {e} ({time.monotonic() - t0:.2f}s)"
                log(f"    {msg}; trying the next source")
                attempts.append(msg)
    raise FetchError(
        f"could not obtain upstream llama.cpp {pin.ident}",
        why="every source failed:\n    " + "\n    ".join(attempts or ["(no sources enabled)"]),
        fix="check the network or proxy, or pass --source with a local checkout or the sdist "
        f"{next((s.filename for s in pin.sources if s.filename), 'tarball')}",
    )


def _fetch_pinned_git(settings: Settings, pin: pinmod.Pin, src: pinmod.Source) -> Tree:
    assert src.url and pin.commit  # pin.load: git and archive sources need the commit
    with cache.staging(settings.layout, pin.commit[:12]) as stage:
        commit = _git_fetch(settings, src.url, pin.commit, stage / "src")
        if commit != pin.commit:  # pragma: no cover - git guarantees this
            raise _Failed(f"fetched commit {commit}, not {pin.commit}")
        return _finish_pinned(settings, pin, stage, origin=f"git {src.url} @ {commit}")


def _fetch_pinned_archive(settings: Settings, pin: pinmod.Pin, src: pinmod.Source) -> Tree:
    assert src.url and pin.commit
    with cache.staging(settings.layout, pin.commit[:12]) as stage:
        name = Path(urlsplit(src.url).path).name or "archive.tar.gz"
        archive, sha = _download(settings, src.url, stage / name, src.sha256)
        origin = f"archive {src.url}"
        found = PinnedArchive(archive, src.subdir, origin, sha)
        return pinned_from_archive(settings, pin, stage, found, remove=True, failed=_Failed)


def _fetch_pinned_sdist(settings: Settings, pin: pinmod.Pin, src: pinmod.Source) -> Tree:
    assert src.package and src.version and src.filename and src.sha256
    # an sdist already in <cache>/sdists/ with pin.toml's sha256 is used without any registry request
    kept = cached_sdist(settings, src.filename, src.sha256)
    if kept is not None:
        log(f"    {src.filename} found in {kept.parent} (sha256 as in pin.toml): no download")
    else:
        url, registry_sha = _pypi_sdist_url(settings, src.package, src.version, src.filename)
        if registry_sha and registry_sha != src.sha256:
            raise ChecksumError(
                f"PyPI lists {src.filename} with sha256 {registry_sha}",
                why=f"pin.toml expects {src.sha256}",
                fix="the registry file changed or the pin is wrong: check pin.toml before trusting either",
            )
    with cache.staging(settings.layout, pin.key[:16]) as stage:
        if kept is not None:
            archive, sha = kept, src.sha256
        else:
            archive, sha = _download(settings, url, stage / src.filename, src.sha256)
            set_aside_damaged(settings, src.filename, sha)
        subdir = src.subdir or _sdist_subdir(src.filename)
        origin = f"pypi-sdist {src.package}=={src.version} (sha256 {sha})"
        return pinned_from_archive(
            settings, pin, stage, PinnedArchive(archive, subdir, origin, sha), remove=kept is None
        )


@dataclass(frozen=True)
class PinnedArchive:
    """One of the pinned tree's archives, its sha256 checked: the file, the folder of the tree in it, where it came
    from."""

    path: Path
    subdir: str | None
    origin: str
    sha256: str


def pinned_from_archive(
    settings: Settings,
    pin: pinmod.Pin,
    stage: Path,
    archive: PinnedArchive,
    *,
    remove: bool = False,
    failed: type[Exception] = SourceError,
) -> Tree:
    """The pinned tree from one of its archives: its ``subdir`` extracted into ``stage/src`` (``remove``: the
    archive, downloaded into the stage, deleted then) and published."""
    _extract(archive.path, stage / "src", subdir=archive.subdir, failed=failed)
    if remove:
        archive.path.unlink()
    return _finish_pinned(settings, pin, stage, origin=archive.origin, archive_sha256=archive.sha256, failed=failed)


#: How the pinned tree is fetched from each source kind of :data:`ggml_bridge.upstream.pin.SOURCE_KINDS`.
PINNED_FETCHERS: dict[str, Callable[[Settings, pinmod.Pin, pinmod.Source], Tree]] = {
    pinmod.GIT: _fetch_pinned_git,
    pinmod.ARCHIVE: _fetch_pinned_archive,
    pinmod.PYPI_SDIST: _fetch_pinned_sdist,
}
