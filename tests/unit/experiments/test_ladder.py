"""ladder: file parsing, validity rules, byte comparison, and whole ladders against fake tools."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from ggml_bridge.experiments import model, tensor_split
from ggml_bridge.experiments.ladder import artifact, diff, inputs, kinds, orchestrate, registry, schema, validity
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import LadderSetupError, UsageError
from ggml_bridge.runtime import logparse, mechanisms, modes

from helpers import REPO_ROOT, ladder_options, make_vocab, real_vocab, write_fake_bin, write_ladder

MICRO = 'shape = { name = "micro", n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 64, n_ctx_train = 512 }'


# --- ladder files -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO_ROOT / "ladders").glob("*.toml")))
def test_shipped_ladders_parse(name):
    lad = schema.load_ladder(REPO_ROOT / "ladders" / name)
    assert lad.rungs
    for r in lad.rungs:
        assert r.reference in r.modes and len(r.modes) >= 2
        assert max(r.prompts_words()) > r.ubatch  # at least one prompt longer than the ubatch
        assert r.server_ctx() >= max(r.prompts_words()) + r.n_predict


def test_cpu_ladder_is_upstream_vs_off_and_never_bridges():
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cpu.toml")
    assert lad.backend == "cpu"
    for r in lad.rungs:
        if r.split_mode == "tensor":  # over two CPU rpc-servers: upstream's servers against the patched ones
            assert r.modes == ["rpc-upstream", "rpc-off"] and r.n_devices == 2 and r.devices == 0
            continue
        assert r.reference == "upstream" and "off" in r.modes and r.devices == 0
        assert not any(modes.MODES[m].uses_bridge for m in r.modes)
        if any(modes.MODES[m].uses_batched for m in r.modes):
            assert r.expect_batched == "inactive"
    assert min(r.ubatch for r in lad.rungs) == 1
    assert sum(r.split_mode == "tensor" for r in lad.rungs) == 1


def test_tensor_ladder_covers_devices_all_reduces_and_mechanisms():
    """ladders/cuda-tensor.toml: 2, 3, 4 and 6 virtual devices; internal (default BF16 and F32), none and the
    default; bridge off / auto / force and batching; every shape one -sm tensor splits over its devices."""
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda-tensor.toml")
    assert all(r.split_mode == "tensor" and r.devices == 1 for r in lad.rungs)
    assert {r.virtual_devices for r in lad.rungs} == {2, 3, 4, 6}
    paths = {schema.effective_allreduce(r, r.reference) for r in lad.rungs}
    assert paths == {"internal", "none", None}
    assert any(r.env.get("GGML_CUDA_AR_BF16_THRESHOLD") == "0" for r in lad.rungs)
    for n in (2, 3, 4, 6):
        (r,) = [r for r in lad.rungs if r.virtual_devices == n and r.name.startswith(f"{n}virt-tensor-none")]
        assert {"tensor-upstream", "tensor-bridge", "tensor-bridge-force", "tensor-batched"} <= set(r.modes)
        assert r.expect["tensor-bridge"] == "inactive", "auto leaves virtual devices of one GPU to upstream"
    for r in lad.rungs:
        assert tensor_split.check(r.shape, r.n_devices).ok, r.name


def test_a_tensor_rung_refuses_a_shape_it_cannot_split_and_mixed_all_reduces(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'backend = "cuda"\n[[rung]]\nname = "x"\nshape = "small"\ndevices = 1\nvirtual_devices = 2\n'
        'split_mode = "tensor"\nmodes = ["tensor-off", "tensor-upstream"]\nreference = "tensor-off"\n'
    )
    with pytest.raises(LadderSetupError, match="head size 32"):
        schema.load_ladder(bad)
    bad.write_text(
        'backend = "cuda"\n[[rung]]\nname = "x"\nshape = "tensor-small"\ndevices = 1\nvirtual_devices = 2\n'
        'split_mode = "tensor"\nmodes = ["tensor-off", "tensor-upstream-internal"]\nreference = "tensor-off"\n'
    )
    with pytest.raises(LadderSetupError, match="different all-reduces"):
        schema.load_ladder(bad)
    bad.write_text(
        'backend = "cuda"\n[[rung]]\nname = "x"\nshape = "tensor-small"\ndevices = 1\nvirtual_devices = 2\n'
        'allreduce = "internal"\nmodes = ["off", "upstream"]\n'
    )
    with pytest.raises(LadderSetupError, match="split_mode"):
        schema.load_ladder(bad)
    # the rung's env reaches the processes last: it decides the all-reduce (and the rounding) of every mode
    bad.write_text(
        'backend = "cuda"\n[[rung]]\nname = "x"\nshape = "tensor-small"\ndevices = 1\nvirtual_devices = 2\n'
        'split_mode = "tensor"\nmodes = ["tensor-off", "tensor-upstream-internal"]\nreference = "tensor-off"\n'
        'env = { GGML_CUDA_ALLREDUCE = "internal" }\n'
    )
    (r,) = schema.load_ladder(bad).rungs
    assert {schema.effective_allreduce(r, m) for m in r.modes} == {"internal"}


def test_cuda_ladder_covers_the_rigs_and_boundary_sizes():
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda.toml")
    rigs = {(r.devices, r.virtual_devices) for r in lad.rungs}
    assert {(1, None), (2, None), (2, 6)} <= rigs
    sizes = [r.shape.n_embd * r.ubatch * 4 for r in lad.rungs if r.multi_device]
    assert min(sizes) <= 256 and max(sizes) >= 128 << 20
    assert any(s == 64 << 20 for s in sizes)
    for r in lad.rungs:
        if r.multi_device and not r.rpc_servers:  # the RPC rungs: tests/unit/runtime/test_rpc.py
            assert {"bridge", "bridge-force", "batched", "bridge-force-batched", "upstream"} <= set(r.modes)


@pytest.mark.parametrize(
    "body,match",
    [
        ("[[rung]]\nname='a'\nshape='tiny'\nmodes=['off','nope']\n", "unknown mode"),
        ("[[rung]]\nname='a'\nshape='tiny'\nbogus=1\n", "unknown key"),
        ("[[rung]]\nname='a'\nshape='huge'\n", "unknown model shape"),
        ("[[rung]]\nname='a'\nshape='tiny'\nubatch=64\nbatch=32\n", "ubatch <= batch"),
        ("[[rung]]\nname='a'\nshape='tiny'\nsplit_mode='diagonal'\ndevices=2\n", "split_mode"),
        ("[[rung]]\nname='a'\nshape='tiny'\nmodes=['off','bridge']\n", "need GPUs"),
        ("[[rung]]\nname='a'\nshape='tiny'\nbatch=96\nubatch=32\nppl_ctx=64\n", "multiple"),
        ("[[rung]]\nname='a'\nshape='tiny'\n[[rung]]\nname='a'\nshape='tiny'\n", "duplicate"),
        ("name='x'\n", "no \\[\\[rung\\]\\]"),
        ("[[rung]\n", "not valid TOML"),
    ],
)
def test_bad_ladder_files(tmp_path, body, match):
    with pytest.raises(LadderSetupError, match=match):
        schema.load_ladder(write_ladder(tmp_path / "l.toml", body))


def test_reference_is_added_and_inline_shape(tmp_path):
    lad = schema.load_ladder(write_ladder(tmp_path / "l.toml", f"[[rung]]\nname='a'\n{MICRO}\nmodes=['batched']\n"))
    r = lad.rungs[0]
    assert r.modes == ["off", "batched"] and r.shape.n_embd == 32


def test_a_rungs_boolean_keys_set_its_kinds(tmp_path):
    """perplexity, rpc_front_gpu and require_boundaries are written as booleans and read as what the rung does: the
    artifacts it skips, where an rpc mode's front runs, what a bridge mode must show of its boundaries."""
    body = "[[rung]]\nname='a'\nshape='tiny'\ndevices=1\nmodes=['off','rpc-off']\nrpc_servers=[['CPU']]\n"
    (r,) = schema.load_ladder(write_ladder(tmp_path / "l.toml", body)).rungs
    assert (r.skips, r.rpc_front, r.boundaries) == (frozenset(), kinds.RpcFront.BARE, kinds.Boundaries.REQUIRED)
    switched = body + "perplexity=false\nrpc_front_gpu=true\nrequire_boundaries=false\n"
    (r,) = schema.load_ladder(write_ladder(tmp_path / "l.toml", switched)).rungs
    assert (r.skips, r.rpc_front, r.boundaries) == ({"logits"}, kinds.RpcFront.GPU, kinds.Boundaries.COUNTED)
    with pytest.raises(LadderSetupError, match="rpc_front_gpu = 'yes' is not"):
        schema.load_ladder(write_ladder(tmp_path / "l.toml", body + "rpc_front_gpu='yes'\n"))
    with pytest.raises(LadderSetupError, match="unknown key.*rpc_front"):  # the kinds are not keys of the file
        schema.load_ladder(write_ladder(tmp_path / "l.toml", body + "rpc_front='gpu'\n"))


# --- inputs -------------------------------------------------------------------------------------------


def test_text_and_prompts_are_deterministic():
    a = inputs.make_text(500, 7)
    assert a == inputs.make_text(500, 7) and a != inputs.make_text(500, 8)
    assert len(a.split()) == 500
    r = schema.Rung("r", model.get_shape("tiny"), ubatch=32, batch=64)
    p = inputs.make_prompts(r, 7, None)
    assert p == inputs.make_prompts(r, 7, None)
    assert max(len(x.split()) for x in p) > 32 and min(len(x.split()) for x in p) == 1


def test_words_are_single_tokens_in_the_upstream_vocab():
    v = real_vocab()
    if v is None:
        pytest.skip("no upstream vocab GGUF")
    toks = set(model.load_vocab(v).tokens)
    missing = [w for w in inputs.WORDS if "\u2581" + w not in toks]
    assert not missing


# --- comparison ---------------------------------------------------------------------------------------


def logits_file(path: Path, n_ctx=8, n_vocab=5, flip=None) -> Path:
    nv = 2 * ((n_vocab + 1) // 2) + 4
    recs = 2 * (n_ctx - 1 - n_ctx // 2)
    b = bytearray(
        b"_logits_" + struct.pack("<iii", n_ctx, n_vocab, 2) + struct.pack(f"<{2 * n_ctx}i", *range(2 * n_ctx))
    )
    for r in range(recs):
        b += struct.pack("<ff", 0.5, -3.0) + struct.pack(f"<{nv - 4}H", *[(r * 7 + i) % 65536 for i in range(nv - 4)])
    if flip is not None:
        b[flip] ^= 0x01
    path.write_bytes(bytes(b))
    return path


def test_first_difference(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.write_bytes(b"x" * 5000)
    b.write_bytes(b"x" * 5000)
    assert diff.first_difference(a, b, block=1024) == (None, 5000)
    b.write_bytes(b"x" * 3000 + b"y" + b"x" * 1999)
    assert diff.first_difference(a, b, block=1024) == (3000, 3000)
    b.write_bytes(b"x" * 4000)
    assert diff.first_difference(a, b, block=1024) == (4000, 4000)


def compared(ref, other, kind):
    """Two files of the artifact ``kind`` compared byte for byte, as the report writes it."""
    return artifact.compare(registry.ARTIFACTS[kind], ref, other).as_json()


def test_describe_logits_difference(tmp_path):
    n_ctx, n_vocab = 8, 5
    tok_end = 20 + 4 * 2 * n_ctx
    nv = 2 * ((n_vocab + 1) // 2) + 4
    ref = logits_file(tmp_path / "ref", n_ctx, n_vocab)
    # vocab entry 2 of record 3
    off = tok_end + 3 * 2 * nv + 2 * (4 + 2)
    other = logits_file(tmp_path / "o", n_ctx, n_vocab, flip=off)
    c = compared(ref, other, "logits")
    assert not c["identical"] and c["bytes_compared"] == off
    d = c["first_difference"]
    assert d["token_record"] == 3 and d["vocab_id"] == 2 and d["chunk"] == 1
    assert d["reference"] == (3 * 7 + 2) and d["mode"] == (3 * 7 + 2) ^ 1
    # a record header float
    other = logits_file(tmp_path / "o2", n_ctx, n_vocab, flip=tok_end + 2 * nv + 1)
    d = compared(ref, other, "logits")["first_difference"]
    assert d["where"] == "record header scale" and d["reference"] == 0.5 and d["mode"] != 0.5
    # token ids
    other = logits_file(tmp_path / "o3", n_ctx, n_vocab, flip=20 + 4 * 5)
    d = compared(ref, other, "logits")["first_difference"]
    assert d["where"] == "token id 5"
    assert compared(ref, logits_file(tmp_path / "same", n_ctx, n_vocab), "logits")["identical"]


def test_describe_responses_difference(tmp_path):
    def rec(i, toks, lps):
        return inputs.canonical_response(
            json.dumps(
                {
                    "content": "x",
                    "tokens": toks,
                    "tokens_predicted": len(toks),
                    "timings": {"t": i * 1.5},
                    "completion_probabilities": [
                        {"id": t, "logprob": lv, "top_logprobs": [{"id": t, "logprob": lv}]}
                        for t, lv in zip(toks, lps, strict=False)
                    ],
                }
            ).encode(),
            i,
        )

    a = tmp_path / "a"
    b = tmp_path / "b"
    a.write_bytes(rec(0, [1, 2], [-1.0, -2.0]) + rec(1, [3, 4], [-1.0, -2.0]))
    b.write_bytes(rec(0, [1, 2], [-1.0, -2.0]) + rec(1, [3, 4], [-1.0, -2.0000001]))
    c = compared(a, b, "responses")
    assert not c["identical"]
    d = c["first_difference"]
    assert d["request"] == 1 and d["where"] == "probabilities of generated token 1"
    assert d["reference"]["logprob"] == -2.0 and d["mode"]["logprob"] == -2.0000001
    b.write_bytes(rec(0, [1, 5], [-1.0, -2.0]) + rec(1, [3, 4], [-1.0, -2.0]))
    d = compared(a, b, "responses")["first_difference"]
    assert d["request"] == 0 and d["where"] == "generated token 1" and d["mode"] == 5
    # timings are not part of the record
    assert b"timings" not in rec(0, [1], [-1.0])


# --- validity -----------------------------------------------------------------------------------------

BR_EN = "ggml_cuda_mapped_host_bridge: enabled (mode {m}), 4 slots x 64 MiB mapped pinned host memory\n"
BR_ST = (
    "ggml_cuda_mapped_host_bridge: stats: boundaries={n} bytes=1 chunks=1 producer_waits=0 sync_copies=0 fallbacks=0\n"
)
BT_EN = "llama_batched_transfers: enabled, pinned pool up to 32 MiB\n"
BT_IN = "llama_batched_transfers: inactive: no device to batch to\n"
BT_ST = (
    "llama_batched_transfers: stats: graphs=3 async_uploads={u} async_downloads={d} sync_uploads=0 "
    "sync_downloads=0 upstream_uploads=0 upstream_downloads=0 bytes_up=1 bytes_down=1 fallbacks=0 pool_waits=0 pool_drains=0\n"
)
DEV2 = "using device CUDA0 (A) (a) - 1 MiB free\nusing device CUDA1 (B) (b) - 1 MiB free\n"


def rung(**kw):
    kw.setdefault("devices", 2)
    return schema.Rung("r", model.get_shape("tiny"), ubatch=8, batch=32, **kw)


def v(mode, r, **logs):
    return validity.validate_mode(modes.MODES[mode], r, {k: logparse.parse(t) for k, t in logs.items()})


def test_validity_bridge():
    r = rung()
    ok = v(
        "bridge-force",
        r,
        server=BR_EN.format(m="force") + DEV2 + BR_ST.format(n=3),
        perplexity=BR_EN.format(m="force") + DEV2 + BR_ST.format(n=5),
    )
    assert ok.ok, ok.problems
    assert ok.bridge.totals["boundaries"] == 8 and ok.bridge.per_process["slots"] == {"server": 4, "perplexity": 4}
    zero = v(
        "bridge", r, server=BR_EN.format(m="auto") + DEV2 + BR_ST.format(n=0), perplexity=BR_EN.format(m="auto") + DEV2
    )
    assert not zero.ok and any("boundaries=0" in p for p in zero.problems)
    nostats = v("bridge", r, server=BR_EN.format(m="auto") + DEV2)
    assert not nostats.ok and any("no bridge stats" in p for p in nostats.problems)
    missing = v("bridge", r, server=BR_EN.format(m="auto") + DEV2 + BR_ST.format(n=1), perplexity=DEV2)
    assert not missing.ok and any("perplexity: no bridge line" in p for p in missing.problems)
    wrongmode = v("bridge-force", r, server=BR_EN.format(m=1) + DEV2 + BR_ST.format(n=1))
    assert not wrongmode.ok
    onedev = v(
        "bridge", r, server=BR_EN.format(m="auto") + "using device CUDA0 (A) (a) - 1 MiB free\n" + BR_ST.format(n=1)
    )
    assert not onedev.ok and any("on fewer" in p for p in onedev.problems)
    six = rung(virtual_devices=6)
    assert not v("bridge", six, server=BR_EN.format(m="auto") + DEV2 + BR_ST.format(n=1)).ok  # 6-card rig seen as 2
    # single-GPU rung: no counters needed, but the line is
    single = rung(devices=1)
    assert v("bridge", single, server=BR_EN.format(m="auto") + BR_ST.format(n=0)).ok
    assert not v("bridge", single, server="ggml_cuda_mapped_host_bridge: inactive: one device\n").ok
    either = rung(devices=1, expect_bridge="either")
    res = v("bridge", either, server="ggml_cuda_mapped_host_bridge: inactive: one device\n")
    assert res.ok and "not a bridge pass" in res.notes[0]


def test_validity_batched():
    r = rung(devices=1)
    assert v("batched", r, server=BT_EN + BT_ST.format(u=2, d=2), perplexity=BT_EN + BT_ST.format(u=1, d=1)).ok
    # downloads into the pinned output buffer are upstream's own (upstream_downloads): not required as batched
    assert v("batched", r, server=BT_EN + BT_ST.format(u=2, d=0)).ok
    logs = {"server": logparse.parse(BT_EN + BT_ST.format(u=2, d=0))}
    assert validity.validate_mode(modes.MODES["batched"], r, logs, {"batched_async_uploads_total": 5}).ok
    res = validity.validate_mode(modes.MODES["batched"], r, logs, {"batched_async_uploads_total": 0})
    assert not res.ok and any("/metrics" in p for p in res.problems)
    res = validity.validate_mode(modes.MODES["batched"], r, logs, {})  # a server without the metrics patch
    assert not res.ok and any("absent" in p for p in res.problems)
    res = v("batched", r, server=BT_EN + BT_ST.format(u=0, d=2))
    assert not res.ok and any("async_uploads=0" in p for p in res.problems)
    assert not v("batched", r, server=BT_EN).ok
    assert not v("batched", r, server=BT_IN).ok  # inactive where engaged is expected
    cpu = rung(devices=0, expect_batched="inactive")
    res = v("batched", cpu, server=BT_IN + BT_ST.format(u=0, d=0))
    assert res.ok and "not a batched pass" in res.notes[0]
    assert not v("batched", cpu, server=BT_EN + BT_ST.format(u=1, d=1)).ok
    assert not v("batched", cpu, server="").ok  # no line at all is never a pass


def test_validity_bridge_typo():
    r = rung()
    rej = 'ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE="yes" (expected 0, 1, auto or force); bridge off\n'
    old = 'ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB="abc" (expected 64..65536); using 2048\n'
    assert modes.MODES["bridge-typo"].env()["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "yes"
    assert v("bridge-typo", r, server=rej + DEV2, perplexity=rej + DEV2).ok
    # silence in one process (the warning went to llama.cpp's muted fitting probe) is a failure
    res = v("bridge-typo", r, server=rej + DEV2, perplexity=DEV2)
    assert not res.ok and any(
        "perplexity: GGML_CUDA_MAPPED_HOST_BRIDGE=\"yes\" is invalid but the log does not report it rejected" in p
        for p in res.problems
    )
    # a rejection the mode does not set (the series before issue 26 had more bridge variables) fails it
    assert not v("bridge-typo", r, server=rej + old + DEV2, perplexity=rej + DEV2).ok
    assert not v("bridge-typo", r, server=rej + DEV2 + BR_EN.format(m=1)).ok  # the bridge must stay off
    # an unexpected rejection fails any mode
    assert not v("off", r, server=rej + DEV2).ok


def test_validity_off_and_upstream():
    r = rung(devices=1)
    assert v("off", r, server="").ok
    assert not v("off", r, server=BR_EN.format(m=1)).ok
    assert not v("off", r, server=BT_EN).ok
    assert v("upstream", r, server="").ok
    res = v("upstream", r, server="ggml_cuda_mapped_host_bridge: inactive: disabled\n")
    assert not res.ok and "not an unpatched build" in res.problems[0]


# --- whole ladders against the fake tools -------------------------------------------------------------


@dataclass(frozen=True)
class LadderRig:
    tmp: Path
    vocab: Path
    patched: Path
    """The fake patched build's bin folder."""
    upstream: Path
    """The fake upstream build's bin folder (its programs print no patch lines)."""
    settings: config.Settings


@pytest.fixture
def ladder_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LadderRig:
    """A ladder on fake patched and upstream builds and a small vocabulary, no FAKE_* behaviour set."""
    for k in list(os.environ):
        if k.startswith("FAKE_"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("GGML_BRIDGE_VOCAB", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return LadderRig(
        tmp=tmp_path,
        vocab=make_vocab(tmp_path / "vocab.gguf"),
        patched=write_fake_bin(tmp_path / "patched"),
        upstream=write_fake_bin(tmp_path / "upstream", unpatched=True),
        settings=config.Settings(
            cache_dir=tmp_path / "cache", project_dir=REPO_ROOT, build=config.BuildSettings(backend="cpu")
        ),
    )


def run_ladder(e, body, *extra):
    lf = write_ladder(e.tmp / "ladder.toml", body)
    a = ladder_options(
        [
            "--ladder",
            str(lf),
            "--report",
            str(e.tmp / "report"),
            "--vocab",
            str(e.vocab),
            "--bin-dir-patched",
            str(e.patched),
            "--bin-dir-upstream",
            str(e.upstream),
            "--threads",
            "1",
            "--startup-timeout",
            "30",
            *extra,
        ]
    )
    rc = orchestrate.run(a, e.settings)
    rep = json.loads((e.tmp / "report" / "report.json").read_text())
    md = (e.tmp / "report" / "report.md").read_text()
    return rc, rep, md


GPU_LADDER = f"""
name = "fake"
backend = "cuda"
[defaults]
{MICRO}
reference = "off"
modes = ["off", "upstream", "bridge", "bridge-force", "batched", "bridge-force-batched"]
devices = 2
ubatch = 8
batch = 16
ppl_ctx = 16
env = {{ FAKE_DEVICES = "2" }}
[[rung]]
name = "two-gpus"
"""


def test_fake_gpu_ladder_passes(ladder_rig, capsys):
    rc, rep, md = run_ladder(ladder_rig, GPU_LADDER)
    r = rep["rungs"][0]
    assert rc == 0, r["problems"]
    assert rep["status"] == "pass" and r["status"] == "pass"
    ref = r["modes"]["off"]
    for name in ("upstream", "bridge", "bridge-force", "batched", "bridge-force-batched"):
        m = r["modes"][name]
        assert m["responses"]["sha256"] == ref["responses"]["sha256"]
        assert m["logits"]["sha256"] == ref["logits"]["sha256"]
        assert (
            m["compare"]["logits"]["identical"] and m["compare"]["logits"]["bytes_compared"] == ref["logits"]["bytes"]
        )
        assert m["compare"]["responses"]["identical"]
        assert m["wall_s"] > 0
    assert r["modes"]["bridge-force-batched"]["validity"]["bridge"]["boundaries"] == 14  # server + perplexity
    assert r["modes"]["batched"]["validity"]["batched"]["async_uploads"] == 8
    assert r["modes"]["bridge"]["selectors"]["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "auto"
    assert "| two-gpus |" in md and "PASS" in md
    assert (
        "[1/1] two-gpus: off vs upstream, bridge, bridge-force, batched, bridge-force-batched: PASS"
        in capsys.readouterr().err
    )
    assert not list((ladder_rig.tmp / "report").rglob("logits.bin"))  # removed after a pass


def test_a_rung_without_perplexity_makes_no_logits(ladder_rig):
    rc, rep, md = run_ladder(ladder_rig, GPU_LADDER + "perplexity = false\n", "--keep-logits")
    r = rep["rungs"][0]
    assert rc == 0 and r["status"] == "pass", r["problems"]
    assert all(m["logits"] is None and "logits" not in m.get("compare", {}) for m in r["modes"].values())
    assert r["modes"]["bridge"]["compare"]["responses"]["identical"]
    assert not list((ladder_rig.tmp / "report").rglob("logits.bin")) and not list(
        (ladder_rig.tmp / "report").rglob("perplexity.log")
    )


def test_fake_gpu_ladder_requires_the_rejection_in_every_process(ladder_rig, monkeypatch):
    body = GPU_LADDER.replace(
        'modes = ["off", "upstream", "bridge", "bridge-force", "batched", "bridge-force-batched"]',
        'modes = ["off", "bridge-typo"]',
    )
    rc, rep, _ = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 0 and r["status"] == "pass", r["problems"]
    assert r["modes"]["bridge-typo"]["selectors"]["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "yes"
    assert not any(k.startswith("GGML_CUDA_MAPPED_HOST_BRIDGE_") for k in r["modes"]["bridge-typo"]["selectors"])
    # the series before issue 14 printed its rejections only once, into the fitting probe's muted log
    monkeypatch.setenv("FAKE_FIT_SWALLOWS", "1")
    rc, rep, _ = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 1 and r["status"] == "invalid"
    assert any("does not report it rejected" in p for p in r["problems"])


def test_fake_mismatch_exits_1_with_first_difference(ladder_rig):
    body = GPU_LADDER.replace(
        'FAKE_DEVICES = "2"', 'FAKE_DEVICES = "2", FAKE_PERTURB_WHEN = "LLAMA_BATCHED_TRANSFERS=1"'
    )
    rc, rep, md = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 1 and rep["status"] == "fail" and r["status"] == "mismatch"
    for name in ("batched", "bridge-force-batched"):
        c = r["modes"][name]["compare"]
        assert not c["responses"]["identical"] and not c["logits"]["identical"]
        assert c["logits"]["first_difference"]["token_record"] == 3
        assert c["logits"]["first_difference"]["vocab_id"] == 5  # the fake flips entry 5 of record 3
        assert "probabilities of generated token 2" in c["responses"]["first_difference"]["where"]
    for name in ("upstream", "bridge", "bridge-force"):
        assert r["modes"][name]["compare"]["logits"]["identical"]
    assert "DIFFER" in md
    assert list((ladder_rig.tmp / "report").rglob("logits.bin"))  # kept for inspection


def test_fake_no_boundaries_is_not_a_pass(ladder_rig):
    body = GPU_LADDER.replace('FAKE_DEVICES = "2"', 'FAKE_DEVICES = "2", FAKE_BOUNDARIES = "0"')
    rc, rep, _ = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 1 and r["status"] == "invalid"
    assert any("boundaries=0" in p for p in r["problems"])
    # outputs were identical: it is the missing evidence that fails it
    assert all(m.get("compare", {}).get("logits", {}).get("identical", True) for m in r["modes"].values())


def test_fake_no_async_transfers_is_not_a_pass(ladder_rig):
    body = GPU_LADDER.replace('FAKE_DEVICES = "2"', 'FAKE_DEVICES = "2", FAKE_ASYNC_UP = "0"')
    rc, rep, _ = run_ladder(ladder_rig, body)
    assert rc == 1 and any("async_uploads=0" in p for p in rep["rungs"][0]["problems"])


def test_fake_cpu_ladder_with_inactive_batched(ladder_rig):
    body = f"""
[defaults]
{MICRO}
reference = "upstream"
ubatch = 4
batch = 16
ppl_ctx = 16
[[rung]]
name = "cpu-a"
modes = ["upstream", "off"]
[[rung]]
name = "cpu-b"
modes = ["upstream", "off", "batched"]
expect_batched = "inactive"
env = {{ FAKE_BATCHED_INACTIVE = "no GPU backend" }}
"""
    rc, rep, md = run_ladder(ladder_rig, body)
    assert rc == 0, [r["problems"] for r in rep["rungs"]]
    b = rep["rungs"][1]["modes"]["batched"]["validity"]
    assert b["batched"]["state"] == "inactive" and "not a batched pass" in b["notes"][0]
    # without the inactive line, the same rung fails
    rc, rep, _ = run_ladder(ladder_rig, body.replace('env = { FAKE_BATCHED_INACTIVE = "no GPU backend" }', ""))
    assert rc == 1 and rep["rungs"][1]["status"] == "invalid"


def test_server_crash_is_a_setup_error(ladder_rig):
    body = GPU_LADDER.replace('FAKE_DEVICES = "2"', 'FAKE_DEVICES = "2", FAKE_DIE_AT_START = "1"')
    rc, rep, md = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == LadderSetupError.exit_code and r["status"] == "error"
    assert "GGML_ASSERT(fake)" in r["modes"]["off"]["error"]


def test_same_build_is_refused(ladder_rig):
    lf = write_ladder(ladder_rig.tmp / "l.toml", GPU_LADDER)
    a = ladder_options(
        [
            "--ladder",
            str(lf),
            "--vocab",
            str(ladder_rig.vocab),
            "--report",
            str(ladder_rig.tmp / "r"),
            "--bin-dir-patched",
            str(ladder_rig.patched),
            "--bin-dir-upstream",
            str(ladder_rig.patched),
        ]
    )
    with pytest.raises(LadderSetupError, match="same build"):
        orchestrate.run(a, ladder_rig.settings)


def test_missing_bin_dir_and_rung(ladder_rig):
    lf = write_ladder(ladder_rig.tmp / "l.toml", GPU_LADDER)
    with pytest.raises(UsageError, match="--bin-dir-patched .*nope: no such folder"):  # the user's path: exit 2
        ladder_options(
            [
                "--ladder",
                str(lf),
                "--bin-dir-patched",
                str(ladder_rig.tmp / "nope"),
                "--bin-dir-upstream",
                str(ladder_rig.upstream),
            ]
        )
    (ladder_rig.tmp / "empty").mkdir()
    a = ladder_options(
        [
            "--ladder",
            str(lf),
            "--bin-dir-patched",
            str(ladder_rig.tmp / "empty"),
            "--bin-dir-upstream",
            str(ladder_rig.upstream),
        ]
    )
    with pytest.raises(LadderSetupError, match="not found in --bin-dir-patched"):
        orchestrate.run(a, ladder_rig.settings)
    a = ladder_options(["--ladder", str(lf), "--rung", "zzz"])
    with pytest.raises(LadderSetupError, match="no rung named zzz"):
        orchestrate.run(a, ladder_rig.settings)


def test_mechanism_state_names():
    r = rung(devices=1)
    assert v("batched", r, server="", perplexity="").batched.state == "absent"
    assert v("batched", r, server=BT_EN, perplexity="").batched.state == "mixed"
    assert v("batched", r, server=BT_IN, perplexity=BT_IN).batched.state == "inactive"


def test_per_mode_expectations(tmp_path):
    body = (
        "[[rung]]\nname='a'\nshape='tiny'\ndevices=2\nmodes=['off','bridge','bridge-force']\n"
        "expect = { bridge = 'either' }\n"
    )
    r = schema.load_ladder(write_ladder(tmp_path / "l.toml", body)).rungs[0]
    inactive = "ggml_cuda_mapped_host_bridge: inactive: peer access is direct\n" + DEV2
    assert v("bridge", r, server=inactive).ok
    assert not v("bridge-force", r, server=inactive).ok
    with pytest.raises(LadderSetupError, match="expect.batched"):  # a mode the rung does not run
        schema.load_ladder(write_ladder(tmp_path / "m.toml", body.replace("bridge = 'either'", "batched = 'either'")))
    with pytest.raises(LadderSetupError, match="expect.bridge"):
        schema.load_ladder(write_ladder(tmp_path / "n.toml", body.replace("'either'", "'maybe'")))


def test_cuda_ladder_bridge_expectations_follow_the_patch():
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda.toml")
    typo = {r.devices for r in lad.rungs if "bridge-typo" in r.modes}
    assert typo == {1, 2}  # a rejected selector must be reported on one GPU and on a split
    for r in lad.rungs:
        if r.devices == 1:
            assert r.expect_bridge == "inactive"  # "inactive: single device" in every mode
        else:
            # every bridge mode must engage: the ladder never enables peer access, so mode 1 routes too
            assert r.expect_bridge == "engaged" and r.expect == {}
            assert r.expect_batched == "engaged"


VK_POOLS = (
    "llama_batched_transfers: pools: Vulkan0: pool Vulkan_Host; Vulkan1: none (its pinned host buffer type is "
    "pinned for Vulkan0); CPU: none (computes in host memory)\n"
)
VK_DEV2 = "using device Vulkan0 (llvmpipe) (x) - 1 MiB free\nusing device Vulkan1 (llvmpipe) (x) - 1 MiB free\n"


def test_validity_batched_pools_the_device_zero_rule():
    """expect_pools: the pinned pool of each backend as the mechanism names it; a rung whose pools differ (the
    second Vulkan device staging through device 0's host memory, or no pool where one is expected) fails."""
    r = rung(expect_pools={"Vulkan0": "Vulkan_Host", "Vulkan1": "none"}, env={"GGML_VK_VISIBLE_DEVICES": "0,0"})
    ok = v("batched", r, server=BT_EN + VK_POOLS + VK_DEV2 + BT_ST.format(u=2, d=0))
    assert ok.ok, ok.problems
    assert ok.batched.per_process["pools"]["server"]["Vulkan0"] == "Vulkan_Host"
    assert "fallbacks" in ok.batched.totals and any("batched pools: Vulkan0: Vulkan_Host" in n for n in ok.notes)
    wrong = VK_POOLS.replace(
        "Vulkan1: none (its pinned host buffer type is pinned for Vulkan0)", "Vulkan1: pool Vulkan_Host"
    )
    bad = v("batched", r, server=BT_EN + wrong + VK_DEV2 + BT_ST.format(u=2, d=0))
    assert not bad.ok and any("Vulkan1's pinned pool is Vulkan_Host, the rung expects none" in p for p in bad.problems)
    noline = v("batched", r, server=BT_EN + VK_DEV2 + BT_ST.format(u=2, d=0))
    assert not noline.ok and any("no 'llama_batched_transfers: pools:' line" in p for p in noline.problems)
    assert orchestrate._device_env(r) == {}, "Vulkan devices named by the rung: CUDA's variables untouched"


def test_a_vulkan_ladder_file_and_expect_pools_checks(tmp_path):
    from ggml_bridge.foundations.errors import LadderSetupError

    lf = tmp_path / "v.toml"
    lf.write_text(
        'name = "v"\nbackend = "vulkan"\n[[rung]]\nname = "a"\nshape = "tiny"\nmodes = ["upstream", "batched"]\n'
        'reference = "upstream"\nexpect_pools = { Vulkan0 = "Vulkan_Host" }\n'
    )
    lad = schema.load_ladder(lf)
    assert lad.backend == "vulkan" and lad.rungs[0].expect_pools == {"Vulkan0": "Vulkan_Host"}
    lf.write_text(lf.read_text().replace('"upstream", "batched"', '"upstream", "off"'))
    with pytest.raises(LadderSetupError, match="expect_pools needs a batched mode"):
        schema.load_ladder(lf)
    lf.write_text('name = "v"\nbackend = "metal"\n[[rung]]\nname = "a"\nshape = "tiny"\n')
    with pytest.raises(LadderSetupError, match="backend must be one of cpu, cuda, vulkan"):
        schema.load_ladder(lf)


def test_the_shipped_vulkan_ladder_parses_and_proves_what_the_issue_asks():
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "vulkan.toml")
    assert lad.backend == "vulkan"
    for r in lad.rungs:
        assert {"upstream", "off", "batched"} <= set(r.modes) and r.reference == "upstream"
        assert r.env.get("GGML_VK_VISIBLE_DEVICES") == "0,0" and r.n_devices == 2
        assert r.expect_pools == {"Vulkan0": "Vulkan_Host", "Vulkan1": "none"}
    assert any(r.env.get("GGML_VK_PERF_LOGGER") for r in lad.rungs), "a rung with the perf logger (the drain)"


def test_split_devices_counts_devices_the_gpus_do_not_and_the_shipped_mixed_ladder():
    """split_devices: a rung on one GPU whose server_args name two devices (-dev CUDA0,Vulkan0) must show the model
    on two; one device in the log is not a pass. ladders/cuda-vulkan.toml asks exactly that, with a pool per backend."""
    mixed = rung(devices=1, split_devices=2, expect_pools={"CUDA0": "CUDA_Host", "Vulkan0": "Vulkan_Host"})
    pools = "llama_batched_transfers: pools: CUDA0: pool CUDA_Host; Vulkan0: pool Vulkan_Host; CPU: none (computes in host memory)\n"
    both = "using device CUDA0 (A) (a) - 1 MiB free\nusing device Vulkan0 (A) (a) - 1 MiB free\n"
    ok = v("batched", mixed, server=BT_EN + pools + both + BT_ST.format(u=2, d=0))
    assert ok.ok, ok.problems
    one = v(
        "batched", mixed, server=BT_EN + pools + "using device CUDA0 (A) (a) - 1 MiB free\n" + BT_ST.format(u=2, d=0)
    )
    assert not one.ok and any("over 2 devices but the log shows it on fewer" in p for p in one.problems)
    assert v("batched", rung(devices=1), server=BT_EN + BT_ST.format(u=2, d=0)).ok  # without it: one device
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda-vulkan.toml")
    assert lad.backend == "cuda-vulkan" and len(lad.rungs) >= 2
    for r in lad.rungs:
        assert r.devices == 1 and r.n_devices == 2 and r.reference == "upstream"
        assert {"upstream", "off", "batched"} <= set(r.modes)
        assert r.server_args == r.perplexity_args == ["-dev", "CUDA0,Vulkan0"]
        assert r.expect_pools == {"CUDA0": "CUDA_Host", "Vulkan0": "Vulkan_Host"}


# --- sides: any two sets of binaries ------------------------------------------------------------------

SIDES_LADDER = f"""
name = "sides"
backend = "cpu"
[sides.wheel]
variant = "patched"
about = "an installed wheel's bin/"
[[rung]]
name = "r"
{MICRO}
ubatch = 8
batch = 16
modes = ["upstream", "off", "wheel:off"]
reference = "upstream"
expect_batched = "inactive"
"""


def test_a_rung_compares_modes_on_any_declared_side(ladder_rig):
    """``SIDE:MODE`` runs a mode on the binaries given with ``--side SIDE=DIR``: compared byte for byte with the
    reference like any other mode, and reported with its side."""
    wheel = write_fake_bin(ladder_rig.tmp / "wheel")
    rc, rep, md = run_ladder(ladder_rig, SIDES_LADDER, "--side", f"wheel={wheel}")
    assert rc == 0, rep["rungs"][0]["problems"]
    modes_run = rep["rungs"][0]["modes"]
    assert modes_run["wheel:off"]["side"] == "wheel" and modes_run["off"]["side"] == "patched"
    assert modes_run["wheel:off"]["compare"]["logits"]["identical"]
    assert rep["binaries"]["wheel"] == str(wheel) and "wheel:off" in md
    # a perturbed wheel is caught like a perturbed patched build
    bad = write_fake_bin(
        ladder_rig.tmp / "bad", prefix="import os\nos.environ['FAKE_PERTURB_WHEN'] = 'GGML_CUDA_MAPPED_HOST_BRIDGE=0'\n"
    )
    rc, rep, _ = run_ladder(ladder_rig, SIDES_LADDER, "--side", f"wheel={bad}")
    assert rc == 1 and any(p.startswith("wheel:off: ") for p in rep["rungs"][0]["problems"])


def test_sides_are_checked_before_anything_runs(ladder_rig):
    with pytest.raises(LadderSetupError, match="pass --side wheel=DIR"):
        run_ladder(ladder_rig, SIDES_LADDER)
    with pytest.raises(LadderSetupError, match="the ladder .* has no such side"):
        run_ladder(ladder_rig, SIDES_LADDER, "--side", f"nosuch={ladder_rig.patched}")
    with pytest.raises(LadderSetupError, match="does not declare"):
        run_ladder(ladder_rig, SIDES_LADDER.replace('"wheel:off"]', '"other:off"]'))
    with pytest.raises(LadderSetupError, match="mode upstream runs the upstream build, side wheel is patched"):
        run_ladder(ladder_rig, SIDES_LADDER.replace('"wheel:off"]', '"wheel:upstream"]'))
    with pytest.raises(UsageError, match="two folders"):
        run_ladder(ladder_rig, SIDES_LADDER, "--side", f"patched={ladder_rig.upstream}")
    # a side that must hold exactly one CPU variant module
    body = SIDES_LADDER.replace('about = "an installed wheel\'s bin/"', 'cpu_variant = "x64"')
    wheel = write_fake_bin(ladder_rig.tmp / "wheel")
    (wheel / "libggml-cpu-haswell.so").write_bytes(b"")
    with pytest.raises(LadderSetupError, match="must hold exactly libggml-cpu-x64.so"):
        run_ladder(ladder_rig, body, "--side", f"wheel={wheel}")
    (wheel / "libggml-cpu-haswell.so").rename(wheel / "libggml-cpu-x64.so")
    assert run_ladder(ladder_rig, body, "--side", f"wheel={wheel}")[0] == 0


@pytest.mark.parametrize("name", ["cpu-variant.toml", "wheel-vs-source.toml", "rpc-greedy.toml"])
def test_the_comparison_ladders_load(name):
    """The CPU-variant proof, the wheel against the source build and the RPC launcher against the local server are
    ladder files: what they compare is declared there."""
    lad = schema.load_ladder(REPO_ROOT / "ladders" / name)
    runs = [m for r in lad.rungs for m in r.modes]
    if name == "cpu-variant.toml":
        assert {s.cpu_variant for s in lad.sides.values() if s.name in ("wheel", "upstream")} == {"x64"}
        assert all(r.modes == ["upstream", "wheel:off"] and not r.skips for r in lad.rungs) and len(lad.rungs) == 4
    elif name == "wheel-vs-source.toml":
        assert set(runs) == {"source:bridge-force-batched", "wheel:bridge-force-batched"}
        assert all(r.virtual_devices == 4 for r in lad.rungs)
    else:
        assert set(runs) == {"off-1gpu", "rpc-bridge-force"} and lad.rungs[0].rpc_servers == [["CUDA0", "CUDA1"]]


def test_the_tensor_rungs_expect_the_paths_upstream_and_patch_0007_pick():
    """What each mode of ladders/cuda-tensor.toml must prove (the ladder derives it the same way)."""
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda-tensor.toml")

    def path(rung_name: str, run: str) -> str:
        (r,) = [r for r in lad.rungs if r.name == rung_name]
        m = modes.MODES[run]
        patched = modes.VARIANTS[m.variant].patched
        value = schema.effective_allreduce(r, run)
        bridge = modes.BRIDGE_VALUES[m.bridge] if patched and m.bridge else None
        return mechanisms.expected_allreduce(value, r.n_devices, True, bridge=bridge, patched=patched)

    assert path("4virt-tensor-none-ub512", "tensor-upstream") == "butterfly"
    assert path("4virt-tensor-none-ub512", "tensor-bridge") == "butterfly", "auto keeps virtual devices upstream's"
    assert path("4virt-tensor-none-ub512", "tensor-bridge-force") == "bridge"
    assert path("3virt-tensor-bridge-allreduce-ub512", "tensor-allreduce-bridge") == "bridge"
    assert path("3virt-tensor-bridge-allreduce-ub512", "tensor-bridge-force-butterfly") == "butterfly"
    assert path("2virt-tensor-internal-ub512", "tensor-bridge-force-internal") == "internal"
    assert path("4virt-tensor-internal-fallback-ub512", "tensor-off-internal") == "butterfly"
    assert path("4virt-tensor-internal-fallback-ub512", "tensor-bridge-force-internal") == "bridge"
    assert path("2virt-tensor-default-ub512", "upstream") == "internal"
    assert path("3virt-tensor-default-ub512", "bridge-force") == "bridge"


class _Toy:
    """A ladder artifact of the test's own: the mode's prompts, plus (``leaky``) the mode's name, which differs."""

    name = "toy"
    stage = "after"
    disposable = False

    def __init__(self, leaky: bool = False) -> None:
        self.leaky = leaky
        self.made: list[str] = []

    def produce(self, run):
        self.made.append(run.job.mode.name)
        path = run.job.out / "toy.txt"
        path.write_text("\n".join(run.inputs.prompts) + (run.job.mode.name if self.leaky else ""))
        return artifact.Produced(path)

    def describe(self, ref, other, offset):
        return {"offset": offset, "where": "toy byte"}


def test_the_registry_drives_what_a_rung_produces_compares_and_reports(ladder_rig, monkeypatch):
    """One registry row is all a new artifact needs: produced in every mode, compared, listed and tabled."""
    toy = _Toy()
    monkeypatch.setitem(registry.ARTIFACTS, "toy", toy)
    body = GPU_LADDER.replace(
        'modes = ["off", "upstream", "bridge", "bridge-force", "batched", "bridge-force-batched"]',
        'modes = ["off", "upstream", "bridge"]',
    )
    rc, rep, md = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 0, r["problems"]
    assert toy.made == ["off", "upstream", "bridge"]
    assert r["modes"]["off"]["toy"]["sha256"] == r["modes"]["bridge"]["toy"]["sha256"]
    assert all(r["modes"][m]["compare"]["toy"]["identical"] for m in ("upstream", "bridge"))
    assert "| mode | responses sha256 | logits sha256 | toy sha256 | vs reference |" in md
    assert "toy identical" in md
    monkeypatch.setitem(registry.ARTIFACTS, "toy", _Toy(leaky=True))
    rc, rep, md = run_ladder(ladder_rig, body)
    r = rep["rungs"][0]
    assert rc == 1 and r["status"] == "mismatch"
    assert r["modes"]["bridge"]["compare"]["toy"]["first_difference"]["where"] == "toy byte"
    assert r["modes"]["bridge"]["compare"]["logits"]["identical"]
    assert any(p.startswith("bridge: toy differ from off at byte") for p in r["problems"])


def test_the_options_are_declared_on_their_fields_and_the_sides_are_the_commands(tmp_path):
    import dataclasses

    from ggml_bridge.foundations import flags

    declared = [f.name for f, _ in flags.declared(orchestrate.LadderOptions)]
    assert declared == [f.name for f in dataclasses.fields(orchestrate.LadderOptions) if f.name != "sides"]
    (tmp_path / "p").mkdir()
    argv = ["--rung", "a", "--rung", "b", "--bin-dir-patched", str(tmp_path / "p"), "--side", "w=x", "--keep-logits"]
    opts = ladder_options(argv)
    assert (opts.rungs, opts.sides, opts.keep_logits) == (("a", "b"), {"patched": tmp_path / "p", "w": Path("x")}, True)
    assert ladder_options([]) == orchestrate.LadderOptions()
    with pytest.raises(UsageError, match="--vocab"):
        ladder_options(["--vocab", str(tmp_path / "missing.gguf")])
