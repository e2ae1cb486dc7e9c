"""One suite of the bench as a value (:class:`Suite`): its cases, devices, models and llama-bench settings, and the
tables of the measures that have settings of their own. :mod:`.suites` reads the file, checks every key and builds
these once; the rest of the bench reads their fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Suite:
    """A suite's settings, keys checked (:data:`.suites.SUITE_KEYS`), defaults filled in."""

    about: str
    cases: tuple[str, ...]
    shapes: tuple[str, ...]  # ``shapes``, or the one ``shape``
    keyed_by_shape: bool  # the suite lists ``shapes``: tests are named with their shape
    devices: str  # all, 1 or cpu
    pp: int | str
    batch: int
    ubatch: tuple[int, ...]
    tg: int
    virtual_devices: int = 0  # 0: none
    split_mode: str | None = None  # None: a layer split unless the case says otherwise
    threads: int | None = None
    links: tuple[str, ...] = ()
    rpc_servers: int = 1
    rpc_front_gpu: bool = False
    run_lengths: tuple[int, ...] = ()
    rounds: int = 3
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The settings of the measures with a table of their own (``[suite.NAME]``), by measure name."""

    @classmethod
    def of(cls, table: Mapping[str, Any], measure_tables: tuple[str, ...]) -> Suite:
        """The suite of a checked TOML table (``measure_tables``: the names of the measures' own tables)."""
        return cls(
            about=table["about"],
            cases=tuple(table["cases"]),
            shapes=tuple(table.get("shapes") or [table["shape"]]),
            keyed_by_shape="shapes" in table,
            devices=table["devices"],
            pp=table["pp"],
            batch=table["batch"],
            ubatch=tuple(table["ubatch"]),
            tg=table["tg"],
            virtual_devices=table.get("virtual_devices") or 0,
            split_mode=table.get("split_mode"),
            threads=table.get("threads"),
            links=tuple(table.get("links", ())),
            rpc_servers=table.get("rpc_servers", 1),
            rpc_front_gpu=bool(table.get("rpc_front_gpu")),
            run_lengths=tuple(table.get("run_lengths", ())),
            rounds=table.get("rounds", 3),
            tables={name: dict(table[name]) for name in measure_tables if name in table},
        )

    def table(self, measure: str) -> Mapping[str, Any]:
        """The settings of ``measure`` (empty where the suite has no table for it)."""
        return self.tables.get(measure, {})
