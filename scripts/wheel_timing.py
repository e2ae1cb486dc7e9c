#!/usr/bin/env python3
"""Nothing -> first served token, two ways, in one run: the source path (`ggml-bridge build` into an empty cache:
fetch, patch, web UI with npm, compile) and the wheel path (a fresh venv, `pip install` of a prebuilt
ggml-bridge-server wheel, offline). Each then starts llama-server on the same tiny random-weight model and times
the first token of a /completion. The model is written beforehand (the same file for both paths, not timed).

    python scripts/wheel_timing.py --wheel dist/ggml_bridge_server-0.1.0+cpu-py3-none-linux_x86_64.whl \
        --vocab PATH/ggml-vocab-llama-spm.gguf --out results/<date>-cpu-wheel-timing [--skip-source]

Writes timing.json and timing.md into --out. Run it on an otherwise idle machine for figures worth quoting;
the load average at start and end is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggml_bridge import model, serve  # noqa: E402


def first_token(server: Path, gguf: Path, env: dict[str, str] | None = None) -> float:
    """Seconds from starting llama-server to the first generated token of a /completion."""
    port = serve.free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([str(server), "-m", str(gguf), "--port", str(port), "-c", "256", "-np", "1", "-t", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{server} exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                     data=json.dumps({"prompt": "Hello", "n_predict": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
        assert out.get("tokens_predicted") == 1, out
        return time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def timed(argv: list[str], **kw) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    subprocess.run(argv, check=True, **kw)
    return time.monotonic() - t0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--vocab", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-source", action="store_true", help="only the wheel path")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheel-timing-"))
    res: dict = {"load_start": os.getloadavg(), "cores": os.cpu_count(), "wheel": args.wheel.name,
                 "wheel_bytes": args.wheel.stat().st_size}
    gguf = model.ensure_model(work / "models", "tiny", 1, args.vocab)

    # the wheel path: a fresh venv, pip install of the wheel (no network), first token
    venv = work / "venv"
    t_venv = timed([sys.executable, "-m", "venv", str(venv)])
    t_pip = timed([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(args.wheel)])
    server = Path(subprocess.run([venv / "bin" / "python", "-c", "import ggml_bridge_server as g; "
                                  "print(g.get_binary_path())"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    t_tok = first_token(server, gguf)
    res["wheel_path"] = {"venv_s": t_venv, "pip_install_s": t_pip, "first_token_s": t_tok,
                         "total_s": t_venv + t_pip + t_tok, "installed_bytes": du(server.parent.parent)}

    if not args.skip_source:
        # the source path: an empty cache, the toolkit's own defaults (as `make build` runs it), first token
        env = {**os.environ, "GGML_BRIDGE_CACHE_DIR": str(work / "cache")}
        env.pop("CMAKE_ARGS", None)  # no ccache: a new user's first build
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "ggml_bridge", "build", "--backend", "cpu"], env=env,
                             capture_output=True, text=True)
        t_build = time.monotonic() - t0
        if out.returncode != 0:
            raise SystemExit(out.stderr[-3000:])
        built = Path(out.stdout.strip().splitlines()[-1])
        t_tok2 = first_token(built, gguf)
        res["source_path"] = {"build_s": t_build, "first_token_s": t_tok2, "total_s": t_build + t_tok2,
                              "build_dir_bin_bytes": du(built.parent)}
        res["speedup"] = res["source_path"]["total_s"] / res["wheel_path"]["total_s"]
    res["load_end"] = os.getloadavg()
    (args.out / "timing.json").write_text(json.dumps(res, indent=2) + "\n")
    w = res["wheel_path"]
    lines = ["| path | step | seconds |", "|---|---|---|",
             f"| wheel | venv | {w['venv_s']:.1f} |", f"| wheel | pip install (offline) | {w['pip_install_s']:.1f} |",
             f"| wheel | start + first token | {w['first_token_s']:.1f} |",
             f"| wheel | **total** | **{w['total_s']:.1f}** |"]
    if "source_path" in res:
        s = res["source_path"]
        lines += [f"| source | ggml-bridge build (fetch, patch, UI, compile) | {s['build_s']:.1f} |",
                  f"| source | start + first token | {s['first_token_s']:.1f} |",
                  f"| source | **total** | **{s['total_s']:.1f}** |", "", f"speed-up: {res['speedup']:.0f}x"]
    lines += ["", f"wheel {res['wheel_bytes'] / 1e6:.1f} MB, installed {w['installed_bytes'] / 1e6:.1f} MB; "
              f"load average {res['load_start'][0]:.1f} -> {res['load_end'][0]:.1f} on {res['cores']} cores"]
    (args.out / "timing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
