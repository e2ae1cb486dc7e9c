"""The pair bandwidth matrix as a picture: one panel per copy path (the bridge, upstream's copy, the direct peer
copy where it was measured), a cell per ordered pair of devices, GB/s of back-to-back 16 MiB copies, a hatched
cell where the peer copies corrupted data."""

from __future__ import annotations

from pathlib import Path

from .probe import LARGE, ProbeResult

#: the formats --plot writes, chosen by the file name's extension
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
PATHS = (("bridge", "bridge"), ("upstream", "upstream's copy"), ("p2p", "direct peer copy"))


def plot_pairs(p: ProbeResult, out: Path) -> Path | None:
    """Write the PNG; None when there is no pair to draw."""
    devs = sorted(p.devices)
    panels = [(path, title) for path, title in PATHS if any(k[2] == path and k[3] == LARGE for k in p.copies)]
    if len(devs) < 2 or not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    n = len(devs)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 + 1.1 * n * len(panels), 1.6 + 0.9 * n), squeeze=False)
    bad = set(p.bad_pairs())
    top = max((t.gbps for k, t in p.copies.items() if k[3] == LARGE), default=1.0) or 1.0
    for ax, (path, title) in zip(axes[0], panels, strict=True):
        grid = np.full((n, n), np.nan)
        for i, s in enumerate(devs):
            for j, d in enumerate(devs):
                t = p.copy(s, d, path, LARGE)
                if t is not None:
                    grid[i, j] = t.gbps
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=top)
        for i, s in enumerate(devs):
            for j, d in enumerate(devs):
                gs, gd = p.devices[s].gpu, p.devices[d].gpu
                if (min(gs, gd), max(gs, gd)) in bad and path != "bridge" and gs != gd:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xx", color="red"))
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", color="white", fontsize=8)
        names = [p.devices[d].name for d in devs]
        ax.set_xticks(range(n), names, rotation=45, fontsize=8)
        ax.set_yticks(range(n), names, fontsize=8)
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        ax.set_title(f"{title}, GB/s at 16 MiB", fontsize=9)
    if bad:
        fig.text(
            0.01,
            0.01,
            "red hatch: these GPUs' peer copies corrupted data with peer access enabled",
            color="red",
            fontsize=8,
        )
    fig.tight_layout(rect=(0, 0.04, 1, 1) if bad else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=110, format=out.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return out
