"""Helpers shared by test modules (no test module imports another): the fake llama.cpp programs of
tests/fixtures/ written as executables, and where the real builds are when the slow tests can use them."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAKE_SERVER = FIXTURES / "fake_llama_server.py"
FAKE_BENCH = FIXTURES / "fake_llama_bench.py"
FAKE_MICRO = FIXTURES / "fake_mapped_host_bridge_bench.py"
FAKE_RPC = FIXTURES / "fakerpc.py"
FAKE_SMI = FIXTURES / "fake_nvidia_smi.py"


def write_exe(path: Path, text: str) -> Path:
    """``text`` as a Python program run by this interpreter (a ``#!PYTHON`` first line is replaced)."""
    if text.startswith("#!PYTHON\n"):
        text = text.split("\n", 1)[1]
    path.write_text(f"#!{sys.executable}\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_fake_bin(d: Path, *, unpatched: bool = False) -> Path:
    """The fake llama-server and llama-perplexity in ``d``; ``unpatched`` makes them print no patch lines (an
    upstream build)."""
    d.mkdir(parents=True, exist_ok=True)
    prefix = "import os\nos.environ['FAKE_UNPATCHED'] = '1'\n" if unpatched else ""
    for name in ("llama-server", "llama-perplexity"):
        write_exe(d / name, prefix + FAKE_SERVER.read_text())
    return d


def write_fake_variants(root: Path, *, prefix: str = "", rpc_server: str | None = None) -> Path:
    """``root``/{upstream,nopeer,patched}/llama-bench (as bench's --variants-dir), the fake microbenchmark in
    patched/; ``prefix`` is code run first by every llama-bench, ``rpc_server`` the name of a fake rpc-server
    to add to every variant."""
    for v in ("upstream", "nopeer", "patched"):
        (root / v).mkdir(parents=True, exist_ok=True)
        write_exe(root / v / "llama-bench", prefix + FAKE_BENCH.read_text())
        if rpc_server:
            write_exe(root / v / rpc_server, ("import os\nos.environ['FAKE_RPC_UPSTREAM'] = '1'\n"
                                              if v != "patched" else "") + FAKE_RPC.read_text())
    write_exe(root / "patched" / "test-mapped-host-bridge", FAKE_MICRO.read_text())
    return root


def bench_args(**kw: object):  # -> argparse.Namespace
    """``ggml-bridge bench``'s defaults with ``kw`` set."""
    import argparse

    from ggml_bridge import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    ns = p.parse_args([])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def fake_model(d: Path) -> Path:
    p = d / "m.gguf"
    p.write_bytes(b"GGUF fake model")
    return p


def real_bin_dir() -> Path | None:
    """A real patched CPU build (GGML_BRIDGE_TEST_BIN_DIR or the cache's latest), None without one."""
    d = os.environ.get("GGML_BRIDGE_TEST_BIN_DIR")
    if d and (Path(d) / "llama-server").is_file():
        return Path(d)
    try:
        from ggml_bridge import build, config
        return build.find_binary(config.load({}), "llama-server", variant="patched", backend="cpu").parent
    except Exception:  # noqa: BLE001 - no build available: the slow tests skip
        return None


def real_vocab() -> Path | None:
    from ggml_bridge import model
    return model.find_vocab(os.environ.get("GGML_BRIDGE_TEST_UPSTREAM"), "/work/up",
                            *(list(real_bin_dir().parents)[:4] if real_bin_dir() else []))


def make_vocab(path: Path) -> Path:
    """A small llama-spm-like vocabulary GGUF (no tensors): specials, bytes-free, the ladder's words."""
    import gguf

    from ggml_bridge import ladder

    tokens = ["<unk>", "<s>", "</s>"] + ["\u2581" + w for w in ladder.WORDS] + list("abcdefghijklmnopqrstuvwxyz.") + ["\u2581"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path
