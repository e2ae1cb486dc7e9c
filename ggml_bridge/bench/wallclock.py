"""What users run besides llama-bench, measured by wall time: llama-perplexity (tokens evaluated per second of the
process's whole life: loading, warm-up and every chunk) and llama-server under concurrent requests (generated
tokens per second from the first request sent to the last answer). Both as rates, higher is better, so they pool
and pair like llama-bench's figures; both with the case's selectors and proof of engagement: llama-perplexity's
stats lines (``-lv 4``), llama-server's counters on /metrics (its default verbosity, as users run it)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import logparse, modes, runner
from ..engagement import BATCHED, BRIDGE, from_metrics
from ..errors import BenchError, FatalError
from ..ladder.inputs import make_text, make_words
from ..llama_server import Server, free_port
from ..net import DEFAULT_HOST
from .proof import engagement
from .stats import CaseRun, Sample

#: the seed of the perplexity text and the server's prompts (the ladder's default text seed)
TEXT_SEED = 7


@dataclass
class Inputs:
    """The deterministic inputs: llama-perplexity's text file and llama-server's prompts."""

    text: Path | None = None
    prompts: list[str] = field(default_factory=list)


def make_inputs(
    suite: dict[str, Any], measures: Sequence[str], out_dir: Path, vocab_tokens: list[str] | None
) -> Inputs:
    """The text (enough words for every chunk: each word is at least one token) and the prompts of the suite's
    ``perplexity`` and ``server`` settings where ``measures`` has them, from the ladder's deterministic words."""
    inputs = Inputs()
    if "perplexity" in measures:
        p = suite["perplexity"]
        inputs.text = out_dir / "perplexity.txt"
        inputs.text.write_text(make_text(p["ctx"] * p["chunks"] + 64, TEXT_SEED, vocab_tokens), encoding="utf-8")
    if "server" in measures:
        s = suite["server"]
        inputs.prompts = [
            " ".join(make_words(s["prompt_words"], TEXT_SEED * 1000 + i, vocab_tokens)) for i in range(s["requests"])
        ]
    return inputs


def device_args(suite: dict[str, Any], case: modes.Mode) -> list[str]:
    """Offload and split flags (every layer on the GPUs, split as the case or else the suite says, a layer split by
    default; none on the CPU) and the suite's threads."""
    split = case.split or suite.get("split_mode", "layer")
    argv = ["-ngl", "99", "-sm", split] if suite["devices"] != "cpu" or case.rpc else ["-ngl", "0"]
    return argv + (["-t", str(suite["threads"])] if suite.get("threads") else [])


@dataclass(frozen=True)
class Process:
    """One measured process of a round: the programs, the case, the model, the suite, the environment, the inputs,
    where its log goes, the round and how long it may take."""

    bin_dir: Path
    case: modes.Mode
    model: Path
    suite: dict[str, Any]
    base_env: dict[str, str]
    inputs: Inputs
    out_dir: Path
    rnd: int
    timeout: float

    def log_path(self, measure: str) -> Path:
        return self.out_dir / f"{self.case.name}-r{self.rnd}-{measure}.log"

    def timed(self, argv: list[str], selectors: modes.Mode, measure: str) -> Timed:
        """Runs ``argv`` with ``selectors``' environment over the base one, within the process's timeout, and writes
        its stdout and stderr to the log of ``measure``."""
        started, t0 = time.time(), time.monotonic()
        res = runner.run(
            argv, env={**self.base_env, **selectors.env()}, check=False, error=BenchError, timeout=self.timeout
        )
        seconds = time.monotonic() - t0
        log = self.log_path(measure)
        log.write_text(res.stdout + res.stderr)
        return Timed(res, res.stdout + res.stderr, started, seconds, log)


@dataclass(frozen=True)
class Timed:
    """A run of :meth:`Process.timed`: its result, stdout and stderr together, the wall clock at its start, its
    seconds and its log."""

    res: runner.Result
    text: str
    started: float
    seconds: float
    log: Path


def perplexity(proc: Process) -> tuple[CaseRun, list[Sample]]:
    """One llama-perplexity process (``-c``, ``--chunks``, ``-b`` of the suite: several sequences per batch); its
    figure: the tokens it evaluated (chunks x context, from its own line) per second of its wall time."""
    case, suite, inputs, rnd = proc.case, proc.suite, proc.inputs, proc.rnd
    p = suite["perplexity"]
    assert inputs.text is not None
    argv = [str(proc.bin_dir / "llama-perplexity"), "-m", str(proc.model), "-f", str(inputs.text), "-c", str(p["ctx"])]
    argv += ["--chunks", str(p["chunks"]), "-b", str(p["batch"]), "-ub", str(suite["ubatch"][0]), "-lv", "4"]
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
    run.detail = f"{counted[0]} chunks x {counted[1]} tokens in {t.seconds:.2f} s"
    return run, [Sample(case.name, "perplexity", rnd, [tokens / t.seconds])]


def server(proc: Process) -> tuple[CaseRun, list[Sample]]:
    """One llama-server (``-np``, ``--metrics``) answering the suite's requests, ``parallel`` at a time; its figure:
    generated tokens per second from the first request sent to the last answer (start-up not counted)."""
    case, suite, inputs, rnd, timeout = proc.case, proc.suite, proc.inputs, proc.rnd, proc.timeout
    s = suite["server"]
    args = ["-m", str(proc.model), "--host", DEFAULT_HOST, "--port", str(free_port())]
    args += ["-c", str(s["ctx"]), "-np", str(s["parallel"]), "-b", str(suite["batch"])]
    args += ["-ub", str(suite["ubatch"][0]), "--metrics", "--no-webui", *device_args(suite, case)]
    srv = Server(
        proc.bin_dir / "llama-server",
        args,
        env={**proc.base_env, **case.env()},
        log_file=proc.log_path("server"),
        startup_timeout=timeout,
        verbose_proof=False,  # as users run it; the proof reads /metrics (-lv 4 logs per request, which costs)
    )
    started, t0 = time.time(), time.monotonic()
    run = CaseRun(case.name, rnd, 0, 0.0, None, "", [], started)
    try:
        srv.start()
        try:
            generated, wall = _requests(srv, inputs.prompts, s, timeout)
            metrics = srv.metrics()
        finally:
            rc = srv.stop()
    except FatalError as e:
        run.rc, run.seconds, run.log_tail = 1, time.monotonic() - t0, [str(e), *srv.tail(12)]
        return run, []
    run.rc, run.seconds, run.log_tail = rc or 0, time.monotonic() - t0, srv.tail(15)
    run.engaged, run.engagement = _server_engagement(case, srv.info(), metrics)
    run.detail = f"{len(inputs.prompts)} requests, {generated} tokens generated in {wall:.2f} s"
    return run, [Sample(case.name, "server", rnd, [generated / wall])] if run.rc == 0 else []


def _requests(srv: Server, prompts: list[str], s: dict[str, Any], timeout: float) -> tuple[int, float]:
    """Every prompt as a greedy completion of ``n_predict`` tokens, ``parallel`` requests in flight at a time;
    (tokens generated, seconds from the first request to the last answer)."""
    payloads = [
        {"prompt": p, "n_predict": s["n_predict"], "temperature": 0.0, "ignore_eos": True, "cache_prompt": False}
        for p in prompts
    ]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=s["parallel"]) as pool:
        answers = list(pool.map(lambda p: srv.post("/completion", p, timeout=timeout), payloads))
    wall = time.monotonic() - t0
    try:
        generated = sum(int(json.loads(a)["tokens_predicted"]) for a in answers)
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError("llama-server answered without tokens_predicted", why=str(e)) from None
    return generated, wall


def _server_engagement(
    case: modes.Mode, info: logparse.LogInfo, metrics: dict[str, int] | None
) -> tuple[bool | None, str]:
    """Did the case's mechanisms engage in llama-server? From its counters on /metrics (patch 0005): the bridge
    crossed boundaries, batching staged uploads; the log's "inactive" warnings give the reason where not."""
    if not case.mechanisms:
        return None, ""
    ok, parts = True, []
    for mech, log_info, keys in (
        (BRIDGE, info.bridge, ("bridge_boundaries_total", "bridge_bytes_total")),
        (BATCHED, info.batched, ("batched_graphs_total", "batched_async_uploads_total")),
    ):
        if mech in case.mechanisms:
            v = from_metrics(mech, log_info, metrics)
            ok &= v.engaged
            counts = " ".join(f"{k}={(metrics or {}).get(k, 0)}" for k in keys)
            parts.append(f"{mech} {v.state} (/metrics {counts})" + (f", inactive: {v.reason}" if v.reason else ""))
    return ok, "; ".join(parts)
