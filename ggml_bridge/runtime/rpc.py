"""RPC topologies: ggml-rpc-server processes started here or given as ``host:port``, checked before llama-server
starts, watched while it serves, and the one line that says which boundaries cross TCP (docs/rpc.md).

What upstream does at each boundary of a split that uses RPC devices:

* two CUDA devices of one process (llama-server, or one rpc-server): the CUDA backend's copy, i.e. the bridge
  (in llama-server through ``cpy_tensor_async``; inside an rpc-server through ``RPC_CMD_COPY_TENSOR`` ->
  ``ggml_backend_buffer_copy_tensor`` -> the bridge's synchronous path);
* anything <-> an RPC device of another process: the RPC backend has no ``cpy_tensor_async`` and cannot copy
  between servers, so the scheduler stages the tensor in llama-server's host memory and sends it with
  ``RPC_CMD_GET_TENSOR`` / ``RPC_CMD_SET_TENSOR`` over TCP (two hops between two rpc-servers).

The handshake (``RPC_CMD_HELLO``) carries only the protocol version, which a patched and an upstream build
of one upstream release share: :func:`hello` detects a different protocol (another upstream release) and
anything that is not an rpc-server; a patched front with an upstream rpc-server is only visible from the
rpc-server's own log (no ``ggml_bridge_rpc: state`` line), i.e. for the servers started here.

The topology serve's options describe is :func:`ggml_bridge.runtime.serve.rpc_topology`'s.
"""

from __future__ import annotations

import re
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..foundations import files, runner
from ..foundations.errors import RpcError, UsageError
from ..foundations.net import free_port, parse_hostport
from ..foundations.tomlfile import Key
from . import logparse, shaper
from .engagement import BRIDGE, engaged
from .modes import RPC_SERVER as RPC_SERVER  # re-exported: the ladder and the bench start it
from .modes import Selectors

#: RPC_CMD_HELLO and the sizes of rpc_msg_hello_req / _rsp (ggml-rpc.cpp, transport.h RPC_CONN_CAPS_SIZE)
HELLO_CMD = 14
CONN_CAPS_SIZE = 24
HELLO_RSP_SIZE = 4 + CONN_CAPS_SIZE
CONNECT_TIMEOUT = 3.0
#: how long a started rpc-server's banner may come after its first handshake was answered (see _await_banner)
BANNER_WAIT_S = 5.0
_PROTO = re.compile(r"#define\s+RPC_PROTO_(MAJOR|MINOR|PATCH)_VERSION\s+(\d+)")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(spec: str) -> list[Endpoint]:
    """``host:port,host:port`` (llama-server's ``--rpc`` syntax) -> endpoints; UsageError on a bad entry."""
    out: list[Endpoint] = []
    for item in (x.strip() for x in spec.split(",")):
        host, port = parse_hostport(
            item, "--rpc:", example="a comma-separated list such as 192.168.1.2:50052,192.168.1.3:50052"
        )
        out.append(Endpoint(host, port))
    if len(set(out)) != len(out):
        raise UsageError(f"--rpc {spec}: an endpoint is listed twice")
    return out


def protocol_version(source_dir: Path | str | None) -> tuple[int, int, int] | None:
    """RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION of a llama.cpp tree (None if it has no ggml-rpc.h)."""
    if source_dir is None:
        return None
    try:
        text = (Path(source_dir) / "ggml" / "include" / "ggml-rpc.h").read_text(errors="replace")
    except OSError:
        return None
    found = dict(_PROTO.findall(text))
    if set(found) != {"MAJOR", "MINOR", "PATCH"}:
        return None
    return int(found["MAJOR"]), int(found["MINOR"]), int(found["PATCH"])


def compatible(client: tuple[int, int, int], server: tuple[int, int, int]) -> bool:
    """The client's own rule (negotiate_hello): same major, server minor not newer."""
    return server[0] == client[0] and server[1] <= client[1]


def hello(ep: Endpoint, timeout: float = CONNECT_TIMEOUT) -> tuple[int, int, int]:
    """Connect, send RPC_CMD_HELLO, return the server's protocol version; RpcError within ~2x timeout."""
    where = f"RPC endpoint {ep}"
    try:
        sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
    except socket.gaierror as e:
        raise RpcError(
            f"{where}: cannot resolve host {ep.host!r}", why=str(e), fix="check the host name in --rpc"
        ) from None
    except ConnectionRefusedError:
        raise RpcError(
            f"{where}: connection refused",
            why="nothing listens on that port",
            fix=f"start `{RPC_SERVER} -H <address> -p {ep.port}` on that host (docs/rpc.md), or fix the port",
        ) from None
    except (socket.timeout, TimeoutError):
        raise RpcError(
            f"{where}: unreachable",
            why=f"no TCP answer within {timeout:.0f}s",
            fix="check the address, the network and the host's firewall",
        ) from None
    except OSError as e:
        raise RpcError.of_os(e, f"{where}: cannot connect", fix="check the address and the network") from None
    with sock:
        try:
            sock.settimeout(timeout)
            sock.sendall(bytes([HELLO_CMD]) + struct.pack("<Q", CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
            head = _recv_exact(sock, 8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            body = _recv_exact(sock, HELLO_RSP_SIZE) if size == HELLO_RSP_SIZE else b""
        except (socket.timeout, TimeoutError):
            raise RpcError(
                f"{where}: no answer to the RPC handshake within {timeout:.0f}s",
                why="the port accepts connections but does not speak the RPC protocol, or the "
                "rpc-server is serving another client (it serves one at a time)",
                fix="check that the port is an rpc-server's and that no other llama.cpp client uses it",
            ) from None
        except OSError as e:
            raise RpcError.of_os(
                e,
                f"{where}: the RPC handshake failed",
                fix="check that the port is an rpc-server's",
            ) from None
    if len(body) != HELLO_RSP_SIZE:
        raise RpcError(
            f"{where}: not an rpc-server",
            why=f"its answer to RPC_CMD_HELLO is not a hello response ({len(head)} + {len(body)} bytes)",
            fix="check the port",
        )
    return body[0], body[1], body[2]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def check_endpoints(
    endpoints: Sequence[Endpoint], expected: tuple[int, int, int] | None, timeout: float = CONNECT_TIMEOUT
) -> dict[Endpoint, tuple[int, int, int]]:
    """Every endpoint answers the handshake with a protocol this llama-server accepts (before it starts:
    llama-server aborts on a failed handshake)."""
    versions: dict[Endpoint, tuple[int, int, int]] = {}
    for ep in endpoints:
        v = hello(ep, timeout)
        if expected is not None and not compatible(expected, v):
            raise RpcError(
                f"RPC endpoint {ep} speaks RPC protocol {'.'.join(map(str, v))}, this llama-server "
                f"{'.'.join(map(str, expected))}",
                why="the two are builds of different llama.cpp releases; llama-server would abort "
                "with 'RPC server version mismatch'",
                fix="build the rpc-server from the same pinned llama.cpp (`ggml-bridge build` on "
                "that host, docs/rpc.md)",
            )
        versions[ep] = v
    return versions


class LocalRpcServer:
    """One ggml-rpc-server started here, on 127.0.0.1 and a free port unless given."""

    def __init__(
        self,
        binary: Path | str,
        *,
        devices: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_file: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        threads: int | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.devices = list(devices)
        self.env = dict(env or {})
        self.log_file = log_file
        self.endpoint = Endpoint(host, port or free_port(host))
        self.threads = threads
        self.proc: runner.Process | None = None

    def argv(self) -> list[str]:
        a = [str(self.binary), "-H", self.endpoint.host, "-p", str(self.endpoint.port)]
        if self.devices:
            a += ["-d", ",".join(self.devices)]
        if self.threads:
            a += ["-t", str(self.threads)]
        return a

    def start(self, timeout: float = 60.0) -> "LocalRpcServer":
        if not self.binary.is_file():
            raise RpcError(
                f"{RPC_SERVER} not found: {self.binary}",
                fix="rebuild with `ggml-bridge build` (it builds ggml-rpc-server with GGML_RPC=ON)",
            )
        if self.log_file:
            self.log_file.unlink(missing_ok=True)
        self.proc = runner.start(
            self.argv(),
            env=self.env,
            pump=runner.Pump(log_file=self.log_file),
            failure=runner.Failure(RpcError, what=f"cannot start {self.binary}"),
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.proc.wait(5)
                raise RpcError(
                    f"{RPC_SERVER} on {self.endpoint} exited during start-up (status {self.proc.returncode})",
                    why=self._tail(),
                )
            # listening once it answers the handshake (its "state" line is printed before it binds)
            try:
                hello(self.endpoint, timeout=2.0)
                self._await_banner(BANNER_WAIT_S)
                return self
            except RpcError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RpcError(
                        f"{RPC_SERVER} on {self.endpoint} did not answer within {timeout:.0f}s", why=self._tail()
                    ) from None
            time.sleep(0.1)

    def _await_banner(self, seconds: float) -> None:
        """Until the output read so far holds upstream's banner (version and devices), at most ``seconds``: the
        rpc-server prints it to stdout, which a pipe buffers until the fflush after its first accepted connection
        (here: our handshake), so it may come after the handshake's answer; ``info()`` reads it."""
        assert self.proc is not None
        deadline = time.monotonic() + seconds
        while logparse.parse_rpc(self.proc.lines()).version is None and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return
            time.sleep(0.01)

    def _tail(self) -> str:
        lines = self.proc.tail(12) if self.proc else []
        return "last lines:\n    " + "\n    ".join(lines) if lines else "it printed nothing"

    def info(self) -> logparse.RpcServerInfo:
        return logparse.parse_rpc(self.proc.lines() if self.proc else [])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def counters(self, timeout: float = 5.0) -> dict[str, int]:
        """Ask for a counters line (SIGUSR1) and return it. Only patch 0006's rpc-server takes SIGUSR1:
        to an upstream one it is fatal, so its state line must have been seen."""
        if not self.alive():
            raise RpcError(f"{RPC_SERVER} on {self.endpoint} is not running", why=self._tail())
        info = self.info()
        if info.state is None:
            raise RpcError(
                f"{RPC_SERVER} on {self.endpoint} reports no counters",
                why="it printed no 'ggml_bridge_rpc: state' line: an upstream build without patch 0006",
                fix="use the patched build's ggml-rpc-server",
            )
        seen = len(info.counters)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.info()
            if len(info.counters) > seen:
                return info.counters[-1]
            time.sleep(0.05)
        raise RpcError(
            f"{RPC_SERVER} on {self.endpoint} printed no counters line within {timeout:.0f}s of SIGUSR1",
            why=self._tail(),
        )

    def stop(self, timeout: float = 10.0) -> int | None:
        return self.proc.stop(timeout) if self.proc else None


@dataclass
class Topology:
    """The RPC side of one llama-server: servers started here and endpoints given; with ``link``, a shaped
    loopback link (:mod:`shaper`) between llama-server and each local rpc-server, as between hosts."""

    local: list[LocalRpcServer] = field(default_factory=list)
    remote: list[Endpoint] = field(default_factory=list)
    link: shaper.Link | None = None
    shapers: list[shaper.Shaper] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the shapers' ports are chosen now (like the local servers'), so llama-server's --rpc is known before start
        if self.link is not None and not self.shapers:
            self.shapers = [
                shaper.Shaper(
                    (s.endpoint.host, s.endpoint.port),
                    self.link,
                    listen_port=free_port(),
                    name=f"shaper-{s.endpoint.port}",
                )
                for s in self.local
            ]

    @property
    def endpoints(self) -> list[Endpoint]:
        return [s.endpoint for s in self.local] + list(self.remote)

    @property
    def front_endpoints(self) -> list[Endpoint]:
        """What llama-server connects to: the shapers' ends where there are shapers."""
        if not self.shapers:
            return self.endpoints
        return [Endpoint(sh.listen_host, sh.listen_port) for sh in self.shapers] + list(self.remote)

    def server_args(self) -> list[str]:
        eps = self.front_endpoints
        return ["--rpc", ",".join(str(e) for e in eps)] if eps else []

    def start(self, expected: tuple[int, int, int] | None, timeout: float = 60.0) -> "Topology":
        """Start the local servers, then check every endpoint's handshake, then the shapers. On failure nothing
        is left running."""
        try:
            for s in self.local:
                s.start(timeout)
            check_endpoints(self.endpoints, expected)
            for sh in self.shapers:
                sh.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for sh in self.shapers:
            sh.stop()
        for s in self.local:
            s.stop()

    def link_stats(self) -> dict[str, dict[str, Any]]:
        """Per local rpc-server endpoint, what crossed its shaped link (empty without a link)."""
        return {str(s.endpoint): sh.stats() for s, sh in zip(self.local, self.shapers, strict=False)}

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dead(self) -> list[str]:
        """One sentence per local rpc-server that has exited (e.g. killed during a request)."""
        out = []
        for s in self.local:
            if s.proc is not None and s.proc.poll() is not None:
                rc = s.proc.returncode
                how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with status {rc}"
                out.append(f"{RPC_SERVER} on {s.endpoint} (pid {s.proc.pid}) {how}")
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """The latest counters of every local patched rpc-server, by endpoint."""
        return {str(s.endpoint): s.counters() for s in self.local if s.alive() and s.info().state is not None}

    def describe(self, front_devices: Sequence[str]) -> str:
        """One line: which boundaries cross TCP and which the bridge can carry."""
        local_gpus = [d for d in dict.fromkeys(front_devices) if not d.startswith("RPC")]
        over = f" (shaped: {self.link})" if self.shapers else ""
        tcp = [f"llama-server<->{e}{over}" for e in self.endpoints]
        if len(self.endpoints) > 1:
            tcp.append("rpc-server<->rpc-server (2 hops through llama-server's host memory)")
        bridge = []
        if len(local_gpus) > 1:
            bridge.append("llama-server " + "<->".join(local_gpus))
        for s in self.local:
            devs = s.info().devices or s.devices
            if len([d for d in devs if d.startswith("CUDA")]) > 1:
                bridge.append(f"inside {s.endpoint} " + "<->".join(devs) + " (COPY_TENSOR)")
        if self.remote:
            bridge.append(f"inside {', '.join(map(str, self.remote))}: not visible from here")
        return f"rpc: over TCP: {', '.join(tcp) or 'nothing'}; through the bridge: {'; '.join(bridge) or 'nothing'}"

    def engagement(self, bridge: str | None) -> tuple[list[str], list[str]]:
        """(notes, errors) for the bridge inside the local rpc-servers: required where one owns 2+ GPUs."""
        notes: list[str] = []
        errors: list[str] = []
        for ep, st in self.link_stats().items():  # llama-server has loaded its layers through each link by now
            up, down = st["up"]["bytes"], st["down"]["bytes"]
            if up > 0 and down > 0:
                notes.append(f"shaped link {st['link']} to {RPC_SERVER} on {ep}: {up} B up, {down} B down so far")
            else:
                errors.append(
                    f"nothing crossed the shaped link {st['link']} to {RPC_SERVER} on {ep} "
                    f"({up} B up, {down} B down): llama-server did not use it"
                )
        if not Selectors(bridge).asks_bridge:
            return notes, errors
        for s in self.local:
            info = s.info()
            gpus = [d for d in info.devices if d.startswith("CUDA")]
            where = f"{RPC_SERVER} on {s.endpoint}"
            v = engaged(BRIDGE, info.bridge)
            if v.engaged:
                notes.append(f"bridge engaged in {where}: mode {info.bridge.mode}, {len(gpus)} GPUs")
            elif len(gpus) > 1:
                why = (
                    f"it says: inactive: {v.reason}"
                    if v.reason
                    else "it printed no ggml_cuda_mapped_host_bridge line (an upstream build?)"
                )
                errors.append(f"bridge requested but not engaged in {where}, which owns {len(gpus)} GPUs; {why}")
            else:
                notes.append(f"{where}: {len(gpus) or 'no'} GPU, no boundary inside it for the bridge")
        for e in self.remote:
            notes.append(
                f"bridge state of {e} not visible from here: start it with "
                "GGML_CUDA_MAPPED_HOST_BRIDGE=1 and read its log (docs/rpc.md)"
            )
        return notes, errors


# --- serve's hooks -------------------------------------------------------------------------------------------


def expected_version(server_binary: Path) -> tuple[int, int, int] | None:
    """The RPC protocol of the tree a ggml-bridge build of ``server_binary`` came from (None if unknown)."""
    manifest = files.read_record(
        Path(server_binary).resolve().parent.parent / "manifest.json", shape={"source_dir": Key("str")}
    )
    return protocol_version(manifest.get("source_dir")) if manifest is not None else None


def front_devices(info: logparse.LogInfo) -> int:
    """Devices of llama-server's own process the model uses (the RPC ones are other processes)."""
    return len([d for d in dict.fromkeys(info.devices) if not d.startswith("RPC")])


def raise_if_dead(topo: Topology | None, during: str) -> None:
    if topo is not None and (dead := topo.dead()):
        raise RpcError(
            f"{dead[0]} {during}",
            why="; ".join(dead[1:]) or None,
            fix="see its log; the launcher stopped llama-server and the other rpc-servers",
        )
