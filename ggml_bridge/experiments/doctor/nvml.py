"""The NVIDIA GPUs as NVML sees them, through the ``nvidia-ml-py`` package (module ``pynvml``): name, compute
capability, memory, driver and CUDA versions, the PCIe link (current and maximum generation and width) and the
topology between each pair (nvidia-smi topo -m's PIX/PXB/PHB/NODE/SYS, NVLinks).

:func:`read` takes the module as an argument (``None``: import ``pynvml``), so tests hand it a simulated one. A
machine without the NVIDIA driver (``nvmlInit`` raises ``NVMLError_LibraryNotFound``) or without the package is a
finding, not an error: the report says so and the doctor goes on.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

T = TypeVar("T")
#: the most GPUs one NVML inventory lists (one host has 16 at most today; a count beyond it is a binding's nonsense)
MAX_GPUS = 64

#: usable bandwidth per lane and direction in GB/s, after line coding (NCCL's topology model: width x lane rate)
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

#: NVML_TOPOLOGY_* levels -> nvidia-smi topo -m's name and what it means
TOPOLOGY = {
    0: ("X", "the same board"),
    10: ("PIX", "one PCIe switch"),
    20: ("PXB", "several PCIe switches, no host bridge"),
    30: ("PHB", "a PCIe host bridge (the CPU)"),
    40: ("NODE", "host bridges of one NUMA node"),
    50: ("SYS", "across NUMA nodes (the CPUs' interconnect)"),
}


def link_gbps(gen: int | None, width: int | None) -> float | None:
    """The PCIe link's bandwidth per direction in GB/s (None when unknown)."""
    if not gen or not width or gen not in LANE_GBPS:
        return None
    return LANE_GBPS[gen] * width


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    pci: str  # normalized: "0000:17:00.0", lower case
    uuid: str
    cc: str | None
    memory_total_mib: int | None
    memory_free_mib: int | None
    pcie_gen: int | None  # current (drops at idle on most cards: power management)
    pcie_gen_max: int | None  # what this slot and the GPU can train at
    pcie_width: int | None
    pcie_width_max: int | None

    @property
    def degraded(self) -> bool:
        """Trained below its maximum width (a riser, a slot wired x1): width does not drop at idle, unlike gen."""
        return bool(self.pcie_width and self.pcie_width_max and self.pcie_width < self.pcie_width_max)


@dataclass(frozen=True)
class NvmlPair:
    a: int
    b: int
    topology: str | None  # the PCIe path: "PIX", ... or None (not reported)
    nvlinks: int
    p2p_read: str | None  # NVML's P2P read status: "ok" or why not


@dataclass
class NvmlReport:
    #: ok | no-driver | no-binding | error
    status: str
    detail: str = ""
    driver: str | None = None
    cuda_driver: str | None = None  # "13.0"
    gpus: list[NvmlGpu] = field(default_factory=list)
    pairs: list[NvmlPair] = field(default_factory=list)

    def by_pci(self, pci: str) -> NvmlGpu | None:
        want = normalize_pci(pci)
        return next((g for g in self.gpus if g.pci == want), None)

    def pair(self, a: int, b: int) -> NvmlPair | None:
        return next((p for p in self.pairs if {p.a, p.b} == {a, b}), None)


def normalize_pci(pci: str | bytes) -> str:
    """NVML's ``00000000:17:00.0`` and CUDA's ``0000:17:00.0`` -> ``0000:17:00.0``."""
    text = (pci.decode(errors="replace") if isinstance(pci, bytes) else str(pci)).strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            pass
    return text


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read(lib: Any | None = None, *, timeout_s: float = 20.0) -> NvmlReport:
    """Everything NVML says about the GPUs; a report with status ``no-driver`` / ``no-binding`` / ``error`` when it
    cannot say anything. Never raises and never waits longer than ``timeout_s``: NVML runs in a daemon thread that is
    abandoned when it does not return (a GPU that fell off the bus hangs ``nvmlInit``; the process can still end)."""
    box: list[NvmlReport] = []
    worker = threading.Thread(target=lambda: box.append(_read(lib)), name="nvml", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not box:
        return NvmlReport(
            "error",
            f"NVML did not answer within {timeout_s:g} s (a GPU that fell off the bus, a hung driver): the GPUs are "
            "not listed; `nvidia-smi` and the kernel log (dmesg) tell more",
        )
    return box[0]


def _read(lib: Any | None) -> NvmlReport:
    """:func:`read` in its worker: any failure, an NVMLError or a binding that raises anything else or returns
    nonsense, is the report's ``error`` status."""
    try:
        if lib is None:
            try:
                import pynvml as lib_module
            except ImportError:
                return NvmlReport("no-binding", "the nvidia-ml-py package (module pynvml) is not installed")
            lib = lib_module
        return _started(lib)
    except Exception as e:  # noqa: BLE001 - a binding's own bug is NVML trouble: a finding, never a traceback
        return NvmlReport("error", f"NVML failed: {type(e).__name__}: {_text(e)}"[:300])


def _started(lib: Any) -> NvmlReport:
    try:
        lib.nvmlInit()
    except lib.NVMLError_LibraryNotFound:
        return NvmlReport("no-driver", "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed")
    except lib.NVMLError as e:
        return NvmlReport("error", f"NVML did not start: {_text(e)}")
    try:
        return _inventory(lib)
    except lib.NVMLError as e:
        return NvmlReport("error", f"NVML failed: {_text(e)}")
    finally:
        _optional(lib, lib.nvmlShutdown)


def _optional(lib: Any, fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None where NVML says the query is not supported here, or fails in any other way (one
    unknown field, not a lost inventory)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError or a binding's bug: the field is unknown
        return None


def _count(value: Any, lo: int = 0, hi: int = 1 << 20) -> int | None:
    """A whole number NVML returned, or None when it is not one (a string, NaN, a negative or absurd figure)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        value = int(value)
    if not isinstance(value, int) or not lo <= value <= hi:
        return None
    return value


def _inventory(lib: Any) -> NvmlReport:
    rep = NvmlReport("ok")
    rep.driver = _text(lib.nvmlSystemGetDriverVersion())
    cuda = _count(_optional(lib, lib.nvmlSystemGetCudaDriverVersion_v2), 1, 1 << 30)
    if cuda:
        rep.cuda_driver = f"{cuda // 1000}.{cuda % 1000 // 10}"
    raw = lib.nvmlDeviceGetCount()
    n = _count(raw, 0, MAX_GPUS)
    if n is None:
        return NvmlReport("error", f"NVML's GPU count is not a number of GPUs: {_text(raw)[:40]!r}")
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    for i, h in enumerate(handles):
        rep.gpus.append(_gpu(lib, i, h))
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            rep.pairs.append(_pair(lib, rep.gpus, handles, i, j))
    return rep


def _gpu(lib: Any, index: int, h: Any) -> NvmlGpu:
    cc = _optional(lib, lib.nvmlDeviceGetCudaComputeCapability, h)
    mem = _optional(lib, lib.nvmlDeviceGetMemoryInfo, h)
    pci = lib.nvmlDeviceGetPciInfo(h)
    gen_max = _optional(lib, lib.nvmlDeviceGetMaxPcieLinkGeneration, h)
    return NvmlGpu(
        index=index,
        name=_text(lib.nvmlDeviceGetName(h)),
        pci=normalize_pci(pci.busId),
        uuid=_text(_optional(lib, lib.nvmlDeviceGetUUID, h) or ""),
        cc=_cc(cc),
        memory_total_mib=_mib(getattr(mem, "total", None)),
        memory_free_mib=_mib(getattr(mem, "free", None)),
        pcie_gen=_count(_optional(lib, lib.nvmlDeviceGetCurrPcieLinkGeneration, h), 1, 64),
        pcie_gen_max=_count(gen_max, 1, 64),
        pcie_width=_count(_optional(lib, lib.nvmlDeviceGetCurrPcieLinkWidth, h), 1, 64),
        pcie_width_max=_count(_optional(lib, lib.nvmlDeviceGetMaxPcieLinkWidth, h), 1, 64),
    )


def _cc(cc: Any) -> str | None:
    try:
        major, minor = (_count(x, 0, 99) for x in cc)
    except (TypeError, ValueError):
        return None
    return f"{major}.{minor}" if major is not None and minor is not None else None


def _mib(value: Any) -> int | None:
    n = _count(value, 0, 1 << 62)
    return None if n is None else n >> 20


def _pair(lib: Any, gpus: list[NvmlGpu], handles: list[Any], i: int, j: int) -> NvmlPair:
    level = _optional(lib, lib.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
    lvl = _count(level, 0, 1 << 16)
    topo = TOPOLOGY.get(lvl, (f"level {lvl}", ""))[0] if lvl is not None else None
    nvlinks = 0
    for link in range(_count(getattr(lib, "NVML_NVLINK_MAX_LINKS", 0), 0, 64) or 0):
        if _optional(lib, lib.nvmlDeviceGetNvLinkState, handles[i], link) != lib.NVML_FEATURE_ENABLED:
            continue
        remote = _optional(lib, lib.nvmlDeviceGetNvLinkRemotePciInfo, handles[i], link)
        if remote is not None and normalize_pci(remote.busId) == gpus[j].pci:
            nvlinks += 1
    status = _optional(lib, lib.nvmlDeviceGetP2PStatus, handles[i], handles[j], lib.NVML_P2P_CAPS_INDEX_READ)
    p2p = None if status is None else "ok" if status == lib.NVML_P2P_STATUS_OK else _p2p_reason(lib, status)
    return NvmlPair(i, j, topo, nvlinks, p2p)


def _p2p_reason(lib: Any, status: int) -> str:
    for name in dir(lib):
        if name.startswith("NVML_P2P_STATUS_") and getattr(lib, name) == status and "SUPPORED" not in name:
            return name[len("NVML_P2P_STATUS_") :].lower().replace("_", " ")
    return f"status {status}"
