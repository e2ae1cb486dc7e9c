"""engagement.engaged: the one decision whether a mechanism engaged in a process."""

from __future__ import annotations

import pytest

from ggml_bridge import logparse
from ggml_bridge.engagement import ABSENT, ENGAGED, IDLE, INACTIVE, engaged


def test_enabled_is_engaged_and_counters_must_show_work() -> None:
    b = logparse.BridgeInfo(enabled=True, mode="1")
    assert engaged("bridge", b).state == ENGAGED
    assert engaged("bridge", b, {"boundaries": 3}).engaged
    assert engaged("bridge", b, {"boundaries": 0}).state == IDLE
    assert engaged("bridge", b, {"bridge_boundaries": 2}).engaged, "an rpc-server's counters"
    t = logparse.BatchedInfo(enabled=True)
    assert engaged("batched", t, {"async_uploads": 1}).engaged
    assert engaged("batched", t, {"declined_graphs": 4}).engaged, "declining prompt-sized graphs is its policy"
    assert engaged("batched", t, {"async_downloads": 9}).state == IDLE, "downloads are upstream's own"


def test_inactive_keeps_the_process_reason_and_no_line_is_absent() -> None:
    v = engaged("bridge", logparse.BridgeInfo(inactive_reason="single device"))
    assert (v.state, v.reason, v.engaged) == (INACTIVE, "single device", False)
    assert engaged("batched", logparse.BatchedInfo()).state == ABSENT
    with pytest.raises(ValueError):
        engaged("turbo", logparse.BridgeInfo())


def test_every_caller_uses_it() -> None:
    """serve, rpc, the ladder and the bench decide through engagement.engaged (the wheel test via serve --check)."""
    import inspect

    from ggml_bridge import rpc, serve
    from ggml_bridge.bench import running
    from ggml_bridge.ladder import validity

    for mod in (serve, rpc, running, validity):
        assert "engaged(" in inspect.getsource(mod) and mod.engaged is engaged, mod.__name__
