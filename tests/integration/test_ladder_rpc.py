"""The real ggml-rpc-server (patch 0006) on CPU: its state and counters lines, the handshake check, the RPC
ladder byte for byte against the local run, and serve --rpc-local with an rpc-server killed mid-request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ggml_bridge.experiments import model
from ggml_bridge.experiments.ladder import orchestrate
from ggml_bridge.foundations import config
from ggml_bridge.runtime import llama_server, logparse, rpc

from helpers import ladder_options, real_bin_dir, real_vocab

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _real():
    bd, vocab = real_bin_dir(), real_vocab()
    if bd is None or vocab is None or not (bd / rpc.RPC_SERVER).is_file():
        pytest.skip(f"no build with {rpc.RPC_SERVER} (set GGML_BRIDGE_TEST_BIN_DIR) or no vocab GGUF")
    return bd, vocab


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_real_rpc_server_state_counters_and_handshake(tmp_path, monkeypatch):
    bd, _ = _real()
    monkeypatch.setenv("GGML_BRIDGE_RPC_STATS_INTERVAL", "1")
    s = rpc.LocalRpcServer(bd / rpc.RPC_SERVER, devices=["CPU"], threads=1, log_file=tmp_path / "rpc.log")
    s.start(timeout=60)
    try:
        assert rpc.hello(s.endpoint) == rpc.expected_version(bd / "llama-server") == (7, 0, 0)
        info = s.info()
        assert info.version == "7.0.0" and info.devices == ["CPU"]
        assert info.state == {
            "endpoint": str(s.endpoint),
            "pid": str(s.proc.pid),
            "selector": "(unset)",
            "counters": "absent",
        }
        c = s.counters()
        assert c["bridge"] == 0 and c["rpc_graph_compute"] == 0 and "rpc_set_tensor_bytes" in c
        time.sleep(2.5)  # the periodic lines (GGML_BRIDGE_RPC_STATS_INTERVAL=1)
        assert "trigger=interval" in (tmp_path / "rpc.log").read_text()
        assert s.alive()  # SIGUSR1 is taken by the reporter thread, not fatal
    finally:
        s.stop()


def test_real_rpc_server_rejects_a_bad_interval(tmp_path, monkeypatch):
    bd, _ = _real()
    monkeypatch.setenv("GGML_BRIDGE_RPC_STATS_INTERVAL", "soon")
    s = rpc.LocalRpcServer(bd / rpc.RPC_SERVER, devices=["CPU"], threads=1).start(timeout=60)
    try:
        text = "\n".join(s.proc.lines())
        assert 'ignoring invalid GGML_BRIDGE_RPC_STATS_INTERVAL="soon"' in text and "interval_s=0" in text
    finally:
        s.stop()


def test_real_rpc_cpu_ladder_is_byte_identical(tmp_path):
    """ladders/rpc-cpu.toml: two localhost rpc-servers vs the local run, logits and responses identical; one rung
    again through a shaped link to each server."""
    bd, vocab = _real()
    a = ladder_options(
        [
            "--ladder",
            str(ROOT / "ladders" / "rpc-cpu.toml"),
            "--report",
            str(tmp_path / "rep"),
            "--vocab",
            str(vocab),
            "--bin-dir-patched",
            str(bd),
            "--threads",
            "2",
        ]
    )
    rc = orchestrate.run(a, config.Settings(cache_dir=Path(os.environ.get("GGML_BRIDGE_TEST_CACHE_DIR") or tmp_path)))
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    bad = {r["name"]: r["problems"] for r in rep["rungs"] if r["status"] != "pass"}
    assert rc == 0 and not bad, bad
    for r in rep["rungs"]:
        m = r["modes"]["rpc-off"]
        assert m["compare"]["logits"]["identical"] and m["compare"]["responses"]["identical"]
        assert m["compare"]["logits"]["bytes_compared"] > 1000
        servers = m["validity"]["rpc"]
        assert len(servers) == 2
        for s in servers.values():
            assert s["counters"]["rpc_graph_compute"] > 0 and s["counters"]["rpc_set_tensor_bytes"] > 0
            if r["name"].startswith(
                "rpc2-tiny-shaped"
            ):  # through the shaper (ggml_bridge/runtime/shaper.py), both ways
                assert s["link"]["link"] == "1gbit/0.2ms"
                assert s["link"]["up"]["bytes"] > s["counters"]["rpc_set_tensor_bytes"] > 0
                assert s["link"]["down"]["bytes"] > 0
            else:
                assert "link" not in s
    assert any(r["name"].startswith("rpc2-tiny-shaped") for r in rep["rungs"])


def _serve_proc(args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    code = (
        "import sys; from ggml_bridge.foundations import config; from ggml_bridge.runtime import serve\n"
        "from ggml_bridge.foundations.errors import FatalError\n"
        "from ggml_bridge import cli; a = cli.parse_command(cli.COMMANDS['serve'], sys.argv[1:])\n"
        "try:\n    sys.exit(serve.run(a, config.Settings()))\n"
        "except FatalError as e:\n    print(e, file=sys.stderr); sys.exit(e.exit_code)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_real_serve_rpc_local_then_an_rpc_server_killed(tmp_path):
    bd, vocab = _real()
    m = model.ensure_model(tmp_path, "small", 1, vocab)
    port = llama_server.free_port()
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    p = _serve_proc(
        [
            "--server",
            bd / "llama-server",
            "--rpc-local",
            "2",
            "--server-log",
            log,
            "-m",
            m,
            "--port",
            port,
            "-c",
            "512",
            "-np",
            "1",
            "-t",
            "1",
            "-ngl",
            "99",
        ]
    )
    try:
        url = p.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", p.stderr.read() if p.poll() is not None else url
        body = json.dumps({"prompt": "the city of " * 40, "n_predict": 400, "ignore_eos": True}).encode()
        errors: list[str] = []

        def ask():
            try:
                req = urllib.request.Request(
                    url + "/completion", data=body, headers={"Content-Type": "application/json"}
                )
                urllib.request.urlopen(req, timeout=120).read()
            except Exception as e:  # noqa: BLE001 - the request is expected to fail
                errors.append(str(e))

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        time.sleep(1.0)
        infos = [logparse.parse_rpc(q.read_text()) for q in sorted(log.parent.glob("rpc-server-*.log"))]
        pids = [int(i.state["pid"]) for i in infos]
        os.kill(pids[1], 9)
        rc = p.wait(60)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert "rpc: over TCP: llama-server<->127.0.0.1:" in err
    assert rc == 41, err
    assert f"(pid {pids[1]}) killed by signal 9" in err
    server_pid = next(int(x.split("pid ")[1].split(")")[0]) for x in err.splitlines() if "llama-server ready in" in x)
    assert not any(_alive(x) for x in pids + [server_pid])


def test_real_serve_rpc_link_check_and_greedy_against_local(tmp_path):
    """serve --check --rpc-local 2 --rpc-link: bytes through both shapers at start-up; then ladders/rpc-greedy.toml
    (the GPU proof's serve-rpc step) on CPU: greedy responses and full logits over an rpc-server identical to the
    local server's."""
    bd, vocab = _real()
    m = model.ensure_model(tmp_path, "small", 1, vocab)
    p = _serve_proc(
        [
            "--check",
            "--server",
            bd / "llama-server",
            "--rpc-local",
            "2",
            "--rpc-link",
            "10gbit/0.2ms",
            "-m",
            m,
            "--port",
            llama_server.free_port(),
            "-ngl",
            "99",
            "--no-repack",
            "-t",
            "1",
        ]
    )
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert err.count("ggml-bridge: shaped link 10gbit/0.2ms to ggml-rpc-server on 127.0.0.1:") == 2
    assert "(shaped: 10gbit/0.2ms)" in err
    # ladders/rpc-greedy.toml (the GPU proof's serve-rpc step) on CPU, through the command line as the GPU driver
    # runs it: one rpc-server owning the model, llama-server without it, against the local run
    gpu = (ROOT / "ladders" / "rpc-greedy.toml").read_text()
    cpu = (
        gpu.replace('backend = "cuda"', 'backend = "cpu"')
        .replace("devices = 1\nvirtual_devices = 2\n", "devices = 0\n")
        .replace('rpc_servers = [["CUDA0", "CUDA1"]]', 'rpc_servers = [["CPU"]]\nserver_args = ["--no-repack"]')
        .replace('["off-1gpu", "rpc-bridge-force"]', '["off", "rpc-off"]')
        .replace('reference = "off-1gpu"', 'reference = "off"\nperplexity_args = ["--no-repack"]')
    )
    assert cpu.count("CPU") == 1 and "off-1gpu" not in cpu
    (tmp_path / "rpc-greedy-cpu.toml").write_text(cpu)
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bridge", "ladder", "--ladder", str(tmp_path / "rpc-greedy-cpu.toml")]
        + ["--side", f"patched={bd}", "--vocab", str(vocab), "--threads", "1", "--report", str(tmp_path / "g")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), GGML_BRIDGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rung = json.loads((tmp_path / "g" / "report.json").read_text())["rungs"][0]
    cmp = rung["modes"]["rpc-off"]["compare"]
    assert cmp["responses"]["identical"] and cmp["logits"]["identical"] and cmp["responses"]["bytes_compared"] > 1000
    assert list(rung["modes"]["rpc-off"]["validity"]["rpc"].values())[0]["counters"]["rpc_graph_compute"] > 0
