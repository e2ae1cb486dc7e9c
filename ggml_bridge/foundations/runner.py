"""Every subprocess goes through here: it logs what it runs, captures or streams output, and turns
failures into the caller's FatalError with the tail of the output.

What stops every child on a stop signal (and the children's children) is :mod:`ggml_bridge.foundations.signals`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Sequence

from .errors import FatalError, os_reason

_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


def log(msg: str) -> None:
    """A progress line on stderr (stdout stays for machine-readable output)."""
    if not _quiet:
        print(msg, file=sys.stderr, flush=True)


@contextmanager
def step(title: str) -> Iterator[None]:
    """Step-style progress with timing: ``==> title`` ... ``    done in 1.2s``."""
    log(f"==> {title}")
    t0 = time.monotonic()
    try:
        yield
    except BaseException:
        log(f"    failed after {time.monotonic() - t0:.1f}s")
        raise
    log(f"    done in {time.monotonic() - t0:.1f}s")


@dataclass(frozen=True)
class Failure:
    """How a command that cannot start, runs out of time or (with ``check``) exits non-zero is reported: as
    ``error`` (the caller's FatalError class), headed ``what`` (default: what happened, naming the program), with
    ``fix``."""

    error: type[FatalError] = FatalError
    what: str | None = None
    fix: str | None = None

    def __call__(self, default: str, why: str | None = None) -> FatalError:
        """The error to raise: headed ``what``, else ``default``."""
        return self.error(self.what or default, why=why, fix=self.fix)


@dataclass(frozen=True)
class Output:
    """Where the combined output of :func:`run`'s child goes: captured (``capture``, the default) or left to our
    terminal; with ``log_file`` (appended to) or ``on_line`` (each line) it is streamed line by line instead, and
    its last lines are kept for the error message."""

    capture: bool = True
    log_file: Path | None = None
    on_line: Callable[[str], None] | None = None

    @property
    def streamed(self) -> bool:
        return self.log_file is not None or self.on_line is not None


@dataclass(frozen=True)
class Pump:
    """Where the output of a :func:`start`-ed child goes (see :class:`Process`): every line to ``log_file`` (rotated
    at ``log_max_bytes``; None: never) and ``on_line``; ``keep`` chooses the lines kept for later parsing (``True``
    every one, or a predicate); the last ``tail`` lines are kept for error messages."""

    log_file: Path | None = None
    on_line: Callable[[str], None] | None = None
    keep: bool | Callable[[str], bool] = True
    tail: int = 200
    log_max_bytes: int | None = None


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _fmt(args: Sequence[str | os.PathLike[str]], env: Mapping[str, str] | None, cwd: Path | str | None) -> str:
    prefix = ""
    if env:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
    where = f" (in {cwd})" if cwd else ""
    return "+ " + prefix + " ".join(shlex.quote(str(a)) for a in args) + where


def _prepare(
    args: Sequence[str | os.PathLike[str]], env: Mapping[str, str] | None, cwd: Path | str | None
) -> tuple[list[str], dict[str, str]]:
    """Log the command line and return it with the full environment (ours plus the added variables)."""
    argv = [str(a) for a in args]
    log(_fmt(argv, env, cwd))
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return argv, full_env


class _StartFailed(Exception):
    """The program could not be started (the OSError of exec); other OSErrors (the log file) are not this."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _popen(argv: list[str], **kw: object) -> subprocess.Popen[str]:
    try:
        return subprocess.Popen(argv, **kw)  # type: ignore[call-overload, no-any-return]
    except OSError as e:
        raise _StartFailed(e) from None


def _run_captured(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, **kw)  # type: ignore[call-overload, no-any-return]
    except OSError as e:
        raise _StartFailed(e) from None


def _stream(
    argv: list[str], env: dict[str, str], cwd: Path | str | None, output: Output, timeout: float | None
) -> Result:
    """Run ``argv`` with its combined output streamed line by line to ``output.log_file`` and ``output.on_line``; the
    last lines are kept for the error message. A log file that cannot be written is an OSError naming it."""
    log_file, on_line = output.log_file, output.on_line
    tail: deque[str] = deque(maxlen=40)
    fh = open(log_file, "a", encoding="utf-8") if log_file else None
    try:
        proc = _popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if fh:
                    _log_write(fh, line, log_file)
                tail.append(line.rstrip("\n"))
                if on_line:
                    on_line(line.rstrip("\n"))
            rc = proc.wait(timeout=timeout)
        except BaseException:  # interrupted, a timeout, a full disk: the child does not outlive the call
            proc.kill()
            proc.wait()
            raise
    finally:
        if fh:
            with contextlib.suppress(OSError):
                fh.close()
    return Result(argv, rc, "\n".join(tail), "")


def _log_write(fh: IO[str], line: str, log_file: Path | None) -> None:
    try:
        fh.write(line)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(log_file)) from None


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    output: Output = Output(),
    timeout: float | None = None,
    failure: Failure = Failure(),
) -> Result:
    """Run a command, logging it first.

    ``env`` holds only the variables added to the current environment (they are logged). ``output`` says where the
    child's output goes (captured by default; streamed line by line to a log file or a callback). A command that
    cannot start or runs out of ``timeout``, or a non-zero exit with ``check``, raises ``failure``'s error.
    """
    argv, full_env = _prepare(args, env, cwd)
    try:
        if output.streamed:
            res = _stream(argv, full_env, cwd, output, timeout)
        else:
            cp = _run_captured(
                argv,
                cwd=cwd,
                env=full_env,
                text=True,
                errors="replace",
                stdout=subprocess.PIPE if output.capture else None,
                stderr=subprocess.PIPE if output.capture else None,
                timeout=timeout,
            )
            res = Result(argv, cp.returncode, cp.stdout or "", cp.stderr or "")
    except _StartFailed as e:  # not found, not executable, a folder, not a program for this machine (ENOEXEC)
        raise failure(f"cannot run {argv[0]}", why=os_reason(e.cause)) from None
    except subprocess.TimeoutExpired:
        raise failure(f"{argv[0]} timed out after {timeout}s") from None
    if check and res.returncode != 0:
        out = (res.stdout + "\n" + res.stderr).strip().splitlines()[-15:]
        why = f"`{' '.join(argv[:3])}...` exited with {res.returncode}"
        if output.log_file:
            why += f"; full log: {output.log_file}"
        if out:
            why += "; last lines:\n    " + "\n    ".join(out)
        raise failure(f"command failed: {argv[0]}", why=why)
    return res


class Process:
    """A long-running child started by :func:`start` (e.g. llama-server).

    A reader thread pumps its combined stdout/stderr line by line as its :class:`Pump` says: into ``log_file`` /
    ``on_line``, the last ``tail`` lines kept for error messages. ``keep`` chooses the lines kept for later parsing:
    ``True`` every line, or a predicate (e.g. "a line the engagement proof reads"). Memory stays bounded whatever the
    child prints: at most ``KEEP_HEAD`` first and ``KEEP_TAIL`` last kept lines are held (the log file has all).
    """

    KEEP_HEAD = 2000
    KEEP_TAIL = 2000

    def __init__(self, argv: list[str], popen: subprocess.Popen[str], *, log_fh: IO[str] | None, pump: Pump) -> None:
        import threading

        self.args = argv
        self.popen = popen
        self.log_file = pump.log_file
        self._log_fh = log_fh
        #: rotate ``log_file`` to ``log_file.1`` when it reaches this size (None: never), so at most twice it is kept
        self.log_max_bytes = pump.log_max_bytes
        self.rotations = 0
        #: why the log stopped being written (a full disk ...), or None
        self.log_stopped: str | None = None
        self._on_line = pump.on_line
        self._keep = pump.keep
        self._head: list[str] = []
        self._kept_tail: deque[str] = deque(maxlen=self.KEEP_TAIL)
        self.dropped = 0
        """Kept lines dropped between the first KEEP_HEAD and the last KEEP_TAIL."""
        self._tail: deque[str] = deque(maxlen=pump.tail)
        self._lock = threading.Lock()
        self._last_line = time.monotonic()  # when the pump last took a line (settle())
        self._reader = threading.Thread(target=self._pump, name=f"pump-{popen.pid}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        """Read the child's output to its end whatever happens to the log: a log that cannot be written (a full
        disk, a removed folder) stops the log, said once, never the reading (the child would block on its next
        write)."""
        assert self.popen.stdout is not None
        fh = self._log_fh
        written = fh.tell() if fh else 0
        try:
            for raw in self.popen.stdout:
                line = raw.rstrip("\n")
                if fh:
                    text = raw if raw.endswith("\n") else raw + "\n"
                    try:
                        if self.log_max_bytes and written and written + len(text) > self.log_max_bytes:
                            fh = self._rotate(fh)
                            written = 0
                        if fh is not None:  # None: the log could not be reopened after rotating; the pump goes on
                            fh.write(text)
                            fh.flush()
                            written += len(text)
                    except OSError as e:
                        self._log_stopped(fh, e)
                        fh = None
                keep = self._keep is True or (callable(self._keep) and self._keep(line))
                with self._lock:
                    self._last_line = time.monotonic()
                    self._tail.append(line)
                    if keep:
                        if len(self._head) < self.KEEP_HEAD:
                            self._head.append(line)
                        else:
                            if len(self._kept_tail) == self._kept_tail.maxlen:
                                self.dropped += 1
                            self._kept_tail.append(line)
                if self._on_line:
                    try:
                        self._on_line(line)
                    except Exception:  # noqa: BLE001 - a broken callback must not stop the pump
                        pass
        finally:
            if fh:
                with contextlib.suppress(OSError):
                    fh.close()

    def _log_stopped(self, fh: IO[str] | None, e: OSError) -> None:
        """The log cannot be written any more: say so once, close it (what was buffered is lost), go on reading."""
        log(
            f"ggml-bridge: the log {self.log_file} stopped: {os_reason(e)}; "
            f"{Path(self.args[0]).name}'s output is still read (and echoed)"
        )
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()
        self._log_fh = None
        self.log_stopped = os_reason(e)

    def _rotate(self, fh: IO[str]) -> IO[str] | None:
        """Close the log, move it to ``<log>.1`` (replacing the previous one) and open a fresh one."""
        assert self.log_file is not None
        fh.close()
        try:
            os.replace(self.log_file, str(self.log_file) + ".1")
            new = open(self.log_file, "w", encoding="utf-8")
        except OSError as e:  # the folder went away or filled up: stop logging to it rather than stop the pump
            self._log_stopped(None, e)
            return None
        self.rotations += 1
        self._log_fh = new
        return new

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for exit (raises subprocess.TimeoutExpired), then for the output to be drained."""
        rc = self.popen.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    def exited_within(self, timeout: float) -> int | None:
        """The exit status if the process has exited or exits within ``timeout`` seconds, else None."""
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns the exit status."""
        import signal as _signal

        if self.popen.poll() is None:
            self.send_signal(_signal.SIGTERM)
            rc = self.exited_within(timeout)
            if rc is not None:
                return rc
            log(f"    {Path(self.args[0]).name} (pid {self.pid}) did not stop in {timeout:.0f}s; killing it")
            self.popen.kill()
        return self.wait()

    def settle(self, quiet: float = 0.05, limit: float = 0.2) -> None:
        """Until the pump has taken no line for ``quiet`` seconds (the child's burst of lines around an event, e.g.
        a server's "listening", is in), at most ``limit`` seconds."""
        end = time.monotonic() + limit
        while True:
            now = time.monotonic()
            with self._lock:
                idle = now - self._last_line
            if idle >= quiet or now >= end:
                return
            time.sleep(min(quiet - idle, end - now))

    def lines(self) -> list[str]:
        """The kept lines (see ``keep``), or the tail when nothing is kept."""
        with self._lock:
            return self._head + list(self._kept_tail) if self._keep is not False else list(self._tail)

    def tail(self, n: int = 20) -> list[str]:
        with self._lock:
            return list(self._tail)[-n:]

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    pump: Pump = Pump(),
    new_session: bool = True,
    failure: Failure = Failure(),
) -> Process:
    """Start a long-running command (logged like :func:`run`) and return at once.

    ``env`` holds only the added variables (they are logged). ``pump`` says where the child's output goes. With
    ``new_session`` the child gets its own session/process group, so a terminal Ctrl-C reaches only us and we forward
    it exactly once. ``pump.log_file`` is opened before the child starts, so a path that cannot be written fails at
    once (as ``failure``'s error, as does a program that cannot start).
    """
    argv, full_env = _prepare(args, env, cwd)
    fh = None
    if pump.log_file is not None:
        try:
            fh = open(pump.log_file, "a", encoding="utf-8")
        except OSError as e:
            raise failure.error.of_os(
                e,
                f"cannot write the log file {pump.log_file}",
                fix="create its folder or choose another path",
            ) from None
    try:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=new_session,
            preexec_fn=_parent_death_signal(),
        )
    except OSError as e:
        if fh:
            fh.close()
        raise failure(f"cannot run {argv[0]}", why=os_reason(e)) from None
    return Process(argv, popen, log_fh=fh, pump=pump)


_PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to send ``sig`` to the child when we die, even by SIGKILL (which no handler of
    ours sees): a long-running child (llama-server, in its own session) is never orphaned. SIGKILL, because a child
    ignoring SIGTERM would outlive us (with us gone, nobody is left to escalate). Only from the main thread: the
    kernel sends the signal when the *thread* that forked exits. None where prctl is unavailable."""
    import ctypes
    import threading

    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and prctl: nobody would signal the child
            os.kill(os.getpid(), sig)

    return preexec
