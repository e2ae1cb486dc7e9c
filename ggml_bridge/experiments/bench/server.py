"""llama-server under concurrent requests (``--measure server``, suites with a ``server`` table): generated tokens
per second from the first request sent to the last answer (start-up not counted), a rate like llama-bench's
figures; engagement from its counters on /metrics (its default verbosity, as users run it)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...foundations.errors import BenchError, FatalError
from ...foundations.net import DEFAULT_HOST
from ...foundations.tomlfile import Key
from ...runtime import logparse, modes
from ...runtime.engagement import BATCHED, BRIDGE, from_metrics
from ...runtime.llama_server import Server, ServerLog, free_port
from ..ladder.inputs import make_words
from .measure import TEXT_SEED, Inputs, Job, Plain, Process, device_args
from .stats import CaseRun, Sample
from .suite import Suite

_INT = Key("int", 1)


class ServerMeasure(Plain):
    name = "server"
    program = "llama-server"
    table: Mapping[str, Key] | None = {k: _INT for k in ("parallel", "requests", "n_predict", "prompt_words", "ctx")}

    def groups(self, run_lengths: tuple[int, ...]) -> list[Job]:
        return [Job("", "", self.name)]

    def prepare(self, suite: Suite, out_dir: Path, tokens: list[str] | None, inputs: Inputs) -> Inputs:
        """The prompts, from the ladder's deterministic words."""
        s = suite.table(self.name)
        prompts = (" ".join(make_words(s["prompt_words"], TEXT_SEED * 1000 + i, tokens)) for i in range(s["requests"]))
        return replace(inputs, prompts=tuple(prompts))

    def run(self, proc: Process, job: Job) -> tuple[CaseRun, list[Sample]]:
        return server(proc)

    def describe(self, settings: Mapping[str, Any]) -> str | None:
        v = settings[self.name]
        return (
            f"- server: llama-server -np {v['parallel']}, {v['requests']} greedy completions of {v['n_predict']} "
            f"tokens, {v['parallel']} at a time; generated tokens per second from the first request to the last answer"
        )


def server(proc: Process) -> tuple[CaseRun, list[Sample]]:
    """One llama-server (``-np``, ``--metrics``) answering the suite's requests, ``parallel`` at a time; its figure:
    generated tokens per second from the first request sent to the last answer (start-up not counted)."""
    case, suite, inputs, rnd, timeout = proc.case, proc.suite, proc.inputs, proc.rnd, proc.timeout
    s = suite.table("server")
    args = ["-m", str(proc.model), "--host", DEFAULT_HOST, "--port", str(free_port())]
    args += ["-c", str(s["ctx"]), "-np", str(s["parallel"]), "-b", str(suite.batch)]
    args += ["-ub", str(suite.ubatch[0]), "--metrics", "--no-webui", *device_args(suite, case)]
    srv = Server(
        proc.bin_dir / "llama-server",
        args,
        env={**proc.base_env, **case.env()},
        log=ServerLog(proc.log_path("server")),
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
        return replace(run, rc=1, seconds=time.monotonic() - t0, log_tail=[str(e), *srv.tail(12)]), []
    seconds, tail = time.monotonic() - t0, srv.tail(15)
    engaged, engagement = _server_engagement(case, srv.info(), metrics)
    detail = f"{len(inputs.prompts)} requests, {generated} tokens generated in {wall:.2f} s"
    run = CaseRun(case.name, rnd, rc or 0, seconds, engaged, engagement, tail, started, detail=detail)
    return run, [Sample(case.name, "server", rnd, [generated / wall])] if run.rc == 0 else []


def _requests(srv: Server, prompts: Sequence[str], s: Mapping[str, Any], timeout: float) -> tuple[int, float]:
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
