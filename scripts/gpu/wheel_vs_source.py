#!/usr/bin/env python3
"""The installed CUDA wheel against the source build of the same series: greedy responses and full logits, byte
for byte, with both mechanisms on.

Greedy: ``ggml-bridge serve --bridge force --batched on --server BIN/llama-server`` of each side in turn (the
environment's GGML_CUDA_DEVICES makes virtual devices of one GPU, so the bridge carries every boundary), the
requests of serve_rpc_greedy.py (temperature 0, n_probs 4, ignore_eos), canonical responses compared. Full logits:
``llama-perplexity --kl-divergence-base`` of each side (every token's log-probabilities over the vocabulary), the
bridge forced and batching on, dumps compared by sha256. Writes OUT/result.json and OUT/result.md; exit 0 when all
identical, 1 when not, 2 when a side failed to run.

    GGML_CUDA_DEVICES=4 python3 scripts/gpu/wheel_vs_source.py --wheel-bin SITE/ggml_bridge_server/bin \\
        --source-bin CACHE/builds/.../bin --vocab ggml-vocab-llama-spm.gguf --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serve_rpc_greedy import PROMPTS, run  # noqa: E402

from ggml_bridge import model  # noqa: E402
from ggml_bridge.ladder import inputs  # noqa: E402

SIDES = ("source", "wheel")
#: both mechanisms on for the full-logits runs (on a build without CUDA the bridge's variable is not read)
PPL_ENV = {"GGML_CUDA_MAPPED_HOST_BRIDGE": "force", "LLAMA_BATCHED_TRANSFERS": "1"}


def perplexity(bindir: Path, gguf: Path, text: Path, dump: Path, log: Path) -> dict:
    argv = [str(bindir / "llama-perplexity"), "-m", str(gguf), "-f", str(text), "-c", "256", "-b", "512"]
    argv += ["-ub", "128", "-ngl", "999", "-sm", "layer", "--kl-divergence-base", str(dump)]
    env = {**os.environ, **PPL_ENV}
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    out = res.stdout + res.stderr
    log.write_text(" ".join(argv) + "\n" + out)
    ppl = re.findall(r"Final estimate: PPL = ([0-9.]+)", out)
    return {
        "rc": res.returncode,
        "sha256": hashlib.sha256(dump.read_bytes()).hexdigest() if dump.is_file() else None,
        "bytes": dump.stat().st_size if dump.is_file() else 0,
        "ppl": ppl[-1] if ppl else None,
        "bridge_line": next((ln for ln in out.splitlines() if "ggml_cuda_mapped_host_bridge: enabled" in ln), None),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-bin", required=True, type=Path)
    ap.add_argument("--source-bin", required=True, type=Path)
    ap.add_argument("--vocab", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shape", default="small")
    ap.add_argument(
        "--serve-args",
        default="--bridge force --batched on",
        help="ggml-bridge serve's mechanism flags for both sides (on a CPU build: --bridge off --batched off)",
    )
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    bins = {"source": a.source_bin, "wheel": a.wheel_bin}
    gguf = model.ensure_model(a.out / "models", a.shape, 1234, a.vocab)
    text = a.out / "text.txt"
    text.write_text(inputs.make_text(800, 7, model.load_vocab(a.vocab).tokens))
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), root) if x))
    server_args = ["-m", str(gguf), "-ngl", "999", "-sm", "layer", "-c", "2048", "-np", "1", "-lv", "4"]
    result: dict = {"shape": a.shape, "GGML_CUDA_DEVICES": os.environ.get("GGML_CUDA_DEVICES"), "bins": {}}
    greedy = {}
    try:
        for side in SIDES:
            result["bins"][side] = str(bins[side])
            launcher = [*shlex.split(a.serve_args), "--server", str(bins[side] / "llama-server")]
            greedy[side] = run(side, launcher, server_args, env, a.out)
    except (RuntimeError, OSError) as e:
        print(f"wheel_vs_source: {e}", file=sys.stderr)
        return 2
    same = [x == y for x, y in zip(greedy["source"], greedy["wheel"], strict=True)]
    result["greedy"] = {"requests": len(PROMPTS), "identical": sum(same), "bytes": sum(map(len, greedy["wheel"]))}
    logits = {
        side: perplexity(bins[side], gguf, text, a.out / f"{side}.logits", a.out / f"{side}-ppl.log") for side in SIDES
    }
    result["logits"] = logits
    logits_same = (
        logits["source"]["rc"] == 0
        and logits["wheel"]["rc"] == 0
        and (logits["source"]["sha256"] is not None and logits["source"]["sha256"] == logits["wheel"]["sha256"])
    )
    if logits_same:
        for side in SIDES:
            (a.out / f"{side}.logits").unlink()  # equal: the hash says it
    ok = all(same) and len(same) == len(PROMPTS) and logits_same
    result["identical"] = ok
    (a.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Installed wheel vs source build ({a.shape}, GGML_CUDA_DEVICES={result['GGML_CUDA_DEVICES']}; serve "
        f"{a.serve_args}; llama-perplexity with {' '.join(f'{k}={v}' for k, v in PPL_ENV.items())})",
        "",
        f"- greedy (serve): {sum(same)}/{len(PROMPTS)} responses identical ({result['greedy']['bytes']} bytes)",
        f"- full logits (llama-perplexity --kl-divergence-base): {'identical' if logits_same else '**DIFFERENT**'}, "
        f"{logits['wheel']['bytes']} bytes, sha256 source `{(logits['source']['sha256'] or '-')[:16]}` wheel "
        f"`{(logits['wheel']['sha256'] or '-')[:16]}`, PPL {logits['source']['ppl']} / {logits['wheel']['ppl']}",
        f"- bridge line (wheel): `{logits['wheel']['bridge_line']}`",
    ]
    (a.out / "result.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[2:]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
