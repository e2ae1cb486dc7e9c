"""engagement.engaged: the one decision whether a mechanism engaged in a process."""

from __future__ import annotations

import pytest

from ggml_bridge.runtime import logparse, proof
from ggml_bridge.runtime.engagement import ABSENT, ENGAGED, IDLE, INACTIVE, engaged


def test_enabled_is_engaged_and_counters_must_show_work() -> None:
    b = logparse.BridgeInfo(enabled=True, mode="1")
    assert engaged("bridge", b).state == ENGAGED
    assert engaged("bridge", b, {"boundaries": 3}).engaged
    assert engaged("bridge", b, {"boundaries": 0}).state == IDLE
    assert engaged("bridge", b, {"bridge_boundaries": 2}).engaged, "an rpc-server's counters"
    t = logparse.BatchedInfo(enabled=True)
    assert engaged("batched", t, {"async_uploads": 1}).engaged
    assert engaged("batched", t, {"graphs": 4, "upstream_uploads": 8}).state == IDLE, "inputs left to upstream's copy"
    assert engaged("batched", t, {"async_downloads": 9}).state == IDLE, "downloads are upstream's own"


def test_batched_rule_keeping_large_splits_upstream_is_engaged() -> None:
    """A prompt-only run (llama-perplexity at ubatch 512): every split has its KQ mask over the stage limit, so the
    rule keeps all their inputs on upstream's copies and stages nothing; the line's large_splits says the rule ran
    (the bench uses such a run's figures), where before the counter a stats line without staged uploads was idle."""
    line = (
        "llama_batched_transfers: stats: graphs=16 async_uploads=0 async_downloads=0 sync_uploads=0 "
        "sync_downloads=0 upstream_uploads=96 upstream_downloads=16 bytes_up=0 bytes_down=0 fallbacks=0 "
        "pool_waits=0 pool_drains=0 large_splits=16"
    )
    t = logparse.parse(["llama_batched_transfers: enabled, pinned pool up to 32 MiB per process", line]).batched
    assert t.stats and t.total("large_splits") == 16
    assert engaged("batched", t, t.stats[-1]).engaged
    assert engaged("batched", t, {**t.stats[-1], "large_splits": 0}).state == IDLE


def test_inactive_keeps_the_process_reason_and_no_line_is_absent() -> None:
    v = engaged("bridge", logparse.BridgeInfo(inactive_reason="single device"))
    assert (v.state, v.reason, v.engaged) == (INACTIVE, "single device", False)
    assert engaged("batched", logparse.BatchedInfo()).state == ABSENT
    with pytest.raises(ValueError):
        engaged("turbo", logparse.BridgeInfo())


def test_every_caller_uses_it() -> None:
    """serve, rpc, the ladder and the bench decide through engagement.engaged (the wheel test via serve --check)."""
    import inspect

    from ggml_bridge.experiments.bench import proof as bench_proof
    from ggml_bridge.experiments.bench import server as bench_server
    from ggml_bridge.experiments.ladder import validity
    from ggml_bridge.runtime import rpc

    for mod in (rpc, bench_proof, validity):
        assert "engaged(" in inspect.getsource(mod) and mod.engaged is engaged, mod.__name__
    # serve and the bench's llama-server, at its default verbosity, through from_metrics (engaged, then the
    # /metrics counters)
    from ggml_bridge.runtime import engagement

    for mod in (proof, bench_server):  # serve's proof
        assert "from_metrics(" in inspect.getsource(mod) and mod.from_metrics is engagement.from_metrics
    assert "engaged(mechanism, info)" in inspect.getsource(engagement.from_metrics)


def test_from_metrics_reads_the_live_counters() -> None:
    """Issue 27 D1: without -lv 4 the enabled line is hidden; /metrics (patch 0005) decides."""
    from ggml_bridge.runtime.engagement import from_metrics

    hidden = logparse.BridgeInfo()
    assert from_metrics("bridge", hidden, {"bridge_boundaries_total": 3}).state == ENGAGED
    assert from_metrics("bridge", hidden, {"bridge_boundaries_total": 0}).state == IDLE
    assert from_metrics("bridge", hidden, {"batched_graphs_total": 2}).state == ABSENT
    assert from_metrics("bridge", hidden, None).state == ABSENT
    assert from_metrics("batched", logparse.BatchedInfo(), {"batched_async_uploads_total": 4}).state == ENGAGED
    inactive = logparse.BatchedInfo(inactive_reason="no backend with same-device pinned host memory")
    assert (
        from_metrics("batched", inactive, {"batched_graphs_total": 5, "batched_async_uploads_total": 0}).state
        == INACTIVE
    )


def test_the_pair_decisions_on_metrics_are_reported_or_said_missing() -> None:
    """/metrics' pairs_bridge / pairs_upstream are the per-pair decision the docs promise: serve says how many pairs
    took each path, and says so plainly where an engaged bridge counted none (mode force, virtual devices)."""
    from ggml_bridge.runtime import logparse, proof

    live = {"bridge_boundaries_total": 7, "bridge_bytes_total": 4096}
    two = logparse.parse("llama_model_load_from_file_impl: using device CUDA0 (x) - 1 MiB free\n" * 1)
    e = proof.check_engagement(two, "auto", None, 2, metrics={**live, "bridge_pairs_bridge_total": 2,
                                                                  "bridge_pairs_upstream_total": 0})  # fmt: skip
    assert "device pairs: 2 through the bridge, 0 on upstream's copy (/metrics)" in e.notes, e.notes
    e = proof.check_engagement(two, "force", None, 2, metrics={**live, "bridge_pairs_bridge_total": 0,
                                                                   "bridge_pairs_upstream_total": 0})  # fmt: skip
    assert any("counts no device pair decision" in n for n in e.notes), e.notes
    e = proof.check_engagement(two, "force", None, 2, metrics=live)  # an older build: no pair counters at all
    assert not any("pair" in n for n in e.notes), e.notes


def test_auto_not_needed_on_a_split_is_reported_with_its_pairs() -> None:
    """--bridge auto where no device pair needs the bridge (virtual devices of one GPU, peer paths enabled): a note
    with the bridge's reason and the pairs /metrics counted on upstream's copy, not an error (the doctor recommends
    auto there; its command failed serve --check on one H200 as four virtual devices, 2026-12-03)."""
    from ggml_bridge.runtime import logparse, proof

    reason = "no device pair needs it in mode auto (4 device(s) on 1 physical GPU(s))"
    four = logparse.parse(f"ggml_cuda_mapped_host_bridge: inactive: {reason}\n")
    live = {"bridge_boundaries_total": 0, "bridge_pairs_bridge_total": 0, "bridge_pairs_upstream_total": 12}
    e = proof.check_engagement(four, "auto", None, 4, metrics=live)
    assert e.ok, e.errors
    assert f"bridge not needed on this 4-device split in mode auto: {reason}" in e.notes, e.notes
    assert "device pairs: 0 through the bridge, 12 on upstream's copy (/metrics)" in e.notes, e.notes
    e = proof.check_engagement(four, "on", None, 4, metrics=live)  # 1 (on) was asked to bridge: not engaged
    assert not e.ok and "bridge requested (on) but not engaged on a 4-device split" in e.errors[0], e.errors
