"""``ggml-bridge doctor``: what this rig is, whether its peer paths are safe, and how to launch on it. Its options
are the fields of the frozen :class:`~ggml_bridge.experiments.doctor.facts.Options` the doctor runs on, each declared
once there."""

from __future__ import annotations

import argparse

from ..experiments.doctor.facts import Options
from ..foundations.config import Settings
from . import optionset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, Options)


def options(args: argparse.Namespace) -> Options:
    return optionset.options(Options, args)


def run(opts: Options, settings: Settings) -> int:
    from ..experiments.doctor.checkup import run as checkup

    return checkup(opts, settings)
