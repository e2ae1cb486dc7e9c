"""The web UI stage: keyed cache, no npm -> one clear error or an explicit opt-out, placement, embed check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggml_bridge import cli
from ggml_bridge.distribution import ui
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import BuildError, ToolchainError, UsageError


def make_ui_tree(root: Path) -> Path:
    src = root / "src"
    u = src / "tools" / "ui"
    (u / "src").mkdir(parents=True)
    (u / "CMakeLists.txt").write_text("set(TARGET llama-ui)\n")
    (u / "package.json").write_text('{"name": "llama-ui"}\n')
    (u / "package-lock.json").write_text('{"lockfileVersion": 3}\n')
    (u / "src" / "app.ts").write_text("export const x = 1;\n")
    return src


def fake_dist(path: Path, text: str = "<html>ui</html>") -> Path:
    path.mkdir(parents=True)
    (path / "index.html").write_text(text)
    (path / "bundle.js").write_text("console.log(1)")
    return path


def seed_cache(settings: config.Settings, tree: Path, text: str = "<html>ui</html>") -> str:
    """A cache entry as ui._build leaves it."""
    key = ui.source_key(tree)
    entry = settings.layout.ui_entry(key)
    dist = fake_dist(entry / "dist", text)
    sha, n = ui.dist_sha256(dist)
    (entry / ui.DONE).write_text(json.dumps({"key": key, "sha256": sha, "files": n, "source": "test"}))
    return sha


def test_key_follows_lockfile_and_sources_not_outputs(tmp_path: Path) -> None:
    tree = make_ui_tree(tmp_path)
    k0 = ui.source_key(tree)
    fake_dist(tree / "tools" / "ui" / "dist")
    (tree / "tools" / "ui" / "node_modules").mkdir()
    (tree / "tools" / "ui" / "node_modules" / "x.js").write_text("x")
    assert ui.source_key(tree) == k0, "outputs and node_modules are not sources"
    (tree / "tools" / "ui" / "package-lock.json").write_text('{"lockfileVersion": 3, "x": 1}\n')
    k1 = ui.source_key(tree)
    assert k1 != k0
    (tree / "tools" / "ui" / "src" / "app.ts").write_text("export const x = 2;\n")
    assert ui.source_key(tree) not in (k0, k1)


def test_no_npm_is_one_clear_error(settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_ui_tree(tmp_path)
    monkeypatch.setattr(ui.shutil, "which", lambda name: None)
    with pytest.raises(ToolchainError) as e:
        ui.ensure(settings, tree)
    msg = str(e.value)
    assert "npm was not found" in msg and "apt-get install nodejs npm" in msg and "--no-ui" in msg


def test_cached_ui_needs_no_npm(settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_ui_tree(tmp_path)
    sha = seed_cache(settings, tree)
    monkeypatch.setattr(ui.shutil, "which", lambda name: None)
    got = ui.ensure(settings, tree)
    assert got.dist is not None and got.sha256 == sha and got.files == 2
    m = got.manifest()
    assert m["embedded"] and m["sha256"] == sha and m["key"] == ui.source_key(tree)


def test_tampered_cache_is_not_used(settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = make_ui_tree(tmp_path)
    seed_cache(settings, tree)
    entry = settings.layout.ui_entry(ui.source_key(tree))
    (entry / "dist" / "index.html").write_text("<html>changed</html>")
    monkeypatch.setattr(ui.shutil, "which", lambda name: None)
    with pytest.raises(ToolchainError):
        ui.ensure(settings, tree)


def test_opt_out_warns_once_and_records_no_ui(
    make_settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = make_settings(build__ui=False)
    tree = make_ui_tree(tmp_path)
    got = ui.ensure(settings, tree)
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "warning" in line] == [
        line for line in err.splitlines() if "WITHOUT its web UI" in line
    ], err
    assert err.count("warning") == 1
    assert got.manifest() == {"embedded": False, "reason": "disabled by the user (ui = false)"}


def test_opt_out_from_cli_config_and_environment(tmp_path: Path) -> None:
    build = cli.COMMANDS["build"]
    args = cli.parse_namespace(build, ["--no-ui"])
    assert build.overrides is not None and config.load(build.overrides(args), env={}, cwd=tmp_path).build.ui is False
    assert config.load({}, env={"GGML_BRIDGE_UI": "0"}, cwd=tmp_path).build.ui is False
    (tmp_path / "ggml-bridge.toml").write_text("[build]\nui = false\n")
    assert config.load({}, env={}, cwd=tmp_path).build.ui is False
    assert config.load({}, env={}, cwd=tmp_path / "..").build.ui is True


def test_tree_without_tools_ui_is_left_alone(settings: config.Settings, tmp_path: Path) -> None:
    got = ui.ensure(settings, tmp_path)
    assert not got.managed
    with ui.placed(settings, tmp_path, got):
        pass
    ui.check_embedded(tmp_path / "build", got)  # no header, nothing to check


def test_placed_puts_the_ui_where_upstream_embeds_it_then_removes_it(
    make_settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    settings = make_settings(cache_dir=str(tmp_path / "cache"))
    tree = make_ui_tree(settings.layout.work_tree("x"))
    sha = seed_cache(settings, tree)
    got = ui.ensure(settings, tree)
    target = tree / "tools" / "ui" / "dist"
    fake_dist(target, "<html>left by an interrupted build</html>")
    with ui.placed(settings, tree, got):
        assert ui.dist_sha256(target)[0] == sha
    assert not target.exists(), "the cached tree is left as it was"


def test_placed_refuses_to_replace_a_users_dist(settings: config.Settings, tmp_path: Path) -> None:
    tree = make_ui_tree(tmp_path / "mine")
    seed_cache(settings, tree)
    got = ui.ensure(settings, tree)
    fake_dist(tree / "tools" / "ui" / "dist", "<html>mine</html>")
    with pytest.raises(UsageError, match="already has"):
        with ui.placed(settings, tree, got):
            pass
    assert (tree / "tools" / "ui" / "dist" / "index.html").read_text() == "<html>mine</html>"


@pytest.mark.parametrize(
    "has_assets, wanted, ok", [(True, True, True), (False, True, False), (False, False, True), (True, False, False)]
)
def test_check_embedded_reads_the_generated_header(tmp_path: Path, has_assets: bool, wanted: bool, ok: bool) -> None:
    hdr = tmp_path / "build" / "tools" / "ui" / "ui.h"
    hdr.parent.mkdir(parents=True)
    hdr.write_text("#define LLAMA_UI_HAS_ASSETS 1\n" if has_assets else "/* #undef LLAMA_UI_HAS_ASSETS */\n")
    assets = ui.UiAssets("k", tmp_path / "dist", "s") if wanted else ui.UiAssets(None, None, reason="off")
    if ok:
        ui.check_embedded(tmp_path / "build", assets)
    else:
        with pytest.raises(BuildError):
            ui.check_embedded(tmp_path / "build", assets)


def test_old_node_is_refused_with_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, ok in (
        ("v18.20.4", False),
        ("v20.18.1", False),
        ("v20.19.0", True),
        ("v21.7.0", False),
        ("v22.11.0", False),
        ("v22.12.0", True),
        ("v24.1.0", True),
    ):
        monkeypatch.setattr(ui, "_tool_version", lambda cmd, v=version: v)
        if ok:
            ui._check_node()
        else:
            with pytest.raises(ToolchainError, match="--no-ui"):
                ui._check_node()


def test_builds_never_download_nor_run_npm_in_cmake(settings: config.Settings, tmp_path: Path) -> None:
    """Upstream defaults LLAMA_USE_PREBUILT_UI=ON (a download of whatever the bucket holds, 'latest' as fallback):
    the build turns both provisioning paths of its CMake off."""
    from ggml_bridge.distribution.builder import plan, toolchain
    from ggml_bridge.runtime import modes

    src = tmp_path / "tree"
    src.mkdir()
    (src / "CMakeLists.txt").write_text('option(LLAMA_BUILD_UI "" OFF)\noption(LLAMA_USE_PREBUILT_UI "" ON)\n')
    tools = toolchain.find_toolchain()
    args = plan.cmake_args(settings, src, modes.variant("patched"), "cpu", tools)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in args and "-DLLAMA_BUILD_UI=OFF" in args


def test_an_interrupted_npm_leaves_no_work_folder(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during `npm ci` left <cache>/ui/<key>.work behind (700 MB with node_modules)."""
    tree = make_ui_tree(tmp_path)
    monkeypatch.setattr(ui.shutil, "which", lambda name: "/usr/bin/npm")
    monkeypatch.setattr(ui, "_check_node", lambda: None)
    monkeypatch.setattr(ui, "_tool_version", lambda cmd: "v20.19.0")

    def interrupted(argv, **kw):  # type: ignore[no-untyped-def]
        (Path(kw["cwd"]) / "node_modules").mkdir()
        (Path(kw["cwd"]) / "node_modules" / "big").write_bytes(b"\0" * 1000)
        raise KeyboardInterrupt

    monkeypatch.setattr(ui, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ui.ensure(settings, tree)
    assert not list(settings.layout.ui.glob("*.work"))
