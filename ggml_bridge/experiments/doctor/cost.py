"""The paper model of a host round trip per cross-card boundary (docs/paper-model.md), the one definition of its
formulas and constants: ``scripts/paper_model.py`` prints the document's tables from them, the doctor puts the
links it measured into them.

    b            = U * h * 4                          bytes of one boundary (f32 activations, U tokens, hidden h)
    t_seq(b)     = 2*S + 2*(L + b / min(B, Bp))        NO_PEER_COPY: sync, D2H into malloc, H2D out of it
    t_bridge(b)  = 2*L + E + b/B + min(b, C)/B          D2H of chunk i+1 overlaps H2D of chunk i

B is the link's one-way bandwidth and L its per-copy latency; for a pair of GPUs the doctor takes the slower of the
source's download and the destination's upload.

-sm tensor reduces each layer's partial sums twice (after the attention output and after the FFN down projection;
src/llama-model.cpp splits those weights by rows, the meta backend adds the parts), an f32 tensor of U x h:

    steps(N)        = log2(P) + (2 if N > P else 0)     P: the largest power of two <= N (ggml-backend-meta.cpp's
                                                          butterfly: the extra cards fold in first and get the sum back)
    t_ar(b, N)      = steps(N) * (t(b) + (N-1)*H)       each step a host round trip per card, the pairs in parallel
                                                          (t = t_seq without peer access, t_bridge through the bridge)
    t_internal(b)   = 2*L + H + 2*(b/2)/B               upstream's internal path (2 cards): D2H then H2D of BF16
    t_bar(b, N)     = L + E + (N-1)*H + b/B + (N-1)*b/B the bridge's all-reduce (patch 0007), tensors up to 512 KiB:
                                                          one kernel per card stages its tensor and reads the others'
                    = 2*L + E + (N-1)*H + 2*b/B         above, two cards: copy engines, one tensor down, one up
                    = 2*L + E + (N-1)*H + b/B + k*b/B   above, from three (the default): the devices' reduce-scatter
                                                          and gather, k = 2(N-1)/N up per card
                    = 2*L + E + (N-1)*H + c/B           the host's sums (GGML_CUDA_BRIDGE_ALLREDUCE_SUMS=host) in
                      + max(b/B, N*b/Hs)                chunks of c (about b/4, 512 KiB to 2 MiB): every tensor down
                                                          once, the sum up once, a chunk's uploads beside the next
                                                          chunks' downloads, unless the host's additions (N tensors
                                                          read at Hs) are slower than the link
    t_bar1(b, N)    = t_bar's latency + total/B         the same N devices on ONE link (virtual devices of one GPU):
                                                          total = N*b + N*(N-1)*b (kernel), 4*b (two devices),
                                                          N*b + 2*(N-1)*b (reduce-scatter, one direction after the
                                                          other: its phases run on one stream per device); the host's
                                                          sums N*c + max(N*b, N*b*B/Hs) (N tensors down and N sums up
                                                          at once): every byte on it
    H                                                   one host thread enqueues the N cards' parts of an
                                                          all-reduce (or of a butterfly step): the last card's part
                                                          starts (N-1)*H after the first's
    per token       2 * n_layer * t_ar(h*4, N)          against layer split's (N-1) * t(h*4)

The bytes alone (:func:`allreduce_traffic`, in tensors, the larger direction): the butterfly moves log2(P) + [N > P]
per card (on one shared link log2(P) * P + 2 (N - P)); the bridge's copy path by default (the devices'
reduce-scatter) 2(N-1)/N up per card (one link 2(N-1)), with the host's sums one tensor each way per card (one link
N); their ratio is the most the bridge's all-reduce can gain from bytes over the butterfly through any copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 1 << 20
CHUNK = 2 * MiB
S_SYNC = 10e-6  # one host synchronization + API round trip (upstream fallback), per side
BP_PAGEABLE = (
    9.7e9  # per-direction pageable staging bandwidth on the H200 host (sync-malloc, 16 MiB: 3.47 ms round trip)
)
E_EVENT = 3e-6  # cross-device event wait
# the host's enqueue of one card's part of the bridge's all-reduce (its kernel or copies, its events): the host's
# share of a call over the device count, test-bridge-allreduce --bench's host_us_median / N on the H100 of 2026-12-06
# (driver 580, in-kernel path): 2.9-3.3 us for 2-6 devices
H_LAUNCH = 3.2e-6
# the host's sums (patch 0007, GGML_CUDA_BRIDGE_ALLREDUCE_SUMS=host): the bytes of the N staged tensors its crew of
# 8 threads reads and adds per second, host functions on one stream (test-bridge-allreduce --bench on the H100 host
# of 2026-12-07 evening, 3-6 devices, 4 and 10 MiB: 11-18 GB/s)
H_SUM = 15e9
BAR_KERNEL_MAX = 512 * 1024  # patch 0007: the largest per-device tensor of its in-kernel path
BAR_HOST_CHUNK = 2 * MiB  # patch 0007, three or more devices: the largest chunk per device of the host's sums


def bar_host_chunk(b: float) -> float:
    """Patch 0007's chunk per device where the host sums a tensor of ``b`` bytes: about a quarter of it in 64 KiB
    steps, at least 512 KiB, at most BAR_HOST_CHUNK, never more than the tensor."""
    granule = 64 * 1024
    quarter = math.ceil(b / 4 / granule) * granule
    return min(b, min(max(512 * 1024, quarter), BAR_HOST_CHUNK))


def t_seq(b: float, B: float, L: float) -> float:
    return 2 * S_SYNC + 2 * (L + b / min(B, BP_PAGEABLE))


def t_bridge(b: float, B: float, L: float) -> float:
    return 2 * L + E_EVENT + b / B + min(b, CHUNK) / B


def link_constants(small: tuple[int, float], large: tuple[int, float]) -> tuple[float, float]:
    """(B bytes/s, L s) of a one-way link from two timed copies: ``large`` = (bytes, GB/s of back-to-back copies),
    ``small`` = (bytes, us for one copy and its synchronization). L is what the small copy costs beyond its bytes
    (at least 1 us). A figure that is not finite and above 0 is a ValueError: no measurement gives it."""
    if not all(math.isfinite(x) and x > 0 for x in (small[1], large[1])):
        raise ValueError(f"implausible link figures: {small[1]} us, {large[1]} GB/s")
    B = large[1] * 1e9
    L = max(small[1] * 1e-6 - small[0] / B, 1e-6)
    return B, L


def allreduce_steps(n: int) -> int:
    """The exchange steps of the meta backend's butterfly over ``n`` cards (0 for one card)."""
    if n < 2:
        return 0
    p = 1 << (n.bit_length() - 1)
    return p.bit_length() - 1 + (2 if n > p else 0)


def _bar_latency(b: float, n: int, L: float) -> float:
    """The bridge's all-reduce of ``b`` bytes over ``n`` devices beyond its bytes, on any links: one copy's latency
    in-kernel (two by copy engines above BAR_KERNEL_MAX), the event, and the host's launches of the other devices."""
    return (L if b <= BAR_KERNEL_MAX else 2 * L) + E_EVENT + (n - 1) * H_LAUNCH


def t_allreduce(b: float, n: int, B: float, L: float, path: str) -> float:
    """One all-reduce of ``b`` bytes over ``n`` cards: ``path`` ``seq`` (the butterfly's host round trips without peer
    access), ``bridge`` (the butterfly's copies through the bridge), ``bridge-allreduce`` (patch 0007's all-reduce by
    default: from three cards the devices' reduce-scatter above its in-kernel limit; ``bridge-allreduce-host``: the
    host's sums there) or ``internal`` (upstream's host-staged pipeline, 2 cards, F32 rounded through BF16)."""
    if path == "internal":
        return 2 * L + (n - 1) * H_LAUNCH + 2 * (b / 2) / B
    if path in ("bridge-allreduce", "bridge-allreduce-host"):
        if b <= BAR_KERNEL_MAX:
            return _bar_latency(b, n, L) + b / B + (n - 1) * b / B
        if n == 2:
            return _bar_latency(b, n, L) + 2 * b / B
        if path == "bridge-allreduce-host":
            return _bar_latency(b, n, L) + bar_host_chunk(b) / B + max(b / B, n * b / H_SUM)
        return _bar_latency(b, n, L) + b / B + 2 * (n - 1) / n * b / B
    step = t_bridge if path == "bridge" else t_seq
    return allreduce_steps(n) * (step(b, B, L) + (n - 1) * H_LAUNCH)


@dataclass(frozen=True)
class Traffic:
    """What one all-reduce moves over the links, in units of the tensor's bytes: down (device to host) and up (host to
    device) on the busiest card's own link, and in all over one link that every card shares (virtual devices of one
    GPU). A link's two directions run at once, so the larger of the two bounds the time."""

    card_down: float
    card_up: float
    shared_down: float
    shared_up: float

    def card(self) -> float:
        return max(self.card_down, self.card_up)

    def shared(self) -> float:
        return max(self.shared_down, self.shared_up)


def allreduce_traffic(n: int, path: str) -> Traffic:
    """The bytes of one all-reduce over ``n`` cards: ``butterfly`` (the meta backend's, each exchange a copy through
    the host, the bridge's or upstream's: the cards past the largest power of two P fold into the first ones and get
    the result back, log2(P) exchange steps between the P), ``bridge-scatter`` (patch 0007 above its in-kernel limit,
    its default: an exchange for two cards, from three a reduce-scatter and gather on the devices, one tensor and one
    part down, 2(N-1)/N up per card), ``bridge-host`` (the same with the host's sums from three: one tensor down and
    the sum up per card) or ``bridge-kernel`` (0007's token path: one tensor down, the N - 1 others read)."""
    if n < 2:
        return Traffic(0.0, 0.0, 0.0, 0.0)
    if path == "butterfly":
        p = 1 << (n.bit_length() - 1)
        steps, extra = p.bit_length() - 1, n - p
        card = steps + (1 if extra else 0)
        shared = steps * p + 2 * extra
        return Traffic(card, card, shared, shared)
    if path == "bridge-kernel":
        return Traffic(1.0, n - 1.0, float(n), n * (n - 1.0))
    if path in ("bridge-host", "bridge-scatter") and n == 2:
        return Traffic(1.0, 1.0, 2.0, 2.0)
    if path == "bridge-host":
        return Traffic(1.0, 1.0, float(n), float(n))
    if path == "bridge-scatter":
        return Traffic(1 + 1 / n, 2 * (n - 1) / n, n + 1.0, 2 * (n - 1.0))
    raise ValueError(f"unknown all-reduce path {path!r}")


def t_bridge_allreduce(b: float, n: int, B: float, L: float, *, host_sums: bool = False) -> float:
    """The bridge's all-reduce of ``b`` bytes over ``n`` cards, a link of ``B`` each: its default path, or from three
    cards the host's sums (``host_sums``, ``GGML_CUDA_BRIDGE_ALLREDUCE_SUMS=host``)."""
    return t_allreduce(b, n, B, L, "bridge-allreduce-host" if host_sums else "bridge-allreduce")


def t_bridge_allreduce_one_link(b: float, n: int, B: float, L: float, *, host_sums: bool = False) -> float:
    """The bridge's all-reduce of ``b`` bytes over ``n`` devices that share one link (virtual devices of one GPU):
    its latency as on separate links, and every device's bytes through the one link at ``B``: from three devices
    the devices' reduce-scatter (the default; one direction after the other, as its phases run on one stream per
    device) or the host's sums (``host_sums``; the two directions at once, unless the host's additions are slower).
    Every card's bytes cross the one link, so each card's share of it is B / n: the model of a link per card at
    that bandwidth."""
    return t_bridge_allreduce(b, n, B / n, L, host_sums=host_sums)


def per_token_tensor(hidden: int, layers: int, n: int, B: float, L: float, path: str) -> float:
    """A token's all-reduces under -sm tensor: two per layer of ``hidden`` f32 values."""
    return 2 * layers * t_allreduce(4 * hidden, n, B, L, path)


def per_token_layer(hidden: int, n: int, B: float, L: float, path: str) -> float:
    """A token's boundaries under -sm layer: one per pair of consecutive cards."""
    step = t_bridge if path == "bridge" else t_seq
    return (n - 1) * step(4 * hidden, B, L)
