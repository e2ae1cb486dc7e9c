"""Command-line options that more than one command declares, each group defined once here (argparse only: the
modules that act on the options read them from the parsed namespace)."""

from __future__ import annotations

import argparse
from pathlib import Path

#: The ggml-rpc-server binary of a build (the options name it in their help; :mod:`ggml_bridge.rpc` runs it).
RPC_SERVER = "ggml-rpc-server"


def add_rpc_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("RPC (docs/rpc.md)")
    g.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT,...",
        help="rpc-servers to use (passed to llama-server --rpc after a handshake check)",
    )
    g.add_argument(
        "--rpc-local",
        type=int,
        default=0,
        metavar="N",
        help=f"start N local {RPC_SERVER}s on 127.0.0.1 (a test topology) and use them",
    )
    g.add_argument(
        "--rpc-local-devices",
        action="append",
        default=None,
        metavar="DEV,DEV",
        help="devices of one local rpc-server, e.g. CUDA0,CUDA1 (repeat per server; sets N)",
    )
    g.add_argument(
        "--rpc-local-only",
        action="store_true",
        help="the GPUs are the local rpc-servers' alone: llama-server gets none (CUDA_VISIBLE_DEVICES=)",
    )
    g.add_argument(
        "--rpc-link",
        default=None,
        metavar="RATE/DELAY",
        help="put a shaped loopback link (e.g. 10gbit/0.2ms: rate per direction, one-way delay) between "
        "llama-server and each local rpc-server, as between hosts (ggml_bridge/shaper.py)",
    )
    g.add_argument(
        "--rpc-server",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"{RPC_SERVER} binary for --rpc-local (default: next to llama-server, else the build)",
    )
