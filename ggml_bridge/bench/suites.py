"""The bench's suites (which cases, on which devices, with which models and settings) and the part of a suite's
matrix one run measures: its shapes, run lengths and measurements (:func:`select`).

Run lengths (``run_lengths``, ``--run-lengths 1,3,10``): one llama-bench process per case, run length and round,
``-r N`` and every repetition kept, so a one-shot run's first-call costs are in its figures; tests are named with
the run length (``pp4096/ub512@r1``). Without run lengths a process runs ``--reps`` repetitions after
``--warmup-reps`` discarded ones, and the tests carry no suffix.

Shapes (``shapes``, ``--shapes``): a suite that lists several measures each, one model per shape, and names the
shape in every test (``bench-2b-6l:pp4096/ub512@r1``), so that reports of parts of the matrix pool into one.

Measurements (``--measure``): ``bench`` (llama-bench), ``perplexity`` (llama-perplexity's wall time, suites with a
``perplexity`` table) and ``server`` (llama-server's throughput under concurrent requests, suites with a ``server``
table); a suite measures all it has by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import UsageError

#: what a run can measure: llama-bench, llama-perplexity's wall time, llama-server under concurrent requests
MEASURES = ("bench", "perplexity", "server")

#: llama-perplexity of the short-run suites: 4 sequences of 512 tokens, all in one batch of 2048
PERPLEXITY = {"ctx": 512, "chunks": 4, "batch": 2048}
#: llama-server of the short-run suites: 8 greedy completions of 128 tokens, 4 at a time on 4 slots
SERVER = {"parallel": 4, "requests": 8, "n_predict": 128, "prompt_words": 256, "ctx": 4096}
#: the short-run suites' shapes and settings (the 5120-wide model is where one-shot runs lost)
_RUNS: dict[str, Any] = {
    "shapes": ["bench-1b", "bench-2b-6l"],
    "devices": "1",
    "pp": "512,4096",
    "batch": 4096,
    "ubatch": [512],
    "tg": 128,
    "run_lengths": [1, 3, 10],
    "rounds": 5,
    "perplexity": PERPLEXITY,
    "server": SERVER,
}

#: Suites: which cases, on which devices, with which model and llama-bench settings.
SUITES: dict[str, dict[str, Any]] = {
    "multi-gpu": {
        "cases": ["upstream-p2p", "upstream", "upstream-nopeer", "off", "bridge", "bridge-force-p2p"],
        "shape": "bench-3b",
        "devices": "all",
        "pp": 4096,
        "batch": 4096,
        "ubatch": [512, 4096],
        "tg": 128,
        "about": "layer split across every visible GPU: one host round trip per boundary without peer access",
    },
    "batched": {
        "cases": ["off", "batched"],
        "shape": "bench-1b",
        "devices": "1",
        "pp": 512,
        "batch": 512,
        "ubatch": [512],
        "tg": 128,
        "about": "one GPU: per-token graph inputs and logits, batched through the pinned pool or not",
    },
    "batched-multi": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 512,
        "batch": 512,
        "ubatch": [512],
        "tg": 128,
        "about": "layer split: batching composed with the bridge",
    },
    "batched-pipeline": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 2048,
        "batch": 2048,
        "ubatch": [512],
        "tg": 0,
        "about": "layer split with pipeline parallelism (4 ubatches per prompt): staged inputs must not stall it",
    },
    # issue 14 item 2: prompt processing with several ubatches in flight on many-device pipelines; batching
    # must make nothing >= 1 % slower (it declines prompt-sized graphs) and keep its token-generation gain
    "batched-pp-6dev": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l",
        "devices": "all",
        "virtual_devices": 6,
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "6 virtual devices on the visible GPUs (one layer each), -sm layer -ub 512 -b 4096: pipeline parallelism",
    },
    "batched-pp-2gpu": {
        "cases": ["off", "batched", "bridge", "bridge-batched"],
        "shape": "bench-2b-6l",
        "devices": "all",
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "2 GPUs, -sm layer -ub 512 -b 4096: pipeline parallelism over two cards",
    },
    "rpc": {
        "cases": ["rpc-upstream", "rpc-upstream-nopeer", "rpc-off", "rpc-bridge"],
        "shape": "bench-1b",
        "devices": "all",
        "pp": 2048,
        "batch": 2048,
        "ubatch": [512, 2048],
        "tg": 32,
        "about": "one rpc-server on localhost owning every GPU, llama-bench --rpc: the copies between its GPUs "
        "are server-side (RPC_CMD_COPY_TENSOR); the activations to and from llama-bench cross TCP",
    },
    "rpc-cpu": {
        "cases": ["off", "rpc-off"],
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 16,
        "threads": 1,
        "about": "CPU: the same build local and behind one localhost rpc-server (the cost of the TCP hops); one "
        "thread in both, so the comparison is not about thread counts (the defaults differ)",
    },
    # issue 29: hosts over a network, on one GPU. llama-bench keeps the GPU and puts part of the layers on one
    # localhost rpc-server on the same GPU (a second host); the link between them is shaped (netbench.py)
    "rpc-link": {
        "cases": ["off", "rpc-off"],
        "links": ["unlimited/0", "10gbit/0.2ms", "25gbit/0.2ms", "10gbit/0.5ms", "25gbit/0.1ms"],
        "rpc_servers": 1,
        "rpc_front_gpu": True,
        "shape": "bench-1b",
        "devices": "1",
        "pp": "512,4096",
        "batch": 4096,
        "ubatch": [512],
        "tg": 128,
        "about": "one GPU as two hosts: llama-bench's GPU plus one rpc-server on it, over loopback TCP, through the "
        "shaper without limits (the scale model's calibration) and over shaped links (rate per direction / "
        "one-way delay), against the local run",
    },
    "rpc-link-cpu": {
        "cases": ["off", "rpc-off"],
        "links": ["unlimited/0", "1gbit/0.2ms", "1gbit/1ms"],
        "rpc_servers": 1,
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 16,
        "threads": 1,
        "about": "CPU: the same build local, behind one localhost rpc-server, and behind it over a shaped link",
    },
    "cpu": {
        "cases": ["upstream", "off"],
        "shape": "small",
        "devices": "cpu",
        "pp": 256,
        "batch": 256,
        "ubatch": [256],
        "tg": 32,
        "about": "CPU only: the patched build with its selectors off against upstream (the patches must cost nothing)",
    },
    # short runs: what a user's one-shot llama-bench sees. Every repetition of a -r N process is kept (llama-bench's
    # own warm-up run stays, as in a user's run), on today's shape and the wide one, with llama-perplexity's wall
    # time and llama-server's throughput under concurrent requests; batching against its baseline in every case
    "batched-runs-1gpu": {
        "cases": ["off", "batched"],
        **_RUNS,
        "about": "one GPU, run lengths -r 1, 3, 10: batching on or off, llama-perplexity and llama-server included",
    },
    "batched-runs-2virt": {
        "cases": ["off", "batched", "bridge-force", "bridge-force-batched"],
        **_RUNS,
        "virtual_devices": 2,
        "about": "2 virtual devices on one GPU (-sm layer), run lengths -r 1, 3, 10: batching on or off, alone "
        "and with the bridge forced, llama-perplexity and llama-server included",
    },
    "batched-runs-6virt": {
        "cases": ["off", "batched", "bridge-force", "bridge-force-batched"],
        **_RUNS,
        "virtual_devices": 6,
        "about": "6 virtual devices on one GPU (-sm layer, a pipeline of 6), run lengths -r 1, 3, 10: batching on "
        "or off, alone and with the bridge forced, llama-perplexity and llama-server included",
    },
    "cpu-runs": {
        "cases": ["upstream", "off"],
        "shapes": ["tiny", "small"],
        "devices": "cpu",
        "pp": "64,256",
        "batch": 256,
        "ubatch": [64],
        "tg": 16,
        "run_lengths": [1, 3],
        "rounds": 2,
        "perplexity": {"ctx": 128, "chunks": 4, "batch": 512},
        "server": {"parallel": 4, "requests": 8, "n_predict": 16, "prompt_words": 32, "ctx": 1024},
        "about": "CPU only, the short-run matrix in small: run lengths -r 1 and 3 on two tiny shapes, "
        "llama-perplexity and llama-server included (the code path of the batched-runs suites)",
    },
}


@dataclass(frozen=True)
class Selection:
    """The part of a suite's matrix one run measures."""

    shapes: tuple[str, ...]  # model shapes, in the suite's order ("user" for --model)
    keyed_by_shape: bool  # tests are named with their shape (the suite lists shapes)
    run_lengths: tuple[int, ...]  # () = kept repetitions after discarded warm-up ones
    measures: tuple[str, ...]  # of MEASURES


def shapes_of(suite: dict[str, Any]) -> list[str]:
    return list(suite.get("shapes") or [suite["shape"]])


def measures_of(suite: dict[str, Any]) -> tuple[str, ...]:
    """What the suite can measure: llama-bench always, perplexity and server where it has their settings."""
    return tuple(m for m in MEASURES if m == "bench" or m in suite)


def _subset(option: str, given: str, known: Sequence[str], suite: str) -> tuple[str, ...]:
    """The names of a comma list ``given``, each one of ``known`` (duplicates dropped, order kept)."""
    names = [x.strip() for x in given.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if not names or unknown:
        raise UsageError(
            f"bad {option} {given!r}" + (f": suite {suite} has no {', '.join(unknown)}" if unknown else ""),
            why=f"{option} chooses among the suite's own",
            fix=f"use one or more of: {','.join(known)} (or another --suite)",
        )
    return tuple(dict.fromkeys(names))


def select(
    name: str,
    suite: dict[str, Any],
    *,
    shapes: str | None = None,
    run_lengths: Sequence[int] | None = None,
    measures: str | None = None,
    user_model: bool = False,
) -> Selection:
    """The shapes (``--shapes``), run lengths (``--run-lengths``) and measurements (``--measure``) of suite ``name``
    one run measures: the suite's own where an option is not given; UsageError for a name the suite does not have."""
    if user_model and shapes:
        raise UsageError(
            "--shapes and --model together",
            why="--model replaces the suite's random models",
            fix="leave out --shapes to measure the given model, or --model to measure the suite's shapes",
        )
    chosen = ("user",) if user_model else tuple(shapes_of(suite))
    if shapes and not user_model:
        chosen = _subset("--shapes", shapes, shapes_of(suite), name)
    lengths = tuple(sorted(set(run_lengths if run_lengths else suite.get("run_lengths", ()))))
    what = measures_of(suite) if measures is None else _subset("--measure", measures, measures_of(suite), name)
    return Selection(chosen, "shapes" in suite, lengths, what)
