from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.foundations import config, errors

from conftest import REPO_ROOT, FakeUpstream


@pytest.fixture
def cli_argv(cli_settings: config.Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """``cli.main`` run from an empty folder: the common leading argv."""
    monkeypatch.chdir(tmp_path)
    return ["--cache-dir", str(cli_settings.cache_dir)]


def test_fetch_prints_the_tree_path(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], upstream: FakeUpstream, settings: config.Settings
) -> None:
    assert cli.main([*cli_argv, "fetch"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(settings.layout.tree_src(upstream.commit))
    assert "==>" in out.err


def test_options_after_the_subcommand(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], settings: config.Settings
) -> None:
    assert cli.main(["fetch", *cli_argv, "-q"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(str(settings.cache_dir)) and out.err == ""


def test_patch_and_check(cli_argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*cli_argv, "patch", "--check"]) == 0
    assert "all patches apply" in capsys.readouterr().out
    assert cli.main([*cli_argv, "patch"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert (path / "src" / "extra.c").is_file()


def test_patch_check_failure_exit_code(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], settings: config.Settings, upstream: FakeUpstream
) -> None:
    import shutil

    shutil.copy(upstream.patches.conflicting, settings.patches_dir)
    with open(settings.patches_dir / "series", "a") as fh:
        fh.write(upstream.patches.conflicting.name + "\n")
    assert cli.main([*cli_argv, "patch", "--check"]) == errors.PatchError.exit_code
    assert "does NOT apply" in capsys.readouterr().out
    assert cli.main([*cli_argv, "patch"]) == errors.PatchError.exit_code
    err = capsys.readouterr().err
    assert f"patch error: patch {upstream.patches.conflicting.name} does not apply" in err


def test_build_prints_server_path_last(cli_argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*cli_argv, "build", "--jobs", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].endswith("/bin/llama-server") and Path(out[-1]).is_file()
    assert cli.main([*cli_argv, "build"]) == 0
    cap = capsys.readouterr()
    assert "up to date" in cap.err and cap.out.strip().splitlines()[-1] == out[-1]


def test_build_a_variant_list_in_one_tree(cli_argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*cli_argv, "build", "--variant", "patched,upstream", "--shared-tree", "-j", "2"]) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == 2, "one llama-server path per variant, in the order given"
    assert out[0].endswith("/patched/bin/llama-server") and out[1].endswith("/upstream/bin/llama-server")
    run = [subprocess.run([p], capture_output=True, text=True, check=True).stdout for p in out]
    assert run == ["fake llama-server bridge=1\n", "fake llama-server bridge=0\n"]
    assert cli.main([*cli_argv, "build", "--variant", "upstream,nope"]) == errors.UsageError.exit_code
    capsys.readouterr()
    # what scripts ask instead of reading the cache: the manifests and binary folders of the latest builds
    assert cli.main([*cli_argv, "build", "--variant", "patched,upstream", "--print-bin-dir"]) == 0
    assert capsys.readouterr().out.split() == [str(Path(p).parent) for p in out]
    assert cli.main([*cli_argv, "build", "--variant", "patched,upstream", "--print-manifest"]) == 0
    manifests = [json.loads(Path(m).read_text()) for m in capsys.readouterr().out.split()]
    assert [m["variant"] for m in manifests] == ["patched", "upstream"]
    assert (
        cli.main([*cli_argv, "build", "--variant", "upstream-nopeer", "--print-manifest"])
        == errors.NotBuiltError.exit_code
    ), "nothing is built by --print-*"


@pytest.mark.parametrize(
    "argv,code,text",
    [
        (["build", "--backend", "rocm"], 2, "unknown backend 'rocm'"),
        (["build", "--variant", "shiny"], 2, "unknown variant 'shiny'"),
        (["build", "--cuda-arch", "sm90"], 2, "invalid CUDA architecture"),
        (["fetch", "--source", "/no/such/dir"], 12, "does not exist"),
        (["fetch", "--bogus"], 2, "unrecognized arguments"),
    ],
)
def test_bad_input_exit_codes(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], argv: list[str], code: int, text: str
) -> None:
    assert cli.main([*cli_argv, *argv]) == code
    assert text in capsys.readouterr().err


def test_missing_compiler_exit_code(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert cli.main([*cli_argv, "build"]) == errors.ToolchainError.exit_code
    err = capsys.readouterr().err
    assert "toolchain error" in err and "CXX" in err


def test_unknown_config_key(cli_argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ggml-bridge.toml").write_text("[build]\nbakend = 'cpu'\n")
    assert cli.main([*cli_argv, "fetch"]) == 2
    assert "unknown setting 'build.bakend'" in capsys.readouterr().err


def test_no_command_shows_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "fetch" in capsys.readouterr().err


def test_stage_module_missing_errors_cleanly(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        cli.COMMANDS, "nosuchstage", cli.Command("nosuchstage", "a stage nobody wrote", *cli.stage("nosuchstage"))
    )
    assert cli.main([*cli_argv, "nosuchstage", "--anything"]) == 2
    err = capsys.readouterr().err
    assert "nosuchstage subcommand is not available" in err and "ggml_bridge.commands.nosuchstage" in err


def test_stage_module_is_imported_lazily_and_delegated(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, settings: config.Settings
) -> None:
    seen: dict[str, object] = {}
    mod = types.ModuleType("ggml_bridge.commands.fakestage")

    def add_arguments(parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--model")
        parser.add_argument("--backend")

    def run(args, s):  # type: ignore[no-untyped-def]
        seen.update(model=args.model, backend=args.backend, cache=s.cache_dir)
        return 7

    mod.add_arguments, mod.run = add_arguments, run  # type: ignore[attr-defined]
    monkeypatch.setitem(cli.COMMANDS, "fakestage", cli.Command("fakestage", "test stage", *cli.stage("fakestage")))
    monkeypatch.setitem(sys.modules, "ggml_bridge.commands.fakestage", mod)
    assert cli.main([*cli_argv, "fakestage", "--model", "m.gguf", "--backend", "cpu"]) == 7
    assert seen == {"model": "m.gguf", "backend": "cpu", "cache": settings.cache_dir}


def test_every_command_parses_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    """One registry: each command's -h comes from its own parser (stage modules included), and only a
    passthrough command collects unknown arguments."""
    assert list(cli.COMMANDS) == [
        "fetch",
        "patch",
        "build",
        "sdist",
        "wheel",
        "serve",
        "ladder",
        "rebase",
        "bench",
        "shape",
        "model",
        "doctor",
        "paper-model",
    ]
    for name in ("build", "rebase"):
        assert cli.main([name, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: ggml-bridge {name}") and "--cache-dir" in out
        assert ("--shared-tree" in out) == (name == "build") and ("--onto" in out) == (name == "rebase")
    assert cli.main(["fetch", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    ns = cli.parse_command(cli.COMMANDS["serve"], ["--bridge", "force", "-m", "x.gguf", "--", "--check", "-c", "8"])
    assert ns.bridge == "force" and ns.server_args == ("-m", "x.gguf", "--check", "-c", "8")


def test_stage_module_without_interface(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cli.COMMANDS, "halfstage", cli.Command("halfstage", "x", *cli.stage("halfstage")))
    monkeypatch.setitem(
        sys.modules, "ggml_bridge.commands.halfstage", types.ModuleType("ggml_bridge.commands.halfstage")
    )
    assert cli.main([*cli_argv, "halfstage"]) == 2
    assert "does not define add_arguments, run" in capsys.readouterr().err


def test_stage_modules_are_not_imported_at_startup() -> None:
    code = (
        "import sys; from ggml_bridge import cli; cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[-1] in cli.COMMANDS and m != 'ggml_bridge.cli'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_console_script_entry_point() -> None:
    import tomllib

    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["ggml-bridge"] == "ggml_bridge.cli:main"
    markers = " ".join(data["tool"]["pytest"]["ini_options"]["markers"])
    assert "slow:" in markers and "gpu:" in markers
    assert "--strict-markers" in data["tool"]["pytest"]["ini_options"]["addopts"]


def test_python_m_runs_main() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ggml_bridge", "--version"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.startswith("ggml-bridge ")


@pytest.mark.parametrize("argv", [["serve", "--help"], ["fetch"], ["build"], ["bench", "--help"]])
def test_unbalanced_cmake_args_is_a_usage_error_for_every_command(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setenv("CMAKE_ARGS", '-DFOO="bar')
    assert cli.main([*cli_argv, *argv]) == 2
    err = capsys.readouterr().err
    assert "usage error" in err and "CMAKE_ARGS" in err and "unbalanced quotes" in err and "Traceback" not in err


def test_up_to_date_build_on_a_read_only_cache(
    cli_argv: list[str], capsys: pytest.CaptureFixture[str], settings: config.Settings
) -> None:
    assert cli.main([*cli_argv, "build"]) == 0
    capsys.readouterr()
    # Tests run as root, whom permissions do not stop: a directory squatting the pointer's temporary name makes
    # its write fail with an OSError just as a read-only file system does.
    import os

    latest = settings.layout.latest("patched", "cpu")
    latest.with_name(f"{latest.name}.{os.getpid()}.tmp").mkdir()
    assert cli.main([*cli_argv, "build"]) == errors.CacheError.exit_code
    err = capsys.readouterr().err
    assert "up to date" in err and "cache error: cannot write" in err and "latest-patched-cpu.json" in err
    assert "GGML_BRIDGE_CACHE_DIR" in err


def test_edited_work_tree_stops_patch_and_build(cli_argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*cli_argv, "patch"]) == 0
    work = Path(capsys.readouterr().out.strip())
    (work / "notes.txt").write_text("keep me\n")
    for cmd in ("patch", "build"):
        assert cli.main([*cli_argv, cmd]) == errors.WorkTreeModified.exit_code
        err = capsys.readouterr().err
        assert "work tree modified" in err and "notes.txt" in err and "--discard-changes" in err
    assert (work / "notes.txt").is_file()
    assert cli.main([*cli_argv, "patch", "--discard-changes"]) == 0
    assert not (work / "notes.txt").exists()


# --------------------------------------------------------------------------------------------- exit codes


def test_readme_exit_table_is_generated_from_errors() -> None:
    """README's table is `python -m ggml_bridge.foundations.errors --markdown`; fix with `--update README.md`."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start, end = errors.readme_section(text)
    assert text[start:end] == errors.markdown_table(), (
        "run: python -m ggml_bridge.foundations.errors --update README.md"
    )


def test_update_readme_rewrites_only_the_table(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Exit codes\n\n| code | meaning |\n|---|---|\n| 0 | old |\n\n## Next\n\ntext\n")
    assert errors.update_readme(readme) is True
    text = readme.read_text()
    assert text.startswith("# x\n\n## Exit codes\n\n| code | class | meaning |") and text.endswith(
        "\n\n## Next\n\ntext\n"
    )
    assert "| 51 | `DirtyProjectError` |" in text and "| 14 | `UnknownRefError` |" in text
    assert errors.update_readme(readme) is False


def test_help_epilog_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    assert errors.epilog() in out
    for row in errors.exit_table():
        assert f" {row.code} {row.label}" in out


def test_every_error_class_and_exit_code_lives_in_errors() -> None:
    """No FatalError subclass or exit_code outside errors.py; each class has a meaning for the table."""
    import ast

    pkg = REPO_ROOT / "ggml_bridge"
    for py in pkg.rglob("*.py"):
        if py.name == "errors.py" and py.parent == pkg / "foundations":
            continue
        for node in ast.walk(ast.parse(py.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert not bases & ({c.__name__ for c in errors.error_classes()} | {"FatalError"}), (
                    f"{py.relative_to(REPO_ROOT)}: class {node.name} belongs in errors.py"
                )
            if isinstance(node, ast.Assign):
                names = {getattr(t, "id", getattr(t, "attr", "")) for t in node.targets}
                assert "exit_code" not in names, (
                    f"{py.relative_to(REPO_ROOT)}:{node.lineno}: exit code outside errors.py"
                )
    for cls in errors.error_classes():
        assert cls.meaning, f"{cls.__name__} has no meaning for the exit-code table"
    codes = [r.code for r in errors.exit_table()]
    assert len(codes) == len(set(codes)) and {"0", "1", "14", "51", "52", "128+N"} <= set(codes)


def test_settings_sections_reach_the_stages(
    cli_argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: config.Settings
) -> None:
    """[serve] startup_timeout and [rebase] cuda_include from the config file are what the stages get; options win
    (serve) or add (rebase)."""
    import importlib

    (tmp_path / "ggml-bridge.toml").write_text('[serve]\nstartup_timeout = 12.5\n[rebase]\ncuda_include = ["cfg"]\n')
    s = config.load({}, cwd=tmp_path)
    serve_cmd = cli.COMMANDS["serve"]
    assert cli.parse_command(serve_cmd, ["-m", "x"], settings=s).startup_timeout == 12.5
    assert cli.parse_command(serve_cmd, ["--startup-timeout", "3", "-m", "x"], settings=s).startup_timeout == 3.0
    assert cli.parse_command(serve_cmd, []).startup_timeout == config.ServeSettings().startup_timeout
    job = importlib.import_module("ggml_bridge.upstream.rebase.job")
    seen = []
    monkeypatch.setattr(job, "rebase", lambda st, onto, opts: seen.append(opts) or job.RebaseReport(onto))
    assert cli.main([*cli_argv, "rebase", "--onto", "b2", "--check", "--cuda-include", "opt"]) == 0
    assert seen[0].cuda_include == [tmp_path / "cfg", Path("opt")]


def test_each_exit_code_is_used_by_one_error_class() -> None:
    """An exit status names one way of failing: no two FatalError classes share a code (2 was UsageError's,
    LadderSetupError's and ModelError's), and none reuses a result status (0, 1, 52)."""
    codes: dict[int, list[str]] = {}
    for cls in errors.error_classes():
        codes.setdefault(cls.exit_code, []).append(cls.__name__)
    assert {c: n for c, n in codes.items() if len(n) > 1} == {}
    assert not set(codes) & {errors.EXIT_OK, errors.EXIT_DIFFER, errors.EXIT_RADAR_INCOMPLETE}
