"""What the bench records about the GPUs: the inventory (nvidia-smi -L, driver, links, topology) and
``--smi``'s sampling of clocks, power, temperature and throttle reasons while the cases run."""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from ...foundations import runner
from ...foundations.errors import BenchError
from ...runtime import logparse


def n_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = runner.run([smi, "-L"], check=False, failure=runner.Failure(BenchError))
    return len([x for x in out.stdout.splitlines() if x.startswith("GPU ")]) if out.returncode == 0 else 0


def gpu_env() -> dict[str, Any]:
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

    def during(self, t0: float, t1: float) -> dict[str, dict[str, Any]]:
        """Per GPU over [t0, t1], the samples where it computed (utilisation >= 50 %; all when none did): the
        median SM and memory clocks and utilisation, the peak power and temperature, the throttle reasons."""
        out: dict[str, dict[str, Any]] = {}
        by_gpu: dict[str, list[dict[str, str]]] = {}
        for t, r in self.rows:
            if t0 <= t <= t1:
                by_gpu.setdefault(r.get("index", "?"), []).append(r)
        for gpu, rows in sorted(by_gpu.items()):
            busy = [r for r in rows if _num(r.get("utilization.gpu")) >= 50] or rows
            rec: dict[str, Any] = {"n": len(busy)}
            for key, field_name, agg in (
                ("sm_mhz", "clocks.sm", statistics.median),
                ("mem_mhz", "clocks.mem", statistics.median),
                ("util_pct", "utilization.gpu", statistics.median),
                ("power_w_peak", "power.draw", max),
                ("temp_c_peak", "temperature.gpu", max),
            ):
                xs = [_num(r.get(field_name)) for r in busy]
                xs = [x for x in xs if x == x]  # NaN: "[N/A]"
                if xs:
                    rec[key] = agg(xs)
            reasons = [r["clocks_event_reasons.active"] for r in busy if "clocks_event_reasons.active" in r]
            if reasons:
                rec["reasons"] = {k: reasons.count(k) for k in sorted(set(reasons))}
            out[gpu] = rec
        return out


def _num(text: str | None) -> float:
    try:
        return float(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")
