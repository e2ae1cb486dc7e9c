"""The paper model of a host round trip per cross-card boundary (docs/paper-model.md), the one definition of its
formulas and constants: ``scripts/paper_model.py`` prints the document's tables from them, the doctor puts the
links it measured into them.

    b            = U * h * 4                          bytes of one boundary (f32 activations, U tokens, hidden h)
    t_seq(b)     = 2*S + 2*(L + b / min(B, Bp))        NO_PEER_COPY: sync, D2H into malloc, H2D out of it
    t_bridge(b)  = 2*L + E + b/B + min(b, C)/B          D2H of chunk i+1 overlaps H2D of chunk i

B is the link's one-way bandwidth and L its per-copy latency; for a pair of GPUs the doctor takes the slower of the
source's download and the destination's upload.
"""

from __future__ import annotations

import math

MiB = 1 << 20
CHUNK = 2 * MiB
S_SYNC = 10e-6  # one host synchronization + API round trip (upstream fallback), per side
BP_PAGEABLE = (
    9.7e9  # per-direction pageable staging bandwidth on the H200 host (sync-malloc, 16 MiB: 3.47 ms round trip)
)
E_EVENT = 3e-6  # cross-device event wait


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
