"""The doctor's data: what it was asked (:class:`Options`, frozen, built from the command line by
:mod:`ggml_bridge.experiments.doctor.command` and by nothing else) and what it found (:class:`Findings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .inventory import Build, Cpu, Listing, Model, RpcEndpoint
from .nvml import NvmlReport, normalize_pci
from .probe import ProbeResult

#: the environment variables that change what the doctor sees and what the recommended command must repeat
WATCHED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "GGML_CUDA_DEVICES",
    "GGML_CUDA_P2P",
    "GGML_CUDA_MAPPED_HOST_BRIDGE",
    "GGML_VK_VISIBLE_DEVICES",
)
#: the hidden size assumed for boundary costs when neither --model nor --hidden gives one
DEFAULT_HIDDEN = 4096


@dataclass(frozen=True)
class Options:
    """``ggml-bridge doctor``'s options."""

    json: bool = False  # stdout: the JSON document instead of the report
    quick: bool = False  # the probe's quick mode (one direction per pair, smaller checks)
    probe: bool = True  # run the CUDA probe (False: inventory only)
    probe_file: Path | None = None  # read this saved probe output instead of running the probe
    time_budget_s: float | None = None  # the probe's budget (None: 50 s, 25 s with --quick)
    bin_dir: Path | None = None  # ask this build's programs only
    rpc: tuple[str, ...] = ()  # RPC endpoints host:port
    model: Path | None = None  # the GGUF to be served: hidden size, size for -ts, the command line
    hidden: int | None = None  # the hidden size when no model is given
    out: Path | None = None  # also write report.txt, doctor.json, probe.txt and the plot here
    plot: Path | None = None  # the pair bandwidth plot (PNG)

    @property
    def budget_s(self) -> float:
        return self.time_budget_s if self.time_budget_s is not None else (25.0 if self.quick else 50.0)


@dataclass
class Findings:
    """Everything the doctor found, before any advice."""

    when: str
    host: str
    options: Options
    env: dict[str, str]
    nvml: NvmlReport
    cpu: Cpu
    builds: list[Build] = field(default_factory=list)
    listings: list[Listing] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be looked at, and why
    probe: ProbeResult | None = None
    probe_source: str = ""  # the program (or file) the measurements came from, or why there are none
    model: Model | None = None
    rpc: list[RpcEndpoint] = field(default_factory=list)

    @property
    def serving(self) -> Listing | None:
        """The listing of the build the recommended command serves with (the first found, see find_builds)."""
        return self.listings[0] if self.listings else None

    def cuda_ordinal(self, nvml_index: int) -> int | None:
        """The CUDA runtime ordinal of NVML's GPU ``nvml_index`` (matched by PCI bus id through the probe): NVML
        numbers GPUs by bus, CUDA fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and the bridge's log lines and
        its pairs not to trust use CUDA's numbers. None without a probe."""
        if self.probe is None or not 0 <= nvml_index < len(self.nvml.gpus):
            return None
        pci = self.nvml.gpus[nvml_index].pci
        return next((g.gpu for g in self.probe.gpus.values() if normalize_pci(g.pci) == pci), None)

    def gpu_name(self, nvml_index: int) -> str:
        """``GPU n`` with CUDA's ordinal where the probe tells it, else ``NVML GPU n``."""
        ordinal = self.cuda_ordinal(nvml_index)
        return f"GPU {ordinal}" if ordinal is not None else f"NVML GPU {nvml_index}"

    @property
    def hidden(self) -> int:
        if self.model is not None:
            return self.model.hidden
        return self.options.hidden or DEFAULT_HIDDEN
