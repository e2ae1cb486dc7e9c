#!/usr/bin/env python3
"""Soak benchmark of the launcher: thousands of requests through `ggml-bridge serve`, its memory at start and end.

Starts `python -m ggml_bridge serve` (the product's CLI, with its default `-lv 4`, at which llama-server logs
about a thousand lines per request once its prompt cache fills) on a real llama-server build and a random-weight
tiny model, waits for the URL it prints, sends ``--requests`` /completion requests, and samples the resident
memory (VmRSS) of the launcher and of llama-server. Writes ``soak.json`` and ``soak.md`` into ``--report``.
It reports figures; it asserts nothing about them (results/2026-11-30-cpu-launcher-soak/README.md holds a run).

    .venv/bin/python scripts/soak.py --requests 4000 --report /tmp/soak
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tiny_server import tiny_setup  # noqa: E402  (scripts/ is on sys.path)

from ggml_bridge.foundations import signals  # noqa: E402
from ggml_bridge.runtime import llama_server  # noqa: E402


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def post(url: str, payload: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(
        url + "/completion", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--server", type=Path, default=None, help="llama-server (default: the latest patched CPU build)")
    ap.add_argument("--vocab", type=Path, default=None, help="ggml-vocab-llama-spm.gguf (default: found in the cache)")
    ap.add_argument("--report", type=Path, required=True, help="folder for soak.json and soak.md")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop sending after this long (the report says how many requests were sent)",
    )
    ap.add_argument("--sample-every", type=int, default=250, help="requests between memory samples")
    ap.add_argument("--n-predict", type=int, default=8)
    ap.add_argument(
        "--launcher",
        type=Path,
        default=ROOT,
        help="checkout whose ggml_bridge is run (default: this one; e.g. an older commit to compare)",
    )
    args = ap.parse_args(argv)

    setup = tiny_setup(args.server, args.vocab, "ggml-bridge-soak-")
    if setup is None:
        return 2
    server, gguf, work = setup
    args.report.mkdir(parents=True, exist_ok=True)
    port = llama_server.free_port()
    server_log = work / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "ggml_bridge",
        "serve",
        "--server",
        str(server),
        "--server-log",
        str(server_log),
        "--",
        "-m",
        str(gguf),
        "--port",
        str(port),
        "-c",
        "512",
        "-np",
        "1",
        "-t",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(args.launcher.resolve())}
    launcher = subprocess.Popen(
        cmd, env=env, cwd=args.launcher, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    samples: list[dict] = []
    t_start = time.monotonic()
    try:
        url = launcher.stdout.readline().strip()  # type: ignore[union-attr]
        if not url.startswith("http"):
            print(f"the launcher did not start (status {launcher.wait()})", file=sys.stderr)
            return 1
        srv_pid = next(iter(signals.descendants(launcher.pid)), None)

        def sample(done: int) -> None:
            samples.append(
                {
                    "requests": done,
                    "t_s": round(time.monotonic() - t_start, 1),
                    "launcher_rss_kib": rss_kib(launcher.pid),
                    "server_rss_kib": rss_kib(srv_pid) if srv_pid else None,
                    "server_log_lines": sum(1 for _ in open(server_log, "rb")),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)

        words = "the quick brown fox jumps over a lazy dog while the city sleeps under heavy rain".split()
        sent = 0
        for i in range(args.requests):
            if args.max_seconds is not None and time.monotonic() - t_start > args.max_seconds:
                break
            if i in (0, 10) or (i and i % args.sample_every == 0):
                sample(i)  # 0: just started; 10: after warm-up (the start figure)
            # every prompt distinct, so llama-server's prompt cache keeps growing (and logs its list per request)
            prompt = f"request {i}: " + " ".join(words[(i + k) % len(words)] for k in range(8 + i % 24))
            post(url, {"prompt": prompt, "n_predict": args.n_predict, "temperature": 0})
            sent = i + 1
        time.sleep(1.0)  # let the pump drain the last request's lines
        args.requests = sent
        sample(sent)
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            rc = launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            rc = launcher.wait()
    wall = time.monotonic() - t_start
    start = next(s for s in samples if s["requests"] == 10)
    end = samples[-1]
    commit = subprocess.run(
        ["git", "-C", str(args.launcher), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(args.launcher), "status", "--porcelain", "ggml_bridge"], capture_output=True, text=True
    ).stdout.strip()
    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "commit": (commit + ("+dirty" if dirty else "")) if commit else f"{args.launcher} (not a git checkout)",
        "server": str(server),
        "model": "tiny random-weight (n_embd 64, 2 layers, llama-spm vocab)",
        "requests": args.requests,
        "n_predict": args.n_predict,
        "wall_s": round(wall, 1),
        "launcher_exit": rc,
        "launcher_rss_start_kib": start["launcher_rss_kib"],
        "launcher_rss_end_kib": end["launcher_rss_kib"],
        "launcher_rss_growth_kib": end["launcher_rss_kib"] - start["launcher_rss_kib"],
        "server_log_lines": end["server_log_lines"],
        "server_log_lines_per_request": round(end["server_log_lines"] / max(args.requests, 1), 1),
        "samples": samples,
    }
    (args.report / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = "\n".join(
        f"| {s['requests']} | {s['t_s']} | {s['launcher_rss_kib'] / 1024:.1f} | "
        f"{(s['server_rss_kib'] or 0) / 1024:.1f} | {s['server_log_lines']} |"
        for s in samples
    )
    (args.report / "soak.md").write_text(
        f"# ggml-bridge serve soak\n\n{report['date']}, {report['machine']}, commit {report['commit']}\n\n"
        f"{args.requests} requests (n_predict {args.n_predict}) in {report['wall_s']} s through `ggml-bridge serve` "
        f"(-lv 4) on {report['model']}; server log {report['server_log_lines']} lines "
        f"({report['server_log_lines_per_request']} per request).\n\n"
        f"Launcher RSS: {start['launcher_rss_kib'] / 1024:.1f} MiB after 10 requests, "
        f"{end['launcher_rss_kib'] / 1024:.1f} MiB at the end ({report['launcher_rss_growth_kib'] / 1024:+.1f} MiB).\n\n"
        "| requests | s | launcher RSS MiB | llama-server RSS MiB | server log lines |\n|---|---|---|---|---|\n"
        + rows
        + "\n"
    )
    shutil.rmtree(work, ignore_errors=True)  # the model and the server log (gigabytes after thousands of requests)
    print(args.report / "soak.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
