"""One llama-server process: started with the verbosity the proof needs, waited for (``/health`` and its own
"listening" line), queried (``/metrics``, POST) and stopped. serve, the ladder, the bench and the rpc topologies all
run llama-server through :class:`Server`; ports come from :func:`ggml_bridge.foundations.net.free_port`."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..foundations import runner, signals
from ..foundations.errors import ServeError, UsageError
from ..foundations.net import DEFAULT_HOST
from ..foundations.net import free_port as free_port  # re-exported: the ports the callers give their servers
from . import logparse

DEFAULT_PORT = 8080
#: after a request's connection broke: how long the server may take to exit for it to count as died while serving
#: (a crash closes the connection before the process is gone: ggml's abort prints a backtrace first)
DEATH_GRACE_S = 10.0

#: ggml/llama INFO messages (the bridge's "enabled" and "stats" lines, "using device") map to verbosity
#: 4 ("trace") in llama.cpp's common log; the default threshold 3 drops them. Only WARN lines (the
#: "inactive" ones) show without it.
CONTRACT_VERBOSITY = 4
VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity")
VERBOSE_ALL_FLAGS = ("-v", "--verbose", "--log-verbose")


#: llama.cpp's default log verbosity threshold (what a server started without -lv/-v prints)
DEFAULT_VERBOSITY = 3


def with_verbosity(
    args: Sequence[str], env: Mapping[str, str] | None = None, *, add: bool = True
) -> tuple[list[str], int]:
    """``args`` with ``-lv 4`` added (``add``) unless the caller chose a verbosity; returns (args, effective level)."""
    args = [str(a) for a in args]
    if any(a in VERBOSE_ALL_FLAGS for a in args):
        return args, 1 << 30
    given = _arg_value(args, *VERBOSITY_FLAGS)
    if given is None:
        given = (env or {}).get("LLAMA_ARG_LOG_VERBOSITY", os.environ.get("LLAMA_ARG_LOG_VERBOSITY"))
        if given is None:
            if not add:
                return args, DEFAULT_VERBOSITY
            return ["-lv", str(CONTRACT_VERBOSITY), *args], CONTRACT_VERBOSITY
    try:
        return args, int(given)
    except ValueError:
        return args, 0


def _arg_value(args: Sequence[str], *names: str) -> str | None:
    """Last value of an option given as ``--name v`` or ``--name=v``."""
    val = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                val = args[i + 1]
            elif a.startswith(n + "=") and n.startswith("--"):
                val = a.split("=", 1)[1]
    return val


def _fmt_tail(lines: Sequence[str]) -> str:
    return "last server log lines:\n    " + "\n    ".join(lines) if lines else "the server printed nothing"


@dataclass(frozen=True)
class ServerLog:
    """Where llama-server's output goes besides the lines the proof keeps: appended to ``file`` (rotated to
    ``<file>.1`` when it reaches ``max_bytes``; None: never) and, with ``echo``, printed on our stderr."""

    file: Path | None = None
    echo: bool = False
    max_bytes: int | None = None


class Server:
    """One llama-server process: started, waited for, queried, stopped."""

    def __init__(
        self,
        binary: Path | str,
        server_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: ServerLog = ServerLog(),
        startup_timeout: float = 600.0,
        cwd: Path | None = None,
        verbose_proof: bool = True,
    ) -> None:
        self.binary = Path(os.path.abspath(binary))  # "./llama-server" must not become a PATH lookup
        self.env = dict(env or {})
        # verbose_proof: add -lv 4 (the INFO lines) unless a verbosity was chosen; serve proves from /metrics instead
        self.server_args, self.verbosity = with_verbosity(server_args, self.env, add=verbose_proof)
        self.log = log
        self.log_file = log.file
        self.startup_timeout = startup_timeout
        self.cwd = cwd
        host = _arg_value(self.server_args, "--host") or DEFAULT_HOST
        port = _arg_value(self.server_args, "--port")
        if host.endswith(".sock") or "," in host:
            raise UsageError(f"--host {host}: the launcher needs one TCP address to check /health")
        try:
            self.port = int(port) if port is not None else DEFAULT_PORT
        except ValueError:
            raise UsageError(f"--port {port!r} is not a number") from None
        if not 1 <= self.port <= 65535:
            raise UsageError(
                f"--port {port}: not a TCP port the launcher can check",
                why="it must be 1..65535 (0, a random port, cannot be found to check /health)",
                fix=f"omit --port (default {DEFAULT_PORT}) or pass a free port",
            )
        if not math.isfinite(startup_timeout) or startup_timeout <= 0:
            raise UsageError(f"--startup-timeout {startup_timeout}: must be a positive number of seconds")
        self.host = host
        probe = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else ("::1" if host == "::" else host)
        self._probe_host = probe
        self._probe = f"http://[{probe}]:{self.port}" if ":" in probe else f"http://{probe}:{self.port}"
        self.url = f"http://{host}:{self.port}" if ":" not in host else f"http://[{host}]:{self.port}"
        self.proc: runner.Process | None = None
        self.ready_s: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------
    def _precheck(self) -> None:
        if not self.binary.is_file() or not os.access(self.binary, os.X_OK):
            raise ServeError(
                f"llama-server binary not found or not executable: {self.binary}",
                fix="build it with `ggml-bridge build`, or pass --server PATH",
            )
        if self.log_file is not None and not Path(self.log_file).parent.is_dir():
            raise UsageError(
                f"--server-log {self.log_file}: the folder {Path(self.log_file).parent} does not exist",
                why="llama-server was not started",
                fix="create the folder or choose another path",
            )
        model = _arg_value(self.server_args, "-m", "--model")
        if model is not None and not Path(model).is_file():
            raise UsageError(
                f"model file not found: {model}", why="llama-server was not started", fix="check the -m path"
            )
        try:
            socket.getaddrinfo(self._probe_host, self.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise UsageError(
                f"--host {self.host} does not resolve",
                why=f"{e.strerror if isinstance(e, socket.gaierror) else e}; llama-server was not started",
                fix="give an address (e.g. 127.0.0.1) or a name this machine resolves",
            ) from None

    def start(self) -> "Server":
        self._precheck()
        on_line = (lambda line: print(line, file=sys.stderr, flush=True)) if self.log.echo else None
        self.proc = runner.start(
            [self.binary, *self.server_args],
            cwd=self.cwd,
            env=self.env,
            pump=runner.Pump(
                log_file=self.log.file, on_line=on_line, keep=logparse.is_read, log_max_bytes=self.log.max_bytes
            ),
            failure=runner.Failure(ServeError, what=f"cannot start {self.binary}"),
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _failure(self, what: str, when: str = "during start-up") -> ServeError:
        assert self.proc is not None
        rc = self.proc.poll()
        reason = logparse.exit_reason(logparse.parse(self.proc.lines()), rc, when)
        why = reason + "; " + _fmt_tail(self.proc.tail(15))
        if self.log_file:
            why += f"\n    full log: {self.log_file}"
        return ServeError(what, why=why)

    def health(self, timeout: float = 2.0) -> int | None:
        try:
            with urllib.request.urlopen(self._probe + "/health", timeout=timeout) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def metrics(self, timeout: float = 5.0) -> dict[str, int] | None:
        """The transfer counters on /metrics (llama-server --metrics, patch 0005); None when it serves none."""
        try:
            with urllib.request.urlopen(self._probe + "/metrics", timeout=timeout) as r:
                return logparse.parse_metrics(r.read().decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_ready(self) -> None:
        """Until /health answers 200 *and* our own process logged that it listens (so a different
        process already on the port cannot pass for us)."""
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        pause = 0.01  # short first polls (a small model is up in a moment), then every 0.1 s
        while True:
            if self.proc.poll() is not None:
                self.proc.wait(5)
                raise self._failure(f"llama-server exited during start-up (status {self.proc.returncode})")
            if self.health() == 200:
                info = logparse.parse(self.proc.lines())
                if info.listening or info.model_loaded:
                    # the lines printed around ready: until the pump has been idle for 50 ms (at most 0.2 s)
                    self.proc.settle()
                    self.ready_s = time.monotonic() - t0
                    return
            if time.monotonic() > deadline:
                err = self._failure(f"llama-server did not become ready within {self.startup_timeout:.0f}s")
                raise err
            time.sleep(pause)
            pause = min(0.1, pause * 2)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds (default: the stop grace, ``GGML_BRIDGE_STOP_GRACE``)."""
        if self.proc is None:
            return None
        return self.proc.stop(signals.grace_or_default() if timeout is None else timeout)

    def lines(self) -> list[str]:
        """The log lines the engagement proof reads (not every line: see runner.Process)."""
        return self.proc.lines() if self.proc else []

    def tail(self, n: int = 20) -> list[str]:
        """The last ``n`` log lines, whatever they say (for error messages)."""
        return self.proc.tail(n) if self.proc else []

    def info(self) -> logparse.LogInfo:
        return logparse.parse(self.lines())

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests -----------------------------------------------------------------------------------------
    def post(self, path: str, payload: Mapping[str, Any], timeout: float = 600.0) -> bytes:
        data = json.dumps(payload).encode()
        req = urllib.request.Request(self._probe + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                answer: bytes = r.read()
                return answer
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:500]
            raise ServeError(f"POST {path} failed with HTTP {e.code}", why=body) from None
        except (urllib.error.URLError, OSError) as e:
            timed_out = isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)
            if self.proc is not None and self.proc.exited_within(0 if timed_out else DEATH_GRACE_S) is not None:
                raise self._failure(f"llama-server died while serving POST {path}", "while serving") from None
            raise ServeError(f"POST {path} failed", why=str(e)) from None
