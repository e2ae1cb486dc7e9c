"""The doctor's data: what it was asked (:class:`Options`, frozen, each option declared on its field and built from
the command line by :mod:`ggml_bridge.commands.doctor` and by nothing else) and what it found (:class:`Findings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...foundations import flags
from ...foundations.flags import flag, one_of
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
    """``ggml-bridge doctor``'s options, each declared once on its field (:func:`flags.flag`)."""

    json: bool = field(default=False, metadata=flag("--json", help="print the JSON document instead of the report"))
    quick: bool = field(
        default=False,
        metadata=flag("--quick", help="the probe's quick mode: one direction per pair, peer checks up to 16 MiB"),
    )
    probe: bool = field(  # False: inventory only
        default=True, metadata=one_of("probe", flag("--no-probe", help="no measurements: inventory only"))
    )
    probe_file: Path | None = field(  # read this saved probe output instead of running the probe
        default=None,
        metadata=one_of(
            "probe",
            flag(
                "--probe-output",
                parse=flags.path,
                metavar="FILE",
                help="read a saved probe output (probe.txt of --out) instead of running the probe",
            ),
        ),
    )
    time_budget_s: float | None = field(  # the probe's budget (None: 50 s, 25 s with --quick)
        default=None,
        metadata=flag(
            "--time-budget",
            parse=flags.seconds(),
            metavar="S",
            help="seconds the probe may take (default 50, 25 with --quick); it stops measuring when they are spent",
        ),
    )
    bin_dir: Path | None = field(  # ask this build's programs only
        default=None,
        metadata=flag(
            "--bin-dir",
            parse=flags.path,
            metavar="DIR",
            help="ask this build's programs (default: the latest patched build of each backend, then the installed "
            "wheel)",
        ),
    )
    rpc: tuple[str, ...] = field(  # RPC endpoints host:port
        default=(),
        metadata=flag(
            "--rpc",
            metavar="HOST:PORT[,...]",
            takes="repeat",
            help="rpc-servers to check: handshake, protocol, devices (repeatable)",
        ),
    )
    model: Path | None = field(  # the GGUF to be served: hidden size, size for -ts, the command line
        default=None,
        metadata=flag(
            "--model",
            parse=flags.path,
            metavar="GGUF",
            help="the model to serve: its hidden size prices the boundaries, its size balances -ts by measured speed",
        ),
    )
    hidden: int | None = field(  # the hidden size when no model is given
        default=None,
        metadata=flag(
            "--hidden", parse=flags.count(1, 1 << 20), metavar="N", help="hidden size without --model (default 4096)"
        ),
    )
    out: Path | None = field(  # also write report.txt, doctor.json, probe.txt and the plot here
        default=None,
        metadata=flag(
            "--out",
            parse=flags.path,
            metavar="DIR",
            help="also write report.txt, doctor.json, probe.txt (the probe's raw output) and pairs.png into DIR",
        ),
    )
    plot: Path | None = field(  # the pair bandwidth plot (PNG)
        default=None,
        metadata=flag(
            "--plot", parse=flags.path, metavar="PNG", help="the pair bandwidth plot here (.png, .svg or .pdf)"
        ),
    )

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
