"""Every option that more than one command takes, declared once (pip's ``cmdoptions``): a declaration the options
dataclasses put on their fields (:data:`DISCARD_CHANGES`, :data:`VARIANT`), the [build] settings a command line
overrides (:class:`BuildSettingsOptions`), and the functions that add the rest to a parser, with the same name, type,
default and help wherever it appears. The commands turn what argparse parsed into the frozen dataclasses the rest of
the package receives."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..foundations import files, flags
from ..runtime.modes import RPC_SERVER, VARIANTS
from . import argtypes, optionset

#: ``(flag, type or None for text, metavar or None, help)``: an option that takes one value, None when not given
ValueRow = tuple[str, Callable[[str], Any] | None, str | None, str]
#: ``(flag, help)``: an option that is on when given
SwitchRow = tuple[str, str]


def values(parser: argparse.ArgumentParser | argparse._ActionsContainer, *rows: ValueRow) -> None:
    """Options of one value each, in the order given: ``type`` checks it (:mod:`argtypes`), absent is None."""
    for flag, kind, metavar, text in rows:
        if kind is None:
            parser.add_argument(flag, metavar=metavar, help=text)
        else:
            parser.add_argument(flag, type=kind, metavar=metavar, help=text)


def switches(parser: argparse.ArgumentParser | argparse._ActionsContainer, *rows: SwitchRow) -> None:
    """Options that are on when given (``store_true``), in the order given."""
    for flag, text in rows:
        parser.add_argument(flag, action="store_true", help=text)


def on_by_default(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
    """``--X`` / ``--no-X``, on unless turned off."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=True, help=text)


def common(parser: argparse.ArgumentParser, *, suppress: bool = True) -> None:
    """Options accepted both before and after the subcommand."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=default,
        help="config file (default: ./ggml-bridge.toml, or $GGML_BRIDGE_CONFIG)",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=default,
        help="cache directory (default: $GGML_BRIDGE_CACHE_DIR or $XDG_CACHE_HOME/ggml-bridge)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="no progress output on stderr",
    )


#: ``--discard-changes``: patch's and build's, declared on their options' fields
DISCARD_CHANGES = flags.flag(
    "--discard-changes", help="delete edits found in the cached patched work tree (else they are an error, exit 21)"
)
#: ``--variant``: build's list of variants (``BuildOptions.variants``), and the [build] variant setting where it
#: names one (:attr:`BuildSettingsOptions.variant`)
VARIANT = flags.flag(
    "--variant",
    metavar="{" + ",".join(VARIANTS) + "}[,...]",
    help="what to build (default: patched); a comma-separated list builds several",
)


def one_variant(text: str, option: str) -> str | None:
    """``--variant`` as the [build] variant setting: the name given, when one is (a list of several is the build
    command's business: settings hold one variant; the name is checked with the settings)."""
    return None if "," in text else text


@dataclass(frozen=True)
class BuildSettingsOptions:
    """The [build] settings (:class:`~ggml_bridge.foundations.config.BuildSettings`) the command line overrides,
    each field the setting of its name; None: not given, the settings' value stands. build takes them all, wheel and
    sdist some (:func:`optionset.add`'s ``only``), fetch and patch none: :meth:`overrides` of each."""

    variant: str | None = field(default=None, metadata=flags.checked(VARIANT, one_variant))
    backend: str | None = field(
        default=None,
        metadata=flags.flag(
            "--backend",
            metavar="{auto,cpu,cuda,vulkan,cuda-vulkan}",
            help="auto = cuda when nvcc and cuBLAS headers are found, else cpu; vulkan only when named "
            "(Vulkan headers, loader, glslc, SPIRV-Headers; $VULKAN_SDK first)",
        ),
    )
    cuda_arch: str | None = field(
        default=None,
        metadata=flags.flag("--cuda-arch", metavar="ARCH", help="CMAKE_CUDA_ARCHITECTURES (default native)"),
    )
    jobs: int | None = field(
        default=None,
        metadata=flags.also(
            "-j", flags.flag("--jobs", parse=flags.count(0), metavar="N", help="parallel jobs (default: all cores)")
        ),
    )
    native: bool | None = field(
        default=None, metadata=flags.turns_off("--no-native", help="do not optimise for this CPU (-DGGML_NATIVE=OFF)")
    )
    ui: bool | None = field(
        default=None,
        metadata=flags.turns_off(
            "--no-ui", help="build llama-server without its web UI (otherwise built from tools/ui with npm)"
        ),
    )

    def overrides(self) -> dict[str, Any]:
        """``config.load``'s overrides: ``build.<field>`` -> the value given (None: the settings' value)."""
        return {f"build.{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}


def startup_timeout(parser: argparse.ArgumentParser, default: float | None, what: str) -> None:
    """``--startup-timeout S``: a finite number of seconds above 0 wherever it is taken."""
    optionset.one(parser, flags.startup_timeout(what)[flags.KEY], default)


def report_dir(parser: argparse.ArgumentParser, default: str) -> None:
    optionset.one(parser, flags.report_dir(default)[flags.KEY])


#: the most local rpc-servers --rpc-local starts (a test topology: one per device at most; each binds a port and
#: loads its backends, so a thousand ran for minutes before failing)
MAX_LOCAL_RPC = 16


def rpc(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("RPC (docs/rpc.md)")
    values(
        g,
        ("--rpc", None, "HOST:PORT,...", "rpc-servers to use (passed to llama-server --rpc after a handshake check)"),
    )
    g.add_argument(
        "--rpc-local",
        type=argtypes.count(0, MAX_LOCAL_RPC),
        default=0,
        metavar="N",
        help=f"start N local {RPC_SERVER}s on 127.0.0.1 (a test topology) and use them (at most {MAX_LOCAL_RPC})",
    )
    g.add_argument(
        "--rpc-local-devices",
        action="append",
        metavar="DEV,DEV",
        help="devices of one local rpc-server, e.g. CUDA0,CUDA1 (repeat per server; sets N)",
    )
    switches(
        g,
        (
            "--rpc-local-only",
            "the GPUs are the local rpc-servers' alone: llama-server gets none (CUDA_VISIBLE_DEVICES=)",
        ),
    )
    values(
        g,
        (
            "--rpc-link",
            None,
            "RATE/DELAY",
            "put a shaped loopback link (e.g. 10gbit/0.2ms: rate per direction, one-way delay) between "
            "llama-server and each local rpc-server, as between hosts (ggml_bridge/runtime/shaper.py)",
        ),
        (
            "--rpc-server",
            argtypes.path,
            "PATH",
            f"{RPC_SERVER} binary for --rpc-local (default: next to llama-server, else the build)",
        ),
    )


def bin_dirs(parser: argparse.ArgumentParser, programs: str) -> None:
    """``--bin-dir-<variant> DIR`` for every build variant: the folder of its binaries instead of the latest build."""
    optionset.one(parser, flags.bin_dirs(tuple(VARIANTS), programs)[flags.KEY])


def bin_dirs_of(ns: argparse.Namespace) -> dict[str, Path]:
    """The ``--bin-dir-<variant>`` options given, by variant name: existing folders."""
    found = {v: getattr(ns, "bin_dir_" + v.replace("-", "_"), None) for v in VARIANTS}
    return {v: files.input_dir(d, f"--bin-dir-{v}") for v, d in found.items() if d is not None}
