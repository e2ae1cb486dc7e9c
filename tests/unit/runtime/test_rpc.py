"""rpc: endpoints, the RPC_CMD_HELLO check, local rpc-servers and serve's RPC hooks, against a fake
ggml-rpc-server (fast) and the real one (slow, tests/integration/test_ladder_rpc.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import RpcError, UsageError
from ggml_bridge.runtime import llama_server, logparse, rpc, serve

from helpers import FAKE_RPC, REPO_ROOT, bench_args, fake_model, write_fake_bin


def _clear_fake_env(monkeypatch):
    for k in [k for k in os.environ if k.startswith("FAKE_")]:
        monkeypatch.delenv(k)


@dataclass(frozen=True)
class RpcBins:
    bin: Path
    server: Path
    rpc: Path
    """The fake rpc-server (tests/fixtures/fakerpc.py), next to the fake llama-server."""
    model: Path
    tmp: Path


@pytest.fixture
def rpc_bins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RpcBins:
    """A bin folder with the fake llama-server and rpc-server, and a model file; no FAKE_* behaviour set."""
    _clear_fake_env(monkeypatch)
    b = write_fake_bin(tmp_path / "bin")
    exe = b / rpc.RPC_SERVER
    exe.write_text(f"#!{sys.executable}\n" + FAKE_RPC.read_text())
    exe.chmod(0o755)
    return RpcBins(bin=b, server=b / "llama-server", rpc=exe, model=fake_model(tmp_path), tmp=tmp_path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is reaped by its parent, not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# --- endpoints and protocol version ----------------------------------------------------------------------


def test_parse_endpoints():
    assert rpc.parse_endpoints("10.0.0.2:50052,h:1") == [rpc.Endpoint("10.0.0.2", 50052), rpc.Endpoint("h", 1)]
    assert str(rpc.parse_endpoints("[::1]:5")[0]) == "[::1]:5"
    for bad in ("h", "h:0", "h:70000", "h:x", ":5", "a:1,a:1"):
        with pytest.raises(UsageError):
            rpc.parse_endpoints(bad)


def test_protocol_version_and_client_rule(tmp_path):
    (tmp_path / "ggml" / "include").mkdir(parents=True)
    (tmp_path / "ggml" / "include" / "ggml-rpc.h").write_text(
        "#define RPC_PROTO_MAJOR_VERSION    7\n#define RPC_PROTO_MINOR_VERSION    2\n"
        "#define RPC_PROTO_PATCH_VERSION    1\n"
    )
    assert rpc.protocol_version(tmp_path) == (7, 2, 1)
    assert rpc.protocol_version(tmp_path / "nope") is None
    assert rpc.compatible((7, 2, 0), (7, 1, 9)) and rpc.compatible((7, 2, 0), (7, 2, 5))
    assert not rpc.compatible((7, 2, 0), (7, 3, 0)) and not rpc.compatible((7, 2, 0), (6, 0, 0))


def test_real_tree_protocol_version():
    up = os.environ.get("GGML_BRIDGE_TEST_UPSTREAM")
    if not up or not Path(up, "ggml/include/ggml-rpc.h").is_file():
        pytest.skip("no upstream tree (GGML_BRIDGE_TEST_UPSTREAM)")
    assert rpc.protocol_version(up) == (7, 0, 0)


# --- the handshake -----------------------------------------------------------------------------------------


def test_hello_refused_is_fast_and_clear():
    port = llama_server.free_port()
    t0 = time.monotonic()
    with pytest.raises(RpcError) as ei:
        rpc.check_endpoints([rpc.Endpoint("127.0.0.1", port)], (7, 0, 0))
    assert time.monotonic() - t0 < 5
    assert f"127.0.0.1:{port}: connection refused" in str(ei.value) and ei.value.exit_code == 41


def test_hello_silent_port_times_out():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        t0 = time.monotonic()
        with pytest.raises(RpcError) as ei:
            rpc.hello(rpc.Endpoint("127.0.0.1", s.getsockname()[1]), timeout=1.0)
        assert time.monotonic() - t0 < 4
        assert "no answer to the RPC handshake" in str(ei.value)
    finally:
        s.close()


def test_hello_unresolvable_host():
    with pytest.raises(RpcError, match="cannot resolve host"):
        rpc.hello(rpc.Endpoint("no-such-host.invalid", 50052), timeout=2.0)


def test_version_mismatch_detected(rpc_bins, monkeypatch):
    monkeypatch.setenv("FAKE_RPC_VERSION", "8.0.0")
    s = rpc.LocalRpcServer(rpc_bins.rpc).start(timeout=20)
    try:
        assert rpc.hello(s.endpoint) == (8, 0, 0)
        with pytest.raises(RpcError) as ei:
            rpc.check_endpoints([s.endpoint], (7, 0, 0))
        assert "speaks RPC protocol 8.0.0, this llama-server 7.0.0" in str(ei.value)
        assert rpc.check_endpoints([s.endpoint], (8, 0, 0)) == {s.endpoint: (8, 0, 0)}
    finally:
        s.stop()


def test_not_an_rpc_server(rpc_bins):
    # an HTTP-ish server: accepts, answers the first bytes with something else, closes
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]

    import threading

    def answer():
        c, _ = s.accept()
        c.recv(64)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        c.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(RpcError, match="not an rpc-server"):
            rpc.hello(rpc.Endpoint("127.0.0.1", port), timeout=2.0)
    finally:
        s.close()


# --- local rpc-servers -------------------------------------------------------------------------------------


def test_local_server_state_and_counters(rpc_bins, monkeypatch):
    monkeypatch.setenv("GGML_CUDA_MAPPED_HOST_BRIDGE", "1")
    s = rpc.LocalRpcServer(rpc_bins.rpc, devices=["CPU"]).start(timeout=20)
    try:
        info = s.info()
        assert info.version == "7.0.0" and info.devices == ["CPU"]
        assert info.state["selector"] == "1" and info.state["endpoint"] == str(s.endpoint)
        first = s.counters()
        rpc.hello(s.endpoint)
        second = s.counters()
        # the fake counts the handshakes it answered: one more after our extra hello
        assert second["rpc_commands"] == first["rpc_commands"] + 1
        assert len(s.info().counters) == 2
    finally:
        rc = s.stop()
    assert not s.alive() and rc is not None


def test_upstream_server_is_never_sent_sigusr1(rpc_bins, monkeypatch):
    monkeypatch.setenv("FAKE_RPC_UPSTREAM", "1")
    s = rpc.LocalRpcServer(rpc_bins.rpc).start(timeout=20)
    try:
        with pytest.raises(RpcError, match="upstream build without patch 0006"):
            s.counters()
        time.sleep(0.3)
        assert s.alive()  # SIGUSR1 would have killed it
    finally:
        s.stop()


def test_local_server_failing_at_start(rpc_bins, monkeypatch):
    monkeypatch.setenv("FAKE_RPC_FAIL", "1")
    with pytest.raises(RpcError) as ei:
        rpc.LocalRpcServer(rpc_bins.rpc).start(timeout=20)
    assert "exited during start-up (status 1)" in str(ei.value) and "fake failure" in str(ei.value)


def test_topology_start_failure_leaves_nothing_running(rpc_bins):
    good = rpc.LocalRpcServer(rpc_bins.rpc)
    bad = rpc.LocalRpcServer(rpc_bins.tmp / "missing-rpc-server")
    topo = rpc.Topology([good, bad])
    with pytest.raises(RpcError, match="not found"):
        topo.start((7, 0, 0))
    assert good.proc is not None and not _alive(good.proc.pid)


def test_topology_describe_and_engagement():
    def srv(devs, bridge_line):
        s = rpc.LocalRpcServer("/x", devices=devs, port=50052 + len(devs))
        lines = ["Starting RPC server v7.0.0", "Devices:"] + [f"  {d}: GPU (1000 MiB, 900 MiB free)" for d in devs]
        lines.append(bridge_line)
        s.proc = SimpleNamespace(lines=lambda: lines, poll=lambda: None)
        return s

    both = srv(["CUDA0", "CUDA1"], "ggml_cuda_mapped_host_bridge: inactive: no device pair needs it in mode 1")
    one = srv(["CUDA0"], "ggml_cuda_mapped_host_bridge: inactive: single device, no cross-device boundaries")
    topo = rpc.Topology([both, one], [rpc.Endpoint("10.0.0.9", 50052)])
    line = topo.describe(["RPC0[127.0.0.1:50054]", "RPC1[127.0.0.1:50053]", "CUDA0", "CUDA1"])
    assert line.startswith(
        "rpc: over TCP: llama-server<->127.0.0.1:50054, llama-server<->127.0.0.1:50053, "
        "llama-server<->10.0.0.9:50052, rpc-server<->rpc-server"
    )
    assert "through the bridge: llama-server CUDA0<->CUDA1; inside 127.0.0.1:50054 CUDA0<->CUDA1" in line
    notes, errors = topo.engagement("on")
    assert len(errors) == 1 and "127.0.0.1:50054, which owns 2 GPUs" in errors[0]
    assert any("no boundary inside it" in n for n in notes) and any("10.0.0.9:50052 not visible" in n for n in notes)
    assert topo.engagement("off") == ([], [])
    assert topo.server_args() == ["--rpc", "127.0.0.1:50054,127.0.0.1:50053,10.0.0.9:50052"]
    assert rpc.front_devices(logparse.parse(["using device RPC0 (x)", "using device CUDA0 (y)"])) == 1


def test_parse_rpc_log_lines():
    text = (
        "Starting RPC server v7.0.0\n  endpoint       : 127.0.0.1:5\nDevices:\n"
        "  CUDA0: NVIDIA H200 (143000 MiB, 142000 MiB free)\n"
        "ggml_bridge_rpc: state: endpoint=127.0.0.1:5 pid=42 GGML_CUDA_MAPPED_HOST_BRIDGE=(unset) "
        "bridge_counters=available counters_on=SIGUSR1 interval_s=0\n"
        "ggml_bridge_rpc: counters: trigger=signal bridge=1 rpc_commands=9 rpc_copy_tensor=3 bridge_boundaries=3\n"
    )
    info = logparse.parse_rpc(text)
    assert info.version == "7.0.0" and info.devices == ["CUDA0"]
    assert info.state == {"endpoint": "127.0.0.1:5", "pid": "42", "selector": "(unset)", "counters": "available"}
    assert info.latest == {"bridge": 1, "rpc_commands": 9, "rpc_copy_tensor": 3, "bridge_boundaries": 3}


# --- serve with RPC ---------------------------------------------------------------------------------------


def parse(argv):
    return cli.parse_command(cli.COMMANDS["serve"], argv)  # serve's arguments, llama-server's into server_args


def srv_args(model, port):
    return ["-m", str(model), "--host", "127.0.0.1", "--port", str(port)]


def test_serve_rpc_local_check(rpc_bins, capsys):
    log = rpc_bins.tmp / "logs" / "server.log"
    log.parent.mkdir()
    real = rpc_bins.server.with_name("llama-server.real")
    rpc_bins.server.rename(real)
    rpc_bins.server.write_text(
        f'#!/bin/sh\necho "$@" > {rpc_bins.tmp}/argv\necho "[${{CUDA_VISIBLE_DEVICES-unset}}]" '
        f'> {rpc_bins.tmp}/cvd\nexec {real} "$@"\n'
    )
    rpc_bins.server.chmod(0o755)
    a = parse(
        [
            "--check",
            "--server",
            str(rpc_bins.server),
            "--rpc-local",
            "2",
            "--server-log",
            str(log),
            *srv_args(rpc_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=rpc_bins.tmp)) == 0
    err = capsys.readouterr().err
    assert "rpc: over TCP: llama-server<->127.0.0.1:" in err
    assert err.count("counters: bridge=0 rpc_commands=") == 2  # the launcher asked both servers
    pids = [int(logparse.parse_rpc(p.read_text()).state["pid"]) for p in sorted(log.parent.glob("rpc-server-*.log"))]
    assert len(pids) == 2 and not any(_alive(p) for p in pids)
    ports = [logparse.parse_rpc(p.read_text()).state["endpoint"] for p in sorted(log.parent.glob("rpc-server-*.log"))]
    assert f"--rpc {','.join(ports)}" in (rpc_bins.tmp / "argv").read_text()  # llama-server got the endpoints
    assert (rpc_bins.tmp / "cvd").read_text().strip() == "[unset]"
    # --rpc-local-only: the GPUs are the rpc-servers' alone
    a = parse(
        [
            "--check",
            "--server",
            str(rpc_bins.server),
            "--rpc-local",
            "1",
            "--rpc-local-only",
            *srv_args(rpc_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=rpc_bins.tmp)) == 0
    assert (rpc_bins.tmp / "cvd").read_text().strip() == "[]"
    with pytest.raises(UsageError, match="needs local rpc-servers"):
        serve.run(
            parse(["--rpc-local-only", "--server", str(rpc_bins.server)]), config.Settings(cache_dir=rpc_bins.tmp)
        )


def test_rpc_given_to_llama_server_is_checked_too(rpc_bins):
    a = parse(["--rpc", "127.0.0.1:1", "--", "--rpc", "127.0.0.1:2", "-m", "x"])
    assert a.rpc.endpoints == "127.0.0.1:1" and a.server_args == ("--rpc", "127.0.0.1:2", "-m", "x")
    server_args = list(a.server_args)
    topo = serve.rpc_topology(a.rpc, None, rpc_bins.server, {}, server_args)
    assert server_args == ["-m", "x"] and topo.server_args() == ["--rpc", "127.0.0.1:1,127.0.0.1:2"]
    assert serve.take_rpc_arg(args := ["--rpc=h:3", "-ngl", "9"]) == "h:3" and args == ["-ngl", "9"]
    assert serve.rpc_topology(parse([]).rpc, None, rpc_bins.server, {}, []) is None


def test_serve_unreachable_endpoint_fails_before_llama_server(rpc_bins):
    log = rpc_bins.tmp / "server.log"
    port = llama_server.free_port()
    a = parse(
        [
            "--server",
            str(rpc_bins.server),
            "--rpc",
            f"127.0.0.1:{llama_server.free_port()}",
            "--server-log",
            str(log),
            *srv_args(rpc_bins.model, port),
        ]
    )
    t0 = time.monotonic()
    with pytest.raises(RpcError, match="connection refused"):
        serve.run(a, config.Settings(cache_dir=rpc_bins.tmp))
    assert time.monotonic() - t0 < 5
    assert not log.exists()  # llama-server was never started


def test_serve_rpc_server_killed_while_serving(rpc_bins, tmp_path):
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(PYTHONPATH=str(REPO_ROOT))
    code = (
        "import sys; from ggml_bridge.foundations import config; from ggml_bridge.runtime import serve\n"
        "from ggml_bridge.foundations.errors import FatalError\n"
        "from ggml_bridge import cli; a = cli.parse_command(cli.COMMANDS['serve'], sys.argv[1:])\n"
        "try:\n    sys.exit(serve.run(a, config.Settings()))\n"
        "except FatalError as e:\n    print(e, file=sys.stderr); sys.exit(e.exit_code)\n"
    )
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "--server",
            str(rpc_bins.server),
            "--rpc-local",
            "2",
            "--server-log",
            str(log),
            *srv_args(rpc_bins.model, llama_server.free_port()),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # once llama-server serves (serve prints its URL), one of the rpc-servers is killed
        assert p.stdout is not None and p.stdout.readline().startswith("http://")
        pids = [int(logparse.parse_rpc(q.read_text()).state["pid"]) for q in sorted(tmp_path.glob("rpc-server-*.log"))]
        os.kill(pids[0], signal.SIGKILL)
        rc = p.wait(30)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 41, err
    assert "killed by signal 9 while llama-server was serving" in err
    server_pid = next(
        int(line.split("pid ")[1].split(")")[0]) for line in err.splitlines() if "llama-server ready in" in line
    )
    assert len(pids) == 2 and not any(_alive(x) for x in pids + [server_pid])


# --- ladder: rpc-* modes ------------------------------------------------------------------------------------

BANNER = "Starting RPC server v7.0.0\nDevices:\n"
STATE = (
    "ggml_bridge_rpc: state: endpoint=127.0.0.1:5 pid=1 GGML_CUDA_MAPPED_HOST_BRIDGE=1 "
    "bridge_counters=available counters_on=SIGUSR1 interval_s=0\n"
)
BR_ON = (
    "ggml_cuda_mapped_host_bridge: enabled (mode auto), 4 slots x 64 MiB pinned host memory (pinned at the first"
    " routed copy), chunks by boundary size, 2 of 2 device pairs routed\n"
)


def _srv(devs, *lines):
    return logparse.parse_rpc(BANNER + "".join(f"  {d}: dev (1 MiB, 1 MiB free)\n" for d in devs) + "".join(lines))


def test_shipped_rpc_ladders_parse():
    from ggml_bridge.experiments.ladder import schema

    cpu = schema.load_ladder(REPO_ROOT / "ladders" / "rpc-cpu.toml")
    assert all(r.rpc_servers == [["CPU"], ["CPU"]] and "rpc-off" in r.modes for r in cpu.rungs)
    # the local reference must not use in-process-only CPU buffer types (AMX, repack): docs/rpc.md
    assert all("--no-repack" in r.server_args and "--no-repack" in r.perplexity_args for r in cpu.rungs)
    cuda = schema.load_ladder(REPO_ROOT / "ladders" / "cuda.toml")
    rpc_rungs = {r.name: r for r in cuda.rungs if r.rpc_servers}
    assert [["CUDA0", "CUDA1"]] in [r.rpc_servers for r in rpc_rungs.values()]
    assert [["CUDA0"], ["CUDA1"]] in [r.rpc_servers for r in rpc_rungs.values()]
    assert all(r.reference == "off-1gpu" for r in rpc_rungs.values())


def test_rpc_mode_needs_servers(tmp_path):
    from ggml_bridge.experiments.ladder import schema
    from ggml_bridge.foundations.errors import LadderSetupError

    f = tmp_path / "l.toml"
    f.write_text('[[rung]]\nname = "x"\nshape = "tiny"\nmodes = ["off", "rpc-off"]\n')
    with pytest.raises(LadderSetupError, match="rpc-\\* modes need rpc_servers"):
        schema.load_ladder(f)


def test_validate_rpc():
    from ggml_bridge.experiments.ladder import validity
    from ggml_bridge.runtime import modes

    m = modes.MODES
    cnt = "ggml_bridge_rpc: counters: trigger=signal bridge=1 rpc_graph_compute={g} rpc_copy_tensor=4 bridge_boundaries={b}\n"
    ok = validity.validate_rpc(m["rpc-bridge"], {"a": _srv(["CUDA0", "CUDA1"], STATE, BR_ON, cnt.format(g=3, b=4))})
    assert ok.ok, ok.problems
    assert ok.servers["a"].counters["bridge_boundaries"] == 4
    zero = validity.validate_rpc(m["rpc-bridge"], {"a": _srv(["CUDA0", "CUDA1"], STATE, BR_ON, cnt.format(g=3, b=0))})
    assert list(zero.problems) == ["rpc-server a: bridge engaged but bridge_boundaries=0 (rpc_copy_tensor=4)"]
    off = validity.validate_rpc(m["rpc-bridge"], {"a": _srv(["CUDA0", "CUDA1"], STATE, cnt.format(g=3, b=0))})
    assert "bridge not engaged on its 2 GPUs (no bridge line)" in off.problems[0]
    idle = validity.validate_rpc(m["rpc-off"], {"a": _srv(["CPU"], STATE, cnt.format(g=0, b=0))})
    assert "computed no graph" in idle.problems[0]
    one = validity.validate_rpc(m["rpc-bridge"], {"a": _srv(["CUDA0"], STATE, cnt.format(g=2, b=0))})
    assert one.ok and "bridge idle, as it must be with 1 GPU" in one.notes[0]
    assert not validity.validate_rpc(m["rpc-off"], {"a": _srv(["CPU"], cnt.format(g=2, b=0))}).ok  # no state line
    assert not validity.validate_rpc(m["rpc-upstream"], {"a": _srv(["CPU"], STATE)}).ok  # patch lines upstream
    assert validity.validate_rpc(m["rpc-upstream"], {"a": _srv(["CPU"])}).ok


# --- bench: the rpc suites ----------------------------------------------------------------------------------


@pytest.mark.plots
def test_bench_rpc_suite(bench_env):
    import json

    from ggml_bridge.experiments.bench import orchestrate

    out = bench_env.tmp / "report"
    args = bench_args(variants_dir=bench_env.variants, model=bench_env.model, rounds=2, reps=2, report=out, suite="rpc")
    assert orchestrate.bench(args, bench_env.settings) == 0
    rep = json.loads((out / "bench.json").read_text())
    assert rep["not_engaged"] == [] and rep["failed"] == []
    assert set(rep["summary"]) == {"rpc-upstream", "rpc-upstream-nopeer", "rpc-off", "rpc-bridge"}
    eng = next(c for c in rep["cases"] if c["name"] == "rpc-bridge")["engagement"]
    assert "rpc-server bridge enabled, boundaries=7" in eng
    assert rep["ratios"]["rpc-upstream"]["rpc-bridge"]
    calls = (bench_env.tmp / "rpc-order.txt").read_text().splitlines()
    assert len(calls) == 8 and all("cvd=''" in c and "--rpc 127.0.0.1:" in c and "-ngl 99" in c for c in calls)
    # every case's own build served it: an upstream rpc-server for the upstream cases
    logs = sorted(out.glob("**/rpc-upstream-r*-rpc-server.log"))
    assert logs and all(logparse.parse_rpc(p.read_text()).state is None for p in logs)


def test_bench_rpc_bridge_not_engaged(bench_env, monkeypatch):
    import json

    from ggml_bridge.experiments.bench import orchestrate

    monkeypatch.setenv("FAKE_RPC_BRIDGE", "inactive")
    out = bench_env.tmp / "report"
    args = bench_args(
        variants_dir=bench_env.variants,
        model=bench_env.model,
        rounds=1,
        reps=1,
        report=out,
        suite="rpc",
        cases=("rpc-off", "rpc-bridge"),
    )
    from ggml_bridge.foundations.errors import BenchError

    with pytest.raises(BenchError, match="rpc-bridge"):
        orchestrate.bench(args, bench_env.settings)
    rep = json.loads((out / "bench.json").read_text())
    assert rep["not_engaged"] == ["rpc-bridge"]
    assert (
        "inactive: no device pair needs it" in next(c for c in rep["cases"] if c["name"] == "rpc-bridge")["engagement"]
    )


def test_bench_rpc_cpu_suite_pins_threads_on_both_sides(bench_env, monkeypatch, capsys):
    from ggml_bridge.experiments.bench import orchestrate

    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 0)
    args = bench_args(
        variants_dir=bench_env.variants,
        model=bench_env.model,
        rounds=1,
        reps=1,
        report=bench_env.tmp / "report",
        suite="rpc-cpu",
    )
    assert orchestrate.bench(args, bench_env.settings) == 0
    calls = (bench_env.tmp / "rpc-order.txt").read_text().splitlines()
    assert len(calls) == 2 and all(" -t 1" in c for c in calls)
    assert sum("--rpc 127.0.0.1:" in c and "-ngl 99" in c for c in calls) == 1
    assert any(line.endswith(" -t 1") and rpc.RPC_SERVER in line for line in capsys.readouterr().err.splitlines())


def test_serve_says_one_consistent_thing_about_the_rpc_front_and_each_rpc_server(rpc_bins, capsys, monkeypatch):
    """--rpc-local-only with the bridge asked for: the front has no GPU by design, the bridge's boundaries are inside
    the rpc-server. serve said both "bridge not confirmed: single device or CPU ... serving anyway" (about the front)
    and "bridge engaged in ggml-rpc-server", and left the front's "failed to initialize CUDA" unexplained."""
    monkeypatch.setenv("FAKE_CUDA_INIT_FAILED", "1")
    argv = ["--check", "--bridge", "force", "--server", str(rpc_bins.server), "--rpc-local-devices", "CUDA0,CUDA1"]
    a = parse([*argv, "--rpc-local-only", *srv_args(rpc_bins.model, llama_server.free_port())])
    assert serve.run(a, config.Settings(cache_dir=rpc_bins.tmp)) == 0
    err = capsys.readouterr().err
    assert "not confirmed" not in err and "single device or CPU" not in err, err
    assert "bridge engaged in ggml-rpc-server on 127.0.0.1:" in err
    assert "llama-server (the RPC front) has no GPU of its own (--rpc-local-only)" in err, err
    assert "failed to initialize CUDA: no CUDA-capable device is detected" in err
    assert "is expected" in err, err


def test_a_started_rpc_server_reports_its_banner_that_comes_after_the_handshake(rpc_bins, monkeypatch):
    """The real rpc-server's banner (version, devices) goes to a buffered stdout and comes out with the fflush after
    its first accepted connection: on a loaded machine after the handshake was answered (a fresh clone's make test
    of 2026-12-05 read version None once)."""
    monkeypatch.setenv("FAKE_RPC_BANNER_LATE_S", "0.5")
    s = rpc.LocalRpcServer(rpc_bins.rpc, devices=["CPU"]).start(timeout=20)
    try:
        info = s.info()
        assert info.version == "7.0.0" and info.devices == ["CPU"], info
    finally:
        s.stop()
