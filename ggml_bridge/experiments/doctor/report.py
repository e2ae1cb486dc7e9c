"""The doctor's report: the human one (text, the sections in the order a reader needs them: warnings first) and the
JSON document (every finding and the advice, for machines)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from .facts import Findings
from .nvml import TOPOLOGY, link_gbps
from .probe import LARGE, SMALL, ProbeResult, Timing
from .recommend import Recommendation, quoted

SCHEMA = "ggml-bridge-doctor/1"


def _fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def _fmt_gbps(t: Timing | None) -> str:
    return f"{t.gbps:.1f} GB/s" if t is not None else "- GB/s"


def _gib(mib: int | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.0f}"


def _gen(gen: int | None, width: int | None) -> str:
    return f"Gen{gen or '?'} x{width or '?'}"


def render(f: Findings, rec: Recommendation) -> str:
    out: list[str] = [f"ggml-bridge doctor: {f.host}, {f.when}", ""]
    if rec.warnings:
        out += ["!! WARNINGS", *[f"!! {w}" for w in rec.warnings], ""]
    out += _machine(f)
    out += _gpus(f)
    out += _devices(f)
    out += _measurements(f)
    out += _checks(f)
    out += _rpc(f)
    out += _advice(f, rec)
    return "\n".join(one_line(line) for line in out).rstrip() + "\n"


def one_line(text: str) -> str:
    """``text`` as one line of the report: what it holds from NVML, the probe, the device listing or the environment
    cannot start a line of its own (a newline in CUDA_VISIBLE_DEVICES forging a "!! PEER COPIES ... ARE SAFE"
    line): control characters are written as escapes (``\\n``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _machine(f: Findings) -> list[str]:
    out = ["== Machine", f"CPU: {f.cpu.model}, {f.cpu.cores} cores, {' '.join(f.cpu.features) or 'no AVX'}"]
    out.append(f"CPU backend: {f.cpu.backend}")
    n = f.nvml
    if n.status == "ok":
        out.append(f"NVIDIA driver {n.driver}, CUDA {n.cuda_driver or '?'} (NVML): {len(n.gpus)} GPU(s)")
    else:
        out.append(f"NVIDIA: {n.detail}")
    if f.env:
        out.append("environment: " + " ".join(f"{k}={quoted(v)}" for k, v in f.env.items()))
    for note in f.notes:
        out.append(f"note: {note}")
    return out + [""]


def _gpus(f: Findings) -> list[str]:
    n = f.nvml
    if not n.gpus:
        return []
    out = ["== GPUs (NVML; GPU n: CUDA's ordinal, as in the bridge's log lines; NVML GPU n: NVML's, by PCI bus)"]
    for g in n.gpus:
        best = link_gbps(g.pcie_gen_max, g.pcie_width_max)
        mem = f"{_gib(g.memory_total_mib)} GiB ({_gib(g.memory_free_mib)} GiB free)"
        out.append(
            f"{f.gpu_name(g.index)}: {g.name}, cc {g.cc or '?'}, {mem}, PCIe {_gen(g.pcie_gen, g.pcie_width)} now, "
            f"{_gen(g.pcie_gen_max, g.pcie_width_max)} max"
            + (f" ({best:.1f} GB/s per direction)" if best else "")
            + f", {g.pci}"
        )
    if n.pairs:
        out.append("topology (nvidia-smi topo -m's names; peer: cudaDeviceCanAccessPeer, from the probe):")
        for pair in n.pairs:
            words = f"NV{pair.nvlinks} ({pair.nvlinks} NVLinks)" if pair.nvlinks else None
            topo = words or (f"{pair.topology} ({TOPOLOGY_WORDS.get(pair.topology, '')})" if pair.topology else "?")
            a, b = f.cuda_ordinal(pair.a), f.cuda_ordinal(pair.b)
            peer = _peer(f.probe, a, b) if a is not None and b is not None else ""
            out.append(
                f"  {f.gpu_name(pair.a)} - {f.gpu_name(pair.b)}: {topo}; NVML P2P read: {pair.p2p_read or '?'}{peer}"
            )
    return out + [""]


TOPOLOGY_WORDS = {name: words for name, words in TOPOLOGY.values()}


def _peer(p: ProbeResult | None, a: int, b: int) -> str:
    if p is None or (a, b) not in p.peers:
        return ""
    (ab, ab_on), (ba, ba_on) = p.peers[(a, b)], p.peers.get((b, a), (False, False))
    state = "enabled" if ab_on or ba_on else "not enabled"
    return f"; CUDA peer access: {'yes' if ab else 'no'} / {'yes' if ba else 'no'} ({state} in a plain process)"


def _devices(f: Findings) -> list[str]:
    out = ["== Devices llama.cpp lists (llama-server --list-devices)"]
    if not f.listings:
        return out + ["no build of llama-server found: `ggml-bridge build` (add --backend cuda / vulkan)", ""]
    for listing in f.listings:
        out.append(f"{listing.build.label} ({listing.build.backend}): {listing.build.server}")
        for d in listing.devices:
            out.append(f"  {d.name}: {d.description}, {d.total_mib} MiB ({d.free_mib} MiB free)")
        if not listing.devices and listing.problem is None:
            out.append("  (none besides the CPU)")
        if listing.problem:
            out.append(f"  problem: {listing.problem}")
    if not any(d.kind == "Vulkan" for listing in f.listings for d in listing.devices):
        if any(listing.build.backend.endswith("vulkan") for listing in f.listings):
            out.append(
                "  (ggml uses CPU-type Vulkan devices such as lavapipe only when GGML_VK_VISIBLE_DEVICES names them)"
            )
    return out + [""]


def _measurements(f: Findings) -> list[str]:
    p = f.probe
    out = ["== Measurements"]
    if p is None:
        return out + [f"none: {f.probe_source}", ""]
    took = f"{p.seconds:.1f} s" if p.seconds is not None else "did not finish"
    out.append(f"{f.probe_source} ({took}; CUDA driver {p.driver}, runtime {p.runtime})")
    for what, why in p.skipped:
        out.append(f"skipped: {what}: {why}")
    for line in p.malformed[:5]:
        out.append(f"unreadable probe line: {line}")
    for line in p.implausible[:5]:
        out.append(f"implausible probe line, not used: {line}")
    if len(p.implausible) > 5:
        out.append(f"... and {len(p.implausible) - 5} more implausible probe lines (doctor.json lists them all)")
    for dev in sorted(p.devices.values(), key=lambda d: d.dev):
        d2h, h2d = (p.link(dev.dev, d, LARGE) for d in ("d2h", "h2d"))
        s2h, s2d = (p.link(dev.dev, d, SMALL) for d in ("d2h", "h2d"))
        if d2h is None and dev.dev not in p.gflops:
            continue
        out.append(
            f"GPU {dev.gpu} ({dev.name}): pinned D2H {_fmt_gbps(d2h)}, H2D {_fmt_gbps(h2d)} at 16 MiB; 64 KiB {_fmt_us(s2h.us if s2h else None)} / {_fmt_us(s2d.us if s2d else None)}; "
            f"F32 GEMM {p.gflops.get(dev.dev, 0):.0f} GFLOP/s"
        )
    if p.pairs:
        out.append("pairs: bridge and upstream's copy, 64 KiB (one copy + sync) / 16 MiB (back to back):")
        for (s, d), (kind, enabled) in sorted(p.pairs.items()):
            up = {"virtual": "device-local", "no-peer": "driver-staged", "peer-capable": "driver-staged"}.get(
                kind, kind
            )
            if enabled:
                up = "direct (peer access enabled)"
            row = [f"  CUDA{s} -> CUDA{d} ({kind}):"]
            for path, words in (("bridge", "bridge"), ("upstream", up), ("p2p", "direct peer copy")):
                small, large = p.copy(s, d, path, SMALL), p.copy(s, d, path, LARGE)
                if small or large:
                    row.append(f"{words} {_fmt_us(small.us if small else None)} / {_fmt_gbps(large)};")
            out.append(" ".join(row).rstrip(";"))
    return out + [""]


def _checks(f: Findings) -> list[str]:
    p = f.probe
    if p is None or not p.verdicts:
        return []
    out = ["== Peer-copy correctness (peer access enabled, upstream's copy, async and sync)"]
    for (a, b), v in sorted(p.verdicts.items()):
        if v.verdict == "no-peer-path":
            out.append(f"GPU {a} -> GPU {b}: no peer path (nothing to check)")
            continue
        bad = [c for c in p.checks if (c.src_gpu, c.dst_gpu) == (a, b) and not c.ok]
        sizes = [c.bytes for c in p.checks if (c.src_gpu, c.dst_gpu) == (a, b)]
        if v.verdict == "ok":
            span = f"{min(sizes)} B to {max(sizes) / (1 << 20):.0f} MiB, " if sizes else ""
            out.append(f"GPU {a} -> GPU {b}: ok, {v.cases} copies ({span}aligned and not, 4 patterns)")
        elif v.verdict == "died":
            out.append(f"GPU {a} -> GPU {b}: PROBE DIED during copy {v.cases} (a fault of the peer copy, or a hang)")
        else:
            out.append(f"GPU {a} -> GPU {b}: CORRUPT: {v.failed} of {v.cases} copies differ")
        for c in bad[:3]:
            out.append(
                f"    {c.bytes} bytes, offsets {c.src_off}/{c.dst_off}, pattern {c.pattern}, {c.path}: "
                f"{c.bad_bytes} byte(s) differ, {c.guard_bad} outside the destination; FNV-1a {c.want} != {c.got}"
            )
    return out + [""]


def _rpc(f: Findings) -> list[str]:
    if not f.rpc:
        return []
    out = ["== RPC endpoints"]
    for r in f.rpc:
        if r.ok:
            devs = ", ".join(f"{d.name}: {d.description} ({d.total_mib} MiB)" for d in r.devices) or "no device"
            out.append(f"{r.endpoint}: rpc-server, protocol {r.version}, handshake {r.handshake_ms:.1f} ms; {devs}")
        else:
            out.append(f"{r.endpoint}: {(r.problem or '').removeprefix(f'RPC endpoint {r.endpoint}: ')}")
    return out + [""]


def _advice(f: Findings, rec: Recommendation) -> list[str]:
    out = ["== Recommendation"]
    out.append(
        "bridge: "
        + (f"GGML_CUDA_MAPPED_HOST_BRIDGE={rec.bridge}" if rec.bridge else "leave unset (no cross-GPU boundary)")
    )
    out.append(f"peer access: {'GGML_CUDA_P2P=1' if rec.p2p else 'off (leave GGML_CUDA_P2P unset)'}")
    out.append(f"batched transfers: {'on' if rec.batched else 'off'}")
    if rec.ts:
        out.append(f"split: -ts {','.join(map(str, rec.ts))} over {','.join(rec.devices)} ({rec.ts_basis})")
    if rec.boundaries:
        out.append(
            f"boundaries (hidden size {f.hidden}{'' if f.model else ', assumed'}; per token / per ubatch of 512):"
        )
        for b in rec.boundaries:
            cost_words = (
                f"{_fmt_us(b.per_token_us)} / {_fmt_us(b.per_ubatch_ms * 1e3 if b.per_ubatch_ms is not None else None)}"
            )
            meas = f"; 64 KiB measured {_fmt_us(b.measured_small_us)}" if b.measured_small_us is not None else ""
            out.append(f"  {b.src} -> {b.dst}: {b.path}: {cost_words} ({b.basis}{meas})")
        if rec.per_token_us is not None:
            out.append(f"  all boundaries: {_fmt_us(rec.per_token_us)} per token")
    for note in rec.notes:
        out.append(f"note: {note}")
    out += ["", "command (add --check to start it, prove what engaged and stop):", f"  {rec.command}"]
    return out


def to_json(f: Findings, rec: Recommendation) -> dict[str, Any]:
    """Every finding and the advice, JSON-ready (tuple keys become "a,b" / "a,b,path,bytes" strings)."""

    def plain(x: Any) -> Any:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return {k.name: plain(getattr(x, k.name)) for k in dataclasses.fields(x)}
        if isinstance(x, dict):
            return {(",".join(map(str, k)) if isinstance(k, tuple) else str(k)): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, Path):
            return str(x)
        if isinstance(x, float) and not math.isfinite(x):
            return None  # JSON has no NaN nor Infinity
        return x

    doc = {"schema": SCHEMA, **plain(f)}
    doc["recommendation"] = {**plain(rec), "command": rec.command}
    return doc


def dumps(f: Findings, rec: Recommendation) -> str:
    return json.dumps(to_json(f, rec), indent=2, sort_keys=False, allow_nan=False) + "\n"
