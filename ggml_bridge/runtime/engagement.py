"""Whether a mechanism engaged in one process: the one decision serve, rpc, the ladder and the bench all make
(and the wheel test through ``serve --check``).

A mechanism *engaged* when the process says it is enabled (its ``enabled`` line) and, where counters are given
(the bench's last stats line, an rpc-server's SIGUSR1 counters), they show it did work: the bridge crossed a
boundary; batching staged an upload (a split whose inputs are all small: a token step's positions, KV indices,
mask) or its rule kept a split with a large input on upstream's copies (``large_splits``: a prompt ubatch, whose
KQ mask is over the stage limit; a prompt-only run such as llama-perplexity's stages nothing). Otherwise it is *idle*
(enabled, no work), *inactive* (the process gave its own reason, e.g. one device) or *absent* (no line at all:
a binary without the patch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .logparse import AllReduceInfo, BatchedInfo, BridgeInfo
from .mechanisms import ALLREDUCE as ALLREDUCE_RECORD
from .mechanisms import MECHANISMS as RECORDS
from .mechanisms import PATCHED_ALLREDUCE_VALUES, expected_allreduce

BRIDGE, BATCHED = RECORDS["bridge"].name, RECORDS["batched"].name
#: the mechanisms with an enabled line and counters of their own (the series')
MECHANISMS = (BRIDGE, BATCHED)
ENGAGED, IDLE, INACTIVE, ABSENT = "engaged", "idle", "inactive", "absent"


@dataclass(frozen=True)
class Verdict:
    mechanism: str
    state: str
    """:data:`ENGAGED`, :data:`IDLE`, :data:`INACTIVE` or :data:`ABSENT`."""
    reason: str | None = None
    """The process's own reason when it reported the mechanism inactive."""

    @property
    def engaged(self) -> bool:
        return self.state == ENGAGED


def did_work(mechanism: str, counters: Mapping[str, int]) -> bool:
    """Counters (a stats line, or an rpc-server's counters with their ``bridge_`` prefix) show work."""
    record = RECORDS[mechanism]
    return any(counters.get(k, counters.get(f"{mechanism}_{k}", 0)) > 0 for k in record.work_keys)


def engaged(mechanism: str, info: BridgeInfo | BatchedInfo, counters: Mapping[str, int] | None = None) -> Verdict:
    """The verdict for ``mechanism`` from what one process printed about it (``LogInfo.bridge``/``.batched``, or
    ``RpcServerInfo.bridge``); with ``counters``, engaged also needs :func:`did_work`."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}")
    if info.enabled:
        return Verdict(mechanism, ENGAGED if counters is None or did_work(mechanism, counters) else IDLE)
    if info.inactive_reason is not None:
        return Verdict(mechanism, INACTIVE, info.inactive_reason)
    return Verdict(mechanism, ABSENT)


def from_metrics(mechanism: str, info: BridgeInfo | BatchedInfo, metrics: Mapping[str, int] | None) -> Verdict:
    """The verdict for llama-server at its default log verbosity, where the INFO ``enabled`` line is hidden: what
    the log says (``enabled`` when the user chose ``-lv 4``; else the WARN ``inactive`` line and its reason) first,
    then the live counters patch 0005 exports on /metrics (``llamacpp:<mechanism>_<name>_total``, keys as
    :func:`ggml_bridge.runtime.logparse.parse_metrics` gives them). With counters that show work (the start-up warm-up
    decode crosses the bridge's boundaries and stages batched uploads) it engaged; counters at zero: *idle*; no
    counters: *absent* (a binary without the patch, or no CUDA backend for the bridge)."""
    verdict = engaged(mechanism, info)
    if verdict.state != ABSENT or not metrics:
        return verdict
    prefix, suffix = mechanism + "_", "_total"
    counters = {
        k[len(prefix) : -len(suffix)]: v for k, v in metrics.items() if k.startswith(prefix) and k.endswith(suffix)
    }
    if not counters:
        return verdict
    return Verdict(mechanism, ENGAGED if did_work(mechanism, counters) else IDLE)


@dataclass(frozen=True)
class AllReduceVerdict:
    """Which all-reduce path upstream took for ``-sm tensor`` in one process, against the one it must have taken."""

    expected: str
    """:data:`ggml_bridge.runtime.mechanisms.ALLREDUCE_PATHS` name upstream picks for the selector and devices."""
    seen: str | None
    """The path the process's lines name (None: it said nothing, as for the butterfly asked by ``none``)."""
    ok: bool
    evidence: str


def allreduce_verdict(
    info: AllReduceInfo,
    value: str | None,
    n_devices: int,
    virtual: bool,
    bridge: str | None = None,
    patched: bool = False,
) -> AllReduceVerdict:
    """The proof of the all-reduce path from the process's own lines (:class:`ggml_bridge.runtime.logparse.AllReduceInfo`), for
    ``GGML_CUDA_ALLREDUCE=value`` (None: unset) on ``n_devices`` (``virtual``: of fewer GPUs), in the ``patched`` build
    with the bridge's selector value ``bridge`` (:func:`ggml_bridge.runtime.mechanisms.expected_allreduce`). ``internal``
    proves itself by its INFO line ('initialized AllReduce pipeline: 2 GPUs', so the process must log at INFO); the
    bridge's all-reduce by its 'enabled for N devices' line; a fallback to the butterfly by upstream's WARN line;
    the butterfly asked by ``none`` prints nothing in upstream's build, so its proof is that neither the internal
    pipeline nor the bridge's all-reduce says it started."""
    want = expected_allreduce(value, n_devices, virtual, bridge=bridge, patched=patched)
    seen = info.path
    if want == "internal":
        ok = bool(info.internal_ready) and not info.internal_failed
        return AllReduceVerdict(want, seen, ok, _said(info) if ok else "no 'initialized AllReduce pipeline' line")
    if info.internal_ready:
        return AllReduceVerdict(want, seen, False, f"the internal pipeline started ({_said(info)}), {want} expected")
    if want in ("bridge", "bridge-or-butterfly") and info.bridge_enabled:
        return AllReduceVerdict(want, seen, True, _said(info))
    if want == "bridge":
        return AllReduceVerdict(want, seen, False, f"no 'ggml_cuda_bridge_allreduce: enabled' line ({_said(info)})")
    if info.bridge_enabled:
        return AllReduceVerdict(want, seen, False, f"the bridge's all-reduce started ({_said(info)}), {want} expected")
    if want == "nccl":
        ok = not info.internal_failed and not info.nccl_fallbacks
        return AllReduceVerdict(want, seen, ok, "no fallback line" if ok else _said(info))
    if value is not None and value not in ALLREDUCE_RECORD.words or (value in PATCHED_ALLREDUCE_VALUES and not patched):
        ok = info.unknown_value == value
        return AllReduceVerdict(want, seen, ok, _said(info) if ok else f"no 'unknown value: {value}' line")
    if value in ("none", "bridge", "butterfly") or want == "bridge-or-butterfly":
        return AllReduceVerdict(
            want, seen, True, _said(info) if seen else f"GGML_CUDA_ALLREDUCE={value}: no start line"
        )
    ok = info.internal_failed > 0
    return AllReduceVerdict(want, seen, ok, _said(info) if ok else "no 'internal AllReduce init failed' line")


def _said(info: AllReduceInfo) -> str:
    parts = [f"initialized AllReduce pipeline: {n} GPUs" for n in dict.fromkeys(info.internal_ready)]
    parts += list(dict.fromkeys(info.nccl_fallbacks))
    if info.internal_failed:
        parts.append("internal AllReduce init failed; falling back to meta-backend butterfly")
    if info.unknown_value is not None:
        parts.append(f"unknown GGML_CUDA_ALLREDUCE value: {info.unknown_value}")
    parts += [f"bridge all-reduce enabled ({why})" for why in dict.fromkeys(info.bridge_enabled)]
    parts += [f"bridge all-reduce inactive ({why})" for why in dict.fromkeys(info.bridge_inactive)]
    if info.bridge_stats:
        parts.append(f"allreduces={sum(s.get('allreduces', 0) for s in info.bridge_stats)}")
    return "; ".join(parts) or "nothing"
