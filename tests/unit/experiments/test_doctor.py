"""``ggml-bridge doctor`` with NVML and the probe simulated: the real nvidia-ml-py module with its functions replaced
(a GPU rig, no driver, no binding), the probe's real output on mock devices (tests/fixtures/probe/, a corrupting pair,
a probe killed by a fault, virtual devices, a verified peer pair), and a fake llama-server that lists devices."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ggml_bridge import cli
from ggml_bridge.experiments.doctor import inventory, nvml, probe, recommend, report
from ggml_bridge.experiments.doctor.facts import Findings
from ggml_bridge.runtime import rpc

from helpers import FAKE_RPC, FIXTURES, doctor_findings, write_exe

PROBES = FIXTURES / "probe"
CORRUPT = PROBES / "mock-3gpu-corrupt-0-1-quick.txt"
DIED = PROBES / "mock-2gpu-died-0-1-quick.txt"
VIRTUAL = PROBES / "mock-1gpu-4virtual-quick.txt"
VERIFIED = PROBES / "mock-2gpu-ok.txt"

# --------------------------------------------------------------------------------------------- NVML, simulated


@dataclasses.dataclass
class SimGpu:
    name: str
    bus: str  # NVML's form, 00000000:01:00.0
    gen: int
    gen_max: int
    width: int
    width_max: int
    mem_gib: int = 24


def simulate_nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[SimGpu], nvlinks: int = 0) -> Any:
    """Replace the real pynvml's functions (monkeypatch refuses a name the binding does not have: the doctor calls
    the binding's real API). GPUs 0 and 1 share a PCIe switch, the others meet at the CPU; NVLink between 0 and 1
    when ``nvlinks``; only 0 and 1 report P2P read support."""
    import pynvml as p

    handles = list(range(len(gpus)))

    def set_(name: str, fn: Any) -> None:
        monkeypatch.setattr(p, name, fn)

    set_("nvmlInit", lambda: None)
    set_("nvmlShutdown", lambda: None)
    set_("nvmlSystemGetDriverVersion", lambda: "580.95.05")
    set_("nvmlSystemGetCudaDriverVersion_v2", lambda: 13000)
    set_("nvmlDeviceGetCount", lambda: len(gpus))
    set_("nvmlDeviceGetHandleByIndex", lambda i: handles[i])
    set_("nvmlDeviceGetName", lambda h: gpus[h].name)
    set_("nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=gpus[h].bus.encode()))
    set_("nvmlDeviceGetUUID", lambda h: f"GPU-{h:08d}")
    set_("nvmlDeviceGetCudaComputeCapability", lambda h: (8, 6))
    set_(
        "nvmlDeviceGetMemoryInfo",
        lambda h: SimpleNamespace(total=gpus[h].mem_gib << 30, free=(gpus[h].mem_gib - 1) << 30),
    )
    set_("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: gpus[h].gen)
    set_("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: gpus[h].gen_max)
    set_("nvmlDeviceGetCurrPcieLinkWidth", lambda h: gpus[h].width)
    set_("nvmlDeviceGetMaxPcieLinkWidth", lambda h: gpus[h].width_max)
    set_(
        "nvmlDeviceGetTopologyCommonAncestor",
        lambda a, b: p.NVML_TOPOLOGY_SINGLE if {a, b} == {0, 1} else p.NVML_TOPOLOGY_HOSTBRIDGE,
    )

    def nvlink_state(h: int, link: int) -> int:
        if h in (0, 1) and link < nvlinks:
            return p.NVML_FEATURE_ENABLED
        raise p.NVMLError(p.NVML_ERROR_NOT_SUPPORTED)

    set_("nvmlDeviceGetNvLinkState", nvlink_state)
    set_("nvmlDeviceGetNvLinkRemotePciInfo", lambda h, link: SimpleNamespace(busId=gpus[1 - h].bus))
    set_(
        "nvmlDeviceGetP2PStatus",
        lambda a, b, idx: p.NVML_P2P_STATUS_OK if {a, b} == {0, 1} else p.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
    )
    return p


RIG = [
    SimGpu("NVIDIA GeForce RTX 3090", "00000000:01:00.0", 1, 4, 16, 16),  # idle: Gen1 now, Gen4 max
    SimGpu("NVIDIA GeForce RTX 3090", "00000000:02:00.0", 4, 4, 16, 16),
    SimGpu("NVIDIA GeForce RTX 3060", "00000000:03:00.0", 1, 3, 1, 16, mem_gib=12),  # on an x1 riser
]


def test_nvml_inventory_of_a_simulated_rig(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_nvml(monkeypatch, RIG, nvlinks=4)
    rep = nvml.read()
    assert rep.status == "ok" and rep.driver == "580.95.05" and rep.cuda_driver == "13.0"
    assert [g.pci for g in rep.gpus] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    g2 = rep.gpus[2]
    assert (g2.pcie_gen, g2.pcie_gen_max, g2.pcie_width, g2.pcie_width_max, g2.cc) == (1, 3, 1, 16, "8.6")
    assert g2.degraded and not rep.gpus[0].degraded  # the riser's width, not the idle generation
    assert g2.memory_total_mib == 12 << 10
    p01, p02 = rep.pair(0, 1), rep.pair(0, 2)
    assert p01 is not None and p02 is not None
    assert (p01.topology, p01.nvlinks, p01.p2p_read) == ("PIX", 4, "ok")
    assert (p02.topology, p02.nvlinks, p02.p2p_read) == ("PHB", 0, "chipset not supported")
    assert nvml.link_gbps(4, 16) == pytest.approx(31.5, rel=0.01) and nvml.link_gbps(1, 1) == 0.25


def test_nvml_without_the_driver_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml as p

    def no_library() -> None:
        raise p.NVMLError_LibraryNotFound(p.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(p, "nvmlInit", no_library)
    rep = nvml.read()
    assert rep.status == "no-driver" and "no NVIDIA driver" in rep.detail and rep.gpus == []


def test_nvml_without_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    rep = nvml.read()
    assert rep.status == "no-binding" and "nvidia-ml-py" in rep.detail


def test_nvml_error_in_one_query_leaves_that_field_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    p = simulate_nvml(monkeypatch, RIG[:1])

    def unsupported(h: int) -> int:
        raise p.NVMLError(p.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(p, "nvmlDeviceGetCurrPcieLinkGeneration", unsupported)
    rep = nvml.read()
    assert rep.status == "ok" and rep.gpus[0].pcie_gen is None and rep.gpus[0].pcie_gen_max == 4


# --------------------------------------------------------------------------------------------- the probe's output


def test_probe_output_with_a_corrupting_pair() -> None:
    res = probe.parse(CORRUPT.read_text())
    assert res.version == probe.VERSION and res.quick and res.ended and not res.malformed
    assert sorted(res.devices) == [0, 1, 2] and sorted(res.gpus) == [0, 1, 2]
    assert res.peers[(0, 1)] == (True, False) and res.peers[(0, 2)] == (False, False)
    assert res.pairs[(0, 1)] == ("peer-capable", False) and res.pairs[(0, 2)] == ("no-peer", False)
    assert res.verdicts[(0, 1)].verdict == "corrupt" and res.verdicts[(1, 0)].verdict == "corrupt"
    assert res.verdicts[(0, 2)].verdict == "no-peer-path"
    assert res.bad_pairs() == [(0, 1)]
    bad = [c for c in res.checks if not c.ok]
    assert bad and all(c.want != c.got and c.bad_bytes == 1 and c.guard_bad == 0 for c in bad)
    assert all(c.ok for c in res.checks if c.bytes <= 4096)  # the mock corrupts copies over 4 KiB only
    for s, d in ((0, 1), (0, 2), (1, 2)):  # quick: one direction per pair, both paths, both sizes
        for path in ("bridge", "upstream"):
            assert res.copy(s, d, path, probe.SMALL) and res.copy(s, d, path, probe.LARGE)
    assert res.link(0, "d2h", probe.LARGE) and res.gflops[0] > 0


def test_probe_that_died_names_the_pair() -> None:
    res = probe.parse(DIED.read_text())
    assert not res.ended and res.died_during == (0, 1, 2)
    assert res.verdicts[(0, 1)].verdict == "died" and res.bad_pairs() == [(0, 1)]


def test_probe_parser_keeps_going_past_bad_lines() -> None:
    text = (
        "noise before\n"
        "probe: begin version=1 quick=0 deadline_s=0\n"
        "probe: device dev=0 gpu=0 name=CUDA0 description=x total_mib=100 free_mib=90 virtual=0\n"
        'probe: gpu gpu=0 pci="0000:01:00.0 name=broken\n'  # unbalanced quote
        "probe: link dev=0 gpu=0 dir=d2h bytes=65536 gbps=x us=1 iters=2\n"  # not a number
        "probe: copy src=0 dst=1\n"  # fields missing
        "probe: future-kind a=1\n"  # a newer probe's line: ignored
        "[ts] probe: compute dev=0 gpu=0 gflops=12.5\n"  # a prefix before the marker
        "probe: end seconds=1.5\n"
    )
    res = probe.parse(text)
    assert len(res.malformed) == 3 and res.gflops == {0: 12.5} and res.seconds == 1.5 and res.version == 1


def test_probe_run_reads_what_a_stopped_program_printed(tmp_path: Path) -> None:
    """The hard limit: a probe that hangs is stopped, and what it printed before is kept."""
    prog = write_exe(
        tmp_path / "hang",
        "#!PYTHON\nimport sys, time\nprint('probe: begin version=1 quick=1 deadline_s=1', flush=True)\n"
        "print('probe: check-begin src_gpu=0 dst_gpu=1 case=0', flush=True)\ntime.sleep(60)\n",
    )
    res = probe.run(probe.ProbeRun(prog, budget_s=0.5, limit_s=0.8, quick=True, log_file=tmp_path / "probe.txt"))
    assert res.timed_out and res.verdicts[(0, 1)].verdict == "died"
    assert "probe: check-begin src_gpu=0 dst_gpu=1 case=0" in (tmp_path / "probe.txt").read_text()


# --------------------------------------------------------------------------------------------- the advice


def _findings(
    probe_file: Path | None,
    devices: list[str] | None = None,
    *,
    model: inventory.Model | None = None,
    env: dict[str, str] | None = None,
) -> Findings:
    res = probe.parse(probe_file.read_text()) if probe_file else None
    return doctor_findings(res, devices=devices, model=model, env=env)


def test_a_corrupting_pair_is_flagged_and_kept_off_peer_access() -> None:
    f = _findings(CORRUPT)
    rec = recommend.recommend(f, "/b/bin/llama-server")
    assert rec.bridge == "auto:0-1" and not rec.p2p and rec.batched  # three devices: the first split stages
    assert recommend.BATCHING_MEASURED in rec.notes
    assert rec.env["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "auto:0-1" and "GGML_CUDA_P2P" not in rec.env
    assert "--bridge" not in rec.argv and "--server" not in rec.argv  # serve finds this build by itself
    assert any("GPU 0 AND GPU 1 ARE NOT SAFE" in w and "leave GGML_CUDA_P2P unset" in w for w in rec.warnings)
    assert rec.devices == ["CUDA0", "CUDA1", "CUDA2"] and sum(rec.ts) == 100 and len(rec.ts) == 3
    assert [b.path for b in rec.boundaries] == ["bridge", "bridge"]
    assert all(b.per_token_us and b.per_ubatch_ms and b.per_token_us < b.per_ubatch_ms * 1e3 for b in rec.boundaries)
    assert rec.command.startswith(
        "GGML_CUDA_MAPPED_HOST_BRIDGE=auto:0-1 ggml-bridge serve --batched on -- -m MODEL.gguf"
    )
    text = report.render(f, rec)
    assert text.index("!! PEER COPIES BETWEEN GPU 0 AND GPU 1 ARE NOT SAFE") < text.index("== Machine")
    assert "GPU 0 -> GPU 1: CORRUPT: 8 of 10 copies differ" in text and "GPU 0 -> GPU 2: no peer path" in text
    doc = json.loads(report.dumps(f, rec))
    assert doc["schema"] == report.SCHEMA and doc["recommendation"]["bridge"] == "auto:0-1"
    assert doc["probe"]["verdicts"]["0,1"]["verdict"] == "corrupt" and doc["recommendation"]["command"] == rec.command


def test_a_probe_killed_by_a_peer_copy_is_flagged_too() -> None:
    rec = recommend.recommend(_findings(DIED), None)
    assert rec.bridge == "auto:0-1" and any("died during copy" in w for w in rec.warnings)
    assert "--server" in rec.argv  # serve would not find this build by itself


def _with_p2p_gbps(gbps: float) -> probe.ProbeResult:
    """The verified pair, its direct 16 MiB copies at ``gbps`` and its bridged ones at 10 GB/s."""
    text = re.sub(r"(path=p2p bytes=16777216 gbps=)[0-9.]+", rf"\g<1>{gbps:.3f}", VERIFIED.read_text())
    return probe.parse(re.sub(r"(path=bridge bytes=16777216 gbps=)[0-9.]+", r"\g<1>10.000", text))


def test_verified_peer_copies_are_used_only_where_clearly_faster() -> None:
    f = _findings(VERIFIED)
    assert {v.verdict for v in f.probe.verdicts.values()} == {"ok"}  # type: ignore[union-attr]
    f.probe = _with_p2p_gbps(40.0)
    rec = recommend.recommend(f, "/b/bin/llama-server")
    assert rec.p2p and rec.env["GGML_CUDA_P2P"] == "1" and rec.bridge == "auto" and not rec.warnings
    assert rec.boundaries[0].path == "direct peer copy" and any("4.0x or more" in n for n in rec.notes)
    f.probe = _with_p2p_gbps(10.5)  # 1.05x: not worth enabling peer access for
    rec = recommend.recommend(f, None)
    assert not rec.p2p and "GGML_CUDA_P2P" not in rec.env and rec.boundaries[0].path == "bridge"


def test_virtual_devices_of_one_gpu_are_not_a_pcie_pair() -> None:
    f = _findings(VIRTUAL, env={"GGML_CUDA_DEVICES": "4"})
    rec = recommend.recommend(f, "/b/bin/llama-server")
    assert rec.bridge == "auto" and rec.argv[2:4] == ["--bridge", "auto"] and rec.env == {"GGML_CUDA_DEVICES": "4"}
    assert any("virtual devices of one GPU" in n for n in rec.notes)
    assert rec.ts == [25, 25, 25, 25] and len(rec.boundaries) == 3
    assert all(b.path.startswith("device-local copy") and b.per_token_us for b in rec.boundaries)
    assert "-ts 25,25,25,25" in rec.command and rec.command.startswith(
        "GGML_CUDA_DEVICES=4 ggml-bridge serve --bridge auto --batched on"
    )


def test_split_follows_measured_speed_within_each_devices_memory(tmp_path: Path) -> None:
    f = _findings(CORRUPT)
    f.probe.gflops.update({0: 300.0, 1: 100.0, 2: 100.0})  # type: ignore[union-attr]
    f.listings[0].devices = [
        inventory.ListedDevice("CUDA0", "a", 8192, 4096),  # fastest, but it holds little
        inventory.ListedDevice("CUDA1", "b", 24576, 24000),
        inventory.ListedDevice("CUDA2", "c", 24576, 24000),
    ]
    f.model = inventory.Model(tmp_path / "m.gguf", 10 << 30, "llama", 4096, 32)
    ts, basis = recommend.split_shares(f, recommend.split_devices(f))
    cap0 = (4096 * 0.9 - 512) / (10 << 10)  # what CUDA0's free memory holds of 10 GiB
    assert ts[0] == round(100 * cap0) and abs(ts[1] - ts[2]) <= 1 and sum(ts) == 100 and "measured speed" in basis
    f.model = inventory.Model(tmp_path / "m.gguf", 100 << 30, "llama", 4096, 32)  # does not fit at all
    ts, basis = recommend.split_shares(f, recommend.split_devices(f))
    assert "does not fit" in basis and ts[1] == ts[2] > ts[0]
    f.model = None
    ts, basis = recommend.split_shares(f, recommend.split_devices(f))
    assert "free memory" in basis and ts == [8, 46, 46]


def test_a_link_trained_below_its_width_or_speed_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_nvml(monkeypatch, RIG)
    f = _findings(CORRUPT)
    f.nvml = nvml.read()
    # GPU 0 measured at 20 GB/s one way (Gen4 x16 gives 31.5: fine, it only idles at Gen1), GPU 1 at 7.5 GB/s (a
    # link that trained at Gen2 x16, or Gen4 x4, as far as the bandwidth tells)
    for dev, gbps in ((0, 20.0), (1, 7.5)):
        for d in ("d2h", "h2d"):
            t = f.probe.links[(dev, d, probe.LARGE)]  # type: ignore[union-attr]
            f.probe.links[(dev, d, probe.LARGE)] = dataclasses.replace(t, gbps=gbps)  # type: ignore[union-attr]
    rec = recommend.recommend(f, None)
    assert any("GPU 2 (NVIDIA GeForce RTX 3060) runs its link at x1 of x16" in w for w in rec.warnings)
    assert any(w.startswith("GPU 1 (NVIDIA GeForce RTX 3090): 7.5 GB/s measured") for w in rec.warnings)
    assert not any(w.startswith("GPU 0 ") for w in rec.warnings)
    text = report.render(f, rec)
    assert "GPU 0 - GPU 1: PIX (one PCIe switch); NVML P2P read: ok; CUDA peer access: yes / yes" in text


# --------------------------------------------------------------------------------------------- the command


def test_nothing_to_find_is_a_report_and_exit_0(doctor_bin: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor"]) == 0
    out, err = capfd.readouterr()
    assert "NVIDIA: no NVIDIA driver" in out and "no build of llama-server found" in out
    assert "none: no NVIDIA driver, nothing to measure" in out and "Traceback" not in err
    assert "ggml-bridge serve -- -m MODEL.gguf" in out


def test_vulkan_devices_are_listed_and_split(
    doctor_bin: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "FAKE_LIST",
        "Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free);"
        "Vulkan1: Intel(R) Arc(tm) A770 Graphics (DG2) (16288 MiB, 12000 MiB free)",
    )
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0,1")
    assert cli.main(["doctor", "--bin-dir", str(doctor_bin), "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    rec = doc["recommendation"]
    assert rec["devices"] == ["Vulkan0", "Vulkan1"] and rec["ts"] == [67, 33] and rec["batched"]
    assert rec["bridge"] is None and "--bridge" not in rec["argv"] and rec["env"] == {"GGML_VK_VISIBLE_DEVICES": "0,1"}
    assert rec["argv"][-6:] == ["-dev", "Vulkan0,Vulkan1", "-sm", "layer", "-ts", "67,33"]
    assert doc["cpu"]["backend"].startswith("portable: ggml loads the haswell variant")
    assert [b["path"] for b in rec["boundaries"]] == [
        "staged in host memory by the scheduler (the bridge carries CUDA pairs only)"
    ]


def test_saved_probe_output_report_json_and_plot(
    doctor_bin: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    rc = cli.main(["doctor", "--bin-dir", str(doctor_bin), "--probe-output", str(CORRUPT), "--out", str(out)])
    o, err = capfd.readouterr()
    assert rc == 0 and "!! PEER COPIES BETWEEN GPU 0 AND GPU 1 ARE NOT SAFE" in o
    assert "ggml-bridge: warning: PEER COPIES BETWEEN GPU 0 AND GPU 1" in err  # loud on stderr too
    assert (out / "report.txt").read_text() == o
    assert json.loads((out / "doctor.json").read_text())["recommendation"]["bridge"] == "auto:0-1"
    assert (out / "pairs.png").read_bytes()[:4] == b"\x89PNG"


def test_rpc_endpoints_good_and_bad(
    doctor_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    exe = write_exe(tmp_path / "ggml-rpc-server", FAKE_RPC.read_text())
    good = rpc.LocalRpcServer(exe).start(timeout=20)
    dead = f"127.0.0.1:{rpc.free_port()}"
    try:
        rc = cli.main(["doctor", "--no-probe", "--bin-dir", str(doctor_bin), "--rpc", f"{good.endpoint},{dead}"])
    finally:
        good.stop()
    out, err = capfd.readouterr()
    assert rc == 41, err
    assert f"{good.endpoint}: rpc-server, protocol 7.0.0" in out and f"RPC0[{good.endpoint}]: fake rpc device" in out
    bad_lines = [line for line in out.splitlines() if line.startswith(f"{dead}:")]
    assert len(bad_lines) == 1 and "connection refused" in bad_lines[0] and "nothing listens" in bad_lines[0]
    said = [line for line in err.splitlines() if line.startswith("ggml-bridge: ")]
    assert said[-1].startswith(f"ggml-bridge: rpc error: 1 of 2 RPC endpoint(s) failed the check ({dead}).")
    assert "start or fix those rpc-servers" in said[-1]
    assert f"--rpc {good.endpoint} --" in out and "Traceback" not in err


def test_gpus_are_named_by_cuda_ordinal_not_nvml_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML numbers GPUs by PCI bus, CUDA fastest first: the riser card is NVML's GPU 0 here but CUDA's GPU 2 (the
    probe's PCI bus ids tell), and the bridge's pairs and log lines use CUDA's numbers."""
    simulate_nvml(monkeypatch, [RIG[2], RIG[0], RIG[1]])
    f = _findings(CORRUPT)
    f.nvml = nvml.read()
    assert [f.cuda_ordinal(i) for i in range(3)] == [2, 0, 1]
    rec = recommend.recommend(f, None)
    assert any(w.startswith("GPU 2 (NVIDIA GeForce RTX 3060) runs its link at x1 of x16") for w in rec.warnings)
    text = report.render(f, rec)
    assert "GPU 2: NVIDIA GeForce RTX 3060" in text and "GPU 0 - GPU 1: PIX" not in text
    f.probe = None  # without the probe CUDA's order is not known: NVML's numbers, said so
    assert recommend.recommend(f, None).warnings[0].startswith("NVML GPU 0 (NVIDIA GeForce RTX 3060) runs its link")


def test_the_probe_runs_from_the_cuda_build(
    doctor_bin: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A CUDA build (its ggml-cuda library beside llama-server) with NVML seeing a GPU: the doctor runs the build's
    test-mapped-host-bridge --probe with its time budget (a stand-in printing the virtual-device fixture) and keeps its
    raw output in --out."""
    simulate_nvml(monkeypatch, [SimGpu("NVIDIA H200", "00000000:01:00.0", 5, 5, 16, 16, mem_gib=141)])
    (doctor_bin / "libggml-cuda.so").write_bytes(b"")
    write_exe(
        doctor_bin / "test-mapped-host-bridge",
        "#!PYTHON\nimport sys\nassert sys.argv[1:4] == ['--probe', '--deadline', '7'] and '--quick' in sys.argv, sys.argv\n"
        f"print(open({str(VIRTUAL)!r}).read(), end='')\n",
    )
    monkeypatch.setenv(
        "FAKE_LIST", ";".join(f"CUDA{i}: NVIDIA H200 (dev p0/v{i}) (36000 MiB, 35000 MiB free)" for i in range(4))
    )
    monkeypatch.setenv("GGML_CUDA_DEVICES", "4")
    out = tmp_path / "out"
    rc = cli.main(["doctor", "--bin-dir", str(doctor_bin), "--quick", "--time-budget", "7", "--out", str(out)])
    text, err = capfd.readouterr()
    assert rc == 0, err
    assert "GPU 0: NVIDIA H200, cc 8.6, 141 GiB (140 GiB free), PCIe Gen5 x16 now, Gen5 x16 max" in text
    assert f"{doctor_bin / 'test-mapped-host-bridge'} --probe --quick" in text
    assert "CUDA0 -> CUDA1 (virtual): bridge" in text and "(none besides the CPU)" not in text
    assert "probe: end seconds=" in (out / "probe.txt").read_text()
    server = doctor_bin / "llama-server"  # not the build serve finds by itself: named
    assert (
        f"GGML_CUDA_DEVICES=4 ggml-bridge serve --server {server} --bridge auto --batched on -- -m MODEL.gguf" in text
    )
    assert text.rstrip().endswith("-dev CUDA0,CUDA1,CUDA2,CUDA3 -sm layer -ts 25,25,25,25")


def test_cpu_and_its_backend(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD Ryzen 9 7950X\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f\n")
    native = inventory.Build("patched/cpu build", "cpu", Path("/b/bin/llama-server"), ("-DGGML_NATIVE=ON",))
    cpu = inventory.cpu_info([native], [inventory.Listing(native)], info)
    assert cpu.model == "AMD Ryzen 9 7950X" and cpu.features == ("sse4_2", "avx", "avx2", "fma", "avx512f")
    assert cpu.backend.startswith("compiled for this CPU (-DGGML_NATIVE=ON, patched/cpu build)")
    wheel = inventory.Build("installed ggml-bridge-server wheel", "cpu", Path("/w/bin/llama-server"))
    loaded = inventory.Listing(wheel, loaded={"CPU": "/w/bin/libggml-cpu-zen4.so"})
    assert inventory.cpu_info([wheel], [loaded], info).backend.startswith("portable: ggml loads the zen4 variant")
    assert inventory.cpu_info([], [], tmp_path / "none").model == "unknown CPU"


def test_batching_is_advised_wherever_a_gpu_device_stages() -> None:
    """Batching gained on one GPU (tg128 +4-5 % on an H200) and, since only a graph's first device split stages, on
    a split of six virtual devices too (+3-4 %, 2026-12-03); the rule per split before it lost 1-2 % there, and the
    advice was then one GPU device only: the advice follows what was measured."""
    one = [inventory.ListedDevice("CUDA0", "NVIDIA H200", 143000, 142000)]
    two = one + [inventory.ListedDevice("CUDA1", "NVIDIA H200", 143000, 142000)]
    cpu: list[inventory.ListedDevice] = []
    for devices, want in ((one, True), (two, True), (cpu, False)):
        rec = recommend.Recommendation()
        recommend._batching_advice(rec, devices)
        assert rec.batched is want, devices
        assert (recommend.BATCHING_MEASURED in rec.notes) is bool(devices)
