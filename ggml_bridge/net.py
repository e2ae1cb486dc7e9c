"""Local networking shared by the launchers: the default bind address and a free TCP port for a child
(llama-server, a local ggml-rpc-server) to listen on."""

from __future__ import annotations

import socket

DEFAULT_HOST = "127.0.0.1"


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
