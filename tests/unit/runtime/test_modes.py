"""The one table of selectors, variants and modes, and what ladder, bench, serve and build derive from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.distribution.builder import shared
from ggml_bridge.experiments.bench import orchestrate, suites
from ggml_bridge.experiments.ladder import schema, sides
from ggml_bridge.foundations.errors import BenchError, LadderSetupError, UsageError
from ggml_bridge.runtime import modes, proof, serve
from ggml_bridge.upstream import patch as patchmod

from helpers import REPO_ROOT


def test_mode_environments_say_what_their_names_say():
    env = {n: m.env() for n, m in modes.MODES.items()}
    assert env["upstream"] == {} and env["rpc-upstream"] == {}
    assert env["upstream-p2p"] == {"GGML_CUDA_P2P": "1"}
    assert env["off"] == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "0", "LLAMA_BATCHED_TRANSFERS": "0"}
    assert env["bridge"]["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "auto"
    assert env["bridge-force"] == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "force", "LLAMA_BATCHED_TRANSFERS": "0"}
    assert env["bridge-force-p2p"] == {**env["bridge-force"], "GGML_CUDA_P2P": "1"}
    assert env["bridge-batched"] == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "auto", "LLAMA_BATCHED_TRANSFERS": "1"}
    assert env["bridge-force-batched"] == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "force", "LLAMA_BATCHED_TRANSFERS": "1"}
    assert env["bridge-typo"]["GGML_CUDA_MAPPED_HOST_BRIDGE"] == "yes"
    assert not any(k.endswith("_STATS") for m in modes.MODES.values() for k in m.env())
    assert not any(k.startswith("GGML_CUDA_MAPPED_HOST_BRIDGE_") for m in modes.MODES.values() for k in m.env())
    for name, m in modes.MODES.items():
        base = name.removeprefix("tensor-")
        assert ("-p2p" in name) == m.p2p == ("GGML_CUDA_P2P" in env[name]), name
        assert name.startswith("rpc-") == m.rpc, name
        assert ("bridge" in m.mechanisms) == (base.startswith(("bridge", "rpc-bridge")) and name != "bridge-typo")
        assert ("batched" in m.mechanisms) == name.endswith("batched"), name
        assert m.variant in modes.VARIANTS
        # the tensor modes name their split and all-reduce: -internal sets internal, the others the butterfly
        assert (m.split == "tensor") == name.startswith("tensor-"), name
        if m.split == "tensor":
            want = "internal" if "-internal" in name else "bridge" if "allreduce-bridge" in name else "none"
            want = "butterfly" if name.endswith("-butterfly") else want
            assert env[name]["GGML_CUDA_ALLREDUCE"] == want, name
            assert ("GGML_CUDA_AR_BF16_THRESHOLD" in env[name]) == name.endswith("-f32"), name
        assert ("nopeer-virtual" in name) == (m.variant == "upstream-nopeer-virtual"), name


def test_old_names_are_accepted_with_a_note_and_both_is_refused(capsys):
    assert modes.lookup("p2p").name == "upstream-p2p"
    assert modes.lookup("rpc-staged").name == "rpc-upstream"
    assert "deprecated" in capsys.readouterr().err
    with pytest.raises(UsageError) as e:
        modes.lookup("both")
    assert "bridge-force-batched" in e.value.fix and "bridge-batched" in e.value.fix
    with pytest.raises(UsageError, match="unknown mode"):
        modes.lookup("bridgee")


def test_ladder_files_use_current_names(tmp_path: Path):
    root = REPO_ROOT / "ladders"
    for f in root.glob("*.toml"):
        for r in schema.load_ladder(f).rungs:
            assert {sides.run_parts(m)[1] for m in r.modes} <= set(modes.MODES), (f, r.modes)
    old = tmp_path / "old.toml"
    old.write_text(
        '[[rung]]\nname = "x"\nshape = "tiny"\nmodes = ["staged", "off"]\nreference = "off"\n'
        'expect = { staged = "either" }\n'
    )
    r = schema.load_ladder(old).rungs[0]
    assert r.modes == ["upstream", "off"] and r.expect == {"upstream": "either"}
    old.write_text('[[rung]]\nname = "x"\nshape = "tiny"\nmodes = ["off", "both"]\n')
    with pytest.raises(LadderSetupError, match="no longer accepted"):
        schema.load_ladder(old)
    old.write_text('[[rung]]\nname = "x"\nshape = "tiny"\nmodes = ["off", "upstream-nopeer"]\n')
    with pytest.raises(LadderSetupError, match="upstream-nopeer build"):
        schema.load_ladder(old)


def test_bench_serve_and_build_derive_from_the_table():
    assert orchestrate.CASES is modes.MODES
    for suite in suites.SUITES.values():
        assert set(suite.cases) <= set(modes.MODES)
    assert proof.BRIDGE_VAR == modes.BRIDGE and not hasattr(serve, "selector_env")
    assert dict(modes.VARIANTS["patched"].cmake) == {
        "GGML_CUDA_MAPPED_HOST_BRIDGE": "ON",
        "SAM3D_BATCHED_TRANSFERS": "ON",
    }
    assert [n for n, v in modes.VARIANTS.items() if v.cuda_only] == ["upstream-nopeer", "upstream-nopeer-virtual"]
    # the test-only baseline: its own series folder, never the project's, never with it
    base = modes.VARIANTS["upstream-nopeer-virtual"]
    assert not base.patched and base.test_patches and "TEST-ONLY" in base.about
    series = patchmod.read_series(REPO_ROOT / "patches" / base.test_patches)
    assert len(series.patches) == 1 and "test-only" in series.patches[0].name
    assert shared.SHARED_ORDER == tuple(modes.VARIANTS), "the shared tree can make every variant, in table order"


def test_bench_refuses_ladder_only_modes(tmp_path, monkeypatch):
    from ggml_bridge import cli

    monkeypatch.setattr(orchestrate, "n_gpus", lambda: 0)
    for cases, msg in (("off,bridge-typo", "ladder checks"), ("off,both", "no longer accepted")):
        args = cli.parse_command(
            cli.COMMANDS["bench"], ["--suite", "cpu", "--cases", cases, "--report", str(tmp_path / "r")]
        )
        with pytest.raises(BenchError, match=msg):
            orchestrate.bench(args, None)


def test_a_table_of_named_rows_refuses_a_name_given_twice() -> None:
    from ggml_bridge.foundations.tables import by_name
    from ggml_bridge.runtime.modes import VARIANTS

    v = VARIANTS["patched"]
    assert list(by_name(*VARIANTS.values())) == list(VARIANTS)
    with pytest.raises(ValueError, match="two rows are named 'patched'"):
        by_name(v, v)


@pytest.mark.parametrize("value", ["0", "1", "auto", "force", "auto:0-1", "1:0-1,2-3"])
def test_the_bridge_values_the_build_takes_pass_serves_check(value: str) -> None:
    """E25: serve refuses a selector the build would ignore, and only that (patch 0001's grammar)."""
    modes.check_selector_env({modes.BRIDGE: value, modes.BATCHED: "1"}, modes.Selectors())


@pytest.mark.parametrize(
    "value", ["", "on", "auto:", "auto:0", "force:0-1", "auto:0-1,", "1:a-b", "auto:0-1 ", "auto:1-1", "1:0-16"]
)
def test_a_bridge_value_the_build_ignores_is_refused(value: str) -> None:
    with pytest.raises(UsageError, match="is not a value the build takes"):
        modes.check_selector_env({modes.BRIDGE: value}, modes.Selectors())
    modes.check_selector_env({modes.BRIDGE: value}, modes.Selectors(bridge="auto"))  # --bridge replaces it
