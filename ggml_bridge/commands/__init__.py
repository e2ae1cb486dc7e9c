"""The commands of ``ggml-bridge``, one module each (pip's ``commands/``): every module declares its options
(shared ones from :mod:`.cmdoptions`, each declared once), turns the parsed namespace into the frozen dataclass its
stage takes (``options(namespace)``) and runs the stage (``run(options, settings)``). Only this package and
:mod:`ggml_bridge.cli` see argparse.

A command module is imported only when its command runs (:func:`stage`), so ``ggml-bridge --help`` and every other
command start without the stage modules.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..foundations.config import Settings
from ..foundations.errors import ToolchainError, UsageError
from ..foundations.tables import by_name

Run = Callable[[Any, Settings], int]
Options = Callable[[argparse.Namespace], Any]


@dataclass(frozen=True)
class Command:
    """One subcommand."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: receives what :attr:`options` made of the parsed namespace, and the settings
    run: Run
    #: the parsed namespace -> the command's typed options (None: ``run`` gets the namespace)
    options: Options | None = None
    #: Namespace attribute that receives the arguments the command's parser does not know (else they are an error).
    passthrough: str | None = None
    #: Settings overrides from the parsed arguments (``config.load``'s ``overrides``), besides --cache-dir.
    overrides: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    #: The command's settings section (``config.Settings.<name>``): an option left unset (None) takes the value of
    #: the section's field of the same name (defaults -> config file -> environment -> command line).
    section: str | None = None


def stage(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Run, Options]:
    """(add_arguments, run, options) of the command module ``ggml_bridge.commands.<name>``, each importing the
    module when called."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        load(name).add_arguments(parser)

    def run(opts: Any, settings: Settings) -> int:
        return int(load(name).run(opts, settings))

    def options(ns: argparse.Namespace) -> Any:
        convert = getattr(load(name), "options", None)
        return convert(ns) if callable(convert) else ns

    return add_arguments, run, options


def load(name: str) -> Any:
    """Import ``ggml_bridge.commands.<name>`` now (not at startup), with a clean error when it is missing."""
    modname = f"{__package__}.{name}"
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            raise UsageError(
                f"the {name} subcommand is not available in this installation",
                why=f"module {modname} does not exist yet",
                fix="update ggml-bridge, or use fetch, patch and build",
            ) from None
        raise ToolchainError(
            f"the {name} subcommand needs the Python module {e.name}",
            fix="reinstall ggml-bridge with its dependencies (pip install .)",
        ) from None
    missing = [attr for attr in ("add_arguments", "run") if not callable(getattr(module, attr, None))]
    if missing:
        raise UsageError(
            f"the {name} subcommand is not available in this installation",
            why=f"{modname} does not define {', '.join(missing)}()",
        )
    return module


def build_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The [build] settings the command's options override (:class:`.cmdoptions.BuildSettingsOptions`; those the
    command does not take are not given)."""
    from . import cmdoptions, optionset

    return optionset.options(cmdoptions.BuildSettingsOptions, args).overrides()


#: Every subcommand, in ``--help`` order.
COMMANDS: dict[str, Command] = by_name(
    Command(
        "fetch",
        "obtain the pinned upstream tree (cached); prints its path",
        *stage("fetch"),
        overrides=build_overrides,
    ),
    Command(
        "patch",
        "apply the patch series onto the upstream tree; prints the work tree path",
        *stage("patch"),
        overrides=build_overrides,
    ),
    Command(
        "build",
        "fetch + patch + CMake/Ninja build; prints the llama-server path last",
        *stage("build"),
        overrides=build_overrides,
    ),
    Command(
        "sdist",
        "write the sdist of ggml-bridge-server (patched tree + web UI, scikit-build-core); prints its path",
        *stage("sdist"),
        overrides=build_overrides,
    ),
    Command(
        "wheel",
        "write that sdist and build its platform wheel with pip, offline (CMAKE_ARGS=-DGGML_CUDA=ON "
        "for CUDA); prints the wheel's path",
        *stage("wheel"),
        overrides=build_overrides,
    ),
    Command(
        "serve",
        "launch llama-server and prove the requested mechanisms engaged",
        *stage("serve"),
        passthrough="server_args",
        section="serve",
    ),
    Command("ladder", "run the comparison ladder and write a JSON+Markdown report", *stage("ladder")),
    Command("rebase", "move the patch series onto another upstream", *stage("rebase")),
    Command("bench", "side-by-side llama-bench report", *stage("bench")),
    Command(
        "shape",
        "a loopback TCP proxy with a link's bandwidth and latency (e.g. in front of an rpc-server); prints its address",
        *stage("shape"),
    ),
    Command(
        "model",
        "write a generated GGUF model (the shapes the ladder and bench use); prints its path",
        *stage("model"),
    ),
    Command(
        "doctor",
        "what this rig is (GPUs, links, peer paths, Vulkan, CPU, rpc-servers), whether its peer copies are "
        "correct, and the serve command line for it",
        *stage("doctor"),
    ),
    Command(
        "paper-model",
        "the scale model of a boundary's host round trip (docs/paper-model.md); --bench: predicted vs measured",
        *stage("paper_model"),
    ),
)
