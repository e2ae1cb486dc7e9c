"""Model writer: determinism, format, cache."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from ggml_bridge.experiments import model
from ggml_bridge.foundations.layout import Layout

#: GGML_BRIDGE_VOCAB names the file; else it is looked up in GGML_BRIDGE_TEST_UPSTREAM (an upstream tree)
VOCAB_CANDIDATES = [os.environ.get("GGML_BRIDGE_VOCAB")]


def _vocab() -> Path:
    for c in VOCAB_CANDIDATES:
        if c and Path(c).is_file():
            return Path(c)
    found = model.find_vocab(os.environ.get("GGML_BRIDGE_TEST_UPSTREAM"))
    if found:
        return found
    pytest.skip("no ggml-vocab-llama-spm.gguf (set GGML_BRIDGE_VOCAB)")


@pytest.fixture(scope="module")
def vocab() -> Path:
    return _vocab()


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# a shape small enough to write several times per test, with a tensor spanning several chunks
MICRO = model.Shape("micro", n_embd=32, n_layer=1, n_head=4, n_head_kv=2, n_ff=64, n_ctx_train=256, dtype="f16")


def test_same_seed_same_bytes_regardless_of_threads(tmp_path, vocab, monkeypatch):
    monkeypatch.setattr(model, "CHUNK_ELEMS", 1 << 16)  # token_embd (32000x32) spans 16 chunks
    a = model.write_model(tmp_path / "a.gguf", MICRO, 7, vocab, threads=1)
    b = model.write_model(tmp_path / "b.gguf", MICRO, 7, vocab, threads=4)
    assert sha(a) == sha(b)
    c = model.write_model(tmp_path / "c.gguf", MICRO, 8, vocab, threads=2)
    assert sha(c) != sha(a)
    d = model.write_model(tmp_path / "d.gguf", MICRO.with_(n_ff=96), 7, vocab, threads=2)
    assert sha(d) != sha(a)


def test_format_kv_and_tensors(tmp_path, vocab):
    import gguf

    p = model.write_model(tmp_path / "m.gguf", MICRO, 1, vocab)
    r = gguf.GGUFReader(str(p))

    def kv(k):
        return r.fields[k].contents()

    assert kv("general.architecture") == "llama"
    assert kv("llama.embedding_length") == 32
    assert kv("llama.block_count") == 1
    assert kv("llama.feed_forward_length") == 64
    assert kv("llama.attention.head_count") == 4
    assert kv("llama.attention.head_count_kv") == 2
    assert kv("llama.rope.dimension_count") == 8
    assert kv("llama.context_length") == 256
    assert kv("general.file_type") == 1
    assert abs(kv("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-9
    assert abs(kv("llama.rope.freq_base") - 10000.0) < 1e-3
    src = gguf.GGUFReader(str(vocab))
    assert r.fields["tokenizer.ggml.tokens"].contents() == src.fields["tokenizer.ggml.tokens"].contents()
    assert kv("tokenizer.ggml.model") == src.fields["tokenizer.ggml.model"].contents()
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)

    t = {x.name: x for x in r.tensors}
    expect = {
        "token_embd.weight": [32, n_vocab],
        "output.weight": [32, n_vocab],
        "output_norm.weight": [32],
        "blk.0.attn_q.weight": [32, 32],
        "blk.0.attn_k.weight": [32, 16],
        "blk.0.attn_v.weight": [32, 16],
        "blk.0.attn_output.weight": [32, 32],
        "blk.0.ffn_gate.weight": [32, 64],
        "blk.0.ffn_up.weight": [32, 64],
        "blk.0.ffn_down.weight": [64, 32],
        "blk.0.attn_norm.weight": [32],
        "blk.0.ffn_norm.weight": [32],
    }
    assert set(t) == set(expect)
    for name, ne in expect.items():
        assert list(t[name].shape) == ne, name
    assert t["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.all(t["blk.0.attn_norm.weight"].data == 1.0)
    assert t["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    w = np.asarray(t["token_embd.weight"].data, dtype=np.float32)
    assert np.isfinite(w).all()
    assert 0.018 < float(w.std()) < 0.022 and abs(float(w.mean())) < 1e-3
    # different tensors are different streams
    assert not np.array_equal(t["blk.0.ffn_gate.weight"].data, t["blk.0.ffn_up.weight"].data)


def test_f32_dtype(tmp_path, vocab):
    import gguf

    p = model.write_model(tmp_path / "m.gguf", MICRO.with_(dtype="f32"), 1, vocab)
    r = gguf.GGUFReader(str(p))
    assert r.fields["general.file_type"].contents() == 0
    assert all(x.tensor_type == gguf.GGMLQuantizationType.F32 for x in r.tensors)


def test_cache_reuses_and_keys_on_seed(tmp_path, vocab):
    models = Layout(tmp_path).models
    a = model.ensure_model(models, MICRO, 3, vocab)
    assert a.parent == models and a.is_file()
    mtime = a.stat().st_mtime_ns
    assert model.ensure_model(models, MICRO, 3, vocab) == a
    assert a.stat().st_mtime_ns == mtime
    b = model.ensure_model(models, MICRO, 4, vocab)
    assert b != a
    assert not [p for p in models.iterdir() if p.name.startswith(".")]


def test_presets_sizes():
    p3 = model.get_shape("bench-3b").n_params()
    assert 3.1e9 < p3 < 3.5e9
    assert 0.9e9 < model.get_shape("bench-1b").n_params() < 1.3e9
    wide = model.get_shape("wide")
    assert wide.n_embd * 4096 * 4 == 128 << 20
    assert model.get_shape("tiny").n_params() < 5e6


def test_bad_shapes():
    with pytest.raises(model.ModelError):
        model.get_shape("nope")
    with pytest.raises(model.ModelError):
        model.Shape("x", n_embd=30, n_layer=1, n_head=4, n_head_kv=2, n_ff=8)
    with pytest.raises(model.ModelError):
        model.Shape("x", n_embd=32, n_layer=1, n_head=4, n_head_kv=2, n_ff=8, dtype="q4")
    s = model.get_shape({"preset": "tiny", "n_layer": 3})
    assert s.n_layer == 3 and s.n_embd == 64 and s.name != "tiny"


def test_missing_vocab(tmp_path):
    with pytest.raises(model.ModelError, match="not found"):
        model.write_model(tmp_path / "m.gguf", MICRO, 1, tmp_path / "nope.gguf")


def test_find_vocab(tmp_path, monkeypatch):
    monkeypatch.delenv("GGML_BRIDGE_VOCAB", raising=False)
    assert model.find_vocab(tmp_path) is None
    f = tmp_path / "src" / "abc" / "models" / model.VOCAB_FILE
    f.parent.mkdir(parents=True)
    f.write_bytes(b"x")
    assert model.find_vocab(tmp_path / "src" / "abc") == f
    assert model.find_vocab(tmp_path) == f


def test_the_model_command_writes_the_same_bytes_as_the_library(tmp_path, monkeypatch, capsys):
    """``ggml-bridge model`` (what the GPU drivers call): --out writes there, else the cached copy; a missing
    vocabulary is one line and ModelError's exit status, a missing --vocab a usage error."""
    from ggml_bridge import cli
    from ggml_bridge.foundations.errors import ModelError

    from helpers import make_vocab

    monkeypatch.delenv("GGML_BRIDGE_VOCAB", raising=False)
    vocab = make_vocab(tmp_path / "vocab.gguf")
    out = tmp_path / "m.gguf"
    assert (
        cli.main(
            ["--cache-dir", str(tmp_path / "c"), "model", "--shape", "tiny", "--vocab", str(vocab), "--out", str(out)]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == str(out)
    ref = model.write_model(tmp_path / "ref.gguf", "tiny", 1, vocab)
    assert out.read_bytes() == ref.read_bytes()
    assert (
        cli.main(["--cache-dir", str(tmp_path / "c"), "model", "--shape", "tiny", "--seed", "1", "--vocab", str(vocab)])
        == 0
    )
    cached = Path(capsys.readouterr().out.strip())
    assert (
        cached == model.cached_path(Layout(tmp_path / "c").models, "tiny", 1, vocab)
        and cached.read_bytes() == ref.read_bytes()
    )
    assert cli.main(["--cache-dir", str(tmp_path / "empty"), "model"]) == ModelError.exit_code
    err = capsys.readouterr().err
    assert "cannot find the upstream vocabulary" in err and "Traceback" not in err
    # a --vocab the user gave that does not exist is their input: exit 2, like every other path option
    assert cli.main(["--cache-dir", str(tmp_path / "empty"), "model", "--vocab", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err
    assert f"--vocab {tmp_path / 'nope.gguf'}: no such file" in err and "Traceback" not in err
