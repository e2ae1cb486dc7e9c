"""Deterministic inputs: word texts of about N tokens, the prompts and requests of a rung, canonical responses."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from ...foundations.errors import ServeError
from .schema import Rung

#: Words that are single tokens in the llama-spm vocabulary (checked against the vocab at run time), so a
#: text of N words is about N tokens and prompts of a given length can be made without a tokenizer.
WORDS = (
    "the of and to in is was for on that with as by at from it his an are were which be this has or "
    "had not but also first one their its new after who they have her she two been other when there all "
    "during into school time may years more most only over city some world would where later up such used "
    "many can state about national out known university then made"
).split()


def make_words(n: int, seed: int, vocab_tokens: Sequence[str] | None = None) -> list[str]:
    words = list(WORDS)
    if vocab_tokens is not None:
        toks = set(vocab_tokens)
        words = [w for w in words if "\u2581" + w in toks] or words
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, len(words), size=n)
    return [words[i] for i in idx]


def make_text(n_words: int, seed: int, vocab_tokens: Sequence[str] | None = None) -> str:
    """Deterministic pseudo-English: sentences of 8-16 words, capitalised, one per line every 5."""
    words = make_words(n_words, seed, vocab_tokens)
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    out: list[str] = []
    i = 0
    n_sent = 0
    while i < len(words):
        k = int(rng.integers(8, 17))
        sent = words[i : i + k]
        i += k
        out.append(" ".join(sent) + ".")
        n_sent += 1
        if n_sent % 5 == 0:
            out.append("\n")
    return " ".join(out).replace(" \n ", "\n").strip() + "\n"


def make_prompts(rung: Rung, seed: int, vocab_tokens: Sequence[str] | None) -> list[str]:
    prompts = []
    for j, n in enumerate(rung.prompts_words()):
        prompts.append(" ".join(make_words(n, seed * 1000 + j, vocab_tokens)))
    return prompts


def request_payload(prompt: str, rung: Rung) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "n_predict": rung.n_predict,
        "temperature": 0.0,
        "n_probs": rung.n_probs,
        "cache_prompt": False,
        "ignore_eos": True,
        "return_tokens": True,
        "seed": 1,
        "stream": False,
    }


#: Response fields that are part of the result; everything else (timings, slot ids, settings echo,
#: model path) is not compared.
RESULT_KEYS = (
    "content",
    "tokens",
    "completion_probabilities",
    "tokens_predicted",
    "tokens_evaluated",
    "stop_type",
    "truncated",
)


def canonical_response(raw: bytes, index: int) -> bytes:
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ServeError(f"request {index}: the server answered something that is not JSON", why=str(e)) from None
    rec = {"request": index, **{k: d.get(k) for k in RESULT_KEYS}}
    if not rec["tokens"] and not rec["content"]:
        raise ServeError(f"request {index}: the server generated nothing", why=raw[:300].decode(errors="replace"))
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
