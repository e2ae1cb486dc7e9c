"""The greedy responses artifact: llama-server's answers to the rung's requests (canonical JSON, one per line,
volatile fields dropped), and their first difference located in a request, a token or a probability."""

from __future__ import annotations

import json
from pathlib import Path

from .artifact import Produced, Production, Stage
from .inputs import RESULT_KEYS, canonical_response, request_payload


class Responses:
    """``responses.jsonl``: made while the mode's llama-server runs."""

    name = "responses"
    stage: Stage = "server"
    disposable = False

    def produce(self, run: Production) -> Produced:
        assert run.server is not None, "responses are requests to a running llama-server"
        rung = run.job.rung
        resp = run.job.out / "responses.jsonl"
        with open(resp, "wb") as fh:
            for i, p in enumerate(run.inputs.prompts):
                payload = request_payload(p, rung)
                fh.write(canonical_response(run.server.post("/completion", payload, timeout=rung.timeout), i))
        return Produced(resp)

    def describe(self, ref: Path, other: Path, offset: int) -> dict[str, object]:
        return describe_responses_diff(ref, other, offset)


def describe_responses_diff(ref: Path, other: Path, offset: int) -> dict[str, object]:
    a = ref.read_bytes().splitlines()
    b = other.read_bytes().splitlines()
    # which line holds the offset
    pos = 0
    line = 0
    for line, text in enumerate(a):  # noqa: B007 - the line is used after the loop
        if pos + len(text) + 1 > offset:
            break
        pos += len(text) + 1
    out: dict[str, object] = {"offset": offset, "request": line}
    if line >= len(a) or line >= len(b):
        out["where"] = "one response set is shorter"
        return out
    ra, rb = json.loads(a[line]), json.loads(b[line])
    ta, tb = ra.get("tokens") or [], rb.get("tokens") or []
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            out.update(where=f"generated token {i}", reference=x, mode=y)
            return out
    pa, pb = ra.get("completion_probabilities") or [], rb.get("completion_probabilities") or []
    for i, (x, y) in enumerate(zip(pa, pb, strict=False)):
        if x != y:
            out["where"] = f"probabilities of generated token {i}"
            xa, yb = x.get("top_logprobs") or [], y.get("top_logprobs") or []
            for j, (u, v) in enumerate(zip(xa, yb, strict=False)):
                if u != v:
                    out.update(
                        rank=j,
                        reference={"id": u.get("id"), "logprob": u.get("logprob")},
                        mode={"id": v.get("id"), "logprob": v.get("logprob")},
                    )
                    break
            else:
                out.update(reference=x.get("logprob"), mode=y.get("logprob"))
            return out
    for k in RESULT_KEYS:
        if ra.get(k) != rb.get(k):
            out.update(where=f"field {k}", reference=ra.get(k), mode=rb.get(k))
            return out
    out["where"] = "serialisation"
    return out
