#!/usr/bin/env python3
"""Nothing -> first served token, two ways, interleaved over rounds; then server throughput of both binaries.

The source path (what `make build` does, from nothing): a fresh venv, `pip install` of this checkout, then
`ggml-bridge build --backend cpu` into an empty cache (fetch, patch, web UI with npm, compile), ccache off
(CMAKE_ARGS dropped, CCACHE_DISABLE=1). The wheel path: a fresh venv, `pip install` of a prebuilt
ggml-bridge-server wheel (offline). Each then starts its llama-server on the same tiny random-weight model and
times the first token of a /completion. The model is written beforehand (the same file for both, not timed).

Throughput (--throughput-rounds): the wheel's llama-server and the last round's source-built one serve the same
model, in ABBA order per round; each does --requests /completion requests of --n-predict tokens after one
warm-up; the figures are llama-server's own timings (predicted_per_second, prompt_per_second).

    python scripts/wheel_timing.py --wheel dist/ggml_bridge_server-0.1.0+cpu-py3-none-linux_x86_64.whl \
        --vocab PATH/ggml-vocab-llama-spm.gguf --out results/DATE-cpu-wheel-timing [--rounds 2]

Writes timing.json (rewritten after every step, so an interrupted run keeps what it measured) and timing.md into
--out; every step records the load average before and after it. Run it on an otherwise idle machine for figures
worth quoting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggml_bridge.experiments import model  # noqa: E402
from ggml_bridge.runtime import llama_server  # noqa: E402


class Server:
    """A llama-server on the model, waited for until /health answers; (seconds to ready) in .ready_s."""

    def __init__(self, server: Path, gguf: Path, ctx: int = 512) -> None:
        self.port = llama_server.free_port()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(server), "-m", str(gguf), "--port", str(self.port), "-c", str(ctx), "-np", "1", "-t", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{server} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        self.ready_s = time.monotonic() - t0
        self.t0 = t0

    def complete(self, prompt: str, n_predict: int) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(
                {"prompt": prompt, "n_predict": n_predict, "seed": 1, "ignore_eos": True, "cache_prompt": False}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        assert out.get("tokens_predicted") == n_predict, out
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def first_token(server: Path, gguf: Path) -> float:
    """Seconds from starting llama-server to the first generated token of a /completion."""
    s = Server(server, gguf, ctx=256)
    try:
        s.complete("Hello", 1)
        return time.monotonic() - s.t0
    finally:
        s.stop()


def timed(argv: list, **kw) -> float:  # type: ignore[type-arg, no-untyped-def]
    t0 = time.monotonic()
    subprocess.run([str(a) for a in argv], check=True, **kw)
    return time.monotonic() - t0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def load() -> float:
    return round(os.getloadavg()[0], 2)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def wheel_path(work: Path, wheel: Path, gguf: Path) -> dict:
    venv = work / "wheel-venv"
    shutil.rmtree(venv, ignore_errors=True)
    r: dict = {"load_before": load()}
    r["venv_s"] = timed([sys.executable, "-m", "venv", venv])
    r["pip_install_s"] = timed(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel]
    )
    server = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import ggml_bridge_server as g; print(g.get_binary_path())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    r["first_token_s"] = first_token(server, gguf)
    r["total_s"] = r["venv_s"] + r["pip_install_s"] + r["first_token_s"]
    r["installed_bytes"] = du(server.parent.parent)
    r["server"] = str(server)
    r["load_after"] = load()
    return r


def source_path(work: Path, gguf: Path, tag: str) -> dict:
    venv, cache = work / f"src-venv-{tag}", work / f"src-cache-{tag}"
    r: dict = {"load_before": load()}
    r["venv_s"] = timed([sys.executable, "-m", "venv", venv])
    # `make install` without the test extras and not editable: a user's install of the toolkit
    r["pip_install_s"] = timed([venv / "bin" / "python", "-m", "pip", "install", "-q", ROOT], stdout=subprocess.DEVNULL)
    env = {**os.environ, "GGML_BRIDGE_CACHE_DIR": str(cache), "CCACHE_DISABLE": "1"}
    env.pop("CMAKE_ARGS", None)  # no ccache launcher: a new user's first build
    t0 = time.monotonic()
    out = subprocess.run(
        [venv / "bin" / "ggml-bridge", "build", "--backend", "cpu"], env=env, capture_output=True, text=True
    )
    r["build_s"] = time.monotonic() - t0
    (work / f"build-{tag}.log").write_text(out.stderr)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    steps = [line.strip() for line in out.stderr.splitlines() if line.startswith(("==>", "    done in"))]
    r["build_steps"] = steps
    built = Path(out.stdout.strip().splitlines()[-1])
    r["first_token_s"] = first_token(built, gguf)
    r["total_s"] = r["venv_s"] + r["pip_install_s"] + r["build_s"] + r["first_token_s"]
    r["bin_dir_bytes"] = du(built.parent)
    r["server"] = str(built)
    r["load_after"] = load()
    return r


def throughput(server: Path, gguf: Path, requests: int, n_predict: int) -> dict:
    prompt = "Once upon a time, " * 16
    s = Server(server, gguf)
    try:
        s.complete(prompt, 8)  # warm-up
        t = [s.complete(prompt, n_predict)["timings"] for _ in range(requests)]
    finally:
        s.stop()
    return {
        "predicted_per_second": [x["predicted_per_second"] for x in t],
        "prompt_per_second": [x["prompt_per_second"] for x in t],
        "load": load(),
    }


def report(res: dict, out: Path) -> str:
    (out / "timing.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [
        f"{res['date']} on {res['machine']}; ggml-bridge {res['commit']}, wheel {res['wheel']} "
        f"(sha256 {res['wheel_sha256'][:16]}, series {res['wheel_series'][:16]}, patched head "
        f"{res['wheel_patched_head'][:12]})",
        "",
        "| round | path | venv | pip install | build | start + first token | **total** | load 1-min before/after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, rnd in enumerate(res["rounds"], 1):
        for name in rnd["order"]:
            p = rnd.get(name)
            if p:
                lines.append(
                    f"| {i} | {name} | {p['venv_s']:.1f} | {p['pip_install_s']:.1f} | "
                    f"{p.get('build_s', 0):.1f} | {p['first_token_s']:.2f} | **{p['total_s']:.1f}** | "
                    f"{p['load_before']} / {p['load_after']} |"
                )
        if rnd.get("source", {}).get("total_s") and rnd.get("wheel"):
            lines.append(
                f"| {i} | **source / wheel** | | | | | **{rnd['source']['total_s'] / rnd['wheel']['total_s']:.0f}x** | |"
            )
    if res.get("throughput"):
        t = res["throughput"]
        lines += [
            "",
            f"Server throughput, model {t['model']}, {t['requests']} x {t['n_predict']} tokens per run "
            f"after a warm-up, -t 2, {len(t['runs'])} runs in ABBA order (median of each run's requests):",
            "",
            "| run | binary | generation tok/s | prompt tok/s | load after |",
            "|---|---|---|---|---|",
        ]
        for i, run in enumerate(t["runs"], 1):
            lines.append(
                f"| {i} | {run['binary']} | {statistics.median(run['predicted_per_second']):.1f} | "
                f"{statistics.median(run['prompt_per_second']):.1f} | {run['load']} |"
            )
        for b in ("wheel", "source"):
            g = [v for run in t["runs"] if run["binary"] == b for v in run["predicted_per_second"]]
            p = [v for run in t["runs"] if run["binary"] == b for v in run["prompt_per_second"]]
            if g:
                lines.append(f"| all | **{b}** | **{statistics.median(g):.1f}** | **{statistics.median(p):.1f}** | |")
    lines += [
        "",
        f"wheel {res['wheel_bytes'] / 1e6:.1f} MB; load average at start {res['load_start']}, {res['cores']} cores",
    ]
    text = "\n".join(lines) + "\n"
    (out / "timing.md").write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--vocab", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both paths (default 2)")
    ap.add_argument("--skip-source", action="store_true", help="only the wheel path (and no throughput)")
    ap.add_argument("--throughput-rounds", type=int, default=2, help="ABBA rounds (default 2; 0 = none)")
    ap.add_argument("--throughput-model", default="small")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument(
        "--source-server",
        type=Path,
        help="throughput only: the wheel's llama-server against this already built one (no timing rounds)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheel-timing-"))
    with zipfile.ZipFile(args.wheel) as z:
        manifest = json.loads(z.read("ggml_bridge_server/manifest.json"))
    res: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": os.uname().nodename
        + ", "
        + next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"),
        "cores": os.cpu_count(),
        "load_start": os.getloadavg(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "wheel": args.wheel.name,
        "wheel_sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(),
        "wheel_series": manifest["series_hash"],
        "wheel_patched_head": manifest["patched_head"],
        "wheel_bytes": args.wheel.stat().st_size,
        "rounds": [],
    }
    gguf = model.ensure_model(work / "models", "tiny", 1, args.vocab)
    try:
        for i in range(0 if args.source_server else args.rounds):
            # alternate which path goes first, so a trend in the machine's load hits both
            order = ["wheel", "source"] if i % 2 == 0 else ["source", "wheel"]
            rnd: dict = {"order": order if not args.skip_source else ["wheel"]}
            res["rounds"].append(rnd)
            for name in rnd["order"]:
                if name == "source" and i > 0:
                    shutil.rmtree(work / f"src-cache-{i - 1}", ignore_errors=True)  # keep only the newest build
                rnd[name] = wheel_path(work, args.wheel, gguf) if name == "wheel" else source_path(work, gguf, str(i))
                print(report(res, args.out), flush=True)
        if args.source_server:
            res["source_server"] = str(args.source_server)
            res["rounds"].append({"order": ["wheel"], "wheel": wheel_path(work, args.wheel, gguf)})
            res["rounds"][-1]["source"] = {"server": str(args.source_server)}
        if args.throughput_rounds and (args.source_server or not args.skip_source):
            big = model.ensure_model(work / "models", args.throughput_model, 1234, args.vocab)
            bins = {
                "wheel": Path(res["rounds"][-1]["wheel"]["server"]),
                "source": Path(res["rounds"][-1]["source"]["server"]),
            }
            t = res["throughput"] = {
                "model": f"{args.throughput_model} (seed 1234)",
                "requests": args.requests,
                "n_predict": args.n_predict,
                "runs": [],
            }
            for i in range(args.throughput_rounds):
                for b in (
                    ["wheel", "source", "source", "wheel"] if i % 2 == 0 else ["source", "wheel", "wheel", "source"]
                ):
                    t["runs"].append({"binary": b, **throughput(bins[b], big, args.requests, args.n_predict)})
                    report(res, args.out)
        for log in work.glob("build-*.log"):
            shutil.copy(log, args.out / log.name)
        res["load_end"] = os.getloadavg()
        print(report(res, args.out))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
