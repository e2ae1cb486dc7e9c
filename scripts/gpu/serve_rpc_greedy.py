#!/usr/bin/env python3
"""The launcher's RPC mode serving, against the local server: greedy completions byte for byte.

Starts ``ggml-bridge serve --bridge force --rpc-local-devices CUDA0,CUDA1 --rpc-local-only -- -m MODEL -ngl 99``
(one rpc-server owning the devices, llama-server without a GPU; GGML_CUDA_DEVICES=2 in the environment makes two
virtual devices of one GPU), sends the ladder's greedy requests (temperature 0, n_probs, ignore_eos), stops it with
SIGTERM, then does the same with ``ggml-bridge serve --bridge off -- -m MODEL -ngl 99`` on one local GPU, and compares
the canonical responses (content, tokens, probabilities) byte for byte. Writes OUT/{rpc,local}.jsonl, the launchers'
stderr and OUT/result.json; exit 0 when identical, 1 when not, 2 when a launcher failed.

    GGML_CUDA_DEVICES=2 python3 scripts/gpu/serve_rpc_greedy.py --server BIN/llama-server --model M.gguf --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ggml_bridge.ladder.inputs import canonical_response  # noqa: E402
from ggml_bridge.serve import free_port  # noqa: E402

PROMPTS = ["the city of", "a river runs through " * 12, "one two three four five six seven eight nine ten " * 20]


def run(label: str, launcher_args: list[str], server_args: list[str], env: dict[str, str], out: Path) -> list[bytes]:
    port = free_port()
    err = open(out / f"{label}.stderr.txt", "w")
    p = subprocess.Popen(
        [sys.executable, "-m", "ggml_bridge", "serve", *launcher_args, "--", *server_args, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    try:
        url = p.stdout.readline().strip() if p.stdout else ""
        if not url.startswith("http"):
            raise RuntimeError(f"{label}: the launcher printed no URL (status {p.wait(30)}); see {err.name}")
        got = []
        for i, prompt in enumerate(PROMPTS):
            body = json.dumps(
                {
                    "prompt": prompt,
                    "n_predict": 32,
                    "temperature": 0.0,
                    "n_probs": 4,
                    "cache_prompt": False,
                    "ignore_eos": True,
                    "return_tokens": True,
                    "seed": 1,
                    "stream": False,
                }
            ).encode()
            req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                got.append(canonical_response(r.read(), i))
        (out / f"{label}.jsonl").write_bytes(b"".join(got))
        return got
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        err.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--devices", default="CUDA0,CUDA1", help="the local rpc-server's devices")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more llama-server argument for both runs (e.g. --no-repack on CPU: docs/rpc.md)",
    )
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), str(ROOT)) if x))
    common = ["-m", str(a.model), "-ngl", "99", "-c", "2048", "-np", "1", "-lv", "4", *a.server_arg]
    t0 = time.monotonic()
    try:
        rpc = run(
            "rpc",
            [
                "--bridge",
                "force",
                "--server",
                str(a.server),
                "--rpc-local-devices",
                a.devices,
                "--rpc-local-only",
                "--server-log",
                str(a.out / "rpc-server-front.log"),
            ],
            common,
            env,
            a.out,
        )
        local_env = {k: v for k, v in env.items() if k != "GGML_CUDA_DEVICES"}
        local = run("local", ["--bridge", "off", "--server", str(a.server)], common, local_env, a.out)
    except (RuntimeError, OSError) as e:
        print(f"serve_rpc_greedy: {e}", file=sys.stderr)
        return 2
    same = [x == y for x, y in zip(rpc, local, strict=True)]
    result = {
        "requests": len(PROMPTS),
        "identical": sum(same),
        "seconds": round(time.monotonic() - t0, 1),
        "rpc_bytes": sum(map(len, rpc)),
        "devices": a.devices,
        "GGML_CUDA_DEVICES": os.environ.get("GGML_CUDA_DEVICES"),
    }
    (a.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"serve --rpc-local-devices {a.devices} --rpc-local-only vs local serve: {sum(same)}/{len(same)} greedy "
        f"responses identical ({result['rpc_bytes']} bytes)"
    )
    return 0 if all(same) and len(same) == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
