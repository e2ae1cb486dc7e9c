"""Batching against its baseline inside one process (``--measure inproc``): the patched build's
``test-batched-transfers --bench`` creates, per inner round, one context with batching off and one with it on in the
same process (the baseline's other selectors, e.g. the bridge forced, set for both), so the spread between processes
(an H200's fast and slow ones, 15-20 % apart) stays out of the ratio. One process per batched case, shape and bench
round measures the case and its baseline: each context's creation, the suite's prompts decoded three times from the
context's first graph on, and its token generation, as tokens (contexts) per second; tests ``pp512/ub512@inproc2``
(the second decode: what llama-bench ``-r 1`` times), ``tg128@inproc``, ``context@inproc``.

With ``control = true`` in the suite's ``inproc`` table, each such baseline also runs its own process per shape and
round, ``--control``: both contexts with batching off (an A/A run), kept as ``BASE~control-a`` / ``BASE~control-b``
(:data:`.stats.CONTROL`), from which the report gives every in-process ratio the range an unchanged path falls in
inside one process on that machine (:func:`.stats.control_interval`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from ...foundations.errors import BenchError, UsageError
from ...foundations.tomlfile import Key
from ...runtime import logparse, modes
from ...runtime.engagement import BATCHED, engaged
from .measure import Job, Plain, Process, Timed
from .stats import CONTROL, INPROC, CaseRun, Sample
from .suite import Suite

#: the program (patch 0004) and the decodes of each prompt it times per context
PROGRAM = "test-batched-transfers"
DECODES = 3


class InProcess(Plain):
    name = "inproc"
    program = PROGRAM
    table: Mapping[str, Key] | None = {"rounds": Key("int", 1), "control": Key("bool")}

    def check(self, settings: Mapping[str, Any], where: str) -> None:
        rounds = settings.get("rounds")
        if rounds is not None and rounds % 2:
            raise UsageError(
                f"{where}: inproc rounds = {rounds} is odd",
                why="test-batched-transfers --bench alternates which context of a round comes first, so an odd "
                "count lets one order weigh more in the ratio",
                fix="set inproc = { rounds = N } to an even number",
            )

    def groups(self, run_lengths: tuple[int, ...]) -> list[Job]:
        return [Job("", "", self.name)]

    def has_job(self, case: modes.Mode, cases: Mapping[str, modes.Mode], suite: Suite) -> bool:
        """One job per batched case, its baseline measured in the same process, and, where the suite asks for the
        control, one per such baseline with both contexts off."""
        if measured(case, list(cases)) is not None:
            return True
        return bool(suite.table(self.name).get("control")) and controlled(case, cases)

    def needs_program(self, case: modes.Mode) -> bool:
        return case.uses_batched  # the builds of the cases with batching, whose jobs run it

    def run(self, proc: Process, job: Job) -> tuple[CaseRun, list[Sample]]:
        base = measured(proc.case, list(proc.names))
        return run_control(proc) if base is None else run(proc, base)  # a baseline's own job is its control

    def describe(self, settings: Mapping[str, Any]) -> str | None:
        s = settings[self.name]
        return (
            f"- inproc: test-batched-transfers --bench, one process per batched case, shape and round measuring it "
            f"and its baseline: {s['rounds']} rounds of a context each (alternating, after a warm-up "
            f"round), each prompt decoded {DECODES} times from the context's first graph on (test@inprocN: "
            "decode N; "
            "llama-bench -r 1 times the second), the token steps, the context's creation (contexts per second)"
            + (
                "; per baseline, shape and round also a control process (--control: both contexts with batching off)"
                if s.get("control")
                else ""
            )
        )


def measured(case: modes.Mode, names: list[str]) -> modes.Mode | None:
    """The baseline a case's in-process job measures it against (None: the case has no job of its own here: it is
    no batched case, or its baseline is not among ``names``; a baseline is measured by its batched case's job)."""
    base = modes.baseline(case)
    return base if base is not None and base.name in names and not case.rpc else None


def controlled(case: modes.Mode, cases: Mapping[str, modes.Mode]) -> bool:
    """Whether ``case`` is the baseline an in-process job of another case measures against (:func:`measured`): its
    own in-process job, where the suite asks for one, is the control (both contexts off)."""
    names = list(cases)
    return any((b := measured(c, names)) is not None and b.name == case.name for c in cases.values())


def argv(bin_dir: Path, model: Path, suite: Suite, rounds: int, control: bool = False) -> list[str]:
    opts = {"--rounds": rounds, "--reps": DECODES, "--prompts": suite.pp, "--n-gen": suite.tg}
    opts["--ubatch"] = suite.ubatch[0]
    return [
        str(bin_dir / PROGRAM),
        "--model",
        str(model),
        "--bench",
        *(["--control"] if control else []),
        *(x for k, v in opts.items() for x in (k, str(v))),
    ]


def _test(measure: str, ubatch: int) -> tuple[str, float]:
    """A measure of the program's CSV (``context``, ``pp512 #2``, ``tg128``) as (test, tokens per measured unit)."""
    head, _, nth = measure.partition(" #")
    if head.startswith("pp") and head[2:].isdigit() and nth.isdigit():
        return f"{head}/ub{ubatch}{INPROC}{nth}", float(head[2:])
    if head.startswith("tg") and head[2:].isdigit() and not nth:
        return f"{head}{INPROC}", float(head[2:])
    if head == "context" and not nth:
        return f"context{INPROC}", 1.0
    raise BenchError(f"unknown measure {measure!r} in {PROGRAM} --bench output")


def samples(stdout: str, case: str, base: str, rnd: int, ubatch: int) -> list[Sample]:
    """The CSV lines ``bench,ROUND,CONTEXT,MEASURE,MS`` as samples of ``case`` (context 1) and ``base`` (0): per
    test, one value per inner round, in units per second."""
    values: dict[tuple[str, str], list[float]] = {}
    for line in stdout.splitlines():
        f = line.split(",")
        if len(f) != 5 or f[0] != "bench" or not f[1].isdigit() or f[2] not in ("0", "1"):
            continue
        test, units = _test(f[3], ubatch)
        ms = float(f[4])
        if ms <= 0:
            raise BenchError(f"{PROGRAM} --bench timed {ms} ms for {f[3]}")
        values.setdefault((case if f[2] == "1" else base, test), []).append(units * 1000.0 / ms)
    return [Sample(c, t, rnd, v) for (c, t), v in values.items()]


def _process(proc: Process, base: modes.Mode, measure: str, control: bool) -> Timed:
    """One run of the program with ``base``'s selectors (batching left to the program), its output in the log of
    ``proc`` for ``measure``."""
    return proc.timed(
        argv(proc.bin_dir, proc.model, proc.suite, proc.suite.table("inproc")["rounds"], control), base, measure
    )


def run(proc: Process, base: modes.Mode) -> tuple[CaseRun, list[Sample]]:
    """One process: ``proc.case`` and its baseline ``base`` in the suite's ``inproc.rounds`` inner rounds (after
    the program's warm-up round). Engaged: batching said it was enabled and did its work in the contexts that asked
    (the program also fails when they did not, or when a context with batching off printed anything)."""
    case, suite = proc.case, proc.suite
    t = _process(proc, base, "inproc", control=False)
    info = logparse.parse(t.text)
    last = info.batched.stats[-1] if info.batched.stats else {}
    verdict = engaged(BATCHED, info.batched, last)
    what = f"batched {verdict.state} in one process against {base.name}, async_uploads={last.get('async_uploads', 0)}"
    ok = verdict.engaged and t.res.returncode == 0
    detail = f"{suite.table('inproc')['rounds']} rounds of a context each, {DECODES} decodes per prompt"
    cr = CaseRun(case.name, proc.rnd, t.res.returncode, t.seconds, ok, what, logparse.tail(t.text), t.started)
    cr = replace(cr, detail=detail)
    if t.res.returncode != 0:
        return cr, []
    return cr, samples(t.res.stdout, case.name, base.name, proc.rnd, suite.ubatch[0])


def run_control(proc: Process) -> tuple[CaseRun, list[Sample]]:
    """One process of the baseline ``proc.case`` alone, ``--control``: both contexts of every inner round with
    batching off, their figures kept as ``BASE~control-a`` and ``BASE~control-b``. Nothing to engage; the program
    fails when either context printed a batched-transfers line, and a failed control leaves the baseline out of the
    ratios."""
    base, suite = proc.case, proc.suite
    t = _process(proc, base, "inproc-control", control=True)
    what = "control in one process: both contexts with batching off"
    detail = f"control: {suite.table('inproc')['rounds']} rounds of two contexts off, {DECODES} decodes per prompt"
    cr = CaseRun(base.name, proc.rnd, t.res.returncode, t.seconds, None, what, logparse.tail(t.text), t.started)
    cr = replace(cr, detail=detail)
    if t.res.returncode != 0:
        return cr, []
    a, b = (base.name + c for c in CONTROL)
    return cr, samples(t.res.stdout, b, a, proc.rnd, suite.ubatch[0])
