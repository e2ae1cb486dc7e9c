"""The bench's figures: samples and runs, per-case summaries (median, quartiles), ratios against the
reference cases, and the paired per-round ratio with its bootstrap interval; :func:`pool` pools every round."""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Mapping, Sequence

from ...foundations.errors import BenchError
from ...runtime import modes
from .telemetry import GpuState


@dataclass(frozen=True)
class Sample:
    case: str
    test: str  # e.g. "pp4096/ub512", "tg128"
    round: int
    values: list[float]  # tokens per second, one per llama-bench repetition


@dataclass(frozen=True)
class CaseRun:
    case: str
    round: int
    rc: int
    seconds: float
    engaged: bool | None  # None: nothing to prove
    engagement: str  # what the log said
    log_tail: list[str] = field(default_factory=list)
    started: float = 0.0  # wall clock (epoch seconds) when the process started: lines runs up with GPU telemetry
    gpus: dict[str, GpuState] = field(default_factory=dict)  # --smi: GPU state while it ran, by GPU index
    measure: str = "bench"  # bench (llama-bench), perplexity (llama-perplexity) or server (llama-server)
    shape: str = ""  # the model's shape where the run measured several
    run_length: int | None = None  # llama-bench -r N with every repetition kept (None: kept after discarded ones)
    detail: str = ""  # what the figure was made of (chunks, requests, tokens, seconds)

    def to_json(self) -> dict[str, object]:
        """The report's record (every field, the GPU states as theirs)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gpus"] = {g: state.to_json() for g, state in self.gpus.items()}
        return out


@dataclass(frozen=True)
class Summary:
    case: str
    test: str
    n: int
    median: float
    q1: float
    q3: float
    lo: float
    hi: float

    @property
    def spread(self) -> float:
        return self.q3 - self.q1


def summarize(case: str, test: str, values: Sequence[float]) -> Summary:
    vals = sorted(values)
    if not vals:
        raise BenchError(f"no samples for {case} {test}")
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return Summary(case, test, len(vals), statistics.median(vals), q1, q3, vals[0], vals[-1])


@dataclass(frozen=True)
class Ratio:
    """A case against a reference in one test: the ratio of the pooled medians and whether it is noise, and where
    the two shared rounds the paired ratio, its number of rounds and its bootstrap intervals."""

    ratio: float
    noise: bool
    paired: float | None = None
    paired_rounds: int | None = None
    paired_ci95: tuple[float, float] | None = None
    self_ci95: tuple[float, float] | None = None

    def to_json(self) -> dict[str, object]:
        """The report's record: the paired figures only where there are some."""
        out: dict[str, object] = {"ratio": self.ratio, "noise": self.noise}
        if self.paired is not None:
            out["paired"], out["paired_rounds"] = self.paired, self.paired_rounds
            if self.paired_ci95 is not None:
                out["paired_ci95"] = list(self.paired_ci95)
            if self.self_ci95 is not None:
                out["self_ci95"] = list(self.self_ci95)
        return out


def compare(a: Summary, b: Summary) -> Ratio:
    """a relative to b: ratio of medians, and whether the difference is inside the spreads (noise)."""
    ratio = a.median / b.median if b.median else float("nan")
    noise = abs(a.median - b.median) <= (a.spread + b.spread)
    return Ratio(ratio, noise)


def _round_medians(samples: Sequence[Sample], case: str, test: str) -> dict[int, float]:
    """Per round that ran ``case`` in ``test``: the median of its samples."""
    per: dict[int, list[float]] = {}
    for s in samples:
        if s.test == test and s.case == case and s.values:
            per.setdefault(s.round, []).extend(s.values)
    return {r: statistics.median(v) for r, v in per.items()}


def _round_ratios(samples: Sequence[Sample], case: str, ref: str, test: str) -> list[float]:
    """Per round that ran both cases: median of case / median of ref within the round."""
    a, b = _round_medians(samples, case, test), _round_medians(samples, ref, test)
    return [a[r] / b[r] for r in a if r in b and b[r]]


def paired_ratio(samples: Sequence[Sample], case: str, ref: str, test: str) -> tuple[float, int] | None:
    """Median over the rounds that ran both cases of (median of case / median of ref) within the round, and the
    number of such rounds. Cases of one round ran next to each other, so a drift of the machine between rounds
    (clocks, a noisy neighbour) cancels here, while the pooled medians keep it; None without a common round."""
    ratios = _round_ratios(samples, case, ref, test)
    if not ratios:
        return None
    return statistics.median(ratios), len(ratios)


def _median_range(ratios: Sequence[float], k: int, resamples: int, seed: int) -> tuple[float, float] | None:
    """95 % range of the median of ``k`` per-round ratios drawn with replacement from ``ratios`` (bootstrap over
    whole rounds: the samples of one process are not independent); None with fewer than 3 rounds or no ``k``."""
    if len(ratios) < 3 or k < 1:
        return None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=k)) for _ in range(resamples))
    return meds[int(0.025 * (resamples - 1))], meds[int(0.975 * (resamples - 1))]


def paired_interval(
    samples: Sequence[Sample], case: str, ref: str, test: str, resamples: int = 2000, seed: int = 1234
) -> tuple[float, float] | None:
    """95 % bootstrap interval of :func:`paired_ratio` that resamples whole rounds (the samples of one process
    are not independent); None with fewer than 3 common rounds."""
    ratios = _round_ratios(samples, case, ref, test)
    return _median_range(ratios, len(ratios), resamples, seed)


def self_interval(
    samples: Sequence[Sample], ref: str, test: str, k: int, resamples: int = 2000, seed: int = 1234
) -> tuple[float, float] | None:
    """95 % range of the median of ``k`` ratios between two different processes (rounds) of ``ref`` itself: where a
    paired ratio over ``k`` rounds falls by the spread of the machine's processes alone, i.e. for a case whose path
    is ``ref``'s (batching's prompts, on upstream's copies path for path); None with fewer than 3 rounds of ``ref``."""
    values = [m for m in _round_medians(samples, ref, test).values() if m]
    if len(values) < 3 or k < 1:
        return None
    rng = random.Random(seed)
    meds = sorted(
        statistics.median(a / b for a, b in (rng.sample(values, 2) for _ in range(k))) for _ in range(resamples)
    )
    return meds[int(0.025 * (resamples - 1))], meds[int(0.975 * (resamples - 1))]


def test_key(r: Mapping[str, object]) -> str:
    """The test of a row of llama-bench's JSON: ``ppN/ubU`` or ``tgN``."""
    if r.get("n_prompt"):
        return f"pp{r['n_prompt']}/ub{r['n_ubatch']}"
    return f"tg{r['n_gen']}"


#: the order of the kinds of test: llama-bench's prompt processing and generation, then the wall-time figures, then
#: the creation of a context (measured inside one process)
_KINDS = ("pp", "tg", "perplexity", "server", "context")
#: the suffix of the tests measured inside one process (bench.inproc): ``pp512/ub512@inproc2`` is the second decode
INPROC = "@inproc"
#: the case names under which a baseline's in-process control run (both contexts with batching off, bench.inproc)
#: keeps its samples, as ``BASE~control-a`` (the first context of each inner round pair) and ``BASE~control-b``
CONTROL = ("~control-a", "~control-b")


def control_interval(
    samples: Sequence[Sample], ref: str, test: str, k: int, resamples: int = 2000, seed: int = 1234
) -> tuple[float, float] | None:
    """95 % range of the median over ``k`` rounds of ``ref``'s in-process control, each round's ratio taken as the
    paired in-process ratio is (median of the second context / median of the first): where a paired in-process
    ratio over ``k`` rounds falls for an unchanged path, the in-process twin of :func:`self_interval`; None with
    fewer than 3 rounds of the control."""
    return _median_range(_round_ratios(samples, ref + CONTROL[1], ref + CONTROL[0], test), k, resamples, seed)


def in_process(test: str) -> bool:
    """A test measured inside one process: both cases of its ratio ran in the same process."""
    return INPROC in test


def _test_order(test: str) -> tuple[str, int, int, int, int]:
    """By shape (``SHAPE:``), then pp, tg, perplexity, server, context, then by size, ubatch and run length
    (``@rN``) as numbers, the in-process decodes (``@inprocN``) after them: pp4096/ub512 before pp4096/ub4096,
    pp512/ub512@r3 before pp512/ub512@r10 before pp512/ub512@inproc1."""
    shape, _, body = test.rpartition(":")
    body, _, after = body.partition("@")
    head, _, ub = body.partition("/ub")
    kind = head if head in _KINDS else head[:2]
    size = head[2:] if kind in ("pp", "tg") and head[2:].isdigit() else "0"
    run = 0
    if after.startswith(INPROC[1:]):
        nth = after[len(INPROC) - 1 :]
        run = 10**6 + (int(nth) if nth.isdigit() else 0)
    elif after[:1] == "r" and after[1:].isdigit():
        run = int(after[1:])
    kinds = _KINDS.index(kind) if kind in _KINDS else len(_KINDS)
    return (shape, kinds, int(size), int(ub) if ub.isdigit() else 0, run)


#: reference cases of the ratios, in this order: upstream with and without peer access, the test-only no-peer
#: baselines of virtual devices (layer and tensor split), upstream's own tensor-split paths, the butterfly through the
#: bridge's copies (what the bridge's all-reduce replaces), the patched build off
REFERENCES = (
    "upstream-p2p",
    "upstream-nopeer",
    "upstream-nopeer-virtual",
    "tensor-nopeer-virtual",
    "tensor-upstream-internal",
    "tensor-upstream-internal-f32",
    "tensor-upstream",
    "tensor-bridge-force-butterfly",
    "off",
    "upstream",
    "rpc-upstream-nopeer",
    "rpc-upstream",
    "rpc-off",
)
#: the references that get a column of bench.md's table, up to the patched build off (the others are in bench.json)
TABLE_REFERENCES = REFERENCES[: REFERENCES.index("off") + 1]


def references(names: Sequence[str], among: Sequence[str] = REFERENCES) -> list[str]:
    """The reference cases present in ``names``, by their current or older name (reports of earlier runs)."""
    old = {new: [o for o, n in modes.ALIASES.items() if n == new] for new in among}
    return [n for ref in among for n in [ref, *old[ref]] if n in names]


@dataclass(frozen=True)
class Pooled:
    """Every round pooled (:func:`pool`): the rounds, the tests in order, per case and test its summary, per
    reference, case and test the ratio, and the cases that failed or did not engage."""

    rounds: int
    tests: list[str]
    summary: dict[str, dict[str, Summary]]
    ratios: dict[str, dict[str, dict[str, Ratio]]]
    failed: list[str]
    not_engaged: list[str]

    def to_json(self) -> dict[str, object]:
        """The report's fields."""
        return {
            "rounds": self.rounds,
            "tests": self.tests,
            "summary": {n: {t: asdict(x) for t, x in by.items()} for n, by in self.summary.items()},
            "ratios": {
                ref: {n: {t: r.to_json() for t, r in by.items()} for n, by in per.items()}
                for ref, per in self.ratios.items()
            },
            "failed": self.failed,
            "not_engaged": self.not_engaged,
        }


def pool(names: Sequence[str], samples: Sequence[Sample], runs: Sequence[CaseRun]) -> Pooled:
    """All rounds pooled: per case and test the median and quartiles of every kept sample, and against each
    reference case the ratio of medians and the paired ratio with its interval (cases that failed or did not
    engage are left out of the ratios)."""
    failed = sorted({r.case for r in runs if r.rc != 0})
    not_engaged = sorted({r.case for r in runs if r.engaged is False})
    tests = sorted({s.test for s in samples}, key=_test_order)
    summary: dict[str, dict[str, Summary]] = {}
    for name in names:
        for t in tests:
            vals = [v for s in samples if s.case == name and s.test == t for v in s.values]
            if vals:
                summary.setdefault(name, {})[t] = summarize(name, t, vals)
    usable = [n for n in names if n not in failed and n not in not_engaged]
    refs = references(usable)
    pairs = [(n, ref) for ref in refs for n in usable] + [p for p in batched_pairs(usable) if p[1] not in refs]
    ratios: dict[str, dict[str, dict[str, Ratio]]] = {}
    for n, ref in pairs:
        for t in tests:
            if t in summary.get(n, {}) and t in summary.get(ref, {}):
                ratios.setdefault(ref, {}).setdefault(n, {})[t] = _ratio(samples, summary, n, ref, t)
    return Pooled(len({r.round for r in runs}), tests, summary, ratios, failed, not_engaged)


def _ratio(samples: Sequence[Sample], summary: dict[str, dict[str, Summary]], n: str, ref: str, t: str) -> Ratio:
    """Case ``n`` against ``ref`` in test ``t``: the ratio of the pooled medians (and whether it is noise), the
    paired ratio over rounds with its number of rounds and bootstrap interval."""
    cmp = compare(summary[n][t], summary[ref][t])
    paired = paired_ratio(samples, n, ref, t)
    if paired is None:
        return cmp
    k = paired[1]
    own = control_interval(samples, ref, t, k) if in_process(t) else self_interval(samples, ref, t, k)
    return replace(
        cmp, paired=paired[0], paired_rounds=k, paired_ci95=paired_interval(samples, n, ref, t), self_ci95=own
    )


def batched_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """(batched case, its baseline) for every case in ``names`` with batching on whose baseline (the same mode with
    batching off, :func:`modes.baseline`) is in ``names`` too: off for batched, bridge-force for
    bridge-force-batched."""
    pairs = []
    for n in names:
        base = modes.baseline(modes.MODES[n]) if n in modes.MODES else None
        if base is not None and base.name in names:
            pairs.append((n, base.name))
    return pairs
