"""The full logits artifact: ``llama-perplexity --kl-divergence-base`` over the rung's text, every evaluated token's
(16-bit quantised) log-probabilities, and their first difference located in a token's record."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from ...foundations import runner
from ...foundations.errors import ServeError
from ...runtime import logparse
from .artifact import Produced, Production, Stage


class Logits:
    """``logits.bin``: made after the mode's llama-server stopped; rungs with ``perplexity = false`` skip it
    (:attr:`~.schema.Rung.skips`)."""

    name = "logits"
    stage: Stage = "after"
    disposable = True

    def produce(self, run: Production) -> Produced:
        job = run.job
        rung, out = job.rung, job.out
        logits = out / "logits.bin"
        logits.unlink(missing_ok=True)
        plog = out / "perplexity.log"
        plog.unlink(missing_ok=True)
        pargs: list[str | Path] = [
            job.programs["llama-perplexity"],
            "-m",
            run.inputs.model,
            "-f",
            run.inputs.text,
            "-c",
            str(rung.perplexity_ctx()),
            *job.common_args(),
            *job.extra,
            "--kl-divergence-base",
            logits,
            *rung.perplexity_args,
        ]
        r = runner.run(
            pargs,
            env=job.env,
            timeout=rung.timeout,
            output=runner.Output(log_file=plog),
            failure=runner.Failure(ServeError, what=f"llama-perplexity failed in mode {job.mode.name}"),
        )
        if not logits.is_file() or logits.stat().st_size <= 20:
            raise ServeError(
                f"llama-perplexity wrote no logits in mode {job.mode.name}",
                why="last lines:\n    " + r.stdout[-2000:].replace("\n", "\n    "),
            )
        return Produced(logits, (("perplexity", logparse.parse(plog.read_text(errors="replace"))),))

    def describe(self, ref: Path, other: Path, offset: int) -> dict[str, object]:
        return describe_logits_diff(ref, other, offset)


def describe_logits_diff(ref: Path, other: Path, offset: int) -> dict[str, object]:
    """Locate a byte offset of a --kl-divergence-base file: header, token ids, or a token's record."""
    with open(ref, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:8] != b"_logits_":
        return {"offset": offset, "where": "file header (not a _logits_ file)"}
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", head[8:20])
    tok_end = 20 + 4 * n_chunk * n_ctx
    if offset < 20:
        return {"offset": offset, "where": "file header"}
    if offset < tok_end:
        i = (offset - 20) // 4
        vals = [_read_at(p, 20 + 4 * i, "<i") for p in (ref, other)]
        return {"offset": offset, "where": f"token id {i}", "reference": vals[0], "mode": vals[1]}
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rec = (offset - tok_end) // (2 * nv)
    elem = ((offset - tok_end) % (2 * nv)) // 2
    base = tok_end + rec * 2 * nv
    first = n_ctx // 2
    per_chunk = n_ctx - 1 - first
    where: dict[str, object] = {
        "offset": offset,
        "token_record": rec,
        "chunk": rec // per_chunk,
        "position_in_chunk": first + rec % per_chunk,
    }
    if elem < 4:
        names = ["scale", "min_log_prob"]
        k = elem // 2
        vals = [_read_at(p, base + 4 * k, "<f") for p in (ref, other)]
        where.update(where=f"record header {names[k]}", reference=vals[0], mode=vals[1])
    else:
        tok = elem - 4
        q = [_read_at(p, base + 2 * elem, "<H") for p in (ref, other)]
        hdr = [(_read_at(p, base, "<f"), _read_at(p, base + 4, "<f")) for p in (ref, other)]
        lp = [None if v is None or h[0] is None else h[1] + h[0] * v for v, h in zip(q, hdr, strict=False)]
        where.update(
            where=f"log-prob of vocab entry {tok}",
            vocab_id=tok,
            reference=q[0],
            mode=q[1],
            reference_log_prob=lp[0],
            mode_log_prob=lp[1],
        )
    return where


def _read_at(path: Path, off: int, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    with open(path, "rb") as f:
        f.seek(off)
        b = f.read(size)
    return struct.unpack(fmt, b)[0] if len(b) == size else None
