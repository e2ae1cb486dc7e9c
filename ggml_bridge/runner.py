"""Every subprocess goes through here: it logs what it runs, captures or streams output, and turns
failures into the caller's FatalError with the tail of the output."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from .errors import FatalError

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


def _prepare(args: Sequence[str | os.PathLike[str]], env: Mapping[str, str] | None,
             cwd: Path | str | None) -> tuple[list[str], dict[str, str]]:
    """Log the command line and return it with the full environment (ours plus the added variables)."""
    argv = [str(a) for a in args]
    log(_fmt(argv, env, cwd))
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return argv, full_env


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
    log_file: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    error: type[FatalError] = FatalError,
    what: str | None = None,
    fix: str | None = None,
    timeout: float | None = None,
) -> Result:
    """Run a command, logging it first.

    ``env`` holds only the variables added to the current environment (they are logged).
    With ``log_file`` or ``on_line`` the combined output is streamed line by line; the last lines are
    kept for the error message. A non-zero exit with ``check`` raises ``error``.
    """
    argv, full_env = _prepare(args, env, cwd)
    try:
        if log_file is not None or on_line is not None:
            tail: deque[str] = deque(maxlen=40)
            fh = open(log_file, "a", encoding="utf-8") if log_file else None
            try:
                proc = subprocess.Popen(
                    argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, errors="replace", bufsize=1,
                )
                assert proc.stdout is not None
                for line in proc.stdout:
                    if fh:
                        fh.write(line)
                    tail.append(line.rstrip("\n"))
                    if on_line:
                        on_line(line.rstrip("\n"))
                rc = proc.wait(timeout=timeout)
            finally:
                if fh:
                    fh.close()
            res = Result(argv, rc, "\n".join(tail), "")
        else:
            cp = subprocess.run(
                argv, cwd=cwd, env=full_env, text=True, errors="replace",
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None, timeout=timeout,
            )
            res = Result(argv, cp.returncode, cp.stdout or "", cp.stderr or "")
    except FileNotFoundError as e:
        raise error(what or f"cannot run {argv[0]}", why=str(e), fix=fix) from None
    except subprocess.TimeoutExpired:
        raise error(what or f"{argv[0]} timed out after {timeout}s", fix=fix) from None
    if check and res.returncode != 0:
        out = (res.stdout + "\n" + res.stderr).strip().splitlines()[-15:]
        why = f"`{' '.join(argv[:3])}...` exited with {res.returncode}"
        if log_file:
            why += f"; full log: {log_file}"
        if out:
            why += "; last lines:\n    " + "\n    ".join(out)
        raise error(what or f"command failed: {argv[0]}", why=why, fix=fix)
    return res


class Process:
    """A long-running child started by :func:`start` (e.g. llama-server).

    A reader thread pumps its combined stdout/stderr line by line into ``log_file`` / ``on_line``, keeps
    the last lines for error messages, and (with ``keep_lines``) every line for later parsing.
    """

    def __init__(self, argv: list[str], popen: subprocess.Popen[str], *, log_file: Path | None,
                 on_line: Callable[[str], None] | None, keep_lines: bool, tail: int) -> None:
        import threading

        self.args = argv
        self.popen = popen
        self.log_file = log_file
        self._on_line = on_line
        self._keep = keep_lines
        self._lines: list[str] = []
        self._tail: deque[str] = deque(maxlen=tail)
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._pump, name=f"pump-{popen.pid}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        fh = open(self.log_file, "a", encoding="utf-8") if self.log_file else None
        try:
            for raw in self.popen.stdout:
                line = raw.rstrip("\n")
                if fh:
                    fh.write(raw if raw.endswith("\n") else raw + "\n")
                    fh.flush()
                with self._lock:
                    self._tail.append(line)
                    if self._keep:
                        self._lines.append(line)
                if self._on_line:
                    try:
                        self._on_line(line)
                    except Exception:  # noqa: BLE001 - a broken callback must not stop the pump
                        pass
        finally:
            if fh:
                fh.close()

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

    def send_signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit status."""
        import signal as _signal

        if self.popen.poll() is None:
            self.send_signal(_signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"    {Path(self.args[0]).name} (pid {self.pid}) did not stop in {timeout:.0f}s; killing it")
                self.popen.kill()
        return self.wait()

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines) if self._keep else list(self._tail)

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
    log_file: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    keep_lines: bool = True,
    tail: int = 200,
    new_session: bool = True,
    error: type[FatalError] = FatalError,
    what: str | None = None,
    fix: str | None = None,
) -> Process:
    """Start a long-running command (logged like :func:`run`) and return at once.

    ``env`` holds only the added variables (they are logged). With ``new_session`` the child gets its
    own session/process group, so a terminal Ctrl-C reaches only us and we forward it exactly once.
    """
    argv, full_env = _prepare(args, env, cwd)
    try:
        popen = subprocess.Popen(
            argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
            start_new_session=new_session,
        )
    except OSError as e:
        raise error(what or f"cannot run {argv[0]}", why=str(e), fix=fix) from None
    return Process(argv, popen, log_file=log_file, on_line=on_line, keep_lines=keep_lines, tail=tail)
