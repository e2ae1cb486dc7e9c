"""Settings: small dataclasses, resolved defaults -> config file -> environment -> command line.

The config file is ``ggml-bridge.toml`` in the current directory, or the path given by ``--config`` /
``GGML_BRIDGE_CONFIG``; failing both, a ``[tool.ggml-bridge]`` table of ``pyproject.toml`` in the current
directory. Top-level keys are the fields of :class:`Settings`; each table is one stage's section, a small
dataclass that stage reads: ``[fetch]`` :class:`FetchSettings`, ``[build]`` :class:`BuildSettings`, ``[serve]``
:class:`ServeSettings`, ``[rebase]`` :class:`RebaseSettings`. Any other key or table (``[ladder]`` and ``[bench]``
read nothing from the file: their settings are command-line options) is a :class:`~ggml_bridge.foundations.errors.UsageError`
naming the key and the file, so no setting is silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..runtime import modes
from ..upstream import pin as pinmod
from . import tomlfile
from .errors import UsageError
from .layout import Layout

#: The programs a build makes when the tree defines them, in this order (llama-server is required); ``build.targets``
#: may narrow them. The build stage's own list (:data:`ggml_bridge.distribution.builder.steps.WANTED_TARGETS`) is this one.
BUILD_TARGETS = (
    "llama-server",
    "llama-bench",
    "llama-perplexity",
    "test-batched-transfers",
    "test-mapped-host-bridge",
    "test-bridge-allreduce",
    "ggml-rpc-server",
)
#: ``--backend`` values (``auto`` never picks vulkan: it is asked for by name).
BACKEND_CHOICES = ("auto", *modes.BACKENDS)
#: Sections of Settings (config tables), each a dataclass its stage reads.
SECTIONS = ("fetch", "build", "serve", "rebase")
#: Stages that read no settings from the config file (a table for them is an error saying so).
OPTION_ONLY_STAGES = ("ladder", "bench")
CONFIG_NAME = "ggml-bridge.toml"

#: List settings whose items are paths (relative ones resolved against the config file's directory).
_PATH_LISTS = ("rebase.cuda_include",)
_CUDA_ARCH_RE = re.compile(
    r"^(native|all|all-major|[0-9]+[a-z]?(-real|-virtual)?(;[0-9]+[a-z]?(-real|-virtual)?)*)$", re.ASCII
)


@dataclass
class FetchSettings:
    """How the upstream tree is obtained."""

    sources: list[str] = field(default_factory=lambda: list(pinmod.SOURCE_KINDS))
    """Kinds of pin.toml ``[[source]]`` entries to try, in this order (git, archive, pypi-sdist)."""

    connect_timeout: float = 3.0
    """Seconds to wait for a TCP connection before a host counts as unreachable and the next source is tried."""

    read_timeout: float = 60.0
    """Seconds a download may stall before it is abandoned."""

    pypi_url: str = "https://pypi.org"
    """Base URL of the PyPI JSON API used to find the registry sdist (``<url>/pypi/<name>/<version>/json``)."""


@dataclass
class BuildSettings:
    """How llama-server and the other tools are configured and compiled."""

    variant: str = modes.PATCHED
    """patched (series applied, our CMake options ON), upstream, or upstream-nopeer (CUDA only)."""

    backend: str = "auto"
    """cpu, cuda, vulkan, or auto: cuda when nvcc is found and the CUDA toolkit has cuBLAS headers, else cpu."""

    cuda_arch: str = "native"
    """CMAKE_CUDA_ARCHITECTURES: native, all, all-major, or numbers like 90 or 86;90."""

    jobs: int = 0
    """Parallel compile jobs; 0 means one per CPU core."""

    native: bool = True
    """Pass -DGGML_NATIVE=ON (optimise for this machine's CPU)."""

    ui: bool = True
    """Embed llama-server's web UI, built from the tree's tools/ui with npm (never downloaded); false builds a
    server without it (one warning line; the manifest says so)."""

    cmake_args: list[str] = field(default_factory=list)
    """Extra CMake arguments, appended last (the CMAKE_ARGS environment variable adds to these)."""

    targets: list[str] = field(default_factory=list)
    """Build only these of the programs a build makes (llama-server always), e.g. ``["llama-server",
    "llama-perplexity", "test-batched-transfers"]`` for a test build; empty: all of them. Part of the build key."""


@dataclass
class ServeSettings:
    """How ``ggml-bridge serve`` waits for llama-server (its options override these)."""

    startup_timeout: float = 600.0
    """Seconds to wait for llama-server's /health (``--startup-timeout``)."""


@dataclass
class RebaseSettings:
    """Machine-specific settings of ``ggml-bridge rebase``."""

    cuda_include: list[Path] = field(default_factory=list)
    """Include directories for the nvcc compile check, e.g. cuBLAS headers from a wheel (``--cuda-include`` adds
    to these)."""


@dataclass
class Settings:
    """Everything a stage needs to know; built by :func:`load`."""

    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    """Where fetched trees, patched work trees, builds and manifests live (content-addressed)."""

    project_dir: Path = field(default_factory=lambda: default_project_dir())
    """Directory holding pin.toml and patches/ (a checkout, or the copy packaged in the wheel)."""

    fetch: FetchSettings = field(default_factory=FetchSettings)
    """Fetch settings ([fetch] table)."""

    build: BuildSettings = field(default_factory=BuildSettings)
    """Build settings ([build] table)."""

    serve: ServeSettings = field(default_factory=ServeSettings)
    """Serve settings ([serve] table)."""

    rebase: RebaseSettings = field(default_factory=RebaseSettings)
    """Rebase settings ([rebase] table)."""

    config_file: Path | None = None
    """The config file that was read, if any."""

    @property
    def layout(self) -> Layout:
        """The paths under :attr:`cache_dir` (the one owner of the cache layout)."""
        return Layout(self.cache_dir)

    @property
    def pin_file(self) -> Path:
        return self.project_dir / "pin.toml"

    @property
    def patches_dir(self) -> Path:
        return self.project_dir / "patches"


def user_path(text: str | os.PathLike[str]) -> Path:
    """``text`` with ``~`` / ``~user`` expanded as the shell does; a UsageError for an unknown user (left as it is,
    ``~nosuchuser/c`` would be a folder of that name under the current one; ``Path.expanduser`` raises
    RuntimeError)."""
    expanded = os.path.expanduser(text)
    if str(expanded).startswith("~"):
        user = str(expanded).split("/", 1)[0]
        raise UsageError(f"{text}: {user} names no user of this machine", fix="write the path out, or use ~/")
    return Path(expanded)


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/ggml-bridge``, else ``~/.cache/ggml-bridge``. A relative ``XDG_CACHE_HOME`` is ignored, as the
    XDG base directory specification says (it would put the cache wherever the command happens to run)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME") or ""
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ggml-bridge"


def default_project_dir(cwd: Path | None = None) -> Path:
    """A checkout in the current directory, else the checkout this package lives in, else the wheel's copy."""
    here = Path(__file__).resolve().parents[1]  # ggml_bridge
    for cand in (cwd or Path.cwd(), here.parent, here / "_data"):
        if (cand / "pin.toml").is_file() and (cand / "patches").is_dir():
            return cand
    return here.parent


#: Environment variable -> dotted settings key. Values are parsed by the field's type.
ENV_VARS: dict[str, str] = {
    "GGML_BRIDGE_CACHE_DIR": "cache_dir",
    "GGML_BRIDGE_PROJECT_DIR": "project_dir",
    "GGML_BRIDGE_SOURCES": "fetch.sources",
    "GGML_BRIDGE_CONNECT_TIMEOUT": "fetch.connect_timeout",
    "GGML_BRIDGE_PYPI_URL": "fetch.pypi_url",
    "GGML_BRIDGE_VARIANT": "build.variant",
    "GGML_BRIDGE_BACKEND": "build.backend",
    "GGML_BRIDGE_CUDA_ARCH": "build.cuda_arch",
    "GGML_BRIDGE_JOBS": "build.jobs",
    "GGML_BRIDGE_NATIVE": "build.native",
    "GGML_BRIDGE_UI": "build.ui",
    "GGML_BRIDGE_SERVE_STARTUP_TIMEOUT": "serve.startup_timeout",
}


def load(
    overrides: Mapping[str, Any] | None = None,
    *,
    config_path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve settings: defaults, then the config file, then ``env``, then ``overrides``.

    ``overrides`` maps dotted keys (``"build.backend"``, ``"cache_dir"``) to values; ``None`` values are
    ignored so that unset command-line flags do not mask lower layers.
    """
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    if config_path is not None and not str(config_path).strip():
        raise UsageError(
            "--config is empty",
            why="an empty value would silently mean the default config file",
            fix="leave --config out for ./ggml-bridge.toml, or give a file",
        )
    settings = Settings(cache_dir=default_cache_dir(env), project_dir=default_project_dir(cwd))

    path, table = _read_config(config_path or env.get("GGML_BRIDGE_CONFIG"), cwd)
    if path is not None:
        settings.config_file = path
        _apply_table(settings, table, origin=str(path), base=path.parent)

    for var, key in ENV_VARS.items():
        if env.get(var):
            _set(settings, key, env[var], origin=f"environment variable {var}", base=cwd)
    if env.get("CMAKE_ARGS"):
        settings.build.cmake_args = (
            split_cmake_args(env["CMAKE_ARGS"], "environment variable CMAKE_ARGS") + settings.build.cmake_args
        )

    for key, value in (overrides or {}).items():
        if value is not None:
            _set(settings, key, value, origin=f"option --{key.split('.')[-1].replace('_', '-')}", base=cwd)

    validate(settings)
    return settings


def split_cmake_args(text: str, origin: str) -> list[str]:
    """Split a CMAKE_ARGS-style string the way a POSIX shell would; unbalanced quotes are a usage error."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UsageError(
            f"cannot split {origin}: {text!r}",
            why=f"{e} (unbalanced quotes)",
            fix="balance the quotes, e.g. CMAKE_ARGS='-DX=\"a b\"'",
        ) from None


def validate(settings: Settings) -> None:
    b, f = settings.build, settings.fetch
    _choice(b.backend, BACKEND_CHOICES, "backend")
    _choice(b.variant, tuple(modes.VARIANTS), "variant")
    for kind in f.sources:
        _choice(kind, tuple(pinmod.SOURCE_KINDS), "fetch source kind")
    url = urllib.parse.urlsplit(f.pypi_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UsageError(
            f"[fetch] pypi_url {f.pypi_url!r} is not an http(s) URL",
            why="the registry's JSON API is asked at <url>/pypi/<name>/<version>/json",
            fix="e.g. https://pypi.org, or leave it out",
        )
    if not _CUDA_ARCH_RE.match(b.cuda_arch):
        raise UsageError(
            f"invalid CUDA architecture {b.cuda_arch!r}",
            why="CMAKE_CUDA_ARCHITECTURES takes native, all, all-major, or numbers such as 90 or 86;90",
            fix="pass e.g. --cuda-arch 90",
        )
    unknown = [t for t in b.targets if t not in BUILD_TARGETS]
    if unknown:
        raise UsageError(
            f"unknown build target(s) {', '.join(unknown)}",
            why=f"a build makes {', '.join(BUILD_TARGETS)}",
            fix="list some of those in [build] targets, or leave it empty for all",
        )
    if b.jobs < 0:
        raise UsageError(f"invalid job count {b.jobs}", why="it must be 0 (one per core) or more")
    if f.connect_timeout <= 0 or f.read_timeout <= 0 or settings.serve.startup_timeout <= 0:
        raise UsageError("timeouts must be positive")


def _choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}", fix=f"use one of: {', '.join(choices)}")


def _read_config(explicit: Path | str | None, cwd: Path) -> tuple[Path | None, dict[str, Any]]:
    if explicit:
        path = user_path(explicit)
        if not path.is_absolute():
            path = cwd / path
        if not path.exists():
            raise UsageError(f"config file {path} not found", fix="check --config / GGML_BRIDGE_CONFIG")
        return path, _parse_toml(path)
    local = cwd / CONFIG_NAME
    if local.is_file():
        return local, _parse_toml(local)
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        try:
            table = _parse_toml(pyproject).get("tool", {}).get("ggml-bridge")
        except UsageError:
            table = None
        if isinstance(table, dict):
            return pyproject, table
    return None, {}


def _parse_toml(path: Path) -> dict[str, Any]:
    return tomlfile.read(path, "config file")


def _apply_table(settings: Settings, table: Mapping[str, Any], *, origin: str, base: Path) -> None:
    for key, value in table.items():
        if key in OPTION_ONLY_STAGES:
            raise UsageError(
                f"[{key}] in {origin} is not a settings table",
                why=f"the {key} stage reads nothing from the config file: a key there would be ignored",
                fix=f"remove it and pass its settings as options (ggml-bridge {key} --help)",
            )
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise UsageError(f"[{key}] in {origin} must be a table")
            for sub, subval in value.items():
                _set(settings, f"{key}.{sub}", subval, origin=origin, base=base)
        else:
            _set(settings, key, value, origin=origin, base=base)


def _set(settings: Settings, key: str, value: Any, *, origin: str, base: Path) -> None:
    obj: Any = settings
    parts = key.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part, None)
        if not dataclasses.is_dataclass(obj):
            raise UsageError(f"unknown setting {key!r} in {origin}")
    name = parts[-1]
    nested = (*SECTIONS, "config_file")
    known = {f.name: f for f in dataclasses.fields(obj) if f.name not in nested}
    if name not in known:
        raise UsageError(
            f"unknown setting {key!r} in {origin}",
            fix=f"known keys here: {', '.join(sorted(known))}",
        )
    setattr(obj, name, _coerce(getattr(obj, name), value, key=key, origin=origin, base=base))


def _coerce(current: Any, value: Any, *, key: str, origin: str, base: Path) -> Any:
    """Convert ``value`` (TOML value, env string or CLI value) to the type of the field's current value."""
    bad = UsageError(f"bad value {value!r} for {key!r} in {origin}", why=f"expected {_kind(current)}")
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise bad
    if isinstance(current, (int, float)):
        try:
            out = type(current)(value)
        except (TypeError, ValueError):
            raise bad from None
        if isinstance(value, bool) or (isinstance(value, float) and isinstance(current, int)):
            raise bad
        if not math.isfinite(out):
            raise UsageError(f"bad value {value!r} for {key!r} in {origin}", why="it must be a finite number")
        return out
    if isinstance(current, Path):
        if not isinstance(value, (str, os.PathLike)):
            raise bad
        if not str(value).strip():
            raise UsageError(
                f"empty path for {key!r} in {origin}",
                why="an empty value would silently mean the current directory",
                fix="give a directory, or leave the setting out for the default",
            )
        p = user_path(value)
        return p if p.is_absolute() else (base / p)
    if isinstance(current, list):
        if isinstance(value, str):
            if key == "build.cmake_args":
                return split_cmake_args(value, f"{key!r} in {origin}")
            value = [v for v in re.split(r"[,\s]+", value) if v]
        if not (isinstance(value, list) and all(isinstance(v, (str, os.PathLike)) for v in value)):
            raise bad
        if key in _PATH_LISTS:
            return [_coerce(Path(), v, key=key, origin=origin, base=base) for v in value]
        return [str(v) for v in value]
    if isinstance(current, str):
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise bad
        value = str(value)
        return value.replace(",", ";") if key == "build.cuda_arch" else value
    raise bad  # pragma: no cover


def _kind(current: Any) -> str:
    """What a setting of ``current``'s type takes, in words (never a Python class name)."""
    for cls, words in (
        (bool, "true or false"),
        (int, "a whole number"),
        (float, "a number"),
        (Path, "a path"),
        (list, "a list of strings"),
        (str, "a string"),
    ):
        if isinstance(current, cls):
            return words
    return "another kind of value"  # pragma: no cover
