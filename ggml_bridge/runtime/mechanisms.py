"""The mechanism record: one typed row per mechanism a process may run, from which modes, logparse, engagement,
serve, the ladder, the bench and the doctor derive what they spell out (issue 47 item 2).

A *mechanism* is something a run must prove engaged or not: the series' bridge and batched transfers, and
upstream's all-reduce of ``-sm tensor``. Its row says which environment variable selects it, the words the command
line accepts and the values they set, which words ask for it (it must then prove that it engaged or say why not),
the tag of its log lines and the values its ``enabled`` line may report, the counters it prints (its stats keys,
exported on /metrics as ``llamacpp:<name>_<key>_total`` where it has metrics) and which of them show work.

The all-reduce of ``-sm tensor`` (``GGML_CUDA_ALLREDUCE``, read by upstream's ``ggml-cuda.cu``) has no counters and
no ``enabled`` line of its own: upstream says which path it chose only through its init lines (see
:data:`ALLREDUCE_PATHS` and :mod:`ggml_bridge.runtime.logparse`), and the butterfly says nothing at all: where the bridge is
forced, its boundaries prove the butterfly's exchanges (they are ``ggml_backend_tensor_copy_async`` between
devices, the bridge's ``cpy_tensor_async``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..foundations.errors import UsageError
from ..foundations.tables import by_name


@dataclass(frozen=True)
class Mechanism:
    name: str
    selector: str
    """The environment variable that selects it."""
    words: Mapping[str, str]
    """Command-line words (``--bridge auto``) -> the selector's value."""
    asks: tuple[str, ...]
    """The words that ask for the mechanism: it must then prove that it engaged, or say why it may not."""
    log_tag: str
    """The tag its own log lines start with (empty: upstream's lines, see :data:`ALLREDUCE_PATHS`)."""
    stats_keys: tuple[str, ...] = ()
    """The counters of its ``stats:`` line, in order (the /metrics names are ``<name>_<key>_total``)."""
    work_keys: tuple[str, ...] = ()
    """Counters any of which above zero shows that it did work."""
    metrics: bool = False
    """Its counters are exported on llama-server's /metrics (patch 0005)."""
    upstream: bool = False
    """The selector is upstream's (not the series'): both builds read it."""
    proof: str = ""
    """How a run proves that it engaged, in words (the docs' table)."""

    @property
    def asked_values(self) -> tuple[str, ...]:
        """The selector values the words that ask for it set, in order, each once (what an ``enabled`` line may
        report as its mode)."""
        return tuple(dict.fromkeys(self.words[w] for w in self.asks))

    def metric_names(self) -> tuple[str, ...]:
        """The /metrics counter names (without the ``llamacpp:`` prefix) of its stats keys."""
        return tuple(f"{self.name}_{k}_total" for k in self.stats_keys) if self.metrics else ()


BRIDGE = Mechanism(
    "bridge",
    "GGML_CUDA_MAPPED_HOST_BRIDGE",
    {"on": "1", "off": "0", "auto": "auto", "force": "force"},
    ("on", "auto", "force"),
    "ggml_cuda_mapped_host_bridge",
    (
        "boundaries",
        "bytes",
        "chunks",
        "producer_waits",
        "sync_copies",
        "fallbacks",
        "pairs_bridge",
        "pairs_upstream",
    ),
    ("boundaries", "allreduces"),
    metrics=True,
    proof=(
        "its 'enabled (mode M)' line, and boundaries > 0 (or, under -sm tensor, allreduces > 0: patch 0007's "
        "all-reduce) in its stats line or on /metrics"
    ),
)
BATCHED = Mechanism(
    "batched",
    "LLAMA_BATCHED_TRANSFERS",
    {"on": "1", "off": "0"},
    ("on",),
    "llama_batched_transfers",
    (
        "graphs",
        "async_uploads",
        "async_downloads",
        "sync_uploads",
        "sync_downloads",
        "upstream_uploads",
        "upstream_downloads",
        "bytes_up",
        "bytes_down",
        "fallbacks",
        "pool_waits",
        "pool_drains",
    ),
    ("async_uploads", "large_splits"),
    metrics=True,
    proof="its 'enabled' line, and async_uploads > 0 or large_splits > 0 in its stats line or on /metrics",
)
ALLREDUCE = Mechanism(
    "allreduce",
    "GGML_CUDA_ALLREDUCE",
    {"nccl": "nccl", "internal": "internal", "none": "none", "bridge": "bridge", "butterfly": "butterfly"},
    ("nccl", "internal", "bridge"),
    "ggml_cuda_bridge_allreduce",
    upstream=True,
    proof=(
        "upstream's init lines: 'initialized AllReduce pipeline: 2 GPUs' (internal), its fallback warnings "
        "(NCCL not compiled in / disabled with virtual devices; internal init failed -> butterfly); the bridge's "
        "all-reduce (patch 0007) its 'enabled for N devices' line and allreduces > 0; upstream's butterfly prints "
        "nothing (the patched build: 'inactive for N devices')"
    ),
)

# --- the selectors of one process (the --bridge / --batched words)


@dataclass(frozen=True)
class Selectors:
    """The ``--bridge`` / ``--batched`` words of one process (``None``: left unset, the build's default)."""

    bridge: str | None = None
    batched: str | None = None

    def __post_init__(self) -> None:
        if self.bridge is not None and self.bridge not in BRIDGE.words:
            raise UsageError(f"--bridge must be one of {', '.join(BRIDGE.words)}, not {self.bridge!r}")
        if self.batched is not None and self.batched not in BATCHED.words:
            raise UsageError(f"--batched must be one of {', '.join(BATCHED.words)}, not {self.batched!r}")

    @property
    def asks_bridge(self) -> bool:
        """The bridge is asked for: it must engage or say why it may not (``on``, ``auto``, ``force``)."""
        return self.bridge in BRIDGE.asks

    @property
    def asks_batched(self) -> bool:
        return self.batched in BATCHED.asks

    @property
    def any_set(self) -> bool:
        """A selector is set: there is something to prove (asked for, or asked to stay off)."""
        return self.bridge is not None or self.batched is not None

    @property
    def bridge_mode(self) -> str | None:
        """What the server reports in its ``enabled (mode M)`` line when the bridge engages as asked."""
        return BRIDGE.words[self.bridge] if self.asks_bridge and self.bridge is not None else None

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """Which mechanisms must prove that they engaged: ``()``, ``("bridge",)``, ``("batched",)`` or both."""
        return (("bridge",) if self.asks_bridge else ()) + (("batched",) if self.asks_batched else ())

    def env(self) -> dict[str, str]:
        """The selectors' environment variables (only those set)."""
        env: dict[str, str] = {}
        if self.bridge is not None:
            env[BRIDGE.selector] = BRIDGE.words[self.bridge]
        if self.batched is not None:
            env[BATCHED.selector] = BATCHED.words[self.batched]
        return env


def selector_env(bridge: str | None, batched: str | None) -> dict[str, str]:
    """Environment for the selectors. ``None`` leaves a selector unset (the build's default). There is nothing to
    switch the counters on: both mechanisms print their stats line whenever they are on."""
    return Selectors(bridge, batched).env()


#: every mechanism, by name
MECHANISMS: dict[str, Mechanism] = by_name(BRIDGE, BATCHED, ALLREDUCE)
#: the series' mechanisms (the ones with their own log lines and counters)
SERIES = tuple(m for m in MECHANISMS.values() if not m.upstream)

#: the GGML_CUDA_ALLREDUCE values only the patched build knows (patch 0007; upstream warns and takes the butterfly)
PATCHED_ALLREDUCE_VALUES = ("bridge", "butterfly")
#: upstream's variable for the internal all-reduce's BF16 rounding of F32 (default 1: always; 0: never)
AR_BF16_THRESHOLD = "GGML_CUDA_AR_BF16_THRESHOLD"


@dataclass(frozen=True)
class AllReducePath:
    """One way ``-sm tensor``'s partial sums are reduced across the devices of the Meta device."""

    name: str
    selector_value: str | None
    """The ``GGML_CUDA_ALLREDUCE`` value that asks for it (None: none does, e.g. a path still to come)."""
    devices: str
    """Which device counts it serves."""
    carried_by: str
    about: str
    available: bool = True
    """False: a row reserved for a path still to come (refused by the modes until it is)."""


ALLREDUCE_PATHS: dict[str, AllReducePath] = by_name(
    AllReducePath(
        "nccl",
        "nccl",
        "any (physical GPUs only)",
        "NCCL",
        "upstream's default on Linux; refused with virtual devices and in builds without GGML_CUDA_NCCL (falls back "
        "to internal)",
    ),
    AllReducePath(
        "internal",
        "internal",
        "exactly 2",
        "upstream's host-staged pipeline (ggml-cuda/allreduce.cu)",
        "pinned host staging by the GPUs' own kernels and copy engines; F32 rounded through BF16 unless "
        "GGML_CUDA_AR_BF16_THRESHOLD=0; with another device count it falls back to the butterfly",
    ),
    AllReducePath(
        "butterfly",
        "none",
        "any",
        "ggml_backend_tensor_copy_async between the devices (cpy_tensor_async: the bridge where it is on)",
        "the meta backend's generic exchange (ggml-backend-meta.cpp); also what every failed init falls back to",
    ),
    AllReducePath(
        "bridge",
        "bridge",
        "2 or more",
        "the bridge's all-reduce (patch 0007, bridge-allreduce.cu): mapped pinned memory and copy engines",
        "the patched build, where upstream would run the butterfly: with GGML_CUDA_MAPPED_HOST_BRIDGE=force, with "
        "1/auto where the bridge takes every device pair, or asked by GGML_CUDA_ALLREDUCE=bridge (also on 2 devices); "
        "the butterfly's sums byte for byte; GGML_CUDA_ALLREDUCE=butterfly keeps the butterfly",
    ),
)


def expected_allreduce(
    value: str | None,
    n_devices: int,
    virtual: bool,
    nccl_built: bool = False,
    bridge: str | None = None,
    patched: bool = False,
) -> str:
    """The path b11434 picks (``ggml_backend_cuda_comm_init``) for ``GGML_CUDA_ALLREDUCE=value`` (None: unset, Linux's
    default NCCL) on ``n_devices`` CUDA devices, ``virtual`` ones of fewer GPUs or not; in the ``patched`` build
    (patch 0007) with the bridge's selector value ``bridge``, the bridge's all-reduce where upstream would run the
    butterfly and the bridge takes it. An unknown value warns and takes the butterfly (in the patched build its init,
    so the bridge's all-reduce where the bridge takes it); ``bridge`` and ``butterfly`` are unknown to upstream. ``auto``/``1`` between physical GPUs depend on their peer paths: ``bridge-or-butterfly``."""
    if value in (None, "nccl") and nccl_built and not virtual:
        return "nccl"
    if value in (None, "nccl", "internal") and n_devices == 2:
        return "internal"
    if not patched or value == "butterfly":  # upstream: every other value, none or unknown, is the butterfly
        return "butterfly"
    if value == "bridge" or bridge == "force":
        return "bridge"
    if bridge in ("1", "auto") and not virtual:
        return "bridge-or-butterfly"
    return "butterfly"
