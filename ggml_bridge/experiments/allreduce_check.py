"""The paper model's all-reduce against ``test-bridge-allreduce --bench`` (patch 0008): per device count and size,
the measured time of one all-reduce beside the model's prediction (``doctor/cost.py``) and their ratio."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..foundations.errors import UsageError
from .doctor import cost

#: ``bench: devices=N ne=E bytes=B path=P us_median=X us_min=Y us_max=Z [host_us_median=H] rounds=R`` (H: the
#: host's share of a call, the time to enqueue it; outputs before it have no such field)
LINE = re.compile(
    r"^bench: devices=(?P<n>\d+) ne=(?P<ne>\d+) bytes=(?P<bytes>\d+) path=(?P<path>[\w-]+) "
    r"us_median=(?P<us>[\d.]+) us_min=[\d.]+ us_max=[\d.]+ (?:host_us_median=(?P<host>[\d.]+) )?"
    r"rounds=(?P<rounds>\d+)$"
)

#: the variant each ``path=`` names: the bridge's default (every device reads every part in-kernel), its
#: reduce-scatter (two meetings; not modelled) and upstream's internal all-reduce (not modelled here)
GATHER, SCATTER = "gather", "scatter"


@dataclass(frozen=True)
class Timing:
    devices: int
    nbytes: int
    variant: str
    us: float
    rounds: int
    host_us: float | None = None
    """The host's share of a call (the time to enqueue it): near ``us``, the host's launches bound the call."""
    host_sums: bool = False
    """A copy-engine row of three or more devices whose sums the host made (patch 0007 from 2026-12-07 on); else the
    devices made them (two devices, and the reduce-scatter of the series before)."""


@dataclass(frozen=True)
class Output:
    timings: tuple[Timing, ...]
    cut: int = 0
    """``bench:`` lines that do not parse."""


def read(path: Path) -> Output:
    """The bridge's rows of a ``--bench`` output. The first version of the test program named its reduce-scatter
    ``bridge`` and the gather ``bridge-gather`` (the default then and now differ): where both names stand for one size,
    ``bridge`` is the reduce-scatter. From 2026-12-07 on the host sums the copy engines' calls of three or more
    devices and the test program prints the devices' sums beside them as ``bridge-devsum``: where that name stands
    for a device count, a copy-engine ``bridge`` row of that count is the host's sums (``bridge-host1``, one host
    thread, is left out). From the series of 2026-12-07 evening on the devices sum by default again and the host's
    sums are ``bridge-host``. A ``bench:`` line that does not parse (a log line written into it: test programs before
    2026-12-07 evening buffered stdout) is counted in ``cut``, never guessed at."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError.of_os(e, f"cannot read {path}", fix="pass test-bridge-allreduce's output") from None
    lines = [x for x in text.splitlines() if x.startswith("bench: ")]
    rows = [m for m in map(LINE.match, lines) if m]
    both = {(m["n"], m["ne"]) for m in rows if m["path"] == "bridge-gather"}
    # by device count: a size's devsum row may be the one a log line cut
    devsum = {m["n"] for m in rows if m["path"] == "bridge-devsum"}
    out = []
    for m in rows:
        name, host_sums = m["path"], False
        if name == "bridge":
            variant = SCATTER if (m["n"], m["ne"]) in both else GATHER
            host_sums = m["n"] in devsum and int(m["bytes"]) > cost.BAR_KERNEL_MAX
        elif name in ("bridge-gather", "bridge-scatter", "bridge-devsum"):
            variant = SCATTER if name == "bridge-scatter" else GATHER
        elif name == "bridge-host":
            variant, host_sums = GATHER, True
        else:
            continue
        host = float(m["host"]) if m["host"] is not None else None
        out.append(Timing(int(m["n"]), int(m["bytes"]), variant, float(m["us"]), int(m["rounds"]), host, host_sums))
    if not out:
        raise UsageError(
            f"{path} has no 'bench: ... path=bridge' lines",
            why="it is not the output of test-bridge-allreduce --bench",
            fix="run GGML_CUDA_DEVICES=N test-bridge-allreduce --bench and pass what it printed",
        )
    return Output(tuple(out), len(lines) - len(rows))


def table(output: Output, link: tuple[float, float], *, one_link: bool) -> str:
    """Markdown: measured against predicted, the in-kernel gather and the copy engines (the reduce-scatter's rows are
    left out: the model has no term for its second meeting), with the host's share of a call where the output has it."""
    B, L = link
    lines = [
        "| devices | bytes | path | measured µs | host µs | predicted µs | measured / predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for t in sorted(output.timings, key=lambda t: (t.devices, t.nbytes, not t.host_sums)):
        if t.variant != GATHER:
            continue
        model = cost.t_bridge_allreduce_one_link if one_link else cost.t_bridge_allreduce
        predicted = model(t.nbytes, t.devices, B, L, host_sums=t.host_sums)
        ratio = t.us * 1e-6 / predicted
        ratios.append(ratio)
        path = "in-kernel" if t.nbytes <= cost.BAR_KERNEL_MAX else "copy engines"
        path += ", host sums" if t.host_sums else ""
        host = f"{t.host_us:.2f}" if t.host_us is not None else "-"
        lines.append(
            f"| {t.devices} | {t.nbytes} | {path} | {t.us:.2f} | {host} | {predicted * 1e6:.2f} | {ratio:.2f} |"
        )
    if not ratios:
        raise UsageError(
            "no row of the bridge's default all-reduce to compare",
            why="the output holds only the reduce-scatter's rows, which the model does not describe",
            fix="pass the output of test-bridge-allreduce --bench with its path=bridge rows",
        )
    inside = sum(1 for r in ratios if 1 / 1.5 <= r <= 1.5)
    lines.append("")
    lines.append(
        f"{inside} of {len(ratios)} within 1.5x of the prediction (median ratio {statistics.median(ratios):.2f}); "
        f"link B = {B / 1e9:.1f} GB/s, L = {L * 1e6:.1f} µs, "
        + ("every device on one link (virtual devices of one GPU)" if one_link else "a link per device")
        + (f"; {output.cut} 'bench:' line(s) cut by other output, left out" if output.cut else "")
    )
    return "\n".join(lines)
