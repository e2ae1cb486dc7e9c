"""serve: launcher against a fake llama-server (the real one: tests/integration/test_serve.py)."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config, runner, signals
from ggml_bridge.foundations.errors import ServeError, UsageError
from ggml_bridge.runtime import llama_server, logparse, modes, proof, serve

from helpers import REPO_ROOT, busy_port, fake_model, write_fake_bin


@dataclass(frozen=True)
class ServerBins:
    bin: Path
    server: Path
    """The fake llama-server (tests/fixtures/fake_llama_server.py)."""
    model: Path
    tmp: Path


@pytest.fixture
def server_bins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ServerBins:
    """A bin folder with the fake llama-server, and a model file; no FAKE_* behaviour set."""
    for k in list(os.environ):
        if k.startswith("FAKE_"):
            monkeypatch.delenv(k)
    b = write_fake_bin(tmp_path / "bin")
    return ServerBins(bin=b, server=b / "llama-server", model=fake_model(tmp_path), tmp=tmp_path)


def srv_args(model, port):
    return ["-m", str(model), "--host", "127.0.0.1", "--port", str(port)]


# --- selectors & rules --------------------------------------------------------------------------------


def test_selector_env():
    assert modes.selector_env("on", "off") == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "1", "LLAMA_BATCHED_TRANSFERS": "0"}
    assert modes.selector_env("auto", None) == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "auto"}
    assert modes.selector_env("force", "on") == {
        "GGML_CUDA_MAPPED_HOST_BRIDGE": "force",
        "LLAMA_BATCHED_TRANSFERS": "1",
    }
    assert modes.selector_env(None, None) == {}
    with pytest.raises(UsageError):
        modes.selector_env("yes", None)


def info(text):
    return logparse.parse(text)


ENABLED = "ggml_cuda_mapped_host_bridge: enabled (mode 1), 4 slots x 64 MiB mapped pinned host memory\n"
TWO_DEV = "using device CUDA0 (A) (a) - 1 MiB free\nusing device CUDA1 (B) (b) - 1 MiB free\n"


def test_engagement_rules():
    e = proof.check_engagement(info(ENABLED + TWO_DEV), "on", None)
    assert e.ok and "4 slots x 64 MiB" in e.notes[0] and "2 devices" in e.notes[0]
    # multi-device, inactive -> error with the reason from the log
    e = proof.check_engagement(
        info("ggml_cuda_mapped_host_bridge: inactive: peer access is faster\n" + TWO_DEV), "on", None
    )
    assert not e.ok and "peer access is faster" in e.errors[0] and "2-device" in e.errors[0]
    # multi-device, no line at all -> error
    e = proof.check_engagement(info(TWO_DEV), "force", None)
    assert not e.ok and "no ggml_cuda_mapped_host_bridge line" in e.errors[0]
    # single device -> plain note, keeps serving
    e = proof.check_engagement(
        info("ggml_cuda_mapped_host_bridge: inactive: single device\nusing device CUDA0 (A) (a) - 1 MiB free\n"),
        "on",
        None,
    )
    assert e.ok and "single device" in e.notes[0]
    # force requested but mode 1 reported
    e = proof.check_engagement(info(ENABLED + TWO_DEV), "force", None)
    assert not e.ok
    # off requested but enabled
    assert not proof.check_engagement(info(ENABLED), "off", None).ok
    # batched
    e = proof.check_engagement(info("llama_batched_transfers: enabled, pinned pool up to 32 MiB\n"), None, "on")
    assert e.ok and "32 MiB" in e.notes[0]
    e = proof.check_engagement(info("llama_batched_transfers: inactive: no GPU\n"), None, "on")
    assert e.ok and "no GPU" in e.notes[0]
    assert not proof.check_engagement(
        info("llama_batched_transfers: enabled, pinned pool up to 32 MiB\n"), None, "off"
    ).ok
    # invalid selector value reported by the server
    assert not proof.check_engagement(
        info('ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE="x"'), None, None
    ).ok
    # any of the bridge's selectors: a rejected chunk size fails the check too, with the bridge on
    e = proof.check_engagement(
        info(
            ENABLED + TWO_DEV + 'ggml_cuda_mapped_host_bridge: ignoring invalid '
            'GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB="abc" (expected 64..65536); using 2048\n'
        ),
        "on",
        None,
    )
    assert not e.ok and 'GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB="abc"' in e.errors[0]


# --- Server against the fake --------------------------------------------------------------------------


def test_server_starts_and_confirms_bridge(server_bins, monkeypatch):
    monkeypatch.setenv("FAKE_DEVICES", "2")
    port = llama_server.free_port()
    env = modes.selector_env("force", "on")
    with llama_server.Server(server_bins.server, srv_args(server_bins.model, port), env=env, startup_timeout=20) as s:
        assert s.health() == 200
        e = proof.check_engagement(s.info(), "force", "on")
        assert e.ok, e.errors
        assert s.info().bridge.slots == 4
        out = s.post("/completion", {"prompt": "a b c", "n_predict": 3})
        assert b"tokens" in out
    # stats are printed at teardown and captured
    i = s.info()
    assert i.bridge.total("boundaries") == 7 and i.batched.total("async_uploads") == 4
    assert s.proc.returncode == 0


def test_port_in_use(server_bins, monkeypatch):
    # the port's owner listens but never answers: each /health probe waits out its timeout (2 s by default)
    monkeypatch.setattr(llama_server.Server, "health", functools.partialmethod(llama_server.Server.health, timeout=0.2))
    sock, port = busy_port()
    try:
        s = llama_server.Server(server_bins.server, srv_args(server_bins.model, port), startup_timeout=20)
        with pytest.raises(ServeError) as ei:
            s.start()
        msg = str(ei.value)
        assert f"port {port}" in msg and "already in use" in msg
        assert "couldn't bind" in msg  # the server's own last lines are included
    finally:
        sock.close()


def test_missing_model(server_bins):
    """A -m the user typed that is not there is their argument's error (exit 2), found before anything starts."""
    s = llama_server.Server(
        server_bins.server, srv_args(server_bins.tmp / "nope.gguf", llama_server.free_port()), startup_timeout=20
    )
    with pytest.raises(UsageError, match="model file not found"):
        s.start()
    assert s.proc is None  # not started at all


def test_dies_during_startup(server_bins, monkeypatch):
    monkeypatch.setenv("FAKE_DIE_AT_START", "134")
    s = llama_server.Server(
        server_bins.server, srv_args(server_bins.model, llama_server.free_port()), startup_timeout=20
    )
    with pytest.raises(ServeError) as ei:
        s.start()
    msg = str(ei.value)
    assert "exited during start-up (status 134)" in msg and "GGML_ASSERT(fake)" in msg


def test_startup_timeout(server_bins, monkeypatch):
    monkeypatch.setenv("FAKE_LOAD_S", "30")
    s = llama_server.Server(
        server_bins.server, srv_args(server_bins.model, llama_server.free_port()), startup_timeout=1.0
    )
    t0 = time.monotonic()
    with pytest.raises(ServeError, match="did not become ready within 1s"):
        s.start()
    assert time.monotonic() - t0 < 15
    assert s.proc.poll() is not None  # it was stopped


def test_missing_binary(tmp_path):
    with pytest.raises(ServeError, match="not found or not executable"):
        llama_server.Server(tmp_path / "llama-server", ["--port", "1"]).start()


def test_arg_value_and_url():
    s = llama_server.Server("/x", ["-m", "a", "--host=0.0.0.0", "--port", "9999"])
    assert s.port == 9999 and s.url == "http://0.0.0.0:9999" and s._probe == "http://127.0.0.1:9999"
    s = llama_server.Server("/x", [])
    assert s.port == 8080 and s.host == "127.0.0.1"
    with pytest.raises(UsageError):
        llama_server.Server("/x", ["--port", "abc"])


# --- the CLI entry point ------------------------------------------------------------------------------


def parse(argv):
    return cli.parse_command(cli.COMMANDS["serve"], argv)  # serve's arguments, llama-server's into server_args


def test_cli_parsing_passes_unknown_args_through():
    a = parse(["--bridge", "force", "-m", "x.gguf", "-c", "256", "--batch-size", "8"])
    assert a.bridge == "force" and a.server_args == ("-m", "x.gguf", "-c", "256", "--batch-size", "8")
    a = parse(["--check", "--", "--check", "-m", "y"])
    assert a.check and a.server_args == ("--check", "-m", "y")
    assert parse([]).server_args == ()


def test_run_check_multi_device_not_engaged_fails(server_bins, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DEVICES", "2")
    # the device count comes from the bridge's own WARN line (the INFO "using device" lines are hidden by default)
    monkeypatch.setenv("FAKE_BRIDGE_INACTIVE", "no device pair needs it in mode 1 (2 device(s) on 2 physical GPU(s))")
    a = parse(
        [
            "--bridge",
            "on",
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    with pytest.raises(ServeError) as ei:
        serve.run(a, config.Settings(cache_dir=server_bins.tmp))
    assert "no device pair needs it" in str(ei.value) and ei.value.exit_code != 0


def test_run_check_single_device_keeps_serving(server_bins, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DEVICES", "1")
    monkeypatch.setenv("FAKE_BRIDGE_INACTIVE", "one device")
    port = llama_server.free_port()
    a = parse(["--bridge", "on", "--check", "--server", str(server_bins.server), *srv_args(server_bins.model, port)])
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    cap = capsys.readouterr()
    assert f"http://127.0.0.1:{port}" in cap.out
    assert "single device (one device)" in cap.err


def test_run_check_reads_live_metrics(server_bins, monkeypatch, capsys):
    """--check asks the server for /metrics and requires batching's live counters when it says it is enabled."""
    monkeypatch.setenv("FAKE_METRICS", "3")
    a = parse(
        [
            "--batched",
            "on",
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    assert "/metrics: batched_graphs_total=3 batched_async_uploads_total=3" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_METRICS", "0")
    a = parse(
        [
            "--batched",
            "on",
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    with pytest.raises(ServeError, match="/metrics counts no staged graph after the warm-up"):
        serve.run(a, config.Settings(cache_dir=server_bins.tmp))


def test_run_check_names_the_all_reduce_of_a_tensor_split(server_bins, monkeypatch, capsys):
    """serve --check with -sm tensor logs at INFO (the all-reduce is said only there) and names the path: the
    bridge's all-reduce where the bridge is forced, upstream's internal one on two devices; a path the server did not
    take fails the check."""
    monkeypatch.setenv("FAKE_DEVICES", "4")
    monkeypatch.setenv("GGML_CUDA_DEVICES", "4")
    monkeypatch.setenv("GGML_CUDA_ALLREDUCE", "none")
    args = [*srv_args(server_bins.model, llama_server.free_port()), "-sm", "tensor"]
    a = parse(["--bridge", "force", "--check", "--server", str(server_bins.server), *args])
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    err = capsys.readouterr().err
    assert "-sm tensor over 4 devices: all-reduce bridge (bridge all-reduce enabled" in err
    monkeypatch.setenv("FAKE_DEVICES", "2")
    monkeypatch.setenv("GGML_CUDA_DEVICES", "2")
    monkeypatch.setenv("GGML_CUDA_ALLREDUCE", "internal")
    a = parse(
        [
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
            "-sm",
            "tensor",
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    assert "all-reduce internal (initialized AllReduce pipeline: 2 GPUs)" in capsys.readouterr().err
    monkeypatch.setenv("GGML_CUDA_ALLREDUCE", "butterfly")  # the fake (patched) keeps the butterfly: none expected
    args = [*srv_args(server_bins.model, llama_server.free_port()), "-sm", "tensor"]
    a = parse(["--bridge", "force", "--check", "--server", str(server_bins.server), *args])
    monkeypatch.setenv("FAKE_DEVICES", "4")
    monkeypatch.setenv("GGML_CUDA_DEVICES", "4")
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    assert "all-reduce butterfly" in capsys.readouterr().err


def _cli_proc(server_bins, extra_env, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(extra_env)
    env["PYTHONPATH"] = str(REPO_ROOT)
    code = (
        "import sys; from ggml_bridge.foundations import config; from ggml_bridge.runtime import serve\n"
        "from ggml_bridge import cli; a = cli.parse_command(cli.COMMANDS['serve'], sys.argv[1:])\n"
        "sys.exit(serve.run(a, config.Settings()))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_url(p, timeout=20):
    t0 = time.monotonic()
    line = p.stdout.readline()
    assert line.startswith("http://"), (line, p.stderr.read() if p.poll() is not None else "")
    assert time.monotonic() - t0 < timeout
    return line.strip()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_forwarded_and_exit_code_propagated(server_bins, sig):
    port = llama_server.free_port()
    p = _cli_proc(
        server_bins, {"FAKE_EXIT_CODE": "7"}, "--server", str(server_bins.server), *srv_args(server_bins.model, port)
    )
    try:
        url = _wait_url(p)
        assert url == f"http://127.0.0.1:{port}"
        p.send_signal(sig)
        rc = p.wait(20)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 7, err  # the fake server's own exit status, passed through
    assert "cleaning up before exit" in err  # the server got the signal and shut down itself
    assert "exited with status 7" in err


def test_server_dying_while_serving_propagates(server_bins):
    p = _cli_proc(
        server_bins,
        {"FAKE_DIE_AFTER_S": "1"},
        "--server",
        str(server_bins.server),
        *srv_args(server_bins.model, llama_server.free_port()),
    )
    try:
        _wait_url(p)
        assert p.wait(20) == 3
    finally:
        if p.poll() is None:
            p.kill()


def test_runner_start_stop_kills_a_process_that_ignores_sigterm(tmp_path):
    from ggml_bridge.foundations import runner

    code = (
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    seen = []
    p = runner.start([sys.executable, "-c", code], pump=runner.Pump(log_file=tmp_path / "log", on_line=seen.append))
    t0 = time.monotonic()
    while "ready" not in seen and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert p.poll() is None
    rc = p.stop(timeout=0.3)
    assert rc == -signal.SIGKILL and time.monotonic() - t0 < 15
    assert p.lines() == ["ready"] and (tmp_path / "log").read_text() == "ready\n"


def test_runner_settle_waits_for_the_burst_of_lines_and_no_longer(tmp_path):
    """settle(): returns once the pump has taken no line for `quiet` seconds (a line 0.15 s after the first is
    in), and at `limit` when the child never pauses: what wait_ready does instead of a fixed 0.2 s sleep."""
    from ggml_bridge.foundations import runner

    code = "import sys, time\nprint('a', flush=True)\ntime.sleep(0.15)\nprint('b', flush=True)\ntime.sleep(60)\n"
    p = runner.start([sys.executable, "-c", code], pump=runner.Pump(keep=True))
    try:
        t0 = time.monotonic()
        while "a" not in p.lines() and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        p.settle(quiet=0.4, limit=5.0)
        assert p.lines() == ["a", "b"]
    finally:
        p.stop(timeout=1.0)
    chatty = "import time\nwhile True:\n    print('x', flush=True)\n    time.sleep(0.01)\n"
    q = runner.start([sys.executable, "-c", chatty], pump=runner.Pump(keep=False))
    try:
        t0 = time.monotonic()
        q.settle(quiet=0.2, limit=0.5)
        assert 0.45 < time.monotonic() - t0 < 3.0  # bounded by the limit, not the quiet window
    finally:
        q.stop(timeout=1.0)


def test_runner_start_missing_binary(tmp_path):
    from ggml_bridge.foundations import runner

    with pytest.raises(ServeError, match="cannot run"):
        runner.start([tmp_path / "nope"], failure=runner.Failure(ServeError))


def test_verbosity_added_unless_chosen(monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_LOG_VERBOSITY", raising=False)
    assert llama_server.with_verbosity(["-m", "x"]) == (["-lv", "4", "-m", "x"], 4)
    assert llama_server.with_verbosity(["-m", "x"], add=False) == (["-m", "x"], llama_server.DEFAULT_VERBOSITY)
    assert llama_server.with_verbosity(["-lv", "2", "-m", "x"]) == (["-lv", "2", "-m", "x"], 2)
    assert llama_server.with_verbosity(["--log-verbosity=5"]) == (["--log-verbosity=5"], 5)
    assert llama_server.with_verbosity(["-v"])[0] == ["-v"]
    assert llama_server.with_verbosity([], {"LLAMA_ARG_LOG_VERBOSITY": "3"}) == ([], 3)


def test_serve_proves_from_metrics_without_verbose_logging(server_bins, monkeypatch, capsys):
    """Issue 27 D1: serve does not add -lv 4 (13x the time and 269 MB of log under 1,500 requests); it adds
    --metrics and proves engagement from the live counters; -lv 4 only when the user asks."""
    monkeypatch.setenv("FAKE_DEVICES", "2")
    a = parse(
        [
            "--bridge",
            "force",
            "--batched",
            "on",
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    err = capsys.readouterr().err
    launched = next(line for line in err.splitlines() if line.startswith("+ ") and "llama-server" in line)
    assert " -lv " not in launched and launched.endswith(" --metrics")
    assert "bridge engaged: 7 boundaries crossed" in err and "batched transfers engaged: 2 graph(s) staged" in err
    # the user's --metrics is not doubled; the user's -lv 4 gives the log's proof as before
    a = parse(
        [
            "--bridge",
            "force",
            "--check",
            "--server",
            str(server_bins.server),
            "--metrics",
            "-lv",
            "4",
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    err = capsys.readouterr().err
    assert err.count("--metrics") == 1 and "bridge engaged: mode force, 4 slots x 64 MiB" in err
    assert "model on 2 devices" in err
    # a server without the counters and the INFO lines hidden: the launcher says what it cannot prove
    monkeypatch.setenv("FAKE_NO_METRICS", "1")
    a = parse(
        [
            "--bridge",
            "force",
            "--check",
            "--server",
            str(server_bins.server),
            "-lv",
            "3",
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    err = capsys.readouterr().err
    assert "bridge engaged" not in err and "answers no /metrics and log verbosity 3 hides" in err


def test_serve_without_selectors_leaves_the_arguments_alone():
    args = ["-m", "x", "--port", "1"]
    assert not modes.Selectors(None, None).any_set
    assert serve.with_metrics(args, {}) == (args + ["--metrics"], True)
    assert serve.with_metrics(args + ["--metrics"], {}) == (args + ["--metrics"], False)
    assert serve.with_metrics(args, {"LLAMA_ARG_ENDPOINT_METRICS": "1"}) == (args, False)


# --- faults (issue 15) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_signal_during_startup_stops_the_server(server_bins, sig):

    port = llama_server.free_port()
    p = _cli_proc(
        server_bins, {"FAKE_LOAD_S": "60"}, "--server", str(server_bins.server), *srv_args(server_bins.model, port)
    )
    try:
        t0 = time.monotonic()
        while not signals.descendants(p.pid) and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        tree = signals.descendants(p.pid)
        assert tree, "the fake server never started"
        # into the start-up wait: the server answers (503, loading) and the launcher polls it
        while time.monotonic() - t0 < 20:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        p.send_signal(sig)
        rc = p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 128 + sig, p.stderr.read()
    t0 = time.monotonic()
    while any(signals._alive(pid, st) for pid, st in tree.items()) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not any(signals._alive(pid, st) for pid, st in tree.items()), "llama-server outlived the launcher"


def test_relative_server_path_runs_that_file_not_one_on_path(server_bins, tmp_path, monkeypatch):
    impostor = tmp_path / "path-bin" / "llama-server"
    impostor.parent.mkdir()
    impostor.write_text("#!/bin/sh\necho impostor; exit 99\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("PATH", f"{impostor.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(server_bins.bin)
    a = parse(["--check", "--server", "./llama-server", *srv_args(server_bins.model, llama_server.free_port())])
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0


def test_server_log_in_a_missing_folder_fails_before_starting(server_bins):
    t0 = time.monotonic()
    s = llama_server.Server(
        server_bins.server,
        srv_args(server_bins.model, llama_server.free_port()),
        log=llama_server.ServerLog(server_bins.tmp / "nope" / "server.log"),
        startup_timeout=10,
    )
    with pytest.raises(UsageError, match="--server-log .*nope.* does not exist"):
        s.start()
    assert s.proc is None and time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "args,match",
    [
        (["--port", "0"], "1..65535"),
        (["--port", "70000"], "1..65535"),
        (["--port=-1"], "1..65535"),
    ],
)
def test_ports_the_launcher_cannot_check_are_refused(server_bins, args, match):
    with pytest.raises(UsageError, match=match):
        llama_server.Server(server_bins.server, ["-m", str(server_bins.model), *args])


@pytest.mark.parametrize("timeout", [-5.0, 0.0, float("nan")])
def test_bad_startup_timeout_is_refused(server_bins, timeout):
    with pytest.raises(UsageError, match="startup-timeout"):
        llama_server.Server(
            server_bins.server, srv_args(server_bins.model, llama_server.free_port()), startup_timeout=timeout
        )


def test_server_output_is_not_all_kept_in_memory(server_bins, monkeypatch, tmp_path):
    """A long-running server prints ~1000 lines per request at -lv 4: only what the proof reads stays in memory;
    the log file gets everything."""
    monkeypatch.setenv("FAKE_DEVICES", "2")
    monkeypatch.setenv("FAKE_NOISE", "20000")
    log = tmp_path / "server.log"
    with llama_server.Server(
        server_bins.server,
        srv_args(server_bins.model, llama_server.free_port()),
        log=llama_server.ServerLog(log),
        env=modes.selector_env("force", None),
        startup_timeout=30,
    ) as s:
        pass
    kept = s.lines()
    assert len(kept) < 50, len(kept)
    info = s.info()
    assert info.bridge.enabled and info.listening and info.n_devices == 2 and info.bridge.stats
    assert sum(1 for _ in open(log)) > 20000


def test_runner_keeps_a_bounded_head_and_tail(tmp_path, monkeypatch):
    from ggml_bridge.foundations import runner

    monkeypatch.setattr(runner.Process, "KEEP_HEAD", 5)
    monkeypatch.setattr(runner.Process, "KEEP_TAIL", 5)
    p = runner.start([sys.executable, "-c", "for i in range(1000): print(i)"], pump=runner.Pump(keep=True))
    p.wait(20)
    assert p.lines() == [str(i) for i in (*range(5), *range(995, 1000))] and p.dropped == 990


def test_server_log_is_rotated_at_its_cap(tmp_path):
    """Issue 27 D1: --server-log is bounded: rotated to FILE.1 at the cap, so FILE + FILE.1 stay under 2 x cap."""
    from ggml_bridge.foundations import runner

    code = "import sys\nfor i in range(5000):\n    print('x' * 99)\n"
    log_file = tmp_path / "server.log"
    p = runner.start(
        [sys.executable, "-c", code], pump=runner.Pump(log_file=log_file, keep=False, log_max_bytes=100_000)
    )
    assert p.wait(30) == 0
    sizes = [log_file.stat().st_size, (tmp_path / "server.log.1").stat().st_size]
    assert all(0 < n <= 100_000 for n in sizes) and p.rotations == 4
    assert log_file.read_text().splitlines()[-1] == "x" * 99


def test_sigkill_of_the_launcher_does_not_orphan_the_server(server_bins):
    """Issue 27: kill -9 of serve (no handler runs) still stops llama-server (PR_SET_PDEATHSIG in the child)."""
    port = llama_server.free_port()
    p = _cli_proc(server_bins, {}, "--server", str(server_bins.server), *srv_args(server_bins.model, port))
    try:
        _wait_url(p)

        children = signals.descendants(p.pid)
        assert children
        p.kill()
        p.wait(10)
        t0 = time.monotonic()
        while any(signals._alive(pid, st) for pid, st in children.items()) and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        left = [pid for pid, st in children.items() if signals._alive(pid, st)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, "llama-server outlived a SIGKILLed launcher"
    finally:
        if p.poll() is None:
            p.kill()


def test_a_server_that_dies_while_serving_is_not_said_to_have_died_during_start_up(server_bins, monkeypatch):
    """A crash mid-request (the lavapipe defect of Dec 2 was reported as "killed by signal 11 during start-up")."""
    monkeypatch.setenv("FAKE_DIE_AFTER_S", "1")
    with llama_server.Server(
        server_bins.server, srv_args(server_bins.model, llama_server.free_port()), startup_timeout=20
    ) as s:
        assert s.proc is not None and s.proc.wait(20) == 3  # it served, then died
        with pytest.raises(ServeError) as ei:
            s.post("/completion", {"prompt": "x", "n_predict": 1}, timeout=5)
    msg = str(ei.value)
    assert "died while serving POST /completion" in msg and "exited with status 3 while serving" in msg, msg
    assert "during start-up" not in msg, msg


@pytest.mark.parametrize("value", ["on", "auto", "force"])
def test_every_bridge_value_that_asks_for_the_bridge_is_proved(server_bins, monkeypatch, capsys, value):
    """``--bridge auto`` asks for the bridge like ``on`` and ``force`` (modes.Selectors): serve proves it engaged,
    fails on a multi-device split where it did not, and says what it cannot prove (it used to add --metrics and then
    say nothing about the bridge for ``auto``)."""
    assert modes.Selectors(value).asks_bridge and modes.Selectors(value).mechanisms == ("bridge",)
    want = modes.BRIDGE_VALUES[value]
    enabled = f"ggml_cuda_mapped_host_bridge: enabled (mode {want}), 4 slots x 64 MiB pinned host memory\n"
    e = proof.check_engagement(info(enabled + TWO_DEV), value, None)
    assert e.ok and e.notes[0].startswith(f"bridge engaged: mode {want}, 4 slots x 64 MiB pinned host memory")
    other = "force" if want != "force" else "1"
    e = proof.check_engagement(info(enabled.replace(f"(mode {want})", f"(mode {other})") + TWO_DEV), value, None)
    assert not e.ok and f"requested in mode {want} but the server reports mode {other}" in e.errors[0]
    monkeypatch.setenv("FAKE_DEVICES", "2")
    a = parse(
        [
            "--bridge",
            value,
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    assert "bridge engaged: 7 boundaries crossed" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_BRIDGE_INACTIVE", "no device pair needs it (2 device(s) on 2 physical GPU(s))")
    monkeypatch.setenv("FAKE_METRICS", "0")
    a = parse(
        [
            "--bridge",
            value,
            "--check",
            "--server",
            str(server_bins.server),
            *srv_args(server_bins.model, llama_server.free_port()),
        ]
    )
    if value == "auto":
        # auto routes the pairs that need it: none needing it is its answer (the doctor recommends auto for virtual
        # devices of one GPU, where serve --check failed on 2026-12-03's H200), reported, not an error
        assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
        assert (
            "bridge not needed on this 2-device split in mode auto: no device pair needs it" in capsys.readouterr().err
        )
    else:
        with pytest.raises(ServeError, match=f"bridge requested \\({value}\\) but not engaged on a 2-device split"):
            serve.run(a, config.Settings(cache_dir=server_bins.tmp))
    monkeypatch.delenv("FAKE_BRIDGE_INACTIVE")
    monkeypatch.setenv("FAKE_NO_METRICS", "1")
    a = parse(
        ["--bridge", value, "--check", "--server", str(server_bins.server), "-lv", "3"]
        + srv_args(server_bins.model, llama_server.free_port())
    )
    assert serve.run(a, config.Settings(cache_dir=server_bins.tmp)) == 0
    assert "answers no /metrics and log verbosity 3 hides" in capsys.readouterr().err


# --- a server that ignores SIGTERM -------------------------------------------------------------------------------


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``timeout`` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = signals._proc_stat(pid)
        if st is None or st[1] in "ZX":
            return True
        time.sleep(0.05)
    return False


def _stubborn(server_bins) -> tuple[dict[str, str], Path]:
    pid_file = server_bins.tmp / "server.pid"
    return {"FAKE_IGNORE_SIGTERM": "1", "FAKE_PID_FILE": str(pid_file), "GGML_BRIDGE_STOP_GRACE": "0.5"}, pid_file


def test_a_forwarded_sigterm_is_escalated_to_sigkill_after_the_grace(server_bins):
    """README: SIGKILL after the grace (GGML_BRIDGE_STOP_GRACE, default 10 s). A server ignoring the forwarded
    SIGTERM kept serve waiting forever."""
    env, pid_file = _stubborn(server_bins)
    p = _cli_proc(
        server_bins, env, "--server", str(server_bins.server), *srv_args(server_bins.model, llama_server.free_port())
    )
    try:
        _wait_url(p)
        server = int(pid_file.read_text())
        p.send_signal(signal.SIGTERM)
        rc = p.wait(15)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 128 + signal.SIGKILL, err  # the server was killed
    assert "killing it" in err and _gone(server, 5), err


def test_a_stubborn_server_killed_during_start_up_is_exit_137(server_bins):
    """D12: a SIGTERM during start-up to a server that ignores it: serve had to SIGKILL it and exited 143 (128 +
    the signal); the README says 137 when the server had to be killed."""
    env, pid_file = _stubborn(server_bins)
    env["FAKE_LOAD_S"] = "600"
    p = _cli_proc(
        server_bins, env, "--server", str(server_bins.server), *srv_args(server_bins.model, llama_server.free_port())
    )
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # its SIGTERM handler (which ignores the signal) is installed
        p.send_signal(signal.SIGTERM)
        rc = p.wait(20)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 128 + signal.SIGKILL, err
    assert _gone(int(pid_file.read_text()), 5), err


def test_check_with_a_stubborn_server_that_never_gets_ready_ends_after_the_grace(server_bins):
    """``--check --startup-timeout 1`` with a server that neither becomes ready nor stops on SIGTERM took 32 s (a
    30 s stop timeout): now the timeout, then the grace, then SIGKILL."""
    env, pid_file = _stubborn(server_bins)
    env["FAKE_LOAD_S"] = "600"
    t0 = time.monotonic()
    p = _cli_proc(
        server_bins, env, "--check", "--startup-timeout", "1", "--server", str(server_bins.server),
        *srv_args(server_bins.model, llama_server.free_port()),
    )  # fmt: skip
    try:
        rc = p.wait(40)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    took = time.monotonic() - t0
    assert rc != 0 and "did not become ready within 1s" in err, err
    assert took < 10, f"{took:.1f}s\n{err}"
    assert _gone(int(pid_file.read_text()), 5)


def test_sigkill_of_the_launcher_kills_even_a_stubborn_server(server_bins):
    """The parent-death signal of what serve starts is SIGKILL: a server ignoring SIGTERM outlived a SIGKILLed
    launcher."""
    env, pid_file = _stubborn(server_bins)
    p = _cli_proc(
        server_bins, env, "--server", str(server_bins.server), *srv_args(server_bins.model, llama_server.free_port())
    )
    try:
        _wait_url(p)
        server = int(pid_file.read_text())
        p.kill()
        p.wait(10)
        gone = _gone(server, 5)
    finally:
        if p.poll() is None:
            p.kill()
    if not gone:
        os.kill(server, signal.SIGKILL)
    assert gone, "a server ignoring SIGTERM outlived a SIGKILLed launcher"


# --- the server log on a full disk --------------------------------------------------------------------------------


def test_the_log_pump_survives_a_full_disk(tmp_path, capfd):
    """ENOSPC at the write of the log (/dev/full: the kernel's full disk): the pump says once that the log stopped
    and keeps draining the child's output; it used to die, and the child blocked on its next write."""
    code = "import sys\nfor i in range(40000): sys.stdout.write('%06d the same line, again and again\\n' % i)\n"
    p = runner.start([sys.executable, "-c", code], pump=runner.Pump(log_file=Path("/dev/full"), keep=False, tail=5))
    try:
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.popen.kill()
    err = capfd.readouterr().err
    assert rc == 0 and p.tail(1) == ["039999 the same line, again and again"]
    assert err.count("/dev/full stopped") == 1 and "the disk is full" in err, err


def test_a_crash_that_closes_the_connection_before_the_process_exits_is_a_death(server_bins, monkeypatch):
    """The lavapipe ladder's crash in CI (2026-12-03) read "POST /completion failed. Remote end closed connection
    without response": the socket closed while the aborting server was still printing, so the exit went unseen."""
    monkeypatch.setenv("FAKE_CRASH_IN_REQUEST_S", "0.5")
    with llama_server.Server(
        server_bins.server, srv_args(server_bins.model, llama_server.free_port()), startup_timeout=20
    ) as s:
        with pytest.raises(ServeError) as ei:
            s.post("/completion", {"prompt": "x", "n_predict": 1}, timeout=30)
    msg = str(ei.value)
    assert "died while serving POST /completion" in msg, msg
    assert "GGML_ASSERT(fake) failed" in msg, msg


def test_the_options_are_declared_on_their_fields_and_unset_ones_take_the_settings(capsys, tmp_path):
    import dataclasses

    from ggml_bridge import cli
    from ggml_bridge.foundations import config, flags
    from ggml_bridge.runtime.serve import RpcOptions, ServeOptions

    own = {"rpc", "server_args"}  # the RPC topology and llama-server's arguments: the command line's
    declared = [f.name for f, _ in flags.declared(ServeOptions)]
    assert declared == [f.name for f in dataclasses.fields(ServeOptions) if f.name not in own]
    serve = cli.COMMANDS["serve"]
    opts = cli.parse_command(serve, ["--bridge", "force", "--rpc-local", "2", "-m", "x.gguf"])
    assert (opts.bridge, opts.rpc, opts.server_args) == ("force", RpcOptions(local=2), ("-m", "x.gguf"))
    settings = config.Settings(serve=config.ServeSettings(startup_timeout=7.0))
    assert cli.parse_command(serve, [], settings=settings).startup_timeout == 7.0
    log = cli.parse_command(serve, ["--server-log", str(tmp_path / "s.log")]).server_log
    assert log == tmp_path / "s.log"
    assert cli.main(["serve", "--batched", "maybe"]) == 2
    assert "argument --batched: invalid choice: 'maybe' (choose from" in capsys.readouterr().err
    assert flags.choices(["on", "off"])("on") == "on"
    with pytest.raises(flags.BadValue, match="invalid choice: 'maybe' \\(choose from 'on', 'off'\\)"):
        flags.choices(["on", "off"])("maybe")
