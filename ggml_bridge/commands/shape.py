"""``ggml-bridge shape``: a loopback TCP proxy with a link's bandwidth and latency; prints its address."""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, field

from ..foundations import flags
from ..foundations.config import Settings
from ..foundations.errors import RpcError, UsageError
from ..foundations.net import parse_hostport
from ..foundations.runner import log
from ..runtime import netbench, shaper
from . import optionset


@dataclass(frozen=True)
class ShapeOptions:
    """``ggml-bridge shape``'s options: where to listen, where to forward, the link."""

    listen: str = field(
        metadata=flags.flag(
            "--listen", metavar="[HOST:]PORT", help="where to accept connections (loopback; default host 127.0.0.1)"
        )
    )
    to: str = field(metadata=flags.flag("--to", metavar="HOST:PORT", help="where to forward them (loopback)"))
    rate: str = field(
        default="unlimited", metadata=flags.flag("--rate", help="per-direction bandwidth, e.g. 10gbit, 25gbit, 800mbit")
    )
    delay: str = field(default="0", metadata=flags.flag("--delay", help="one-way latency added, e.g. 0.2ms, 100us"))
    ceiling: bool = field(
        default=False,
        metadata=flags.flag(
            "--ceiling", help="first measure what the shaper can move on this machine and warn below the rate"
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, ShapeOptions)
    # "-5gbit" is a value (refused by the rate's own check), not an unknown option: argparse takes only plain
    # negative numbers as values by default and said "expected one argument"
    parser._negative_number_matcher = re.compile(r"^-[\d.]")


def options(ns: argparse.Namespace) -> ShapeOptions:
    return optionset.options(ShapeOptions, ns)


def run(args: ShapeOptions, settings: Settings) -> int:
    link = shaper.Link(shaper.parse_rate(args.rate), shaper.parse_delay(args.delay))
    host, port = parse_hostport(args.listen, "--listen", default_host="127.0.0.1", allow_zero=True)
    target = parse_hostport(args.to, "--to")  # port 0 is where nothing listens
    sh = shaper.Shaper(target, link, listen_host=host, listen_port=port)
    if args.ceiling:
        ceiling = netbench.measure_ceiling(128 << 20)
        log(f"ggml-bridge: shaper ceiling on this machine: {ceiling * 8 / 1e9:.2f} Gbit/s per direction")
        if ceiling < link.rate:
            log(
                f"ggml-bridge: warning: the set rate {shaper.fmt_rate(link.rate)} is above that ceiling: "
                "the shaper, not the rate, bounds the link"
            )
    try:
        sh.start()
    except RpcError as e:  # the --listen the user chose is taken: their input, exit 2
        raise UsageError(e.what, why=e.why, fix=e.fix) from None
    h, p = sh.endpoint
    log(
        f"ggml-bridge: shaping {h}:{p} -> {target[0]}:{target[1]} at {link} (rate/one-way delay); "
        "Ctrl-C or SIGTERM stops it"
    )
    print(f"{h}:{p}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        st = sh.stop()
        log(
            "ggml-bridge: shaper stopped: "
            + " ".join(f"{d}_bytes={st[d]['bytes']} {d}_late_mean_us={st[d]['late_mean_us']}" for d in ("up", "down"))
            + f" connections={st['connections']}"
        )
