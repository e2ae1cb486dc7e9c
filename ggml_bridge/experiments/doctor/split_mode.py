"""The split-mode advice: what a token's all-reduces under ``-sm tensor`` cost over the links measured here, against
the boundaries of ``-sm layer`` (the paper model, :mod:`ggml_bridge.experiments.doctor.cost`), and whether the model's
architecture can be split by tensor at all (:mod:`ggml_bridge.experiments.tensor_split`).

Tensor split divides each token's compute by the number of cards; layer split does not (its cards wait for each
other one at a time), but crosses far fewer bytes: one hidden vector per pair of consecutive cards against two
all-reduces per layer. So tensor split gains a token only where its compute on one card exceeds the extra link time
divided by (1 - 1/N): the *break-even* the advice states. The doctor cannot time a token's compute without running
the model, so it keeps layer split in the command and says where tensor split could win.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import tensor_split
from . import cost
from .facts import Findings
from .probe import LARGE, SMALL, ProbeResult

#: the paths a -sm tensor all-reduce can take without peer access, by what the advice calls them
PATHS = {
    "bridge-allreduce": "the bridge's all-reduce (patch 0007)",
    "bridge": "the butterfly through the bridge",
    "seq": "the butterfly through upstream's host path (no peer access)",
    "internal": "upstream's internal all-reduce (2 cards, F32 rounded through BF16)",
}


@dataclass(frozen=True)
class SplitModeAdvice:
    mode: str
    """The split mode the command keeps (``layer``)."""
    supported: bool | None
    """The model's architecture can be split by tensor (None: no model given)."""
    layer_us: float | None
    """A token's boundaries under -sm layer (µs; None: the links were not measured)."""
    tensor_us: dict[str, float]
    """A token's all-reduces under -sm tensor, per path of :data:`PATHS` (µs)."""
    break_even_us: float | None
    """A token's compute on one card above which -sm tensor would be faster (µs)."""
    notes: tuple[str, ...]


def link(p: ProbeResult | None, gpus: list[int]) -> tuple[float, float] | None:
    """(B bytes/s, L s) of the slowest host link of ``gpus`` (each one's download and upload), None unmeasured."""
    if p is None or not gpus:
        return None
    bs, ls = [], []
    for gpu in gpus:
        dev = min((i for i, d in p.devices.items() if d.gpu == gpu), default=None)
        if dev is None:
            return None
        for direction in ("d2h", "h2d"):
            small, large = p.link(dev, direction, SMALL), p.link(dev, direction, LARGE)
            if small is None or large is None or small.us is None or large.gbps is None:
                return None
            B, L = cost.link_constants((SMALL, small.us), (LARGE, large.gbps))
            bs.append(B)
            ls.append(L)
    return min(bs), max(ls)


def advise(f: Findings, devices: list[str], bridge: str | None, p2p: bool = False) -> SplitModeAdvice:
    """The advice for the CUDA ``devices`` of the split (``CUDA0``...), with the bridge and peer access as
    recommended."""
    n = len(devices)
    arch = f.model.architecture if f.model is not None else None
    supported = None if arch is None else arch not in tensor_split.UNSUPPORTED_ARCHITECTURES
    notes: list[str] = []
    if supported is False:
        notes.append(f"-sm tensor: b11434 does not implement it for architecture {arch}: layer split")
    p = f.probe
    gpus = sorted({p.devices[int(d[4:])].gpu for d in devices if p and int(d[4:]) in p.devices}) if p else []
    if p is not None and len(gpus) == 1 and n > 1:
        notes.append(
            f"-sm tensor on {n} virtual devices of one GPU: its all-reduces are device-local copies; measured on one "
            "H100 (2026-12, issue 48) it ran slower than layer split (pp512 0.5x, tg128 0.6x): layer split"
        )
        return SplitModeAdvice("layer", supported, None, {}, None, tuple(notes))
    measured = link(p, gpus) if len(gpus) == n else None
    if measured is None:
        notes.append("-sm tensor against -sm layer: the links were not measured (run the probe): layer split")
        return SplitModeAdvice("layer", supported, None, {}, None, tuple(notes))
    B, L = measured
    layers = f.model.layers if f.model is not None and f.model.layers else 1
    per = "per token" if f.model is not None and f.model.layers else "per token and layer"
    main = "bridge" if bridge else "seq"
    layer_us = cost.per_token_layer(f.hidden, n, B, L, main) * 1e6
    paths = ("bridge-allreduce", "bridge", "seq") + (("internal",) if n == 2 else ())
    tensor_us = {k: cost.per_token_tensor(f.hidden, layers, n, B, L, k) * 1e6 for k in paths}
    best = min(tensor_us, key=lambda k: tensor_us[k])
    extra = tensor_us[best] - layer_us
    break_even = max(extra, 0.0) / (1 - 1 / n)
    notes.append(
        f"-sm tensor over {n} cards, {per} (hidden {f.hidden}, links {B / 1e9:.1f} GB/s, {L * 1e6:.1f} us): "
        + "; ".join(f"{PATHS[k]} {tensor_us[k]:.0f} us" for k in paths)
        + f", against layer split's boundaries {layer_us:.0f} us; tensor split gains only where a token's compute "
        f"on one card exceeds {break_even:.0f} us ({PATHS[best]}): layer split kept"
    )
    if p2p:
        notes.append("with peer access enabled the butterfly's copies are direct peer copies (not modelled here)")
    return SplitModeAdvice("layer", supported, layer_us, tensor_us, break_even, tuple(notes))
