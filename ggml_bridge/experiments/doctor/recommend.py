"""From findings to advice: the bridge's setting (and the GPU pairs it must not trust), whether to enable peer access,
batching, the split ratios (``-ts``), what each boundary of the split costs per token (the paper model with the
links measured here), and the exact ``ggml-bridge serve`` command line.

The rules, each stated where it is applied, are documented in docs/doctor.md.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

from ...runtime import modes
from . import cost, split_mode
from .facts import Findings
from .inventory import ListedDevice
from .probe import LARGE, SMALL, ProbeResult, Timing
from .split_mode import SplitModeAdvice

MiB = 1 << 20
#: memory a device keeps for the KV cache and compute buffers besides its share of the weights
HEADROOM = 0.10
HEADROOM_MIB = 512
#: the direct peer copy is recommended only where it is this much faster than the bridge (and verified correct)
P2P_MIN_GAIN = 1.10
UBATCH = 512
#: a boundary the bridge does not carry (a Vulkan or a CPU device on either side): the scheduler stages it in host memory
HOST_STAGED = "staged in host memory by the scheduler (the bridge carries CUDA pairs only)"


@dataclass(frozen=True)
class Boundary:
    src: str
    dst: str
    path: str
    per_token_us: float | None
    per_ubatch_ms: float | None
    measured_small_us: float | None  # the probe's 64 KiB copy on that path (one copy and its synchronization)
    basis: str


@dataclass
class Recommendation:
    bridge: str | None = None  # GGML_CUDA_MAPPED_HOST_BRIDGE value; None: leave it unset (nothing to route)
    p2p: bool = False  # GGML_CUDA_P2P=1
    batched: bool = False
    devices: list[str] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)  # per cent, in device order
    ts_basis: str = ""
    boundaries: list[Boundary] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    split_mode: SplitModeAdvice | None = None  # -sm tensor against -sm layer (two or more CUDA devices)

    @property
    def command(self) -> str:
        return " ".join([f"{k}={quoted(v)}" for k, v in self.env.items()] + [quoted(a) for a in self.argv])

    @property
    def per_token_us(self) -> float | None:
        costs = [b.per_token_us for b in self.boundaries]
        return None if not costs or any(c is None for c in costs) else sum(c for c in costs if c is not None)


def quoted(value: str) -> str:
    """A value the report shows as the shell takes it: shlex's quoting, or bash's ``$'...'`` with escapes when it
    holds a control character (so the line stays one line, and the command still pastes)."""
    if value.isprintable():
        return shlex.quote(value)
    body = "".join(
        c if c.isprintable() and c not in "'\\" else ("\\" + c if c in "'\\" else c.encode("unicode_escape").decode())
        for c in value
    )
    return f"$'{body}'"


#: what batching was measured to do where it is advised (docs/batched.md, results/2026-12-03-h200x1-batched-split-rule)
BATCHING_MEASURED = (
    "batched transfers: on: token generation stages the inputs of each step's first device split (one H200, "
    "2026-12-03, 5120-wide model: tg128 +4-5 % on one GPU, +3-4 % on 6 virtual devices with and without the "
    "bridge); prompts keep upstream's copies (their KQ mask is over the stage limit), so they run as with batching "
    "off; not yet measured on a rig of several real GPUs"
)


def _batching_advice(rec: Recommendation, devices: list[ListedDevice]) -> None:
    """Batching wherever a GPU device has inputs to stage: a graph's first device split stages its token step's
    inputs (measured gains on one GPU and on a split of several virtual devices); nothing to stage on the CPU."""
    gpus = [d for d in devices if d.kind in ("CUDA", "Vulkan")]
    rec.batched = bool(gpus)
    if not gpus:
        rec.notes.append("no GPU device: batched transfers have nothing to stage (CPU backend), left off")
    else:
        rec.notes.append(BATCHING_MEASURED)


def recommend(f: Findings, default_server: str | None) -> Recommendation:
    """The advice for findings ``f``; ``default_server`` is the llama-server ``ggml-bridge serve`` finds by itself
    (the command names ``--server`` only when the serving build is another one)."""
    rec = Recommendation()
    devices = split_devices(f)
    rec.devices = [d.name for d in devices]
    if f.serving is not None and not f.serving.build.cuda and any(d.kind == "CUDA" for d in devices):
        rec.notes.append(
            f"the serving build ({f.serving.build.label}) has no CUDA backend: the CUDA devices are the probe's; "
            "`ggml-bridge build --backend cuda` builds the one to serve them"
        )
    _peer_advice(f, rec)
    _link_warnings(f, rec)
    cuda = [d for d in devices if d.kind == "CUDA"]
    gpus = {_gpu_of(f.probe, d) for d in cuda}
    if len(cuda) >= 2:
        rec.bridge = rec.bridge or "auto"
        if len(gpus) == 1 and None not in gpus:
            rec.notes.append(
                f"{len(cuda)} virtual devices of one GPU ({modes.CUDA_DEVICES}): no PCIe pair between them; auto "
                "keeps upstream's device-local copy (--bridge force routes them through the bridge: verification only)"
            )
    elif rec.bridge is None and cuda:
        rec.notes.append("one CUDA device: no cross-GPU boundary, the bridge has nothing to do")
    if len(cuda) >= 2 and not f.rpc:
        rec.split_mode = split_mode.advise(f, [d.name for d in cuda], rec.bridge, rec.p2p)
        rec.notes += rec.split_mode.notes
    _batching_advice(rec, devices)
    if len(devices) >= 2 and not f.rpc:
        rec.ts, rec.ts_basis = split_shares(f, devices)
        rec.boundaries = boundaries(f, rec, [d for d, s in zip(devices, rec.ts, strict=True) if s > 0])
    elif f.rpc:
        rec.notes.append(
            "with RPC devices llama.cpp orders the devices itself (RPC first): no -ts given; the network's cost is "
            "measured by `ggml-bridge bench --suite rpc-link` (docs/rpc.md)"
        )
    _command(f, rec, devices, default_server)
    return rec


def _gpu_of(probe: ProbeResult | None, d: ListedDevice) -> int | None:
    if probe is None or d.kind != "CUDA":
        return None
    dev = probe.devices.get(d.ordinal) if d.ordinal is not None else None
    return dev.gpu if dev else None


def split_devices(f: Findings) -> list[ListedDevice]:
    """The devices the recommended split uses: what the serving build lists (CUDA, then Vulkan devices that are not
    an NVIDIA GPU already listed through CUDA), else the probe's CUDA devices."""
    listing = f.serving
    listed = list(listing.devices) if listing is not None else []
    if not listed and f.probe is not None:
        listed = [ListedDevice(d.name, d.description, d.total_mib, d.free_mib) for d in f.probe.devices.values()]
    cuda = [d for d in listed if d.kind == "CUDA"]
    names = {d.description.split(" (")[0] for d in cuda}
    vulkan = [d for d in listed if d.kind == "Vulkan" and d.description.split(" (")[0] not in names]
    return cuda + vulkan


def _peer_advice(f: Findings, rec: Recommendation) -> None:
    """Corrupting pairs: loud, never peer access, the bridge told not to trust them. Verified pairs: direct copies
    only where they are clearly faster. Unverified peer paths: keep peer access off."""
    p = f.probe
    if p is None:
        if any(pair.p2p_read == "ok" for pair in f.nvml.pairs):
            rec.notes.append(
                "NVML reports peer-capable pairs, but their peer copies were not checked (no probe): keep "
                f"{modes.CUDA_P2P} unset until the doctor has checked them with a patched CUDA build"
            )
        return
    bad = p.bad_pairs()
    if bad:
        pairs = ",".join(f"{a}-{b}" for a, b in bad)
        rec.bridge = f"auto:{pairs}"
        for a, b in bad:
            v = [x for x in p.verdicts.values() if {x.src_gpu, x.dst_gpu} == {a, b} and x.verdict != "ok"]
            what = "; ".join(
                f"GPU {x.src_gpu} -> GPU {x.dst_gpu}: "
                + (
                    f"the probe died during copy {x.cases} (a fault)"
                    if x.verdict == "died"
                    else f"{x.failed} of {x.cases} copies differ"
                )
                for x in v
            )
            rec.warnings.append(
                f"PEER COPIES BETWEEN GPU {a} AND GPU {b} ARE NOT SAFE ({what}, peer access enabled). Do not enable "
                f"peer access: leave {modes.CUDA_P2P} unset (upstream enables it for any value, 0 included); "
                f"{modes.BRIDGE}=auto:{pairs} routes these pairs through the bridge even where NCCL or another "
                "library enables peer access"
            )
        return
    capable = [k for k, v in p.verdicts.items() if v.verdict == "ok"]
    if not capable:
        return
    gains = [_p2p_gain(p, a, b) for a, b in capable]
    if all(g is not None and g >= P2P_MIN_GAIN for g in gains):
        rec.p2p = True
        rec.notes.append(
            f"peer copies verified on {len(capable)} ordered GPU pair(s) (every pattern, size and alignment) and "
            f"{min(g for g in gains if g):.1f}x or more the bridge's speed at 16 MiB: {modes.CUDA_P2P}=1; auto "
            "then takes the direct copy on those pairs and the bridge on the others"
        )
    else:
        rec.notes.append(
            "peer copies verified correct, but not clearly faster than the bridge here: peer access stays off"
        )


def _p2p_gain(p: ProbeResult, src_gpu: int, dst_gpu: int) -> float | None:
    for (s, d, path, size), t in p.copies.items():
        if path != "p2p" or size != LARGE:
            continue
        ds, dd = p.devices.get(s), p.devices.get(d)
        if ds is None or dd is None:
            continue  # a copy of a device no device line describes (the parser drops those; kept safe here)
        if (ds.gpu, dd.gpu) in ((src_gpu, dst_gpu), (dst_gpu, src_gpu)):
            bridge = p.copy(s, d, "bridge", LARGE) or p.copy(d, s, "bridge", LARGE)
            gain = t.gbps / bridge.gbps if bridge and bridge.gbps > 0 else None
            return gain if gain is not None and math.isfinite(gain) else None
    return None


def _link_warnings(f: Findings, rec: Recommendation) -> None:
    """Links that trained narrower or slower than they can: the width does not change at idle, the generation does,
    so a low generation counts only where the measured bandwidth confirms it."""
    from .nvml import link_gbps

    for g in f.nvml.gpus:
        best = link_gbps(g.pcie_gen_max, g.pcie_width_max)
        measured = _measured_link(f, g.pci)
        name = f.gpu_name(g.index)
        if g.degraded:
            rec.warnings.append(
                f"{name} ({g.name}) runs its link at x{g.pcie_width} of x{g.pcie_width_max}: a riser or a "
                "slot wired narrower; every boundary through it is bounded by that link"
            )
        if best and measured is not None and measured < 0.5 * best:
            rec.warnings.append(
                f"{name} ({g.name}): {measured:.1f} GB/s measured one way, {best:.1f} GB/s possible at "
                f"Gen{g.pcie_gen_max} x{g.pcie_width_max} (NVML now: Gen{g.pcie_gen} x{g.pcie_width}): the link "
                "trained lower than it can (slot, riser, BIOS PCIe setting)"
            )


def _measured_link(f: Findings, pci: str) -> float | None:
    p = f.probe
    if p is None:
        return None
    from .nvml import normalize_pci

    for dev in p.devices.values():
        g = p.gpus.get(dev.gpu)
        if g is not None and normalize_pci(g.pci) == pci:
            ts = [p.link(dev.dev, d, LARGE) for d in ("d2h", "h2d")]
            if all(ts):
                return min(t.gbps for t in ts if t)
    return None


def split_shares(f: Findings, devices: list[ListedDevice]) -> tuple[list[int], str]:
    """``-ts`` in per cent. With a model and a measured speed for every device: shares follow the speed (balanced
    pipeline stages), no device above what its free memory holds (less 10 % and 512 MiB for the KV cache and compute
    buffers). Otherwise, or when the model does not fit that way: shares follow free memory."""
    free = [max(d.free_mib, 0) for d in devices]
    speeds = [_speed(f.probe, d) for d in devices]
    if f.model is not None and all(s is not None and math.isfinite(s) and s > 0 for s in speeds):
        caps = [max(0.0, (m * (1 - HEADROOM) - HEADROOM_MIB) * MiB / f.model.bytes) for m in free]
        if sum(caps) >= 1.0:
            shares = _water_fill([s or 0.0 for s in speeds], caps)
            return _percent(shares), (
                f"by measured speed, an F32 matrix multiplication's, each device capped by what its free memory "
                f"holds of {f.model.path.name}, {_size(f.model.bytes)}"
            )
        basis = f"by free memory: {f.model.path.name} does not fit the devices' free memory with headroom, check -ngl"
    elif f.model is not None:
        basis = "by free memory: no speed measured for every device"
    else:
        basis = "by free memory; --model balances by measured speed within memory"
    return _percent([float(m) for m in free]), basis


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _speed(p: ProbeResult | None, d: ListedDevice) -> float | None:
    if p is None or d.kind != "CUDA":
        return None
    dev = p.devices.get(d.ordinal) if d.ordinal is not None else None
    if dev is None:
        return None
    first = min((x.dev for x in p.devices.values() if x.gpu == dev.gpu), default=None)
    sharing = sum(1 for x in p.devices.values() if x.gpu == dev.gpu)
    g = p.gflops.get(first) if first is not None else None
    return g / sharing if g else None


def _water_fill(weights: list[float], caps: list[float]) -> list[float]:
    shares = [0.0] * len(weights)
    free = set(range(len(weights)))
    left = 1.0
    while free and left > 1e-12:
        total = sum(weights[i] for i in free)
        over = [i for i in free if left * weights[i] / total > caps[i]]
        if not over:
            for i in free:
                shares[i] = left * weights[i] / total
            break
        for i in over:
            shares[i] = caps[i]
            left -= caps[i]
            free.discard(i)
    return shares


def _percent(values: list[float]) -> list[int]:
    """Shares in whole per cent summing to 100 (largest remainders); a figure that is not finite and positive
    counts 0, and all of them 0 share evenly."""
    values = [v if math.isfinite(v) and v > 0 else 0.0 for v in values]
    if not any(values):
        values = [1.0] * len(values)
    total = sum(values) or 1.0
    raw = [100 * v / total for v in values]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: 100 - sum(out)]:
        out[i] += 1
    return out


def boundaries(f: Findings, rec: Recommendation, devices: list[ListedDevice]) -> list[Boundary]:
    """Each boundary of the split (consecutive devices with a share): its path and what it costs per token (a
    boundary of hidden x 4 bytes) and per ubatch of 512 tokens."""
    return [
        _boundary(f, rec, a, b, 4 * f.hidden, UBATCH * 4 * f.hidden) for a, b in zip(devices, devices[1:], strict=False)
    ]


def _boundary(f: Findings, rec: Recommendation, a: ListedDevice, b: ListedDevice, tok: int, ub: int) -> Boundary:
    p = f.probe
    if a.kind != "CUDA" or b.kind != "CUDA":
        return Boundary(a.name, b.name, HOST_STAGED, None, None, None, "not measured")
    if p is None:
        return Boundary(a.name, b.name, "bridge", None, None, None, "not measured (no probe)")
    ia, ib = a.ordinal, b.ordinal
    da = p.devices.get(ia) if ia is not None else None
    db = p.devices.get(ib) if ib is not None else None
    if ia is None or ib is None or da is None or db is None:
        return Boundary(a.name, b.name, "bridge", None, None, None, "not measured (device not probed)")
    edge = _Edge(a.name, b.name, ia, ib, tok, ub)
    if da.gpu == db.gpu:
        return _interpolated(p, edge, "upstream", "device-local copy (virtual devices of one GPU)")
    bad = (min(da.gpu, db.gpu), max(da.gpu, db.gpu)) in p.bad_pairs()
    if rec.p2p and not bad and (da.gpu, db.gpu) in p.verdicts:
        return _interpolated(p, edge, "p2p", "direct peer copy")
    la, lb = _first_of_gpu(p, da.gpu), _first_of_gpu(p, db.gpu)
    down = [p.link(la, "d2h", s) for s in (SMALL, LARGE)]
    up = [p.link(lb, "h2d", s) for s in (SMALL, LARGE)]
    measured = edge.copy(p, "bridge", SMALL)
    if not all(t is not None and t.gbps > 0 for t in down + up):
        return Boundary(a.name, b.name, "bridge", None, None, measured.us if measured else None, "links not measured")
    Bd, Ld = cost.link_constants((SMALL, down[0].us), (LARGE, down[1].gbps))  # type: ignore[union-attr]
    Bu, Lu = cost.link_constants((SMALL, up[0].us), (LARGE, up[1].gbps))  # type: ignore[union-attr]
    B, L = min(Bd, Bu), max(Ld, Lu)
    return Boundary(
        a.name,
        b.name,
        "bridge",
        cost.t_bridge(tok, B, L) * 1e6,
        cost.t_bridge(ub, B, L) * 1e3,
        measured.us if measured else None,
        f"paper model, links measured here: {B / 1e9:.1f} GB/s one way, {L * 1e6:.1f} us per copy",
    )


def _first_of_gpu(p: ProbeResult, gpu: int) -> int:
    return min(d.dev for d in p.devices.values() if d.gpu == gpu)


@dataclass(frozen=True)
class _Edge:
    """One boundary being costed: the devices either side (names, probe ordinals) and the bytes that cross it per
    token (``tok``) and per ubatch (``ub``)."""

    a: str
    b: str
    ia: int
    ib: int
    tok: int
    ub: int

    def copy(self, p: ProbeResult, path: str, size: int) -> Timing | None:
        """The probe's copy of ``size`` bytes on ``path`` from a to b, else from b to a."""
        return p.copy(self.ia, self.ib, path, size) or p.copy(self.ib, self.ia, path, size)


def _interpolated(p: ProbeResult, e: _Edge, path: str, words: str) -> Boundary:
    small, large = e.copy(p, path, SMALL), e.copy(p, path, LARGE)
    if small is None or large is None or large.gbps <= 0 or small.us <= 0:
        return Boundary(e.a, e.b, words, None, None, small.us if small else None, "not measured")
    B, L = cost.link_constants((SMALL, small.us), (LARGE, large.gbps))
    return Boundary(
        e.a,
        e.b,
        words,
        (L + e.tok / B) * 1e6,
        (L + e.ub / B) * 1e3,
        small.us,
        "measured copies (64 KiB, 16 MiB) interpolated",
    )


def _command(f: Findings, rec: Recommendation, devices: list[ListedDevice], default_server: str | None) -> None:
    """The serve command line: the environment it needs (the one the doctor saw, plus peer access and the bridge's
    pairs not to trust), the selectors, the model, the devices, the split."""
    for var in ("CUDA_VISIBLE_DEVICES", modes.CUDA_DEVICES, modes.VK_DEVICES):
        if var in f.env:
            rec.env[var] = f.env[var]
    if rec.p2p:
        rec.env[modes.CUDA_P2P] = "1"
    argv = ["ggml-bridge", "serve"]
    listing = f.serving
    if listing is not None and str(listing.build.server) != default_server:
        argv += ["--server", str(listing.build.server)]
    if rec.bridge is not None and rec.bridge in modes.BRIDGE_VALUES:
        argv += ["--bridge", rec.bridge]
    elif rec.bridge is not None:  # a value with pairs not to trust: serve's --bridge takes the plain words only
        rec.env[modes.BRIDGE] = rec.bridge
    if rec.batched:
        argv += ["--batched", "on"]
    ok_rpc = [r.endpoint for r in f.rpc if r.ok]
    if ok_rpc:
        argv += ["--rpc", ",".join(ok_rpc)]
    argv += ["--", "-m", str(f.model.path) if f.model else "MODEL.gguf"]
    if devices:
        argv += ["-dev", ",".join(rec.devices)]
    if len(devices) >= 2:
        argv += ["-sm", "layer"]
    if rec.ts:
        argv += ["-ts", ",".join(str(s) for s in rec.ts)]
    rec.argv = argv
