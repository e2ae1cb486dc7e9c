"""-sm tensor as a mode of the toolkit: which shapes split (upstream's rules), the bench's tensor cases and their
all-reduce proof, the test-only no-peer baseline."""

from __future__ import annotations

import pytest

from ggml_bridge.experiments import model, tensor_split
from ggml_bridge.experiments.bench import proof as bench_proof
from ggml_bridge.experiments.bench.measure import device_args
from ggml_bridge.experiments.bench.suites import SUITES
from ggml_bridge.runtime import modes

INTERNAL_READY = "ggml_cuda_ar_pipeline_init: initialized AllReduce pipeline: 2 GPUs, 64 KB chunked kernel staging"
META = "llama_prepare_model_devices: creating a Meta device for tensor parallelism from {n} devices:"


def test_shares_round_down_to_the_granule_and_the_last_device_takes_the_rest() -> None:
    assert tensor_split.shares(12, 1, 4) == (3, 3, 3, 3)
    assert tensor_split.shares(8 * 128, 128, 3) == (256, 384, 384)  # 341 -> 256, 682 -> 640
    assert tensor_split.shares(32000, 1, 3) == (10666, 10667, 10667)
    assert sum(tensor_split.shares(5120, 640, 6)) == 5120


@pytest.mark.parametrize("n", tensor_split.TENSOR_DEVICE_COUNTS)
def test_the_tensor_shapes_split_evenly_over_2_3_4_and_6_devices(n: int) -> None:
    for name in ("tensor-small", "tensor-3k"):
        c = tensor_split.check(model.PRESETS[name], n)
        assert c.ok and len(set(c.kv_heads)) == 1 and len(set(c.ffn)) == 1, (name, n, c)
        assert sum(c.kv_heads) == model.PRESETS[name].n_head_kv


def test_why_the_small_shapes_do_not_run() -> None:
    small = tensor_split.check(model.PRESETS["small"], 2)
    assert not small.ok and "head size 32" in small.problems[0] and "unsupported mul_mat" in small.problems[0]
    assert tensor_split.check(model.PRESETS["small"], 2, cuda=False).ok, "the CPU's flash attention takes any size"
    one_b = tensor_split.check(model.PRESETS["bench-1b"], 6)
    assert not one_b.ok and "a device gets none" in one_b.problems[0]
    assert tensor_split.check(model.PRESETS["bench-2b-6l"], 4).ok  # the width the issue measured running
    uneven = tensor_split.check(model.PRESETS["bench-2b-6l"], 3)
    assert uneven.ok and any("KV heads per device 2/3/3" in n for n in uneven.notes)
    assert tensor_split.check(model.PRESETS["tensor-tiny"], 2, cuda=False).ok


def test_the_bench_splits_as_the_case_says_and_proves_the_all_reduce() -> None:
    suite = SUITES["tensor-virt"]
    assert suite.split_mode == "tensor" and suite.run_lengths == (1, 10) and suite.rounds >= 5
    for name in suite.cases:
        case = modes.MODES[name]
        assert case.split == "tensor" and device_args(suite, case)[:4] == ["-ngl", "99", "-sm", "tensor"]
    assert device_args(SUITES["layer-nopeer-virt"], modes.MODES["upstream-nopeer-virtual"])[3] == "layer"
    internal = modes.MODES["tensor-upstream-internal"]
    ok, what = bench_proof.engagement(internal, "\n".join([META.format(n=2), INTERNAL_READY]), virtual=True)
    assert ok and "internal on 2 devices" in what
    ok, what = bench_proof.engagement(internal, META.format(n=2), virtual=True)
    assert not ok, "internal asked, no pipeline line: not proved"
    ok, _ = bench_proof.engagement(modes.MODES["tensor-upstream"], META.format(n=4), virtual=True)
    assert ok, "the butterfly asked by none: no line expected, the Meta device over 4"
    ok, _ = bench_proof.engagement(modes.MODES["tensor-upstream"], "", virtual=True)
    assert not ok, "no Meta device: the case did not split by tensor"
    assert bench_proof.engagement(modes.MODES["upstream"], "") == (None, "")


def test_a_tensor_bridge_case_on_virtual_devices_is_measured_forced() -> None:
    """auto leaves virtual devices of one GPU to upstream's copies (and the butterfly): the bench measures the case
    forced there, as it does the layer split's bridge cases."""
    forced = modes.MODES[modes.FORCED_ON_VIRTUAL["tensor-bridge"]]
    auto = modes.MODES["tensor-bridge"]
    assert forced.bridge == "force" and (forced.split, forced.allreduce) == (auto.split, auto.allreduce)


def test_the_no_peer_baseline_is_test_only_and_said_so() -> None:
    v = modes.VARIANTS[modes.UPSTREAM_NOPEER_VIRTUAL]
    assert v.cmake == {"GGML_CUDA_NO_PEER_COPY": "ON"} and v.cuda_only and not v.patched
    for name in ("tensor-nopeer-virtual", "tensor-nopeer-virtual-aa", "upstream-nopeer-virtual"):
        m = modes.MODES[name]
        assert m.variant == v.name and not m.mechanisms
    assert modes.MODES["tensor-nopeer-virtual"].env() == modes.MODES["tensor-nopeer-virtual-aa"].env()


def test_serve_proves_the_all_reduce_path_of_a_tensor_split() -> None:
    from ggml_bridge.runtime import logparse
    from ggml_bridge.runtime.proof import Engagement, prove_allreduce, splits_by_tensor

    assert splits_by_tensor(["-m", "x", "-sm", "tensor"], {})
    assert splits_by_tensor(["--split-mode=tensor"], {}) and not splits_by_tensor(["-sm", "layer"], {})
    assert splits_by_tensor([], {"LLAMA_ARG_SPLIT_MODE": "tensor"})
    assert not splits_by_tensor(["-sm", "layer"], {"LLAMA_ARG_SPLIT_MODE": "tensor"}), "the argument wins"
    env = {"GGML_CUDA_DEVICES": "4", "GGML_CUDA_ALLREDUCE": "none"}
    eng = Engagement(logparse.parse([META.format(n=4)]))
    prove_allreduce(eng, env, verbose=True)
    assert eng.ok and "-sm tensor over 4 devices: all-reduce butterfly" in eng.notes[0]
    eng = Engagement(logparse.parse([META.format(n=2), INTERNAL_READY]))
    prove_allreduce(eng, {**env, "GGML_CUDA_ALLREDUCE": "none"}, verbose=True)
    assert not eng.ok and "started" in eng.errors[0], "none asked, the internal pipeline ran"
    eng = Engagement(logparse.parse([META.format(n=2), INTERNAL_READY]))
    prove_allreduce(eng, {"GGML_CUDA_DEVICES": "2"}, verbose=True)
    assert eng.ok and "all-reduce internal" in eng.notes[0], "unset on 2 virtual devices: internal"
    eng = Engagement(logparse.parse([]))
    prove_allreduce(eng, env, verbose=True)
    assert not eng.ok and "no Meta device" in eng.errors[0]
    eng = Engagement(logparse.parse([]))
    prove_allreduce(eng, env, verbose=False)
    assert eng.ok and "-lv 4" in eng.notes[0]
