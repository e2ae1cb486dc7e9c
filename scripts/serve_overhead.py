#!/usr/bin/env python3
"""What `ggml-bridge serve` costs on a busy server: N requests through it against plain llama-server, same build.

Runs, in ABBA-style interleaved rounds, on a real llama-server build and a random-weight tiny model:

* ``plain``  llama-server itself (its output to a file), the same server arguments and (``--plain-env selectors``,
  the default) the selector variables serve sets, so only the launcher differs;
* ``serve``  ``python -m ggml_bridge serve --bridge on --batched on --server-log FILE -- ARGS`` of this checkout
  (selectors set, so the engagement proof runs);
* ``before`` the same command of another checkout (``--before DIR``, e.g. a worktree of the commit before the
  change), when given.

For each run: the wall time of the N sequential /completion requests (n_predict ``--n-predict``, every prompt
distinct), the bytes logged (the server log file(s) plus what the launcher wrote to its stderr), and the launcher's
resident memory (VmRSS after 10 requests and at the end, VmHWM at the end). Writes ``serve_overhead.json`` and
``serve_overhead.md`` into ``--report``; it asserts nothing about the figures.

    .venv/bin/python scripts/serve_overhead.py --requests 1500 --before /work/main --report results/X
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tiny_server import tiny_setup  # noqa: E402  (scripts/ is on sys.path)

from ggml_bridge.runtime import llama_server, modes  # noqa: E402


def proc_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (the launcher's own work; for plain, llama-server's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def post(url: str, payload: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(
        url + "/completion", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready in time")


WORDS = "the quick brown fox jumps over a lazy dog while the city sleeps under heavy rain".split()


def one_run(
    kind: str,
    launcher_root: Path | None,
    server: Path,
    gguf: Path,
    work: Path,
    n: int,
    n_predict: int,
    same_env: bool = True,
) -> dict:
    port = llama_server.free_port()
    run_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=work))
    server_args = ["-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-np", "1", "-t", "2"]
    err_file = run_dir / "stderr"
    server_log = run_dir / "server.log"
    url = f"http://127.0.0.1:{port}"
    with open(err_file, "wb") as err:
        if kind == "plain":
            cmd = [str(server), *server_args]
            # the selectors serve sets (bridge on, batched on, their stats): the same server work, no launcher
            env = {**os.environ, **(modes.selector_env("on", "on") if same_env else {})}
            proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            env_root = None
        else:
            assert launcher_root is not None
            cmd = [
                sys.executable,
                "-m",
                "ggml_bridge",
                "serve",
                "--bridge",
                "on",
                "--batched",
                "on",
                "--server",
                str(server),
                "--server-log",
                str(server_log),
                "--",
                *server_args,
            ]
            env_root = str(launcher_root.resolve())
            proc = subprocess.Popen(
                cmd,
                env={**os.environ, "PYTHONPATH": env_root},
                cwd=launcher_root,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        try:
            if kind == "plain":
                wait_health(url, proc)
            else:
                line = proc.stdout.readline().strip()  # type: ignore[union-attr]
                if not line.startswith("http"):
                    raise RuntimeError(f"{kind}: the launcher did not start (status {proc.wait()}); see {err_file}")
            rss10 = None
            t0 = time.monotonic()
            for i in range(n):
                if i == 10:
                    rss10 = proc_kib(proc.pid, "VmRSS")
                prompt = f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8 + i % 24))
                post(url, {"prompt": prompt, "n_predict": n_predict, "temperature": 0})
            wall = time.monotonic() - t0
            time.sleep(1.0)  # let the pump drain the last lines
            rss_end, hwm = proc_kib(proc.pid, "VmRSS"), proc_kib(proc.pid, "VmHWM")
            cpu_s = cpu_seconds(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    logs = sorted(run_dir.glob("server.log*"))
    out = {
        "kind": kind,
        "requests": n,
        "wall_s": round(wall, 2),
        "ms_per_request": round(1000 * wall / n, 2),
        "stderr_bytes": err_file.stat().st_size,
        "server_log_bytes": sum(p.stat().st_size for p in logs),
        "server_log_files": [p.name for p in logs],
        "launcher_rss_10_kib": rss10,
        "launcher_rss_end_kib": rss_end,
        "launcher_hwm_kib": hwm,
        "launcher_cpu_s": cpu_s,
        "exit": rc,
        "cmd": " ".join(cmd),
    }
    out["log_bytes_total"] = out["stderr_bytes"] + out["server_log_bytes"]
    shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps({k: v for k, v in out.items() if k != "cmd"}), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each runs every kind once)")
    ap.add_argument("--n-predict", type=int, default=4)
    ap.add_argument("--server", type=Path, default=None, help="llama-server (default: the latest patched CPU build)")
    ap.add_argument("--vocab", type=Path, default=None, help="a vocab GGUF (default: found in the cache)")
    ap.add_argument("--before", type=Path, default=None, help="checkout of the launcher before the change")
    ap.add_argument(
        "--plain-env",
        choices=("selectors", "none"),
        default="selectors",
        help="plain llama-server with the selector variables serve sets (default), or none",
    )
    ap.add_argument("--report", type=Path, required=True)
    args = ap.parse_args(argv)

    setup = tiny_setup(args.server, args.vocab, "ggml-bridge-overhead-")
    if setup is None:
        return 2
    server, gguf, work = setup
    args.report.mkdir(parents=True, exist_ok=True)
    kinds = [("plain", None), ("serve", ROOT)] + ([("before", args.before)] if args.before else [])
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            order = kinds if r % 2 == 0 else list(reversed(kinds))
            for kind, root in order:
                run = one_run(
                    kind, root, server, gguf, work, args.requests, args.n_predict, args.plain_env == "selectors"
                )
                runs.append(run | {"round": r})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def summary(kind: str) -> dict:
        rs = [x for x in runs if x["kind"] == kind]
        return {
            "runs": len(rs),
            "wall_s_median": round(statistics.median(x["wall_s"] for x in rs), 2),
            "wall_s": [x["wall_s"] for x in rs],
            "log_bytes_max": max(x["log_bytes_total"] for x in rs),
            "launcher_rss_10_kib": [x["launcher_rss_10_kib"] for x in rs],
            "launcher_rss_end_kib": [x["launcher_rss_end_kib"] for x in rs],
            "launcher_cpu_s": [x.get("launcher_cpu_s") for x in rs],
        }

    summ = {k: summary(k) for k, _ in kinds}
    plain = summ["plain"]["wall_s_median"]
    for k in summ:
        summ[k]["time_vs_plain"] = round(summ[k]["wall_s_median"] / plain, 3)

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"Python {platform.python_version()}",
        "commit": git("rev-parse", "--short=12", "HEAD")
        + ("+dirty" if git("status", "--porcelain", "ggml_bridge") else ""),
        "before": str(args.before) if args.before else None,
        "server": str(server),
        "model": "tiny random-weight (model.py preset 'tiny', seed 1)",
        "requests": args.requests,
        "n_predict": args.n_predict,
        "rounds": args.rounds,
        "plain_env": args.plain_env,
        "command": "scripts/serve_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "summary": summ,
        "runs": runs,
    }
    (args.report / "serve_overhead.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# serve overhead: {args.requests} requests through `ggml-bridge serve` vs plain llama-server",
        "",
        f"{report['date']}, {report['machine']}, commit {report['commit']}; {report['model']}, "
        f"n_predict {args.n_predict}, {args.rounds} interleaved rounds.",
        "",
        f"Command: `{report['command']}`",
        "",
        "| kind | runs | wall s (median) | vs plain | wall s (each) | log bytes (max) | launcher RSS MiB "
        "after 10 / at end | CPU s of the process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, s in summ.items():
        rss = ", ".join(
            f"{(a or 0) / 1024:.1f}/{(b or 0) / 1024:.1f}"
            for a, b in zip(s["launcher_rss_10_kib"], s["launcher_rss_end_kib"], strict=True)
        )
        lines.append(
            f"| {k} | {s['runs']} | {s['wall_s_median']} | {s['time_vs_plain']}x | "
            f"{', '.join(map(str, s['wall_s']))} | {s['log_bytes_max']:,} | {rss} | "
            f"{', '.join(map(str, s['launcher_cpu_s']))} |"
        )
    lines += [
        "",
        "log bytes: the server log file(s) plus the launcher's (or plain llama-server's) own stderr. "
        "RSS and CPU of `plain` are llama-server's own (it is the process); of `serve` and `before` the launcher's.",
    ]
    (args.report / "serve_overhead.md").write_text("\n".join(lines) + "\n")
    print(args.report / "serve_overhead.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
