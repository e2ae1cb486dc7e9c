"""The mechanism record (ggml_bridge/runtime/mechanisms.py) and what derives from it: a derived pattern, table or rule that
disagrees with the record fails here, not first on a GPU."""

from __future__ import annotations

import argparse
import re

import pytest

from ggml_bridge.commands import serve as serve_cmd
from ggml_bridge.foundations.errors import UsageError
from ggml_bridge.runtime import engagement, logparse, mechanisms, modes
from ggml_bridge.runtime.mechanisms import ALLREDUCE, ALLREDUCE_PATHS, BATCHED, BRIDGE, MECHANISMS


def _enabled(value: str) -> str:
    return f"{BRIDGE.log_tag}: enabled (mode {value}), 4 slots x 64 MiB"


def test_every_value_that_asks_for_the_bridge_parses_as_its_mode() -> None:
    """logparse's enabled line takes exactly the values of the words that ask for the bridge (issue 47: it once
    hard-coded ``1|auto|force``): a new asking word in the record parses, a value no word asks for does not."""
    assert BRIDGE.asked_values == ("1", "auto", "force")
    for value in BRIDGE.asked_values:
        info = logparse.parse([_enabled(value)])
        assert info.bridge.enabled and info.bridge.mode == value
    for value in set(BRIDGE.words.values()) - set(BRIDGE.asked_values):
        assert not logparse.parse([_enabled(value)]).bridge.enabled, value
    assert not logparse.parse([_enabled("sometimes")]).bridge.enabled


def test_logparse_stats_metrics_and_tags_are_the_records() -> None:
    assert logparse.BRIDGE == BRIDGE.log_tag and logparse.BATCHED == BATCHED.log_tag
    assert logparse.BRIDGE_STATS_KEYS == BRIDGE.stats_keys and logparse.BATCHED_STATS_KEYS == BATCHED.stats_keys
    for record in mechanisms.SERIES:
        page = "\n".join(f"llamacpp:{name} {i + 1}" for i, name in enumerate(record.metric_names()))
        parsed = logparse.parse_metrics(page)
        assert list(parsed) == list(record.metric_names()), record.name
    assert logparse.parse_metrics("llamacpp:allreduce_calls_total 3") == {}, "the all-reduce exports no counters"
    stats = f"{BATCHED.log_tag}: stats: " + " ".join(f"{k}=1" for k in BATCHED.stats_keys)
    assert logparse.parse([stats]).batched.stats == [dict.fromkeys(BATCHED.stats_keys, 1)]
    bad = f'{BRIDGE.log_tag}: ignoring invalid {BRIDGE.selector}="yes"'
    assert logparse.parse([bad]).bridge.rejected == {BRIDGE.selector: "yes"}


def test_modes_serve_and_engagement_derive_their_words_and_work_from_the_record() -> None:
    assert modes.BRIDGE == BRIDGE.selector and modes.BATCHED == BATCHED.selector
    assert modes.ALLREDUCE == ALLREDUCE.selector
    assert modes.BRIDGE_VALUES == dict(BRIDGE.words) and modes.BATCHED_VALUES == dict(BATCHED.words)
    assert modes.BRIDGE_ASKS == BRIDGE.asks and modes.BATCHED_ASKS == BATCHED.asks
    for word in BRIDGE.words:
        assert modes.Selectors(bridge=word).asks_bridge == (word in BRIDGE.asks)
    parser = argparse.ArgumentParser()
    serve_cmd.add_arguments(parser)
    choices = {a.dest: set(a.choices or ()) for a in parser._actions if a.dest in ("bridge", "batched")}
    assert choices == {"bridge": set(BRIDGE.words), "batched": set(BATCHED.words)}
    for record in mechanisms.SERIES:
        for key in record.work_keys:
            assert engagement.did_work(record.name, {key: 1}), (record.name, key)
        idle = {k: 0 for k in record.stats_keys}
        assert not engagement.did_work(record.name, idle), record.name
    assert set(engagement.MECHANISMS) == {m.name for m in mechanisms.SERIES}
    assert set(MECHANISMS) == {"bridge", "batched", "allreduce"}


def test_the_all_reduce_words_and_their_path_rows() -> None:
    """Upstream's values and patch 0007's two (bridge, butterfly): each selects a path row (butterfly: the butterfly,
    as none does), and every mode's all-reduce is one of them."""
    assert set(ALLREDUCE.words) == {"nccl", "internal", "none", "bridge", "butterfly"}
    assert set(mechanisms.PATCHED_ALLREDUCE_VALUES) == {"bridge", "butterfly"}
    for m in modes.MODES.values():
        if m.allreduce is not None:
            assert m.allreduce in ALLREDUCE.words and m.split == "tensor", m.name
            if m.allreduce in mechanisms.PATCHED_ALLREDUCE_VALUES:
                assert modes.VARIANTS[m.variant].patched, m.name
    values = {p.selector_value for p in ALLREDUCE_PATHS.values() if p.available}
    assert values | {"butterfly"} == set(ALLREDUCE.words), "every value has its path row"
    assert ALLREDUCE_PATHS["bridge"].selector_value == "bridge"


@pytest.mark.parametrize(
    ("value", "n", "virtual", "want"),
    [
        ("internal", 2, True, "internal"),
        ("internal", 4, True, "butterfly"),
        ("none", 2, True, "butterfly"),
        (None, 2, True, "internal"),  # Linux default nccl: not compiled in / virtual devices -> internal
        (None, 3, False, "butterfly"),
        ("bogus", 2, True, "butterfly"),
    ],
)
def test_the_path_upstream_picks(value: str | None, n: int, virtual: bool, want: str) -> None:
    assert mechanisms.expected_allreduce(value, n, virtual) == want
    # the patched build with the bridge off takes the same path (patch 0007 needs the bridge or =bridge)
    assert mechanisms.expected_allreduce(value, n, virtual, bridge="0", patched=True) == want
    assert mechanisms.expected_allreduce("nccl", 2, False, nccl_built=True) == "nccl"
    assert mechanisms.expected_allreduce("nccl", 2, True, nccl_built=True) == "internal"


@pytest.mark.parametrize(
    ("value", "n", "bridge", "want"),
    [
        ("none", 4, "force", "bridge"),  # where upstream runs the butterfly, the forced bridge takes it
        ("internal", 4, "force", "bridge"),  # internal fails on 4: init_none, then the bridge's
        ("internal", 2, "force", "internal"),  # upstream's internal path stays
        ("bridge", 2, "0", "bridge"),  # asked: also on 2 devices, also with the bridge's selector 0
        ("butterfly", 4, "force", "butterfly"),  # kept
        ("none", 4, "auto", "butterfly"),  # virtual devices of one GPU: auto keeps upstream's copies
    ],
)
def test_the_path_the_patched_build_picks(value: str, n: int, bridge: str, want: str) -> None:
    assert mechanisms.expected_allreduce(value, n, True, bridge=bridge, patched=True) == want
    assert mechanisms.expected_allreduce("none", 4, False, bridge="auto", patched=True) == "bridge-or-butterfly"
    assert mechanisms.expected_allreduce("bridge", 4, True) == "butterfly", "upstream does not know the value"


# upstream b11434's lines, as ggml-cuda.cu and ggml-cuda/allreduce.cu print them
INTERNAL_READY = (
    "ggml_cuda_ar_pipeline_init: initialized AllReduce pipeline: 2 GPUs, 64 KB chunked kernel staging + "
    "32 MB copy-engine staging per GPU"
)
INTERNAL_FAILED = "internal AllReduce init failed (n_devices != 2?); falling back to meta-backend butterfly"
NCCL_MISSING = (
    "NCCL not compiled in; falling back to internal AllReduce.  Recompile with -DGGML_CUDA_NCCL=ON for best "
    "multi-GPU performance."
)
NCCL_VIRTUAL = "NCCL disabled: virtual devices in use; falling back to internal AllReduce"


def _verdict(lines: list[str], value: str | None, n: int) -> engagement.AllReduceVerdict:
    return engagement.allreduce_verdict(logparse.parse(lines).allreduce, value, n, virtual=True)


def test_the_all_reduce_proof_reads_upstreams_lines() -> None:
    v = _verdict([INTERNAL_READY], "internal", 2)
    assert v.ok and v.seen == "internal" and "2 GPUs" in v.evidence
    assert not _verdict([], "internal", 2).ok, "internal without its line is not proved"
    v = _verdict([INTERNAL_FAILED], "internal", 4)
    assert v.ok and v.expected == v.seen == "butterfly"
    assert not _verdict([], "internal", 4).ok, "a fallback must say so"
    assert _verdict([], "none", 4).ok and _verdict([], "none", 4).seen is None
    v = _verdict([INTERNAL_READY], "none", 2)
    assert not v.ok and "started" in v.evidence
    v = _verdict([NCCL_MISSING, INTERNAL_READY], None, 2)
    assert v.ok and "NCCL not compiled in" in v.evidence
    info = logparse.parse([NCCL_VIRTUAL, INTERNAL_FAILED]).allreduce
    assert info.nccl_fallbacks == ["NCCL disabled: virtual devices in use"] and info.path == "butterfly"
    assert _verdict(["unknown GGML_CUDA_ALLREDUCE value: bogus"], "bogus", 2).ok


BAR_ENABLED = (
    "ggml_cuda_bridge_allreduce: enabled for 4 devices (GGML_CUDA_MAPPED_HOST_BRIDGE=force): in-kernel exchange up to "
    "512 KiB per device, copy engines above (sums on the host, 8 threads), pinned at the first all-reduce"
)
BAR_STATS = "ggml_cuda_bridge_allreduce: stats: devices=4 allreduces=96 kernel=90 copy=6 fallbacks=0"
BAR_INACTIVE = (
    "ggml_cuda_bridge_allreduce: inactive for 2 devices (GGML_CUDA_ALLREDUCE=butterfly); the meta backend's "
    "butterfly runs"
)


def test_the_bridges_all_reduce_is_proved_by_its_own_lines() -> None:
    def verdict(lines: list[str], value: str, n: int, bridge: str, patched: bool = True) -> engagement.AllReduceVerdict:
        info = logparse.parse(lines).allreduce
        return engagement.allreduce_verdict(info, value, n, True, bridge=bridge, patched=patched)

    v = verdict([BAR_ENABLED, BAR_STATS], "none", 4, "force")
    assert v.ok and v.seen == "bridge" and "allreduces=96" in v.evidence
    assert not verdict([], "none", 4, "force").ok, "forced, the bridge's all-reduce must say it took the group"
    assert not verdict([BAR_ENABLED], "none", 4, "auto").ok, "auto on virtual devices: the butterfly expected"
    v = verdict([BAR_INACTIVE], "butterfly", 2, "force")
    assert v.ok and v.seen == "butterfly"
    v = verdict(["unknown GGML_CUDA_ALLREDUCE value: bridge"], "bridge", 4, "force", patched=False)
    assert v.ok and v.expected == "butterfly", "upstream's build: an unknown value, the butterfly"
    info = logparse.parse([BAR_ENABLED, BAR_STATS]).allreduce
    assert info.bridge_stats == [{"devices": 4, "allreduces": 96, "kernel": 90, "copy": 6, "fallbacks": 0}]
    assert engagement.did_work("bridge", {"boundaries": 0, "allreduces": 3}), "the bridge's all-reduce is work"


def test_the_meta_backends_abort_is_the_exit_reason() -> None:
    line = (
        "/src/ggml/src/ggml-backend-meta.cpp:609: unsupported mul_mat split states: node=attn_out-0 "
        "src0=blk.0.attn_output.weight axis=0 src1=kqv_out-0 axis=10"
    )
    info = logparse.parse([line])
    assert info.tensor_abort is not None and info.tensor_abort.startswith("unsupported mul_mat split states")
    assert re.search(r"-sm tensor cannot split this model: unsupported mul_mat", logparse.exit_reason(info, -6))


def test_serves_environment_check_takes_every_value_of_the_record() -> None:
    """The selector variables serve checks in its environment (modes.check_selector_env) take exactly the record's
    values (and, for the bridge, GPU pairs after 1 or auto)."""
    for value in BRIDGE.words.values():
        modes.check_selector_env({BRIDGE.selector: value}, modes.Selectors())
    for value in BATCHED.words.values():
        modes.check_selector_env({BATCHED.selector: value}, modes.Selectors())
    modes.check_selector_env({BRIDGE.selector: "auto:0-1"}, modes.Selectors())
    with pytest.raises(UsageError):
        modes.check_selector_env({BRIDGE.selector: "sometimes"}, modes.Selectors())
