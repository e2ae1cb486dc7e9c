"""ggml_bridge/experiments/paper_model.py's host model: the per-hop cost, the predicted-vs-measured table built from a bench
report of the rpc-link suite, and the hosts table."""

from __future__ import annotations

import json
import math

import pytest


@pytest.fixture(scope="module")
def pm():
    from ggml_bridge.experiments import paper_model

    return paper_model


def test_hop_is_two_one_way_delays_and_the_activation_in_and_out(pm):
    # one token of a 2048-wide model over 10 Gbit/s (1.25 GB/s), 0.2 ms one way: 2*0.2 ms + 2*8 KiB/1.25 GB/s
    assert pm.t_hop(1, 2048, 1.25e9, 2e-4) == pytest.approx(4e-4 + 2 * 8192 / 1.25e9)
    assert pm.t_hop(512, 2048, math.inf, 0.0) == 0.0
    # a prompt's ubatch: bandwidth dominates (4 MiB each way at 10 Gbit/s = 3.4 ms)
    assert pm.t_hop(512, 2048, 1.25e9, 1e-4) == pytest.approx(2e-4 + 2 * 512 * 2048 * 4 / 1.25e9)


def _report(tmp_path, pm, shape="bench-1b", servers=1, skew=1.0):
    """A bench.json of the rpc-link suite whose link cases ran exactly as the model says (times ``skew``)."""
    from ggml_bridge.runtime import shaper

    tests = {"pp512/ub512": (9000.0, 8000.0), "pp4096/ub512": (8500.0, 7600.0), "tg128": (400.0, 300.0)}
    cases = [
        {"name": "off", "link": None},
        {"name": "rpc-off", "link": None},
        {"name": "rpc-off@unlimited-0", "link": "unlimited/0"},
    ]
    summary = {
        "off": {t: {"median": v[0]} for t, v in tests.items()},
        "rpc-off": {t: {"median": v[1] * 1.01} for t, v in tests.items()},
        "rpc-off@unlimited-0": {t: {"median": v[1]} for t, v in tests.items()},
    }
    for spec in ("10gbit/0.2ms", "25gbit/0.1ms"):
        link = shaper.parse_link(spec)
        name = f"rpc-off@{link.label}"
        cases.append({"name": name, "link": str(link)})
        summary[name] = {
            t: {"median": skew * pm.predict_tps(t, v[0], v[1], servers, 2048, link.rate, link.delay)}
            for t, v in tests.items()
        }
    rep = {
        "model": {"shape": shape},
        "cases": cases,
        "summary": summary,
        "links": {"rpc_servers": servers, "front_gpu": True},
    }
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(rep))
    return p


def test_check_bench_puts_predicted_next_to_measured(pm, tmp_path):
    table = pm.check_bench(_report(tmp_path, pm))
    rows = [r for r in table.splitlines() if r.startswith("| rpc-off@")]
    assert len(rows) == 6  # 2 links x 3 tests; the calibration case is not predicted
    assert all(r.split("|")[7].strip() == "1.000" for r in rows)
    tg10 = next(r for r in rows if "10gbit/0.2ms" in r and "tg128" in r).split("|")
    # tg over 10 Gbit/s / 0.2 ms: 1/300 s + 0.4 ms + 2 * 8 KiB / 1.25 GB/s per token
    assert float(tg10[5]) == pytest.approx(1 / (1 / 300 + 4e-4 + 2 * 8192 / 1.25e9), abs=0.05)
    off = pm.check_bench(_report(tmp_path, pm, skew=1.25))
    assert all(r.split("|")[7].strip() == "0.800" for r in off.splitlines() if r.startswith("| rpc-off@"))


def test_check_bench_needs_the_calibration_case(pm, tmp_path):
    p = _report(tmp_path, pm)
    rep = json.loads(p.read_text())
    rep["cases"] = [c for c in rep["cases"] if c["link"] != "unlimited/0"]
    p.write_text(json.dumps(rep))
    from ggml_bridge.foundations.errors import UsageError

    with pytest.raises(UsageError, match="calibration"):  # one error line, never an exit from the module
        pm.check_bench(p)
    p.write_text("[]")
    with pytest.raises(UsageError, match="is not a JSON object"):
        pm.check_bench(p)


def test_hosts_table_faster_networks_allow_more_hosts(pm):
    table = pm.hosts_table()
    rows = [r.split("|") for r in table.splitlines()[2:]]
    by = {(r[1].strip(), r[5].strip()): r for r in rows}
    assert {m for m, _ in by} == {"bench-1b", "bench-2b-6l", "bench-3b", "70B-class"}

    def pp50(m, n):
        return int(by[(m, n)][11].split("/")[1].strip().rstrip("+"))

    assert pp50("70B-class", "10 GbE") < pp50("70B-class", "25 GbE") < pp50("70B-class", "100 GbE")
    assert by[("70B-class", "10 GbE")][2].strip() == "8192" and by[("70B-class", "10 GbE")][3].strip() == "80"


def test_the_paper_model_command_prints_the_tables(capsys):
    from ggml_bridge import cli

    assert cli.main(["paper-model"]) == 0
    out = capsys.readouterr().out
    assert "## Predicted transfer time added by the boundaries" in out and "## Hosts: how many before" in out
    assert "| bytes | bridge predicted | bridge measured |" in out
