"""Selectors, build variants and modes: the one table ladder, bench, serve and build derive from.

*Selectors* are the environment variables the patched build reads (docs/DESIGN.md, "Runtime selectors").
A *build variant* is (our series applied or not) + CMake options. A *mode* is a variant plus selector values
plus which mechanism must prove that it engaged: the ladder compares modes byte for byte, the bench measures
them side by side, ``serve --bridge/--batched`` sets the same selectors.

Mode names say what they set: ``upstream*`` run the unpatched build, ``off`` the patched one with both
selectors 0, ``bridge`` = ``GGML_CUDA_MAPPED_HOST_BRIDGE=auto`` (the recommended setting: the bridge wherever peer
access is not enabled), ``bridge-force`` = ``force``, ``batched`` =
``LLAMA_BATCHED_TRANSFERS=1``, ``*-p2p`` add ``GGML_CUDA_P2P=1`` (peer access enabled), ``rpc-*`` put the model
on local ``ggml-rpc-server`` processes. Older names are accepted with a deprecation note (:data:`ALIASES`);
``both`` meant bridge=force in the ladder and bridge=1 in the bench, so it is refused with both new names.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..foundations.errors import UsageError
from ..foundations.runner import log
from ..foundations.tables import by_name
from . import mechanisms
from .mechanisms import Selectors as Selectors  # re-exported: the selectors of one process
from .mechanisms import selector_env as selector_env

# --- selectors (environment variables the patched build reads) --------------------------------------------

BRIDGE = mechanisms.BRIDGE.selector  # 0|1|auto|force (its only setting; stats line always)
BATCHED = mechanisms.BATCHED.selector  # 0|1 (its stats line comes at teardown when 1)
#: upstream's all-reduce of -sm tensor (nccl|internal|none) and the internal one's BF16 rounding threshold
ALLREDUCE = mechanisms.ALLREDUCE.selector
AR_BF16_THRESHOLD = mechanisms.AR_BF16_THRESHOLD
BATCHED_CMAKE = "SAM3D_BATCHED_TRANSFERS"
#: the RPC server program of a build (the rpc-* modes start it; serve's --rpc-local too)
RPC_SERVER = "ggml-rpc-server"
#: upstream's own variables the modes and suites set
CUDA_P2P = "GGML_CUDA_P2P"  # 1: enable peer access between the GPUs
CUDA_DEVICES = "GGML_CUDA_DEVICES"  # N: emulate N cards on the visible GPUs
NCCL_NVLS = "NCCL_NVLS_ENABLE"  # 0 on the lent machines (NVLink multicast off)
VK_DEVICES = "GGML_VK_VISIBLE_DEVICES"  # Vulkan device indices; "0,0" = two devices on one (CPU-type ones
# such as lavapipe are used only when named here)

#: ``--bridge`` / ``--batched`` words -> selector values, and the words that ask for each mechanism (it must then
#: prove that it engaged, or say why not): the single rule serve, rpc, the ladder and the bench apply, from the
#: mechanism record (:mod:`ggml_bridge.runtime.mechanisms`)
BRIDGE_VALUES = dict(mechanisms.BRIDGE.words)
BATCHED_VALUES = dict(mechanisms.BATCHED.words)
BRIDGE_ASKS = mechanisms.BRIDGE.asks
BATCHED_ASKS = mechanisms.BATCHED.asks
#: ``GGML_CUDA_ALLREDUCE`` words (upstream's values)
ALLREDUCE_VALUES = dict(mechanisms.ALLREDUCE.words)


#: what the patched build takes in its selectors (patch 0001's parser: 0, 1, auto, force, or 1 / auto with GPU pairs
#: not to trust; patch 0003's: 0 or 1); anything else it ignores with a warning, and the mechanism stays off
#: (the values from the mechanism record; the GPU pairs belong to modes 1 and auto)
_BRIDGE_RE = re.compile("(" + "|".join(map(re.escape, BRIDGE_VALUES.values())) + r"|(1|auto):\d+-\d+(,\d+-\d+)*)")
_BATCHED_RE = re.compile("|".join(map(re.escape, BATCHED_VALUES.values())))
#: llama-server's own switch of batching (patch 0003), after ``--``, and its environment variable
BATCHED_FLAGS = {"--batched-transfers": True, "--no-batched-transfers": False}
BATCHED_ARG_ENV = "LLAMA_ARG_BATCHED_TRANSFERS"


def check_selector_env(environ: Mapping[str, str], given: Selectors) -> None:
    """UsageError for a selector variable of the environment that the build would ignore (a typo leaves the
    mechanism off without a word on a build without it), unless the option that sets it (``--bridge``,
    ``--batched``) is given and replaces it."""
    checks = (
        (BRIDGE, _BRIDGE_RE, given.bridge, "0, 1, auto or force; 1 or auto may list GPU pairs not to trust: auto:0-1"),
        (BATCHED, _BATCHED_RE, given.batched, "0 or 1"),
    )
    for var, grammar, option, takes in checks:
        value = environ.get(var)
        if value is None or option is not None or (grammar.fullmatch(value) and _pairs_ok(value)):
            continue
        raise UsageError(
            f"{var}={value!r} in the environment is not a value the build takes",
            why=f"it takes {takes}; it would ignore this one and leave the mechanism off",
            fix=f"fix or unset {var}, or pass serve's --{'bridge' if var == BRIDGE else 'batched'}",
        )


def _pairs_ok(value: str) -> bool:
    """The GPU pairs of ``auto:0-1,2-3``: two different GPUs each, below ggml-cuda's GGML_CUDA_MAX_DEVICES (16)."""
    _, _, pairs = value.partition(":")
    for pair in filter(None, pairs.split(",")):
        a, b = (int(x) for x in pair.split("-"))
        if a == b or max(a, b) >= 16:
            return False
    return True


def check_batched_args(given: Selectors, server_args: Sequence[str], environ: Mapping[str, str]) -> None:
    """UsageError when serve's ``--batched`` and llama-server's own switch of batching after ``--`` (or its
    environment variable) say opposite things: the server would follow its own, against what serve proves."""
    if given.batched is None:
        return
    want = given.batched == "on"
    theirs = [(a, on) for a in server_args if (on := BATCHED_FLAGS.get(a)) is not None]
    value = environ.get(BATCHED_ARG_ENV, "").strip().lower()
    if value:
        theirs.append((f"{BATCHED_ARG_ENV}={value}", value in ("1", "true", "on", "enabled")))
    for words, on in theirs:
        if on != want:
            raise UsageError(
                f"--batched {given.batched} contradicts llama-server's {words}",
                why="llama-server would follow its own switch",
                fix=f"give one of them: --batched {given.batched} alone, or drop --batched",
            )


# --- build backends ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str
    cuda: bool  # GGML_CUDA=ON (nvcc and cuBLAS needed)
    vulkan: bool  # GGML_VULKAN=ON (Vulkan headers, loader, glslc and SPIRV-Headers needed)
    about: str


#: What ``build --backend`` compiles (``auto`` is resolved to cpu or cuda by the toolchain, never to vulkan). The CPU
#: backend is in every build. ``cuda-vulkan``: both GPU backends in one build, so that one model can be split over a
#: CUDA and a Vulkan device (a rig of an NVIDIA card and an AMD or Intel one).
BACKENDS: dict[str, Backend] = by_name(
    Backend("cpu", False, False, "ggml's CPU backend only"),
    Backend("cuda", True, False, "ggml-cuda"),
    Backend("vulkan", False, True, "ggml-vulkan"),
    Backend("cuda-vulkan", True, True, "ggml-cuda and ggml-vulkan in one build (a model split over both)"),
)


def backend(name: str) -> Backend:
    """The build backend called ``name``; a UsageError naming the known ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}", fix=f"use one of: auto, {', '.join(BACKENDS)}") from None


# --- build variants ---------------------------------------------------------------------------------------

#: The variant names (the keys of :data:`VARIANTS`).
PATCHED, UPSTREAM, UPSTREAM_NOPEER = "patched", "upstream", "upstream-nopeer"
UPSTREAM_NOPEER_VIRTUAL = "upstream-nopeer-virtual"


@dataclass(frozen=True)
class Variant:
    name: str
    patched: bool  # our series applied
    cmake: Mapping[str, str]  # CMake options the variant adds (every variant adds -DGGML_RPC=ON)
    subdir: str  # its folder under bench's --variants-dir
    about: str
    cuda_only: bool = False  # exists only for the CUDA backend
    test_patches: str | None = None
    """A test-only series (a folder under patches/) applied to the upstream tree instead of ours: a baseline that is
    not upstream's build, said in its manifest (``test_only``); never with ``patched``."""


#: Every build variant, in the order a shared tree builds them (``build --shared-tree``): the upstream sources
#: first, the no-peer recompile of one object, then the series on top.
VARIANTS: dict[str, Variant] = by_name(
    Variant(UPSTREAM, False, {}, "upstream", "no patches: the reference for 'the patches change nothing'"),
    Variant(
        UPSTREAM_NOPEER,
        False,
        {"GGML_CUDA_NO_PEER_COPY": "ON"},
        "nopeer",
        "no patches, GGML_CUDA_NO_PEER_COPY (synchronous copy through malloc; CUDA only)",
        cuda_only=True,
    ),
    Variant(
        UPSTREAM_NOPEER_VIRTUAL,
        False,
        {"GGML_CUDA_NO_PEER_COPY": "ON"},
        "nopeer-virtual",
        "TEST-ONLY baseline: upstream + patches/baseline/nopeer-virtual + GGML_CUDA_NO_PEER_COPY, in which distinct "
        "virtual devices (GGML_CUDA_DEVICES) count as distinct GPUs without peer access (their copies take upstream's "
        "host path); CUDA only",
        cuda_only=True,
        test_patches="baseline/nopeer-virtual",
    ),
    Variant(
        PATCHED,
        True,
        {BRIDGE: "ON", BATCHED_CMAKE: "ON"},
        "patched",
        "our series applied, both mechanisms compiled in",
    ),
)


def variant(name: str | Variant, where: str = "") -> Variant:
    """The build variant called ``name`` (a variant already looked up is itself); a UsageError naming the known ones
    otherwise."""
    if isinstance(name, Variant):
        return name
    try:
        return VARIANTS[name]
    except KeyError:
        at = f" ({where})" if where else ""
        raise UsageError(f"unknown variant {name!r}{at}", fix=f"use one of: {', '.join(VARIANTS)}") from None


def check_backend(v: Variant, backend: str, fix: str) -> None:
    """A CUDA-only variant on another backend is a UsageError."""
    if v.cuda_only and not (backend in BACKENDS and BACKENDS[backend].cuda):
        raise UsageError(f"variant {v.name} only exists for the CUDA backend", why=f"the backend is {backend}", fix=fix)


#: the test-only baseline's butterfly (upstream-nopeer-virtual): its exchanges through upstream's host path
NOPEER_VIRTUAL_TENSOR = "TEST-ONLY baseline, -sm tensor, butterfly through upstream's host path between virtual devices"

# --- modes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    name: str
    variant: str  # a VARIANTS key
    bridge: str | None  # a BRIDGE_VALUES key; None: unset
    batched: str | None  # a BATCHED_VALUES key; None: unset
    about: str
    p2p: bool = False  # GGML_CUDA_P2P=1
    rejected: tuple[tuple[str, str], ...] = ()  # invalid selector values every process must report rejected
    rpc: bool = False  # the model on local ggml-rpc-servers (they get GPUs and selectors)
    devices: int | None = None  # GPUs of this mode, instead of the rung's (ladder)
    link: str | None = None  # rpc modes in the bench: a shaped link RATE/DELAY (netbench.py)
    split: str | None = None  # llama.cpp -sm of this mode instead of the rung's / suite's ("tensor")
    allreduce: str | None = None  # GGML_CUDA_ALLREDUCE word (ALLREDUCE_VALUES); None: the rung's, else unset
    ar_bf16_threshold: str | None = None  # GGML_CUDA_AR_BF16_THRESHOLD ("0": the internal path reduces F32 exactly)

    @property
    def selectors(self) -> Selectors:
        return Selectors(self.bridge, self.batched)

    @property
    def uses_bridge(self) -> bool:
        return self.selectors.asks_bridge

    @property
    def uses_batched(self) -> bool:
        return self.selectors.asks_batched

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """Which mechanisms must prove that they engaged: ``()``, ``("bridge",)``, ``("batched",)`` or both."""
        return self.selectors.mechanisms

    def env(self) -> dict[str, str]:
        """The mode's environment: selectors for a patched variant, GGML_CUDA_P2P for the *-p2p modes, upstream's
        all-reduce variables for the tensor modes, and the rejected values of a typo mode."""
        env = {CUDA_P2P: "1"} if self.p2p else {}
        if self.allreduce is not None:
            env[ALLREDUCE] = ALLREDUCE_VALUES[self.allreduce]
        if self.ar_bf16_threshold is not None:
            env[AR_BF16_THRESHOLD] = self.ar_bf16_threshold
        if VARIANTS[self.variant].patched:
            env.update(selector_env(self.bridge, self.batched))
        return {**env, **dict(self.rejected)}


MODES: dict[str, Mode] = by_name(
    Mode(
        "upstream",
        "upstream",
        None,
        None,
        "upstream build (on GPUs: cudaMemcpyPeerAsync without peer access, driver-staged)",
    ),
    Mode("upstream-p2p", "upstream", None, None, "upstream build, peer access enabled (NVLink / PCIe P2P)", p2p=True),
    Mode(
        "upstream-nopeer",
        "upstream-nopeer",
        None,
        None,
        "upstream GGML_CUDA_NO_PEER_COPY build (synchronous copy through malloc between physical GPUs; between "
        "virtual devices of one GPU still device to device: there use upstream-nopeer-virtual)",
    ),
    Mode("off", "patched", "off", "off", "patched build, selectors 0"),
    Mode(
        "off-p2p",
        "patched",
        "off",
        "off",
        "patched build, selectors 0, peer access enabled: upstream's P2P path in our binary (a control)",
        p2p=True,
    ),
    Mode(
        "off-1gpu",
        "patched",
        "off",
        "off",
        "patched build, selectors 0, on one GPU whatever the rung's devices",
        devices=1,
    ),
    Mode("bridge", "patched", "auto", "off", "patched, GGML_CUDA_MAPPED_HOST_BRIDGE=auto (peer access not enabled)"),
    Mode("bridge-force", "patched", "force", "off", "patched, GGML_CUDA_MAPPED_HOST_BRIDGE=force"),
    Mode(
        "bridge-force-p2p",
        "patched",
        "force",
        "off",
        "patched, GGML_CUDA_MAPPED_HOST_BRIDGE=force with peer access enabled",
        p2p=True,
    ),
    Mode("batched", "patched", "off", "on", "patched, LLAMA_BATCHED_TRANSFERS=1"),
    Mode(
        "bridge-batched",
        "patched",
        "auto",
        "on",
        "patched, GGML_CUDA_MAPPED_HOST_BRIDGE=auto and LLAMA_BATCHED_TRANSFERS=1",
    ),
    Mode(
        "bridge-force-batched",
        "patched",
        "force",
        "on",
        "patched, GGML_CUDA_MAPPED_HOST_BRIDGE=force and LLAMA_BATCHED_TRANSFERS=1",
    ),
    # typos: the bridge stays off and says so in every process, also past llama.cpp's fitting probe (-fit)
    Mode("bridge-typo", "patched", None, "off", f"patched, invalid {BRIDGE}=yes", rejected=((BRIDGE, "yes"),)),
    Mode(
        "rpc-upstream",
        "upstream",
        None,
        None,
        "upstream rpc-server(s) (one owning every GPU: server-side cudaMemcpyPeer without peer access)",
        rpc=True,
    ),
    Mode("rpc-upstream-nopeer", "upstream-nopeer", None, None, "upstream GGML_CUDA_NO_PEER_COPY rpc-server", rpc=True),
    Mode("rpc-off", "patched", "off", "off", "patched rpc-server(s), selectors 0", rpc=True),
    Mode(
        "rpc-bridge",
        "patched",
        "auto",
        "off",
        "patched rpc-server(s), GGML_CUDA_MAPPED_HOST_BRIDGE=auto: copies between a server's GPUs through the bridge",
        rpc=True,
    ),
    Mode(
        "rpc-bridge-force",
        "patched",
        "force",
        "off",
        "patched rpc-server(s), GGML_CUDA_MAPPED_HOST_BRIDGE=force: also between virtual devices of one GPU",
        rpc=True,
    ),
)


#: -sm tensor (docs/tensor.md): the same builds and selectors, split by the meta backend, with the all-reduce named
#: (``-internal``: upstream's host-staged pipeline, exactly 2 devices; ``-allreduce-bridge`` / ``-butterfly``: patch
#: 0007's values; otherwise ``none``: upstream's butterfly, whose exchanges are cross-device copies, or in the patched
#: build the bridge's all-reduce where the bridge takes it)
def _tensor(name: str, variant: str, bridge: str | None, batched: str | None, allreduce: str, about: str) -> Mode:
    return Mode(name, variant, bridge, batched, about, split="tensor", allreduce=allreduce)


TENSOR_MODES: dict[str, Mode] = by_name(
    _tensor("tensor-upstream", UPSTREAM, None, None, "none", "upstream, -sm tensor, its butterfly"),
    _tensor("tensor-upstream-internal", UPSTREAM, None, None, "internal", "upstream, -sm tensor, internal (BF16)"),
    dataclasses.replace(
        _tensor("tensor-upstream-internal-f32", UPSTREAM, None, None, "internal", "upstream, internal in F32"),
        ar_bf16_threshold="0",
    ),
    _tensor("tensor-nopeer-virtual", UPSTREAM_NOPEER_VIRTUAL, None, None, "none", NOPEER_VIRTUAL_TENSOR),
    _tensor(
        "tensor-nopeer-virtual-aa", UPSTREAM_NOPEER_VIRTUAL, None, None, "none", NOPEER_VIRTUAL_TENSOR + ", again (A/A)"
    ),
    _tensor("tensor-off", PATCHED, "off", "off", "none", "patched, selectors 0, -sm tensor, butterfly"),
    _tensor("tensor-off-internal", PATCHED, "off", "off", "internal", "patched, selectors 0, internal all-reduce"),
    _tensor("tensor-bridge", PATCHED, "auto", "off", "none", "patched, bridge auto, -sm tensor"),
    _tensor("tensor-bridge-force", PATCHED, "force", "off", "none", "patched, bridge forced: its all-reduce (0007)"),
    _tensor("tensor-batched", PATCHED, "off", "on", "none", "patched, batching, -sm tensor, butterfly"),
    _tensor("tensor-bridge-force-batched", PATCHED, "force", "on", "none", "patched, bridge forced and batching"),
    _tensor("tensor-bridge-force-internal", PATCHED, "force", "off", "internal", "patched, bridge forced, internal"),
    _tensor("tensor-allreduce-bridge", PATCHED, "off", "off", "bridge", "patched, GGML_CUDA_ALLREDUCE=bridge (0007)"),
    _tensor(
        "tensor-bridge-force-butterfly",
        PATCHED,
        "force",
        "off",
        "butterfly",
        "patched, bridge forced, GGML_CUDA_ALLREDUCE=butterfly: the butterfly's exchanges through the bridge's copies",
    ),
)
#: layer split against the test-only no-peer baseline on virtual devices (docs/tensor.md)
BASELINE_MODES: dict[str, Mode] = by_name(
    Mode(
        "upstream-nopeer-virtual",
        UPSTREAM_NOPEER_VIRTUAL,
        None,
        None,
        "TEST-ONLY baseline: layer split, copies between virtual devices through upstream's host path",
    ),
)
MODES.update(TENSOR_MODES)
MODES.update(BASELINE_MODES)

#: ``auto`` leaves virtual devices of one GPU (GGML_CUDA_DEVICES) on upstream's device-local copy: a bench of such
#: devices measures these cases forced, or it would measure nothing of the bridge
FORCED_ON_VIRTUAL: dict[str, str] = {
    "bridge": "bridge-force",
    "bridge-batched": "bridge-force-batched",
    "rpc-bridge": "rpc-bridge-force",
    "tensor-bridge": "tensor-bridge-force",
}


def baseline(mode: Mode) -> Mode | None:
    """What a mode with batching on is measured against: the same mode with batching off (same build, bridge
    setting, peer access and rpc servers), e.g. ``off`` for ``batched``, ``bridge-force`` for
    ``bridge-force-batched``; None for a mode without batching, or when the table has no such mode."""
    if not mode.uses_batched:
        return None
    for m in MODES.values():
        same = (m.variant, m.bridge, m.p2p, m.rpc, m.devices, m.split, m.allreduce) == (
            mode.variant,
            mode.bridge,
            mode.p2p,
            mode.rpc,
            mode.devices,
            mode.split,
            mode.allreduce,
        )
        if same and m.batched == "off" and not m.rejected:
            return m
    return None


#: older names -> current ones (accepted with a deprecation note)
ALIASES: dict[str, str] = {
    "p2p": "upstream-p2p",
    "staged": "upstream",
    "nopeer": "upstream-nopeer",
    "upstream-cpu": "upstream",
    "p2p-patched": "off-p2p",
    "rpc-staged": "rpc-upstream",
    "rpc-nopeer": "rpc-upstream-nopeer",
}
#: older names that meant different things in different tables: refused, naming the candidates
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "both": ("bridge-force-batched", "bridge-batched"),
}


def lookup(name: str, where: str = "") -> Mode:
    """The mode called ``name`` (or an older alias of it, with a deprecation note); UsageError otherwise."""
    if name in MODES:
        return MODES[name]
    at = f" ({where})" if where else ""
    if name in ALIASES:
        log(f"    warning{at}: mode {name!r} is deprecated, it is now called {ALIASES[name]!r}")
        return MODES[ALIASES[name]]
    if name in AMBIGUOUS:
        options = " or ".join(f"{n!r} ({MODES[n].about})" for n in AMBIGUOUS[name])
        raise UsageError(
            f"mode {name!r}{at} is no longer accepted",
            why="it meant bridge=force with batching in the ladder and bridge=1 in the bench",
            fix=f"use {options}",
        )
    raise UsageError(f"unknown mode {name!r}{at}", fix=f"modes: {', '.join(MODES)}")


def canonical(name: str, where: str = "") -> str:
    return lookup(name, where).name
