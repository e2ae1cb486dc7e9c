"""A rebase stopped at a conflict: its state file, its work tree and the lock, all keyed by the project *and* the
user, so that two clones of the project sharing one cache, or two users sharing a cache, never touch each other's.

For the project at ``P`` run by user ``U`` (key ``K`` = a hash of both):

* ``<cache>/rebase/state-K.json`` what ``--continue`` needs (target, base commit, the patch it stopped at, options);
* ``<cache>/rebase/K/src``        the work tree stopped inside ``git am``, holding the user's hand edits;
* ``<cache>/rebase/K.lock``       held by every run that writes either (``--onto`` without ``--check``,
                                  ``--continue``, ``--abort``): a second one is refused at once (exit 53).

Nothing here deletes a work tree it cannot attribute: a damaged state still finds its work tree (the folder is
``K``), whose changes ``--abort`` keeps as a patch file (the base is the work tree's root commit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Iterator

from ...foundations import cache, files
from ...foundations.config import Settings
from ...foundations.errors import RebaseInProgress, UsageError
from ...foundations.tomlfile import Key
from .report import Options, RebaseReport

#: The keys of a state file (:func:`save`), each of its kind.
STATE_KEYS = {
    "project": Key("str"),
    "onto": Key("str"),
    "worktree": Key("str"),
    "base": Key("str"),
    "stopped": Key("int"),
    "series_hash": Key("str"),
    "date": Key("str"),
    "options": Key("table"),
    "report": Key("table"),
}


class Damaged(Exception):
    """The state file exists but cannot be read as one (truncated, edited, of an older shape)."""


def key(settings: Settings) -> str:
    """The project's checkout and the user running it, hashed: two clones or two users never share a key."""
    who = f"{os.getuid()}:{settings.project_dir.resolve()}"
    return hashlib.sha256(who.encode()).hexdigest()[:16]


def state_path(settings: Settings) -> Path:
    return settings.layout.rebase_state(key(settings))


def handoff_dir(settings: Settings) -> Path:
    """Where this project's stopped work tree lives (``<dir>/src``)."""
    return settings.layout.rebase_handoff(key(settings))


@contextlib.contextmanager
def locked(settings: Settings) -> Iterator[None]:
    """Held while a rebase of this project writes its state or work tree; a second such run is refused at once."""
    lock = settings.layout.rebase_lock(key(settings))

    def busy() -> RebaseInProgress:
        return RebaseInProgress(
            f"another rebase of {settings.project_dir} is running",
            why=f"it holds {lock}",
            fix="wait for it to finish (or stop it), then run this again",
        )

    with cache.entry_lock(lock, busy=busy):
        yield


def save(settings: Settings, report: RebaseReport, series_hash: str, opts: Options, **where: Any) -> None:
    """The state ``--continue`` reads; ``where``: base (commit), stopped (patch index), date."""
    o = dataclasses.asdict(opts)
    o["cuda_include"] = [str(p) for p in opts.cuda_include]
    o["report_dir"] = str(opts.report_dir) if opts.report_dir else None
    cache.write_json_atomic(
        state_path(settings),
        {
            "project": str(settings.project_dir.resolve()),
            "onto": report.onto,
            "worktree": report.worktree,
            "series_hash": series_hash,
            "options": o,
            "report": report.to_json(),
            **where,
        },
    )


def load(settings: Settings) -> dict[str, Any] | None:
    """The state of this project's stopped rebase; None when there is none; :class:`Damaged` when it cannot be read."""
    path = state_path(settings)
    if not path.exists():
        return None
    try:
        return files.read_json(path, "rebase state", shape=STATE_KEYS, required=tuple(STATE_KEYS), error=UsageError)
    except UsageError as e:
        raise Damaged(str(e)) from None


def options_of(state: dict[str, Any]) -> Options:
    """The options the stopped rebase ran with; :class:`Damaged` when they are not the ones a state holds."""
    o = dict(state["options"])
    try:
        o["cuda_include"] = [Path(p) for p in o.get("cuda_include", [])]
        o["report_dir"] = Path(o["report_dir"]) if o.get("report_dir") else None
        return Options(**o)
    except (TypeError, ValueError) as e:
        raise Damaged(f"its options are not a rebase's: {e}") from None


def damaged(
    settings: Settings, e: Damaged, then: str = "", error: type[UsageError | RebaseInProgress] = UsageError
) -> UsageError | RebaseInProgress:
    """The error for a stopped rebase whose state cannot be read (``then``: what --abort does besides)."""
    return error(
        f"the state of the stopped rebase of {settings.project_dir} is damaged",
        why=str(e),
        fix=f"`ggml-bridge rebase --abort` keeps the stopped work tree's changes as a patch file{then}",
    )


def require_none_stopped(settings: Settings) -> None:
    """A second ``--onto`` would replace the stopped work tree (and the user's edits in it): refuse."""
    fix = (
        "finish it with `ggml-bridge rebase --continue`, or give it up with `ggml-bridge rebase --abort` (keeps its "
        "changes as a patch file; --discard does not)"
    )
    try:
        state = load(settings)
    except Damaged as e:
        raise damaged(settings, e, " and clears it", error=RebaseInProgress) from None
    if state is not None:
        raise RebaseInProgress(
            f"a rebase onto {state['onto']} is stopped at a conflict",
            why=f"its work tree {state['worktree']} may hold hand edits that a new rebase would replace",
            fix=fix,
        )
    left = handoff_dir(settings)
    if left.exists():
        raise RebaseInProgress(
            f"a work tree of an earlier rebase of {settings.project_dir} is left in {left} without its state",
            why="it may hold hand edits that a new rebase would replace",
            fix="`ggml-bridge rebase --abort` keeps its changes as a patch file and removes it (--discard does not keep "
            "them)",
        )
