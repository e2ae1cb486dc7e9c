"""``ggml-bridge serve``: its options (everything the parser does not know, and everything after ``--``, goes to
llama-server in order: the registry's passthrough into ``server_args``), typed as :class:`ggml_bridge.runtime.serve.ServeOptions`."""

from __future__ import annotations

import argparse

from ..foundations import files
from ..foundations.config import Settings
from ..foundations.errors import UsageError
from ..runtime.modes import BATCHED, BATCHED_VALUES, BRIDGE, BRIDGE_VALUES
from ..runtime.serve import DEFAULT_LOG_MAX_MB, RpcOptions, ServeOptions
from . import argtypes, cmdoptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bridge",
        choices=tuple(BRIDGE_VALUES),
        help=f"the host bridge between GPUs (pinned host memory): sets {BRIDGE}=1|0|auto|force (default: unset)",
    )
    parser.add_argument(
        "--batched",
        choices=tuple(BATCHED_VALUES),
        help=f"batched pinned graph I/O transfers: sets {BATCHED}=1|0 (default: unset)",
    )
    cmdoptions.values(
        parser,
        (
            "--server",
            argtypes.path,
            "PATH",
            "llama-server binary (default: the patched build from `ggml-bridge build`, else "
            "an installed ggml-bridge-server wheel)",
        ),
    )
    cmdoptions.switches(parser, ("--check", "start, confirm what engaged, stop and exit (0: confirmed)"))
    cmdoptions.startup_timeout(parser, None, "/health (default: [serve] startup_timeout of the config file, 600)")
    cmdoptions.values(
        parser,
        (
            "--server-log",
            argtypes.path,
            "FILE",
            "also write the server log to FILE (rotated to FILE.1 at --server-log-max-mb)",
        ),
    )
    parser.add_argument(
        "--server-log-max-mb",
        type=argtypes.mebibytes,
        default=DEFAULT_LOG_MAX_MB,
        metavar="MB",
        help=f"rotate --server-log to FILE.1 when it reaches MB MiB, so the two files stay "
        f"under 2 x MB (default {DEFAULT_LOG_MAX_MB}; 0: no limit)",
    )
    cmdoptions.rpc(parser)
    parser.epilog = (
        "Other arguments (or all arguments after --) are passed to llama-server, e.g. "
        "ggml-bridge serve --bridge force -- -m model.gguf -ngl 99 --port 8080"
    )


def rpc_options(ns: argparse.Namespace) -> RpcOptions:
    if len(ns.rpc_local_devices or []) > cmdoptions.MAX_LOCAL_RPC:
        raise UsageError(
            f"--rpc-local-devices given {len(ns.rpc_local_devices)} times",
            why=f"each starts one local rpc-server, at most {cmdoptions.MAX_LOCAL_RPC}",
            fix="name fewer servers",
        )
    return RpcOptions(
        endpoints=ns.rpc,
        local=ns.rpc_local,
        local_devices=tuple(tuple(d for d in x.split(",") if d) for x in (ns.rpc_local_devices or [])),
        local_only=ns.rpc_local_only,
        link=ns.rpc_link,
        server=ns.rpc_server,
    )


def options(ns: argparse.Namespace) -> ServeOptions:
    return ServeOptions(
        bridge=ns.bridge,
        batched=ns.batched,
        server=ns.server,
        check=ns.check,
        startup_timeout=ns.startup_timeout,
        server_log=files.output_file(ns.server_log, "--server-log") if ns.server_log is not None else None,
        server_log_max_mb=ns.server_log_max_mb,
        rpc=rpc_options(ns),
        server_args=tuple(getattr(ns, "server_args", None) or ()),
    )


def run(opts: ServeOptions, settings: Settings) -> int:
    from ..runtime import serve

    return serve.run(opts, settings)
