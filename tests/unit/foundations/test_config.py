from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import UsageError


def _load(tmp_path: Path, env: dict[str, str] | None = None, **kw: object) -> config.Settings:
    return config.load(
        kw.pop("overrides", None),
        env={"HOME": str(tmp_path / "home"), **(env or {})},  # type: ignore[arg-type]
        cwd=tmp_path,
        **kw,
    )  # type: ignore[arg-type]


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    s = config.load(env={}, cwd=tmp_path)
    assert s.cache_dir == tmp_path / "home" / ".cache" / "ggml-bridge"
    assert (s.build.variant, s.build.backend, s.build.cuda_arch, s.build.jobs) == ("patched", "auto", "native", 0)
    assert s.fetch.sources == ["git", "archive", "pypi-sdist"]
    assert s.config_file is None
    assert s.pin_file.name == "pin.toml" and s.pin_file.is_file(), "falls back to the project this package is in"


def test_xdg_cache_home(tmp_path: Path) -> None:
    s = _load(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert s.cache_dir == tmp_path / "xdg" / "ggml-bridge"


def test_layers_defaults_file_env_cli(tmp_path: Path) -> None:
    (tmp_path / "ggml-bridge.toml").write_text(
        'cache_dir = "c-from-file"\n[build]\nbackend = "cuda"\njobs = 3\ncuda_arch = "86"\n'
        '[fetch]\nsources = ["pypi-sdist"]\n'
    )
    s = _load(tmp_path)
    assert s.config_file == tmp_path / "ggml-bridge.toml"
    assert s.cache_dir == tmp_path / "c-from-file", "relative paths resolve against the config file"
    assert (s.build.backend, s.build.jobs, s.build.cuda_arch) == ("cuda", 3, "86")
    assert s.fetch.sources == ["pypi-sdist"]
    s = _load(
        tmp_path,
        {"GGML_BRIDGE_BACKEND": "cpu", "GGML_BRIDGE_JOBS": "5", "GGML_BRIDGE_CACHE_DIR": str(tmp_path / "c-env")},
    )
    assert (s.build.backend, s.build.jobs, s.cache_dir) == ("cpu", 5, tmp_path / "c-env")
    assert s.build.cuda_arch == "86", "untouched file values survive"
    s = _load(tmp_path, {"GGML_BRIDGE_BACKEND": "cpu"}, overrides={"build.backend": "auto", "build.jobs": None})
    assert s.build.backend == "auto" and s.build.jobs == 3, "None overrides do not mask lower layers"


def test_explicit_config_path_and_env(tmp_path: Path) -> None:
    f = tmp_path / "elsewhere.toml"
    f.write_text('[build]\nvariant = "upstream"\n')
    assert _load(tmp_path, config_path=f).build.variant == "upstream"
    assert _load(tmp_path, {"GGML_BRIDGE_CONFIG": str(f)}).build.variant == "upstream"
    with pytest.raises(UsageError, match="not found"):
        _load(tmp_path, config_path=tmp_path / "missing.toml")


def test_pyproject_tool_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname="x"\n[tool.ggml-bridge.build]\njobs = 7\n')
    s = _load(tmp_path)
    assert s.build.jobs == 7 and s.config_file == tmp_path / "pyproject.toml"


@pytest.mark.parametrize(
    "text,match",
    [
        ("colour = 1\n", "unknown setting 'colour'"),
        ("[build]\nbackend_typo = 'cpu'\n", "unknown setting 'build.backend_typo'"),
        ("[nonsense]\nx = 1\n", "unknown setting 'nonsense'"),
        ("[build]\njobs = 'many'\n", "bad value"),
        ("[build]\nnative = 3\n", "bad value"),
        ("[build]\nbackend = 'rocm'\n", "unknown backend 'rocm'"),
        ("[build]\nvariant = 'fancy'\n", "unknown variant"),
        ("[build]\ncuda_arch = 'sm_90'\n", "invalid CUDA architecture"),
        ("[fetch]\nsources = ['ftp']\n", "unknown fetch source kind"),
        ("[build\n", "not valid TOML"),
    ],
)
def test_bad_config_is_a_usage_error(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "ggml-bridge.toml").write_text(text)
    with pytest.raises(UsageError, match=match) as e:
        _load(tmp_path)
    assert e.value.exit_code == 2


def test_bad_env_value(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="GGML_BRIDGE_JOBS"):
        _load(tmp_path, {"GGML_BRIDGE_JOBS": "lots"})


def test_stage_sections_are_read_and_unread_tables_are_errors(tmp_path: Path) -> None:
    (tmp_path / "ggml-bridge.toml").write_text('[serve]\nstartup_timeout = 30\n[rebase]\ncuda_include = ["inc"]\n')
    s = _load(tmp_path)
    assert s.serve.startup_timeout == 30.0 and s.rebase.cuda_include == [tmp_path / "inc"]
    assert _load(tmp_path, {"GGML_BRIDGE_SERVE_STARTUP_TIMEOUT": "45"}).serve.startup_timeout == 45.0
    (tmp_path / "ggml-bridge.toml").write_text('[serve]\nfoo = 1\n')
    with pytest.raises(UsageError, match=r"unknown setting 'serve.foo' in .*ggml-bridge.toml") as e:
        _load(tmp_path)
    assert e.value.exit_code == 2 and "startup_timeout" in str(e.value)
    for stage in ("ladder", "bench"):  # they read nothing from the file: even an empty table would mislead
        (tmp_path / "ggml-bridge.toml").write_text(f"[{stage}]\n")
        with pytest.raises(UsageError, match=rf"\[{stage}\] in .*ggml-bridge.toml is not a settings table") as e:
            _load(tmp_path)
        assert e.value.exit_code == 2 and f"ggml-bridge {stage} --help" in str(e.value)
    (tmp_path / "ggml-bridge.toml").write_text('[serve]\nstartup_timeout = 0\n')
    with pytest.raises(UsageError, match="timeouts must be positive"):
        _load(tmp_path)


@pytest.mark.parametrize(
    "env,origin",
    [
        ({"CMAKE_ARGS": "-DX='a b"}, "environment variable CMAKE_ARGS"),
        ({"GGML_BRIDGE_CONFIG": "c.toml"}, "'build.cmake_args' in"),
    ],
)
def test_unbalanced_quotes_in_cmake_args_are_a_usage_error(tmp_path: Path, env: dict[str, str], origin: str) -> None:
    (tmp_path / "c.toml").write_text("[build]\ncmake_args = \"-DY=\\\"oops\"\n")
    with pytest.raises(UsageError, match="unbalanced quotes") as e:
        _load(tmp_path, env)
    assert origin in str(e.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(UsageError, match="finite"):
        _load(tmp_path, {"GGML_BRIDGE_CONNECT_TIMEOUT": value})


def test_empty_cache_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="empty path for 'cache_dir' in option --cache-dir"):
        _load(tmp_path, overrides={"cache_dir": ""})
    (tmp_path / "ggml-bridge.toml").write_text('cache_dir = " "\n')
    with pytest.raises(UsageError, match="empty path"):
        _load(tmp_path)


def test_cmake_args_env_is_shlex_split(tmp_path: Path) -> None:
    (tmp_path / "ggml-bridge.toml").write_text('[build]\ncmake_args = ["-DFROM_FILE=1"]\n')
    s = _load(tmp_path, {"CMAKE_ARGS": "-DGGML_AVX512=OFF -DX='a b'"})
    assert s.build.cmake_args == ["-DGGML_AVX512=OFF", "-DX=a b", "-DFROM_FILE=1"]


def test_cuda_arch_list_and_bool_env(tmp_path: Path) -> None:
    s = _load(tmp_path, {"GGML_BRIDGE_CUDA_ARCH": "86,90", "GGML_BRIDGE_NATIVE": "off"})
    assert s.build.cuda_arch == "86;90" and s.build.native is False


def test_fields_have_docstrings() -> None:
    import inspect

    for cls in (config.Settings, config.FetchSettings, config.BuildSettings):
        src = inspect.getsource(cls)
        for f in config.dataclasses.fields(cls):
            after = src.split(f"    {f.name}:", 1)[1].split("\n", 2)[1]
            assert after.strip().startswith('"""'), f"{cls.__name__}.{f.name} has no docstring"


def test_source_kinds_are_one_table() -> None:
    """pin.toml's source kinds, the fetch.sources setting and fetch's fetchers all come from pin.SOURCE_KINDS."""
    from ggml_bridge.upstream import pin
    from ggml_bridge.upstream.fetch.pinned import PINNED_FETCHERS

    assert set(PINNED_FETCHERS) == set(pin.SOURCE_KINDS)
    assert config.load({}, env={}).fetch.sources == list(pin.SOURCE_KINDS)
    with pytest.raises(UsageError, match="fetch source kind"):
        config.load({"fetch.sources": ["git", "svn"]}, env={})


def test_a_relative_xdg_cache_home_is_ignored(tmp_path: Path) -> None:
    """The XDG base directory specification: a relative XDG_CACHE_HOME is invalid and ignored (it put the cache
    in whatever folder the command ran in)."""
    assert config.default_cache_dir({"XDG_CACHE_HOME": "rel/cache"}) == Path.home() / ".cache" / "ggml-bridge"
    assert config.default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "ggml-bridge"
