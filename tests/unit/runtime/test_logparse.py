"""logparse: the contract regexes against sample log text."""

from __future__ import annotations

from ggml_bridge.runtime import logparse

PATCHED_2GPU = """\
ggml_cuda_init: found 2 CUDA devices (Total VRAM: 286000 MiB):
  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes
  Device 1: NVIDIA H200, compute capability 9.0, VMM: yes
ggml_cuda_mapped_host_bridge: enabled (mode force), 4 slots x 64 MiB mapped pinned host memory
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:19:00.0) - 142000 MiB free
llama_model_load_from_file_impl: using device CUDA1 (NVIDIA H200) (0000:3b:00.0) - 142000 MiB free
llama_batched_transfers: enabled, pinned pool up to 32 MiB
main: server is listening on http://127.0.0.1:8080
srv    load_model: model loaded
llama_batched_transfers: stats: graphs=12 async_uploads=24 async_downloads=12 sync_uploads=0 sync_downloads=0 upstream_uploads=0 upstream_downloads=0 bytes_up=4096 bytes_down=128000 fallbacks=0 pool_waits=0 pool_drains=0
ggml_cuda_mapped_host_bridge: stats: boundaries=36 bytes=1048576 chunks=40 producer_waits=3 sync_copies=0 fallbacks=0
"""


def test_bridge_enabled_and_stats():
    info = logparse.parse(PATCHED_2GPU)
    b = info.bridge
    assert b.enabled and b.mode == "force" and b.slots == 4 and b.slot_mib == 64
    assert b.enabled_lines == 1
    assert b.stats == [dict(boundaries=36, bytes=1048576, chunks=40, producer_waits=3, sync_copies=0, fallbacks=0)]
    assert b.total("boundaries") == 36
    assert info.n_devices == 2 and info.cuda_found == 2
    assert info.listening == "http://127.0.0.1:8080"
    assert info.model_loaded


def test_batched_enabled_and_stats():
    t = logparse.parse(PATCHED_2GPU).batched
    assert t.enabled and t.pool_mib == 32
    assert t.total("async_uploads") == 24 and t.total("async_downloads") == 12
    assert t.total("sync_uploads") == 0


def test_batched_stats_keep_upstream_apart():
    """The stats line says what batching staged (async), could not stage (sync) and left to upstream; a line of the
    older contract, where upstream's own asynchronous logits download was counted as batched, is not taken."""
    new = (
        "llama_batched_transfers: stats: graphs=3 async_uploads=6 async_downloads=0 sync_uploads=0 "
        "sync_downloads=0 upstream_uploads=40 upstream_downloads=11 bytes_up=64 bytes_down=0 fallbacks=0 "
        "pool_waits=0 pool_drains=0"
    )
    t = logparse.parse([new]).batched
    assert t.total("upstream_uploads") == 40 and t.total("upstream_downloads") == 11 and t.total("async_downloads") == 0
    old = (
        "llama_batched_transfers: stats: graphs=12 async_uploads=24 async_downloads=12 sync_uploads=0 "
        "sync_downloads=0 bytes_up=4096 bytes_down=128000 fallbacks=0 pool_waits=0 pool_drains=0"
    )
    assert logparse.parse([old]).batched.stats == []


def test_batched_stats_of_the_measuring_policy_still_parse():
    """The series before 2026-12-03 measured both paths inside the run: its extra counters (declined_graphs after
    graphs, the probe and class counters at the end) are parsed with the stable keys (older result logs)."""
    line = (
        "llama_batched_transfers: stats: graphs=3 declined_graphs=8 async_uploads=6 async_downloads=0 sync_uploads=0 "
        "sync_downloads=0 upstream_uploads=40 upstream_downloads=11 bytes_up=64 bytes_down=0 fallbacks=0 "
        "pool_waits=0 pool_drains=0 probe_graphs=11 classes_staged=1 classes_upstream=2"
    )
    t = logparse.parse([line]).batched
    assert t.total("declined_graphs") == 8 and t.total("probe_graphs") == 11 and t.total("async_uploads") == 6
    assert t.total("classes_staged") == 1 and t.total("classes_upstream") == 2


def test_batched_enabled_line_of_the_measuring_policy():
    line = (
        "llama_batched_transfers: enabled, pinned pool up to 32 MiB per process, staged or not per graph size by "
        "measured host time (8 graphs per path and size)"
    )
    t = logparse.parse([line]).batched
    assert t.enabled and t.pool_mib == 32 and t.stage_max is None and t.selector is None


def test_batched_enabled_line_with_the_stage_limit():
    line = (
        "llama_batched_transfers: enabled, pinned pool up to 32 MiB per process, split inputs in host memory up to "
        "65536 bytes staged, larger ones on upstream's copy"
    )
    t = logparse.parse([line]).batched
    assert t.enabled and t.pool_mib == 32 and t.stage_max == 65536 and t.selector is None


def test_batched_enabled_line_names_the_specifications_selector():
    """SAM3D_BATCHED_TRANSFERS=1 (the name in the mechanism's specification) enabled it: the line says so."""
    line = (
        "llama_batched_transfers: enabled, pinned pool up to 32 MiB per process, split inputs in host memory up to "
        "1024 bytes staged, larger ones on upstream's copy (selected by SAM3D_BATCHED_TRANSFERS=1, the "
        "specification's name of LLAMA_BATCHED_TRANSFERS)"
    )
    t = logparse.parse([line]).batched
    assert t.enabled and t.stage_max == 1024 and t.selector == "SAM3D_BATCHED_TRANSFERS"


def test_mode_1_with_prefix_and_colours():
    line = "\x1b[32m0.00.123.456 I ggml_cuda_mapped_host_bridge: enabled (mode 1), 8 slots x 16 MiB mapped pinned host memory\x1b[0m"
    b = logparse.parse([line]).bridge
    assert b.enabled and b.mode == "1" and b.slots == 8 and b.slot_mib == 16


def test_inactive_and_invalid():
    info = logparse.parse(
        "ggml_cuda_mapped_host_bridge: inactive: only one CUDA device\n"
        "llama_batched_transfers: inactive: no GPU backend in this context\n"
    )
    assert not info.bridge.enabled and info.bridge.inactive_reason == "only one CUDA device"
    assert info.bridge.seen
    assert not info.batched.enabled and info.batched.inactive_reason == "no GPU backend in this context"
    bad = logparse.parse(
        'ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE="yes" (expected 0, 1 or force); bridge off'
    )
    assert bad.bridge.rejected == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "yes"} and not bad.bridge.enabled
    assert bad.bridge.inactive_reason is None


def test_every_rejected_bridge_selector_is_kept():
    # the lines the bridge prints with every set of CUDA backends (issue 14: a typo must be visible)
    info = logparse.parse(
        'W ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE="" (expected 0, 1, auto or force); bridge off\n'
        'ggml_cuda_mapped_host_bridge: ignoring invalid GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB="63" (expected 64..65536); using 2048\n'
    )
    assert info.bridge.rejected == {"GGML_CUDA_MAPPED_HOST_BRIDGE": "", "GGML_CUDA_MAPPED_HOST_BRIDGE_CHUNK_KIB": "63"}
    assert info.bridge.seen and not info.bridge.enabled and info.bridge.inactive_reason is None


def test_auto_mode_state_pair_decisions_and_stats():
    # issue 26: one line per pair of GPUs with the decision; the stats line has the pair counters
    info = logparse.parse(
        "ggml_cuda_mapped_host_bridge: GPU 0 -> GPU 1: bridge (peer access not enabled: the driver would stage the copy "
        "through host memory)\n"
        "ggml_cuda_mapped_host_bridge: GPU 1 -> GPU 0: upstream (peer access enabled: direct peer copy)\n"
        "ggml_cuda_mapped_host_bridge: enabled (mode auto), 4 slots x 64 MiB pinned host memory (pinned at the first "
        "routed copy), chunks by boundary size, 1 of 2 device pairs routed\n"
        "ggml_cuda_mapped_host_bridge: stats: boundaries=3 bytes=12 chunks=3 producer_waits=0 sync_copies=0 fallbacks=0 "
        "pairs_bridge=1 pairs_upstream=1\n"
    )
    b = info.bridge
    assert b.enabled and b.mode == "auto" and b.slots == 4 and b.slot_mib == 64
    assert b.pairs == {(0, 1): "bridge", (1, 0): "upstream"}
    assert b.stats == [dict(zip(logparse.BRIDGE_STATS_KEYS, (3, 12, 3, 0, 0, 0, 1, 1), strict=True))]


def test_state_line_with_deferred_pool_and_trace_lines():
    info = logparse.parse(
        "ggml_cuda_mapped_host_bridge: enabled (mode force), 4 slots x 64 MiB mapped pinned host memory (pinned at the "
        "first routed copy), chunk 2048 KiB, strategy dual, 2 of 2 device pairs routed\n"
        "ggml_cuda_mapped_host_bridge: trace: allocated 4 x 64 MiB mapped pinned host memory at the first routed copy\n"
        "ggml_cuda_mapped_host_bridge: trace: boundary 0 device 0 -> 1 (GPU 0 -> 1), bytes 0..4096 of 4096: slot 0, "
        "1 chunk(s) of 2048 KiB, producer none (slot unused), then D2H ...; consumer stream waits ...\n"
    )
    b = info.bridge
    assert b.enabled and b.mode == "force" and b.slots == 4 and b.slot_mib == 64 and b.enabled_lines == 1
    assert b.inactive_reason is None and b.rejected == {} and b.stats == []


def test_unpatched_log_has_nothing():
    info = logparse.parse("llama_model_loader: loaded meta data\nmain: server is listening on http://127.0.0.1:9\n")
    assert not info.bridge.seen and not info.batched.seen
    assert info.bridge.stats == [] and info.batched.total("async_uploads") == 0
    assert info.n_devices == 0


def test_malformed_lines_are_not_matches():
    info = logparse.parse(
        "ggml_cuda_mapped_host_bridge: enabled (mode 2), 4 slots x 64 MiB\n"  # mode 2 is not a mode
        "ggml_cuda_mapped_host_bridge: enabled (mode 1), four slots x 64 MiB\n"
        "llama_batched_transfers: enabled\n"
    )
    assert not info.bridge.enabled and not info.batched.enabled


def test_several_processes_stats_accumulate():
    text = (
        "ggml_cuda_mapped_host_bridge: stats: boundaries=2 bytes=10 chunks=2 producer_waits=0 sync_copies=0 fallbacks=0\n"
        "ggml_cuda_mapped_host_bridge: stats: boundaries=5 bytes=20 chunks=5 producer_waits=1 sync_copies=0 fallbacks=1\n"
    )
    b = logparse.parse(text).bridge
    assert len(b.stats) == 2 and b.total("boundaries") == 7 and b.total("fallbacks") == 1


def test_duplicate_device_counted_once():
    info = logparse.parse("using device CUDA0 (A) (x) - 1 MiB free\nusing device CUDA0 (A) (x) - 1 MiB free\n")
    assert info.n_devices == 1


def test_startup_failures():
    bind = logparse.parse(
        "srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n"
        "srv    main: exiting due to HTTP server error\n"
    )
    assert bind.bind_failed == ("127.0.0.1", 8080)
    assert "port 8080" in logparse.exit_reason(bind, 1)
    assert "already in use" in logparse.exit_reason(bind, 1)

    missing = logparse.parse(
        "gguf_init_from_file: failed to open GGUF file '/x/m.gguf' (No such file or directory)\n"
        "llama_model_load: error loading model: llama_model_loader: failed to load model from /x/m.gguf\n"
        "srv    load_model: failed to load model, '/x/m.gguf'\n"
        "srv    main: exiting due to model loading error\n"
    )
    assert missing.gguf_open_failed == ("/x/m.gguf", "No such file or directory")
    assert missing.model_load_failed
    r = logparse.exit_reason(missing, 1)
    assert "/x/m.gguf" in r and "No such file" in r

    bad = logparse.parse("llama_model_load: error loading model: missing tensor 'output_norm.weight'\n")
    assert "missing tensor" in logparse.exit_reason(bad, 1)

    crash = logparse.parse("/src/ggml.c:123: GGML_ASSERT(x) failed\n")
    assert "crashed" in logparse.exit_reason(crash, -6)
    assert "signal 9" in logparse.exit_reason(logparse.parse(""), -9)
    assert "status 3" in logparse.exit_reason(logparse.parse(""), 3)


VK_POOLS = (
    "llama_batched_transfers: pools: Vulkan0: pool Vulkan_Host; Vulkan1: none (its pinned host buffer type is "
    "pinned for Vulkan0); CPU: none (computes in host memory)\n"
)


def test_batched_pools_line_names_each_backends_host_buffer_type():
    t = logparse.parse("llama_batched_transfers: enabled, pinned pool up to 32 MiB\n" + VK_POOLS).batched
    assert t.enabled
    assert t.pools == {
        "Vulkan0": "Vulkan_Host",
        "Vulkan1": "none (its pinned host buffer type is pinned for Vulkan0)",
        "CPU": "none (computes in host memory)",
    }
    assert logparse.parse_pools("CUDA0: pool CUDA_Host; odd item") == {"CUDA0": "CUDA_Host", "odd item": "?"}
    assert logparse.parse("llama_batched_transfers: enabled, pinned pool up to 32 MiB\n").batched.pools == {}
