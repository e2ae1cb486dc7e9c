"""The ggml-bridge-server wheel installed in a fresh venv: from the fake tree and the real CPU wheel built offline
from the sdist (slow; sdist contents, the version plugin and the installed package's API are in
tests/unit/test_wheel.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from ggml_bridge import cache, config, wheel

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------- a real wheel


def _fresh_venv(path: Path) -> Path:
    """A new venv with nothing installed; the toolkit (this checkout and its dependencies) comes through a .pth
    placed AFTER its own site-packages, so only the wheel can provide ggml_bridge_server."""
    venv.EnvBuilder(with_pip=True).create(path)
    py = path / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "zz-ggml-bridge-dev.pth").write_text("\n".join([str(ROOT), *deps]) + "\n")
    return py


@pytest.mark.slow
def test_wheel_from_the_fake_tree_installs_and_serves(settings: config.Settings, tmp_path: Path) -> None:
    """The whole path on the fake llama.cpp (seconds): sdist -> pip wheel offline -> install -> $ORIGIN -> API."""
    pytest.importorskip("scikit_build_core")
    made = wheel.make_sdist(settings, tmp_path / "dist")
    whl = wheel.build_wheel(settings, made.path, tmp_path / "dist")
    assert whl.name.startswith(f"ggml_bridge_server-{made.version}+cpu-py3-none-linux_"), whl.name
    py = _fresh_venv(tmp_path / "venv")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(whl)], check=True)
    code = ("import ggml_bridge_server as g, subprocess; p = g.get_binary_path(); m = g.get_manifest(); "
            "print(p.parent.parent == g.PACKAGE_DIR, m['build']['backend'], m['build']['ui_embedded'], "
            "subprocess.run([p], capture_output=True, text=True).stdout.strip())")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:3] == ["True", "cpu", "False"] and "fake" in out[3:], out
    script = tmp_path / "venv" / "bin" / "ggml-bridge-server"
    assert script.is_file()


@pytest.fixture(scope="session")
def real_wheel(real_settings: config.Settings, real_tree) -> Path:  # type: ignore[no-untyped-def]
    """The CPU wheel of the real pinned tree, built offline from its sdist; kept in the test cache by the sdist's
    hash (the sdist is reproducible), so later sessions install it instead of compiling again."""
    pytest.importorskip("scikit_build_core")

    made = wheel.make_sdist(real_settings, real_settings.cache_dir / "test-sdist")
    key = cache.file_sha256(made.path)[:16]
    out = real_settings.cache_dir / "test-wheels" / key
    done = sorted(out.glob("ggml_bridge_server-*+cpu-*.whl"))
    return done[0] if done else wheel.build_wheel(real_settings, made.path, out)


@pytest.mark.slow
def test_real_cpu_wheel_installs_serves_and_passes_the_cpu_ladder(real_wheel: Path, real_build, real_tree,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """The real wheel in a fresh venv: $ORIGIN libraries, the embedded UI in its manifest, `serve --check` with
    no build present engages exactly as with a build, and the shipped CPU ladder (wheel vs the upstream build)."""
    import argparse
    from types import SimpleNamespace

    from ggml_bridge import ladder, model, serve

    assert "+cpu-py3-none-linux_" in real_wheel.name
    py = _fresh_venv(tmp_path / "venv")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(real_wheel)], check=True)
    info = json.loads(subprocess.run(
        [py, "-c", "import ggml_bridge_server as g, json; print(json.dumps({'bin': str(g.get_binary_path()), "
         "'m': g.get_manifest()}))"], capture_output=True, text=True, check=True).stdout)
    server, m = Path(info["bin"]), info["m"]
    assert m["build"]["backend"] == "cpu" and m["build"]["ui_embedded"] is True
    assert m["ui"]["embedded"] and len(m["ui"]["sha256"]) == 64 and m["upstream"]["commit"] == real_tree.commit
    assert {"llama-server", "llama-perplexity", "test-batched-transfers"} <= set(m["build"]["programs"])
    # every library resolves inside the package ($ORIGIN/../lib), none from elsewhere
    ldd = subprocess.run(["ldd", str(server)], capture_output=True, text=True, check=True).stdout
    ours = [line.split("=>", 1) for line in ldd.splitlines() if "libllama" in line or "libggml" in line]
    # ldd prints the $ORIGIN path unresolved (bin/../lib/x.so): compare resolved locations
    libdir = (server.parent.parent / "lib").resolve()
    assert ours and all(len(p) == 2 and Path(p[1].split("(")[0].strip()).resolve().parent == libdir
                        for p in ours), ldd

    vocab = Path(real_tree.path) / "models" / model.VOCAB_FILE
    gguf = model.ensure_model(tmp_path, "tiny", 1, vocab)
    env = {**os.environ, "GGML_BRIDGE_CACHE_DIR": str(tmp_path / "no-build"), "GGML_BRIDGE_BACKEND": "cpu"}
    check = subprocess.run([py, "-m", "ggml_bridge", "serve", "--check", "--batched", "on", "--", "-m", str(gguf),
                            "--port", str(serve.free_port()), "-c", "256", "-t", "2"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"using llama-server of the installed ggml-bridge-server {m['build']['version']} wheel" in check.stderr
    assert "batched transfers" in check.stderr and "check passed" in check.stderr

    upstream = real_build("upstream")
    p = argparse.ArgumentParser()
    ladder.add_arguments(p)
    a = p.parse_args(["--ladder", str(ROOT / "ladders" / "cpu.toml"), "--report", str(tmp_path / "rep"),
                      "--vocab", str(vocab), "--bin-dir-patched", str(server.parent),
                      "--bin-dir-upstream", str(upstream.bin_dir)])
    rc = ladder.run(a, SimpleNamespace(cache_dir=tmp_path / "cache"))
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    bad = {r["name"]: r["problems"] for r in rep["rungs"] if r["status"] != "pass"}
    assert rc == 0 and not bad and rep["binaries"]["same_build"] is False, bad
