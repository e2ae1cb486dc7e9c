"""The bench's suites (which cases, on which devices, with which models and settings) and the part of a suite's
matrix one run measures: its shapes, run lengths and measurements (:func:`select`).

Run lengths (``run_lengths``, ``--run-lengths 1,3,10``): one llama-bench process per case, run length and round,
``-r N`` and every repetition kept, so a one-shot run's first-call costs are in its figures; tests are named with
the run length (``pp4096/ub512@r1``). Without run lengths a process runs ``--reps`` repetitions after
``--warmup-reps`` discarded ones, and the tests carry no suffix.

Shapes (``shapes``, ``--shapes``): a suite that lists several measures each, one model per shape, and names the
shape in every test (``bench-2b-6l:pp4096/ub512@r1``), so that reports of parts of the matrix pool into one.

Measurements (``--measure``): ``bench`` (llama-bench), ``perplexity`` (llama-perplexity's wall time, suites with a
``perplexity`` table), ``server`` (llama-server's throughput under concurrent requests, suites with a ``server``
table) and ``inproc`` (batching against its baseline inside one process, ``test-batched-transfers --bench``, suites
with an ``inproc`` table); a suite measures all it has by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...foundations import tomlfile
from ...foundations.errors import UsageError
from ...foundations.tomlfile import Key
from .measures import MEASURES
from .suite import Suite

#: The suites shipped with the package: which cases, on which devices, with which models and llama-bench settings.
SUITES_FILE = Path(__file__).resolve().parent / "suites.toml"
#: the keys of a suite, checked as the ladder's rungs are (:mod:`ggml_bridge.foundations.tomlfile`)
SUITE_KEYS: dict[str, Key] = {
    "about": Key("str"),
    "cases": Key("strs"),
    "shape": Key("str"),
    "shapes": Key("strs"),
    "devices": Key("str", choices=("all", "1", "cpu")),
    "virtual_devices": Key("int", 1),
    "split_mode": Key("str", choices=("layer", "row", "tensor")),
    "pp": Key("int_or_str", 1),
    "batch": Key("int", 1),
    "ubatch": Key("ints", 1),
    "tg": Key("int", 0),
    "threads": Key("int", 1),
    "links": Key("strs"),
    "rpc_servers": Key("int", 1),
    "rpc_front_gpu": Key("bool"),
    "run_lengths": Key("ints", 1),
    "rounds": Key("int", 1),
    **{m.name: Key("table", table=m.table) for m in MEASURES.values() if m.table is not None},
}
REQUIRED = ("about", "cases", "devices", "pp", "batch", "ubatch", "tg")


def load_suites(path: Path) -> dict[str, Suite]:
    """The suites of a TOML file (one table per suite), every key checked; UsageError naming the file, the suite
    and the key otherwise."""
    data = tomlfile.read(path, "suite file")
    suites: dict[str, Suite] = {}
    tables = tuple(m.name for m in MEASURES.values() if m.table is not None)
    for name, suite in data.items():
        where = f"{path} [{name}]"
        if not isinstance(suite, dict):
            raise UsageError(f"{where} is not a table", fix="one [NAME] table per suite")
        tomlfile.check(suite, SUITE_KEYS, where)
        missing = [k for k in REQUIRED if k not in suite] + ([] if "shape" in suite or "shapes" in suite else ["shape"])
        if missing:
            raise UsageError(
                f"{where}: no {', '.join(missing)}", fix=f"a suite sets {', '.join(REQUIRED)} and shape(s)"
            )
        for m in MEASURES.values():
            if m.name in suite:
                m.check(suite[m.name], where)
        suites[name] = Suite.of(suite, tables)
    if not suites:
        raise UsageError(f"suite file {path} holds no suite", fix="one [NAME] table per suite")
    return suites


SUITES = load_suites(SUITES_FILE)


@dataclass(frozen=True)
class Selection:
    """The part of a suite's matrix one run measures."""

    shapes: tuple[str, ...]  # model shapes, in the suite's order ("user" for --model)
    keyed_by_shape: bool  # tests are named with their shape (the suite lists shapes)
    run_lengths: tuple[int, ...]  # () = kept repetitions after discarded warm-up ones
    measures: tuple[str, ...]  # of MEASURES


def measures_of(suite: Suite) -> tuple[str, ...]:
    """What the suite can measure: llama-bench always, perplexity and server where it has their settings."""
    return tuple(m.name for m in MEASURES.values() if m.table is None or m.name in suite.tables)


def _subset(option: str, given: Sequence[str], known: Sequence[str], suite: str) -> tuple[str, ...]:
    """The names ``given``, each one of ``known`` (duplicates dropped, order kept)."""
    names = list(given)
    unknown = [x for x in names if x not in known]
    if not names or unknown:
        raise UsageError(
            f"bad {option} {','.join(given)!r}" + (f": suite {suite} has no {', '.join(unknown)}" if unknown else ""),
            why=f"{option} chooses among the suite's own",
            fix=f"use one or more of: {','.join(known)} (or another --suite)",
        )
    return tuple(dict.fromkeys(names))


def select(
    name: str,
    suite: Suite,
    *,
    shapes: Sequence[str] | None = None,
    run_lengths: Sequence[int] | None = None,
    measures: Sequence[str] | None = None,
    user_model: bool = False,
) -> Selection:
    """The shapes (``--shapes``), run lengths (``--run-lengths``) and measurements (``--measure``) of suite ``name``
    one run measures: the suite's own where an option is not given; UsageError for a name the suite does not have."""
    if user_model and shapes:
        raise UsageError(
            "--shapes and --model together",
            why="--model replaces the suite's random models",
            fix="leave out --shapes to measure the given model, or --model to measure the suite's shapes",
        )
    chosen = ("user",) if user_model else suite.shapes
    if shapes and not user_model:
        chosen = _subset("--shapes", shapes, suite.shapes, name)
    lengths = tuple(sorted(set(run_lengths if run_lengths else suite.run_lengths)))
    what = measures_of(suite) if measures is None else _subset("--measure", measures, measures_of(suite), name)
    return Selection(chosen, suite.keyed_by_shape, lengths, what)
