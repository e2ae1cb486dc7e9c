"""``ggml-bridge serve``: launch llama-server with the runtime selectors set, and prove what engaged.

``ggml-bridge serve [--bridge on|off|auto|force] [--batched on|off] [--] <llama-server args>``

The selectors are environment variables read by the patched build (docs/DESIGN.md):
``GGML_CUDA_MAPPED_HOST_BRIDGE`` = 0|1|auto|force and ``LLAMA_BATCHED_TRANSFERS`` = 0|1; both mechanisms print their
counters at teardown whenever they are on. When a selector is set (or with ``--check``) the launcher adds
``--metrics`` and proves engagement from the live counters on ``/metrics`` (patch 0005) together with the start-up
log's WARN lines (:mod:`ggml_bridge.runtime.proof`); with ``-lv 4`` the INFO "enabled" lines count too:

* a mechanism asked for (``--bridge on|auto|force``, ``--batched on``: :class:`ggml_bridge.runtime.modes.Selectors`) and
  engaged: says so;
* the bridge asked for, not engaged, model split over more than one device: exits non-zero with the reason;
* asked for on a single device or the CPU: says so plainly and keeps serving.

The process itself is :class:`ggml_bridge.runtime.llama_server.Server`, which the ladder and the bench run too.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..foundations import files, flags, runner, signals
from ..foundations.config import Settings
from ..foundations.errors import ServeError, UsageError, os_reason
from ..foundations.flags import flag
from ..foundations.runner import log
from . import modes, rpc
from .llama_server import CONTRACT_VERBOSITY, Server, ServerLog
from .modes import Selectors
from .proof import Engagement, check_engagement, prove_allreduce, splits_by_tensor
from .shaper import parse_link

DEFAULT_LOG_MAX_MB = 64
#: llama-server options that print something and exit without serving: serve runs the binary with them as it is
INFO_ONLY_FLAGS = ("-h", "--help", "--usage", "--version", "--list-devices", "--completion-bash")
METRICS_FLAG, METRICS_ENV = "--metrics", "LLAMA_ARG_ENDPOINT_METRICS"


def take_rpc_arg(server_args: list[str]) -> str | None:
    """Remove llama-server's own ``--rpc LIST`` from ``server_args`` (given after ``--``) and return LIST,
    so that those endpoints are checked too."""
    value = None
    i = 0
    while i < len(server_args):
        a = server_args[i]
        if a == "--rpc" and i + 1 < len(server_args):
            value = server_args[i + 1]
            del server_args[i : i + 2]
        elif a.startswith("--rpc="):
            value = a.split("=", 1)[1]
            del server_args[i]
        else:
            i += 1
    return value


@dataclass(frozen=True)
class RpcOptions:
    """The RPC topology serve's options ask for (``--rpc``, ``--rpc-local*``, ``--rpc-link``, ``--rpc-server``)."""

    endpoints: str | None = None
    """``--rpc``: remote rpc-servers, ``host:port,...``."""
    local: int = 0
    """``--rpc-local N``: local rpc-servers to start."""
    local_devices: tuple[tuple[str, ...], ...] = ()
    """``--rpc-local-devices``: the devices of each local rpc-server (sets their number)."""
    local_only: bool = False
    """``--rpc-local-only``: llama-server gets no GPU of its own."""
    link: str | None = None
    """``--rpc-link RATE/DELAY``: a shaped loopback link in front of each local rpc-server."""
    server: Path | None = None
    """``--rpc-server``: the ggml-rpc-server binary."""

    @property
    def n_local(self) -> int:
        return len(self.local_devices) or self.local


def rpc_topology(
    opts: RpcOptions,
    settings: object,
    server_binary: Path,
    env: Mapping[str, str],
    server_args: list[str],
    log_dir: Path | None = None,
) -> rpc.Topology | None:
    """The topology the serve options ask for (None: no RPC), not started yet. A ``--rpc`` in
    ``server_args`` is taken out of them and joins ``opts.endpoints``."""
    given = [x for x in (opts.endpoints, take_rpc_arg(server_args)) if x]
    remote = rpc.parse_endpoints(",".join(given)) if given else []
    devices = [list(d) for d in opts.local_devices]
    n = opts.n_local
    if n < 0:
        raise UsageError("--rpc-local must be 0 or more")
    if opts.link and not n:
        raise UsageError(
            "--rpc-link needs local rpc-servers",
            why="a remote endpoint's link is the network's",
            fix="add --rpc-local N or --rpc-local-devices",
        )
    if opts.server is not None and not n:
        raise UsageError("--rpc-server is the program of --rpc-local", fix="add --rpc-local N or --rpc-local-devices")
    if not remote and not n:
        return None
    devices += [[] for _ in range(n - len(devices))]
    if opts.server is not None:  # the user's program, or an error: never silently another one
        binary = program(opts.server, "--rpc-server")
    else:
        binary = Path(server_binary).parent / rpc.RPC_SERVER
        if n and not binary.is_file():
            from ..distribution.builder import locate

            binary = locate.locate(settings, "patched", rpc.RPC_SERVER)  # type: ignore[arg-type]
    local = [
        rpc.LocalRpcServer(binary, devices=d, env=env, log_file=(log_dir / f"rpc-server-{i}.log") if log_dir else None)
        for i, d in enumerate(devices)
    ]
    return rpc.Topology(local, remote, link=parse_link(opts.link) if opts.link else None)


def program(path: Path, flag: str) -> Path:
    """A program the user named (``--server``, ``--rpc-server``): a file this user may execute; a UsageError naming
    ``flag`` otherwise (missing, a folder, not executable). One that is not a program for this machine (a bad ELF)
    is found when it is run."""
    try:
        st = path.stat()
    except OSError as e:
        raise UsageError(
            f"{flag} {path} cannot be used", why=os_reason(e), fix="give the path of the program"
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag} {path} is a folder, not a program", fix="give the program file inside it")
    if not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {path} is not executable", fix=f"chmod +x {path}, or give the program itself")
    return path


def front_env(opts: RpcOptions) -> dict[str, str]:
    """llama-server's extra environment: no GPU of its own with --rpc-local-only (a multi-host test topology)."""
    if opts.local_only:
        if not opts.n_local:
            raise UsageError("--rpc-local-only needs local rpc-servers", fix="add --rpc-local N or --rpc-local-devices")
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {}


@dataclass(frozen=True)
class ServeOptions:
    """What ``ggml-bridge serve`` was asked to do (its command line, typed): every option declared once on its field
    (:func:`flags.flag`), but the RPC topology and llama-server's own arguments, which the command line reads."""

    bridge: str | None = field(
        default=None,
        metadata=flag(
            "--bridge",
            parse=flags.choices(modes.BRIDGE_VALUES),
            help=f"the host bridge between GPUs (pinned host memory): sets {modes.BRIDGE}=1|0|auto|force (default: "
            "unset)",
        ),
    )
    batched: str | None = field(
        default=None,
        metadata=flag(
            "--batched",
            parse=flags.choices(modes.BATCHED_VALUES),
            help=f"batched pinned graph I/O transfers: sets {modes.BATCHED}=1|0 (default: unset)",
        ),
    )
    server: Path | None = field(
        default=None,
        metadata=flag(
            "--server",
            parse=flags.path,
            metavar="PATH",
            help="llama-server binary (default: the patched build from `ggml-bridge build`, else "
            "an installed ggml-bridge-server wheel)",
        ),
    )
    """llama-server binary (None: the patched build, else an installed ggml-bridge-server wheel)."""
    check: bool = field(
        default=False, metadata=flag("--check", help="start, confirm what engaged, stop and exit (0: confirmed)")
    )
    """Start, prove, stop and exit."""
    startup_timeout: float = field(
        default=600.0,
        metadata=flags.startup_timeout("/health (default: [serve] startup_timeout of the config file, 600)"),
    )
    """Unset on the command line: the ``[serve]`` settings' (``config.ServeSettings``)."""
    server_log: Path | None = field(
        default=None,
        metadata=flag(
            "--server-log",
            parse=flags.path,
            metavar="FILE",
            help="also write the server log to FILE (rotated to FILE.1 at --server-log-max-mb)",
            check=files.output_file,
        ),
    )
    server_log_max_mb: float = field(
        default=DEFAULT_LOG_MAX_MB,
        metadata=flag(
            "--server-log-max-mb",
            parse=flags.mebibytes,
            metavar="MB",
            help=f"rotate --server-log to FILE.1 when it reaches MB MiB, so the two files stay "
            f"under 2 x MB (default {DEFAULT_LOG_MAX_MB}; 0: no limit)",
        ),
    )
    rpc: RpcOptions = field(default_factory=RpcOptions)
    server_args: tuple[str, ...] = ()
    """llama-server's own arguments, in order."""

    @property
    def selectors(self) -> Selectors:
        return Selectors(self.bridge, self.batched)


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


def run(opts: ServeOptions, settings: Settings) -> int:
    server_args = list(opts.server_args)
    if server_args and server_args[0] == "--":
        server_args = server_args[1:]
    sel = opts.selectors
    modes.check_selector_env(os.environ, sel)
    modes.check_batched_args(sel, server_args, os.environ)
    env = sel.env()
    from ..distribution.builder import (
        locate,
    )  # the build's patched llama-server, else an installed ggml-bridge-server wheel's

    if opts.server is not None:
        binary = program(opts.server, "--server")
    else:
        binary = locate.locate(settings, "patched", "llama-server", installed=True)
    if any(a in INFO_ONLY_FLAGS for a in server_args):  # `serve -- --help`: llama-server's own answer and status
        return runner.run(
            [binary, *server_args],
            env=env,
            check=False,
            output=runner.Output(capture=False),
            failure=runner.Failure(
                UsageError if opts.server is not None else ServeError,
                what=f"--server {binary} cannot be run" if opts.server is not None else f"cannot run {binary}",
            ),
        ).returncode
    proof = sel.any_set or opts.check
    metrics_added = False
    if proof:  # the proof reads the live counters on /metrics (patch 0005), not INFO lines at -lv 4
        server_args, metrics_added = with_metrics(server_args, env)
    log_dir = opts.server_log.parent if opts.server_log else None
    topo = rpc_topology(opts.rpc, settings, binary, env, server_args, log_dir)
    cap = opts.server_log_max_mb
    srv = Server(
        binary,
        server_args + (topo.server_args() if topo else []),
        env={**env, **front_env(opts.rpc)},
        log=ServerLog(opts.server_log, echo=True, max_bytes=int(cap * (1 << 20)) if cap else None),
        startup_timeout=opts.startup_timeout,
        # -sm tensor: the all-reduce path is said only at INFO level (upstream exports no counter of it)
        verbose_proof=opts.check and splits_by_tensor(server_args, os.environ),
    )
    if metrics_added:
        log(f"ggml-bridge: added {METRICS_FLAG}: the engagement proof reads the transfer counters on /metrics")
    if opts.rpc.local_only:
        log(
            "ggml-bridge: --rpc-local-only: llama-server starts with CUDA_VISIBLE_DEVICES= (the GPUs are the "
            "rpc-servers'); a CUDA build's \"failed to initialize CUDA: no CUDA-capable device\" from it is expected"
        )
    return _Launch(opts, srv, topo, proof, warmed_up="--no-warmup" not in server_args).run()


class _Launch:
    """One launch: signals forwarded to the server, start-up, the proof, then ``--check``'s report or the wait."""

    def __init__(self, opts: ServeOptions, srv: Server, topo: rpc.Topology | None, proof: bool, warmed_up: bool):
        self.opts, self.srv, self.topo, self.proof, self.warmed_up = opts, srv, topo, proof, warmed_up
        self.received: list[int] = []
        self._escalation: threading.Timer | None = None

    def forward(self, signum: int, _frame: Any) -> None:
        """SIGINT/SIGTERM go to the server (it runs in its own session, so it gets each signal once); SIGHUP
        (terminal closed, ssh dropped) stops it like SIGTERM: llama-server has no SIGHUP handler of its own. A
        server still running after the stop grace (``GGML_BRIDGE_STOP_GRACE``, 10 s) gets SIGKILL."""
        self.received.append(signum)
        if self.srv.proc is not None:
            self.srv.proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
            if self._escalation is None:
                self._escalation = threading.Timer(signals.grace_or_default(), self._kill)
                self._escalation.daemon = True
                self._escalation.start()
        else:
            raise KeyboardInterrupt

    def _kill(self) -> None:
        proc = self.srv.proc
        if proc is not None and proc.poll() is None:
            log(
                f"ggml-bridge: llama-server (pid {proc.pid}) did not stop within {signals.grace_or_default():g}s of "
                "the signal; killing it"
            )
            proc.popen.kill()

    def run(self) -> int:
        old = {s: signal.signal(s, self.forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._run()
        finally:
            if self._escalation is not None:
                self._escalation.cancel()
            for s, h in old.items():
                signal.signal(s, h)
            if self.srv.proc is not None and self.srv.proc.poll() is None:
                self.srv.stop()
            if self.topo:
                self.topo.stop()

    def _run(self) -> int:
        srv, topo = self.srv, self.topo
        try:
            if topo:
                topo.start(rpc.expected_version(srv.binary))
            srv.start()
        except (KeyboardInterrupt, ServeError):
            rpc.raise_if_dead(topo, "during llama-server's start-up")
            if not self.received:
                raise
            rc = srv.stop()
            log(f"ggml-bridge: interrupted during start-up (signal {self.received[0]})")
            return _exit_status(rc, self.received[0])  # 137 when the server had to be killed
        if self.received:  # a signal arrived just as it became ready: the server is shutting down
            rc = srv.proc.wait() if srv.proc else 1
            return _exit_status(rc, self.received[0])
        live = srv.metrics() if self.proof else None
        eng = self.prove(live)
        for note in eng.notes:
            log(f"ggml-bridge: {note}")
        if not eng.ok:
            srv.stop()
            raise ServeError(eng.errors[0], why="; ".join(eng.errors[1:]) or None)
        assert srv.proc is not None
        log(f"ggml-bridge: llama-server ready in {srv.ready_s:.1f}s (pid {srv.proc.pid})")
        print(srv.url, flush=True)
        return self.check(live) if self.opts.check else self.wait()

    def prove(self, live: dict[str, int] | None) -> Engagement:
        srv, topo, sel = self.srv, self.topo, self.opts.selectors
        info = srv.info()
        eng = check_engagement(
            info,
            sel.bridge,
            sel.batched,
            rpc.front_devices(info) if topo else None,
            metrics=live,
            warmed_up=self.warmed_up,
            front=self.front(rpc.front_devices(info)) if topo else None,
        )
        env = {**os.environ, **srv.env}  # the server inherits this process's environment
        if splits_by_tensor(srv.server_args, env):
            prove_allreduce(eng, env, srv.verbosity >= CONTRACT_VERBOSITY)
        if topo:
            notes, errors = topo.engagement(sel.bridge)
            eng.notes += [topo.describe(info.devices), *notes]
            eng.errors += errors
        if info.cuda_init_failed and self.opts.rpc.local_only:
            eng.notes.append(
                f"llama-server's \"failed to initialize CUDA: {info.cuda_init_failed}\" is expected: --rpc-local-only "
                "starts it with CUDA_VISIBLE_DEVICES= (the GPUs are the rpc-servers')"
            )
        elif info.cuda_init_failed:
            eng.notes.append(f"llama-server found no CUDA device ({info.cuda_init_failed}): it computes on the CPU")
        if self.proof and live is None and srv.verbosity < CONTRACT_VERBOSITY and sel.mechanisms:
            eng.notes.append(
                f"the server answers no /metrics and log verbosity {srv.verbosity} hides the 'enabled' "
                f"lines (INFO messages): use -lv {CONTRACT_VERBOSITY} for the proof from the log"
            )
        return eng

    def front(self, n_devices: int) -> str:
        """How serve speaks of llama-server in an RPC topology: the front, and the devices of its own."""
        if self.opts.rpc.local_only:
            return "llama-server (the RPC front) has no GPU of its own (--rpc-local-only)"
        own = "no device" if not n_devices else "1 device" if n_devices == 1 else f"{n_devices} devices"
        return f"llama-server (the RPC front) uses {own} of its own"

    def check(self, live: dict[str, int] | None) -> int:
        """``--check``: the counters, the server stopped, its teardown stats."""
        if live:  # (check_engagement required the warm-up's staged graph when batching is on)
            log("ggml-bridge: /metrics: " + " ".join(f"{k}={v}" for k, v in live.items()))
        stopped = self.srv.stop()
        info = self.srv.info()
        for st in info.bridge.stats:
            log("ggml-bridge: bridge stats: " + " ".join(f"{k}={v}" for k, v in st.items()))
        for st in info.batched.stats:
            log("ggml-bridge: batched stats: " + " ".join(f"{k}={v}" for k, v in st.items()))
        for ep, c in (self.topo.counters() if self.topo else {}).items():
            log(f"ggml-bridge: rpc-server {ep} counters: " + " ".join(f"{k}={v}" for k, v in c.items()))
        log(f"ggml-bridge: check passed; server stopped (status {stopped})")
        return 0

    def wait(self) -> int:
        """Serve until the server exits (signals interrupt the wait and are forwarded)."""
        assert self.srv.proc is not None
        while True:
            try:
                rc = self.srv.proc.wait(timeout=0.5)
                break
            except Exception:  # noqa: BLE001 - TimeoutExpired: keep waiting (signals interrupt us here)
                rpc.raise_if_dead(self.topo, "while llama-server was serving")
                continue
        log(f"ggml-bridge: llama-server exited with status {rc}")
        rpc.raise_if_dead(self.topo, "while llama-server was serving")
        return _exit_status(rc, self.received[0] if self.received else None)


def _exit_status(rc: int | None, signum: int | None = None) -> int:
    """The launcher's status: the server's own, except that a server stopping cleanly because we were signalled
    gives 128 + the signal (the exit table's "stopped by signal N")."""
    if rc is None:
        return 1
    if signum is not None and rc == 0:
        return 128 + signum
    return 128 - rc if rc < 0 else rc
