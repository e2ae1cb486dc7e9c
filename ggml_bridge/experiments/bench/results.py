"""The bench report as one value (:class:`Report`): what a run measured, how and on what, its figures pooled, and its
samples and processes. Written to bench.json once (:meth:`Report.to_json`), read back once (:func:`read`, for
``--pool``): everything else in the bench reads its fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from ...foundations import files
from ...foundations.errors import BenchError
from ...foundations.tomlfile import Key
from .running import CopyRate
from .stats import CaseRun, Pooled, Ratio, Sample, Summary
from .telemetry import GpuEnv, GpuState

#: A JSON object as bench.json holds it: what :meth:`Report.to_json` writes and :meth:`Report.from_json` reads (the
#: one place where the report is not typed).
JsonObject = dict[str, Any]


@dataclass(frozen=True)
class CaseEntry:
    """A case in the report: what it is, its binaries and what its processes said about engagement."""

    name: str
    variant: str = ""
    env: Mapping[str, str] | None = None
    link: str | None = None
    description: str = ""
    bin_dir: str = ""
    llama_bench_sha256: str = ""
    engagement: str = ""


@dataclass(frozen=True)
class Model:
    """The model(s) of the report: the shapes (joined with ", " where several) and the first one's file."""

    shape: str
    path: str


@dataclass(frozen=True)
class SmiRecord:
    """How ``--smi`` sampled: every ``interval_ms``, these fields, so many samples, written to ``file``."""

    interval_ms: int
    fields: tuple[str, ...]
    samples: int
    file: str


@dataclass(frozen=True)
class Report:
    """A bench report (bench.json's fields in their order; a pooled one also names its sources)."""

    suite: str
    about: str
    date: str
    host: str
    rounds_planned: int
    stopped: str
    time_budget: float | None
    reps: int | None
    warmup_reps: int
    run_lengths: tuple[int, ...] | None
    shapes: tuple[str, ...]
    keyed_by_shape: bool
    measures: tuple[str, ...]
    settings: Mapping[str, object]
    """The suite's settings as the run used them (the measures' descriptions read them; bench.md shows them)."""
    model: Model
    models: Mapping[str, str]
    environment: GpuEnv
    links: Mapping[str, object] | None
    """The shaped links' record (:func:`...runtime.netbench.report`)."""
    cases: tuple[CaseEntry, ...]
    manifests: Mapping[str, object]
    """The build manifest of every variant, as the build stage wrote it."""
    figures: Pooled
    samples: tuple[Sample, ...]
    runs: tuple[CaseRun, ...]
    microbench: tuple[CopyRate, ...]
    smi: SmiRecord | None
    cpus: str | None = None
    skipped: tuple[str, ...] = ()
    pooled_from: tuple[str, ...] | None = None
    manifests_by_report: Mapping[str, object] | None = None

    def to_json(self) -> JsonObject:
        """bench.json's object."""
        out: JsonObject = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "figures":
                out |= self.figures.to_json()
            elif f.name in ("model", "smi"):
                out[f.name] = asdict(value) if value is not None else None
            elif f.name in ("cases", "samples", "microbench"):
                out[f.name] = [asdict(x) for x in value]
            elif f.name == "runs":
                out[f.name] = [r.to_json() for r in self.runs]
            elif f.name not in ("pooled_from", "manifests_by_report") or value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> Report:
        """The report :meth:`to_json` wrote (or an earlier version of the tool: what it lacks is empty); KeyError,
        TypeError or ValueError where a part is not of its kind."""
        model = data.get("model") or {}
        smi = data.get("smi")
        return cls(
            suite=data["suite"],
            about=data.get("about", ""),
            date=data.get("date", ""),
            host=data.get("host", ""),
            rounds_planned=data.get("rounds_planned", 0),
            stopped=data.get("stopped", ""),
            time_budget=data.get("time_budget"),
            reps=data.get("reps"),
            warmup_reps=data.get("warmup_reps", 0),
            run_lengths=_tuple(data.get("run_lengths")),
            shapes=tuple(data.get("shapes", ())),
            keyed_by_shape=bool(data.get("keyed_by_shape")),
            measures=tuple(data.get("measures", ("bench",))),
            settings=dict(data.get("settings", {})),
            model=Model(str(model.get("shape", "")), str(model.get("path", ""))),
            models=dict(data.get("models", {})),
            environment=data.get("environment") or {},
            links=data.get("links"),
            cases=tuple(CaseEntry(**c) for c in data.get("cases", ())),
            manifests=dict(data.get("manifests", {})),
            figures=_figures(data),
            samples=tuple(_sample(x) for x in data.get("samples", ())),
            runs=tuple(_run(x) for x in data.get("runs", ())),
            microbench=tuple(CopyRate(**r) for r in data.get("microbench") or ()),
            smi=SmiRecord(smi["interval_ms"], tuple(smi["fields"]), smi["samples"], smi["file"]) if smi else None,
            cpus=data.get("cpus"),
            skipped=tuple(data.get("skipped") or ()),
            pooled_from=_tuple(data.get("pooled_from")),
            manifests_by_report=data.get("manifests_by_report"),
        )


def _tuple(items: list[Any] | None) -> tuple[Any, ...] | None:
    return tuple(items) if items is not None else None


def _figures(data: JsonObject) -> Pooled:
    """The pooled figures of a report as :meth:`Pooled.to_json` wrote them."""
    return Pooled(
        data.get("rounds", 0),
        list(data.get("tests", ())),
        {n: {t: Summary(**x) for t, x in by.items()} for n, by in data.get("summary", {}).items()},
        {
            ref: {n: {t: _ratio(x) for t, x in by.items()} for n, by in per.items()}
            for ref, per in data.get("ratios", {}).items()
        },
        list(data.get("failed", ())),
        list(data.get("not_engaged", ())),
    )


def _ratio(x: JsonObject) -> Ratio:
    """A ratio as :meth:`Ratio.to_json` wrote it."""
    pair = x.get("paired_ci95")
    own = x.get("self_ci95")
    return Ratio(
        x["ratio"],
        x["noise"],
        x.get("paired"),
        x.get("paired_rounds"),
        (pair[0], pair[1]) if pair is not None else None,
        (own[0], own[1]) if own is not None else None,
    )


def _sample(x: JsonObject) -> Sample:
    """A sample as bench.json holds it; ValueError where a figure is not a number."""
    values = list(x["values"])
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise ValueError(f"a sample of {x['case']} in {x['test']} holds a figure that is not a number")
    return Sample(str(x["case"]), str(x["test"]), x["round"], values)


#: the fields of a process's record (an earlier version's other fields are left out)
_RUN_FIELDS = {f.name for f in fields(CaseRun)}


def _run(x: JsonObject) -> CaseRun:
    """A process as :meth:`CaseRun.to_json` wrote it."""
    known = {k: v for k, v in x.items() if k in _RUN_FIELDS}
    known["gpus"] = {g: GpuState.from_json(s) for g, s in (x.get("gpus") or {}).items()}
    return CaseRun(**known)


#: What ``--pool`` reads of a bench.json (a ladder's report.json, or any other JSON, is not one).
POOLED_KEYS = {
    "suite": Key("str"),
    "cases": Key("tables", table=None),
    "samples": Key("tables", table=None),
    "runs": Key("tables", table=None),
    "settings": Key("table"),
}
FIX = "pass bench.json files (or their folders) written by ggml-bridge bench"


def read(p: Path) -> tuple[Path, Report]:
    """The report in ``p`` (a bench.json, or its folder) and its file; BenchError, one line, when it is not one."""
    f = Path(p) / "bench.json" if Path(p).is_dir() else Path(p)
    data = files.read_json(f, "bench report", shape=POOLED_KEYS, required=tuple(POOLED_KEYS), error=BenchError, fix=FIX)
    for key in ("samples", "runs"):
        if any(not isinstance(x.get("round"), int) for x in data[key]):
            raise BenchError(f"{f} is not a bench report", why=f"an entry of {key} has no round number", fix=FIX)
    if any(not isinstance(c.get("name"), str) for c in data["cases"]):
        raise BenchError(f"{f} is not a bench report", why="a case has no name", fix=FIX)
    try:
        return f, Report.from_json(data)
    except KeyError as e:
        why = f"a part of it has no {e.args[0]!r}"
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        why = f"a part of it is not of its kind ({e})"
    raise BenchError(f"{f} is not a bench report", why=why, fix=FIX)
