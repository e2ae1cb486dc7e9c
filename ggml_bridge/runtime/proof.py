"""The engagement proof of ``ggml-bridge serve``: what a llama-server's start-up log and its live ``/metrics``
counters prove about the mechanisms the selectors asked for, as notes for the user and errors that fail the launch.
Which words ask for a mechanism is :class:`ggml_bridge.runtime.modes.Selectors`'; whether one engaged in a process is
:mod:`ggml_bridge.runtime.engagement`'s."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from . import logparse
from .engagement import ABSENT, BATCHED, BRIDGE, IDLE, allreduce_verdict, from_metrics
from .modes import ALLREDUCE, CUDA_DEVICES, Selectors
from .modes import BRIDGE as BRIDGE_VAR

#: llama-server's split-mode option and its environment variable
SPLIT_FLAGS = ("-sm", "--split-mode")
SPLIT_ENV = "LLAMA_ARG_SPLIT_MODE"


@dataclass
class Engagement:
    """What the log proves about the requested mechanisms."""

    info: logparse.LogInfo
    notes: list[str] = field(default_factory=list)  # plain statements for the user
    errors: list[str] = field(default_factory=list)  # reasons to exit non-zero

    @property
    def ok(self) -> bool:
        return not self.errors


#: the bridge's own reason when no pair of the split needs it (patch 0001's inactive line); in mode auto that is an
#: answer, not a failure
NO_PAIR_NEEDS_IT = "no device pair needs it"


def check_engagement(
    info: logparse.LogInfo,
    bridge: str | None,
    batched: str | None,
    n_devices: int | None = None,
    metrics: Mapping[str, int] | None = None,
    warmed_up: bool = True,
    front: str | None = None,
) -> Engagement:
    """Apply the launcher's rules to a parsed start-up log and, when given, the live counters of /metrics (patch
    0005; see the module docstring and :func:`ggml_bridge.runtime.engagement.from_metrics`). The counters prove engagement
    at the default log verbosity, where the INFO "enabled" lines are hidden and only the WARN lines ("inactive",
    rejected selectors) show. What asks for a mechanism is :class:`~ggml_bridge.runtime.modes.Selectors`' rule (``--bridge
    on``, ``auto`` and ``force`` ask for the bridge). ``front``: the process is the front of an RPC topology, so
    described (its rpc-servers' boundaries are proved apart): one device or none of its own is a plain statement about
    it, not a bridge left unconfirmed."""
    sel = Selectors(bridge, batched)
    eng = Engagement(info)
    ndev = info.n_devices if n_devices is None else n_devices
    if not ndev and info.bridge.inactive_reason:
        ndev = _devices_in_reason(info.bridge.inactive_reason)
    for var, value in info.bridge.rejected.items():
        eng.errors.append(f'the server rejected {var}="{value}"' + (" (bridge off)" if var == BRIDGE_VAR else ""))
    _prove_bridge(eng, sel, ndev, metrics, front)
    _prove_batched(eng, sel, metrics, warmed_up)
    return eng


def _prove_bridge(
    eng: Engagement, sel: Selectors, ndev: int, metrics: Mapping[str, int] | None, front: str | None = None
) -> None:
    b, live = eng.info.bridge, dict(metrics or {})
    vb = from_metrics(BRIDGE, b, metrics)
    if sel.asks_bridge:
        if vb.engaged:
            from_line = f"mode {b.mode}, {b.slots} slots x {b.slot_mib} MiB pinned host memory" + (
                f", model on {ndev} devices" if ndev else ""
            )
            counted = (
                f"{live.get('bridge_boundaries_total', 0)} boundaries crossed through pinned host memory, "
                f"{live.get('bridge_bytes_total', 0)} bytes"
            )
            eng.notes.append(_engaged("bridge", "bridge", from_line if b.enabled else None, counted))
            if b.enabled and b.mode != sel.bridge_mode:
                eng.errors.append(f"bridge requested in mode {sel.bridge_mode} but the server reports mode {b.mode}")
        elif ndev > 1 and sel.bridge == "auto" and vb.reason is not None and vb.reason.startswith(NO_PAIR_NEEDS_IT):
            # auto routes only the pairs that need it: where none does (peer paths enabled and trusted, or virtual
            # devices of one GPU), upstream's copies are what auto asked for, not a bridge that failed to engage
            eng.notes.append(f"bridge not needed on this {ndev}-device split in mode auto: {vb.reason}")
            eng.notes += _pair_decisions(live) if metrics is not None else []
        elif ndev > 1:
            why = (
                f"the server says: inactive: {vb.reason}"
                if vb.reason is not None
                else "the server printed no ggml_cuda_mapped_host_bridge line (binary without the patch, or not a CUDA build?)"
            )
            eng.errors.append(f"bridge requested ({sel.bridge}) but not engaged on a {ndev}-device split; {why}")
        elif front is not None:  # the RPC front: its boundaries with the rpc-servers cross TCP, not the bridge
            eng.notes.append(f"{front}: no boundary between GPUs of its own for the bridge")
        else:
            eng.notes.append(
                _not_engaged(
                    "bridge",
                    vb.reason and f"single device ({vb.reason})",
                    "single device or CPU, and the server printed no bridge line "
                    "(binary without the patch, or not a CUDA build)",
                )
            )
        if vb.engaged and metrics is not None:
            eng.notes += _pair_decisions(live)
    elif sel.bridge == "off" and vb.engaged:
        eng.errors.append(
            f"bridge requested off but the server reports it enabled (mode {b.mode})"
            if b.enabled
            else f"bridge requested off but /metrics counts {live.get('bridge_boundaries_total', 0)} "
            "boundaries crossed through it"
        )


def _engaged(name: str, prefix: str, from_line: str | None, counted: str) -> str:
    """The note that a mechanism engaged: what its "enabled" log line says (INFO, shown at -lv 3), else what its
    counters on /metrics count (``llamacpp:<prefix>_*``, the proof at the default verbosity)."""
    if from_line is not None:
        return f"{name} engaged: {from_line}"
    return f"{name} engaged: {counted} (llamacpp:{prefix}_* on /metrics)"


def _pair_decisions(live: Mapping[str, int]) -> list[str]:
    """What /metrics says of the bridge's per-pair decisions (``pairs_bridge``, ``pairs_upstream``), when it has
    them: the ordered device pairs each path took (patch 0001 counts them per set of backends, in every mode), or that
    the build counted none (the series before 2026-12-03 counted a pair only where it asked the CUDA runtime: not in
    mode force, not between virtual devices of one GPU)."""
    bridge, upstream = live.get("bridge_pairs_bridge_total"), live.get("bridge_pairs_upstream_total")
    if bridge is None or upstream is None:
        return []
    if bridge or upstream:
        return [f"device pairs: {bridge} through the bridge, {upstream} on upstream's copy (/metrics)"]
    return [
        "/metrics counts no device pair decision (llamacpp:bridge_pairs_*_total 0): a build of the series before "
        "2026-12-03 counts a pair only where it asks the CUDA runtime (not in mode force, not between virtual "
        "devices of one GPU); the state line at -lv 4 gives the pairs routed"
    ]


def _prove_batched(eng: Engagement, sel: Selectors, metrics: Mapping[str, int] | None, warmed_up: bool) -> None:
    t, live = eng.info.batched, dict(metrics or {})
    vt = from_metrics(BATCHED, t, metrics)
    if sel.asks_batched:
        if vt.engaged:
            counted = (
                f"{live.get('batched_graphs_total', 0)} graph(s) staged, "
                f"{live.get('batched_async_uploads_total', 0)} asynchronous uploads"
            )
            from_line = f"pinned pool up to {t.pool_mib} MiB" if t.enabled else None
            eng.notes.append(_engaged("batched transfers", "batched", from_line, counted))
        elif vt.state == IDLE and warmed_up:
            # patched, no "inactive" warning, and yet the start-up warm-up decode staged nothing
            eng.errors.append(
                "batched transfers requested but /metrics counts no staged graph after the warm-up "
                f"decode (llamacpp:batched_graphs_total {live.get('batched_graphs_total', 0)})"
            )
        else:
            no_line = (
                "the server printed no llama_batched_transfers line (binary without the patch?)"
                if metrics is None
                else "/metrics has no llamacpp:batched_* counters (binary without the patch?)"
                if vt.state == ABSENT
                else "/metrics counts no staged graph yet (no warm-up decode: --no-warmup)"
            )
            eng.notes.append(_not_engaged("batched transfers", vt.reason, no_line))
    elif sel.batched == "off" and vt.engaged:
        eng.errors.append(
            "batched transfers requested off but the server reports them enabled"
            if t.enabled
            else f"batched transfers requested off but /metrics counts "
            f"{live.get('batched_graphs_total', 0)} staged graph(s)"
        )


_REASON_DEVICES = re.compile(r"\b(?P<n>\d+) device\(s\)")


def _devices_in_reason(reason: str) -> int:
    """The device count an "inactive" reason of the bridge (patch 0001, a WARN line: shown at the default verbosity,
    where the INFO "using device" lines are not) states: "single device" 1, "... (2 device(s) on ...)" 2, a failed
    allocation of its slots (only tried for a split that needs them) at least 2; else 0 (not known)."""
    if reason.startswith("single device"):
        return 1
    if m := _REASON_DEVICES.search(reason):
        return int(m["n"])
    if "could not be allocated" in reason or "cudaHostAlloc" in reason:
        return 2
    return 0


def _not_engaged(what: str, reason: str | None, no_line: str) -> str:
    """The note for a mechanism that was asked for but may rightly stay off here (one device, CPU): the server's own
    reason when it gave one, else what was missing from its log."""
    if reason:
        return f"{what} not engaged: {reason}; serving anyway"
    return f"{what} not confirmed: {no_line}; serving anyway"


def splits_by_tensor(server_args: Sequence[str], env: Mapping[str, str]) -> bool:
    """llama-server is asked for ``-sm tensor`` (its last ``-sm``/``--split-mode``, else LLAMA_ARG_SPLIT_MODE)."""
    value = env.get(SPLIT_ENV)
    for i, a in enumerate(server_args):
        if a in SPLIT_FLAGS and i + 1 < len(server_args):
            value = server_args[i + 1]
        elif a.startswith("--split-mode="):
            value = a.split("=", 1)[1]
    return value == "tensor"


def prove_allreduce(eng: Engagement, env: Mapping[str, str], verbose: bool) -> None:
    """-sm tensor: the Meta device and the all-reduce path upstream took (:func:`ggml_bridge.runtime.engagement.
    allreduce_verdict`; ``env``: the server's environment, GGML_CUDA_ALLREDUCE and GGML_CUDA_DEVICES). The path is
    said by INFO lines (``verbose``: the server logs them); the bridge's part, where it is forced on the butterfly,
    is the bridge's proof."""
    info = eng.info
    n = info.meta_devices
    if not verbose:
        eng.notes.append("-sm tensor: the all-reduce path is said at INFO level: use -lv 4 (serve --check adds it)")
        return
    if n < 2:
        eng.errors.append(f"-sm tensor asked, but the log shows no Meta device over 2 or more devices (found {n})")
        return
    patched = info.bridge.seen or bool(info.allreduce.bridge_enabled or info.allreduce.bridge_inactive)
    bridge = env.get(BRIDGE_VAR) if patched else None
    v = allreduce_verdict(info.allreduce, env.get(ALLREDUCE), n, CUDA_DEVICES in env, bridge, patched)
    said = f"-sm tensor over {n} devices: all-reduce {v.expected}"
    if v.ok:
        eng.notes.append(f"{said} ({v.evidence})")
    else:
        eng.errors.append(f"{said} expected, not proved: {v.evidence}")
