"""``ggml-bridge build --series-prefixes DIR``: every prefix of the series built in one CMake tree with the patched
variant's arguments (the series' switches from ggml_bridge/runtime/modes.py, tests on), the ctest labels a prefix registers
run, one row per prefix (real CMake + Ninja + cc on a small tree)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.distribution.builder import prefixes
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import BuildError, UsageError
from ggml_bridge.runtime import modes

from fixtures import fakellama

#: A tree that builds only with the series' switches and the tests on, and registers the ctest label ``batched``
#: once a patch has added its test program.
CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project("llama.cpp" C)
option(LLAMA_BUILD_TESTS "llama: build tests" OFF)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_subdirectory(ggml)
if (NOT LLAMA_BUILD_TESTS OR NOT GGML_CUDA_MAPPED_HOST_BRIDGE OR NOT SAM3D_BATCHED_TRANSFERS)
    message(FATAL_ERROR "fixture: a prefix is built with the tests and both switches on")
endif()
add_subdirectory(tools/server)
add_executable(llama-bench tools/bench.c)
enable_testing()
if (EXISTS ${CMAKE_SOURCE_DIR}/tests/batched.c)
    add_executable(test-batched-transfers tests/batched.c)
    add_test(NAME batched COMMAND test-batched-transfers)
    set_tests_properties(batched PROPERTIES LABELS batched)
endif()
"""


def _series(tree: Path, patches: Path) -> None:
    """Three patches on ``tree``'s one commit: 0001 edits a source, 0002 adds the batched test program, 0003 breaks
    llama-bench's compile."""
    fakellama.git(tree, "init", "-q", "-b", "main")
    fakellama.git(tree, "add", "-A")
    fakellama.git(tree, "commit", "-q", "-m", "upstream")
    steps = {
        "src/llama.cpp": "// patched\nint llama_version_number = 2;\n",
        "tests/batched.c": "int main(void) { return 0; }\n",
        "tools/bench.c": "int main(void) { return 0 }\n",
    }
    for rel, text in steps.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
        fakellama.git(tree, "add", rel)
        fakellama.git(tree, "commit", "-q", "-m", f"change {rel}")
    shutil.rmtree(patches)
    patches.mkdir()
    fakellama.git(tree, "format-patch", "-q", "-o", str(patches), "HEAD~3..HEAD")
    (patches / "series").write_text("".join(p.name + "\n" for p in sorted(patches.glob("*.patch"))))
    fakellama.git(tree, "checkout", "-q", "HEAD~3")


def test_every_prefix_builds_in_one_tree_and_runs_the_labels_it_registers(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "upstream"
    fakellama.write_tree(tree)
    (tree / "CMakeLists.txt").write_text(CMAKELISTS)
    (tree / "ggml" / "CMakeLists.txt").write_text("option(GGML_NATIVE x ON)\noption(SAM3D_BATCHED_TRANSFERS x OFF)\n")
    _series(tree, settings.patches_dir)
    monkeypatch.setenv("GGML_BRIDGE_PROJECT_DIR", str(settings.project_dir))
    monkeypatch.setenv("GGML_BRIDGE_BACKEND", "cpu")
    out = tmp_path / "prefixes"
    argv = ["--cache-dir", str(settings.cache_dir), "build", "--series-prefixes", str(out), "-j", "2"]
    rc = cli.main([*argv, "--source", str(tree), "--allow-unpinned"])
    std = capsys.readouterr()
    assert rc == BuildError.exit_code, std.err  # the third prefix does not compile: a row, and the exit status
    assert std.out.strip() == str(out / prefixes.REPORT)
    rows = (out / prefixes.REPORT).read_text().splitlines()[2:]
    assert len(rows) == 3, rows
    assert rows[0].startswith("| 1..1 (0001-") and rows[0].endswith("| llama-server llama-bench | - |")
    assert rows[1].endswith("| llama-server llama-bench test-batched-transfers | -L batched passed |"), rows[1]
    assert rows[2].endswith("| FAILED (build-3.log) | -L batched passed |"), rows[2]
    configured = (out / "configure-1.log").read_text()
    switches = " ".join(f"-D{k}={v}" for k, v in modes.VARIANTS[modes.PATCHED].cmake.items())
    assert switches in configured and "-DLLAMA_BUILD_TESTS=ON" in configured
    assert "error" in (out / "build-3.log").read_text()

    # again: the same upstream's work tree is taken back to its upstream commit, not made again
    (out / "tree" / "untracked.txt").write_text("left behind\n")
    report, done = prefixes.build_prefixes(settings, out, source_spec=str(tree), allow_unpinned=True)
    assert [p.ok for p in done] == [True, True, False] and report.read_text().splitlines()[2:] == [
        p.row() for p in done
    ]
    assert not (out / "tree" / "untracked.txt").exists()
    assert "making it again" not in capsys.readouterr().err


def test_series_prefixes_is_the_patched_variant_in_its_own_tree(
    settings: config.Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--cache-dir", str(settings.cache_dir), "build", "--series-prefixes", str(tmp_path / "p")]
    for extra in (["--shared-tree"], ["--variant", "upstream"], ["--print-manifest"]):
        assert cli.main([*base, *extra]) == UsageError.exit_code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
    assert not (tmp_path / "p").exists(), "refused before anything was made"
