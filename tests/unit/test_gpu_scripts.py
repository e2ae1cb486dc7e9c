"""scripts/gpu/steps.sh's ``prebuilt``: the builds carried to a lent machine (``PREBUILT=DIR``), unpacked and checked
before any comparison runs on them (fake executables; ``ldd`` stands in where a check reads it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("xz") is None, reason="needs bash, xz")

STEPS = REPO_ROOT / "scripts" / "gpu" / "steps.sh"


def _pack(tmp_path: Path, variants: dict[str, str]) -> Path:
    """DIR/builds.tar.xz with a folder per variant: an executable llama-bench printing its version (``text``) and
    manifest.json."""
    stage, carried = tmp_path / "stage", tmp_path / "carried"
    carried.mkdir()
    for v, text in variants.items():
        (stage / v).mkdir(parents=True)
        exe = stage / v / "llama-bench"
        exe.write_text(f"#!/bin/sh\necho 'version: {text}'\n")
        exe.chmod(0o755)
        (stage / v / "manifest.json").write_text(json.dumps({"variant": v}))
    with tarfile.open(carried / "builds.tar.xz", "w:xz") as tar:
        for v in variants:
            tar.add(stage / v, arcname=v)
    return carried


def _run(tmp_path: Path, carried: Path, ldd: str = "") -> subprocess.CompletedProcess[str]:
    """``prebuilt DIR`` in a shell that sourced steps.sh; prints the variables it sets. ``ldd``: a fake ldd's
    output (else the real one, which finds no libraries in a script)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    path = "$PATH"
    if ldd:
        fake = tmp_path / "fakebin"
        fake.mkdir(exist_ok=True)
        (fake / "ldd").write_text(f"#!/bin/sh\ncat <<'EOF'\n{ldd}\nEOF\n")
        (fake / "ldd").chmod(0o755)
        path = f"{fake}:$PATH"
    script = (
        f'export PATH="{path}"; OUT={out}; BUDGET=100; STEPS=""; source {STEPS}; '
        f'prebuilt {carried}; rc=$?; echo "rc=$rc pbin=$pbin ubin=$ubin vbin=$vbin vocab=$vocab"'
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def test_three_variants_unpack_with_their_manifests(tmp_path: Path) -> None:
    carried = _pack(tmp_path, {"patched": "p", "upstream": "u", "upstream-nopeer-virtual": "v"})
    r = _run(tmp_path, carried)
    last = r.stdout.strip().splitlines()[-1]
    assert last == (
        f"rc=0 pbin={carried}/patched ubin={carried}/upstream vbin={carried}/upstream-nopeer-virtual "
        f"vocab={carried}/ggml-vocab-llama-spm.gguf"
    ), r.stdout + r.stderr
    manifests = sorted(p.name for p in (tmp_path / "out" / "manifests").iterdir())
    assert manifests == ["patched.json", "upstream-nopeer-virtual.json", "upstream.json"]
    assert "patched: version: p" in r.stdout and "upstream-nopeer-virtual: version: v" in r.stdout


def test_patched_alone_leaves_the_others_empty(tmp_path: Path) -> None:
    r = _run(tmp_path, _pack(tmp_path, {"patched": "p"}))
    assert " ubin= vbin= " in r.stdout.splitlines()[-1] and "rc=0" in r.stdout, r.stdout + r.stderr


def test_a_variant_of_an_earlier_archive_does_not_stand_in(tmp_path: Path) -> None:
    """The second archive lacks upstream: the folder the first one left must not pass for it."""
    carried = _pack(tmp_path, {"patched": "p", "upstream": "u"})
    assert "rc=0" in _run(tmp_path, carried).stdout
    (tmp_path / "second").mkdir()
    second = _pack(tmp_path / "second", {"patched": "p2"})
    shutil.copy(second / "builds.tar.xz", carried / "builds.tar.xz")
    r = _run(tmp_path, carried)
    assert f"rc=0 pbin={carried}/patched ubin= vbin= " in r.stdout.splitlines()[-1], r.stdout + r.stderr
    assert not (carried / "upstream").exists()


def test_no_patched_build_stops(tmp_path: Path) -> None:
    r = _run(tmp_path, _pack(tmp_path, {"upstream": "u"}))
    assert "rc=1" in r.stdout.splitlines()[-1]
    assert "no patched build in" in (tmp_path / "out" / "summary.txt").read_text()


def test_no_archive_stops(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run(tmp_path, empty)
    assert "rc=1" in r.stdout.splitlines()[-1]
    assert "cannot unpack" in (tmp_path / "out" / "summary.txt").read_text()


def test_a_variant_loading_another_folders_libggml_cuda_stops(tmp_path: Path) -> None:
    """A comparison of a build with itself proves nothing: each variant loads its own libggml-cuda or none."""
    carried = _pack(tmp_path, {"patched": "p", "upstream": "u"})
    r = _run(tmp_path, carried, ldd="\tlibggml-cuda.so.0 => /elsewhere/libggml-cuda.so.0 (0x0)")
    assert "rc=1" in r.stdout.splitlines()[-1]
    assert "loads libggml-cuda from '/elsewhere/libggml-cuda.so.0'" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.parametrize("fetch_ok", [True, False])
def test_pinned_vocab_is_the_fetched_trees_or_one_line(tmp_path: Path, fetch_ok: bool) -> None:
    """``pinned_vocab``, the one lookup of the pinned tree's vocabulary the GPU scripts share: the tree that
    ``ggml-bridge fetch`` prints, or a line on the log and status 1 (a fake python3 stands in for the CLI)."""
    fake, out = tmp_path / "fakebin", tmp_path / "out"
    fake.mkdir()
    out.mkdir()
    body = f'echo "{tmp_path}/tree"' if fetch_ok else "exit 3"
    (fake / "python3").write_text(f'#!/bin/sh\n[ "$3" = fetch ] || exit 9\n{body}\n')
    (fake / "python3").chmod(0o755)
    script = (
        f'export PATH="{fake}:$PATH"; OUT={out}; BUDGET=100; STEPS=""; source {STEPS}; '
        'vocab=; pinned_vocab; echo "rc=$? vocab=$vocab"'
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    last = r.stdout.strip().splitlines()[-1]
    if fetch_ok:
        assert last == f"rc=0 vocab={tmp_path}/tree/models/ggml-vocab-llama-spm.gguf", r.stdout + r.stderr
    else:
        assert last == "rc=1 vocab=" and "cannot locate the pinned tree" in (out / "summary.txt").read_text()
