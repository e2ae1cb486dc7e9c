"""The doctor's three untrusted sources (NVML, the probe's output, ``llama-server --list-devices``) and its outputs,
as the fifth sweep (issue 50) tried them: a binding that hangs or raises anything, figures no measurement gives,
a listing that never returns, values that would forge report lines, a full disk. Each is a finding in the report
(exit 0) or one usage line, never a traceback or a hang. The parser and the advice over arbitrary figures are
property tests (Hypothesis) at the end."""

from __future__ import annotations

import errno
import json
import math
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_bridge import cli
from ggml_bridge.experiments.doctor import checkup, inventory, nvml, probe, recommend, report
from ggml_bridge.experiments.doctor.facts import Findings, Options
from ggml_bridge.foundations import cache

from helpers import FIXTURES, doctor_findings, write_exe

OK2 = FIXTURES / "probe" / "mock-2gpu-ok.txt"


class _NvmlError(Exception):
    pass


class _NotFound(_NvmlError):
    pass


def _binding(**fns: Any) -> Any:
    """A stand-in pynvml: its error classes, a working two-call start, and ``fns`` replacing any function."""
    base: dict[str, Any] = {
        "NVMLError": _NvmlError,
        "NVMLError_LibraryNotFound": _NotFound,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.95.05",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "GPU",
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=b"00000000:01:00.0"),
        "nvmlDeviceGetUUID": lambda h: "GPU-0",
        "nvmlDeviceGetCudaComputeCapability": lambda h: (8, 6),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=8 << 30, free=7 << 30),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 4,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 4,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
    }
    base.update(fns)
    return SimpleNamespace(**base)


# --------------------------------------------------------------------------------------------- NVML


def test_nvml_that_never_returns_is_a_finding_within_the_timeout() -> None:
    """E11: a GPU that fell off the bus hangs nvmlInit; the doctor waited for ever."""
    release = threading.Event()
    lib = _binding(nvmlInit=lambda: release.wait(60))
    t0 = time.monotonic()
    try:
        rep = nvml.read(lib, timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5
    assert rep.status == "error" and "did not answer within 0.5 s" in rep.detail


@pytest.mark.parametrize(
    ("fns", "status", "fragment"),
    [
        ({"nvmlInit": lambda: (_ for _ in ()).throw(RuntimeError("bad binding"))}, "error", "RuntimeError"),
        ({"nvmlDeviceGetCount": lambda: (_ for _ in ()).throw(TypeError("x"))}, "error", "TypeError"),
        ({"nvmlDeviceGetCount": lambda: "two"}, "error", "not a number of GPUs"),
        ({"nvmlDeviceGetCount": lambda: float("nan")}, "error", "not a number of GPUs"),
        ({"nvmlSystemGetCudaDriverVersion_v2": lambda: "thirteen"}, "ok", ""),
        ({"nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=float("nan"), free=-1)}, "ok", ""),
        ({"nvmlDeviceGetCudaComputeCapability": lambda h: "8.6"}, "ok", ""),
        ({"nvmlDeviceGetMaxPcieLinkWidth": lambda h: (_ for _ in ()).throw(ValueError("x"))}, "ok", ""),
    ],
    ids=[
        "init-runtime-error",
        "count-type-error",
        "count-text",
        "count-nan",
        "cuda-text",
        "memory-nan",
        "cc-text",
        "optional-value-error",
    ],
)
def test_nvml_trouble_of_any_kind_is_a_finding(fns: dict[str, Any], status: str, fragment: str) -> None:
    """E12: a binding raising RuntimeError/TypeError, a non-numeric count or CUDA version, NaN memory."""
    rep = nvml.read(_binding(**fns), timeout_s=10)
    assert rep.status == status and fragment in rep.detail
    if status == "ok":
        (gpu,) = rep.gpus
        assert gpu.memory_total_mib in (None, 8192) and rep.cuda_driver in (None, "13.0") and gpu.cc in (None, "8.6")


def test_the_doctor_with_a_hanging_nvml_ends_with_its_report(
    doctor_bin: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """E11 end to end: the doctor ends within its time budget, exit 0, the hang one line of the report."""
    import pynvml as p

    release = threading.Event()
    monkeypatch.setattr(p, "nvmlInit", lambda: release.wait(60))
    t0 = time.monotonic()
    try:
        rc = cli.main(["doctor", "--no-probe", "--time-budget", "1", "--bin-dir", str(doctor_bin)])
    finally:
        release.set()
    out = capfd.readouterr().out
    assert rc == 0 and time.monotonic() - t0 < 20
    assert "NVIDIA: NVML did not answer within 1 s" in out


# --------------------------------------------------------------------------------------------- --list-devices

STALLING_LISTER = "#!PYTHON\nimport time\ntime.sleep(60)\n"


def test_a_listing_that_never_returns_is_one_line_of_the_report(
    doctor_bin: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """E13: a --list-devices that does not return ended the whole doctor with exit 40 and no report."""
    write_exe(doctor_bin / "llama-server", STALLING_LISTER)
    monkeypatch.setattr(inventory, "LIST_TIMEOUT_S", 1.0)
    rc = cli.main(["doctor", "--no-probe", "--bin-dir", str(doctor_bin)])
    out, err = capfd.readouterr()
    assert rc == 0 and "Traceback" not in err
    assert "problem: `llama-server --list-devices`:" in out and "timed out" in out


# --------------------------------------------------------------------------------------------- the probe's figures


def _fixture_with(old: str, new: str) -> str:
    import re

    text, n = re.subn(old, new, OK2.read_text())
    assert n
    return text


@pytest.mark.parametrize("figure", ["0", "-18.6", "nan", "inf", "-inf"])
def test_implausible_link_figures_are_reported_and_not_used(figure: str) -> None:
    """E1 (0 GB/s: ZeroDivisionError), E14 (negative figures used as measured): such a line is implausible."""
    res = probe.parse(_fixture_with(r"gbps=[0-9.]+", f"gbps={figure}"))
    assert not res.links and not res.copies and res.implausible
    assert all("is not a finite figure above 0" in line for line in res.implausible)
    rec = recommend.recommend(_findings(res), None)
    text = report.render(_findings(res), rec)
    assert f"{figure} GB/s" not in text and "implausible probe line, not used" in text


@pytest.mark.parametrize("figure", ["nan", "inf", "0", "-5"])
def test_implausible_gflops_leave_the_split_by_free_memory(figure: str, tmp_path: Path) -> None:
    """E2: NaN or inf GFLOP/s with --model was a ValueError in the split."""
    res = probe.parse(_fixture_with(r"gflops=[0-9.]+", f"gflops={figure}"))
    assert not res.gflops
    f = _findings(res)
    f.model = inventory.Model(tmp_path / "m.gguf", 1 << 30, "llama", 4096, 32)
    ts, basis = recommend.split_shares(f, recommend.split_devices(f))
    assert ts == [50, 50] and "no speed measured" in basis


def test_split_shares_survive_figures_that_bypass_the_parser(tmp_path: Path) -> None:
    """E2 at its cause: the split itself takes only finite, positive speeds."""
    f = _findings(probe.parse(OK2.read_text()))
    assert f.probe is not None
    f.probe.gflops.update({0: math.nan, 1: 100.0})
    f.model = inventory.Model(tmp_path / "m.gguf", 1 << 30, "llama", 4096, 32)
    ts, basis = recommend.split_shares(f, recommend.split_devices(f))
    assert sum(ts) == 100 and "no speed measured" in basis


def test_a_copy_naming_an_unknown_device_is_implausible() -> None:
    """E3: a p2p copy line naming a device with no device line was a KeyError in the advice."""
    res = probe.parse(
        OK2.read_text() + "probe: copy src=7 dst=1 path=p2p bytes=16777216 gbps=30 us=500 iters=10\n"
        "probe: check-pair src_gpu=0 dst_gpu=1 cases=10 failed=0 verdict=ok\n"
    )
    assert (7, 1, "p2p", probe.LARGE) not in res.copies
    assert any("no device line for device 7" in line for line in res.implausible)
    recommend.recommend(_findings(res), None)  # no KeyError
    assert recommend._p2p_gain(res, 0, 1) is None or recommend._p2p_gain(res, 0, 1) > 0


# --------------------------------------------------------------------------------------------- the outputs


def _findings(res: probe.ProbeResult | None, env: dict[str, str] | None = None) -> Findings:
    return doctor_findings(res, env=env)


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in the JSON document")

    return json.loads(text, parse_constant=refuse)


def test_the_json_document_is_strict_json() -> None:
    """E4: NaN and Infinity are not JSON: they are null in the document."""
    res = probe.parse(OK2.read_text())
    res.gflops[0] = math.nan
    res.seconds = math.inf
    f = _findings(res)
    doc = _strict_json(report.dumps(f, recommend.recommend(f, None)))
    assert doc["probe"]["gflops"]["0"] is None and doc["probe"]["seconds"] is None


def test_the_doctors_json_with_a_nan_probe_is_strict(
    doctor_bin: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """E4 end to end: `doctor --json` printed NaN."""
    saved = tmp_path / "nan.txt"
    saved.write_text(_fixture_with(r"gflops=[0-9.]+", "gflops=nan"))
    assert cli.main(["doctor", "--probe-output", str(saved), "--json", "--bin-dir", str(doctor_bin)]) == 0
    doc = _strict_json(capfd.readouterr().out)
    assert doc["probe"]["implausible"]


FORGED = "!! PEER COPIES BETWEEN GPU 0 AND GPU 1 ARE SAFE"


def test_a_newline_in_a_watched_variable_forges_no_report_line(
    doctor_bin: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """E15: CUDA_VISIBLE_DEVICES with a newline printed a line of its own choosing."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"0\n{FORGED}")
    assert cli.main(["doctor", "--no-probe", "--bin-dir", str(doctor_bin)]) == 0
    out = capfd.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith("!!")]
    assert f"CUDA_VISIBLE_DEVICES=$'0\\n{FORGED}'" in out


def test_every_report_line_is_one_line_whatever_the_sources_say() -> None:
    """E15 at its cause: NVML names, the listing's descriptions and the probe's names are quoted too."""
    f = _findings(None, env={"GGML_CUDA_DEVICES": "a\rb"})
    f.nvml = nvml.NvmlReport("error", f"NVML failed: x\n{FORGED}")
    f.listings[0].devices = [inventory.ListedDevice("CUDA0", f"dev\n{FORGED}", 1, 1)]
    text = report.render(f, recommend.recommend(f, None))
    assert FORGED in text and not [line for line in text.splitlines() if line.startswith("!!")]


def test_a_full_disk_under_out_names_the_path(
    doctor_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """E9: a full disk under --out was a cache error without the path."""

    def full(path: Path, text: str) -> None:
        raise cache.CacheError(f"cannot write {path}", why="the disk is full")

    monkeypatch.setattr(cache, "write_text_atomic", full)
    rc = cli.main(["doctor", "--no-probe", "--out", str(tmp_path / "o"), "--bin-dir", str(doctor_bin)])
    err = capfd.readouterr().err
    assert rc == 2 and f"cannot write {tmp_path / 'o' / 'report.txt'}" in err and "the disk is full" in err


def test_a_full_disk_under_plot_names_the_path(
    doctor_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """E9: the plot on a full disk."""

    def full(p: probe.ProbeResult, out: Path) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(checkup, "plot_pairs", full)
    plot = tmp_path / "p.png"
    rc = cli.main(["doctor", "--probe-output", str(OK2), "--plot", str(plot), "--bin-dir", str(doctor_bin)])
    err = capfd.readouterr().err
    assert rc == 2 and f"cannot write the plot {plot}" in err and "the disk is full" in err


def test_plot_formats_follow_the_extension(doctor_bin: Path, tmp_path: Path) -> None:
    """E5: --plot p.svg is an SVG (the extension chooses the format; no '.png' appended)."""
    assert (
        cli.main(
            ["doctor", "--probe-output", str(OK2), "--plot", str(tmp_path / "p.svg"), "--bin-dir", str(doctor_bin)]
        )
        == 0
    )
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml") and not list(tmp_path.glob("*.png"))


# --------------------------------------------------------------------------------------------- properties

_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
#: PROP_EXAMPLES=3000 for a longer search, as in test_properties.py
BOUNDED = settings(
    max_examples=int(os.environ.get("PROP_EXAMPLES", "60")), deadline=None, database=None, suppress_health_check=_QUIET
)
_FIGURE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0", "-1", "nan", "inf", "1e309", "x", ""]),
)
_KINDS = ["link", "copy", "compute", "device", "gpu", "pair", "peer", "check", "check-begin", "check-pair", "end"]


@st.composite
def _probe_line(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(_KINDS))
    keys = draw(
        st.lists(
            st.sampled_from(
                [
                    "dev",
                    "gpu",
                    "src",
                    "dst",
                    "dir",
                    "bytes",
                    "gbps",
                    "us",
                    "iters",
                    "gflops",
                    "path",
                    "total_mib",
                    "free_mib",
                    "name",
                    "description",
                    "virtual",
                    "kind",
                    "peer_enabled",
                    "seconds",
                    "src_gpu",
                    "dst_gpu",
                    "case",
                    "cases",
                    "failed",
                    "verdict",
                    "pci",
                    "cc",
                ]
            ),
            max_size=12,
        )
    )
    values = [
        draw(
            st.one_of(
                st.integers(-3, 3).map(str),
                _FIGURE.map(str),
                st.sampled_from(["d2h", "h2d", "p2p", "bridge", "ok", "died", "corrupt"]),
            )
        )
        for _ in keys
    ]
    return f"probe: {kind} " + " ".join(f"{k}={v or '0'}" for k, v in zip(keys, values, strict=True))


@BOUNDED
@given(st.lists(_probe_line(), max_size=30), st.lists(st.integers(0, 60), max_size=5))
def test_any_probe_output_parses_and_advises_without_an_exception(lines: list[str], cut: list[int]) -> None:
    """The parser keeps only finite, positive figures of known devices; the advice, the text and the strict JSON
    follow from any output, the real fixture's lines mixed with arbitrary ones."""
    real = OK2.read_text().splitlines()
    text = "\n".join(real[: (cut[0] if cut else len(real))] + lines)
    res = probe.parse(text)
    for t in [*res.links.values(), *res.copies.values()]:
        assert math.isfinite(t.gbps) and t.gbps > 0 and math.isfinite(t.us) and t.us > 0
    assert all(math.isfinite(g) and g > 0 for g in res.gflops.values())
    assert all(k[0] in res.devices and k[1] in res.devices for k in res.copies)
    f = _findings(res)
    rec = recommend.recommend(f, None)
    assert not rec.ts or sum(rec.ts) == 100
    for b in rec.boundaries:
        assert b.per_token_us is None or (math.isfinite(b.per_token_us) and b.per_token_us > 0)
    text_report = report.render(f, rec)
    assert all(line.isprintable() for line in text_report.splitlines())
    _strict_json(report.dumps(f, rec))


_REAL = OK2.read_text().splitlines()


@BOUNDED
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(_REAL) - 1),
            st.integers(0, 12),
            st.one_of(_FIGURE.map(str), st.integers(-(1 << 40), 1 << 40).map(str), st.text(max_size=4)),
        ),
        max_size=12,
    )
)
def test_arbitrary_figures_in_a_real_probe_output_never_break_the_advice(changes: list[tuple[int, int, str]]) -> None:
    """The real two-GPU output with any of its values replaced by arbitrary figures (0, negative, NaN, inf, huge,
    words): the parser keeps only plausible figures of described devices, and the advice, the text report and
    the strict JSON follow."""
    lines = list(_REAL)
    for row, pos, value in changes:
        words = lines[row].split(" ")
        fields = [i for i, w in enumerate(words) if "=" in w]
        if fields:
            i = fields[pos % len(fields)]
            key = words[i].split("=", 1)[0]
            words[i] = f"{key}={value.replace(' ', '') or '0'}"
            lines[row] = " ".join(words)
    res = probe.parse("\n".join(lines))
    for t in [*res.links.values(), *res.copies.values()]:
        assert math.isfinite(t.gbps) and t.gbps > 0 and math.isfinite(t.us) and t.us > 0
    f = _findings(res)
    rec = recommend.recommend(f, None)
    assert not rec.ts or sum(rec.ts) == 100
    assert all(line.isprintable() for line in report.render(f, rec).splitlines())
    _strict_json(report.dumps(f, rec))


@BOUNDED
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=2, max_size=6),
    st.lists(st.integers(-(1 << 20), 1 << 20), min_size=2, max_size=6),
    st.integers(1, 1 << 40),
)
def test_the_split_over_arbitrary_speeds_and_memory_sums_to_100(
    speeds: list[float], free: list[int], size: int
) -> None:
    """The doctor's split: whatever the speeds (NaN, inf, 0, negative) and free memory, -ts is whole per cent
    summing to 100, one share per device."""
    n = min(len(speeds), len(free))
    res = probe.ProbeResult()
    for i in range(n):
        res.devices[i] = probe.Device(i, i, f"CUDA{i}", "d", abs(free[i]), free[i], False)
        res.gflops[i] = speeds[i]
    f = _findings(res)
    f.listings[0].devices = [inventory.ListedDevice(f"CUDA{i}", "d", abs(free[i]), free[i]) for i in range(n)]
    f.model = inventory.Model(Path("m.gguf"), size, "llama", 4096, 32)
    ts, _ = recommend.split_shares(f, recommend.split_devices(f))
    assert len(ts) == n and sum(ts) == 100 and all(0 <= s <= 100 for s in ts)


_ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.tuples(st.integers(-5, 100), st.integers(-5, 100)),
)
_NVML_FNS = [
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
]


@BOUNDED
@given(st.dictionaries(st.sampled_from(_NVML_FNS), _ANYTHING), _ANYTHING, _ANYTHING)
def test_nvml_over_arbitrary_binding_answers_never_raises(answers: dict[str, Any], total: Any, free: Any) -> None:
    """E12 as a property: whatever a binding returns, the NVML report is a status and GPUs of plain figures, and
    the text report and the strict JSON follow from it."""
    fns: dict[str, Any] = {name: (lambda *a, v=v: v) for name, v in answers.items()}
    fns["nvmlDeviceGetMemoryInfo"] = lambda h: SimpleNamespace(total=total, free=free)
    rep = nvml.read(_binding(**fns), timeout_s=10)
    assert rep.status in ("ok", "error")
    for g in rep.gpus:
        for v in (g.memory_total_mib, g.memory_free_mib, g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max):
            assert v is None or (isinstance(v, int) and v >= 0)
    f = _findings(None)
    f.nvml = rep
    rec = recommend.recommend(f, None)
    assert all(line.isprintable() for line in report.render(f, rec).splitlines())
    _strict_json(report.dumps(f, rec))


def test_the_options_are_declared_on_their_fields(capsys):
    import dataclasses

    from ggml_bridge.foundations import flags

    assert [f.name for f, _ in flags.declared(Options)] == [f.name for f in dataclasses.fields(Options)]
    doctor = cli.COMMANDS["doctor"]
    assert cli.parse_command(doctor, []) == Options()
    opts = cli.parse_command(doctor, ["--no-probe", "--rpc", "a:1", "--rpc", "b:2", "--time-budget", "3"])
    assert (opts.probe, opts.rpc, opts.time_budget_s, opts.probe_file) == (False, ("a:1", "b:2"), 3.0, None)
    assert cli.main(["doctor", "--no-probe", "--probe-output", "p.txt"]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("argument --probe-output: not allowed with argument --no-probe")
    )
