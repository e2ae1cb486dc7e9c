#!/usr/bin/env python3
"""The portable wheel's contract is per CPU variant: with the same ggml CPU variant loaded, the patched build (the
wheel) and upstream give byte-identical full logits. Runs llama-perplexity --kl-divergence-base (every token's
log-probabilities over the whole vocabulary) of both on random-weight models, with exactly one CPU variant module
beside each binary, and compares the dumps byte for byte. Writes results.json and results.md into --out.

  python scripts/cpu_variant_proof.py --patched-bin PKG/bin --upstream-bin BUILD/bin --vocab ggml-vocab-llama-spm.gguf \\
      --variant x64 --out results/DATE-MACHINE-cpu-variant-proof

Each --*-bin folder must hold llama-perplexity and libggml-cpu-<variant>.so and no other libggml-cpu-*.so (ggml's
loader looks in the program's folder): the script refuses otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggml_bridge import model  # noqa: E402
from ggml_bridge.ladder import inputs  # noqa: E402

#: (shape, context, batch, ubatch): one-token ubatches, several ubatches per sequence, f16 and f32 weights
CASES = (("tiny", 64, 64, 1), ("tiny-f16", 128, 128, 32), ("small", 128, 256, 64), ("small-f32", 256, 512, 512))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--patched-bin", type=Path, required=True)
    ap.add_argument("--upstream-bin", type=Path, required=True)
    ap.add_argument("--vocab", type=Path, required=True)
    ap.add_argument("--variant", default="x64")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for side in (a.patched_bin, a.upstream_bin):
        mods = sorted(p.name for p in side.glob("libggml-cpu-*.so"))
        if mods != [f"libggml-cpu-{a.variant}.so"]:
            print(f"error: {side} must hold exactly libggml-cpu-{a.variant}.so, holds {mods}", file=sys.stderr)
            return 2
    text = a.out / "text.txt"
    text.write_text(inputs.make_text(600, 7, model.load_vocab(a.vocab).tokens))
    rows = []
    for shape, ctx, batch, ubatch in CASES:
        gguf = model.ensure_model(a.out / "models", shape, 1234, a.vocab)
        row: dict = {"shape": shape, "ctx": ctx, "batch": batch, "ubatch": ubatch}
        for side, bindir in (("upstream", a.upstream_bin), ("patched", a.patched_bin)):
            dump = a.out / f"{shape}-{side}.logits"
            argv = [
                str(bindir / "llama-perplexity"),
                "-m",
                str(gguf),
                "-f",
                str(text),
                "-c",
                str(ctx),
                "-b",
                str(batch),
                "-ub",
                str(ubatch),
                "-t",
                str(a.threads),
                "--kl-divergence-base",
                str(dump),
            ]
            t0 = time.monotonic()
            res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": ""})
            log = res.stdout + res.stderr
            (a.out / f"{shape}-{side}.log").write_text(" ".join(argv) + "\n" + log)
            # the loaded CPU module's features, as llama prints them (x64: none of SSE/AVX)
            loaded = re.findall(r"system_info: .*\| (CPU : [^\n]*)", log)
            ppl = re.findall(r"Final estimate: PPL = ([0-9.]+)", log)
            row[side] = {
                "rc": res.returncode,
                "sha256": hashlib.sha256(dump.read_bytes()).hexdigest() if dump.is_file() else None,
                "bytes": dump.stat().st_size if dump.is_file() else 0,
                "cpu_backend": loaded,
                "ppl": ppl[-1] if ppl else None,
                "wall_s": round(time.monotonic() - t0, 2),
            }
        row["identical"] = (
            row["upstream"]["rc"] == 0
            and row["patched"]["rc"] == 0
            and row["upstream"]["sha256"] is not None
            and row["upstream"]["sha256"] == row["patched"]["sha256"]
        )
        if row["identical"]:
            for side in ("upstream", "patched"):
                (a.out / f"{shape}-{side}.logits").unlink()  # equal: the hash says it; keep the results small
        rows.append(row)
        print(
            f"{shape}: {'identical' if row['identical'] else 'DIFFERENT'} "
            f"({row['upstream']['bytes']} bytes, PPL {row['upstream']['ppl']} / {row['patched']['ppl']})"
        )
    ok = all(r["identical"] for r in rows)
    (a.out / "results.json").write_text(
        json.dumps({"variant": a.variant, "cases": rows, "all_identical": ok, "argv": sys.argv}, indent=2) + "\n"
    )
    md = [
        f"# CPU variant `{a.variant}` alone: upstream vs patched, full logits (llama-perplexity --kl-divergence-base)",
        "",
        "| shape | ctx | batch | ubatch | bytes | sha256 (both) | PPL | identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['shape']} | {r['ctx']} | {r['batch']} | {r['ubatch']} | {r['upstream']['bytes']} | "
            f"`{(r['upstream']['sha256'] or '')[:16]}`{'' if r['identical'] else ' / `' + (r['patched']['sha256'] or '')[:16] + '`'} | "
            f"{r['upstream']['ppl']} | {'yes' if r['identical'] else '**no**'} |"
        )
    md += [
        "",
        "CPU features of the loaded module (system_info): upstream "
        + ", ".join(sorted({p for r in rows for p in r['upstream']['cpu_backend']}))
        + "; patched "
        + ", ".join(sorted({p for r in rows for p in r['patched']['cpu_backend']})),
    ]
    (a.out / "results.md").write_text("\n".join(md) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
