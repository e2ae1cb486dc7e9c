"""What a rung does, as kinds: where an rpc-* mode's front runs (:class:`RpcFront`), what a bridge mode must show
of the boundaries it carried (:class:`Boundaries`), which artifacts the rung leaves out. The ladder file writes them
as boolean keys (:data:`SWITCHES`), read once in :mod:`.schema`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class RpcFront(enum.Enum):
    """Where an rpc-* mode's front processes (llama-server, llama-perplexity) run."""

    BARE = "bare"
    """Without a GPU of their own: every device is an rpc-server's."""
    GPU = "gpu"
    """On the rung's GPUs, with the rpc-servers' devices beside them (a host with its own GPU plus rpc-servers);
    every front process must show the model on both (``rpc_front_gpu = true``)."""


class Boundaries(enum.Enum):
    """What a bridge mode on a multi-device rung must show of the boundaries it carried."""

    REQUIRED = "required"
    """Its counters must show work."""
    COUNTED = "counted"
    """Counted and noted, not required: the rung's split copies between devices on another path
    (``require_boundaries = false``)."""


#: the ladder file's boolean keys: key -> (the Rung field it sets, its value for true, for false)
SWITCHES: Mapping[str, tuple[str, Any, Any]] = {
    "perplexity": ("skips", frozenset(), frozenset({"logits"})),
    "rpc_front_gpu": ("rpc_front", RpcFront.GPU, RpcFront.BARE),
    "require_boundaries": ("boundaries", Boundaries.REQUIRED, Boundaries.COUNTED),
}


def from_switches(table: Mapping[str, Any]) -> Mapping[str, Any]:
    """A rung table (its values checked) with its boolean keys as the Rung fields they set: Rung's arguments."""
    out = {k: v for k, v in table.items() if k not in SWITCHES}
    for key, (name, on, off) in SWITCHES.items():
        if key in table:
            out[name] = on if table[key] else off
    return out
