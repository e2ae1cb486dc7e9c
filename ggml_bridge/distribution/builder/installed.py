"""An installed ``ggml-bridge-server`` wheel as a source of binaries: how ``serve`` finds llama-server when
nothing was built here (the wheel itself is made by :mod:`ggml_bridge.distribution.wheel`)."""

from __future__ import annotations

from pathlib import Path

from ...foundations.config import Settings
from ...foundations.errors import NotBuiltError, ServeError
from ...foundations.runner import log

#: The distribution name of the server wheel.
DIST_NAME = "ggml-bridge-server"


def installed_server(settings: Settings, name: str = "llama-server") -> Path | None:
    """``name`` from an installed ggml-bridge-server wheel, None when none is installed.

    A damaged installation is a NotBuiltError naming what is missing; a wheel for a backend this machine lacks
    (a CUDA wheel without a GPU), or another backend than the one asked for, is a ServeError."""
    try:
        import ggml_bridge_server as server
    except ImportError:
        return None
    try:
        backend = server.check_backend()
        path = server.get_binary_path(name)
    except server.MissingFileError as e:
        raise NotBuiltError(str(e)) from None
    except server.BackendUnavailable as e:
        raise ServeError(str(e)) from None
    wanted = settings.build.backend
    if wanted not in ("auto", backend):
        raise ServeError(
            f"the installed ggml-bridge-server wheel is built for {backend}, not {wanted}",
            fix=f"install a {wanted} wheel, or pass --backend {backend} / --server PATH",
        )
    version = server.get_manifest()["build"].get("version", "?")
    log(f"using {name} of the installed {DIST_NAME} {version} wheel: {path}")
    return Path(path)
