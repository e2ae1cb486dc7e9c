"""What a ladder run found, as values: a mode's :class:`Validity`, a mode's, a rung's and the run's results. Built
once by the stages (validity, orchestrate), serialized once (``as_json``) where the report is written."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .artifact import Comparison, Record
from .schema import Rung


@dataclass(frozen=True)
class Mechanism:
    """A mechanism's part of a mode's validity: its state over the processes, what each engaged process said (the
    bridge's ``slots`` and ``slot_mib``, batching's ``pool_mib`` and ``pools``: by name, then process), the processes
    where it said why it is inactive, its stats lines and the totals of the counters named."""

    state: str
    per_process: Mapping[str, Mapping[str, object]]
    inactive: Mapping[str, str]
    stats: tuple[Mapping[str, int], ...]
    totals: Mapping[str, int]
    metrics_async_uploads: int | None = None
    """Batching's live counter on the server's /metrics, where it was read."""

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "state": self.state,
            **{k: dict(v) for k, v in self.per_process.items()},
            "inactive": dict(self.inactive),
            "stats": [dict(s) for s in self.stats],
            **self.totals,
        }
        if self.metrics_async_uploads is not None:
            out["metrics_async_uploads"] = self.metrics_async_uploads
        return out


@dataclass(frozen=True)
class AllreducePath:
    """-sm tensor: the all-reduce path a process had to take, the one its lines show, and why."""

    expected: str
    seen: str | None
    evidence: str

    def as_json(self) -> dict[str, object]:
        return {"expected": self.expected, "seen": self.seen, "evidence": self.evidence}


@dataclass(frozen=True)
class Link:
    """What crossed an rpc-server's shaped link: the shaper's stats as they came (:meth:`of`), and the numbers the
    validity reads from them."""

    name: str
    up_bytes: int
    down_bytes: int
    stats: Mapping[str, object]

    @classmethod
    def of(cls, stats: Mapping[str, Any]) -> Link:
        return cls(str(stats["link"]), int(stats["up"]["bytes"]), int(stats["down"]["bytes"]), dict(stats))


@dataclass(frozen=True)
class RpcServerSeen:
    """One rpc-server of an rpc-* mode as the report lists it."""

    devices: tuple[str, ...]
    counters: Mapping[str, int]
    bridge_enabled: bool
    bridge_mode: str | None
    link: Link | None = None

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "devices": list(self.devices),
            "counters": dict(self.counters),
            "bridge_enabled": self.bridge_enabled,
            "bridge_mode": self.bridge_mode,
        }
        if self.link is not None:
            out["link"] = dict(self.link.stats)
        return out


@dataclass(frozen=True)
class RpcCheck:
    """The rpc-servers of an rpc-* mode checked (:func:`validate_rpc`)."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]
    servers: Mapping[str, RpcServerSeen]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Validity:
    """One mode's verdict: its problems (none: it counts), its notes, and what each check saw (None: not checked)."""

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    bridge: Mechanism | None = None
    batched: Mechanism | None = None
    devices_used: Mapping[str, int] | None = None
    allreduce: Mapping[str, AllreducePath] | None = None
    rpc: Mapping[str, RpcServerSeen] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def with_rpc(self, check: RpcCheck, front: tuple[str, ...] = ()) -> Validity:
        """This verdict of the front processes joined with the rpc-servers' (and ``front``: the front's own
        problems over them, :func:`validate_front`)."""
        return replace(
            self,
            problems=self.problems + check.problems + front,
            notes=self.notes + check.notes,
            rpc=check.servers,
        )

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "ok": self.ok,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "bridge": self.bridge.as_json() if self.bridge else None,
            "batched": self.batched.as_json() if self.batched else None,
        }
        if self.devices_used is not None:
            out["devices_used"] = dict(self.devices_used)
        if self.allreduce is not None:
            out["allreduce"] = {p: a.as_json() for p, a in self.allreduce.items()}
        if self.rpc is not None:
            out["rpc"] = {ep: s.as_json() for ep, s in self.rpc.items()}
        return out


@dataclass(frozen=True)
class ModeResult:
    """One mode of a rung: where it ran, its artifacts (every registered one, None where it made none), and its
    error or its validity; ``compare``: its artifacts against the reference's (None: not compared)."""

    wall_s: float
    side: str
    variant: str
    selectors: Mapping[str, str]
    artifacts: Mapping[str, Record | None]
    error: str | None = None
    validity: Validity | None = None
    compare: Mapping[str, Comparison] | None = None

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "wall_s": self.wall_s,
            "side": self.side,
            "variant": self.variant,
            "selectors": dict(self.selectors),
            **{a: r.as_json() if r else None for a, r in self.artifacts.items()},
        }
        if self.error:
            out["error"] = self.error
        if self.validity is not None:
            out["validity"] = self.validity.as_json()
        if self.compare is not None:
            out["compare"] = {k: c.as_json() for k, c in self.compare.items()}
        return out


@dataclass(frozen=True)
class Prepared:
    """A rung's inputs as far as they were made (None: not reached): the model's size, the boundary activation
    (n_embd x ubatch, f32), the model file, the prompts' lengths."""

    n_params: int | None = None
    boundary_mib_f32: float | None = None
    model: str | None = None
    prompt_words: tuple[int, ...] | None = None

    def as_json(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items() if v is not None}


#: a rung's statuses, best first
STATUSES = ("pass", "invalid", "mismatch", "error")


@dataclass(frozen=True)
class RungResult:
    """One rung: its status (:data:`STATUSES`), the problems that decided it, each mode's result in the order they
    ran, its inputs, its setup error (the modes did not run) and its wall time."""

    rung: Rung
    status: str
    problems: tuple[str, ...]
    modes: Mapping[str, ModeResult]
    prepared: Prepared
    wall_s: float
    error: str | None = None

    def as_json(self) -> dict[str, object]:
        r = self.rung
        out: dict[str, object] = {
            "name": r.name,
            "shape": dataclasses.asdict(r.shape),
            "seed": r.seed,
            "devices": r.devices,
            "virtual_devices": r.virtual_devices,
            "split_mode": r.split_mode,
            "allreduce": r.allreduce,
            "multi_device": r.multi_device,
            "ubatch": r.ubatch,
            "batch": r.batch,
            "ctx": r.server_ctx(),
            "ppl_ctx": r.perplexity_ctx(),
            "reference": r.reference,
            "modes": {name: m.as_json() for name, m in self.modes.items()},
            "status": self.status,
            "problems": list(self.problems),
            **self.prepared.as_json(),
        }
        if self.error is not None:
            out["error"] = self.error
        out["wall_s"] = self.wall_s
        return out


@dataclass(frozen=True)
class LadderResult:
    """A ladder run so far (``status`` ``running``) or done (``pass``, ``fail``, ``error``)."""

    ladder: str
    file: str
    backend: str
    started: str
    vocab: str
    threads: int
    binaries: Mapping[str, str | None]
    """Side -> the folder of its programs."""
    same_build: bool
    rungs: tuple[RungResult, ...] = ()
    wall_s: float = 0.0
    status: str = "running"

    def add(self, rung: RungResult, wall_s: float) -> LadderResult:
        return replace(self, rungs=(*self.rungs, rung), wall_s=round(wall_s, 2))

    def as_json(self) -> dict[str, object]:
        return {
            "ladder": self.ladder,
            "file": self.file,
            "backend": self.backend,
            "started": self.started,
            "vocab": self.vocab,
            "threads": self.threads,
            "binaries": {**self.binaries, "same_build": self.same_build},
            "rungs": [r.as_json() for r in self.rungs],
            "wall_s": self.wall_s,
            "status": self.status,
        }
