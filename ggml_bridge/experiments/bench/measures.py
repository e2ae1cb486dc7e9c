"""The bench's measures, one module each behind :class:`.measure.Measure`: the one registry that the suites'
schema, the command line's ``--measure``, the rounds and the report read. A new measure is a module and a row here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .inproc import InProcess
from .llamabench import LlamaBench
from .measure import Inputs, Measure
from .perplexity import Perplexity
from .server import ServerMeasure
from .suite import Suite

#: by name, in the order of the rounds, the report and ``--measure``'s help
MEASURES: dict[str, Measure] = {m.name: m for m in (LlamaBench(), Perplexity(), ServerMeasure(), InProcess())}


def prepare_inputs(suite: Suite, measures: Sequence[str], out_dir: Path, tokens: list[str] | None) -> Inputs:
    """The deterministic inputs that the ``measures`` of a run read (a text, prompts), written under ``out_dir``."""
    inputs = Inputs()
    for name in measures:
        inputs = MEASURES[name].prepare(suite, out_dir, tokens, inputs)
    return inputs
