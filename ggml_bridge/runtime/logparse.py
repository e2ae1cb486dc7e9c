"""Every regex the launcher and the ladder apply to llama.cpp log text lives here.

The bridge and batched-transfer lines are the contract with the C++ patches (docs/DESIGN.md);
the rest are upstream llama-server / llama.cpp lines used to explain start-up failures and to count
the devices a model was placed on. Lines may carry a timestamp/level prefix or ANSI colours, so every
pattern is searched, not anchored at the start of the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from . import mechanisms
from .mechanisms import ALLREDUCE_PATHS
from .mechanisms import BATCHED as BATCHED_RECORD
from .mechanisms import BRIDGE as BRIDGE_RECORD

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# --- contract: mapped pinned host bridge (CUDA backend, GGML log) -------------------------------------
BRIDGE = BRIDGE_RECORD.log_tag
#: the modes the enabled line may report: the values of the words that ask for the bridge (the mechanism record)
BRIDGE_ENABLED = re.compile(
    BRIDGE
    + r": enabled \(mode (?P<mode>"
    + "|".join(re.escape(v) for v in BRIDGE_RECORD.asked_values)
    + r")\), (?P<slots>\d+) slots x (?P<slot_mib>\d+) MiB\b"
)
BRIDGE_INACTIVE = re.compile(BRIDGE + r": inactive: (?P<reason>.*?)\s*$")
#: the bridge's selector (GGML_CUDA_MAPPED_HOST_BRIDGE; the series before issue 26 had ..._CHUNK_KIB and others)
BRIDGE_INVALID = re.compile(
    BRIDGE + r': ignoring invalid (?P<var>' + BRIDGE_RECORD.selector + r'\w*)="(?P<value>[^"]*)"'
)
BRIDGE_STATS = re.compile(BRIDGE + r": stats: (?P<kv>(?:\s*\w+=\d+)+)")
BRIDGE_STATS_KEYS = BRIDGE_RECORD.stats_keys
#: one line per pair of GPUs and set of backends: the bridge or upstream's copy, and why
BRIDGE_PAIR = re.compile(
    BRIDGE + r": GPU (?P<src>\d+) -> GPU (?P<dst>\d+): (?P<route>bridge|upstream) \((?P<why>[^)]*)\)"
)

# --- contract: batched pinned graph I/O transfers (llama context, LLAMA log) --------------------------
BATCHED = BATCHED_RECORD.log_tag
BATCHED_ENABLED = re.compile(
    BATCHED + r": enabled, pinned pool up to (?P<pool_mib>\d+) MiB\b"
    r"(?: per process, split inputs in host memory up to (?P<stage_max>\d+) bytes staged)?"
    r"(?:.*\(selected by (?P<selector>\w+)=1\b)?"
)
BATCHED_INACTIVE = re.compile(BATCHED + r": inactive: (?P<reason>.*?)\s*$")
#: after the enabled line: each backend's pinned pool (its host buffer type) or why it has none, ``; ``-separated:
#: ``Vulkan0: pool Vulkan_Host; Vulkan1: none (its pinned host buffer type is pinned for Vulkan0); CPU: none (..)``
BATCHED_POOLS = re.compile(BATCHED + r": pools: (?P<pools>.*?)\s*$")
BATCHED_POOL_ITEM = re.compile(r"^(?P<backend>[^:;]+): (?:pool (?P<buft>\S+)|none \((?P<why>.*)\))$")
# async_* count only what batching staged, sync_* what it could not stage (fallbacks), upstream_* what it left on
# upstream's path by design (inputs over the stage limit, inputs already on a device, downloads upstream already
# makes asynchronously): a line without that split (an older patch) is not taken as batching's stats
BATCHED_STATS_KEYS = BATCHED_RECORD.stats_keys
#: the splits the rule per split kept on upstream's copies (after pool_drains; a series before 2026-12-03 lacks them)
BATCHED_STATS_SPLIT_KEYS = ("large_splits", "later_splits")
# (the keys of the series before 2026-12-03 are parsed too: declined_graphs after graphs, probe_graphs,
# classes_staged and classes_upstream at the end, from its measuring policy)
BATCHED_STATS = re.compile(
    BATCHED
    + r": stats: (?P<kv>graphs=\d+(?: declined_graphs=\d+)? "
    + " ".join(rf"{k}=\d+" for k in BATCHED_STATS_KEYS[1:])
    + r"(?: \w+=\d+)*)"
)

_KV = re.compile(r"(\w+)=(\d+)")

# --- contract: llama-server /metrics (patch 0005): llamacpp:bridge_<name>_total, llamacpp:batched_<name>_total ----
METRIC_LINE = re.compile(
    r"^llamacpp:(?P<name>(?:"
    + "|".join(m.name for m in mechanisms.SERIES if m.metrics)
    + r")_\w+_total)\s+(?P<value>[0-9.eE+-]+)\s*$"
)


def parse_metrics(text: str) -> dict[str, int]:
    """The transfer counters of a Prometheus /metrics page, keyed ``batched_async_uploads_total`` etc."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if m := METRIC_LINE.match(line.strip()):
            out[m["name"]] = int(float(m["value"]))
    return out


# --- upstream: -sm tensor's all-reduce (ggml-cuda.cu ggml_backend_cuda_comm_init, ggml-cuda/allreduce.cu) ------
#: the internal pipeline is up (INFO): the path for this Meta device is upstream's host-staged all-reduce
AR_INTERNAL_READY = re.compile(r"initialized AllReduce pipeline: (?P<n>\d+) GPUs")
#: the internal pipeline could not start (any device count but 2): the butterfly takes over (WARN)
AR_INTERNAL_FAILED = re.compile(r"internal AllReduce init failed .*falling back to meta-backend butterfly")
#: NCCL refused or missing: internal is tried next (WARN)
AR_NCCL_FALLBACK = re.compile(
    r"(?P<why>NCCL not compiled in|NCCL disabled: virtual devices in use|NCCL init failed \([^)]*\))"
    r"; falling back to internal AllReduce"
)
#: an unknown GGML_CUDA_ALLREDUCE value: the butterfly (WARN)
AR_UNKNOWN = re.compile(r"unknown " + mechanisms.ALLREDUCE.selector + r" value: (?P<value>\S*)")
#: patch 0007: the bridge's all-reduce for a group of devices (INFO; WARN where GGML_CUDA_ALLREDUCE=bridge asked
#: and it could not), and its counts at teardown
BRIDGE_AR = mechanisms.ALLREDUCE.log_tag
BRIDGE_AR_ENABLED = re.compile(BRIDGE_AR + r": enabled for (?P<n>\d+) devices \((?P<why>[^)]*)\)")
BRIDGE_AR_INACTIVE = re.compile(BRIDGE_AR + r": inactive(?: for (?P<n>\d+) devices)?:? \(?(?P<why>[^;)]*)")
BRIDGE_AR_STATS = re.compile(BRIDGE_AR + r": stats: (?P<kv>(?:\s*\w+=\d+)+)")
#: the meta backend cannot split an op this way (e.g. a CUDA build with a head size flash attention lacks)
TENSOR_SPLIT_ABORT = re.compile(r"(?P<what>unsupported mul_mat split states: .*|ggml op not implemented: .*)$")
#: llama.cpp turns flash attention on for -sm tensor (it needs it)
TENSOR_NEEDS_FA = re.compile(r"SPLIT_MODE_TENSOR requires flash_attn to be enabled")

# --- upstream llama.cpp / llama-server lines ----------------------------------------------------------
#: llama.cpp: each device a model is placed on
USING_DEVICE = re.compile(r"using device (?P<dev>\S+) \((?P<desc>[^)]*)\)")
#: -sm tensor: the model sits on one "Meta" device made of several (llama.cpp's llama_prepare_model_devices)
META_DEVICE = re.compile(r"creating a Meta device (?:for tensor parallelism from|with) (?P<n>\d+) devices")
#: ggml-cuda: how many CUDA devices (physical, or virtual with GGML_CUDA_DEVICES) the process sees
CUDA_FOUND = re.compile(r"ggml_cuda_init: found (?P<n>\d+) CUDA devices")
#: ggml-cuda: a CUDA build that sees no GPU (e.g. started with CUDA_VISIBLE_DEVICES=): upstream's error line
CUDA_INIT_FAILED = re.compile(r"failed to initialize CUDA: (?P<why>.+)")
#: llama-server: the port is taken (serve retries on another)
BIND_FAILED = re.compile(r"couldn't bind HTTP server socket, hostname: (?P<host>\S+), port: (?P<port>\d+)")
#: the model file cannot be opened, and why
GGUF_OPEN_FAILED = re.compile(r"failed to open GGUF file '(?P<path>[^']*)' \((?P<why>[^)]*)\)")
#: the loader's own reason, when it gives one
MODEL_LOAD_ERROR = re.compile(r"error loading model: (?P<why>.*?)\s*$")
#: the model did not load (with or without a reason)
MODEL_LOAD_FAILED = re.compile(r"failed to load model|exiting due to model loading error")
#: llama-server gave up on its HTTP server
HTTP_ERROR_EXIT = re.compile(r"exiting due to HTTP server error")
#: llama-server is ready: the address it listens on
LISTENING = re.compile(r"(?:server is listening on|listening on) (?P<addr>\S+)")
#: the model is loaded (server-side)
MODEL_LOADED = re.compile(r"\bmodel loaded\b")
#: out of memory on a device or in a pinned allocation
OOM = re.compile(r"out of memory|failed to allocate|cudaMalloc failed", re.I)
#: a crash: ggml assertion or abort, segfault, uncaught C++ exception
ASSERT = re.compile(r"GGML_ASSERT|GGML_ABORT|Segmentation fault|terminate called", re.I)
#: llama-perplexity: how many chunks of how many tokens it evaluates
PERPLEXITY_CHUNKS = re.compile(r"calculating perplexity over (?P<chunks>\d+) chunks, n_ctx=(?P<n_ctx>\d+)")


def perplexity_chunks(text: str) -> tuple[int, int] | None:
    """(chunks, tokens per chunk) of llama-perplexity's "calculating perplexity over N chunks, n_ctx=C" line."""
    m = PERPLEXITY_CHUNKS.search(text)
    return (int(m["chunks"]), int(m["n_ctx"])) if m else None


def clean(line: str) -> str:
    return ANSI.sub("", line).rstrip("\r\n")


def tail(text: str, n: int = 15) -> list[str]:
    """The last ``n`` lines of a process's output, cleaned (:func:`clean`): what a report keeps of a run."""
    return [clean(x) for x in text.splitlines()[-n:]]


def _kv(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in _KV.findall(text)}


@dataclass
class BridgeInfo:
    enabled: bool = False
    mode: str | None = None  # "1", "auto" or "force"
    slots: int | None = None
    slot_mib: int | None = None
    inactive_reason: str | None = None
    rejected: dict[str, str] = field(default_factory=dict)  # every rejected bridge selector -> its value
    enabled_lines: int = 0  # one per set of CUDA backends
    stats: list[dict[str, int]] = field(default_factory=list)
    pairs: dict[tuple[int, int], str] = field(default_factory=dict)  # (src GPU, dst GPU) -> "bridge" | "upstream"

    @property
    def seen(self) -> bool:
        return self.enabled or self.inactive_reason is not None or bool(self.rejected)

    def total(self, key: str) -> int:
        return sum(s.get(key, 0) for s in self.stats)


@dataclass
class BatchedInfo:
    enabled: bool = False
    pool_mib: int | None = None
    stage_max: int | None = None  # split inputs in host memory of up to this many bytes are staged
    selector: str | None = None  # the variable that enabled it, when the line names one (SAM3D_BATCHED_TRANSFERS)
    inactive_reason: str | None = None
    enabled_lines: int = 0
    stats: list[dict[str, int]] = field(default_factory=list)
    pools: dict[str, str] = field(default_factory=dict)
    """Backend name -> its pinned pool's host buffer type, or ``none (why)`` (the ``pools:`` line; last wins)."""

    @property
    def seen(self) -> bool:
        return self.enabled or self.inactive_reason is not None

    def total(self, key: str) -> int:
        return sum(s.get(key, 0) for s in self.stats)


@dataclass
class AllReduceInfo:
    """What upstream printed about -sm tensor's all-reduce (it has no line of its own for the butterfly)."""

    internal_ready: list[int] = field(default_factory=list)  # GPUs of each internal pipeline started
    internal_failed: int = 0  # "internal AllReduce init failed ... butterfly" lines
    nccl_fallbacks: list[str] = field(default_factory=list)  # why NCCL was not used, per line
    unknown_value: str | None = None
    bridge_enabled: list[str] = field(default_factory=list)  # patch 0007: why, per group it took
    bridge_inactive: list[str] = field(default_factory=list)  # patch 0007: why not, per group it said so
    bridge_stats: list[dict[str, int]] = field(default_factory=list)

    @property
    def path(self) -> str | None:
        """The path the lines name: ``internal``, ``bridge`` (patch 0007's), ``butterfly`` (a fallback, an unknown
        value or the bridge's all-reduce inactive said so), or None (nothing said: ``none`` asked in upstream's
        build, or no -sm tensor)."""
        if self.internal_ready:
            return ALLREDUCE_PATHS["internal"].name
        if self.bridge_enabled:
            return ALLREDUCE_PATHS["bridge"].name
        if self.internal_failed or self.unknown_value is not None or self.bridge_inactive:
            return ALLREDUCE_PATHS["butterfly"].name
        return None


@dataclass
class LogInfo:
    bridge: BridgeInfo = field(default_factory=BridgeInfo)
    batched: BatchedInfo = field(default_factory=BatchedInfo)
    allreduce: AllReduceInfo = field(default_factory=AllReduceInfo)
    tensor_abort: str | None = None  # the meta backend's abort (-sm tensor on a shape it cannot split)
    devices: list[str] = field(default_factory=list)  # "using device" lines, in order
    meta_devices: int = 0  # -sm tensor: devices behind the Meta device
    cuda_found: int | None = None
    cuda_init_failed: str | None = None  # why a CUDA build found no GPU ("no CUDA-capable device is detected")
    bind_failed: tuple[str, int] | None = None
    gguf_open_failed: tuple[str, str] | None = None
    model_error: str | None = None
    model_load_failed: bool = False
    http_error: bool = False
    listening: str | None = None
    model_loaded: bool = False
    oom_lines: list[str] = field(default_factory=list)
    crash_lines: list[str] = field(default_factory=list)

    @property
    def n_devices(self) -> int:
        """Distinct devices the model was placed on (0: CPU only or not known); a Meta device (-sm tensor)
        counts as the devices it is made of."""
        if self.meta_devices:
            return self.meta_devices + len(dict.fromkeys(d for d in self.devices if not d.startswith("Meta(")))
        return len(dict.fromkeys(self.devices))


def parse_pools(text: str) -> dict[str, str]:
    """``Vulkan0: pool Vulkan_Host; CPU: none (computes in host memory)`` -> ``{"Vulkan0": "Vulkan_Host", "CPU":
    "none (computes in host memory)"}``; an item of another form is kept whole under its text."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split("; ") if x.strip()):
        m = BATCHED_POOL_ITEM.match(item)
        if m is None:
            out[item] = "?"
        elif m["buft"]:
            out[m["backend"]] = m["buft"]
        else:
            out[m["backend"]] = f"none ({m['why']})"
    return out


def parse(lines: Iterable[str] | str) -> LogInfo:
    """Parse llama.cpp log text (a string or lines) into a :class:`LogInfo`."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    info = LogInfo()
    for raw in lines:
        line = clean(raw)
        if BRIDGE in line:
            b = info.bridge
            if m := BRIDGE_ENABLED.search(line):
                b.enabled = True
                b.enabled_lines += 1
                b.mode, b.slots, b.slot_mib = m["mode"], int(m["slots"]), int(m["slot_mib"])
            elif m := BRIDGE_STATS.search(line):
                b.stats.append(_kv(m["kv"]))
            elif m := BRIDGE_INVALID.search(line):
                b.rejected[m["var"]] = m["value"]
            elif m := BRIDGE_PAIR.search(line):
                b.pairs[(int(m["src"]), int(m["dst"]))] = m["route"]
            elif m := BRIDGE_INACTIVE.search(line):
                b.inactive_reason = m["reason"]
            continue
        if BATCHED in line:
            t = info.batched
            if m := BATCHED_ENABLED.search(line):
                t.enabled = True
                t.enabled_lines += 1
                t.pool_mib = int(m["pool_mib"])
                t.stage_max = int(m["stage_max"]) if m["stage_max"] else None
                t.selector = m["selector"]
            elif m := BATCHED_STATS.search(line):
                t.stats.append(_kv(m["kv"]))
            elif m := BATCHED_POOLS.search(line):
                t.pools = parse_pools(m["pools"])
            elif m := BATCHED_INACTIVE.search(line):
                t.inactive_reason = m["reason"]
            continue
        if _parse_allreduce(info, line):
            continue
        if m := USING_DEVICE.search(line):
            info.devices.append(m["dev"])
        elif m := META_DEVICE.search(line):
            info.meta_devices = int(m["n"])
        elif m := CUDA_FOUND.search(line):
            info.cuda_found = int(m["n"])
        elif m := CUDA_INIT_FAILED.search(line):
            info.cuda_init_failed = m["why"].strip()
        elif m := BIND_FAILED.search(line):
            info.bind_failed = (m["host"], int(m["port"]))
        elif m := GGUF_OPEN_FAILED.search(line):
            info.gguf_open_failed = (m["path"], m["why"])
        elif m := MODEL_LOAD_ERROR.search(line):
            info.model_error = info.model_error or m["why"]
        elif MODEL_LOAD_FAILED.search(line):
            info.model_load_failed = True
        elif HTTP_ERROR_EXIT.search(line):
            info.http_error = True
        elif m := LISTENING.search(line):
            info.listening = m["addr"]
        elif MODEL_LOADED.search(line):
            info.model_loaded = True
        if OOM.search(line):
            info.oom_lines.append(line.strip())
        if ASSERT.search(line):
            info.crash_lines.append(line.strip())
    return info


def _parse_allreduce(info: LogInfo, line: str) -> bool:
    """The all-reduce's and the meta backend's lines (True: the line was one)."""
    ar = info.allreduce
    if BRIDGE_AR in line:
        if m := BRIDGE_AR_ENABLED.search(line):
            ar.bridge_enabled.append(m["why"])
        elif m := BRIDGE_AR_STATS.search(line):
            ar.bridge_stats.append(_kv(m["kv"]))
        elif m := BRIDGE_AR_INACTIVE.search(line):
            ar.bridge_inactive.append(m["why"].strip())
        return True
    if m := AR_INTERNAL_READY.search(line):
        ar.internal_ready.append(int(m["n"]))
    elif AR_INTERNAL_FAILED.search(line):
        ar.internal_failed += 1
    elif m := AR_NCCL_FALLBACK.search(line):
        ar.nccl_fallbacks.append(m["why"])
    elif m := AR_UNKNOWN.search(line):
        ar.unknown_value = m["value"]
    elif m := TENSOR_SPLIT_ABORT.search(line):
        info.tensor_abort = info.tensor_abort or m["what"].strip()
        info.crash_lines.append(line.strip())
    else:
        return False
    return True


def exit_reason(info: LogInfo, rc: int | None, when: str = "during start-up") -> str:
    """One sentence saying why a server that exited ``when`` (during start-up, or while serving a request) failed."""
    if info.bind_failed:
        host, port = info.bind_failed
        return (
            f"port {port} on {host} is already in use, or {host} is not an address of this machine (llama-server "
            "could not bind its HTTP socket)"
        )
    if info.http_error and not info.model_load_failed:
        return "llama-server could not start its HTTP server (address in use or not available)"
    if info.gguf_open_failed:
        path, why = info.gguf_open_failed
        return f"llama-server could not open the model file {path} ({why})"
    if info.model_error:
        return f"llama-server failed to load the model: {info.model_error}"
    if info.model_load_failed:
        return "llama-server failed to load the model"
    if info.tensor_abort:
        return f"llama-server aborted {when}: -sm tensor cannot split this model: {info.tensor_abort}"
    if info.oom_lines:
        return f"out of memory {when}: {info.oom_lines[0]}"
    if info.crash_lines:
        return f"llama-server crashed {when}: {info.crash_lines[0]}"
    if rc is None:
        return "llama-server is still running but has not logged that it listens with /health answering 200"
    if rc < 0:
        return f"llama-server was killed by signal {-rc} {when}"
    return f"llama-server exited with status {rc} {when}"


def is_read(line: str) -> bool:
    """Whether :func:`parse` takes anything from ``line``: the launcher keeps only such lines in memory (a
    server at high verbosity prints about a thousand others per request; they go to the log file)."""
    return parse([line]) != LogInfo()


# --- contract: ggml-rpc-server with patch 0006 (its stdout) --------------------------------------------
#: patch 0006's state line, printed once at start
RPC_STATE = re.compile(
    r"ggml_bridge_rpc: state: endpoint=(?P<endpoint>\S+) pid=(?P<pid>\d+) "
    r"GGML_CUDA_MAPPED_HOST_BRIDGE=(?P<selector>\S+) bridge_counters=(?P<counters>available|absent)"
)
#: patch 0006's counters line (on SIGUSR1, periodically with an interval, and at exit)
RPC_COUNTERS = re.compile(r"ggml_bridge_rpc: counters: trigger=(?P<trigger>\w+)(?P<kv>(?:\s+\w+=\d+)+)")
#: upstream rpc-server lines: its banner and each device it serves
RPC_STARTING = re.compile(r"Starting RPC server v(?P<version>\d+\.\d+\.\d+)")
RPC_DEVICE = re.compile(r"^\s+(?P<dev>[A-Za-z]+\d*): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)")


@dataclass
class RpcServerInfo:
    """What one ggml-rpc-server printed: upstream's banner and device list, patch 0006's state and counters,
    and (through :func:`parse`) the bridge's own lines."""

    version: str | None = None
    devices: list[str] = field(default_factory=list)
    state: dict[str, str] | None = None  # patch 0006's start line; None: an upstream rpc-server
    counters: list[dict[str, int]] = field(default_factory=list)  # one per counters line, in order
    bridge: BridgeInfo = field(default_factory=BridgeInfo)

    @property
    def latest(self) -> dict[str, int]:
        return self.counters[-1] if self.counters else {}


def parse_rpc(lines: Iterable[str] | str) -> RpcServerInfo:
    if isinstance(lines, str):
        lines = lines.splitlines()
    lines = [clean(x) for x in lines]
    out = RpcServerInfo(bridge=parse(lines).bridge)
    for line in lines:
        if m := RPC_STARTING.search(line):
            out.version = m["version"]
        elif m := RPC_STATE.search(line):
            out.state = {k: v for k, v in m.groupdict().items()}
        elif m := RPC_COUNTERS.search(line):
            out.counters.append(_kv(m["kv"]))
        elif out.version is not None and (m := RPC_DEVICE.search(line)):
            out.devices.append(m["dev"])
    return out
