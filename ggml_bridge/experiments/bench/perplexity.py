"""llama-perplexity by wall time (``--measure perplexity``, suites with a ``perplexity`` table): the tokens it
evaluated per second of the process's whole life (loading, warm-up and every chunk), a rate like llama-bench's
figures; engagement from its stats lines (``-lv 4``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from ...foundations.errors import BenchError
from ...foundations.tomlfile import Key
from ...runtime import logparse, modes
from ..ladder.inputs import make_text
from .measure import TEXT_SEED, Inputs, Job, Plain, Process, device_args
from .proof import engagement
from .stats import CaseRun, Sample
from .suite import Suite


class Perplexity(Plain):
    name = "perplexity"
    program = "llama-perplexity"
    table: Mapping[str, Key] | None = {"ctx": Key("int", 1), "chunks": Key("int", 1), "batch": Key("int", 1)}

    def groups(self, run_lengths: tuple[int, ...]) -> list[Job]:
        return [Job("", "", self.name)]

    def prepare(self, suite: Suite, out_dir: Path, tokens: list[str] | None, inputs: Inputs) -> Inputs:
        """The text: enough of the ladder's deterministic words for every chunk (each word is at least one token)."""
        p = suite.table(self.name)
        text = out_dir / "perplexity.txt"
        text.write_text(make_text(p["ctx"] * p["chunks"] + 64, TEXT_SEED, tokens), encoding="utf-8")
        return replace(inputs, text=text)

    def run(self, proc: Process, job: Job) -> tuple[CaseRun, list[Sample]]:
        return perplexity(proc)

    def describe(self, settings: Mapping[str, Any]) -> str | None:
        p = settings[self.name]
        return (
            f"- perplexity: llama-perplexity -c {p['ctx']} --chunks {p['chunks']} -b {p['batch']}, tokens evaluated "
            "per second of the process's wall time (loading and warm-up included)"
        )


def perplexity(proc: Process) -> tuple[CaseRun, list[Sample]]:
    """One llama-perplexity process (``-c``, ``--chunks``, ``-b`` of the suite: several sequences per batch); its
    figure: the tokens it evaluated (chunks x context, from its own line) per second of its wall time."""
    case, suite, inputs, rnd = proc.case, proc.suite, proc.inputs, proc.rnd
    p = suite.table("perplexity")
    assert inputs.text is not None
    argv = [str(proc.bin_dir / "llama-perplexity"), "-m", str(proc.model), "-f", str(inputs.text), "-c", str(p["ctx"])]
    argv += ["--chunks", str(p["chunks"]), "-b", str(p["batch"]), "-ub", str(suite.ubatch[0]), "-lv", "4"]
    argv += device_args(suite, case)
    t = proc.timed(argv, case, "perplexity")
    eng, what = engagement(case, t.text, modes.CUDA_DEVICES in proc.base_env)
    run = CaseRun(case.name, rnd, t.res.returncode, t.seconds, eng, what, logparse.tail(t.text), t.started)
    if t.res.returncode != 0:
        return run, []
    counted = logparse.perplexity_chunks(t.text)
    if counted is None or counted[0] == 0:
        raise BenchError(
            f"llama-perplexity evaluated nothing for case {case.name}",
            why="no 'calculating perplexity over N chunks' line with N > 0",
            fix=f"see {t.log}",
        )
    tokens = counted[0] * counted[1]
    run = replace(run, detail=f"{counted[0]} chunks x {counted[1]} tokens in {t.seconds:.2f} s")
    return run, [Sample(case.name, "perplexity", rnd, [tokens / t.seconds])]
