"""A userspace link shaper: a loopback TCP proxy that gives the connections through it the bandwidth and one-way
latency of a network link between hosts (the GPU machines have no ``tc`` and no network to install it).

``ggml-bridge shape --listen PORT --to HOST:PORT --rate 10gbit --delay 0.2ms`` (or, in-process, :class:`Shaper`)
accepts connections on 127.0.0.1:PORT and opens one to HOST:PORT for each. Every byte is carried through a
model of one full-duplex link, one instance per direction shared by all connections through the shaper:

* bandwidth: the direction serializes what it has read at ``rate`` bytes per second in arrival order (a FIFO
  link; a token bucket whose burst is one read of at most :data:`CHUNK` bytes): a chunk of ``n`` bytes read at
  ``t`` starts at ``max(t, link_free)`` and leaves at ``link_free = start + n / rate``;
* latency: it is delivered ``delay`` after it left (a timestamped queue; a writer thread sleeps until then);
* flow control: a direction holds at most ``max(8 MiB, 2 * rate * delay)`` bytes in flight; beyond that its reader
  stops reading and TCP pushes back on the sender, as a real link's buffers would.

So a message of ``b`` bytes sent at ``t0`` on an idle link arrives complete at ``t0 + b / rate + delay``, and a
request/response pair costs ``2 * delay`` more than on loopback. Accuracy is bounded by the host's timers (the
writer threads ask for 1 µs timer slack; Python's sleep then overshoots by ~5-30 µs) and by what one Python
thread pair can move: :func:`ggml_bridge.runtime.netbench.measure_ceiling` measures that ceiling, which the bench reports
next to the set rate.

Loopback only: both ends must be 127.0.0.0/8 or ::1 (this is a test device for one machine, not a router).

The command ``ggml-bridge shape`` is :mod:`ggml_bridge.commands.shape`.
"""

from __future__ import annotations

import collections
import ctypes
import ipaddress
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Deque

from ..foundations.errors import RpcError, UsageError

CHUNK = 256 * 1024  # the most one read takes from a socket (the link's burst)
MIN_IN_FLIGHT = 8 << 20  # bytes a direction may hold, at least
ACCEPT_POLL = 0.1  # seconds between checks of the stop flag in the accept loop
CONNECT_TIMEOUT = 5.0

_RATE_UNITS = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
}
_DELAY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


#: The rates a link may have (bytes per second): 1 kbit/s (slower, one message of a split would take minutes) to
#: 10 Tbit/s (faster than any loopback copy: say ``unlimited``).
MIN_RATE, MAX_RATE = 1e3 / 8, 10e12 / 8


def parse_rate(text: str) -> float:
    """``10gbit`` -> bytes/s (tc's units: ``bit``/``kbit``/``mbit``/``gbit``, 1000-based; ``bps``... are bytes);
    ``unlimited`` -> inf."""
    t = str(text).strip().lower()
    if t in ("unlimited", "inf", "0"):
        return math.inf
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)", t)
    rate = float(m.group(1)) * _RATE_UNITS[m.group(2)] if m and m.group(2) in _RATE_UNITS else 0.0
    if not MIN_RATE <= rate <= MAX_RATE:
        raise UsageError(
            f"bad link rate {text!r}",
            why=f"it is a number with a unit, from {fmt_rate(MIN_RATE)} to {fmt_rate(MAX_RATE)} (or unlimited)",
            fix="e.g. 10gbit, 25gbit, 800mbit (tc's units; kbps/mbps/gbps are bytes per second), or unlimited",
        )
    return rate


def parse_delay(text: str) -> float:
    """``0.2ms`` -> seconds (units s, ms, us); a bare ``0`` is no delay."""
    t = str(text).strip().lower()
    if t in ("0", "none"):
        return 0.0
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*(s|ms|us|µs)", t)
    if not m or float(m.group(1)) * _DELAY_UNITS[m.group(2)] > 10:
        raise UsageError(
            f"bad link delay {text!r}",
            why="it is a one-way latency of 0 to 10 s with a unit",
            fix="e.g. 0.2ms, 100us, 0",
        )
    return float(m.group(1)) * _DELAY_UNITS[m.group(2)]


def fmt_rate(rate: float) -> str:
    if math.isinf(rate):
        return "unlimited"
    bits = rate * 8
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= f:
            return f"{bits / f:g}{unit}"
    return f"{bits:g}bit"


def _fmt_delay(delay: float) -> str:
    return "0" if delay == 0 else f"{delay * 1e3:g}ms"


@dataclass(frozen=True)
class Link:
    """One direction's rate (bytes per second; inf: unlimited) and one-way delay (s); both directions alike."""

    rate: float
    delay: float

    @property
    def label(self) -> str:
        """A name usable in file and case names: ``10gbit-0.2ms``."""
        return f"{fmt_rate(self.rate)}-{_fmt_delay(self.delay)}"

    def __str__(self) -> str:
        return f"{fmt_rate(self.rate)}/{_fmt_delay(self.delay)}"

    @property
    def in_flight(self) -> int:
        bdp = 0 if math.isinf(self.rate) else 2 * self.rate * self.delay
        return int(max(MIN_IN_FLIGHT, bdp))


def parse_link(spec: str) -> Link:
    """``RATE/DELAY`` (``10gbit/0.2ms``) or ``RATE-DELAY`` (a :attr:`Link.label`)."""
    m = re.fullmatch(r"\s*([^/\s]+?)\s*[/-]\s*([^/\s-]+)\s*", str(spec))
    if not m:
        raise UsageError(f"bad link {spec!r}", why="a link is RATE/DELAY", fix="e.g. 10gbit/0.2ms or 25gbit/0.1ms")
    return Link(parse_rate(m.group(1)), parse_delay(m.group(2)))


def is_loopback(host: str) -> bool:
    """``host`` resolves to loopback addresses only; a UsageError when it does not resolve at all."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(
            f"link shaper: {host} does not resolve", why=str(e), fix="use 127.0.0.1 or a name of this machine"
        ) from None
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _fine_timer_slack() -> None:
    """Ask Linux for 1 µs timer slack on the calling thread (PR_SET_TIMERSLACK; default 50 µs): the delivery
    sleeps are then ~30 µs late at worst on a busy machine instead of ~80 µs. Best effort."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Direction:
    """The link model of one direction: the time it is next free, and its counters."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.lock = threading.Lock()
        self.free_at = 0.0
        self.bytes = 0
        self.chunks = 0
        self.busy_s = 0.0  # time the link spent serializing (bytes / rate)
        self.sends = 0  # deliveries (one send of everything due at once)
        self.late_s = 0.0  # how late deliveries were, summed (timer overshoot, a writer behind)
        self.late_max_s = 0.0

    def schedule(self, n: int, now: float) -> float:
        """Deliver-by time of ``n`` bytes read at ``now``."""
        with self.lock:
            start = max(now, self.free_at)
            serial = 0.0 if math.isinf(self.link.rate) else n / self.link.rate
            self.free_at = start + serial
            self.bytes += n
            self.chunks += 1
            self.busy_s += serial
            return self.free_at + self.link.delay

    def late(self, s: float) -> None:
        with self.lock:
            self.sends += 1
            self.late_s += s
            self.late_max_s = max(self.late_max_s, s)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "bytes": self.bytes,
                "chunks": self.chunks,
                "sends": self.sends,
                "busy_s": round(self.busy_s, 6),
                "late_mean_us": round(1e6 * self.late_s / self.sends, 1) if self.sends else 0.0,
                "late_max_us": round(1e6 * self.late_max_s, 1),
            }


class _Pipe:
    """One direction of one connection: a reader thread (recv, schedule, enqueue) and a writer thread (sleep
    until due, send). At EOF the writer shuts the far side's write half once everything queued is delivered."""

    def __init__(
        self,
        name: str,
        src: socket.socket,
        dst: socket.socket,
        direction: _Direction,
        stopping: threading.Event,
        done: Any,
    ) -> None:
        self.src, self.dst, self.dir, self.stopping, self.done = src, dst, direction, stopping, done
        self.queue: Deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.eof = False
        self.threads = [
            threading.Thread(target=self._read, name=f"shaper-{name}-read", daemon=True),
            threading.Thread(target=self._write, name=f"shaper-{name}-write", daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _read(self) -> None:
        limit = self.dir.link.in_flight
        try:
            while not self.stopping.is_set():
                with self.cond:
                    while self.queued >= limit and not self.stopping.is_set():
                        self.cond.wait(0.1)
                data = self.src.recv(CHUNK)
                if not data:
                    break
                due = self.dir.schedule(len(data), time.monotonic())
                with self.cond:
                    self.queue.append((due, data))
                    self.queued += len(data)
                    self.cond.notify_all()
        except OSError:
            pass
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()

    def _write(self) -> None:
        _fine_timer_slack()
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.eof and not self.stopping.is_set():
                        self.cond.wait(0.1)
                    if self.stopping.is_set() or (not self.queue and self.eof):
                        break
                    due = self.queue[0][0]
                wait = due - time.monotonic()
                if wait > 0.005:  # long waits (a slow link's queue) end early when stopping
                    self.stopping.wait(wait)
                    if self.stopping.is_set():
                        break
                elif wait > 0:
                    time.sleep(wait)
                now = time.monotonic()
                with self.cond:  # everything due by now goes out in one send
                    batch = []
                    while self.queue and self.queue[0][0] <= now:
                        batch.append(self.queue.popleft()[1])
                if not batch:
                    continue
                self.dir.late(max(0.0, now - due))
                _sendall(self.dst, batch)
                with self.cond:
                    self.queued -= sum(len(b) for b in batch)
                    self.cond.notify_all()
            if not self.stopping.is_set():
                self.dst.shutdown(socket.SHUT_WR)
            self.done(ok=True)
        except OSError:
            self.done(ok=False)

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


class _Connection:
    def __init__(
        self,
        idx: int,
        client: socket.socket,
        upstream: socket.socket,
        up: _Direction,
        down: _Direction,
        stopping: threading.Event,
    ) -> None:
        self.client, self.upstream = client, upstream
        self.lock = threading.Lock()
        self.open_pipes = 2
        self.pipes = [
            _Pipe(f"{idx}-up", client, upstream, up, stopping, self._pipe_done),
            _Pipe(f"{idx}-down", upstream, client, down, stopping, self._pipe_done),
        ]

    def _pipe_done(self, ok: bool) -> None:
        """A writer finished: on an error (a side reset) the whole connection goes; after both EOFs, its sockets."""
        with self.lock:
            self.open_pipes -= 1
            last = self.open_pipes == 0
        if last or not ok:
            self.close()

    def start(self) -> None:
        for p in self.pipes:
            p.start()

    def alive(self) -> bool:
        return any(p.alive() for p in self.pipes)

    def close(self) -> None:
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.lock:
            if self.open_pipes == 0:  # nobody reads or writes them any more
                for s in (self.client, self.upstream):
                    s.close()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.pipes:
            for t in p.threads:
                t.join(max(0.0, deadline - time.monotonic()))


def _sendall(sock: socket.socket, bufs: list[bytes]) -> None:
    """Send every buffer, in order, with gathering writes (no joined copy)."""
    if len(bufs) == 1:
        sock.sendall(bufs[0])
        return
    views = [memoryview(b) for b in bufs]
    while views:
        sent = sock.sendmsg(views[:512])  # IOV_MAX is 1024 on Linux
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _nodelay(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


@dataclass
class Shaper:
    """A shaped loopback link in front of ``target`` (host, port): connect to :attr:`endpoint` instead.
    ``up`` is client -> target, ``down`` target -> client."""

    target: tuple[str, int]
    link: Link
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    name: str = "shaper"
    _sock: socket.socket | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _conns: list[_Connection] = field(default_factory=list, init=False, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _errors: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        for what, host in (("listen address", self.listen_host), ("target", self.target[0])):
            if not is_loopback(host):
                raise UsageError(
                    f"link shaper: {what} {host} is not a loopback address",
                    why="the shaper only emulates links between processes of this machine",
                    fix="use 127.0.0.1 (shape real links with the kernel's tc)",
                )
        self.up = _Direction(self.link)
        self.down = _Direction(self.link)
        self.connections = 0

    @property
    def endpoint(self) -> tuple[str, int]:
        if self._sock is None:
            raise RpcError(f"{self.name} is not started")
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> "Shaper":
        fam = socket.AF_INET6 if ":" in self.listen_host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.listen_host, self.listen_port))
        except OSError as e:
            sock.close()
            raise RpcError.of_os(
                e,
                f"link shaper: cannot listen on {self.listen_host}:{self.listen_port}",
                fix="choose a free port (or 0 for any)",
            ) from None
        sock.listen(16)
        sock.settimeout(ACCEPT_POLL)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        assert self._sock is not None
        n = 0
        while not self._stopping.is_set():
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
                upstream.settimeout(None)
            except OSError as e:
                self._errors.append(f"cannot connect to {self.target[0]}:{self.target[1]}: {e.strerror or e}")
                client.close()
                continue
            for s in (client, upstream):
                _nodelay(s)
            conn = _Connection(n, client, upstream, self.up, self.down, self._stopping)
            n += 1
            self.connections = n
            self._conns = [c for c in self._conns if c.alive()] + [conn]
            conn.start()

    def stop(self, timeout: float = 5.0) -> dict[str, Any]:
        """Close everything and join every thread (bounded by ``timeout``); returns :meth:`stats`."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        for c in self._conns:
            c.close()
        deadline = time.monotonic() + timeout
        for c in self._conns:
            c.join(max(0.0, deadline - time.monotonic()))
            for s in (c.client, c.upstream):
                s.close()
        return self.stats()

    def threads_alive(self) -> int:
        n = 1 if self._thread is not None and self._thread.is_alive() else 0
        return n + sum(t.is_alive() for c in self._conns for p in c.pipes for t in p.threads)

    def stats(self) -> dict[str, Any]:
        return {
            "link": str(self.link),
            "target": f"{self.target[0]}:{self.target[1]}",
            "connections": self.connections,
            "up": self.up.stats(),
            "down": self.down.stats(),
            "errors": list(self._errors),
        }

    def __enter__(self) -> "Shaper":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
