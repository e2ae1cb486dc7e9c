"""Stop signals: after SIGINT, SIGTERM or SIGHUP nothing of ours keeps running. :func:`stop_children_on_signals`
(the command line's frame) stops every descendant process, waits for them, then raises :class:`Interrupted`."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Iterator, Mapping

from .errors import UsageError
from .runner import log

#: Signals after which nothing of ours may keep running: Ctrl-C / `kill -INT`, `kill` / timeout / CI cancel,
#: terminal closed / ssh dropped.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; every child process had been stopped (and waited for) before this was raised."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_stopping = False

#: Seconds the children get between SIGTERM and SIGKILL when we are stopped (``GGML_BRIDGE_STOP_GRACE``).
STOP_GRACE_S = 10.0
STOP_GRACE_VAR = "GGML_BRIDGE_STOP_GRACE"


def stop_grace(env: Mapping[str, str] | None = None) -> float:
    """The grace period: ``$GGML_BRIDGE_STOP_GRACE`` seconds (0 to 600), else :data:`STOP_GRACE_S`. The wait
    ends as soon as every child is gone; only a child that ignores SIGTERM waits the whole grace."""
    text = (os.environ if env is None else env).get(STOP_GRACE_VAR, "").strip()
    if not text:
        return STOP_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 600:
        raise UsageError(
            f"{STOP_GRACE_VAR}={text!r} is not a number of seconds from 0 to 600",
            fix=f"unset it for the default {STOP_GRACE_S:.0f} s",
        )
    return value


def grace_or_default() -> float:
    """:func:`stop_grace`, or the default where the variable is bad (``cli.main`` reports that as a usage error
    before any command runs; a stop must not fail on it)."""
    try:
        return stop_grace()
    except UsageError:
        return STOP_GRACE_S


@contextmanager
def stop_children_on_signals(grace: float | None = None) -> Iterator[None]:
    """While inside: SIGINT, SIGTERM and SIGHUP stop every descendant process (each process group of ours too),
    wait until they are gone (SIGKILL after ``grace`` seconds, default :func:`stop_grace` read when the signal
    comes), then raise
    :class:`Interrupted` in the main
    thread, so that ``finally`` blocks (build locks, temporary trees) run only once nothing of ours runs.
    A second signal during that clean-up is ignored. Handlers a stage installs itself (serve) take over inside."""
    global _stopping

    def handler(signum: int, _frame: object) -> None:
        global _stopping
        if _stopping:
            return
        _stopping = True
        log(f"ggml-bridge: {signal.Signals(signum).name} received: stopping child processes")
        stop_descendants(grace_or_default() if grace is None else grace)
        raise Interrupted(signum)

    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    _stopping = False
    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        _stopping = False


def _proc_stat(pid: int) -> tuple[int, str, int, int] | None:
    """(ppid, state, pgid, start time) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[2]), int(fields[19])


def descendants(root: int | None = None) -> dict[int, int]:
    """Every live process below ``root`` (default: us), as pid -> start time (so a reused pid is not taken
    for it later)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _proc_stat(int(entry))) is not None and st[1] not in "ZX":
            children.setdefault(st[0], []).append((int(entry), st[3]))
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            if pid not in out:
                out[pid] = started
                todo.append(pid)
    return out


def _alive(pid: int, started: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[3] == started and st[1] not in "ZX"


def stop_descendants(grace: float = 10.0) -> None:
    """SIGTERM every descendant and every process group they lead (ninja runs each compiler in its own group),
    wait up to ``grace`` seconds for all of them to be gone, SIGKILL what is left and wait for that too.
    Processes re-parented away (their parent died first) are still followed by pid and start time."""
    own_group = os.getpgid(0)
    seen: dict[int, int] = {}
    signalled: set[tuple[int, int, int]] = set()

    def signal_all(sig: int) -> None:
        """Send ``sig`` once to each live descendant (and group) not yet sent it: a second SIGTERM would make
        llama-server skip its graceful shutdown."""
        seen.update(descendants())
        groups = set()
        for pid, started in list(seen.items()):
            if not _alive(pid, started) or (sig, pid, started) in signalled:
                continue
            signalled.add((sig, pid, started))
            st = _proc_stat(pid)
            if st is not None and st[2] != own_group:
                groups.add(st[2])
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        deadline = time.monotonic() + wait_s
        signal_all(sig)
        while any(_alive(p, s) for p, s in seen.items()) or descendants():
            if time.monotonic() > deadline:
                break
            signal_all(sig)  # late children of a dying parent
            time.sleep(0.05)
        else:
            return
        if sig == signal.SIGTERM:
            log(f"ggml-bridge: child processes still running after {grace:g}s; killing them")
