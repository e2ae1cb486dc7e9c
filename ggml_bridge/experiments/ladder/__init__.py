"""Byte-exact comparison ladder: the patches must change nothing but speed.

``ggml-bridge ladder [--ladder FILE] [--report DIR]`` reads a ladder TOML file (``ladders/cpu.toml`` runs
in CI, ``ladders/cuda.toml`` on GPU machines). Each rung names a model shape (generated, deterministic,
cached: :mod:`model`), the devices, ubatch/batch sizes and the *modes* to compare. A mode is a binary
(patched or upstream build) plus selector values; the table is :data:`ggml_bridge.runtime.modes.MODES` (shared with
the bench, listed in docs/DESIGN.md), and the ladder runs the modes of the patched and upstream builds.

An ``rpc-*`` mode starts one ``ggml-rpc-server`` per entry of the rung's ``rpc_servers`` (each a device list,
e.g. ``[["CPU"], ["CPU"]]`` or ``[["CUDA0", "CUDA1"]]``) with the rung's GPUs and the mode's selectors, and
runs llama-server and llama-perplexity with ``--rpc`` and no GPU of their own; the servers' counters (patch
0006, SIGUSR1) must show each served graph computations, and in ``rpc-bridge`` every server owning two or
more GPUs must report the bridge engaged with ``bridge_boundaries>0`` (docs/rpc.md).

For every mode the rung runs the real llama-server through :class:`llama_server.Server`, sends a fixed request
set (greedy, ``n_probs``, prompts from one token up to longer than the ubatch) and records the responses
(canonical JSON, volatile fields such as timings dropped); then runs ``llama-perplexity
--kl-divergence-base FILE`` on a fixed generated text, which dumps the (16-bit quantised) log-probabilities
of every evaluated token. Both artifacts of every mode are compared byte for byte with the rung's
reference mode.

No vacuous passes: a bridge mode needs the bridge's ``enabled ... N slots x M MiB`` line in every process,
and on multi-device rungs its teardown counters must show ``boundaries>0`` (and the log must show the model
on more than one device); a batched mode needs its ``enabled`` line and ``async_uploads>0`` (what batching
itself staged; logits downloads into llama.cpp's pinned output buffer are upstream's own and counted apart),
also live on the server's ``/metrics`` (``llamacpp:batched_async_uploads_total``) when it serves them. ``off``
must not show either mechanism enabled, and ``upstream`` must not print any patch line at all. ``bridge-typo``
sets invalid selector values: every process must report each of them rejected (with llama.cpp's default
``-fit``, whose probe demotes warnings) and the bridge must stay off; any other rejected value fails every mode.
A rung may declare ``expect_batched = "inactive"`` (CPU: nothing to batch to): the mode
is then compared but reported as *inactive, as expected* and never counted as a batched pass;
``expect_bridge`` likewise, and ``expect = { bridge = "either" }`` sets it for one mode (for every
mechanism that mode uses). "either" accepts engaged or inactive and reports which; "idle" needs the mechanism enabled
and reports its work without requiring any (batching in -sm tensor graphs).

A rung with ``split_mode = "tensor"`` (docs/tensor.md) may name upstream's all-reduce (``allreduce = "internal"``,
``"none"``, ..., GGML_CUDA_ALLREDUCE of every mode; the ``tensor-*`` modes name their own): every process must show
the path its build picks (:func:`ggml_bridge.runtime.engagement.allreduce_verdict`), its shape must split over the rung's
devices (:mod:`ggml_bridge.experiments.tensor_split`), and its modes must round alike (upstream's internal path on two devices
rounds through BF16 unless GGML_CUDA_AR_BF16_THRESHOLD=0).

Exit status: 0 all rungs pass; 1 any mismatch or validity failure; 2 setup errors only.
"""
