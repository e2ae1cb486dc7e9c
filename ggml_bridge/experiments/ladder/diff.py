"""Byte diff of two modes' artifacts: the first differing byte, decoded in the perplexity logits format
(llama-perplexity --kl-divergence-base) or the canonical response stream."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ...foundations import cache
from .inputs import RESULT_KEYS


def sha256_file(path: Path) -> str:
    return cache.file_sha256(path)


def first_difference(a: Path, b: Path, block: int = 1 << 20) -> tuple[int | None, int]:
    """(offset of the first differing byte or None, bytes compared). Files of different length differ at
    the end of the shorter one."""
    off = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x = fa.read(block)
            y = fb.read(block)
            if x == y:
                off += len(x)
                if not x:
                    return None, off
                continue
            n = min(len(x), len(y))
            for i in range(n):
                if x[i] != y[i]:
                    return off + i, off + i
            return off + n, off + n


def describe_logits_diff(ref: Path, other: Path, offset: int) -> dict[str, Any]:
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
    where = {
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


def describe_responses_diff(ref: Path, other: Path, offset: int) -> dict[str, Any]:
    a = ref.read_bytes().splitlines()
    b = other.read_bytes().splitlines()
    # which line holds the offset
    pos = 0
    line = 0
    for line, text in enumerate(a):  # noqa: B007 - the line is used after the loop
        if pos + len(text) + 1 > offset:
            break
        pos += len(text) + 1
    out: dict[str, Any] = {"offset": offset, "request": line}
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


def compare_files(ref: Path, other: Path, kind: str) -> dict[str, Any]:
    off, n = first_difference(ref, other)
    res: dict[str, Any] = {
        "identical": off is None,
        "bytes_compared": n,
        "reference_bytes": ref.stat().st_size,
        "mode_bytes": other.stat().st_size,
    }
    if off is not None:
        try:
            res["first_difference"] = (describe_logits_diff if kind == "logits" else describe_responses_diff)(
                ref, other, off
            )
        except Exception as e:  # noqa: BLE001 - the description is a courtesy; the offset is the fact
            res["first_difference"] = {"offset": off, "where": f"(could not describe: {e})"}
    return res
