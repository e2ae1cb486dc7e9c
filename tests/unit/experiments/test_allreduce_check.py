"""The paper model's all-reduce (doctor/cost.py) against what test-bridge-allreduce --bench printed
(experiments/allreduce_check.py, ``ggml-bridge paper-model --allreduce-bench``)."""

from __future__ import annotations

import dataclasses

import pytest

from ggml_bridge import cli
from ggml_bridge.experiments import allreduce_check
from ggml_bridge.experiments.doctor import cost

from helpers import REPO_ROOT

H100_RUN = REPO_ROOT / "results/2026-12-06-h100x1-bridge-allreduce/test-bridge-allreduce.txt"
#: the later output: each row also says the host's share of a call (host_us_median)
H100_HOST_RUN = REPO_ROOT / "results/2026-12-06-h100x1-tensor-split/allreduce/test-bridge-allreduce.txt"
LINK = (55.2e9, 7.4e-6)


def line(n: int, nbytes: int, path: str, us: float) -> str:
    return f"bench: devices={n} ne={nbytes // 4} bytes={nbytes} path={path} us_median={us} us_min={us} us_max={us} rounds=5"


def test_the_in_kernel_path_reads_every_peer_and_the_copy_path_scatters():
    b, n = 32768.0, 6
    launch = (n - 1) * cost.H_LAUNCH  # the sixth device's part is enqueued after the five before it
    kernel = cost.t_allreduce(b, n, *LINK, "bridge-allreduce")
    assert kernel == pytest.approx(LINK[1] + cost.E_EVENT + launch + b / LINK[0] + (n - 1) * b / LINK[0])
    big = 4.0 * 2**20
    # the default from three devices: the devices' reduce-scatter, one tensor down and 2(N-1)/N up per card
    scatter = cost.t_allreduce(big, n, *LINK, "bridge-allreduce")
    assert scatter == pytest.approx(
        2 * LINK[1] + cost.E_EVENT + launch + big / LINK[0] + 2 * (n - 1) / n * big / LINK[0]
    )
    # the host's sums: the last chunk's sum up (a quarter of the tensor, 512 KiB to 2 MiB) after the tensor down, or
    # after the host's additions of the six tensors where they take longer (at 15 GB/s they do on this link)
    host = cost.t_allreduce(big, n, *LINK, "bridge-allreduce-host")
    assert host == pytest.approx(2 * LINK[1] + cost.E_EVENT + launch + 2**20 / LINK[0] + 6 * big / cost.H_SUM)
    slow = (1e9, LINK[1])  # about PCIe Gen3 x1: the link bounds, and the host's sums move fewer bytes
    slow_host = cost.t_allreduce(big, n, *slow, "bridge-allreduce-host")
    assert slow_host == pytest.approx(2 * LINK[1] + cost.E_EVENT + launch + (big + 2**20) / slow[0])
    assert slow_host < cost.t_allreduce(big, n, *slow, "bridge-allreduce")
    assert [cost.bar_host_chunk(b) for b in (600e3, 4 * 2**20, 10 * 2**20, 64 * 2**20)] == [524288, 2**20, 2**21, 2**21]
    assert cost.bar_host_chunk(4096.0) == 4096.0  # never more than the tensor
    # on one link every device's bytes cross it: six devices move (6 + 30) tensors in-kernel, (6 + 10) by the
    # reduce-scatter one direction after the other; the host's sums 6 tensors down and beside them 6 sums up, one
    # chunk's after, or the host's additions where slower
    one = cost.t_bridge_allreduce_one_link(big, n, *LINK)
    assert one == pytest.approx(2 * LINK[1] + cost.E_EVENT + launch + 16 * big / LINK[0])
    host = cost.t_bridge_allreduce_one_link(big, n, *LINK, host_sums=True)
    assert host == pytest.approx(2 * LINK[1] + cost.E_EVENT + launch + 6 * 2**20 / LINK[0] + 6 * big / cost.H_SUM)
    fast_host = cost.t_bridge_allreduce_one_link(big, n, LINK[0] / 10, LINK[1], host_sums=True)
    assert fast_host == pytest.approx(2 * LINK[1] + cost.E_EVENT + launch + 10 * (6 * big + 6 * 2**20) / LINK[0])
    assert cost.t_bridge_allreduce_one_link(b, n, *LINK) == pytest.approx(
        LINK[1] + cost.E_EVENT + launch + 36 * b / LINK[0]
    )


def test_the_host_launch_term_is_what_the_bench_measured_and_puts_the_in_kernel_rows_within_the_bound():
    """H_LAUNCH is the host's share of a call per device in the run that measured it (host_us_median / N, in-kernel
    rows), and with it the rows of the two earlier runs, which it was not taken from, lie within 1.5x."""
    rework = allreduce_check.read(
        REPO_ROOT / "results/2026-12-06-h100x1-allreduce-rework/allreduce/test-bridge-allreduce.txt"
    )
    per_device = [
        t.host_us / t.devices for t in rework.timings if t.host_us is not None and t.nbytes <= cost.BAR_KERNEL_MAX
    ]
    assert per_device and all(abs(x * 1e-6 - cost.H_LAUNCH) <= 0.4e-6 for x in per_device), per_device
    for run in (H100_RUN, H100_HOST_RUN):
        last = allreduce_check.table(allreduce_check.read(run), LINK, one_link=True).splitlines()[-1]
        inside, total = (int(x) for x in last.split(" within ")[0].split(" of "))
        assert inside == total, last


def test_read_tells_the_variants_apart(tmp_path):
    out = tmp_path / "bench.txt"
    out.write_text(
        "\n".join(
            [
                line(2, 8192, "bridge", 10.0),
                line(2, 8192, "internal-f32", 12.0),
                # the first version: 'bridge' the reduce-scatter where 'bridge-gather' stands beside it
                line(4, 8192, "bridge", 30.0),
                line(4, 8192, "bridge-gather", 20.0),
                line(6, 8192, "bridge-scatter", 70.0),
                "order: n=3 a left-to-right sum differs ...",
            ]
        )
    )
    got = {(t.devices, t.variant): t.us for t in allreduce_check.read(out).timings}
    assert got == {(2, "gather"): 10.0, (4, "scatter"): 30.0, (4, "gather"): 20.0, (6, "scatter"): 70.0}


def test_read_tells_the_host_sums_from_the_devices_sums(tmp_path):
    """From 2026-12-07 on a copy-engine 'bridge' row of three or more devices is the host's sums wherever the output
    has a 'bridge-devsum' row of the same device count; the earlier outputs have none and their 'bridge' rows stay
    the devices' reduce-scatter (so the runs of 2026-12-06 keep their predictions)."""
    big = 10 << 20
    out = tmp_path / "bench.txt"
    out.write_text(
        "\n".join(
            [
                line(4, 8192, "bridge", 20.0),
                line(4, big, "bridge", 900.0),
                line(4, big, "bridge-devsum", 1300.0),
                line(4, big, "bridge-host1", 2000.0),
                line(3, big, "bridge", 1000.0),  # no devsum row of three devices: the devices' sums
            ]
        )
    )
    got = {(t.devices, t.nbytes, t.us): t.host_sums for t in allreduce_check.read(out).timings}
    assert got == {(4, 8192, 20.0): False, (4, big, 900.0): True, (4, big, 1300.0): False, (3, big, 1000.0): False}
    text = allreduce_check.table(allreduce_check.read(out), LINK, one_link=True)
    host = cost.t_bridge_allreduce_one_link(big, 4, *LINK, host_sums=True) * 1e6
    assert f"| 4 | {big} | copy engines, host sums | 900.00 | - | {host:.2f} |" in text
    assert f"| 4 | {big} | copy engines | 1300.00 |" in text and "5 of" not in text.splitlines()[-1]


def test_read_takes_bridge_host_rows_as_the_host_sums(tmp_path):
    """From the series of 2026-12-07 evening the devices sum by default ('bridge', no 'bridge-devsum' row) and the
    test program prints the host's sums as 'bridge-host'."""
    big = 4 << 20
    out = tmp_path / "bench.txt"
    out.write_text("\n".join([line(6, big, "bridge", 1000.0), line(6, big, "bridge-host", 700.0)]))
    got = {t.us: t.host_sums for t in allreduce_check.read(out).timings}
    assert got == {1000.0: False, 700.0: True}


def test_a_bench_line_cut_by_a_log_line_is_counted_and_does_not_turn_its_neighbour_into_the_devices_sums(tmp_path):
    """The run of 2026-12-07 evening (series of aef55a9): ggml's stats line on stderr cut the 4-device 10 MiB
    'bridge-devsum' row; its 'bridge' row (the host's sums there) was then read as the devices' sums. The device
    count's other devsum row decides now, and the cut line is counted in the table's last line."""
    big, four = 10 << 20, 4 << 20
    out = tmp_path / "bench.txt"
    devsum = line(4, big, "bridge-devsum", 2039.67)
    out.write_text(
        "\n".join(
            [
                line(4, four, "bridge", 1312.0),
                line(4, four, "bridge-devsum", 788.0),
                line(4, big, "bridge", 2732.0),
                devsum[: devsum.index(" us_max=") + 3] + "ggml_cuda_bridge_allreduce: stats: devices=4 allreduces=90",
            ]
        )
    )
    measured = allreduce_check.read(out)
    assert measured.cut == 1
    assert {t.us: t.host_sums for t in measured.timings} == {1312.0: True, 788.0: False, 2732.0: True}
    assert (
        "1 'bench:' line(s) cut by other output, left out"
        in allreduce_check.table(measured, LINK, one_link=True).splitlines()[-1]
    )


def test_the_evening_run_reads_its_host_sums_rows_as_such():
    """The recorded output itself: every host-sums row of three or more devices at 4 and 10 MiB is read as such."""
    run = REPO_ROOT / "results/2026-12-07-h100x1-allreduce-host-functions/test-bridge-allreduce.txt"
    measured = allreduce_check.read(run)
    host = {(t.devices, t.nbytes) for t in measured.timings if t.host_sums}
    assert host == {(n, b) for n in (3, 4, 5, 6) for b in (4 << 20, 10 << 20)}
    assert measured.cut == 3  # the stats lines of 3 and 6 devices at 20 KiB and of 4 devices at 10 MiB


def test_a_measurement_equal_to_the_prediction_has_ratio_one(tmp_path):
    n, b = 4, 4 * 2**20
    us = cost.t_bridge_allreduce_one_link(b, n, *LINK, host_sums=True) * 1e6
    row = allreduce_check.Timing(n, b, "gather", us, 5, host_sums=True)
    text = allreduce_check.table(allreduce_check.Output((row,)), LINK, one_link=True)
    assert "| 4 | 4194304 | copy engines, host sums |" in text and "| 1.00 |" in text and "1 of 1 within 1.5x" in text
    slow = allreduce_check.table(allreduce_check.Output((dataclasses.replace(row, us=us * 2),)), LINK, one_link=True)
    assert "0 of 1 within 1.5x" in slow and "| 2.00 |" in slow


def test_the_command_prints_the_h100_run(capsys):
    assert cli.main(["paper-model", "--allreduce-bench", str(H100_RUN), "--one-link"]) == 0
    out = capsys.readouterr().out
    assert "## The bridge's all-reduce: predicted vs measured" in out
    assert "| 6 | 4194304 | copy engines | 1061.29 |" in out and "every device on one link" in out


def test_rows_with_the_hosts_share_are_read_and_shown(capsys):
    """test-bridge-allreduce --bench also prints host_us_median, the time to enqueue a call: such an output was
    refused as 'not a bench output'."""
    rows = allreduce_check.read(H100_HOST_RUN)
    six = {t.nbytes: t for t in rows.timings if t.devices == 6 and t.variant == "gather"}
    assert (six[8192].us, six[8192].host_us) == (38.31, 18.75)
    assert cli.main(["paper-model", "--allreduce-bench", str(H100_HOST_RUN), "--one-link"]) == 0
    assert "| 6 | 8192 | in-kernel | 38.31 | 18.75 |" in capsys.readouterr().out


def test_the_command_refuses_what_is_not_a_bench_output(tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text("1926 passed, 0 failed\n")
    assert cli.main(["paper-model", "--allreduce-bench", str(other)]) == 2
    err = capsys.readouterr().err
    assert "has no 'bench: ... path=bridge' lines" in err and "Traceback" not in err
    assert cli.main(["paper-model", "--one-link"]) == 2
    assert "--one-link goes with --allreduce-bench" in capsys.readouterr().err


def test_an_output_of_the_reduce_scatter_alone_is_one_line(tmp_path, capsys):
    only = tmp_path / "scatter.txt"
    only.write_text(line(4, 8192, "bridge-scatter", 30.0) + "\n")
    assert cli.main(["paper-model", "--allreduce-bench", str(only), "--one-link"]) == 2
    err = capsys.readouterr().err
    assert "no row of the bridge's default all-reduce" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "n, butterfly, bridge, scatter",
    [
        # (cards, the butterfly's tensors on the busiest card's link / on one shared link, the bridge's the same)
        (2, (1, 2), (1, 2), (1, 2)),  # one exchange either way
        (3, (2, 4), (1, 3), (4 / 3, 4)),  # fold + one step + unfold; host: one tensor each way; 2(N-1)/N up
        (4, (2, 8), (1, 4), (3 / 2, 6)),
        (6, (3, 12), (1, 6), (5 / 3, 10)),  # fold 2 into 4, two steps over 4 cards, unfold 2
    ],
)
def test_the_bytes_of_an_all_reduce(n, butterfly, bridge, scatter):
    bf, ar = cost.allreduce_traffic(n, "butterfly"), cost.allreduce_traffic(n, "bridge-host")
    assert (bf.card(), bf.shared()) == pytest.approx(butterfly)
    assert (ar.card(), ar.shared()) == pytest.approx(bridge)
    rs = cost.allreduce_traffic(n, "bridge-scatter")  # the default: the devices' reduce-scatter
    assert (rs.card(), rs.shared()) == pytest.approx(scatter)
    kernel = cost.allreduce_traffic(n, "bridge-kernel")  # every card reads the N - 1 others
    assert (kernel.card_up, kernel.shared_up) == (n - 1, n * (n - 1))


def test_the_bytes_table_says_what_bytes_allow():
    """The devices' reduce-scatter (the default): on one shared link three cards move as many tensors as the butterfly
    (1.00x), six 10 against 12 (1.20x); a link per card 1.50x on three. The host's sums: on one shared link three
    cards move 3 tensors each way where the butterfly moves 4 (1.33x), four and six half the butterfly's; on a link
    per card one tensor each way (2x, 3x on six)."""
    from ggml_bridge.experiments import paper_model

    rows = {r.split(" | ")[0].strip("| "): r for r in paper_model.allreduce_bytes_table().splitlines()[2:]}
    assert rows["3"].endswith("| 1.33 | 1.50x | 1.00 | 2.00x | 4.00 | 4.00 | 1.00x | 3.00 | 1.33x |")
    assert rows["6"].endswith("| 1.67 | 1.80x | 1.00 | 3.00x | 12.00 | 10.00 | 1.20x | 6.00 | 2.00x |")
    with pytest.raises(ValueError, match="unknown all-reduce path"):
        cost.allreduce_traffic(3, "ring")
