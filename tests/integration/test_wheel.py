"""The ggml-bridge-server wheel installed in a fresh venv: from the fake tree and the real CPU wheel built offline
from the sdist (slow; sdist contents, the version plugin and the installed package's API are in
tests/unit/distribution/test_wheel.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from ggml_bridge.distribution import wheel, wheel_plan
from ggml_bridge.foundations import cache, config
from ggml_bridge.foundations.layout import Layout
from ggml_bridge.runtime import llama_server

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------- a real wheel


def _fresh_venv(path: Path) -> Path:
    """A new venv with nothing installed; the toolkit (this checkout and its dependencies) comes through a .pth
    placed AFTER its own site-packages, so only the wheel can provide ggml_bridge_server."""
    venv.EnvBuilder(with_pip=True).create(path)
    py = path / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
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
    code = (
        "import ggml_bridge_server as g, subprocess; p = g.get_binary_path(); m = g.get_manifest(); "
        "print(p.parent.parent == g.PACKAGE_DIR, m['build']['backend'], m['build']['ui_embedded'], "
        "subprocess.run([p], capture_output=True, text=True).stdout.strip())"
    )
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:3] == ["True", "cpu", "False"] and "fake" in out[3:], out
    script = tmp_path / "venv" / "bin" / "ggml-bridge-server"
    assert script.is_file()


@pytest.fixture(scope="session")
def real_wheel(real_settings: config.Settings, real_tree) -> Path:  # type: ignore[no-untyped-def]
    """The portable CPU wheel of the real pinned tree (CI's reduced variant set: x64 + haswell), built offline
    from its sdist and repaired by auditwheel; kept in the test cache by the sdist's hash and the variants (the
    sdist is reproducible), so later sessions install it instead of compiling again."""
    given = os.environ.get("GGML_BRIDGE_TEST_WHEEL")  # the release workflow tests the wheel it built
    if given:
        return Path(given).resolve()
    pytest.importorskip("scikit_build_core")
    pytest.importorskip("auditwheel")

    made = wheel.make_sdist(real_settings, real_settings.cache_dir / "test-sdist")
    variants = wheel_plan.CI_CPU_VARIANTS
    key = cache.file_sha256(made.path)[:16] + "-" + "-".join(variants)
    out = real_settings.cache_dir / "test-wheels" / key
    done = sorted(out.glob("ggml_bridge_server-*+cpu-*manylinux*.whl"))
    if done:
        return done[0]
    raw = sorted((out / "unrepaired").glob("ggml_bridge_server-*+cpu-*.whl"))
    if not raw:
        raw = [
            wheel.build_wheel(
                real_settings, made.path, out / "unrepaired", wheel_plan.plan(real_settings, cpu_variants=variants)
            )
        ]
    return wheel.repair_wheel(raw[0], out).path


def library_problems(pkg: Path, forbidden: tuple[Path, ...]) -> list[str]:
    """What ldd says is wrong with the ELF files of an installed package: a library not found, or one found in
    a build tree, a cache or the project checkout (``forbidden``) instead of the package or the system."""
    problems = []
    elves = [p for p in sorted(pkg.rglob("*")) if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    assert elves, f"no ELF file under {pkg}"
    for elf in elves:
        out = subprocess.run(["/usr/bin/ldd", str(elf)], capture_output=True, text=True, env={"PATH": "/usr/bin"})
        for line in out.stdout.splitlines():
            if "not found" in line:
                problems.append(f"{elf.relative_to(pkg)}: {line.strip()}")
            elif "=>" in line and "/" in line.split("=>", 1)[1]:
                where = Path(line.split("=>", 1)[1].split("(")[0].strip()).resolve()
                if any(where.is_relative_to(f) for f in forbidden):
                    problems.append(f"{elf.relative_to(pkg)}: {line.strip()} (outside the wheel)")
    return problems


@pytest.mark.slow
def test_repaired_cpu_wheel_runs_in_a_bare_venv_without_compiler_or_checkout(
    real_wheel: Path,
    real_tree,  # type: ignore[no-untyped-def]
    real_settings: config.Settings,
    tmp_path: Path,
) -> None:
    """The repaired portable wheel as a user gets it: a fresh venv (nothing else installed), PATH without a
    compiler, run from an empty folder, no checkout or toolkit importable; --version, a greedy request, the
    best CPU variant and the x86-64 baseline alone; every shared library resolves inside the wheel or the
    system (ldd), none from the build tree or the cache."""
    import shutil
    import urllib.request

    from ggml_bridge.experiments import model

    assert "manylinux" in real_wheel.name and "+cpu-py3-none-" in real_wheel.name, real_wheel.name
    show = " ".join(real_wheel.with_name(real_wheel.name + ".auditwheel.txt").read_text().split())
    tag = real_wheel.name[:-4].split("-")[-1]
    assert f'is consistent with the following platform tag: "{tag}"' in show and "libcuda" not in show, show
    # only OpenMP comes from the build machine (a CUDA wheel once took its NCCL too: 190 MB)
    assert [n.split("-")[0] for n, _ in wheel.grafted_libraries(real_wheel)] == ["libgomp"]
    home = tmp_path / "home"
    home.mkdir()
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    vbin = tmp_path / "venv" / "bin"
    bare = {"PATH": f"{vbin}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    for cc in ("cc", "gcc", "c++", "g++", "clang", "nvcc"):  # the system has compilers: hide them
        if shutil.which(cc, path=bare["PATH"]):
            bare["PATH"] = f"{vbin}:{_no_compiler_bin(tmp_path)}"
            break
    assert not any(shutil.which(cc, path=bare["PATH"]) for cc in ("cc", "gcc", "c++", "g++", "cmake"))

    def run(*a: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(a), cwd=home, env=bare, capture_output=True, text=True, timeout=timeout)

    inst = run(str(vbin / "python"), "-m", "pip", "install", "-q", "--no-index", str(real_wheel))
    assert inst.returncode == 0, inst.stderr
    where = run(
        str(vbin / "python"),
        "-c",
        "import ggml_bridge_server as g, sys; print(g.PACKAGE_DIR); "
        "print(any(n.startswith('ggml_bridge') and n != 'ggml_bridge_server' for n in sys.modules)); "
        "import importlib.util as u; print(u.find_spec('ggml_bridge'))",
    )
    assert where.returncode == 0, where.stderr
    pkg_line, _, no_toolkit = where.stdout.split("\n")[:3]
    pkg = Path(pkg_line)
    assert pkg.is_relative_to(tmp_path / "venv") and no_toolkit == "None", where.stdout
    build = json.loads((pkg / "build.json").read_text())
    assert build["ggml_native"] == "OFF" and build["ggml_backend_dl"] == "ON" and build["ggml_cuda_nccl"] == "OFF"
    variants = build["cpu_variants"]
    assert "x64" in variants and (
        os.environ.get("GGML_BRIDGE_TEST_WHEEL") or variants == list(wheel_plan.CI_CPU_VARIANTS)
    )
    assert sorted(p.name for p in (pkg / "bin").glob("libggml-cpu-*.so")) == sorted(
        f"libggml-cpu-{v}.so" for v in variants
    )

    problems = library_problems(pkg, (real_settings.cache_dir.resolve(), ROOT, Path("/work").resolve()))
    assert not problems, "\n".join(problems)

    version = run(str(vbin / "ggml-bridge-server"), "--version")
    assert version.returncode == 0 and "version:" in version.stdout + version.stderr, version
    # upstream's build and the series (not the commit count of a git repository around the build folder)
    assert re.search(
        r"\(build \d+, commit (b\d+|[0-9a-f]{9})\+bridge-[0-9a-f]{8}\)", version.stdout + version.stderr
    ), version

    gguf = model.ensure_model(Layout(tmp_path).models, "tiny", 1, Path(real_tree.path) / "models" / model.VOCAB_FILE)

    def greedy(label: str) -> tuple[str, str]:
        port = llama_server.free_port()
        log = tmp_path / f"server-{label}.log"
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [
                    str(vbin / "ggml-bridge-server"),
                    "-m",
                    str(gguf),
                    "--port",
                    str(port),
                    "-c",
                    "256",
                    "-t",
                    "2",
                    "--no-webui",
                ],
                cwd=home,
                env=bare,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        try:
            body = json.dumps(
                {"prompt": "The quick brown fox", "n_predict": 8, "temperature": 0, "seed": 1, "cache_prompt": False}
            ).encode()
            mapped: list[str] = []
            for _ in range(600):
                try:
                    req = urllib.request.Request(
                        f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}
                    )
                    with urllib.request.urlopen(req, timeout=60) as r:
                        out = json.loads(r.read())
                    # which CPU variant ggml loaded: the module mapped into the server (the script exec'd it)
                    maps = Path(f"/proc/{proc.pid}/maps").read_text()
                    mapped = sorted({line.split()[-1] for line in maps.splitlines() if "libggml-cpu-" in line})
                    break
                except OSError:
                    assert proc.poll() is None, log.read_text()[-3000:]
                    import time

                    time.sleep(0.2)
            else:
                raise AssertionError(f"llama-server did not answer: {log.read_text()[-3000:]}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        assert out["tokens_predicted"] == 8 and out["content"], out
        assert len(mapped) == 1 and Path(mapped[0]).parent == pkg / "bin", mapped
        return out["content"], Path(mapped[0]).name

    text, loaded = greedy("best")
    flags = Path("/proc/cpuinfo").read_text()
    if "haswell" in variants and all(f" {f}" in flags for f in ("avx2", "fma", "f16c", "bmi2")):
        assert loaded != "libggml-cpu-x64.so", "an AVX2 machine must get a better variant than the baseline"
    # the x86-64 baseline alone (what a CPU without AVX2 loads): remove every other variant from the install
    for other in (pkg / "bin").glob("libggml-cpu-*.so"):
        if other.name != "libggml-cpu-x64.so":
            other.unlink()
    text_x64, loaded = greedy("x64")
    assert loaded == "libggml-cpu-x64.so"
    assert text_x64 == greedy("x64-again")[0], "greedy decoding on one variant must repeat itself"


def _no_compiler_bin(tmp_path: Path) -> Path:
    """A PATH folder with the few programs the bare venv needs, and no compiler."""
    import shutil

    d = tmp_path / "bare-bin"
    d.mkdir(exist_ok=True)
    for tool in ("sh", "uname", "ldd", "ldconfig"):
        src = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if src and not (d / tool).exists():
            (d / tool).symlink_to(src)
    return d


@pytest.mark.slow
def test_real_cpu_wheel_installs_and_serve_uses_it(
    real_wheel: Path,
    real_tree,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """The real wheel in a fresh venv: $ORIGIN libraries, the embedded UI in its manifest, `serve --check` with
    no build present engages exactly as with a build. (Byte-identity with upstream is the CPU ladder's, on the
    source builds, and per CPU variant for the portable wheel: docs/wheel.md.)"""
    from ggml_bridge.experiments import model

    assert "+cpu-py3-none-manylinux" in real_wheel.name
    py = _fresh_venv(tmp_path / "venv")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(real_wheel)], check=True)
    info = json.loads(
        subprocess.run(
            [
                py,
                "-c",
                "import ggml_bridge_server as g, json; print(json.dumps({'bin': str(g.get_binary_path()), "
                "'m': g.get_manifest()}))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    server, m = Path(info["bin"]), info["m"]
    assert m["build"]["backend"] == "cpu" and m["build"]["ui_embedded"] is True
    assert m["ui"]["embedded"] and len(m["ui"]["sha256"]) == 64 and m["upstream"]["commit"] == real_tree.commit
    assert {"llama-server", "llama-perplexity", "test-batched-transfers"} <= set(m["build"]["programs"])
    # every library resolves inside the package ($ORIGIN/../lib), none from elsewhere
    ldd = subprocess.run(["ldd", str(server)], capture_output=True, text=True, check=True).stdout
    ours = [line.split("=>", 1) for line in ldd.splitlines() if "libllama" in line or "libggml" in line]
    # ldd prints the $ORIGIN path unresolved (bin/../lib/x.so): compare resolved locations
    libdir = (server.parent.parent / "lib").resolve()
    assert ours and all(len(p) == 2 and Path(p[1].split("(")[0].strip()).resolve().parent == libdir for p in ours), ldd

    vocab = Path(real_tree.path) / "models" / model.VOCAB_FILE
    gguf = model.ensure_model(tmp_path, "tiny", 1, vocab)
    env = {**os.environ, "GGML_BRIDGE_CACHE_DIR": str(tmp_path / "no-build"), "GGML_BRIDGE_BACKEND": "cpu"}
    check = subprocess.run(
        [
            py,
            "-m",
            "ggml_bridge",
            "serve",
            "--check",
            "--batched",
            "on",
            "--",
            "-m",
            str(gguf),
            "--port",
            str(llama_server.free_port()),
            "-c",
            "256",
            "-t",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"using llama-server of the installed ggml-bridge-server {m['build']['version']} wheel" in check.stderr
    assert "batched transfers" in check.stderr and "check passed" in check.stderr
