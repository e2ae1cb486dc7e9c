"""Paper model of a host round trip per cross-card boundary: the bridge vs sequential staging.

``ggml-bridge paper-model`` prints the Markdown tables of docs/paper-model.md (``--bench``: a bench report's
predicted-vs-measured table). Inputs are the link's one-way bandwidth B and per-copy
latency L, the model's hidden size h, the ubatch U, the number of cards D, and for sequential staging the
host-side synchronization cost S and the pageable-memory bandwidth Bp of its malloc'd buffer.

    b            = U * h * 4                          bytes of one boundary (f32 activations)
    t_seq(b)     = 2*S + 2*(L + b / min(B, Bp))        NO_PEER_COPY: sync, D2H into malloc, H2D out of it
    t_bridge(b)  = 2*L + E + b/B + min(b, C)/B          D2H of chunk i+1 overlaps H2D of chunk i
    per token    (D-1) * t(h*4)                         token generation: boundaries are latency-bound
    per prompt   sequential: n_ub * (D-1) * t_seq(b)    (no pipeline parallelism: it is switched off)
                 bridge:     ~ (n_ub + D - 1) * k*b/B   link time of the busiest card when transfers overlap
                                                        compute: k = 1 with two cards (one direction each),
                                                        k = 2 with more (a middle card receives and sends)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..foundations import files
from ..foundations.errors import UsageError, os_reason
from ..foundations.tomlfile import Key

# the formulas and their constants are defined once, in the package (the doctor uses them with measured links)
from .doctor.cost import MiB, allreduce_traffic, per_token_layer, per_token_tensor, t_bridge, t_seq

LINKS = {
    # name: (one-way bandwidth B in bytes/s, per-copy latency L in s)
    "H200 PCIe Gen5 x16 (measured)": (55.2e9, 7.4e-6),
    "PCIe Gen3 x16": (12e9, 10e-6),
    "PCIe Gen1 x1 (six-card riser rig)": (0.25e9, 10e-6),
}

# Network links between hosts (llama.cpp RPC over TCP, docs/rpc.md): (goodput of one TCP stream in bytes/s,
# round trip of a small request in s). Assumed, not measured here: 10/25 GbE at ~94 % of line rate; 100 GbE
# single-stream TCP without tuning rarely passes ~70 % of line rate.
NETWORKS = {
    "10 GbE": (1.17e9, 50e-6),
    "25 GbE": (2.9e9, 35e-6),
    "100 GbE": (8.75e9, 25e-6),
}


def t_tcp(b: float, Bn: float, rtt: float, B: float, L: float) -> float:
    """One boundary between GPUs of two hosts: GET_TENSOR (a round trip, the data back to llama-server) and
    SET_TENSOR (sent without a reply: ~half a round trip), one after the other, plus each server's own D2H or
    H2D over its PCIe link (B, L); no overlap: the RPC backend has no async copy, so no pipeline parallelism."""
    return 1.5 * rtt + 2 * b / Bn + 2 * (L + b / B)


def fmt(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} µs"


def tables() -> str:
    out = [
        "| link | hidden | cards | per token: sequential | per token: bridge | prompt 4096 @ ub512: sequential | "
        "prompt 4096 @ ub512: bridge (overlapped) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (B, L) in LINKS.items():
        for h in (4096, 8192):
            for D in (2, 6):
                tok_b = h * 4
                ub_b = 512 * h * 4
                n_ub = 4096 // 512
                seq_tok = (D - 1) * t_seq(tok_b, B, L)
                br_tok = (D - 1) * t_bridge(tok_b, B, L)
                seq_pp = n_ub * (D - 1) * t_seq(ub_b, B, L)
                br_pp = (n_ub + D - 1) * (1 if D == 2 else 2) * ub_b / B
                out.append(f"| {name} | {h} | {D} | {fmt(seq_tok)} | {fmt(br_tok)} | {fmt(seq_pp)} | {fmt(br_pp)} |")
    return "\n".join(out)


def network_tables() -> str:
    """A boundary that crosses TCP next to one the bridge carries inside a host (two cards)."""
    B5, L5 = LINKS["H200 PCIe Gen5 x16 (measured)"]
    out = ["| boundary | link | hidden | per token | prompt 4096 @ ub512 |", "|---|---|---|---|---|"]
    n_ub = 4096 // 512
    for h in (4096, 8192):
        tok_b, ub_b = h * 4, 512 * h * 4
        for name, (Bn, rtt) in NETWORKS.items():
            out.append(
                f"| between hosts (RPC, TCP; Gen5 x16 in each host) | {name} | {h} | "
                f"{fmt(t_tcp(tok_b, Bn, rtt, B5, L5))} | {fmt(n_ub * t_tcp(ub_b, Bn, rtt, B5, L5))} |"
            )
        for name, (B, L) in LINKS.items():
            out.append(
                f"| inside a host, bridge (overlapped) | {name} | {h} | {fmt(t_bridge(tok_b, B, L))} | "
                f"{fmt((n_ub + 1) * ub_b / B)} |"
            )
            out.append(
                f"| inside a host, sequential staging | {name} | {h} | {fmt(t_seq(tok_b, B, L))} | "
                f"{fmt(n_ub * t_seq(ub_b, B, L))} |"
            )
    return "\n".join(out)


def read_microbench(path: Path) -> dict[tuple[str, int], float]:
    """The microbenchmark's ``bench,path,bytes,iters,seconds,GB/s,us_per_copy_synced`` rows: (path, bytes) -> seconds
    per copy. A UsageError naming the file when it cannot be read, is not UTF-8 text, or holds no such row or a row
    whose figures are not numbers."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"--microbench {path} is not UTF-8 text", why=f"byte {e.start}: {e.reason}", fix="pass the CSV it wrote"
        ) from None
    except OSError as e:
        raise UsageError(f"cannot read --microbench {path}", why=os_reason(e)) from None
    measured: dict[tuple[str, int], float] = {}
    for n, r in enumerate(csv.reader(text.splitlines()), 1):
        if len(r) == 7 and r[0] == "bench" and r[1] != "path":
            try:
                measured[(r[1], int(r[2]))] = float(r[6]) * 1e-6
            except ValueError:
                raise UsageError(f"--microbench {path}, line {n}: {','.join(r)[:80]!r} is not a bench row") from None
    if not measured:
        raise UsageError(
            f"--microbench {path} has no bench rows",
            why="the check needs the lines bench,PATH,BYTES,ITERS,SECONDS,GB/s,US of test-mapped-host-bridge",
            fix="pass the microbenchmark's CSV",
        )
    return measured


def check(microbench: Path | None, *, given: bool = False) -> str:
    """Predicted vs measured single-boundary copy time on the H200 machine (one copy plus synchronization). A file
    the user ``given`` must be a microbenchmark; the project's own is left out where it is missing (an installed
    wheel has no results folder)."""
    B, L = LINKS["H200 PCIe Gen5 x16 (measured)"]
    rows = [
        "| bytes | bridge predicted | bridge measured | sequential predicted | NO_PEER_COPY path measured |",
        "|---|---|---|---|---|",
    ]
    measured: dict[tuple[str, int], float] = {}
    if microbench and (given or microbench.is_file()):
        measured = read_microbench(microbench)
    for b in (4096, 65536, MiB, 16 * MiB, 256 * MiB):
        mb = measured.get(("bridge", b))
        ms = measured.get(("sync-malloc", b))
        rows.append(
            f"| {b} | {fmt(t_bridge(b, B, L))} | {fmt(mb) if mb else '—'} | {fmt(t_seq(b, B, L))} | "
            f"{fmt(ms) if ms else '—'} |"
        )
    return "\n".join(rows)


# --- hosts: llama.cpp RPC over a network link (docs/rpc.md, "How many hosts") -------------------------------
#
# b11434's RPC client (ggml-rpc.cpp) queues every command on one dispatcher thread per rpc-server, in order over
# one socket: SET_TENSOR and GRAPH_COMPUTE / GRAPH_RECOMPUTE (a graph already sent is not sent again) are one-way,
# GET_TENSOR waits for its answer, which the server sends once the queued graph has run. A layer split over the
# front (llama-server / llama-bench, with or without a GPU of its own) and S rpc-servers, one contiguous run of
# layers each, therefore adds per graph (a token in generation, a ubatch of U tokens in a prompt) and per server:
#
#     t_hop(U) = 2*d + 2 * U*h*e / R + t_msg
#
# the activation in (SET, one way: d + b/R) and out again (GET: its request travels right behind the SET, the
# answer d + b/R after the compute), b = U*h*e bytes (h = n_embd, e = 4: activations cross as f32), d = one-way
# latency, R = rate per direction, t_msg = the fixed cost of the commands themselves. Between two rpc-servers
# the activation goes through the front (GET, then SET): the same two transfers per server. Nothing overlaps on
# the critical path of one graph (a hop's transfers wait for the previous stage), so
#
#     t_token(S, link) = t_local + S * t_hop(1)            (generation)
#     t_prompt(S, link) = t_local_prompt + n_ub * S * t_hop(U)    (prompt of n_ub ubatches, serial; with several
#                                                           ubatches in flight a stage's link can overlap other
#                                                           stages' compute: then ~ max of the two)
#
# Checked against the shaped-link bench (suite rpc-link): t_local is the local case, S * t_msg is calibrated
# once from the rpc case through an unshaped shaper (link unlimited/0: the same proxy hop, no rate, no delay),
# and every shaped case is predicted from d and R alone.

E_ACT = 4  # bytes per activation element crossing a boundary (f32)


@dataclass(frozen=True)
class Net:
    name: str
    rate: float  # bytes/s per direction (goodput)
    delay: float  # s one way, small message, stacks included


#: real networks for the host question: NETWORKS above (goodput, round trip) as rate and one-way delay
NETS = [Net(n, b, rtt / 2) for n, (b, rtt) in NETWORKS.items()]


def t_hop(tokens: int, n_embd: int, rate: float, delay: float, t_msg: float = 0.0) -> float:
    """What one rpc-server adds to one graph of ``tokens`` tokens: the activation in and out, one round trip."""
    b = tokens * n_embd * E_ACT
    return 2 * delay + (0.0 if math.isinf(rate) else 2 * b / rate) + t_msg


def predict_tps(
    test: str, local_tps: float, calib_tps: float, servers: int, n_embd: int, rate: float, delay: float
) -> float:
    """Tokens/s of ``test`` (``pp4096/ub512``, ``tg128``) over a link, from the local run and the calibration run
    (same topology through an unshaped link: carries S*t_msg and the RPC backend's own costs)."""
    if test.startswith("tg"):
        return 1.0 / (1.0 / calib_tps + servers * t_hop(1, n_embd, rate, delay))
    n, _, ub = test[2:].partition("/ub")
    n_tok, u = int(n), int(ub or n)
    n_ub = math.ceil(n_tok / u)
    return n_tok / (n_tok / calib_tps + n_ub * servers * t_hop(u, n_embd, rate, delay))


def check_bench(report: Path, shape_name: str | None = None, calibration: str = "unlimited/0") -> str:
    """Predicted vs measured tokens/s for every link case of a ``ggml-bridge bench --suite rpc-link`` report
    (bench.json): one table, each row also as a share of the local run."""
    from ..runtime import shaper
    from . import model as modelmod

    fix = "pass the bench.json of `ggml-bridge bench --suite rpc-link`"
    rep = files.read_json(
        Path(report),
        "bench report",
        shape={"model": Key("table"), "cases": Key("tables"), "summary": Key("table"), "links": Key("table")},
        required=("model", "cases", "summary"),
        fix=fix,
    )
    if not isinstance(rep["model"].get("shape"), str) and shape_name is None:
        raise UsageError(f"{report} names no model shape", fix="pass --shape NAME")
    shape = modelmod.get_shape(shape_name or rep["model"]["shape"])
    servers = int((rep.get("links") or {}).get("rpc_servers", 1))
    cases = {str(c.get("name")): c for c in rep["cases"]}
    summ = rep["summary"]
    local = next((n for n in ("off", "upstream") if n in summ), None)
    calib = next((n for n, c in cases.items() if c.get("link") == calibration and n in summ), None)
    if local is None or calib is None:
        raise UsageError(
            f"{report} is not a report of the rpc-link suite",
            why=f"it needs the local case and a case over {calibration} (the calibration)",
            fix=fix,
        )
    rows = [
        f"Model {shape.name}: n_embd {shape.n_embd}, {shape.n_layer} layers; {servers} rpc-server(s); "
        f"calibration: {calib} (S*t_msg and the RPC backend's own costs), local: {local}.",
        "",
        "| case | link | test | local t/s | measured t/s | predicted t/s | predicted / measured | measured / local |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cases.items():
        if not c.get("link") or name not in summ or name == calib:
            continue
        link = shaper.parse_link(c["link"])
        for test, s in summ[name].items():
            if test not in summ[local] or test not in summ[calib]:
                continue
            loc, cal, meas = summ[local][test]["median"], summ[calib][test]["median"], s["median"]
            pred = predict_tps(test, loc, cal, servers, shape.n_embd, link.rate, link.delay)
            rows.append(
                f"| {name} | {link} | {test} | {loc:.1f} | {meas:.1f} | {pred:.1f} | {pred / meas:.3f} | "
                f"{meas / loc:.3f} |"
            )
    return "\n".join(rows)


# compute per token on one H200 (the GPUs' side of the question), roofline: generation streams the weights from
# HBM (4.8 TB/s, ~70 % reached), a prompt ubatch is dense matmul (989 TFLOP/s bf16 dense, ~50 % reached)
HBM = 4.8e12 * 0.7
FLOPS = 989e12 * 0.5

#: the models of the question: the ladder's and bench's presets, and a 70B-class shape (llama-2/3-70B widths)
HOST_MODELS = [
    ("bench-1b", None),
    ("bench-2b-6l", None),
    ("bench-3b", None),
    ("70B-class", dict(n_embd=8192, n_layer=80, n_params=70e9)),
]


def _model_sizes(name: str, spec: dict[str, Any] | None) -> tuple[int, int, float]:
    if spec:
        return int(spec["n_embd"]), int(spec["n_layer"]), float(spec["n_params"])
    from . import model as modelmod

    sh = modelmod.get_shape(name)
    return sh.n_embd, sh.n_layer, float(sh.n_params())


def hosts_table(bytes_per_param: float = 2.0, ubatch: int = 512) -> str:
    """How many hosts (front + S rpc-servers) before the network's share of a token reaches the GPUs' (50 %) and
    10 %, per model and network, for generation and for prompt ubatches."""
    out = [
        "| model | n_embd | layers | params | network | GPU time per token (tg) | per host hop (tg) | "
        "hosts at 10 % / 50 % network (tg) | GPU time per ubatch of 512 (pp) | per host hop (pp) | "
        "hosts at 10 % / 50 % network (pp) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, spec in HOST_MODELS:
        h, layers, params = _model_sizes(name, spec)
        comp_tg = params * bytes_per_param / HBM
        comp_pp = 2 * params * ubatch / FLOPS
        for net in NETS:
            hop_tg = t_hop(1, h, net.rate, net.delay)
            hop_pp = t_hop(ubatch, h, net.rate, net.delay)

            def hosts(comp: float, hop: float, share: float, layers: int = layers) -> str:
                # network share = S*hop / (comp + S*hop) >= share  <=>  S >= share/(1-share) * comp/hop
                s = math.ceil(share / (1 - share) * comp / hop)
                return f"{min(s, layers) + 1}" + ("+" if s > layers else "")

            out.append(
                f"| {name} | {h} | {layers} | {params / 1e9:.1f} B | {net.name} | {fmt(comp_tg)} | "
                f"{fmt(hop_tg)} | {hosts(comp_tg, hop_tg, 0.1)} / {hosts(comp_tg, hop_tg, 0.5)} | "
                f"{fmt(comp_pp)} | {fmt(hop_pp)} | {hosts(comp_pp, hop_pp, 0.1)} / "
                f"{hosts(comp_pp, hop_pp, 0.5)} |"
            )
    return "\n".join(out)


def tensor_table(layers: int = 32) -> str:
    """A token's link time under -sm tensor (two all-reduces per layer, docs/tensor.md) against -sm layer's boundaries,
    per link, hidden size and card count, for a model of ``layers`` layers."""
    out = [
        "| link | hidden | cards | layer split (bridge) | tensor: the bridge's all-reduce (0007) | tensor: butterfly "
        "through the bridge | tensor: butterfly, no peer access | tensor: upstream internal (2 cards) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (B, L) in LINKS.items():
        for h in (4096, 8192):
            for n in (2, 4, 6):
                layer = per_token_layer(h, n, B, L, "bridge")
                tensor = " | ".join(
                    fmt(per_token_tensor(h, layers, n, B, L, p)) for p in ("bridge-allreduce", "bridge", "seq")
                )
                internal = fmt(per_token_tensor(h, layers, n, B, L, "internal")) if n == 2 else "-"
                out.append(f"| {name} | {h} | {n} | {fmt(layer)} | {tensor} | {internal} |")
    return "\n".join(out)


def allreduce_bytes_table(counts: tuple[int, ...] = (2, 3, 4, 5, 6)) -> str:
    """The bytes of one all-reduce (in tensors, the busier direction) over a link per card and over one link that all
    cards share, the butterfly against the bridge's copy path (patch 0007 above its in-kernel limit: the devices'
    reduce-scatter by default, the host's sums asked for): their ratio is the most the bridge's all-reduce can gain
    over the butterfly from bytes alone, whatever carries the copies."""
    out = [
        "| cards | butterfly, a link per card | bridge | most from bytes | bridge, host's sums | most from bytes | "
        "butterfly, one shared link | bridge | most from bytes | bridge, host's sums | most from bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in counts:
        bf = allreduce_traffic(n, "butterfly")
        ar, host = allreduce_traffic(n, "bridge-scatter"), allreduce_traffic(n, "bridge-host")
        out.append(
            f"| {n} | {bf.card():.2f} | {ar.card():.2f} | {bf.card() / ar.card():.2f}x | {host.card():.2f} | "
            f"{bf.card() / host.card():.2f}x | {bf.shared():.2f} | {ar.shared():.2f} | "
            f"{bf.shared() / ar.shared():.2f}x | {host.shared():.2f} | {bf.shared() / host.shared():.2f}x |"
        )
    return "\n".join(out)


def report(microbench: Path, *, given: bool = False) -> str:
    """Every table of docs/paper-model.md, the microbenchmark check against ``microbench`` (``given``: the user's,
    checked before any table is made)."""
    measured_check = check(microbench, given=given)
    return "\n".join(
        [
            "## Predicted transfer time added by the boundaries\n",
            tables(),
            "\n## Tensor split: a token's all-reduces against layer split's boundaries (32 layers)\n",
            tensor_table(),
            "\n### The all-reduce's bytes: the bridge's against the butterfly\n",
            allreduce_bytes_table(),
            "\n## Network links (RPC between hosts) next to PCIe, one boundary, two cards\n",
            network_tables(),
            "\n## Check against the H200 microbenchmark\n",
            measured_check,
            "\n## Hosts: how many before the network bounds tokens/s\n",
            hosts_table(),
        ]
    )
