"""The doctor's split-mode advice with simulated probes (tests/fixtures/probe/): -sm tensor's all-reduces against
-sm layer's boundaries over the links measured, the architecture check, virtual devices of one GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bridge.experiments import tensor_split
from ggml_bridge.experiments.doctor import cost, inventory, probe, recommend
from ggml_bridge.experiments.doctor.facts import Findings

from helpers import FIXTURES, doctor_findings

PROBES = FIXTURES / "probe"


def _findings(probe_file: Path, model: inventory.Model | None = None, env: dict[str, str] | None = None) -> Findings:
    return doctor_findings(probe.parse(probe_file.read_text()), model=model, env=env)


def _model(arch: str, hidden: int = 5120, layers: int | None = 40) -> inventory.Model:
    return inventory.Model(Path("/m.gguf"), 1 << 30, arch, hidden, layers)


def test_the_butterfly_steps_of_the_meta_backend() -> None:
    assert [cost.allreduce_steps(n) for n in (1, 2, 3, 4, 5, 6, 8)] == [0, 1, 3, 2, 4, 4, 3]


def test_all_reduces_cost_more_link_time_than_layer_boundaries() -> None:
    B, L = 25e9, 8e-6
    layer = cost.per_token_layer(5120, 2, B, L, "bridge")
    tensor = cost.per_token_tensor(5120, 40, 2, B, L, "bridge")
    assert tensor == pytest.approx(80 * (cost.t_bridge(4 * 5120, B, L) + cost.H_LAUNCH)) and tensor > 50 * layer
    assert cost.per_token_tensor(5120, 40, 2, B, L, "internal") < tensor, "BF16 halves the bytes, no event"
    # the bridge's all-reduce: the devices' reduce-scatter in one step, one tensor down and 2(N-1)/N up per card
    # (the butterfly: a round trip per step); the host's sums where asked: the tensor down and the last chunk's sum
    # up, or the host's additions where they are slower than the link
    assert cost.t_allreduce(1 << 20, 4, B, L, "bridge-allreduce") < cost.t_allreduce(1 << 20, 4, B, L, "bridge")
    assert cost.t_allreduce(1 << 20, 4, B, L, "bridge-allreduce") == pytest.approx(
        2 * L + cost.E_EVENT + 3 * cost.H_LAUNCH + 2.5 * (1 << 20) / B
    )
    assert cost.t_allreduce(1 << 20, 4, B, L, "bridge-allreduce-host") == pytest.approx(
        2 * L + cost.E_EVENT + 3 * cost.H_LAUNCH + 0.5 * (1 << 20) / B + 4 * (1 << 20) / cost.H_SUM
    )
    assert cost.t_allreduce(8 << 20, 4, 3e9, L, "bridge-allreduce-host") == pytest.approx(
        2 * L + cost.E_EVENT + 3 * cost.H_LAUNCH + (8 + 2) * (1 << 20) / 3e9  # a quarter: 2 MiB chunks
    )
    assert cost.t_allreduce(1 << 20, 4, B, L, "seq") == pytest.approx(
        2 * (cost.t_seq(1 << 20, B, L) + 3 * cost.H_LAUNCH)
    )


def test_two_gpus_get_the_per_token_comparison_and_the_break_even() -> None:
    f = _findings(PROBES / "mock-2gpu-ok.txt", model=_model("llama"))
    rec = recommend.recommend(f, None)
    adv = rec.split_mode
    assert adv is not None and adv.mode == "layer" and adv.supported is True
    assert set(adv.tensor_us) == {"bridge-allreduce", "bridge", "seq", "internal"} and adv.layer_us
    assert adv.tensor_us["bridge-allreduce"] <= adv.tensor_us["bridge"] < adv.tensor_us["seq"]  # equal on 2 cards
    best = min(adv.tensor_us.values())
    assert adv.break_even_us == pytest.approx((best - adv.layer_us) / 0.5)
    assert any("-sm tensor over 2 cards, per token (hidden 5120" in n and "break" not in n for n in rec.notes)
    assert "tensor" not in rec.argv, "the command keeps layer split"
    assert any("peer access" in n and "not modelled" in n for n in adv.notes), "this pair is advised peer access"


def test_three_gpus_have_no_internal_path_and_an_unsupported_architecture_is_said() -> None:
    f = _findings(PROBES / "mock-3gpu-corrupt-0-1-quick.txt", model=_model("mamba", layers=None))
    adv = recommend.recommend(f, None).split_mode
    assert adv is not None and adv.supported is False and "internal" not in adv.tensor_us
    assert set(adv.tensor_us) == {"bridge-allreduce", "bridge", "seq"}
    assert any("does not implement it for architecture mamba" in n for n in adv.notes)
    assert any("per token and layer" in n for n in adv.notes), "no layer count: the figures are per layer"
    assert "mamba" in tensor_split.UNSUPPORTED_ARCHITECTURES and "llama" not in tensor_split.UNSUPPORTED_ARCHITECTURES


def test_virtual_devices_of_one_gpu_keep_layer_split_with_the_measured_reason() -> None:
    f = _findings(PROBES / "mock-1gpu-4virtual-quick.txt", env={"GGML_CUDA_DEVICES": "4"})
    adv = recommend.recommend(f, None).split_mode
    assert adv is not None and adv.mode == "layer" and adv.layer_us is None and not adv.tensor_us
    assert "virtual devices of one GPU" in adv.notes[0]


def test_the_advice_is_in_the_report_and_its_json() -> None:
    import json

    from ggml_bridge.experiments.doctor import report

    f = _findings(PROBES / "mock-2gpu-ok.txt", model=_model("llama"))
    rec = recommend.recommend(f, None)
    text = report.render(f, rec)
    assert "-sm tensor over 2 cards, per token" in text
    doc = json.loads(report.dumps(f, rec))
    split = doc["recommendation"]["split_mode"]
    assert split["mode"] == "layer" and split["supported"] is True and split["break_even_us"] > 0
    assert set(split["tensor_us"]) == {"bridge-allreduce", "bridge", "seq", "internal"}
