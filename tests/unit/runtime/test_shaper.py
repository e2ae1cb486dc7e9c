"""The link shaper (ggml_bridge/runtime/shaper.py): rate and delay accuracy through real loopback sockets, byte-exact
forwarding in both directions, shutdown with connections open (no thread left, bounded), bad input, and the
``ggml-bridge shape`` command stopped by a signal."""

from __future__ import annotations

import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest

from ggml_bridge.foundations.errors import UsageError
from ggml_bridge.runtime import shaper

from helpers import REPO_ROOT


class Echo:
    """A loopback server: echoes (``mode='echo'``) or counts what it receives and when it had it all."""

    def __init__(self, mode: str = "echo") -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.mode = mode
        self.received = 0
        self.data = bytearray()
        self.done_at: float | None = None
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    @property
    def addr(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while True:
                try:
                    d = c.recv(1 << 20)
                except OSError:
                    return
                if not d:
                    self.done_at = time.monotonic()
                    return
                self.received += len(d)
                if self.mode == "echo":
                    c.sendall(d)
                else:
                    self.data += d

    def close(self) -> None:
        self.sock.close()


def _our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shaper")]


def test_parse_rates_delays_and_links():
    assert shaper.parse_rate("10gbit") == 1.25e9
    assert shaper.parse_rate("800mbit") == 1e8
    assert shaper.parse_rate("2MBps") == 2e6
    assert math.isinf(shaper.parse_rate("unlimited"))
    assert shaper.parse_delay("0.2ms") == pytest.approx(2e-4)
    assert shaper.parse_delay("150us") == pytest.approx(1.5e-4)
    assert shaper.parse_delay("0") == 0
    link = shaper.parse_link("25gbit/0.1ms")
    assert (link.rate, link.delay) == (25e9 / 8, pytest.approx(1e-4))
    assert link.label == "25gbit-0.1ms" and str(link) == "25gbit/0.1ms"
    assert shaper.parse_link(link.label) == link
    for bad in ("10", "fast", "-1gbit", "10gbits"):
        with pytest.raises(UsageError, match="bad link rate"):
            shaper.parse_rate(bad)
    for bad in ("1", "20s", "abc"):
        with pytest.raises(UsageError, match="bad link delay"):
            shaper.parse_delay(bad)
    with pytest.raises(UsageError, match="bad link"):
        shaper.parse_link("10gbit")


def test_refuses_anything_but_loopback():
    with pytest.raises(UsageError, match="not a loopback address"):
        shaper.Shaper(("10.1.2.3", 50052), shaper.Link(1e9, 0))
    with pytest.raises(UsageError, match="listen address 0.0.0.0 is not a loopback"):
        shaper.Shaper(("127.0.0.1", 50052), shaper.Link(1e9, 0), listen_host="0.0.0.0")


def test_bytes_arrive_unchanged_in_both_directions():
    echo = Echo("echo")
    payload = os.urandom(3 << 20)
    with shaper.Shaper(echo.addr, shaper.parse_link("unlimited/0")) as sh:
        with socket.create_connection(sh.endpoint) as c:
            got = bytearray()

            def rd() -> None:
                while len(got) < len(payload):
                    d = c.recv(1 << 20)
                    if not d:
                        return
                    got.extend(d)

            t = threading.Thread(target=rd)
            t.start()
            c.sendall(payload)
            t.join(30)
        st = sh.stats()
    echo.close()
    assert bytes(got) == payload
    assert st["up"]["bytes"] == st["down"]["bytes"] == len(payload) and st["connections"] == 1


def _time_to_carry(link: shaper.Link, n: int) -> float:
    """Seconds from the first of ``n`` bytes sent through a shaper with ``link`` until the last one arrived."""
    sink = Echo("sink")
    with shaper.Shaper(sink.addr, link) as sh:
        with socket.create_connection(sh.endpoint) as c:
            t0 = time.monotonic()
            c.sendall(bytes(n))
            c.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 20
            while sink.done_at is None and time.monotonic() < deadline:
                time.sleep(0.01)
    sink.close()
    assert sink.received == n and sink.done_at is not None
    return sink.done_at - t0


def test_rate_is_within_a_few_percent_for_megabytes():
    """4 MB at 20 Mbit/s (2.5 MB/s): the last byte lands 1.6 s (+ the 2 ms delay) after the first was sent.

    A loaded machine can only make a transfer slower (a thread woken late), never faster: no try may beat the link
    by more than 3 %, and the best of up to three tries must be within 3 % of it."""
    link = shaper.parse_link("20mbit/2ms")
    n = 4_000_000
    expected = n / link.rate + link.delay
    tries: list[float] = []
    while len(tries) < 3 and (not tries or min(tries) >= expected * 1.03):
        tries.append(_time_to_carry(link, n))
        assert tries[-1] > expected * 0.97, (tries, expected)
    assert min(tries) < expected * 1.03, (tries, expected)


def test_added_latency_is_twice_the_one_way_delay_per_round_trip():
    echo = Echo("echo")

    def rtts(addr: tuple[str, int], k: int = 40) -> list[float]:
        out = []
        with socket.create_connection(addr) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(k):
                t = time.perf_counter()
                c.sendall(b"x" * 64)
                got = 0
                while got < 64:
                    got += len(c.recv(64 - got))
                out.append(time.perf_counter() - t)
        return out

    direct = statistics.median(rtts(echo.addr))
    with shaper.Shaper(echo.addr, shaper.parse_link("unlimited/5ms")) as sh:
        through = statistics.median(rtts(sh.endpoint))
        stats = sh.stats()
        late = stats["up"]["late_mean_us"] + stats["down"]["late_mean_us"]
    with shaper.Shaper(echo.addr, shaper.parse_link("unlimited/0")) as sh0:
        proxied = statistics.median(rtts(sh0.endpoint))
    echo.close()
    added = through - proxied
    # 10 ms added per round trip: never less; on a busy machine the shaper's timers wake late (11.9 ms seen at load 6,
    # more at nice 19), and it measures that lateness itself: beyond 10 ms, only what it reports as late (up plus
    # down, and a scheduling margin) may be added, so a wrong delay (15-20 ms for three or four) still fails
    assert 0.0099 <= added <= 0.010 + late / 1e6 + 0.002, (direct, proxied, through, late)


def test_stop_with_connections_open_leaves_no_thread_and_is_bounded():
    sink = Echo("sink")
    sh = shaper.Shaper(sink.addr, shaper.parse_link("8mbit/50ms")).start()
    conns = [socket.create_connection(sh.endpoint) for _ in range(3)]
    stop_sending = threading.Event()

    def flood(c: socket.socket) -> None:  # more than the link carries: the shaper's reader pushes back
        try:
            while not stop_sending.is_set():
                c.sendall(bytes(1 << 16))
        except OSError:
            pass

    senders = [threading.Thread(target=flood, args=(c,), daemon=True) for c in conns]
    for t in senders:
        t.start()
    time.sleep(0.5)
    assert len(_our_threads()) == 1 + 3 * 4  # accept + (2 readers + 2 writers) per connection
    t0 = time.monotonic()
    st = sh.stop(timeout=5)
    took = time.monotonic() - t0
    stop_sending.set()
    for c in conns:
        c.close()
    sink.close()
    assert took < 2.0
    assert _our_threads() == [] and sh.threads_alive() == 0
    assert 0 < st["up"]["bytes"] and st["connections"] == 3
    with pytest.raises(OSError):
        socket.create_connection(sh.endpoint if sh._sock and sh._sock.fileno() != -1 else ("127.0.0.1", 1), 1)


def test_connection_closes_when_the_target_closes_and_target_down_is_counted():
    echo = Echo("echo")
    with shaper.Shaper(echo.addr, shaper.Link(math.inf, 0)) as sh:
        with socket.create_connection(sh.endpoint) as c:
            c.sendall(b"hello")
            assert c.recv(5) == b"hello"
        deadline = time.monotonic() + 5
        while sh.threads_alive() > 1 and time.monotonic() < deadline:  # the accept thread stays
            time.sleep(0.02)
        assert sh.threads_alive() == 1
    echo.close()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there
    with shaper.Shaper(("127.0.0.1", port), shaper.Link(math.inf, 0)) as sh:
        with socket.create_connection(sh.endpoint) as c:
            c.settimeout(5)
            assert c.recv(1) == b""  # closed at once
        time.sleep(0.1)
        assert sh.stats()["errors"] and "cannot connect" in sh.stats()["errors"][0]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ggml_bridge", "shape", *args],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_shapes_until_a_signal_then_reports_and_exits_128_plus_n():
    echo = Echo("echo")
    p = _cli("--listen", "0", "--to", f"127.0.0.1:{echo.addr[1]}", "--rate", "100mbit", "--delay", "1ms")
    try:
        line = p.stdout.readline().strip()
        host, port = line.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"ping"
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(10)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        echo.close()
    assert rc == 128 + signal.SIGTERM and time.monotonic() - t0 < 5
    assert "shaper stopped: up_bytes=4 " in err and "down_bytes=4" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--listen", "0", "--to", "10.0.0.2:50052"], "target 10.0.0.2 is not a loopback address"),
        (["--listen", "0", "--to", "127.0.0.1:1", "--rate", "fast"], "bad link rate 'fast'"),
        (["--listen", "0", "--to", "nowhere"], "--to 'nowhere' is not HOST:PORT"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, msg):
    p = _cli(*args)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 2 and msg in err and "Traceback" not in err and out == ""


def test_gathered_send_survives_partial_writes():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    bufs = [os.urandom(n) for n in (1, 70000, 3, 123457, 9) * 40]
    got = bytearray()
    t = threading.Thread(
        target=lambda: [
            got.extend(b.recv(1 << 16)) or time.sleep(0.0005)
            for _ in iter(lambda: len(got) < sum(map(len, bufs)), False)
        ]
    )
    t.start()
    shaper._sendall(a, bufs)
    t.join(30)
    a.close()
    b.close()
    assert bytes(got) == b"".join(bufs)


def test_cli_ceiling_warns_when_the_rate_is_above_what_the_shaper_moves():
    echo = Echo("echo")
    p = _cli("--listen", "0", "--to", f"127.0.0.1:{echo.addr[1]}", "--rate", "10000gbit", "--ceiling")
    try:
        assert p.stdout.readline().strip().startswith("127.0.0.1:")
        p.send_signal(signal.SIGINT)
        rc = p.wait(20)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        echo.close()
    assert rc == 130 and "shaper ceiling on this machine:" in err
    assert "the set rate 10000gbit is above that ceiling: the shaper, not the rate, bounds the link" in err
