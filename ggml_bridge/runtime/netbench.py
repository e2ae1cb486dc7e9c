"""The bench over shaped links (docs/rpc.md, "What a network costs"): every rpc case of a suite once per link,
each with a :mod:`shaper` between llama-bench and each of its rpc-servers, and the proof that the link carried
the run.

A suite asks for it with ``links`` (``RATE/DELAY`` strings; ``--links`` overrides them), ``rpc_servers`` (how
many rpc-servers each rpc case starts, default 1) and ``rpc_front_gpu`` (llama-bench keeps its GPUs: a host with
a GPU using other hosts; else it gets none). The case ``rpc-off`` over ``10gbit/0.2ms`` is called
``rpc-off@10gbit-0.2ms``; the rpc case without a link stays in the suite (loopback TCP, no shaper): it and the
local case are what the scale model (:mod:`ggml_bridge.experiments.paper_model`) is calibrated on.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..foundations.errors import RpcError
from . import modes, rpc, shaper


def expand(cases: Sequence[modes.Mode], links: Sequence[str]) -> list[modes.Mode]:
    """``cases`` with every rpc case repeated once per link (after the unshaped one)."""
    parsed = [shaper.parse_link(x) for x in links]
    out: list[modes.Mode] = []
    for c in cases:
        out.append(c)
        if c.rpc:
            out += [
                dataclasses.replace(
                    c,
                    name=f"{c.name}@{link.label}",
                    link=str(link),
                    about=f"{c.about}; behind a shaped link {link} (rate per direction / one-way delay)",
                )
                for link in parsed
            ]
    return out


def topology(
    case: modes.Mode,
    bin_dir: Path,
    env: Mapping[str, str],
    n: int,
    threads: int | None,
    out_dir: Path,
    rnd: int,
) -> rpc.Topology:
    """The ``n`` rpc-servers of one case run (not started, ``threads`` each where given), behind the case's link if
    it has one."""
    return rpc.Topology(
        [
            rpc.LocalRpcServer(
                bin_dir / rpc.RPC_SERVER,
                env=env,
                threads=threads,
                log_file=out_dir / f"{case.name}-r{rnd}-rpc-server{'-%d' % i if n > 1 else ''}.log",
            )
            for i in range(n)
        ],
        link=shaper.parse_link(case.link) if case.link else None,
    )


def front_env(env: Mapping[str, str], front_gpu: bool) -> dict[str, str]:
    """llama-bench's environment next to rpc-servers: no GPU of its own unless the suite keeps it (``front_gpu``)."""
    return dict(env) if front_gpu else {**env, "CUDA_VISIBLE_DEVICES": ""}


def link_engagement(topo: rpc.Topology) -> tuple[bool, str]:
    """Did the run go through the shapers? Bytes both ways through every one, and how late deliveries were."""
    parts, ok = [], True
    for ep, st in topo.link_stats().items():
        up, down = st["up"], st["down"]
        ok &= up["bytes"] > 0 and down["bytes"] > 0
        parts.append(
            f"link {st['link']} to {ep}: {up['bytes']} B up, {down['bytes']} B down, deliveries late by "
            f"{up['late_mean_us']}/{down['late_mean_us']} us on average (max {up['late_max_us']}/"
            f"{down['late_max_us']})"
        )
    return ok, "; ".join(parts)


def report(cases: Sequence[modes.Mode], rpc_servers: int, front_gpu: bool) -> dict[str, Any] | None:
    """The topology of the link cases, and what the shaper moves per direction on this machine (measured once
    per run): a set rate above that ceiling is bounded by the shaper, and the report says so."""
    rates = [shaper.parse_link(c.link).rate for c in cases if c.link]
    if not rates:
        return None
    finite = [r for r in rates if not math.isinf(r)]
    top = max(finite) if finite else math.inf
    measured = measure_ceiling(256 << 20, shaper.Link(top, 0.0))
    return {
        "rpc_servers": rpc_servers,
        "front_gpu": front_gpu,
        "shaper_ceiling_gbit": round(measured * 8 / 1e9, 2),
        "highest_rate_gbit": None if math.isinf(top) else round(top * 8 / 1e9, 2),
        "bounded_by_shaper": measured < top * 0.98,
    }


def describe(rep: Mapping[str, Any]) -> str:
    """The report's line about the links (bench.md)."""
    top = rep.get("highest_rate_gbit")
    return (
        f"{rep['rpc_servers']} rpc-server(s), llama-bench {'keeps its GPU' if rep.get('front_gpu') else 'without a GPU'}; "
        f"the shaper moved {rep['shaper_ceiling_gbit']} Gbit/s per direction on this machine"
        + (
            f" (highest rate set: {top} Gbit/s"
            + (": BOUNDED BY THE SHAPER, not the set rate)" if rep.get("bounded_by_shaper") else ")")
            if top
            else ""
        )
    )


#: The two ends of :func:`measure_ceiling`, in a process of their own: a sink that prints its port, then a source
#: that connects to the shaper's port (argv[2]) once it listens and sends argv[1] bytes; last line "BYTES SECONDS".
_ENDS = r"""
import socket, sys, threading, time
n, shaper_port = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
got = [0, 0.0]
def sink():
    c, _ = srv.accept()
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        got[0] += len(d)
    got[1] = time.monotonic()
t = threading.Thread(target=sink); t.start()
for _ in range(1000):
    try:
        c = socket.create_connection(("127.0.0.1", shaper_port)); break
    except OSError:
        time.sleep(0.01)
buf = bytes(1 << 20)
t0 = time.monotonic()
for _ in range(n >> 20):
    c.sendall(buf)
c.shutdown(socket.SHUT_WR)
t.join(120)
print(got[0], got[1] - t0, flush=True)
"""


def measure_ceiling(nbytes: int = 256 << 20, link: shaper.Link | None = None) -> float:
    """Bytes per second one direction of a shaper (unlimited, or ``link``) moves on this machine, the source and
    the sink in another process (as llama.cpp's are): the rate above which the shaper, not the set rate, bounds
    a run."""
    import sys
    import tempfile

    from ..foundations.net import free_port
    from ..foundations.runner import Failure, start

    port = free_port()
    sh: shaper.Shaper | None = None
    with tempfile.TemporaryDirectory(prefix="ggml-bridge-ceiling-") as tmp:
        ends = Path(tmp) / "ends.py"
        ends.write_text(_ENDS)
        proc = start(
            [sys.executable, ends, str(nbytes), str(port)], failure=Failure(RpcError, what="cannot measure the shaper")
        )
        try:
            deadline = time.monotonic() + 30
            while not proc.lines() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if not proc.lines():
                raise RpcError("the shaper's measuring ends did not start", why="; ".join(proc.tail(5)) or None)
            sink_port = int(proc.lines()[0])
            sh = shaper.Shaper(
                ("127.0.0.1", sink_port), link or shaper.Link(math.inf, 0.0), listen_port=port, name="shaper-ceiling"
            )
            sh.start()
            proc.wait(300)
        finally:
            if sh is not None:
                sh.stop()
            if proc.poll() is None:
                proc.stop(5)
    got, seconds = proc.lines()[-1].split()
    return int(got) / float(seconds) if float(seconds) > 0 else math.inf
