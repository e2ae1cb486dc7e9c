"""``ggml-bridge shape``: a loopback TCP proxy with a link's bandwidth and latency; prints its address."""

from __future__ import annotations

import argparse

from ..config import Settings
from ..shaper import ShapeOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        required=True,
        metavar="[HOST:]PORT",
        help="where to accept connections (loopback; default host 127.0.0.1)",
    )
    parser.add_argument("--to", required=True, metavar="HOST:PORT", help="where to forward them (loopback)")
    parser.add_argument("--rate", default="unlimited", help="per-direction bandwidth, e.g. 10gbit, 25gbit, 800mbit")
    parser.add_argument("--delay", default="0", help="one-way latency added, e.g. 0.2ms, 100us")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="first measure what the shaper can move on this machine and warn below the rate",
    )


def options(ns: argparse.Namespace) -> ShapeOptions:
    return ShapeOptions(listen=ns.listen, to=ns.to, rate=ns.rate, delay=ns.delay, ceiling=ns.ceiling)


def run(opts: ShapeOptions, settings: Settings) -> int:
    from .. import shaper

    return shaper.run(opts)
