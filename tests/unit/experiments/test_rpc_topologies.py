"""The one-GPU RPC topologies (issue 29) in the ladder: per-rpc-server environment (virtual devices inside one
rpc-server), llama-server keeping its own GPU (rpc_front_gpu), a shaped link to each rpc-server (rpc_link), the
rpc-bridge-force mode, and the validity rules that fail a mode which did not exercise what its rung is about;
against the fake llama-server and rpc-server (the real ones: tests/integration/test_ladder_rpc.py)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ggml_bridge.experiments.ladder import kinds, orchestrate, results, schema, validity
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import LadderSetupError
from ggml_bridge.runtime import llama_server, logparse, modes, rpc

from helpers import FAKE_RPC, REPO_ROOT, ladder_options, make_vocab, write_fake_bin

BANNER = "Starting RPC server v7.0.0\nDevices:\n"
STATE = (
    "ggml_bridge_rpc: state: endpoint=127.0.0.1:1 pid=1 GGML_CUDA_MAPPED_HOST_BRIDGE=force bridge_counters=available\n"
)
BR_FORCE = "ggml_cuda_mapped_host_bridge: enabled (mode force), 4 slots x 64 MiB mapped pinned host memory\n"
BR_ONE = "ggml_cuda_mapped_host_bridge: enabled (mode 1), 4 slots x 64 MiB mapped pinned host memory\n"
INACTIVE = "ggml_cuda_mapped_host_bridge: inactive: single device\n"
CNT = (
    "ggml_bridge_rpc: counters: trigger=signal bridge=1 rpc_graph_compute=3 rpc_copy_tensor={c} "
    "bridge_boundaries={b} bridge_bytes=4096\n"
)


def _srv(devs, *lines):
    return logparse.parse_rpc(BANNER + "".join(f"  {d}: dev (1 MiB, 1 MiB free)\n" for d in devs) + "".join(lines))


def _rung(**kw):
    d = {
        "name": "r",
        "shape": "tiny",
        "devices": 1,
        "modes": ["off", "rpc-off", "rpc-bridge-force"],
        "rpc_servers": [["CUDA0", "CUDA1"]],
        **kw,
    }
    return schema.parse_rung(d, {}, "test")


def test_schema_keys_and_their_checks():
    r = _rung(rpc_env=[{"GGML_CUDA_DEVICES": 2}], rpc_link="10gbit-0.2ms", rpc_front_gpu=True)
    assert (
        r.rpc_env == [{"GGML_CUDA_DEVICES": "2"}] and r.rpc_link == "10gbit/0.2ms" and r.rpc_front is kinds.RpcFront.GPU
    )
    with pytest.raises(LadderSetupError, match="rpc_env needs one table per rpc-server"):
        _rung(rpc_env=[{}, {}])
    with pytest.raises(LadderSetupError, match="rpc_link: bad link rate 'fast'"):
        _rung(rpc_link="fast/1ms")
    with pytest.raises(LadderSetupError, match="need rpc-\\* modes"):
        _rung(modes=["off", "upstream"], rpc_link="1gbit/1ms")
    with pytest.raises(LadderSetupError, match="rpc_front_gpu needs devices >= 1"):
        _rung(devices=0, modes=["off", "rpc-off"], rpc_front_gpu=True)


def test_shipped_one_gpu_rpc_and_split_rungs():
    """ladders/cuda-1gpu.toml holds the three RPC topologies of one GPU and a shaped one; -sm row is in
    ladders/cuda.toml (two GPUs)."""
    lad = schema.load_ladder(REPO_ROOT / "ladders" / "cuda-1gpu.toml")
    rungs = {r.name: r for r in lad.rungs}
    virt = rungs["rpc1x2virt-small-ub512"]
    assert virt.rpc_servers == [["CUDA0", "CUDA1"]] and virt.rpc_env == [{"GGML_CUDA_DEVICES": "2"}]
    assert "rpc-bridge-force" in virt.modes and virt.reference == "off" and virt.devices == 1
    two = rungs["rpc2x1gpu-small-ub512"]
    assert two.rpc_servers == [["CUDA0"], ["CUDA0"]] and "rpc-bridge-force" in two.modes
    front = rungs["rpcfront-small-ub512"]
    assert front.rpc_front is kinds.RpcFront.GPU and front.rpc_servers == [["CUDA0"]]
    assert rungs["rpcfront-shaped-small-ub512"].rpc_link == "10gbit/0.2ms"
    # the head size 32 of "small" has no CUDA flash-attention kernel in b11434 and -fa auto turns it on for a
    # model entirely behind RPC (the rpc-server aborted in fattn.cu on the H200): those rungs turn it off
    for name in ("rpc1x2virt-small-ub512", "rpc2x1gpu-small-ub512"):
        assert rungs[name].server_args == ["-fa", "off"] and rungs[name].perplexity_args == ["-fa", "off"]
    # b11434 refuses -sm row on virtual devices of one GPU (no split buffers) and aborts -sm tensor on these
    # shapes: the one-GPU ladder keeps layer splits only, the row rung is in the two-GPU ladder
    splits = {r.split_mode for r in lad.rungs if r.virtual_devices and "bridge-force" in r.modes}
    assert splits == {"layer"}
    two_gpu = {r.name: r for r in schema.load_ladder(REPO_ROOT / "ladders" / "cuda.toml").rungs}
    row = two_gpu["2gpu-row-small-ub512"]
    assert row.split_mode == "row" and row.devices == 2 and not row.virtual_devices and "bridge-force" in row.modes


def test_validity_virtual_devices_inside_one_rpc_server():
    m, r = modes.MODES, _rung()
    ok = validity.validate_rpc(
        m["rpc-bridge-force"], {"a": _srv(["CUDA0", "CUDA1"], STATE, BR_FORCE, CNT.format(c=4, b=4))}, r
    )
    assert ok.ok, ok.problems
    assert "bridge engaged (mode force) on 2 GPUs: bridge_boundaries=4" in ok.notes[0]
    # mode 1 does not route virtual devices of one GPU: the force mode must say force
    one = validity.validate_rpc(
        m["rpc-bridge-force"], {"a": _srv(["CUDA0", "CUDA1"], STATE, BR_ONE, CNT.format(c=4, b=4))}, r
    )
    assert list(one.problems) == ["rpc-server a: bridge mode 1, expected force"]
    # two devices but no COPY_TENSOR: the boundary inside the server was not exercised, in any mode
    for mode in ("rpc-off", "rpc-bridge-force"):
        res = validity.validate_rpc(
            m[mode],
            {"a": _srv(["CUDA0", "CUDA1"], STATE, BR_FORCE if "bridge" in mode else "", CNT.format(c=0, b=0))},
            r,
        )
        assert any("served no RPC_CMD_COPY_TENSOR" in p for p in res.problems), res
    # GGML_CUDA_DEVICES missing: the server shows one device where the rung gave two
    res = validity.validate_rpc(m["rpc-off"], {"a": _srv(["CUDA0"], STATE, CNT.format(c=0, b=0))}, r)
    assert "given devices CUDA0,CUDA1 but it serves CUDA0" in res.problems[0]


def test_validity_two_servers_prove_the_bridge_idle():
    m, r = modes.MODES, _rung(rpc_servers=[["CUDA0"], ["CUDA0"]])
    servers = {e: _srv(["CUDA0"], STATE, INACTIVE, CNT.format(c=0, b=0)) for e in ("a", "b")}
    res = validity.validate_rpc(m["rpc-bridge-force"], servers, r)
    assert res.ok and len(res.notes) == 2
    assert all(
        "bridge idle, as it must be with 1 GPU (it says: inactive: single device; bridge_boundaries=0)" in n
        for n in res.notes
    )
    bad = validity.validate_rpc(m["rpc-bridge-force"], {"a": _srv(["CUDA0"], STATE, BR_FORCE, CNT.format(c=0, b=3))}, r)
    assert list(bad.problems) == ["rpc-server a: 1 GPU, yet its bridge counted 3 boundaries"]


def test_validity_shaped_link_must_carry_bytes_both_ways():
    m, r = modes.MODES, _rung(rpc_servers=[["CPU"]], devices=0, modes=["off", "rpc-off"])
    info = {"a": _srv(["CPU"], STATE, CNT.format(c=0, b=0))}
    link = {"link": "1gbit/1ms", "up": {"bytes": 10}, "down": {"bytes": 0}}
    res = validity.validate_rpc(m["rpc-off"], info, r, {"a": results.Link.of(link)})
    assert list(res.problems) == ["rpc-server a: nothing crossed its shaped link 1gbit/1ms (up 10 B, down 0 B)"]
    link["down"]["bytes"] = 5
    res = validity.validate_rpc(m["rpc-off"], info, r, {"a": results.Link.of(link)})
    assert res.ok and res.servers["a"].link.up_bytes == 10


@dataclass(frozen=True)
class RpcLadderRig:
    tmp: Path
    vocab: Path
    patched: Path
    """The fake patched build's bin folder, with the fake rpc-server."""
    settings: config.Settings


@pytest.fixture
def rpc_ladder_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RpcLadderRig:
    """A ladder on the fake patched build with its rpc-server and a small vocabulary, no FAKE_* behaviour set."""
    for k in list(os.environ):
        if k.startswith("FAKE_"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    b = write_fake_bin(tmp_path / "patched")
    exe = b / rpc.RPC_SERVER
    exe.write_text(f"#!{sys.executable}\n" + FAKE_RPC.read_text())
    exe.chmod(0o755)
    return RpcLadderRig(
        tmp=tmp_path,
        vocab=make_vocab(tmp_path / "vocab.gguf"),
        patched=b,
        settings=config.Settings(cache_dir=tmp_path / "cache", project_dir=REPO_ROOT),
    )


def _run(e, body):
    lf = e.tmp / "l.toml"
    lf.write_text(body)
    a = ladder_options(
        [
            "--ladder",
            str(lf),
            "--report",
            str(e.tmp / "rep"),
            "--vocab",
            str(e.vocab),
            "--bin-dir-patched",
            str(e.patched),
            "--threads",
            "1",
            "--startup-timeout",
            "30",
        ]
    )
    rc = orchestrate.run(a, e.settings)
    return rc, json.loads((e.tmp / "rep" / "report.json").read_text())


RPC_LADDER = """
name = "fake-rpc"
backend = "cpu"
[defaults]
shape = {{ preset = "tiny", name = "micro", n_layer = 1, n_embd = 32, n_ff = 64, n_head = 2, n_head_kv = 1 }}
modes = ["off", "rpc-off"]
reference = "off"
ubatch = 8
batch = 16
ppl_ctx = 16
n_predict = 2
prompt_words = [3, 9]
rpc_servers = [["CPU"], ["CPU"]]
rpc_env = [{{ FAKE_RPC_DEVICES = "CPU" }}, {{ FAKE_RPC_DEVICES = "CPU" }}]
[[rung]]
name = "shaped"
{link}
"""


def test_shaped_rung_carries_the_front_through_one_shaper_per_server(rpc_ladder_rig):
    rc, rep = _run(rpc_ladder_rig, RPC_LADDER.format(link='rpc_link = "100mbit/1ms"'))
    r = rep["rungs"][0]
    assert rc == 0 and r["status"] == "pass", r["problems"]
    servers = r["modes"]["rpc-off"]["validity"]["rpc"]
    assert len(servers) == 2
    for s in servers.values():  # the fake front says hello to both, through the shapers, from both processes
        assert s["link"]["link"] == "100mbit/1ms" and s["link"]["up"]["bytes"] == 2 * 33
        assert s["link"]["down"]["bytes"] == 2 * 36 and s["link"]["connections"] == 2
    assert any("through the shaped link 100mbit/1ms" in n for n in r["modes"]["rpc-off"]["validity"]["notes"])


def test_unshaped_rung_has_no_link_stats(rpc_ladder_rig):
    rc, rep = _run(rpc_ladder_rig, RPC_LADDER.format(link=""))
    r = rep["rungs"][0]
    assert rc == 0 and r["status"] == "pass", r["problems"]
    assert all("link" not in s for s in r["modes"]["rpc-off"]["validity"]["rpc"].values())


# --- bench: rpc cases over shaped links (netbench.py) -------------------------------------------------------


@pytest.fixture
def one_gpu_bench_env(bench_env, monkeypatch):
    """``bench_env`` on a rig of one GPU."""
    from ggml_bridge.experiments.bench import orchestrate

    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 1)
    return bench_env


@pytest.mark.plots
def test_bench_rpc_link_suite_runs_each_rpc_case_per_link_with_the_front_gpu(one_gpu_bench_env):
    out = one_gpu_bench_env.tmp / "report"
    rep = one_gpu_bench_env.run(
        one_gpu_bench_env.args(out, rounds=1, reps=1, suite="rpc-link", links=("10gbit/0.2ms", "25gbit/0.1ms"))
    )
    names = [c["name"] for c in rep["cases"]]
    assert names == ["off", "rpc-off", "rpc-off@10gbit-0.2ms", "rpc-off@25gbit-0.1ms"]
    assert rep["not_engaged"] == [] and rep["failed"] == []
    assert {c["name"]: c["link"] for c in rep["cases"]}["rpc-off@25gbit-0.1ms"] == "25gbit/0.1ms"
    eng = {c["name"]: c["engagement"] for c in rep["cases"]}
    assert (
        "link 10gbit/0.2ms to 127.0.0.1:" in eng["rpc-off@10gbit-0.2ms"]
        and " 33 B up, 36 B down" in eng["rpc-off@10gbit-0.2ms"]
    )
    assert eng["rpc-off"] == ""  # loopback, no shaper
    assert rep["links"]["highest_rate_gbit"] == 25.0 and rep["links"]["shaper_ceiling_gbit"] > 0
    assert (
        "- shaped links: 1 rpc-server(s), llama-bench keeps its GPU; the shaper moved" in (out / "bench.md").read_text()
    )
    assert set(rep["ratios"]["off"]) >= {"rpc-off@10gbit-0.2ms", "rpc-off@25gbit-0.1ms"}
    # llama-bench kept its GPU (the suite's front GPU) and was given the shaper's end, not the rpc-server's
    calls = [c for c in (one_gpu_bench_env.tmp / "rpc-order.txt").read_text().splitlines() if "llama-bench" not in c]
    bench_calls = [c for c in calls if "--rpc" in c]
    assert len(bench_calls) == 3 and all("cvd='0'" in c for c in bench_calls)
    # the shaped cases gave llama-bench the shaper's end, not the rpc-server's (named in the engagement line)
    for name in ("rpc-off@10gbit-0.2ms", "rpc-off@25gbit-0.1ms"):
        server_port = eng[name].split(" to 127.0.0.1:")[1].split(":")[0]
        given = [c.split("--rpc 127.0.0.1:")[1].split()[0] for c in bench_calls]
        assert server_port not in given


def test_bench_link_case_that_bypasses_the_shaper_is_not_engaged(one_gpu_bench_env, monkeypatch):
    from ggml_bridge.experiments.bench import orchestrate
    from ggml_bridge.foundations.errors import BenchError
    from ggml_bridge.runtime import netbench

    monkeypatch.setattr(netbench.rpc.Topology, "front_endpoints", property(lambda self: self.endpoints))
    args = one_gpu_bench_env.args(rounds=1, reps=1, suite="rpc-link", links=("10gbit/0.2ms",), cases=("rpc-off",))
    with pytest.raises(BenchError, match="rpc-off@10gbit-0.2ms"):
        orchestrate.bench(args, one_gpu_bench_env.settings)


def test_bench_bad_link_is_a_bench_error(one_gpu_bench_env):
    from ggml_bridge.experiments.bench import orchestrate
    from ggml_bridge.foundations.errors import BenchError

    args = one_gpu_bench_env.args(suite="rpc-link", links=("10gbit",))
    with pytest.raises(BenchError, match="bad link '10gbit'"):
        orchestrate.bench(args, one_gpu_bench_env.settings)


def test_row_split_rung_does_not_require_bridge_boundaries_but_records_them():
    from ggml_bridge.experiments.ladder import validity

    dev = "".join(f"llama_model_load_from_file_impl: using device CUDA{i} (GPU) (id{i}) - 1 MiB free\n" for i in (0, 1))
    log = (
        dev + "ggml_cuda_mapped_host_bridge: enabled (mode force), 4 slots x 64 MiB mapped pinned host memory\n"
        "ggml_cuda_mapped_host_bridge: stats: boundaries=0 bytes=0 chunks=0 producer_waits=0 sync_copies=0 "
        "fallbacks=0\n"
    )
    base = {"name": "r", "shape": "small", "devices": 1, "virtual_devices": 2, "modes": ["off", "bridge-force"]}
    layer = schema.parse_rung({**base, "split_mode": "layer"}, {}, "t")
    row = schema.parse_rung({**base, "split_mode": "row", "require_boundaries": False}, {}, "t")
    logs = {"server": logparse.parse(log)}
    assert "boundaries=0" in " ".join(validity.validate_mode(modes.MODES["bridge-force"], layer, logs).problems)
    res = validity.validate_mode(modes.MODES["bridge-force"], row, logs)
    assert res.ok, res.problems
    assert any("0 boundaries counted (the rung does not require any" in n for n in res.notes)


# --- serve --rpc-link -----------------------------------------------------------------------------------------


def _serve_fake(tmp_path):
    from helpers import fake_model

    b = write_fake_bin(tmp_path / "bin")
    exe = b / rpc.RPC_SERVER
    exe.write_text(f"#!{sys.executable}\n" + FAKE_RPC.read_text())
    exe.chmod(0o755)
    return b, fake_model(tmp_path)


def test_serve_rpc_link_puts_a_shaper_before_each_local_server(tmp_path, monkeypatch, capsys):
    from ggml_bridge import cli
    from ggml_bridge.runtime import serve

    for k in [k for k in os.environ if k.startswith("FAKE_")]:
        monkeypatch.delenv(k)
    b, m = _serve_fake(tmp_path)
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    real = b / "llama-server.real"
    (b / "llama-server").rename(real)
    (b / "llama-server").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\nexec {real} "$@"\n')
    (b / "llama-server").chmod(0o755)
    a = cli.parse_command(
        cli.COMMANDS["serve"],
        [
            "--check",
            "--server",
            str(b / "llama-server"),
            "--rpc-local",
            "2",
            "--rpc-link",
            "1gbit/0.5ms",
            "--server-log",
            str(log),
            "-m",
            str(m),
            "--port",
            str(llama_server.free_port()),
        ],
    )
    assert serve.run(a, config.Settings(cache_dir=tmp_path)) == 0
    err = capsys.readouterr().err
    assert "(shaped: 1gbit/0.5ms)" in err
    assert err.count("ggml-bridge: shaped link 1gbit/0.5ms to ggml-rpc-server on 127.0.0.1:") == 2
    assert err.count(": 33 B up, 36 B down so far") == 2
    # llama-server was given the shapers' ports, not the servers'
    servers = [logparse.parse_rpc(p.read_text()).state["endpoint"] for p in sorted(log.parent.glob("rpc-server-*.log"))]
    given = (tmp_path / "argv").read_text().split("--rpc ")[1].split()[0].split(",")
    assert len(servers) == len(given) == 2 and not set(servers) & set(given)
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("shaper")]


def test_serve_rpc_link_needs_local_servers_and_a_good_link(tmp_path):
    from ggml_bridge import cli
    from ggml_bridge.foundations.errors import UsageError
    from ggml_bridge.runtime import serve

    b, m = _serve_fake(tmp_path)
    with pytest.raises(UsageError, match="--rpc-link needs local rpc-servers"):
        serve.run(
            cli.parse_command(
                cli.COMMANDS["serve"],
                ["--server", str(b / "llama-server"), "--rpc-link", "1gbit/1ms", "--rpc", "127.0.0.1:1", "-m", str(m)],
            ),
            config.Settings(cache_dir=tmp_path),
        )
    with pytest.raises(UsageError, match="bad link rate"):
        serve.run(
            cli.parse_command(
                cli.COMMANDS["serve"],
                ["--server", str(b / "llama-server"), "--rpc-link", "fast/1ms", "--rpc-local", "1", "-m", str(m)],
            ),
            config.Settings(cache_dir=tmp_path),
        )


def test_report_says_what_crossed_the_link_and_that_the_bridge_is_idle():
    from ggml_bridge.experiments.ladder.report import markdown_report
    from ggml_bridge.experiments.ladder.results import ModeResult, Prepared, RungResult

    link = results.Link.of({"link": "10gbit/0.2ms", "up": {"bytes": 3 << 20}, "down": {"bytes": 1 << 20}})
    v = results.Validity(
        notes=("rpc-server a: bridge idle, as it must be with 1 GPU (x)",),
        rpc={"a": results.RpcServerSeen(("CUDA0",), {"rpc_graph_compute": 3}, False, None, link)},
    )
    r = _rung(rpc_servers=[["CUDA0"]], modes=["off", "rpc-off"])
    modes = {
        "off": ModeResult(1, "patched", "patched", {}, {}, validity=results.Validity()),
        "rpc-off": ModeResult(1, "patched", "patched", {}, {}, validity=v),
    }
    rep = results.LadderResult(
        "x", "x.toml", "cuda", "now", "v", 1, {}, False, (RungResult(r, "pass", (), modes, Prepared(), 1),), 1, "pass"
    )
    md = markdown_report(rep)
    assert "link 10gbit/0.2ms: up/down MiB=3.00/1.00" in md and "bridge idle, as it must be with 1 GPU" in md


def test_tensor_split_meta_device_counts_as_its_members():
    text = (
        "llama_prepare_model_devices: creating a Meta device for tensor parallelism from 2 devices:\n"
        "llama_prepare_model_devices: - device 0: CUDA0 (NVIDIA H200)\n"
        "llama_prepare_model_devices: - device 1: CUDA1 (NVIDIA H200)\n"
        "llama_prepare_model_devices: using device Meta(CUDA0,CUDA1) (Meta(H200,H200)) (unknown id) - 1 MiB free\n"
    )
    info = logparse.parse(text)
    assert info.meta_devices == 2 and info.n_devices == 2
    assert logparse.parse("x: using device CUDA0 (H200) (id) - 1 MiB free\n").n_devices == 1
    assert logparse.is_read("llama_prepare_model_devices: creating a Meta device with 3 devices")


def test_front_gpu_rung_needs_the_model_on_the_front_gpu_and_the_rpc_server():
    r = _rung(rpc_front_gpu=True, rpc_servers=[["CUDA0"]])
    both = (
        "llama_model_load_from_file_impl: using device RPC0 (127.0.0.1:5) (unknown id) - 1 MiB free\n"
        "llama_model_load_from_file_impl: using device CUDA0 (H200) (0000:01) - 1 MiB free\n"
    )
    only_rpc = both.splitlines()[0] + "\n"
    assert validity.validate_front(r, {"server": logparse.parse(both), "perplexity": logparse.parse(both)}) == []
    bad = validity.validate_front(r, {"server": logparse.parse(both), "perplexity": logparse.parse(only_rpc)})
    assert bad == ["perplexity: the rung keeps a GPU in front of the rpc-servers, but the model sits on RPC0"]
