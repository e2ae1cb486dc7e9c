"""What the bench records about the GPUs: the inventory (nvidia-smi -L, driver, links, topology) and
``--smi``'s sampling of clocks, power, temperature and throttle reasons while the cases run."""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Mapping, TypedDict

from ...foundations import runner
from ...foundations.errors import BenchError
from ...runtime import logparse


def n_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = runner.run([smi, "-L"], check=False, failure=runner.Failure(BenchError))
    return len([x for x in out.stdout.splitlines() if x.startswith("GPU ")]) if out.returncode == 0 else 0


class GpuEnv(TypedDict, total=False):
    """The report's ``environment``: every GPU's row of nvidia-smi (by its query's field names) and the topology
    (empty without nvidia-smi)."""

    gpus: list[dict[str, str]]
    topology: str


def gpu_env() -> GpuEnv:
    """GPU, driver and link from nvidia-smi (empty when there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    q = "index,name,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    out = runner.run(
        [smi, f"--query-gpu={q}", "--format=csv,noheader"], check=False, failure=runner.Failure(BenchError)
    )
    if out.returncode != 0:
        return {}
    keys = q.split(",")
    gpus = [
        dict(zip(keys, [v.strip() for v in line.split(",")], strict=False)) for line in out.stdout.strip().splitlines()
    ]
    topo = runner.run([smi, "topo", "-m"], check=False, failure=runner.Failure(BenchError)).stdout
    return {"gpus": gpus, "topology": logparse.ANSI.sub("", topo)}


@dataclass(frozen=True)
class GpuState:
    """One GPU while one process ran (:meth:`Telemetry.during`): the samples taken into account, the median SM and
    memory clocks and utilisation, the peak power and temperature (None: no number in any sample), and how often
    each throttle reason was active (None: the driver does not say)."""

    n: int
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    util_pct: float | None = None
    power_w_peak: float | None = None
    temp_c_peak: float | None = None
    reasons: dict[str, int] | None = None

    def to_json(self) -> dict[str, object]:
        """The report's record: the figures there are."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> GpuState:
        """The state :meth:`to_json` wrote; ValueError where a figure is not a number (a damaged report)."""
        n, reasons = data.get("n"), data.get("reasons")
        if not isinstance(n, int) or not (reasons is None or isinstance(reasons, dict)):
            raise ValueError("a GPU state without its number of samples or with reasons that are not a table")
        return cls(
            n,
            sm_mhz=_figure(data, "sm_mhz"),
            mem_mhz=_figure(data, "mem_mhz"),
            util_pct=_figure(data, "util_pct"),
            power_w_peak=_figure(data, "power_w_peak"),
            temp_c_peak=_figure(data, "temp_c_peak"),
            reasons={str(k): int(v) for k, v in reasons.items()} if reasons is not None else None,
        )


def _figure(data: Mapping[str, object], key: str) -> float | None:
    """``data[key]``: a number (as it was written) or None."""
    v = data.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ValueError(f"a GPU state whose {key} is not a number")
    return v


#: what --smi samples (nvidia-smi --query-gpu); the throttle reasons are left out where the driver lacks them
SMI_FIELDS = (
    "index",
    "clocks.sm",
    "clocks.mem",
    "power.draw",
    "temperature.gpu",
    "utilization.gpu",
    "clocks_event_reasons.active",
)


class Telemetry:
    """``--smi``: nvidia-smi sampled every ``interval_ms`` while the cases run, every line stamped with our
    clock when it arrives (written to ``csv``), so each llama-bench process can be matched with the GPUs'
    clocks, power, temperatures and throttle reasons while it ran (:meth:`during`)."""

    def __init__(self, csv: Path, interval_ms: int) -> None:
        self.csv = csv
        self.interval_ms = interval_ms
        self.rows: list[tuple[float, dict[str, str]]] = []
        self.fields: list[str] = []
        self.proc: runner.Process | None = None

    def start(self) -> "Telemetry":
        smi = shutil.which("nvidia-smi")
        if not smi:
            raise BenchError(
                "--smi needs nvidia-smi and there is none on PATH", fix="run on the GPU machine, or leave out --smi"
            )
        fields = list(SMI_FIELDS)
        probe = runner.run(
            [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-c", "1"],
            check=False,
            failure=runner.Failure(BenchError),
        )
        if probe.returncode != 0:
            fields.remove("clocks_event_reasons.active")
        self.fields = fields
        self.csv.write_text("time," + ",".join(fields) + "\n")
        self.proc = runner.start(
            [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-lms", str(self.interval_ms)],
            pump=runner.Pump(on_line=self._line, keep=False),
            failure=runner.Failure(BenchError),
        )
        deadline = time.monotonic() + 10  # the first process is sampled from its start
        while not self.rows and time.monotonic() < deadline and self.proc.popen.poll() is None:
            time.sleep(0.01)
        if not self.rows:
            self.stop()
            raise BenchError(
                "--smi: nvidia-smi printed no sample", fix=f"see `{smi} --query-gpu=...` by hand, or leave out --smi"
            )
        return self

    def _line(self, line: str) -> None:
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(self.fields):
            return
        now = time.time()
        self.rows.append((now, dict(zip(self.fields, values, strict=False))))
        with open(self.csv, "a", encoding="utf-8") as f:
            f.write(f"{now:.3f}," + ",".join(values) + "\n")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=5)
            self.proc = None

    def during(self, t0: float, t1: float) -> dict[str, GpuState]:
        """Per GPU over [t0, t1], the samples where it computed (utilisation >= 50 %; all when none did): the
        median SM and memory clocks and utilisation, the peak power and temperature, the throttle reasons."""
        out: dict[str, GpuState] = {}
        by_gpu: dict[str, list[dict[str, str]]] = {}
        for t, r in self.rows:
            if t0 <= t <= t1:
                by_gpu.setdefault(r.get("index", "?"), []).append(r)
        for gpu, rows in sorted(by_gpu.items()):
            busy = [r for r in rows if _num(r.get("utilization.gpu")) >= 50] or rows
            active = [r["clocks_event_reasons.active"] for r in busy if "clocks_event_reasons.active" in r]
            out[gpu] = GpuState(
                len(busy),
                sm_mhz=_aggregate(busy, "clocks.sm", statistics.median),
                mem_mhz=_aggregate(busy, "clocks.mem", statistics.median),
                util_pct=_aggregate(busy, "utilization.gpu", statistics.median),
                power_w_peak=_aggregate(busy, "power.draw", max),
                temp_c_peak=_aggregate(busy, "temperature.gpu", max),
                reasons={k: active.count(k) for k in sorted(set(active))} or None,
            )
        return out


def _aggregate(rows: list[dict[str, str]], field_name: str, agg: Callable[[list[float]], float]) -> float | None:
    """``agg`` of the numbers of ``field_name`` in ``rows`` ("[N/A]" left out); None without any."""
    xs = [x for x in (_num(r.get(field_name)) for r in rows) if x == x]  # NaN: "[N/A]"
    return agg(xs) if xs else None


def _num(text: str | None) -> float:
    try:
        return float(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")
