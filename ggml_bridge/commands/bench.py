"""``ggml-bridge bench``'s command line: its options are :class:`BenchOptions`'s fields, each declared once there
(what to measure, which builds and model, how to run, where the report goes), added and read back by
:mod:`.optionset`."""

from __future__ import annotations

import argparse

from ..experiments.bench.options import BenchOptions
from ..foundations.config import Settings
from . import optionset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, BenchOptions)


def options(ns: argparse.Namespace) -> BenchOptions:
    return optionset.options(BenchOptions, ns)


def run(opts: BenchOptions, settings: Settings) -> int:
    from ..experiments.bench import orchestrate

    return orchestrate.run(opts, settings)
