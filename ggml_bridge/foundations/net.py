"""Local networking shared by the launchers: the default bind address and a free TCP port for a child
(llama-server, a local ggml-rpc-server) to listen on."""

from __future__ import annotations

import re
import socket

from .errors import UsageError

DEFAULT_HOST = "127.0.0.1"


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_HOSTPORT = re.compile(r"(?:\[?([^\[\]]+?)\]?:)?(\d+)")


def parse_hostport(
    text: str, what: str, *, default_host: str | None = None, allow_zero: bool = False, example: str = "127.0.0.1:50052"
) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too), or ``[HOST:]PORT`` with ``default_host``, the one parser of an address
    the user typed (``--rpc``, ``shape --listen/--to``); a UsageError naming ``what`` otherwise."""
    m = _HOSTPORT.fullmatch(text.strip())
    low = 0 if allow_zero else 1
    if not m or not low <= int(m.group(2)) < 65536 or (m.group(1) is None and default_host is None):
        raise UsageError(
            f"{what} {text!r} is not {'[HOST:]PORT' if default_host else 'HOST:PORT'}", fix=f"e.g. {example}"
        )
    return m.group(1) or str(default_host), int(m.group(2))
