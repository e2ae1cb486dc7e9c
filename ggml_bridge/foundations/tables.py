"""Tables of named rows (variants, modes, backends, source kinds, commands): one way to build them."""

from __future__ import annotations

from typing import Protocol, TypeVar


class _Named(Protocol):
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=_Named)


def by_name(*rows: R) -> dict[str, R]:
    """The rows keyed by their ``name``, in the order given. A name given twice is a programming error (the later
    row would silently replace the earlier one)."""
    table: dict[str, R] = {}
    for row in rows:
        if row.name in table:
            raise ValueError(f"two rows are named {row.name!r}")
        table[row.name] = row
    return table
