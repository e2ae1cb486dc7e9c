"""Start the patched llama-server for Vulkan with the flags of ladders/vulkan.toml's tiny-2dev-ub16 rung (two lavapipe
devices, batching on) N times, post M prompts of 5-100 words to each, and count the servers that died.

Usage: python repro-ladder-server.py BIN_DIR UPSTREAM_SRC SERVERS PROMPTS [VAR=VALUE ...]
(BIN_DIR: the patched build's bin folder; UPSTREAM_SRC: the pinned tree, for its vocab GGUF; run from a checkout of
ggml-bridge with its environment, which generates the rung's tiny model into ./repro-models.)"""

import os
import random
import socket
import subprocess
import sys
import time

import requests

from ggml_bridge.experiments import model

bindir, src, nservers, nprompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
extra_env = dict(a.split("=", 1) for a in sys.argv[5:])
vocab = f"{src}/models/ggml-vocab-llama-spm.gguf"
gguf = model.ensure_model("repro-models", "tiny", 1234, vocab)
words = [w for w in model.load_vocab(vocab).tokens[300:5000] if w.isalpha()]
deaths = 0
for s in range(nservers):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(
        os.environ,
        GGML_VK_VISIBLE_DEVICES="0,0",
        LD_LIBRARY_PATH=bindir,
        GGML_CUDA_MAPPED_HOST_BRIDGE="0",
        LLAMA_BATCHED_TRANSFERS="1",
        **extra_env,
    )
    log = open(f"server-{s}.log", "w")
    p = subprocess.Popen(
        [
            f"{bindir}/llama-server",
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "256",
            "-np",
            "1",
            "--no-webui",
            "--metrics",
            "-lv",
            "4",
            "-t",
            "2",
            "-ngl",
            "2",
            "-b",
            "64",
            "-ub",
            "16",
            "-sm",
            "layer",
            "-dev",
            "Vulkan0,Vulkan1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    t0 = time.time()
    while time.time() - t0 < 60 and p.poll() is None:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.1)
    rng = random.Random(s)
    died = p.poll() is not None
    for _ in range(nprompts if not died else 0):
        prompt = " ".join(rng.choice(words) for _ in range(rng.choice([5, 12, 16, 30, 34, 60, 100])))
        try:
            requests.post(
                f"http://127.0.0.1:{port}/completion",
                timeout=120,
                json={
                    "prompt": prompt,
                    "n_predict": 4,
                    "temperature": 0.0,
                    "n_probs": 4,
                    "cache_prompt": False,
                    "ignore_eos": True,
                    "return_tokens": True,
                    "seed": 1,
                    "stream": False,
                },
            )
        except requests.RequestException:
            died = True
            break
        if p.poll() is not None:
            died = True
            break
    if p.poll() is None:
        p.terminate()
        p.wait(20)
    else:
        died = True
    if died:
        deaths += 1
        print(f"server {s}: died, status {p.returncode} (server-{s}.log)", flush=True)
    else:
        os.remove(f"server-{s}.log")
print(f"deaths {deaths} of {nservers}", flush=True)
