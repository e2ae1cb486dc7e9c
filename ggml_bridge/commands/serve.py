"""``ggml-bridge serve``: its options, typed as :class:`ggml_bridge.runtime.serve.ServeOptions` and declared on its
fields, but the RPC topology (``cmdoptions.rpc``) and llama-server's arguments (everything the parser does not know,
and everything after ``--``, in order: the registry's passthrough into ``server_args``), which this module reads."""

from __future__ import annotations

import argparse

from ..foundations.config import ServeSettings, Settings
from ..foundations.errors import UsageError
from ..runtime.serve import RpcOptions, ServeOptions
from . import cmdoptions, optionset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, ServeOptions, ServeSettings, rpc=cmdoptions.rpc)
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
    server_args = tuple(getattr(ns, "server_args", None) or ())
    return optionset.options(ServeOptions, ns, rpc=rpc_options(ns), server_args=server_args)


def run(opts: ServeOptions, settings: Settings) -> int:
    from ..runtime import serve

    return serve.run(opts, settings)
