"""``ggml-bridge doctor`` on the real builds (slow): the report of the CPU build and of the Vulkan build's lavapipe
devices (``GGML_VK_VISIBLE_DEVICES=0,0``: two devices, vulkan-marked, the Vulkan build of test_vulkan.py), each
recommended command run through ``serve --check``; and the probe's real code (patch 0002) built against the real CPU
build of ggml with the mock CUDA registry of tests/fixtures/probe_mock/, a pair whose peer copies corrupt and a
probe killed by a fault, read by the doctor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_bridge.experiments import model
from ggml_bridge.foundations import net

from helpers import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.slow

LAVAPIPE = {"GGML_VK_VISIBLE_DEVICES": "0,0"}


def _env(extra: dict[str, str], cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_CUDA", "GGML_VK", "FAKE_"))}
    env.update(extra, GGML_BRIDGE_CACHE_DIR=str(cache), PYTHONPATH=str(REPO_ROOT))
    return env


def _doctor(args: list[str], env: dict[str, str], out: Path) -> dict:  # type: ignore[type-arg]
    res = subprocess.run(
        [sys.executable, "-m", "ggml_bridge", "doctor", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert (out / "report.txt").read_text() == res.stdout
    doc: dict = json.loads((out / "doctor.json").read_text())  # type: ignore[type-arg]
    return doc


def _serve_check(rec: dict, env: dict[str, str], log: Path) -> str:  # type: ignore[type-arg]
    """The recommended command line with --check added after `serve` and a free port; returns its stderr."""
    argv = rec["argv"]
    at = argv.index("serve") + 1
    cmd = [sys.executable, "-m", "ggml_bridge", *argv[1:at], "--check", *argv[at:], "--port", str(net.free_port())]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**env, **rec["env"]}, cwd=REPO_ROOT)
    log.write_text(" ".join(cmd) + "\n" + res.stdout + res.stderr)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "check passed" in res.stderr
    return res.stderr


def _tiny(real_settings, real_tree) -> Path:  # type: ignore[no-untyped-def]
    vocab = Path(real_tree.path) / "models" / model.VOCAB_FILE
    return model.ensure_model(real_settings.cache_dir, "tiny", 1234, vocab)


def test_doctor_on_the_cpu_build(real_build, real_settings, real_tree, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = real_build("patched")
    env = _env({}, real_settings.cache_dir)
    doc = _doctor(["--bin-dir", str(b.bin_dir), "--model", str(_tiny(real_settings, real_tree))], env, tmp_path / "out")
    assert doc["listings"][0]["devices"] == [] and doc["listings"][0]["problem"] is None
    assert doc["nvml"]["status"] in ("no-driver", "no-binding", "ok")
    assert doc["probe"] is None and doc["probe_source"]  # why there are no measurements
    rec = doc["recommendation"]
    assert rec["bridge"] is None and rec["batched"] is False and rec["devices"] == [] and rec["ts"] == []
    assert "native" in doc["cpu"]["backend"] or "GGML_NATIVE" in doc["cpu"]["backend"]
    _serve_check(rec, env, tmp_path / "serve.log")


@pytest.mark.vulkan
def test_doctor_lists_the_lavapipe_devices_and_its_command_serves(  # type: ignore[no-untyped-def]
    real_vulkan_build, real_settings, real_tree, tmp_path: Path
) -> None:
    b = real_vulkan_build["patched"]
    env = _env(LAVAPIPE, real_settings.cache_dir)
    doc = _doctor(["--bin-dir", str(b.bin_dir), "--model", str(_tiny(real_settings, real_tree))], env, tmp_path / "out")
    devices = doc["listings"][0]["devices"]
    assert [d["name"] for d in devices] == ["Vulkan0", "Vulkan1"], devices
    assert all("llvmpipe" in d["description"] and d["total_mib"] > 0 for d in devices)
    rec = doc["recommendation"]
    # a GPU device holds the model: batching on (a graph's first device split stages, docs/batched.md)
    assert rec["devices"] == ["Vulkan0", "Vulkan1"] and rec["ts"] == [50, 50] and rec["batched"] is True
    assert rec["bridge"] is None and rec["env"] == LAVAPIPE
    assert rec["argv"][-6:] == ["-dev", "Vulkan0,Vulkan1", "-sm", "layer", "-ts", "50,50"]
    assert [x["path"] for x in rec["boundaries"]] == [
        "staged in host memory by the scheduler (the bridge carries CUDA pairs only)"
    ]
    report = (tmp_path / "out" / "report.txt").read_text()
    assert "Vulkan0: llvmpipe" in report and "GGML_VK_VISIBLE_DEVICES=0,0 ggml-bridge serve" in report
    (tmp_path / "report.txt").write_text(report)
    _serve_check(rec, env, tmp_path / "serve.log")  # batching asked for: serve proves it on /metrics


def _mock_probe(real_build, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The test program (--probe) of the series in the real patched tree, linked against the real CPU build's ggml
    and the mock CUDA registry."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    b = real_build("patched")
    tree = Path(json.loads(Path(b.manifest_path).read_text())["source_dir"])
    mock = FIXTURES / "probe_mock"
    inc = [f"-I{mock}", f"-I{tree / 'ggml' / 'include'}", f"-I{tree / 'ggml' / 'src'}"]
    objs = []
    for src, extra in (
        (tree / "tools" / "transfer-tests" / "test-mapped-host-bridge.cpp", ["-Dmain=probe_program_main"]),
        (mock / "probe_mock.cpp", []),
    ):
        obj = tmp_path / (src.stem + ".o")
        subprocess.run(
            [cxx, "-std=c++17", "-O1", *extra, *inc, "-c", str(src), "-o", str(obj)], check=True, timeout=300
        )
        objs.append(str(obj))
    exe = tmp_path / "probe-mock"
    libs = ["-L", str(b.bin_dir), "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{b.bin_dir}", "-lpthread"]
    subprocess.run([cxx, "-o", str(exe), *objs, *libs], check=True, timeout=300)
    return exe


def test_the_probes_own_code_on_mock_devices(real_build, real_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    exe = _mock_probe(real_build, tmp_path)
    runs = {
        "corrupt": ({"MOCK_GPUS": "3", "MOCK_CORRUPT": "0-1"}, 0),
        "died": ({"MOCK_GPUS": "2", "MOCK_DIE": "0-1"}, -6),  # abort()
    }
    for name, (mock_env, status) in runs.items():
        res = subprocess.run(
            [str(exe), "--probe", "--quick", "--deadline", "120"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **mock_env},
        )
        assert res.returncode == status, res.stderr[-2000:]
        (tmp_path / f"{name}.txt").write_text(res.stdout)
        doc = _doctor(
            ["--probe-output", str(tmp_path / f"{name}.txt")], _env({}, real_settings.cache_dir), tmp_path / name
        )
        verdicts = doc["probe"]["verdicts"]
        assert verdicts["0,1"]["verdict"] == ("corrupt" if name == "corrupt" else "died")
        assert doc["recommendation"]["bridge"] == "auto:0-1" and doc["recommendation"]["p2p"] is False
        assert "GPU 0 AND GPU 1 ARE NOT SAFE" in doc["recommendation"]["warnings"][0]
    assert '"1,0": {' in (tmp_path / "corrupt" / "doctor.json").read_text()  # both directions were checked
    assert doc["probe"]["seconds"] is None and doc["probe"]["died_during"] == [0, 1, 2]  # the died run: no end line
