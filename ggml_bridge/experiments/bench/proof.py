"""Whether a case's mechanism engaged in one process, from what the process printed: llama-bench's and
llama-perplexity's stats lines (the last, cumulative one), or the counters of the case's rpc-server."""

from __future__ import annotations

from ...foundations.errors import RpcError
from ...runtime import logparse, modes, rpc
from ...runtime.engagement import BATCHED, BRIDGE, allreduce_verdict, engaged

Case = modes.Mode


def engagement(case: Case, log_text: str, virtual: bool = False) -> tuple[bool | None, str]:
    """Did the mechanism the case is about engage, and, for a -sm tensor case naming its all-reduce, did upstream
    take that path (``virtual``: the devices are GGML_CUDA_DEVICES cards)? (None when the case proves nothing.)"""
    if not case.mechanisms and case.allreduce is None:
        return None, ""
    info = logparse.parse(log_text)
    parts: list[str] = []
    ok = True
    if case.allreduce is not None:
        patched = modes.VARIANTS[case.variant].patched
        bridge = modes.BRIDGE_VALUES[case.bridge] if patched and case.bridge else None
        value = modes.ALLREDUCE_VALUES[case.allreduce]
        v = allreduce_verdict(info.allreduce, value, info.meta_devices, virtual, bridge, patched)
        ok &= v.ok and info.meta_devices > 1
        parts.append(f"all-reduce {v.expected} on {info.meta_devices} devices: {v.evidence}")
    if "bridge" in case.mechanisms:
        b = info.bridge
        # the stats line is cumulative per process: the last one holds the run's totals
        last = b.stats[-1] if b.stats else {}
        crossed = last.get("boundaries", 0)
        ok &= engaged(BRIDGE, b, last).engaged
        parts.append(
            f"bridge {'enabled' if b.enabled else 'not enabled'} ({b.slots} slots), "
            f"boundaries={crossed} bytes={last.get('bytes', 0)}"
            + (f", inactive: {b.inactive_reason}" if b.inactive_reason else "")
        )
    if "batched" in case.mechanisms:
        t = info.batched
        last = t.stats[-1] if t.stats else {}
        up, down = last.get("async_uploads", 0), last.get("async_downloads", 0)
        # engaged: it staged uploads (the inputs of splits whose inputs are all small) or kept splits with an input
        # over the stage limit on upstream's copies (large_splits);
        # downloads into llama.cpp's pinned output buffer are upstream's own asynchronous ones (upstream_downloads)
        ok &= engaged(BATCHED, t, last).engaged
        parts.append(
            f"batched {'enabled' if t.enabled else 'not enabled'}, graphs={last.get('graphs', 0)} "
            f"async_uploads={up} async_downloads={down} "
            f"sync_uploads={last.get('sync_uploads', 0)} upstream_uploads={last.get('upstream_uploads', 0)} "
            f"large_splits={last.get('large_splits', 0)}"
            + (f", inactive: {t.inactive_reason}" if t.inactive_reason else "")
        )
    return ok, "; ".join(parts)


def rpc_engagement(case: Case, topo: rpc.Topology) -> tuple[bool | None, str]:
    """The bridge inside the case's rpc-server: its enabled line and its counters (patch 0006, SIGUSR1)."""
    if not case.mechanisms:
        return None, ""
    srv = topo.local[0]
    try:
        c = srv.counters()
    except RpcError as e:
        return False, str(e)
    info = srv.info()
    crossed = c.get("bridge_boundaries", 0)
    return (
        engaged(BRIDGE, info.bridge, c).engaged,
        f"rpc-server bridge {'enabled' if info.bridge.enabled else 'not enabled'}, boundaries={crossed} "
        f"bytes={c.get('bridge_bytes', 0)} copy_tensor={c.get('rpc_copy_tensor', 0)}"
        + ("" if c.get("bridge") else " (no bridge counters exported)")
        + (f", inactive: {info.bridge.inactive_reason}" if info.bridge.inactive_reason else ""),
    )
