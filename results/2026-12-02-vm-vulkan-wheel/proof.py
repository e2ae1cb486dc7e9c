"""The +vulkan wheel as a user gets it, on Mesa lavapipe (a real Vulkan driver on the CPU): a bare venv, no compiler on
PATH, no checkout importable; ldd of every ELF; --version; greedy completions with batching off and on on Vulkan0
(GGML_VK_VISIBLE_DEVICES=0), compared with the source build's llama-server (same series) byte for byte.
-ngl 2: the tiny model's two layers on Vulkan0, its output layer on the CPU, as ladders/vulkan.toml does: with -ngl 99
upstream's own llama-server (the unpatched build) segfaults on lavapipe once a prompt is longer than -b 64 (README).

python3 proof.py WHEEL SOURCE_BIN_DIR VOCAB_GGUF OUT_DIR   (run from the repository root: uses ggml_bridge.model)
"""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

from ggml_bridge import model, serve

wheel, src_bin, vocab, out = (Path(a).resolve() for a in sys.argv[1:5])
out.mkdir(parents=True, exist_ok=True)
tmp = Path("/tmp/vkwheel-proof")
shutil.rmtree(tmp, ignore_errors=True)
home = tmp / "home"
home.mkdir(parents=True)
venv.EnvBuilder(with_pip=True).create(tmp / "venv")
vbin = tmp / "venv" / "bin"
nocc = tmp / "nocc"
nocc.mkdir()
for tool in ("sh", "bash", "ldd", "env", "cat", "uname", "sed", "grep"):  # a PATH without compilers or cmake
    if shutil.which(tool):
        (nocc / tool).symlink_to(shutil.which(tool))
bare = {"PATH": f"{vbin}:{nocc}", "HOME": str(home), "LANG": "C.UTF-8", "GGML_VK_VISIBLE_DEVICES": "0"}
report: dict = {"wheel": wheel.name, "size_bytes": wheel.stat().st_size}


def run(*a: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(a), cwd=home, env=env or bare, capture_output=True, text=True, timeout=600)


r = run(str(vbin / "python"), "-m", "pip", "install", "-q", "--no-index", str(wheel))
assert r.returncode == 0, r.stderr
r = run(str(vbin / "python"), "-c", "import ggml_bridge_server as g; print(g.PACKAGE_DIR)")
pkg = Path(r.stdout.strip())
report["build_json"] = json.loads((pkg / "build.json").read_text())
elves = [p for p in sorted(pkg.rglob("*")) if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
ldd = {}
for e in elves:
    lines = run("ldd", str(e)).stdout.splitlines()
    ldd[str(e.relative_to(pkg))] = lines
bad = [f"{k}: {l.strip()}" for k, v in ldd.items() for l in v if "not found" in l or "/work/" in l or "cache" in l]
report["elf_files"] = len(elves)
report["ldd_problems"] = bad
report["libvulkan"] = sorted({l.split("=>")[1].split()[0] for v in ldd.values() for l in v if "libvulkan" in l})
(out / "ldd.txt").write_text("\n".join(f"== {k}\n" + "\n".join(v) for k, v in ldd.items()))
r = run(str(vbin / "ggml-bridge-server"), "--version")
report["version"] = (r.stdout + r.stderr).strip().splitlines()[-2:]
gguf = model.ensure_model(tmp / "models", "tiny", 1, vocab)


def greedy(server: Path, label: str, batched: str) -> str:
    port = serve.free_port()
    log = out / f"server-{label}.log"
    env = {**bare, "LLAMA_BATCHED_TRANSFERS": batched} if label.startswith("wheel") else {
        **os.environ, "GGML_VK_VISIBLE_DEVICES": "0", "LLAMA_BATCHED_TRANSFERS": batched}
    argv = [str(server), "-m", str(gguf), "--port", str(port), "-c", "256", "-t", "2", "--no-webui", "-ngl", "2",
            "-b", "64", "-ub", "16", "-lv", "4"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, cwd=home, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        body = json.dumps({"prompt": "The quick brown fox jumps over the lazy dog " * 6, "n_predict": 24,
                           "temperature": 0, "seed": 1, "cache_prompt": False, "n_probs": 4}).encode()
        for _ in range(900):
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as resp:
                    res = json.loads(resp.read())
                break
            except OSError:
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.2)
        else:
            raise AssertionError(log.read_text()[-3000:])
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text(errors="replace")
    report[label] = {
        "content": res["content"],
        "probs_sha": __import__("hashlib").sha256(json.dumps(res.get("completion_probabilities")).encode()).hexdigest(),
        "vulkan_lines": [l for l in text.splitlines() if "Vulkan0" in l and ("offload" in l or "buffer size" in l
                                                                           or "using device" in l)][:4],
        "batched_lines": [l.split("llama_batched_transfers: ", 1)[1] for l in text.splitlines()
                          if "llama_batched_transfers: " in l][:4],
    }
    return res["content"]


for batched in os.environ.get("PROOF_BATCHED", "0 1").split():
    a = greedy(vbin / "ggml-bridge-server", f"wheel-batched{batched}", batched)
    b = greedy(src_bin / "llama-server", f"source-batched{batched}", batched)
    report[f"identical_batched{batched}"] = (a == b and report[f"wheel-batched{batched}"]["probs_sha"]
                                             == report[f"source-batched{batched}"]["probs_sha"])
(out / "report.json").write_text(json.dumps(report, indent=1))
print(json.dumps({k: v for k, v in report.items() if k not in ("build_json",)}, indent=1)[:6000])
