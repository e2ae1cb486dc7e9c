"""Validity rules: no vacuous pass. What every process's log (and /metrics, and the rpc-servers' counters)
must show for a mode to count; the verdict is a :class:`~.results.Validity`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ...runtime import logparse
from ...runtime.engagement import BATCHED, BRIDGE, INACTIVE, allreduce_verdict, engaged
from ...runtime.mechanisms import BRIDGE as BRIDGE_RECORD
from ...runtime.modes import ALLREDUCE, BRIDGE_VALUES, VARIANTS, Mode
from .kinds import Boundaries
from .results import AllreducePath, Link, Mechanism, RpcCheck, RpcServerSeen, Validity
from .schema import Rung


def _state(n_engaged: int, n_inactive: int, n_procs: int) -> str:
    if n_engaged == n_procs:
        return "engaged"
    if n_inactive == n_procs:
        return "inactive"
    return "absent" if n_engaged == n_inactive == 0 else "mixed"


def _verdicts(logs: dict[str, logparse.LogInfo], mech: str) -> tuple[list[str], dict[str, str], str]:
    """Of ``mech`` (BRIDGE or BATCHED) in every process's log: the processes where it engaged, the ones where it
    said why it is inactive, and the state of the whole (:func:`_state`)."""
    verdicts = {p: engaged(mech, i.bridge if mech == BRIDGE else i.batched) for p, i in logs.items()}
    on = [p for p, v in verdicts.items() if v.engaged]
    inactive = {p: v.reason for p, v in verdicts.items() if v.state == INACTIVE and v.reason is not None}
    return on, inactive, _state(len(on), len(inactive), len(logs))


def _inactive_as_expected(what: str, short: str, inactive: dict[str, str]) -> str:
    reasons = "; ".join(sorted(set(inactive.values())))
    return f"{what} inactive as the rung expects ({reasons}): compared, not a {short} pass"


def _not_engaged(
    what: str, no_line: str, logs: dict[str, logparse.LogInfo], on: list[str], inactive: dict[str, str]
) -> str:
    """The problem line of a mechanism that did not engage in every process: why, per process."""
    why = "; ".join(f"{p}: " + (f"inactive: {inactive[p]}" if p in inactive else no_line) for p in logs if p not in on)
    return f"{what} not engaged ({why})"


def _pool_problems(expect: dict[str, str], pools: dict[str, dict[str, str]]) -> list[str]:
    """Each process's ``pools:`` line against the rung's ``expect_pools`` (backend -> host buffer type or "none")."""
    problems = []
    for proc, got in pools.items():
        if not got:
            problems.append(f"{proc}: no 'llama_batched_transfers: pools:' line (the rung expects pools)")
            continue
        for backend, want in expect.items():
            have = got.get(backend)
            if have is None or not (have.startswith("none") if want == "none" else have == want):
                problems.append(f"{proc}: {backend}'s pinned pool is {have or 'not listed'}, the rung expects {want}")
    return problems


def _tot(stats: list[dict[str, int]], key: str) -> int:
    return sum(s.get(key, 0) for s in stats)


def _mechanism(
    state: str,
    per_process: Mapping[str, Mapping[str, object]],
    inactive: Mapping[str, str],
    stats: list[dict[str, int]],
    totals: tuple[str, ...],
) -> Mechanism:
    """A mechanism's part of a mode's validity, the totals of the counters named summed over its stats lines."""
    return Mechanism(state, per_process, inactive, tuple(stats), {k: _tot(stats, k) for k in totals})


@dataclass
class _Validation:
    """One mode's validation under way: its inputs, and the problems, notes and summary found so far."""

    mode: Mode
    rung: Rung
    logs: dict[str, logparse.LogInfo]
    metrics: dict[str, int] | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bridge: Mechanism | None = None
    batched: Mechanism | None = None
    devices_used: dict[str, int] | None = None
    allreduce: dict[str, AllreducePath] | None = None
    bridge_stats: list[dict[str, int]] = field(default_factory=list)
    batched_stats: list[dict[str, int]] = field(default_factory=list)

    def verdict(self) -> Validity:
        return Validity(
            tuple(self.problems), tuple(self.notes), self.bridge, self.batched, self.devices_used, self.allreduce
        )


def validate_mode(
    mode: Mode, rung: Rung, logs: dict[str, logparse.LogInfo], metrics: dict[str, int] | None = None
) -> Validity:
    """Check the log-line contract for one mode across its processes (server, perplexity), and the server's live
    counters on /metrics (``metrics``, when it served them)."""
    v = _Validation(mode, rung, logs, metrics)
    for info in logs.values():
        v.bridge_stats += info.bridge.stats
        v.batched_stats += info.batched.stats
    _check_selectors(v)
    if mode.uses_bridge:
        _check_bridge(v)
    if mode.uses_batched:
        _check_batched(v)
    if rung.multi_device:
        _check_devices(v)
    if rung.split_mode == "tensor":
        _check_allreduce(v)
    return v.verdict()


def _check_allreduce(v: _Validation) -> None:
    """-sm tensor: every process took the all-reduce path upstream picks for the rung (its own lines say which:
    :func:`ggml_bridge.runtime.engagement.allreduce_verdict`); over rpc-servers or CPU devices there is no CUDA
    communicator, so the meta backend's butterfly, and no internal pipeline line may appear."""
    value = v.rung.env.get(ALLREDUCE) or v.mode.allreduce or v.rung.allreduce  # (schema.effective_allreduce's order)
    per: dict[str, AllreducePath] = {}
    for proc, info in v.logs.items():
        if v.rung.devices > 0 and not v.mode.rpc:
            patched = VARIANTS[v.mode.variant].patched
            bridge = BRIDGE_VALUES[v.mode.bridge] if patched and v.mode.bridge else None
            virtual = v.rung.virtual_devices is not None
            verdict = allreduce_verdict(info.allreduce, value, v.rung.n_devices, virtual, bridge, patched)
            per[proc] = AllreducePath(verdict.expected, verdict.seen, verdict.evidence)
            if not verdict.ok:
                v.problems.append(f"{proc}: all-reduce {verdict.expected} not proved ({verdict.evidence})")
        else:
            per[proc] = AllreducePath("butterfly", info.allreduce.path, "no CUDA communicator")
            if info.allreduce.internal_ready:
                v.problems.append(f"{proc}: an internal all-reduce pipeline started without CUDA devices")
    v.allreduce = per
    paths = sorted({p.expected for p in per.values()})
    v.notes.append(f"all-reduce: {', '.join(paths)} ({'; '.join(sorted({p.evidence for p in per.values()}))})")


def _check_selectors(v: _Validation) -> None:
    """Patch lines in an upstream build; rejected selector values; a mechanism on whose selector is 0."""
    mode, logs, problems = v.mode, v.logs, v.problems
    if not VARIANTS[mode.variant].patched:
        for proc, info in logs.items():
            if info.bridge.seen or info.batched.seen or info.bridge.stats or info.batched.stats:
                problems.append(f"{proc}: the upstream binary printed patch log lines: it is not an unpatched build")
    else:
        want_rejected = dict(mode.rejected)
        for proc, info in logs.items():
            for var, value in info.bridge.rejected.items():
                if want_rejected.get(var) != value:
                    problems.append(f"{proc}: selector rejected: {var}=\"{value}\"")
            for var, value in want_rejected.items():
                if info.bridge.rejected.get(var) != value:
                    problems.append(f"{proc}: {var}=\"{value}\" is invalid but the log does not report it rejected")
            if not mode.uses_bridge and info.bridge.enabled:
                problems.append(f"{proc}: bridge reported enabled in mode {mode.name} (selector 0)")
            if not mode.uses_batched and info.batched.enabled:
                problems.append(f"{proc}: batched transfers reported enabled in mode {mode.name} (selector 0)")


def _check_bridge(v: _Validation) -> None:
    """A bridge mode: engaged in every process (with boundaries on a multi-device rung), or inactive as the rung expects."""
    mode, rung, logs, problems, notes = v.mode, v.rung, v.logs, v.problems, v.notes
    bridge_stats = v.bridge_stats
    assert mode.bridge is not None  # uses_bridge
    want_mode = BRIDGE_VALUES[mode.bridge]
    on, inactive, state = _verdicts(logs, BRIDGE)
    per_process = {"slots": {p: logs[p].bridge.slots for p in on}, "slot_mib": {p: logs[p].bridge.slot_mib for p in on}}
    v.bridge = _mechanism(state, per_process, inactive, bridge_stats, BRIDGE_RECORD.work_keys)
    expect = rung.expect.get(mode.name, rung.expect_bridge)
    if state == "engaged":
        if expect == "inactive":
            problems.append("bridge engaged but the rung expects it inactive")
        for p in on:
            if logs[p].bridge.mode != want_mode:
                problems.append(f"{p}: bridge mode {logs[p].bridge.mode}, expected {want_mode}")
        if rung.multi_device and rung.boundaries is Boundaries.REQUIRED:
            if not bridge_stats:
                problems.append("no bridge stats line (printed when the last CUDA backend is freed)")
            elif not any(_tot(bridge_stats, k) > 0 for k in BRIDGE_RECORD.work_keys):
                problems.append(
                    "bridge counters show no work on a multi-device rung ("
                    + ", ".join(f"{k}={_tot(bridge_stats, k)}" for k in BRIDGE_RECORD.work_keys)
                    + ")"
                )
        if rung.multi_device and rung.boundaries is Boundaries.COUNTED:
            notes.append(
                f"bridge engaged, {_tot(bridge_stats, 'boundaries')} boundaries counted (the rung "
                "does not require any: its split copies between devices on another path)"
            )
        if expect == "either":
            notes.append("bridge engaged")
    elif state == "inactive" and expect in ("inactive", "either"):
        notes.append(_inactive_as_expected("bridge", "bridge", inactive))
    else:
        problems.append(_not_engaged("bridge", "no bridge line", logs, on, inactive))


def _check_batched(v: _Validation) -> None:
    """A batched mode: engaged with async uploads (and its pools), or inactive as the rung expects."""
    mode, rung, logs, problems, notes = v.mode, v.rung, v.logs, v.problems, v.notes
    metrics, batched_stats = v.metrics, v.batched_stats
    on, inactive, state = _verdicts(logs, BATCHED)
    per_process: dict[str, Mapping[str, object]] = {
        "pool_mib": {p: logs[p].batched.pool_mib for p in on},
        "pools": {p: logs[p].batched.pools for p in on},
    }
    # fallbacks: what batching tried and could not stage (sync_*); upstream_uploads: what it left on upstream's path
    # (a backend without a pinned pool of its own, an input over the stage limit): reported, never counted as batches
    totals = ("async_uploads", "async_downloads", "fallbacks", "upstream_uploads")
    v.batched = _mechanism(state, per_process, inactive, batched_stats, totals)
    expect = rung.expect.get(mode.name, rung.expect_batched)
    if state == "engaged":
        if expect == "inactive":
            problems.append("batched transfers engaged but the rung expects them inactive")
        if not batched_stats:
            problems.append("no batched-transfers stats line (LLAMA_BATCHED_TRANSFERS=1 prints it at teardown)")
        else:
            # async_* count only what batching staged: every graph's small inputs. Logits go to llama.cpp's
            # pinned output buffer, which upstream already downloads asynchronously (upstream_downloads)
            if expect == "idle":
                notes.append(
                    f"batched transfers enabled, async_uploads={_tot(batched_stats, 'async_uploads')} "
                    "(the rung expects no work to be required)"
                )
            elif _tot(batched_stats, "async_uploads") <= 0:
                problems.append("batched counters show no async upload (async_uploads=0)")
        if rung.expect_pools:
            problems += _pool_problems(rung.expect_pools, {p: logs[p].batched.pools for p in on})
            first = logs[on[0]].batched.pools if on else {}
            notes.append(
                "batched pools: "
                + "; ".join(f"{b}: {v}" for b, v in first.items())
                + f" (fallbacks={_tot(batched_stats, 'fallbacks')}, "
                f"upstream_uploads={_tot(batched_stats, 'upstream_uploads')})"
            )
        if metrics is not None and mode.variant == "patched" and expect != "idle":
            live = metrics.get("batched_async_uploads_total", 0)
            v.batched = replace(v.batched, metrics_async_uploads=live)
            if live <= 0:
                problems.append(
                    "/metrics shows no batched async upload (llamacpp:batched_async_uploads_total="
                    f"{metrics.get('batched_async_uploads_total', 'absent')})"
                )
        if expect == "either":
            notes.append("batched transfers engaged")
    elif state == "inactive" and expect in ("inactive", "either"):
        if _tot(batched_stats, "async_uploads") or _tot(batched_stats, "async_downloads"):
            problems.append("batched transfers inactive but async transfers were counted")
        notes.append(_inactive_as_expected("batched transfers", "batched", inactive))
    else:
        problems.append(_not_engaged("batched transfers", "no batched-transfers line", logs, on, inactive))


def _check_devices(v: _Validation) -> None:
    """A multi-device rung: every process shows the model on the rung's devices."""
    rung, logs, problems = v.rung, v.logs, v.problems
    used = {p: i.n_devices for p, i in logs.items()}
    v.devices_used = used
    want = rung.n_devices
    low = {p: n for p, n in used.items() if n < want}
    if low:
        problems.append(
            f"the rung splits the model over {want} devices but the log shows it on fewer: "
            + ", ".join(f"{p}: {n}" for p, n in low.items())
        )


def validate_rpc(
    mode: Mode,
    servers: dict[str, logparse.RpcServerInfo],
    rung: Rung | None = None,
    links: Mapping[str, Link] | None = None,
) -> RpcCheck:
    """The rpc-servers of an rpc-* mode. Each computed graphs (counters) on the devices the rung gave it; one that
    owns two or more devices carried the boundary between them as RPC_CMD_COPY_TENSOR (else the rung did not
    exercise what it is about), through the bridge in a bridge mode (engaged in the mode asked for, boundaries
    counted); one with a single GPU proves the bridge idle (no boundary counted) and says so; with a shaped link
    (``rung.rpc_link``) bytes crossed it both ways."""
    problems: list[str] = []
    notes: list[str] = []
    summary: dict[str, RpcServerSeen] = {}
    wanted = list(rung.rpc_servers) if rung is not None else []
    for i, (ep, info) in enumerate(servers.items()):
        c = info.latest
        link = links.get(ep) if links else None
        summary[ep] = RpcServerSeen(tuple(info.devices), c, info.bridge.enabled, info.bridge.mode, link)
        if link is not None:
            _rpc_link(ep, link, problems, notes)
        if i < len(wanted) and info.devices and len(info.devices) != len(wanted[i]):
            problems.append(
                f"rpc-server {ep}: given devices {','.join(wanted[i])} but it serves {','.join(info.devices)}"
            )
        if not VARIANTS[mode.variant].patched:
            if info.state is not None or info.bridge.seen:
                problems.append(f"rpc-server {ep}: the upstream binary printed patch lines")
            continue
        if info.state is None:
            problems.append(f"rpc-server {ep}: no 'ggml_bridge_rpc: state' line (not a patch-0006 build)")
            continue
        if not c:
            problems.append(f"rpc-server {ep}: no counters line after SIGUSR1")
            continue
        if c.get("rpc_graph_compute", 0) <= 0:
            problems.append(f"rpc-server {ep}: computed no graph (rpc_graph_compute=0): the model did not use it")
        if len(info.devices) > 1 and c.get("rpc_copy_tensor", 0) <= 0:
            problems.append(
                f"rpc-server {ep}: owns {len(info.devices)} devices but served no RPC_CMD_COPY_TENSOR "
                "(rpc_copy_tensor=0): no boundary between them was exercised"
            )
        _rpc_bridge(mode, ep, info, problems, notes)
    return RpcCheck(tuple(problems), tuple(notes), summary)


def _rpc_link(ep: str, link: Link, problems: list[str], notes: list[str]) -> None:
    """Bytes crossed an rpc-server's shaped link both ways."""
    up, down = link.up_bytes, link.down_bytes
    if up <= 0 or down <= 0:
        problems.append(f"rpc-server {ep}: nothing crossed its shaped link {link.name} (up {up} B, down {down} B)")
    else:
        notes.append(f"rpc-server {ep}: {up} B up and {down} B down through the shaped link {link.name}")


def _rpc_bridge(mode: Mode, ep: str, info: logparse.RpcServerInfo, problems: list[str], notes: list[str]) -> None:
    """The bridge inside one rpc-server: off in a mode without it; engaged with boundaries where it owns two or
    more GPUs; idle (no boundary counted) with one GPU or none."""
    gpus = [d for d in info.devices if d.startswith("CUDA")]
    c = info.latest
    if not mode.uses_bridge:
        if info.bridge.enabled:
            problems.append(f"rpc-server {ep}: bridge enabled in mode {mode.name} (selector 0)")
    elif len(gpus) > 1:
        v = engaged(BRIDGE, info.bridge)
        want_mode = BRIDGE_VALUES[mode.bridge or "off"]
        if not v.engaged:
            problems.append(
                f"rpc-server {ep}: bridge not engaged on its {len(gpus)} GPUs ("
                + (f"inactive: {v.reason}" if v.reason else "no bridge line")
                + ")"
            )
        elif info.bridge.mode != want_mode:
            problems.append(f"rpc-server {ep}: bridge mode {info.bridge.mode}, expected {want_mode}")
        elif not c.get("bridge"):
            problems.append(
                f"rpc-server {ep}: the CUDA registry exports no bridge counters "
                "(0001 without ggml_backend_cuda_mapped_host_bridge_counters)"
            )
        elif c.get("bridge_boundaries", 0) <= 0:
            problems.append(
                f"rpc-server {ep}: bridge engaged but bridge_boundaries=0 "
                f"(rpc_copy_tensor={c.get('rpc_copy_tensor', 0)})"
            )
        else:
            notes.append(
                f"rpc-server {ep}: bridge engaged (mode {info.bridge.mode}) on {len(gpus)} GPUs: "
                f"bridge_boundaries={c['bridge_boundaries']} bridge_bytes={c.get('bridge_bytes', 0)} "
                f"rpc_copy_tensor={c.get('rpc_copy_tensor', 0)}"
            )
    else:
        crossed = c.get("bridge_boundaries", 0)
        if crossed > 0:
            problems.append(f"rpc-server {ep}: {len(gpus) or 'no'} GPU, yet its bridge counted {crossed} boundaries")
        else:
            said = (
                f"it says: inactive: {info.bridge.inactive_reason}"
                if info.bridge.inactive_reason
                else "enabled, nothing routed"
                if info.bridge.enabled
                else "no bridge line"
            )
            notes.append(
                f"rpc-server {ep}: bridge idle, as it must be with {len(gpus) or 'no'} GPU "
                f"({said}; bridge_boundaries=0): every boundary of this topology crosses TCP"
            )


def validate_front(rung: Rung, logs: Mapping[str, logparse.LogInfo]) -> list[str]:
    """A rung whose rpc front keeps its GPU (:attr:`RpcFront.GPU`): every front process (llama-server, llama-perplexity) put layers on its own GPU and on the
    rpc-servers (else the topology under test did not happen); problems, one per process."""
    problems = []
    for proc, info in logs.items():
        local = [d for d in info.devices if not d.startswith("RPC")]
        remote = [d for d in info.devices if d.startswith("RPC")]
        if not local or not remote:
            problems.append(
                f"{proc}: the rung keeps a GPU in front of the rpc-servers, but the model sits on "
                f"{', '.join(info.devices) or 'no device the log names'}"
            )
    return problems
