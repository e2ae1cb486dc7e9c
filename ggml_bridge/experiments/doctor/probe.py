"""The probe of the patched CUDA build, ``test-mapped-host-bridge --probe``: run it within a time budget and read its
``probe:`` lines (the format is the program's contract with this module; docs/DESIGN.md, "The doctor's probe").

Every line is ``probe: <kind> key=value ...`` with strings in double quotes, so one ``shlex.split`` reads it. A probe
that dies (a peer copy that faults the IOMMU takes the process with it) leaves the lines it printed, the last a
``check-begin`` without its ``check``: :attr:`ProbeResult.died_during` names that pair.
"""

from __future__ import annotations

import math
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ...foundations.runner import Failure, Pump, log, start

PREFIX = "probe: "
#: the only format version this parser reads (``probe: begin version=N``)
VERSION = 1
#: the copy sizes the probe times: a latency-bound boundary (token generation) and a bandwidth-bound one
SMALL, LARGE = 64 * 1024, 16 * 1024 * 1024


@dataclass(frozen=True)
class Gpu:
    gpu: int
    pci: str
    name: str
    cc: str
    total_mib: int


@dataclass(frozen=True)
class Device:
    dev: int
    gpu: int
    name: str
    description: str
    total_mib: int
    free_mib: int
    virtual: bool


@dataclass(frozen=True)
class Timing:
    """One timed copy: ``gbps`` of back-to-back copies, ``us`` for one copy and its synchronization."""

    bytes: int
    gbps: float
    us: float
    iters: int


@dataclass(frozen=True)
class Check:
    src_gpu: int
    dst_gpu: int
    case: int
    path: str
    bytes: int
    src_off: int
    dst_off: int
    pattern: str
    want: str
    got: str
    bad_bytes: int
    guard_bad: int
    ok: bool


@dataclass(frozen=True)
class CheckPair:
    """The verdict on one ordered pair of GPUs with peer access enabled: ok, corrupt, no-peer-path, or died (the
    probe ended during one of its copies)."""

    src_gpu: int
    dst_gpu: int
    cases: int
    failed: int
    verdict: str


@dataclass
class ProbeResult:
    version: int = 0
    quick: bool = False
    driver: int = 0  # CUDA driver API version (13000 = 13.0)
    runtime: int = 0
    gpus: dict[int, Gpu] = field(default_factory=dict)
    devices: dict[int, Device] = field(default_factory=dict)
    #: (src GPU, dst GPU) -> (cudaDeviceCanAccessPeer, peer access already enabled in the process)
    peers: dict[tuple[int, int], tuple[bool, bool]] = field(default_factory=dict)
    #: (device, "d2h" | "h2d", bytes) -> timing
    links: dict[tuple[int, str, int], Timing] = field(default_factory=dict)
    gflops: dict[int, float] = field(default_factory=dict)
    #: (src device, dst device) -> (kind, peer enabled): kind virtual | peer-capable | no-peer
    pairs: dict[tuple[int, int], tuple[str, bool]] = field(default_factory=dict)
    #: (src device, dst device, path, bytes) -> timing; path bridge | upstream | p2p
    copies: dict[tuple[int, int, str, int], Timing] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    verdicts: dict[tuple[int, int], CheckPair] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float | None = None  # None: no end line (killed, crashed, cut by the time limit)
    #: the (src GPU, dst GPU, case) whose check-begin line had no check line (the probe died during that copy)
    died_during: tuple[int, int, int] | None = None
    malformed: list[str] = field(default_factory=list)
    #: lines whose figures no measurement gives, or that name a device no ``device`` line describes (not used)
    implausible: list[str] = field(default_factory=list)
    exit_status: int | None = None
    timed_out: bool = False

    @property
    def ended(self) -> bool:
        return self.seconds is not None

    def link(self, dev: int, direction: str, size: int) -> Timing | None:
        return self.links.get((dev, direction, size))

    def copy(self, src: int, dst: int, path: str, size: int) -> Timing | None:
        return self.copies.get((src, dst, path, size))

    def bad_pairs(self) -> list[tuple[int, int]]:
        """Unordered GPU pairs whose peer copies corrupted data or killed the probe, sorted."""
        bad = {tuple(sorted(k)) for k, v in self.verdicts.items() if v.verdict in ("corrupt", "died")}
        return sorted((a, b) for a, b in bad)


class ProbeFormatError(ValueError):
    """A ``probe:`` line that is not ``kind key=value ...``; :func:`parse` keeps it as a ``malformed`` entry."""


class ImplausibleFigure(ProbeFormatError):
    """A ``probe:`` line whose figures no measurement gives (0, negative, NaN or infinite GB/s, us, GFLOP/s or MiB):
    :func:`parse` keeps it as an ``implausible`` entry and uses none of its figures."""


def _positive(f: Mapping[str, str], key: str) -> float:
    """A measured figure: finite and above 0."""
    value = float(f[key])
    if not math.isfinite(value) or value <= 0:
        raise ImplausibleFigure(f"{key}={f[key]} is not a finite figure above 0")
    return value


def _whole(f: Mapping[str, str], key: str, lo: int = 0) -> int:
    """A count or a size: a whole number of at least ``lo``."""
    value = int(f[key])
    if value < lo:
        raise ImplausibleFigure(f"{key}={f[key]} is below {lo}")
    return value


def _fields(rest: str) -> tuple[str, dict[str, str]]:
    try:
        tokens = shlex.split(rest)
    except ValueError as e:
        raise ProbeFormatError(f"unbalanced quotes: {e}") from None
    if not tokens:
        raise ProbeFormatError("no kind")
    out: dict[str, str] = {}
    for t in tokens[1:]:
        key, sep, value = t.partition("=")
        if not sep or not key:
            raise ProbeFormatError(f"{t!r} is not key=value")
        out[key] = value
    return tokens[0], out


def _timing(f: Mapping[str, str]) -> Timing:
    return Timing(_whole(f, "bytes", 1), _positive(f, "gbps"), _positive(f, "us"), _whole(f, "iters", 1))


def parse_line(res: ProbeResult, rest: str) -> None:
    """Apply one line (without its ``probe: `` prefix) to ``res``. Raises ProbeFormatError, KeyError, ValueError."""
    kind, f = _fields(rest)
    if kind == "begin":
        res.version, res.quick = int(f["version"]), f.get("quick") == "1"
    elif kind == "cuda":
        res.driver, res.runtime = int(f["driver"]), int(f["runtime"])
    elif kind == "gpu":
        g = int(f["gpu"])
        res.gpus[g] = Gpu(g, f["pci"], f["name"], f["cc"], _whole(f, "total_mib"))
    elif kind == "device":
        d = int(f["dev"])
        res.devices[d] = Device(
            d,
            int(f["gpu"]),
            f["name"],
            f["description"],
            _whole(f, "total_mib"),
            _whole(f, "free_mib"),
            f["virtual"] == "1",
        )
    elif kind == "peer":
        res.peers[(int(f["src_gpu"]), int(f["dst_gpu"]))] = (f["can_access"] == "1", f["enabled"] == "1")
    elif kind == "link":
        t = _timing(f)
        res.links[(int(f["dev"]), f["dir"], t.bytes)] = t
    elif kind == "compute":
        res.gflops[int(f["dev"])] = _positive(f, "gflops")
    elif kind == "pair":
        res.pairs[(int(f["src"]), int(f["dst"]))] = (f["kind"], f["peer_enabled"] == "1")
    elif kind == "copy":
        t = _timing(f)
        res.copies[(int(f["src"]), int(f["dst"]), f["path"], t.bytes)] = t
    elif kind == "check-begin":
        res.died_during = (int(f["src_gpu"]), int(f["dst_gpu"]), int(f["case"]))
    elif kind == "check":
        res.died_during = None
        res.checks.append(_check(f))
    elif kind == "check-pair":
        a, b = int(f["src_gpu"]), int(f["dst_gpu"])
        res.verdicts[(a, b)] = CheckPair(a, b, int(f["cases"]), int(f["failed"]), f["verdict"])
    elif kind == "skipped":
        res.skipped.append((f["what"], f["reason"]))
    elif kind == "end":
        seconds = float(f["seconds"])
        if not math.isfinite(seconds) or seconds < 0:
            raise ImplausibleFigure(f"seconds={f['seconds']} is not a finite time")
        res.seconds = seconds
    # other kinds: a newer probe's additions, ignored


def _check(f: Mapping[str, str]) -> Check:
    return Check(
        int(f["src_gpu"]),
        int(f["dst_gpu"]),
        int(f["case"]),
        f["path"],
        int(f["bytes"]),
        int(f["src_off"]),
        int(f["dst_off"]),
        f["pattern"],
        f["want"],
        f["got"],
        int(f["bad_bytes"]),
        int(f["guard_bad"]),
        f["ok"] == "1",
    )


def parse(text: str) -> ProbeResult:
    """Read every ``probe:`` line of ``text`` (other lines, e.g. the bridge's log, are skipped). A probe that died
    during a peer copy gets the verdict ``died`` for that pair."""
    res = ProbeResult()
    for raw in text.splitlines():
        at = raw.find(PREFIX)
        if at < 0:
            continue
        try:
            parse_line(res, raw[at + len(PREFIX) :])
        except ImplausibleFigure as e:
            res.implausible.append(f"{raw.strip()[:200]} ({e})")
        except (ProbeFormatError, KeyError, ValueError) as e:
            res.malformed.append(f"{raw.strip()[:200]} ({type(e).__name__}: {e})")
    _cross_check(res)
    if res.died_during is not None and not res.ended:
        a, b, case = res.died_during
        done = [c for c in res.checks if (c.src_gpu, c.dst_gpu) == (a, b)]
        res.verdicts[(a, b)] = CheckPair(a, b, len(done) + 1, sum(not c.ok for c in done) + 1, "died")
    return res


def _cross_check(res: ProbeResult) -> None:
    """Drop the measurements that name a device no ``device`` line describes (each one ``implausible`` entry): the
    advice looks every device of a measurement up."""
    known = set(res.devices)

    def unknown(*devs: int) -> int | None:
        return next((d for d in devs if d not in known), None)

    for key in [k for k in res.links if unknown(k[0]) is not None]:
        res.implausible.append(f"link dev={key[0]} dir={key[1]} bytes={key[2]}: no device line for device {key[0]}")
        del res.links[key]
    for dev in [d for d in res.gflops if unknown(d) is not None]:
        res.implausible.append(f"compute dev={dev}: no device line for device {dev}")
        del res.gflops[dev]
    for pair in [k for k in res.pairs if unknown(*k) is not None]:
        res.implausible.append(f"pair src={pair[0]} dst={pair[1]}: no device line for device {unknown(*pair)}")
        del res.pairs[pair]
    for c in [k for k in res.copies if unknown(k[0], k[1]) is not None]:
        res.implausible.append(
            f"copy src={c[0]} dst={c[1]} path={c[2]} bytes={c[3]}: no device line for device {unknown(c[0], c[1])}"
        )
        del res.copies[c]


@dataclass(frozen=True)
class ProbeRun:
    """How to run the probe: the program, the time budget it is given (``--deadline``), the hard limit after which
    it is stopped, quick mode, the raw output file, and the environment added (e.g. GGML_CUDA_DEVICES)."""

    program: Path
    budget_s: float
    limit_s: float
    quick: bool = False
    log_file: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def run(spec: ProbeRun) -> ProbeResult:
    """Run the probe and parse what it printed, also when it died or was stopped at ``limit_s``."""
    argv = [str(spec.program), "--probe", "--deadline", f"{spec.budget_s:g}"] + (["--quick"] if spec.quick else [])
    proc = start(
        argv,
        env=dict(spec.env),
        pump=Pump(log_file=spec.log_file, keep=lambda line: PREFIX in line, tail=40),
        failure=Failure(what=f"cannot run the probe {spec.program}"),
    )
    timed_out = False
    try:
        rc = proc.wait(timeout=spec.limit_s)
    except subprocess.TimeoutExpired:
        log(f"    the probe ran past {spec.limit_s:.0f} s: stopping it")
        timed_out = True
        rc = proc.stop(timeout=10)
    res = parse("\n".join(proc.lines()))
    res.exit_status, res.timed_out = rc, timed_out
    if rc != 0 and not res.ended and not res.malformed and not res.version:
        res.malformed.append("the probe printed nothing; its last lines: " + " | ".join(proc.tail(5)))
    return res
