"""Launch llama-server with the runtime selectors set, and prove from its own log lines what engaged.

``ggml-bridge serve [--bridge on|off|force] [--batched on|off] [--] <llama-server args>``

The selectors are environment variables read by the patched build (docs/DESIGN.md):
``GGML_CUDA_MAPPED_HOST_BRIDGE`` = 0|1|force (plus ``*_STATS=1``) and ``LLAMA_BATCHED_TRANSFERS`` = 0|1 (its
counters come at teardown whenever it is 1), so counters are printed at teardown. The launcher streams the server log, waits for ``/health``
and the server's "listening" line, then reads the bridge/batched lines (regexes in :mod:`logparse`):

* bridge requested and engaged: says so, with its slot count;
* bridge requested, not engaged, model split over more than one device: exits non-zero with the reason;
* bridge requested on a single device: says so plainly and keeps serving.

:class:`Server` is also what the ladder uses to run every mode.

Over 500 lines: one command's whole life cycle, read top to bottom: the selectors, the Server (start, readiness,
stop), the engagement proof from the log and from /metrics with its messages, and the run that forwards signals and
exit statuses. The proof's decision itself is engagement.py's; the next cut, if it grows, is the proof's messages
(check_engagement and its helpers) into a module of their own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import logparse, modes, rpc, runner
from .cli_options import add_rpc_arguments
from .config import Settings
from .engagement import ABSENT, BATCHED, BRIDGE, IDLE, from_metrics
from .errors import ServeError, UsageError
from .net import DEFAULT_HOST as DEFAULT_HOST  # re-exported
from .net import free_port as free_port  # re-exported: tests, scripts and the ladder pick ports with it
from .runner import log

# the selectors and their values are defined once, in modes.py
BRIDGE_VAR = modes.BRIDGE
BATCHED_VAR = modes.BATCHED
BRIDGE_VALUES, BATCHED_VALUES = modes.BRIDGE_VALUES, modes.BATCHED_VALUES
selector_env = modes.selector_env

DEFAULT_PORT = 8080

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


@dataclass
class Engagement:
    """What the log proves about the requested mechanisms."""

    info: logparse.LogInfo
    notes: list[str] = field(default_factory=list)  # plain statements for the user
    errors: list[str] = field(default_factory=list)  # reasons to exit non-zero

    @property
    def ok(self) -> bool:
        return not self.errors


def check_engagement(
    info: logparse.LogInfo,
    bridge: str | None,
    batched: str | None,
    n_devices: int | None = None,
    metrics: Mapping[str, int] | None = None,
    warmed_up: bool = True,
) -> Engagement:
    """Apply the launcher's rules to a parsed start-up log and, when given, the live counters of /metrics (patch
    0005; see the module docstring and :func:`ggml_bridge.engagement.from_metrics`). The counters prove engagement
    at the default log verbosity, where the INFO "enabled" lines are hidden and only the WARN lines ("inactive",
    rejected selectors) show."""
    eng = Engagement(info)
    ndev = info.n_devices if n_devices is None else n_devices
    b, t = info.bridge, info.batched
    if not ndev and b.inactive_reason:
        ndev = _devices_in_reason(b.inactive_reason)
    live = dict(metrics or {})
    for var, value in b.rejected.items():
        eng.errors.append(f'the server rejected {var}="{value}"' + (" (bridge off)" if var == BRIDGE_VAR else ""))
    vb, vt = from_metrics(BRIDGE, b, metrics), from_metrics(BATCHED, t, metrics)
    if bridge in ("on", "force"):
        if vb.engaged and b.enabled:
            eng.notes.append(
                f"bridge engaged: mode {b.mode}, {b.slots} slots x {b.slot_mib} MiB mapped pinned host memory"
                + (f", model on {ndev} devices" if ndev else "")
            )
            if bridge == "force" and b.mode != "force":
                eng.errors.append(f"bridge requested in mode force but the server reports mode {b.mode}")
        elif vb.engaged:
            eng.notes.append(
                f"bridge engaged: {live.get('bridge_boundaries_total', 0)} boundaries crossed through "
                f"mapped pinned host memory, {live.get('bridge_bytes_total', 0)} bytes "
                "(llamacpp:bridge_* on /metrics)"
            )
        elif ndev > 1:
            why = (
                f"the server says: inactive: {vb.reason}"
                if vb.reason is not None
                else "the server printed no ggml_cuda_mapped_host_bridge line (binary without the patch, or not a CUDA build?)"
            )
            eng.errors.append(f"bridge requested but not engaged on a {ndev}-device split; {why}")
        else:
            eng.notes.append(
                _not_engaged(
                    "bridge",
                    vb.reason and f"single device ({vb.reason})",
                    "single device or CPU, and the server printed no bridge line "
                    "(binary without the patch, or not a CUDA build)",
                )
            )
    elif bridge == "off" and vb.engaged:
        eng.errors.append(
            f"bridge requested off but the server reports it enabled (mode {b.mode})"
            if b.enabled
            else f"bridge requested off but /metrics counts {live.get('bridge_boundaries_total', 0)} "
            "boundaries crossed through it"
        )
    if batched == "on":
        if vt.engaged and t.enabled:
            eng.notes.append(f"batched transfers engaged: pinned pool up to {t.pool_mib} MiB")
        elif vt.engaged:
            eng.notes.append(
                f"batched transfers engaged: {live.get('batched_graphs_total', 0)} graph(s) staged, "
                f"{live.get('batched_async_uploads_total', 0)} asynchronous uploads "
                "(llamacpp:batched_* on /metrics)"
            )
        elif vt.state == IDLE and warmed_up:
            # patched, no "inactive" warning, and yet the start-up warm-up decode staged nothing
            eng.errors.append(
                "batched transfers requested but /metrics counts no staged graph after the warm-up "
                f"decode (llamacpp:batched_graphs_total {live.get('batched_graphs_total', 0)})"
            )
        else:
            no_line = (
                "the server printed no llama_batched_transfers line (binary without the patch?)"
                if metrics is None
                else "/metrics has no llamacpp:batched_* counters (binary without the patch?)"
                if vt.state == ABSENT
                else "/metrics counts no staged graph yet (no warm-up decode: --no-warmup)"
            )
            eng.notes.append(_not_engaged("batched transfers", vt.reason, no_line))
    elif batched == "off" and vt.engaged:
        eng.errors.append(
            "batched transfers requested off but the server reports them enabled"
            if t.enabled
            else f"batched transfers requested off but /metrics counts "
            f"{live.get('batched_graphs_total', 0)} staged graph(s)"
        )
    return eng


_REASON_DEVICES = re.compile(r"\b(?P<n>\d+) device\(s\)")


def _devices_in_reason(reason: str) -> int:
    """The device count an "inactive" reason of the bridge (patch 0001, a WARN line: shown at the default verbosity,
    where the INFO "using device" lines are not) states: "single device" 1, "... (2 device(s) on ...)" 2, a failed
    allocation of its slots (only tried for a split that needs them) at least 2; else 0 (not known)."""
    if reason.startswith("single device"):
        return 1
    if m := _REASON_DEVICES.search(reason):
        return int(m["n"])
    if "could not be allocated" in reason or "cudaHostAlloc" in reason:
        return 2
    return 0


def _not_engaged(what: str, reason: str | None, no_line: str) -> str:
    """The note for a mechanism that was asked for but may rightly stay off here (one device, CPU): the server's own
    reason when it gave one, else what was missing from its log."""
    if reason:
        return f"{what} not engaged: {reason}; serving anyway"
    return f"{what} not confirmed: {no_line}; serving anyway"


def _fmt_tail(lines: Sequence[str]) -> str:
    return "last server log lines:\n    " + "\n    ".join(lines) if lines else "the server printed nothing"


class Server:
    """One llama-server process: started, waited for, queried, stopped."""

    def __init__(
        self,
        binary: Path | str,
        server_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_file: Path | None = None,
        echo: bool = False,
        startup_timeout: float = 600.0,
        cwd: Path | None = None,
        verbose_proof: bool = True,
        log_max_bytes: int | None = None,
    ) -> None:
        self.binary = Path(os.path.abspath(binary))  # "./llama-server" must not become a PATH lookup
        self.env = dict(env or {})
        # verbose_proof: add -lv 4 (the INFO lines) unless a verbosity was chosen; serve proves from /metrics instead
        self.server_args, self.verbosity = with_verbosity(server_args, self.env, add=verbose_proof)
        self.log_max_bytes = log_max_bytes
        self.log_file = log_file
        self.echo = echo
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
            raise ServeError(
                f"model file not found: {model}", why="llama-server was not started", fix="check the -m path"
            )

    def start(self) -> "Server":
        self._precheck()
        on_line = (lambda line: print(line, file=sys.stderr, flush=True)) if self.echo else None
        self.proc = runner.start(
            [self.binary, *self.server_args],
            env=self.env,
            log_file=self.log_file,
            on_line=on_line,
            keep=logparse.is_read,
            error=ServeError,
            cwd=self.cwd,
            what=f"cannot start {self.binary}",
            log_max_bytes=self.log_max_bytes,
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

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        return self.proc.stop(timeout)

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
            if self.proc is not None and self.proc.poll() is not None:
                raise self._failure(f"llama-server died while serving POST {path}", "while serving") from None
            raise ServeError(f"POST {path} failed", why=str(e)) from None


# --- CLI -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bridge",
        choices=tuple(BRIDGE_VALUES),
        default=None,
        help=f"mapped pinned host bridge: sets {BRIDGE_VAR}=1|0|auto|force (default: unset)",
    )
    parser.add_argument(
        "--batched",
        choices=tuple(BATCHED_VALUES),
        default=None,
        help=f"batched pinned graph I/O transfers: sets {BATCHED_VAR}=1|0 (default: unset)",
    )
    parser.add_argument(
        "--server",
        type=Path,
        default=None,
        metavar="PATH",
        help="llama-server binary (default: the patched build from `ggml-bridge build`, else "
        "an installed ggml-bridge-server wheel)",
    )
    parser.add_argument(
        "--check", action="store_true", help="start, confirm what engaged, stop and exit (0: confirmed)"
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for /health (default: [serve] startup_timeout of the config file, 600)",
    )
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the server log to FILE (rotated to FILE.1 at --server-log-max-mb)",
    )
    parser.add_argument(
        "--server-log-max-mb",
        type=_log_cap,
        default=DEFAULT_LOG_MAX_MB,
        metavar="MB",
        help=f"rotate --server-log to FILE.1 when it reaches MB MiB, so the two files stay "
        f"under 2 x MB (default {DEFAULT_LOG_MAX_MB}; 0: no limit)",
    )
    add_rpc_arguments(parser)
    # Everything this parser does not know goes to llama-server, in order (the command registry's passthrough into
    # args.server_args, cli.COMMANDS["serve"]); after `--` everything does.
    parser.epilog = (
        "Other arguments (or all arguments after --) are passed to llama-server, e.g. "
        "ggml-bridge serve --bridge force -- -m model.gguf -ngl 99 --port 8080"
    )


DEFAULT_LOG_MAX_MB = 64
#: llama-server options that print something and exit without serving: serve runs the binary with them as it is
INFO_ONLY_FLAGS = ("-h", "--help", "--usage", "--version", "--list-devices", "--completion-bash")
METRICS_FLAG, METRICS_ENV = "--metrics", "LLAMA_ARG_ENDPOINT_METRICS"


def _log_cap(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 (no limit) or a positive number of MiB")
    return value


def needs_proof(bridge: str | None, batched: str | None) -> bool:
    """Whether the launcher has something to prove (a selector was set)."""
    return bridge is not None or batched is not None


def with_metrics(server_args: list[str], env: Mapping[str, str]) -> tuple[list[str], bool]:
    """``server_args`` with ``--metrics`` added unless the user enabled /metrics already; (args, added)."""
    if METRICS_FLAG in server_args or (env.get(METRICS_ENV) or os.environ.get(METRICS_ENV, "")).lower() in (
        "1",
        "true",
        "on",
        "enabled",
    ):
        return server_args, False
    return [*server_args, METRICS_FLAG], True


def run(args: argparse.Namespace, settings: Settings) -> int:
    server_args = list(getattr(args, "server_args", None) or [])
    if server_args and server_args[0] == "--":
        server_args = server_args[1:]
    env = selector_env(args.bridge, args.batched)
    from . import build  # the build's patched llama-server, else an installed ggml-bridge-server wheel's

    binary = (
        Path(args.server)
        if args.server is not None
        else build.locate(settings, "patched", "llama-server", installed=True)
    )
    if any(a in INFO_ONLY_FLAGS for a in server_args):  # `serve -- --help`: llama-server's own answer and status
        return runner.run(
            [binary, *server_args], env=env, check=False, capture=False, error=ServeError, what=f"cannot run {binary}"
        ).returncode
    proof = needs_proof(args.bridge, args.batched) or args.check
    metrics_added = False
    if proof:  # the proof reads the live counters on /metrics (patch 0005), not INFO lines at -lv 4
        server_args, metrics_added = with_metrics(server_args, env)
    topo = rpc.from_args(args, settings, binary, env, server_args, args.server_log.parent if args.server_log else None)
    cap = getattr(args, "server_log_max_mb", DEFAULT_LOG_MAX_MB)
    srv = Server(
        binary,
        server_args + (topo.server_args() if topo else []),
        env={**env, **rpc.front_env(args)},
        log_file=args.server_log,
        echo=True,
        startup_timeout=args.startup_timeout,
        verbose_proof=False,
        log_max_bytes=int(cap * (1 << 20)) if cap else None,
    )
    if metrics_added:
        log(f"ggml-bridge: added {METRICS_FLAG}: the engagement proof reads the transfer counters on /metrics")

    # Forward SIGINT/SIGTERM to the server (it runs in its own session, so it gets each signal once); SIGHUP
    # (terminal closed, ssh dropped) stops it like SIGTERM: llama-server has no SIGHUP handler of its own.
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if srv.proc is not None:
            srv.proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
        else:
            raise KeyboardInterrupt

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            if topo:
                topo.start(rpc.expected_version(binary))
            srv.start()
        except (KeyboardInterrupt, ServeError):
            rpc.raise_if_dead(topo, "during llama-server's start-up")
            if not received:
                raise
            srv.stop()
            log(f"ggml-bridge: interrupted during start-up (signal {received[0]})")
            return 128 + received[0]
        if received:  # a signal arrived just as it became ready: the server is shutting down
            rc = srv.proc.wait() if srv.proc else 1
            return _exit_status(rc, received[0])
        live = srv.metrics() if proof else None
        eng = check_engagement(
            srv.info(),
            args.bridge,
            args.batched,
            rpc.front_devices(srv.info()) if topo else None,
            metrics=live,
            warmed_up="--no-warmup" not in server_args,
        )
        if topo:
            notes, errors = topo.engagement(args.bridge)
            eng.notes += [topo.describe(srv.info().devices), *notes]
            eng.errors += errors
        if (
            proof
            and live is None
            and srv.verbosity < CONTRACT_VERBOSITY
            and (args.bridge in ("on", "force") or args.batched == "on")
        ):
            eng.notes.append(
                f"the server answers no /metrics and log verbosity {srv.verbosity} hides the 'enabled' "
                f"lines (INFO messages): use -lv {CONTRACT_VERBOSITY} for the proof from the log"
            )
        for note in eng.notes:
            log(f"ggml-bridge: {note}")
        if not eng.ok:
            srv.stop()
            raise ServeError(eng.errors[0], why="; ".join(eng.errors[1:]) or None)
        assert srv.proc is not None
        log(f"ggml-bridge: llama-server ready in {srv.ready_s:.1f}s (pid {srv.proc.pid})")
        print(srv.url, flush=True)
        if args.check:
            if live:  # (check_engagement required the warm-up's staged graph when batching is on)
                log("ggml-bridge: /metrics: " + " ".join(f"{k}={v}" for k, v in live.items()))
            stopped = srv.stop()
            info = srv.info()
            for st in info.bridge.stats:
                log("ggml-bridge: bridge stats: " + " ".join(f"{k}={v}" for k, v in st.items()))
            for st in info.batched.stats:
                log("ggml-bridge: batched stats: " + " ".join(f"{k}={v}" for k, v in st.items()))
            for ep, c in (topo.counters() if topo else {}).items():
                log(f"ggml-bridge: rpc-server {ep} counters: " + " ".join(f"{k}={v}" for k, v in c.items()))
            log(f"ggml-bridge: check passed; server stopped (status {stopped})")
            return 0
        assert srv.proc is not None
        while True:
            try:
                rc = srv.proc.wait(timeout=0.5)
                break
            except Exception:  # noqa: BLE001 - TimeoutExpired: keep waiting (signals interrupt us here)
                rpc.raise_if_dead(topo, "while llama-server was serving")
                continue
        log(f"ggml-bridge: llama-server exited with status {rc}")
        rpc.raise_if_dead(topo, "while llama-server was serving")
        return _exit_status(rc, received[0] if received else None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if srv.proc is not None and srv.proc.poll() is None:
            srv.stop()
        if topo:
            topo.stop()


def _exit_status(rc: int | None, signum: int | None = None) -> int:
    """The launcher's status: the server's own, except that a server stopping cleanly because we were signalled
    gives 128 + the signal (the exit table's "stopped by signal N")."""
    if rc is None:
        return 1
    if signum is not None and rc == 0:
        return 128 + signum
    return 128 - rc if rc < 0 else rc
