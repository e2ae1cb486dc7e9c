"""Byte-exact comparison ladder: the patches must change nothing but speed.

``ggml-bridge ladder [--ladder FILE] [--report DIR]`` reads a ladder TOML file (``ladders/cpu.toml`` runs
in CI, ``ladders/cuda.toml`` on GPU machines). Each rung names a model shape (generated, deterministic,
cached: :mod:`model`), the devices, ubatch/batch sizes and the *modes* to compare. A mode is a binary
(patched or upstream build) plus selector values:

==================== =========  ==============================  ========================
mode                 binaries   GGML_CUDA_MAPPED_HOST_BRIDGE    SAM3D_BATCHED_TRANSFERS
==================== =========  ==============================  ========================
upstream             upstream   (unset)                         (unset)
off                  patched    0                               0
bridge               patched    1                               0
bridge-force         patched    force                           0
batched              patched    0                               1
bridge-batched       patched    1                               1
bridge-force-batched patched    force                           1
bridge-typo          patched    yes (and _CHUNK_KIB=abc)        0
off-1gpu             patched    0                               0        (on one GPU whatever the rung's devices)
rpc-off              patched    0                               0        (over local rpc-servers)
rpc-bridge           patched    1                               0        (over local rpc-servers)
rpc-upstream         upstream   (unset)                         (unset)  (over local rpc-servers)
==================== =========  ==============================  ========================

The table is :data:`ggml_bridge.modes.MODES` (shared with the bench); the ladder runs the modes of the
patched and upstream builds. ``both`` (bridge=force with batching here, bridge=1 in the bench) is refused
with both new names.

An ``rpc-*`` mode starts one ``ggml-rpc-server`` per entry of the rung's ``rpc_servers`` (each a device list,
e.g. ``[["CPU"], ["CPU"]]`` or ``[["CUDA0", "CUDA1"]]``) with the rung's GPUs and the mode's selectors, and
runs llama-server and llama-perplexity with ``--rpc`` and no GPU of their own; the servers' counters (patch
0006, SIGUSR1) must show each served graph computations, and in ``rpc-bridge`` every server owning two or
more GPUs must report the bridge engaged with ``bridge_boundaries>0`` (docs/rpc.md).

For every mode the rung runs the real llama-server through :class:`serve.Server`, sends a fixed request
set (greedy, ``n_probs``, prompts from one token up to longer than the ubatch) and records the responses
(canonical JSON, volatile fields such as timings dropped); then runs ``llama-perplexity
--kl-divergence-base FILE`` on a fixed generated text, which dumps the (16-bit quantised) log-probabilities
of every evaluated token. Both artifacts of every mode are compared byte for byte with the rung's
reference mode.

No vacuous passes: a bridge mode needs the bridge's ``enabled ... N slots x M MiB`` line in every process,
and on multi-device rungs its teardown counters must show ``boundaries>0`` (and the log must show the model
on more than one device); a batched mode needs its ``enabled`` line and ``async_uploads>0`` (what batching
itself staged; logits downloads into llama.cpp's pinned output buffer are upstream's own and counted apart),
also live on the server's ``/metrics`` (``llamacpp:batched_async_uploads_total``) when it serves them. ``off``
must not show either mechanism enabled, and ``upstream`` must not print any patch line at all. ``bridge-typo``
sets invalid selector values: every process must report each of them rejected (with llama.cpp's default
``-fit``, whose probe demotes warnings) and the bridge must stay off; any other rejected value fails every mode.
A rung may declare ``expect_batched = "inactive"`` (CPU: nothing to batch to): the mode
is then compared but reported as *inactive, as expected* and never counted as a batched pass;
``expect_bridge`` likewise, and ``expect = { bridge = "either" }`` sets it for one mode (for every
mechanism that mode uses). "either" accepts engaged or inactive and reports which.

Exit status: 0 all rungs pass; 1 any mismatch or validity failure; 2 setup errors only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import build, logparse, model, modes, rpc, runner, serve
from .modes import MODES, VARIANTS, Mode
from .errors import FatalError, LadderSetupError, RpcError, ServeError, UsageError
from .runner import log

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


EXPECT_VALUES = ("engaged", "inactive", "either")
SPLIT_MODES = ("none", "layer", "row", "tensor")

#: Words that are single tokens in the llama-spm vocabulary (checked against the vocab at run time), so a
#: text of N words is about N tokens and prompts of a given length can be made without a tokenizer.
WORDS = ("the of and to in is was for on that with as by at from it his an are were which be this has or "
         "had not but also first one their its new after who they have her she two been other when there all "
         "during into school time may years more most only over city some world would where later up such used "
         "many can state about national out known university then made").split()


# --- ladder file -----------------------------------------------------------------------------------------

@dataclass
class Rung:
    name: str
    shape: model.Shape
    seed: int = 1234
    devices: int = 0                    # GPUs (CUDA_VISIBLE_DEVICES first N); 0 = CPU only
    virtual_devices: int | None = None  # GGML_CUDA_DEVICES: virtual cards over the GPUs
    split_mode: str = "layer"
    gpu_layers: int | None = None       # -ngl; default 999 with devices, 0 without
    ubatch: int = 512
    batch: int = 2048
    ctx: int | None = None              # server -c; default fits the longest prompt
    ppl_ctx: int | None = None          # llama-perplexity -c; default = batch if it divides, else ubatch
    modes: list[str] = field(default_factory=lambda: ["upstream", "off"])
    reference: str = "off"
    expect_bridge: str = "engaged"
    expect_batched: str = "engaged"
    expect: dict[str, str] = field(default_factory=dict)  # per mode, overrides expect_* for that mode
    n_predict: int = 8
    n_probs: int = 4
    prompt_words: list[int] | None = None
    threads: int | None = None
    server_args: list[str] = field(default_factory=list)
    perplexity_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 1800.0
    perplexity: bool = True
    rpc_servers: list[list[str]] = field(default_factory=list)  # device lists of the rpc-* modes' servers

    @property
    def n_devices(self) -> int:
        """Devices the model is meant to be split over (virtual cards count)."""
        if self.devices <= 0 or self.split_mode == "none":
            return 0 if self.devices <= 0 else 1
        return self.virtual_devices or self.devices

    @property
    def multi_device(self) -> bool:
        return self.n_devices > 1

    def prompts_words(self) -> list[int]:
        if self.prompt_words:
            return list(self.prompt_words)
        ub = self.ubatch
        sizes = [1, 12, max(2, ub // 2), ub + 17]
        if ub <= 64:
            sizes.append(3 * ub + 5)
        return sorted(set(sizes))

    def server_ctx(self) -> int:
        if self.ctx:
            return self.ctx
        need = max(self.prompts_words()) + self.n_predict + 64
        need = int(need * 1.1)
        return max(256, (need + 255) // 256 * 256)

    def perplexity_ctx(self) -> int:
        if self.ppl_ctx:
            return self.ppl_ctx
        return self.batch if self.batch >= 16 else max(16, self.ubatch)


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


RUNG_KEYS = {f.name for f in dataclasses.fields(Rung)}


def parse_rung(d: dict[str, Any], defaults: dict[str, Any], where: str) -> Rung:
    merged = {**defaults, **d}
    unknown = set(merged) - RUNG_KEYS
    if unknown:
        raise LadderSetupError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                               fix=f"allowed keys: {', '.join(sorted(RUNG_KEYS))}")
    if "name" not in merged:
        raise LadderSetupError(f"{where}: a rung needs a name")
    if "shape" not in merged:
        raise LadderSetupError(f"{where} ({merged['name']}): a rung needs a shape")
    try:
        merged["shape"] = model.get_shape(merged["shape"])
    except FatalError as e:
        raise LadderSetupError(f"{where} ({merged['name']}): {e}") from None
    try:
        r = Rung(**merged)
    except TypeError as e:
        raise LadderSetupError(f"{where}: {e}") from None
    try:  # current names (older ones with a deprecation note, see modes.ALIASES)
        r.modes = [modes.canonical(str(m), f"{where} ({r.name})") for m in _as_list(r.modes)]
        r.reference = modes.canonical(str(r.reference), f"{where} ({r.name}) reference")
        r.expect = {modes.canonical(str(k), f"{where} ({r.name}) expect"): v for k, v in dict(r.expect).items()}
    except UsageError as e:
        raise LadderSetupError(e.what, why=e.why, fix=e.fix) from None
    other = [m for m in r.modes if MODES[m].variant not in ("patched", "upstream")]
    if other:
        raise LadderSetupError(f"{where} ({r.name}): mode(s) {', '.join(other)} need the "
                               f"{MODES[other[0]].variant} build", why="the ladder compares the patched and "
                               "upstream builds only", fix="use modes of those two builds")
    if r.reference not in r.modes:
        r.modes.insert(0, r.reference)
    if len(r.modes) < 2:
        raise LadderSetupError(f"{where} ({r.name}): a rung compares at least two modes")
    for k in ("expect_bridge", "expect_batched"):
        if getattr(r, k) not in EXPECT_VALUES:
            raise LadderSetupError(f"{where} ({r.name}): {k} must be one of {', '.join(EXPECT_VALUES)}")
    r.expect = {str(k): str(v) for k, v in dict(r.expect).items()}
    for k, val in r.expect.items():
        if k not in r.modes or val not in EXPECT_VALUES:
            raise LadderSetupError(f"{where} ({r.name}): expect.{k} = {val!r}: keys are the rung's modes, "
                                   f"values one of {', '.join(EXPECT_VALUES)}")
    if r.split_mode not in SPLIT_MODES:
        raise LadderSetupError(f"{where} ({r.name}): split_mode must be one of {', '.join(SPLIT_MODES)}")
    if r.ubatch <= 0 or r.batch <= 0 or r.ubatch > r.batch:
        raise LadderSetupError(f"{where} ({r.name}): need 0 < ubatch <= batch (got {r.ubatch}, {r.batch})")
    pc = r.perplexity_ctx()
    if not (r.batch < pc or r.batch % pc == 0):
        raise LadderSetupError(f"{where} ({r.name}): llama-perplexity needs batch < ppl_ctx or batch a multiple "
                               f"of ppl_ctx (batch {r.batch}, ppl_ctx {pc})")
    if r.server_ctx() < max(r.prompts_words()) + r.n_predict + 16:
        raise LadderSetupError(f"{where} ({r.name}): ctx {r.server_ctx()} is too small for the longest prompt")
    if any(MODES[m].uses_bridge for m in r.modes) and r.devices <= 0:
        raise LadderSetupError(f"{where} ({r.name}): bridge modes need GPUs (devices >= 1)")
    r.rpc_servers = [[str(d) for d in _as_list(x)] for x in _as_list(r.rpc_servers)]
    if any(MODES[m].rpc for m in r.modes) and not r.rpc_servers:
        raise LadderSetupError(f"{where} ({r.name}): rpc-* modes need rpc_servers (one device list per server)",
                               fix='e.g. rpc_servers = [["CPU"], ["CPU"]]')
    r.server_args = [str(a) for a in r.server_args]
    r.perplexity_args = [str(a) for a in r.perplexity_args]
    r.env = {str(k): str(v) for k, v in r.env.items()}
    return r


@dataclass
class Ladder:
    name: str
    path: Path
    backend: str
    rungs: list[Rung]
    description: str = ""
    text_seed: int = 7


def load_ladder(path: Path) -> Ladder:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LadderSetupError(f"ladder file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise LadderSetupError(f"ladder file {path} is not valid TOML", why=str(e)) from None
    known = {"name", "description", "backend", "defaults", "rung", "text_seed"}
    unknown = set(data) - known
    if unknown:
        raise LadderSetupError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = data.get("defaults", {})
    rungs_raw = data.get("rung", [])
    if not rungs_raw:
        raise LadderSetupError(f"{path}: no [[rung]] entries")
    rungs = [parse_rung(r, defaults, f"{path} rung {i + 1}") for i, r in enumerate(rungs_raw)]
    names = [r.name for r in rungs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise LadderSetupError(f"{path}: duplicate rung name(s) {', '.join(sorted(dup))}")
    backend = data.get("backend", "cpu")
    if backend not in ("cpu", "cuda"):
        raise LadderSetupError(f"{path}: backend must be cpu or cuda")
    return Ladder(name=data.get("name", Path(path).stem), path=Path(path), backend=backend, rungs=rungs,
                  description=data.get("description", ""), text_seed=int(data.get("text_seed", 7)))


# --- deterministic inputs --------------------------------------------------------------------------------

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
        sent = words[i:i + k]
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
    return {"prompt": prompt, "n_predict": rung.n_predict, "temperature": 0.0, "n_probs": rung.n_probs,
            "cache_prompt": False, "ignore_eos": True, "return_tokens": True, "seed": 1, "stream": False}


#: Response fields that are part of the result; everything else (timings, slot ids, settings echo,
#: model path) is not compared.
RESULT_KEYS = ("content", "tokens", "completion_probabilities", "tokens_predicted", "tokens_evaluated",
               "stop_type", "truncated")


def canonical_response(raw: bytes, index: int) -> bytes:
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ServeError(f"request {index}: the server answered something that is not JSON", why=str(e)) from None
    rec = {"request": index, **{k: d.get(k) for k in RESULT_KEYS}}
    if not rec["tokens"] and not rec["content"]:
        raise ServeError(f"request {index}: the server generated nothing", why=raw[:300].decode(errors="replace"))
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# --- comparison ------------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    return model.file_sha256(path)


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
    where = {"offset": offset, "token_record": rec, "chunk": rec // per_chunk,
             "position_in_chunk": first + rec % per_chunk}
    if elem < 4:
        names = ["scale", "min_log_prob"]
        k = elem // 2
        vals = [_read_at(p, base + 4 * k, "<f") for p in (ref, other)]
        where.update(where=f"record header {names[k]}", reference=vals[0], mode=vals[1])
    else:
        tok = elem - 4
        q = [_read_at(p, base + 2 * elem, "<H") for p in (ref, other)]
        hdr = [(_read_at(p, base, "<f"), _read_at(p, base + 4, "<f")) for p in (ref, other)]
        lp = [None if v is None or h[0] is None else h[1] + h[0] * v for v, h in zip(q, hdr)]
        where.update(where=f"log-prob of vocab entry {tok}", vocab_id=tok, reference=q[0], mode=q[1],
                     reference_log_prob=lp[0], mode_log_prob=lp[1])
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
    for line, text in enumerate(a):
        if pos + len(text) + 1 > offset:
            break
        pos += len(text) + 1
    out: dict[str, Any] = {"offset": offset, "request": line}
    if line >= len(a) or line >= len(b):
        out["where"] = "one response set is shorter"
        return out
    ra, rb = json.loads(a[line]), json.loads(b[line])
    ta, tb = ra.get("tokens") or [], rb.get("tokens") or []
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x != y:
            out.update(where=f"generated token {i}", reference=x, mode=y)
            return out
    pa, pb = ra.get("completion_probabilities") or [], rb.get("completion_probabilities") or []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            out["where"] = f"probabilities of generated token {i}"
            xa, yb = x.get("top_logprobs") or [], y.get("top_logprobs") or []
            for j, (u, v) in enumerate(zip(xa, yb)):
                if u != v:
                    out.update(rank=j, reference={"id": u.get("id"), "logprob": u.get("logprob")},
                               mode={"id": v.get("id"), "logprob": v.get("logprob")})
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
    res: dict[str, Any] = {"identical": off is None, "bytes_compared": n,
                           "reference_bytes": ref.stat().st_size, "mode_bytes": other.stat().st_size}
    if off is not None:
        try:
            res["first_difference"] = (describe_logits_diff if kind == "logits" else describe_responses_diff)(
                ref, other, off)
        except Exception as e:  # noqa: BLE001 - the description is a courtesy; the offset is the fact
            res["first_difference"] = {"offset": off, "where": f"(could not describe: {e})"}
    return res


# --- validity --------------------------------------------------------------------------------------------

def _state(n_engaged: int, n_inactive: int, n_procs: int) -> str:
    if n_engaged == n_procs:
        return "engaged"
    if n_inactive == n_procs:
        return "inactive"
    return "absent" if n_engaged == n_inactive == 0 else "mixed"


def validate_mode(mode: Mode, rung: Rung, logs: dict[str, logparse.LogInfo],
                  metrics: dict[str, int] | None = None) -> dict[str, Any]:
    """Check the log-line contract for one mode across its processes (server, perplexity), and the server's live
    counters on /metrics (``metrics``, when it served them)."""
    problems: list[str] = []
    notes: list[str] = []
    bridge_stats: list[dict[str, int]] = []
    batched_stats: list[dict[str, int]] = []
    for proc, info in logs.items():
        bridge_stats += info.bridge.stats
        batched_stats += info.batched.stats
    summary: dict[str, Any] = {"bridge": None, "batched": None}

    def tot(stats: list[dict[str, int]], key: str) -> int:
        return sum(s.get(key, 0) for s in stats)

    if not VARIANTS[mode.variant].patched:
        for proc, info in logs.items():
            if info.bridge.seen or info.batched.seen or info.bridge.stats or info.batched.stats:
                problems.append(f"{proc}: the upstream binary printed patch log lines: it is not an unpatched build")
    else:
        want_rejected = dict(mode.rejected)
        for proc, info in logs.items():
            for var, value in info.bridge.rejected.items():
                if want_rejected.get(var) != value:
                    problems.append(f"{proc}: selector rejected: {var}=\"{value}\"")
            for var, value in want_rejected.items():
                if info.bridge.rejected.get(var) != value:
                    problems.append(f"{proc}: {var}=\"{value}\" is invalid but the log does not report it rejected")
            if not mode.uses_bridge and info.bridge.enabled:
                problems.append(f"{proc}: bridge reported enabled in mode {mode.name} (selector 0)")
            if not mode.uses_batched and info.batched.enabled:
                problems.append(f"{proc}: batched transfers reported enabled in mode {mode.name} (selector 0)")

    if mode.uses_bridge:
        want_mode = "force" if mode.bridge == "force" else "1"
        engaged = [p for p, i in logs.items() if i.bridge.enabled]
        inactive = {p: i.bridge.inactive_reason for p, i in logs.items() if i.bridge.inactive_reason is not None}
        state = _state(len(engaged), len(inactive), len(logs))
        summary["bridge"] = {"state": state, "slots": {p: logs[p].bridge.slots for p in engaged},
                             "slot_mib": {p: logs[p].bridge.slot_mib for p in engaged},
                             "inactive": inactive, "stats": bridge_stats,
                             "boundaries": tot(bridge_stats, "boundaries")}
        expect = rung.expect.get(mode.name, rung.expect_bridge)
        if state == "engaged":
            if expect == "inactive":
                problems.append("bridge engaged but the rung expects it inactive")
            for p in engaged:
                if logs[p].bridge.mode != want_mode:
                    problems.append(f"{p}: bridge mode {logs[p].bridge.mode}, expected {want_mode}")
            if rung.multi_device:
                if not bridge_stats:
                    problems.append("no bridge stats line (GGML_CUDA_MAPPED_HOST_BRIDGE_STATS=1 was set)")
                elif tot(bridge_stats, "boundaries") <= 0:
                    problems.append("bridge counters show no boundary crossed (boundaries=0) on a multi-device rung")
            if expect == "either":
                notes.append("bridge engaged")
        elif state == "inactive" and expect in ("inactive", "either"):
            notes.append("bridge inactive as the rung expects (" + "; ".join(sorted(set(inactive.values()))) +
                         "): compared, not a bridge pass")
        else:
            missing = [p for p in logs if p not in engaged]
            why = "; ".join(f"{p}: " + (f"inactive: {inactive[p]}" if p in inactive else "no bridge line")
                            for p in missing)
            problems.append(f"bridge not engaged ({why})")

    if mode.uses_batched:
        engaged = [p for p, i in logs.items() if i.batched.enabled]
        inactive = {p: i.batched.inactive_reason for p, i in logs.items() if i.batched.inactive_reason is not None}
        state = _state(len(engaged), len(inactive), len(logs))
        summary["batched"] = {"state": state, "pool_mib": {p: logs[p].batched.pool_mib for p in engaged},
                              "inactive": inactive, "stats": batched_stats,
                              "async_uploads": tot(batched_stats, "async_uploads"),
                              "async_downloads": tot(batched_stats, "async_downloads")}
        expect = rung.expect.get(mode.name, rung.expect_batched)
        if state == "engaged":
            if expect == "inactive":
                problems.append("batched transfers engaged but the rung expects them inactive")
            if not batched_stats:
                problems.append("no batched-transfers stats line (SAM3D_BATCHED_TRANSFERS_STATS=1 was set)")
            else:
                # async_* count only what batching staged: token generation's inputs. Logits go to llama.cpp's
                # pinned output buffer, which upstream already downloads asynchronously (upstream_downloads)
                if tot(batched_stats, "async_uploads") <= 0:
                    problems.append("batched counters show no async upload (async_uploads=0)")
            if metrics is not None and mode.variant == "patched":
                live = metrics.get("batched_async_uploads_total", 0)
                summary["batched"]["metrics_async_uploads"] = live
                if live <= 0:
                    problems.append("/metrics shows no batched async upload (llamacpp:batched_async_uploads_total="
                                    f"{metrics.get('batched_async_uploads_total', 'absent')})")
            if expect == "either":
                notes.append("batched transfers engaged")
        elif state == "inactive" and expect in ("inactive", "either"):
            if tot(batched_stats, "async_uploads") or tot(batched_stats, "async_downloads"):
                problems.append("batched transfers inactive but async transfers were counted")
            notes.append("batched transfers inactive as the rung expects (" +
                         "; ".join(sorted(set(inactive.values()))) + "): compared, not a batched pass")
        else:
            missing = [p for p in logs if p not in engaged]
            why = "; ".join(f"{p}: " + (f"inactive: {inactive[p]}" if p in inactive else "no batched-transfers line")
                            for p in missing)
            problems.append(f"batched transfers not engaged ({why})")

    if rung.multi_device:
        used = {p: i.n_devices for p, i in logs.items()}
        summary["devices_used"] = used
        want = rung.n_devices
        low = {p: n for p, n in used.items() if n < want}
        if low:
            problems.append(f"the rung splits the model over {want} devices but the log shows it on fewer: " +
                            ", ".join(f"{p}: {n}" for p, n in low.items()))
    return {"ok": not problems, "problems": problems, "notes": notes, **summary}


# --- running ---------------------------------------------------------------------------------------------

@dataclass
class Binaries:
    patched: dict[str, Path]
    upstream: dict[str, Path]
    same_build: bool = False


def _dir_fingerprint(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.is_symlink():
            h.update(p.name.encode())
            h.update(model.file_sha256(p).encode())
    return h.hexdigest()


def resolve_binaries(args: argparse.Namespace, settings: Any, backend: str, needed: set[str],
                     with_rpc: bool = False) -> Binaries:
    names = ("llama-server", "llama-perplexity") + ((rpc.RPC_SERVER,) if with_rpc else ())
    found: dict[str, dict[str, Path]] = {}
    for variant in ("patched", "upstream"):
        if variant not in needed:
            continue
        override = getattr(args, f"bin_dir_{variant}", None)
        found[variant] = {}
        for name in names:
            try:
                p = build.locate(settings, variant, name, override, backend=backend)
            except FatalError as e:
                if override is not None:
                    raise LadderSetupError(f"{name} not found in --bin-dir-{variant} {override}") from None
                raise LadderSetupError(e.what, why=e.why,
                                       fix=(e.fix + ", or pass" if e.fix else "pass") + f" --bin-dir-{variant} DIR") from None
            found[variant][name] = p
    same = False
    if "patched" in found and "upstream" in found:
        dp = found["patched"]["llama-server"].resolve().parent
        du = found["upstream"]["llama-server"].resolve().parent
        same = dp == du or _dir_fingerprint(dp) == _dir_fingerprint(du)
    return Binaries(found.get("patched", {}), found.get("upstream", {}), same)


def _find_vocab(args: argparse.Namespace, settings: Any, bins: Binaries) -> Path:
    if getattr(args, "vocab", None):
        p = Path(args.vocab)
        if not p.is_file():
            raise LadderSetupError(f"--vocab {p} not found")
        return p
    roots: list[Path] = []
    for d in list(bins.patched.values())[:1] + list(bins.upstream.values())[:1]:
        roots += list(d.resolve().parents)[:5]
    found = model.find_vocab(*roots)
    if found is None:
        cache = getattr(settings, "cache_dir", None)
        found = model.find_vocab(cache) if cache else None
    if found is None:
        raise LadderSetupError(f"cannot find the upstream vocabulary models/{model.VOCAB_FILE}",
                               fix="pass --vocab PATH or set GGML_BRIDGE_VOCAB (it is in the upstream tree's models/)")
    return found


def _device_env(rung: Rung) -> dict[str, str]:
    env: dict[str, str] = {}
    if rung.devices > 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(rung.devices)]
        if len(ids) < rung.devices:
            raise LadderSetupError(f"rung {rung.name} needs {rung.devices} GPUs; CUDA_VISIBLE_DEVICES={visible}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:rung.devices])
        if rung.virtual_devices:
            env[modes.CUDA_DEVICES] = str(rung.virtual_devices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _common_args(rung: Rung, threads: int) -> list[str]:
    ngl = rung.gpu_layers if rung.gpu_layers is not None else (999 if rung.devices > 0 else 0)
    # -lv 4: the contract's INFO lines (bridge enabled/stats, "using device") are dropped below it
    a = ["-lv", str(serve.CONTRACT_VERBOSITY), "-t", str(threads), "-ngl", str(ngl), "-b", str(rung.batch),
         "-ub", str(rung.ubatch)]
    if rung.devices > 0:
        a += ["-sm", rung.split_mode]
    return a


@dataclass
class ModeRun:
    mode: str
    wall_s: float = 0.0
    responses: Path | None = None
    logits: Path | None = None
    logs: dict[str, logparse.LogInfo] = field(default_factory=dict)
    metrics: dict[str, int] | None = None  # the server's transfer counters on /metrics after the requests
    error: str | None = None
    rpc_servers: dict[str, logparse.RpcServerInfo] = field(default_factory=dict)  # by endpoint, rpc-* modes


def run_mode(mode: Mode, rung: Rung, bins: Binaries, model_path: Path, text_path: Path, prompts: list[str],
             out: Path, threads: int, startup_timeout: float) -> ModeRun:
    out.mkdir(parents=True, exist_ok=True)
    b = bins.patched if mode.variant == "patched" else bins.upstream
    server_bin, ppl_bin = b["llama-server"], b["llama-perplexity"]
    rung = dataclasses.replace(rung, devices=mode.devices, virtual_devices=None) if mode.devices else rung
    env = {**_device_env(rung), **mode.env(), **rung.env}
    lib_dir = str(server_bin.resolve().parent)
    env["LD_LIBRARY_PATH"] = lib_dir + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    res = ModeRun(mode.name)
    t0 = time.monotonic()
    topo = None
    if mode.rpc:  # the GPUs belong to the rpc-servers; llama-server and llama-perplexity get none
        topo = rpc.Topology([rpc.LocalRpcServer(b[rpc.RPC_SERVER], devices=d, env=env, threads=threads,
                                                log_file=out / f"rpc-server-{i}.log")
                             for i, d in enumerate(rung.rpc_servers)])
        env = {**env, "CUDA_VISIBLE_DEVICES": ""}
    extra = [*topo.server_args(), "-ngl", "999"] if topo else []
    try:
        if topo:
            topo.start(rpc.expected_version(server_bin))
        port = serve.free_port()
        sargs = ["-m", str(model_path), "--host", "127.0.0.1", "--port", str(port), "-c", str(rung.server_ctx()),
                 "-np", "1", "--no-webui", "--metrics", *_common_args(rung, threads), *extra, *rung.server_args]
        slog = out / "server.log"
        slog.unlink(missing_ok=True)
        srv = serve.Server(server_bin, sargs, env=env, log_file=slog, startup_timeout=startup_timeout)
        srv.start()
        try:
            resp = out / "responses.jsonl"
            with open(resp, "wb") as fh:
                for i, p in enumerate(prompts):
                    fh.write(canonical_response(srv.post("/completion", request_payload(p, rung),
                                                         timeout=rung.timeout), i))
            res.responses = resp
            res.metrics = srv.metrics()
        finally:
            rc = srv.stop()
        res.logs["server"] = srv.info()
        if rc not in (0, None):
            raise ServeError(f"llama-server exited with status {rc} when stopped",
                             why="last lines:\n    " + "\n    ".join(srv.tail(10)))
        if rung.perplexity:
            logits = out / "logits.bin"
            logits.unlink(missing_ok=True)
            plog = out / "perplexity.log"
            plog.unlink(missing_ok=True)
            pc = rung.perplexity_ctx()
            pargs = [ppl_bin, "-m", model_path, "-f", text_path, "-c", str(pc),
                     *_common_args(rung, threads), *extra, "--kl-divergence-base", logits, *rung.perplexity_args]
            r = runner.run(pargs, env=env, log_file=plog, error=ServeError, timeout=rung.timeout,
                           what=f"llama-perplexity failed in mode {mode.name}")
            res.logs["perplexity"] = logparse.parse(plog.read_text(errors="replace"))
            if not logits.is_file() or logits.stat().st_size <= 20:
                raise ServeError(f"llama-perplexity wrote no logits in mode {mode.name}",
                                 why="last lines:\n    " + r.stdout[-2000:].replace("\n", "\n    "))
            res.logits = logits
        if topo and mode.variant == "patched":
            topo.counters()  # one counters line per server, parsed below
    except FatalError as e:
        try:
            rpc.raise_if_dead(topo, f"in mode {mode.name}")
            res.error = str(e)
        except RpcError as dead:
            res.error = f"{dead} ({e})"
    finally:
        if topo:
            topo.stop()
            res.rpc_servers = {str(s.endpoint): s.info() for s in topo.local}
    res.wall_s = time.monotonic() - t0
    return res


def validate_rpc(mode: Mode, servers: dict[str, logparse.RpcServerInfo]) -> dict[str, Any]:
    """The rpc-servers of an rpc-* mode: each computed graphs (counters), and in rpc-bridge each one owning
    two or more GPUs carried copies through the bridge."""
    problems: list[str] = []
    notes: list[str] = []
    summary: dict[str, Any] = {}
    for ep, info in servers.items():
        gpus = [d for d in info.devices if d.startswith("CUDA")]
        c = info.latest
        summary[ep] = {"devices": info.devices, "counters": c, "bridge_enabled": info.bridge.enabled}
        if not VARIANTS[mode.variant].patched:
            if info.state is not None or info.bridge.seen:
                problems.append(f"rpc-server {ep}: the upstream binary printed patch lines")
            continue
        if info.state is None:
            problems.append(f"rpc-server {ep}: no 'ggml_bridge_rpc: state' line (not a patch-0006 build)")
            continue
        if not c:
            problems.append(f"rpc-server {ep}: no counters line after SIGUSR1")
            continue
        if c.get("rpc_graph_compute", 0) <= 0:
            problems.append(f"rpc-server {ep}: computed no graph (rpc_graph_compute=0): the model did not use it")
        if not mode.uses_bridge:
            if info.bridge.enabled:
                problems.append(f"rpc-server {ep}: bridge enabled in mode {mode.name} (selector 0)")
        elif len(gpus) > 1:
            if not info.bridge.enabled:
                problems.append(f"rpc-server {ep}: bridge not engaged on its {len(gpus)} GPUs ("
                                + (f"inactive: {info.bridge.inactive_reason}" if info.bridge.inactive_reason
                                   else "no bridge line") + ")")
            elif not c.get("bridge"):
                problems.append(f"rpc-server {ep}: the CUDA registry exports no bridge counters "
                                "(0001 without ggml_backend_cuda_mapped_host_bridge_counters)")
            elif c.get("bridge_boundaries", 0) <= 0:
                problems.append(f"rpc-server {ep}: bridge engaged but bridge_boundaries=0 "
                                f"(rpc_copy_tensor={c.get('rpc_copy_tensor', 0)})")
        else:
            notes.append(f"rpc-server {ep}: {len(gpus) or 'no'} GPU, nothing for the bridge inside it")
    return {"ok": not problems, "problems": problems, "notes": notes, "servers": summary}


def _artifact(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def run_rung(rung: Rung, ladder: Ladder, bins: Binaries, vocab: Path, cache_dir: Path, report_dir: Path,
             threads: int, startup_timeout: float, keep_logits: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    rep: dict[str, Any] = {
        "name": rung.name, "shape": dataclasses.asdict(rung.shape), "seed": rung.seed,
        "devices": rung.devices, "virtual_devices": rung.virtual_devices, "split_mode": rung.split_mode,
        "multi_device": rung.multi_device, "ubatch": rung.ubatch, "batch": rung.batch, "ctx": rung.server_ctx(),
        "ppl_ctx": rung.perplexity_ctx(), "reference": rung.reference, "modes": {}, "status": "pass",
        "problems": [],
    }
    out = report_dir / rung.name
    try:
        vt = model.load_vocab(vocab)
        rep["n_params"] = rung.shape.n_params(len(vt.tokens))
        rep["boundary_mib_f32"] = rung.shape.n_embd * rung.ubatch * 4 / (1 << 20)
        mpath = model.ensure_model(cache_dir, rung.shape, rung.seed, vocab)
        rep["model"] = str(mpath)
        out.mkdir(parents=True, exist_ok=True)
        text = out / "text.txt"
        pc = rung.perplexity_ctx()
        text.write_text(make_text(2 * pc + pc // 2 + 64, ladder.text_seed, vt.tokens), encoding="utf-8")
        prompts = make_prompts(rung, ladder.text_seed, vt.tokens)
        rep["prompt_words"] = rung.prompts_words()
    except FatalError as e:
        rep.update(status="error", error=str(e), wall_s=time.monotonic() - t0)
        return rep

    runs: dict[str, ModeRun] = {}
    order = [rung.reference] + [m for m in rung.modes if m != rung.reference]
    for name in order:
        mode = MODES[name]
        runner.log(f"    {rung.name}: mode {name}")
        mr = run_mode(mode, rung, bins, mpath, text, prompts, out / name, threads, startup_timeout)
        runs[name] = mr
        entry: dict[str, Any] = {"wall_s": round(mr.wall_s, 2), "variant": mode.variant,
                                 "selectors": mode.env(),
                                 "responses": _artifact(mr.responses), "logits": _artifact(mr.logits)}
        if mr.error:
            entry["error"] = mr.error
            rep["status"] = "error"
            rep["problems"].append(f"{name}: {mr.error}")
        else:
            front = dataclasses.replace(mode, bridge="off" if mode.bridge else None) if mode.rpc else mode
            v = validate_mode(front, dataclasses.replace(rung, devices=mode.devices, virtual_devices=None)
                              if mode.devices else rung, mr.logs, mr.metrics)
            if mode.rpc:
                r = validate_rpc(mode, mr.rpc_servers)
                v.update(ok=v["ok"] and r["ok"], problems=v["problems"] + r["problems"],
                         notes=v["notes"] + r["notes"], rpc=r["servers"])
            entry["validity"] = v
            if not v["ok"]:
                if rep["status"] == "pass":
                    rep["status"] = "invalid"
                rep["problems"] += [f"{name}: {p}" for p in v["problems"]]
        rep["modes"][name] = entry
        if name == rung.reference and mr.error:
            break  # nothing to compare against

    ref = runs.get(rung.reference)
    if ref is not None and not ref.error:
        for name, mr in runs.items():
            if name == rung.reference or mr.error:
                continue
            cmp: dict[str, Any] = {}
            for kind, a, b in (("responses", ref.responses, mr.responses), ("logits", ref.logits, mr.logits)):
                if a is None or b is None:
                    continue
                c = compare_files(a, b, kind)
                cmp[kind] = c
                if not c["identical"]:
                    rep["status"] = "mismatch"
                    fd = c.get("first_difference", {})
                    rep["problems"].append(f"{name}: {kind} differ from {rung.reference} at byte {fd.get('offset')}"
                                           f" ({fd.get('where')})")
            rep["modes"][name]["compare"] = cmp

    if not keep_logits and rep["status"] in ("pass", "invalid"):
        for mr in runs.values():
            if mr.logits and mr.logits.exists():
                mr.logits.unlink()
    rep["wall_s"] = round(time.monotonic() - t0, 2)
    return rep


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def progress_line(i: int, n: int, rep: dict[str, Any]) -> str:
    ref = rep["reference"]
    others = [m for m in rep["modes"] if m != ref]
    total = sum(c.get("bytes_compared", 0) for m in others for c in rep["modes"][m].get("compare", {}).values())
    verdict = {"pass": "PASS", "mismatch": "MISMATCH", "invalid": "INVALID", "error": "ERROR"}[rep["status"]]
    extra = ""
    notes = [n for m in rep["modes"].values() for n in (m.get("validity") or {}).get("notes", [])]
    if notes:
        extra = f" [{notes[0]}]"
    if rep["problems"]:
        extra += f" -- {rep['problems'][0]}"
    return (f"[{i}/{n}] {rep['name']}: {ref} vs {', '.join(others) or '-'}: {verdict}, "
            f"{_human(total)} compared, {rep.get('wall_s', 0):.1f}s{extra}")


def markdown_report(rep: dict[str, Any]) -> str:
    L = [f"# Ladder `{rep['ladder']}`: {rep['status'].upper()}", "",
         f"- file: `{rep['file']}`", f"- started: {rep['started']}", f"- wall time: {rep['wall_s']:.1f}s",
         f"- patched binaries: `{rep['binaries'].get('patched')}`",
         f"- upstream binaries: `{rep['binaries'].get('upstream')}`"]
    if rep["binaries"].get("same_build"):
        L.append("- **warning: patched and upstream binaries are the same build; upstream-vs-patched "
                 "comparisons prove nothing about the patches**")
    L += ["", "| rung | shape | devices | ub/b | reference | status | bytes compared | wall |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rep["rungs"]:
        dev = "cpu" if not r["devices"] else f"{r['devices']} GPU" + (f" as {r['virtual_devices']} cards"
                                                                      if r.get("virtual_devices") else "")
        total = sum(c.get("bytes_compared", 0) for m in r["modes"].values() for c in m.get("compare", {}).values())
        L.append(f"| {r['name']} | {r['shape']['name']} ({r['shape']['n_embd']}x{r['shape']['n_layer']}, "
                 f"{r['shape']['dtype']}) | {dev} {r['split_mode'] if r['devices'] else ''} | "
                 f"{r['ubatch']}/{r['batch']} | {r['reference']} | {r['status']} | {_human(total)} | "
                 f"{r.get('wall_s', 0):.1f}s |")
    for r in rep["rungs"]:
        L += ["", f"## {r['name']}: {r['status']}", ""]
        if r.get("error"):
            L += [f"setup error: {r['error']}", ""]
        if r.get("n_params"):
            L.append(f"model: {r['n_params'] / 1e6:.1f}M params, seed {r['seed']}, boundary activation "
                     f"{r['boundary_mib_f32']:.2f} MiB f32 (n_embd x ubatch); server ctx {r['ctx']}, "
                     f"perplexity ctx {r['ppl_ctx']}")
            L.append("")
        L += ["| mode | responses sha256 | logits sha256 | vs reference | mechanism | wall |",
              "|---|---|---|---|---|---|"]
        for name, m in r["modes"].items():
            rs = (m.get("responses") or {}).get("sha256", "-")[:16]
            ls = (m.get("logits") or {}).get("sha256", "-")[:16]
            if name == r["reference"]:
                vs = "reference"
            elif "compare" in m:
                parts = []
                for kind, c in m["compare"].items():
                    if c["identical"]:
                        parts.append(f"{kind} identical ({_human(c['bytes_compared'])})")
                    else:
                        fd = c.get("first_difference", {})
                        parts.append(f"{kind} DIFFER at byte {fd.get('offset')}: {fd.get('where')} "
                                     f"ref={fd.get('reference')} mode={fd.get('mode')}")
                vs = "; ".join(parts)
            else:
                vs = "not compared"
            v = m.get("validity") or {}
            mech = []
            if v.get("bridge"):
                bb = v["bridge"]
                slots = sorted(set(bb["slots"].values()))
                mech.append(f"bridge {bb['state']}" + (f", {slots[0]} slots" if slots else "") +
                            f", boundaries={bb['boundaries']}")
            if v.get("batched"):
                tb = v["batched"]
                mech.append(f"batched {tb['state']}, async up/down={tb['async_uploads']}/{tb['async_downloads']}")
            for ep, srv in (v.get("rpc") or {}).items():
                c = srv["counters"]
                mech.append(f"rpc-server {ep} ({','.join(srv['devices'])}): graphs={c.get('rpc_graph_compute', '-')}"
                            f" copy_tensor={c.get('rpc_copy_tensor', '-')} set/get MiB="
                            f"{c.get('rpc_set_tensor_bytes', 0) / 2**20:.1f}/{c.get('rpc_get_tensor_bytes', 0) / 2**20:.1f}"
                            + (f" bridge={'on' if srv['bridge_enabled'] else 'off'} "
                               f"boundaries={c.get('bridge_boundaries', '-')}" if c.get("bridge") else ""))
            if m.get("error"):
                mech.append(f"ERROR: {m['error'].splitlines()[0]}")
            mech += v.get("problems", [])
            L.append(f"| {name} | `{rs}` | `{ls}` | {vs} | {'; '.join(mech) or '-'} | {m['wall_s']:.1f}s |")
        if r["problems"]:
            L += ["", "Problems:", ""] + [f"- {p}" for p in r["problems"]]
    return "\n".join(L) + "\n"


# --- CLI -------------------------------------------------------------------------------------------------

def default_ladder(settings: Any) -> Path:
    backend = getattr(getattr(settings, "build", None), "backend", "cpu")
    name = "cuda.toml" if backend == "cuda" else "cpu.toml"
    for root in (getattr(settings, "project_dir", None), Path(__file__).resolve().parent.parent,
                 Path(__file__).resolve().parent / "_data"):
        if root is not None and (Path(root) / "ladders" / name).is_file():
            return Path(root) / "ladders" / name
    raise LadderSetupError(f"no ladders/{name} found", fix="pass --ladder FILE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ladder", type=Path, default=None, metavar="FILE",
                        help="ladder TOML (default: ladders/cpu.toml, or ladders/cuda.toml when the backend is cuda)")
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="report directory (default: <cache>/reports/<ladder>-<time>)")
    parser.add_argument("--bin-dir-patched", type=Path, default=None, metavar="DIR",
                        help="directory with the patched llama-server and llama-perplexity (skips the build stage)")
    parser.add_argument("--bin-dir-upstream", type=Path, default=None, metavar="DIR",
                        help="directory with the unpatched llama-server and llama-perplexity")
    parser.add_argument("--rung", action="append", default=None, metavar="NAME",
                        help="run only this rung (repeatable)")
    parser.add_argument("--vocab", type=Path, default=None, metavar="GGUF",
                        help=f"vocabulary GGUF (default: models/{model.VOCAB_FILE} of the upstream tree)")
    parser.add_argument("--threads", type=int, default=None, help="-t for every process (default: all cores)")
    parser.add_argument("--startup-timeout", type=float, default=900.0, metavar="S",
                        help="seconds to wait for each llama-server to become ready (default: 900)")
    parser.add_argument("--keep-logits", action="store_true",
                        help="keep the logits dumps of passing rungs (they are kept on mismatch)")
    parser.add_argument("--allow-same-build", action="store_true",
                        help="allow identical patched and upstream binaries (development only: such a "
                             "comparison proves nothing about the patches)")


def run(args: argparse.Namespace, settings: Any) -> int:
    ladder = load_ladder(args.ladder or default_ladder(settings))
    rungs = ladder.rungs
    if args.rung:
        unknown = set(args.rung) - {r.name for r in rungs}
        if unknown:
            raise LadderSetupError(f"no rung named {', '.join(sorted(unknown))} in {ladder.path}",
                                   fix=f"rungs: {', '.join(r.name for r in rungs)}")
        rungs = [r for r in rungs if r.name in args.rung]
    needed = {MODES[m].variant for r in rungs for m in r.modes}
    bins = resolve_binaries(args, settings, ladder.backend, needed, any(MODES[m].rpc for r in rungs for m in r.modes))
    if bins.same_build and "upstream" in needed and "patched" in needed and not args.allow_same_build:
        raise LadderSetupError("the patched and upstream binaries are the same build",
                               why="comparing a build with itself proves nothing about the patches",
                               fix="point --bin-dir-upstream at an unpatched build (or pass --allow-same-build "
                                   "for development)")
    vocab = _find_vocab(args, settings, bins)
    cache_dir = Path(getattr(settings, "cache_dir"))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report_dir = Path(args.report) if args.report else cache_dir / "reports" / f"{ladder.name}-{stamp}"
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LadderSetupError(f"cannot create report directory {report_dir}", why=str(e)) from None
    threads = args.threads or os.cpu_count() or 1
    rep: dict[str, Any] = {
        "ladder": ladder.name, "file": str(ladder.path), "backend": ladder.backend, "started": stamp,
        "vocab": str(vocab), "threads": threads,
        "binaries": {"patched": str(next(iter(bins.patched.values())).parent) if bins.patched else None,
                     "upstream": str(next(iter(bins.upstream.values())).parent) if bins.upstream else None,
                     "same_build": bins.same_build},
        "rungs": [],
    }
    log(f"==> ladder {ladder.name}: {len(rungs)} rung(s) from {ladder.path}; report in {report_dir}")
    t0 = time.monotonic()
    for i, rung in enumerate(rungs, 1):
        r = run_rung(rung, ladder, bins, vocab, cache_dir, report_dir, threads, args.startup_timeout,
                     args.keep_logits)
        rep["rungs"].append(r)
        log(progress_line(i, len(rungs), r))
        _write_reports(rep, report_dir, time.monotonic() - t0)  # partial report after every rung
    statuses = [r["status"] for r in rep["rungs"]]
    if any(s in ("mismatch", "invalid") for s in statuses):
        rep["status"], rc = "fail", 1
    elif "error" in statuses:
        rep["status"], rc = "error", 2
    else:
        rep["status"], rc = "pass", 0
    _write_reports(rep, report_dir, time.monotonic() - t0)
    log(f"==> ladder {ladder.name}: {rep['status'].upper()} "
        f"({statuses.count('pass')}/{len(statuses)} rungs passed) in {rep['wall_s']:.1f}s")
    if bins.same_build and "upstream" in needed:
        log("    warning: patched and upstream binaries are the same build (--allow-same-build): the upstream "
            "comparisons prove nothing about the patches")
    print(report_dir / "report.md")
    return rc


def _write_reports(rep: dict[str, Any], report_dir: Path, wall: float) -> None:
    rep["wall_s"] = round(wall, 2)
    rep.setdefault("status", "running")
    (report_dir / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n", encoding="utf-8")
    (report_dir / "report.md").write_text(markdown_report(rep), encoding="utf-8")
