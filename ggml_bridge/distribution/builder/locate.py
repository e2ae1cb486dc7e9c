"""Find what a build made: the ``latest-<variant>-<backend>.json`` pointer read back (:func:`find_binary`,
:func:`find_manifest`) and the one binary locator (:func:`locate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...foundations import files
from ...foundations.config import Settings
from ...foundations.errors import NotBuiltError
from ...foundations.tomlfile import Key
from ...runtime import modes
from .installed import installed_server
from .steps import latest_path
from .toolchain import resolve_backend


def find_binary(settings: Settings, name: str, variant: str | None = None, backend: str | None = None) -> Path:
    """Path of ``name`` (e.g. "llama-server") from the latest build of ``variant``/``backend``.

    Defaults come from ``settings.build``; backend ``auto`` is resolved as for a build. Raises NotBuiltError.
    """
    variant, backend, data = _latest(settings, variant, backend)
    fix = f"run `ggml-bridge build --variant {variant} --backend {backend}` first"
    path = data.get("binaries", {}).get(name)
    if not path:
        raise NotBuiltError(
            f"the {variant}/{backend} build has no {name}",
            why=f"it built {', '.join(data.get('binaries', {})) or 'nothing'}",
            fix=fix,
        )
    if not Path(path).is_file():
        raise NotBuiltError(f"{name} of the {variant}/{backend} build is gone", why=f"{path} does not exist", fix=fix)
    return Path(path)


def find_manifest(settings: Settings, variant: str | None = None, backend: str | None = None) -> Path:
    """The ``manifest.json`` of the latest build of ``variant``/``backend`` (defaults as :func:`find_binary`)."""
    variant, backend, data = _latest(settings, variant, backend)
    path = Path(str(data.get("manifest", "")))
    if not data.get("manifest") or not path.is_file():
        raise NotBuiltError(
            f"the manifest of the {variant}/{backend} build is gone",
            why=f"{path} does not exist",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` again",
        )
    return path


def _latest(settings: Settings, variant: str | None, backend: str | None) -> tuple[str, str, dict[str, Any]]:
    """(variant, backend, the ``latest-<variant>-<backend>.json`` pointer); NotBuiltError without one."""
    variant = modes.variant(variant or settings.build.variant).name
    backend = backend or settings.build.backend
    if backend == "auto":
        backend = resolve_backend("auto")[0]
    pointer = latest_path(settings, variant, backend)
    if not pointer.is_file():
        raise NotBuiltError(
            f"no {variant}/{backend} build found",
            why=f"{pointer} does not exist",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` first",
        )
    data = files.read_record(pointer, shape=POINTER_KEYS)
    if data is None or not all(isinstance(v, str) for v in data.get("binaries", {}).values()):
        raise NotBuiltError(
            f"the {variant}/{backend} build pointer {pointer} is damaged",
            why="it is not the JSON object a build writes (variant, backend, manifest, binaries by name)",
            fix=f"run `ggml-bridge build --variant {variant} --backend {backend}` again",
        )
    return variant, backend, data


#: What a ``latest-<variant>-<backend>.json`` pointer holds (:func:`ggml_bridge.distribution.builder.steps.write_pointer`).
POINTER_KEYS = {
    "variant": Key("str"),
    "backend": Key("str"),
    "key": Key("str"),
    "build_dir": Key("str"),
    "manifest": Key("str"),
    "binaries": Key("table"),
}


def locate(
    settings: Settings,
    variant: str,
    name: str,
    override_dir: Path | str | None = None,
    *,
    backend: str | None = None,
    installed: bool = False,
) -> Path:
    """The one binary locator: ``name`` of build ``variant`` in ``override_dir`` when the user gave one (a
    ``--bin-dir-*`` option), else from the latest build (:func:`find_binary`), else, with ``installed`` and the
    patched variant, from an installed ggml-bridge-server wheel. Raises NotBuiltError."""
    if override_dir is not None:
        path = Path(override_dir) / name
        if not path.is_file():
            raise NotBuiltError(
                f"{name} not found in {override_dir}",
                fix=f"point the option at a directory holding the {variant} build's {name}",
            )
        return path
    try:
        return find_binary(settings, name, variant=variant, backend=backend)
    except NotBuiltError:
        if not (installed and variant == modes.PATCHED):  # the wheel carries the patched build
            raise
        found = installed_server(settings, name)  # no build: an installed ggml-bridge-server wheel, if any
        if found is None:
            raise
        return found
