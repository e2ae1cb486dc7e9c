"""Reports: the progress line, the Markdown rendering and the report files (report.json: the results'
``as_json``)."""

from __future__ import annotations

import json
from pathlib import Path

from .registry import ARTIFACTS
from .results import LadderResult, ModeResult, RpcServerSeen, RungResult


def _human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _bytes_compared(modes: list[ModeResult]) -> int:
    return sum(c.bytes_compared for m in modes for c in (m.compare or {}).values())


def progress_line(i: int, n: int, rep: RungResult) -> str:
    ref = rep.rung.reference
    others = [m for m in rep.modes if m != ref]
    total = _bytes_compared([rep.modes[m] for m in others])
    verdict = {"pass": "PASS", "mismatch": "MISMATCH", "invalid": "INVALID", "error": "ERROR"}[rep.status]
    extra = ""
    notes = [n for m in rep.modes.values() for n in (m.validity.notes if m.validity else ())]
    if notes:
        extra = f" [{notes[0]}]"
    if rep.problems:
        extra += f" -- {rep.problems[0]}"
    return (
        f"[{i}/{n}] {rep.rung.name}: {ref} vs {', '.join(others) or '-'}: {verdict}, "
        f"{_human(total)} compared, {rep.wall_s:.1f}s{extra}"
    )


def markdown_report(rep: LadderResult) -> str:
    L = [
        f"# Ladder `{rep.ladder}`: {rep.status.upper()}",
        "",
        f"- file: `{rep.file}`",
        f"- started: {rep.started}",
        f"- wall time: {rep.wall_s:.1f}s",
    ]
    L += [f"- {side} binaries: `{d}`" for side, d in rep.binaries.items()]
    if rep.same_build:
        L.append(
            "- **warning: patched and upstream binaries are the same build; upstream-vs-patched "
            "comparisons prove nothing about the patches**"
        )
    L += [
        "",
        "| rung | shape | devices | ub/b | reference | status | bytes compared | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in rep.rungs:
        r = res.rung
        dev = (
            "cpu"
            if not r.devices
            else f"{r.devices} GPU" + (f" as {r.virtual_devices} cards" if r.virtual_devices else "")
        )
        total = _bytes_compared(list(res.modes.values()))
        L.append(
            f"| {r.name} | {r.shape.name} ({r.shape.n_embd}x{r.shape.n_layer}, "
            f"{r.shape.dtype}) | {dev} {r.split_mode if r.devices else ''} | "
            f"{r.ubatch}/{r.batch} | {r.reference} | {res.status} | {_human(total)} | "
            f"{res.wall_s:.1f}s |"
        )
    for res in rep.rungs:
        L += _rung_section(res)
    return "\n".join(L) + "\n"


def _rung_section(res: RungResult) -> list[str]:
    r, p = res.rung, res.prepared
    L = ["", f"## {r.name}: {res.status}", ""]
    if res.error:
        L += [f"setup error: {res.error}", ""]
    if p.n_params:
        L.append(
            f"model: {p.n_params / 1e6:.1f}M params, seed {r.seed}, boundary activation "
            f"{p.boundary_mib_f32 or 0:.2f} MiB f32 (n_embd x ubatch); server ctx {r.server_ctx()}, "
            f"perplexity ctx {r.perplexity_ctx()}"
        )
        L.append("")
    L += [
        "| mode | " + "".join(f"{a} sha256 | " for a in ARTIFACTS) + "vs reference | mechanism | wall |",
        "|---|" + "---|" * len(ARTIFACTS) + "---|---|---|",
    ]
    for name, m in res.modes.items():
        shas = "".join(f"`{_sha(m, a)[:16]}` | " for a in ARTIFACTS)
        vs = "reference" if name == r.reference else _vs_reference(m)
        mech = _mechanisms(m)
        L.append(f"| {name} | {shas}{vs} | {'; '.join(mech) or '-'} | {m.wall_s:.1f}s |")
    if res.problems:
        L += ["", "Problems:", ""] + [f"- {p}" for p in res.problems]
    return L


def _sha(m: ModeResult, artifact: str) -> str:
    rec = m.artifacts.get(artifact)
    return rec.sha256 if rec else "-"


def _vs_reference(m: ModeResult) -> str:
    if m.compare is None:
        return "not compared"
    parts = []
    for kind, c in m.compare.items():
        if c.identical:
            parts.append(f"{kind} identical ({_human(c.bytes_compared)})")
        else:
            fd = c.first_difference or {}
            parts.append(
                f"{kind} DIFFER at byte {fd.get('offset')}: {fd.get('where')} "
                f"ref={fd.get('reference')} mode={fd.get('mode')}"
            )
    return "; ".join(parts)


def _mechanisms(m: ModeResult) -> list[str]:
    """What engaged in one mode: the bridge, batching, each rpc-server; its error and problems."""
    v = m.validity
    mech = []
    if v and v.bridge:
        bb = v.bridge
        slots = sorted({s for s in bb.per_process["slots"].values() if isinstance(s, int)})
        mech.append(
            f"bridge {bb.state}" + (f", {slots[0]} slots" if slots else "") + f", boundaries={bb.totals['boundaries']}"
        )
    if v and v.batched:
        tb = v.batched
        mech.append(f"batched {tb.state}, async up/down={tb.totals['async_uploads']}/{tb.totals['async_downloads']}")
    mech += [_rpc_server_line(ep, srv) for ep, srv in ((v.rpc if v else None) or {}).items()]
    mech += [n for n in (v.notes if v else ()) if n.startswith("rpc-server")]  # e.g. the bridge proven idle
    if m.error:
        mech.append(f"ERROR: {m.error.splitlines()[0]}")
    return mech + list(v.problems if v else ())


def _rpc_server_line(ep: str, srv: RpcServerSeen) -> str:
    c = srv.counters
    return (
        f"rpc-server {ep} ({','.join(srv.devices)}): graphs={c.get('rpc_graph_compute', '-')}"
        f" copy_tensor={c.get('rpc_copy_tensor', '-')} set/get MiB="
        f"{c.get('rpc_set_tensor_bytes', 0) / 2**20:.1f}/{c.get('rpc_get_tensor_bytes', 0) / 2**20:.1f}"
        + (
            f" bridge={'on' if srv.bridge_enabled else 'off'} boundaries={c.get('bridge_boundaries', '-')}"
            if c.get("bridge")
            else ""
        )
        + (
            f" link {srv.link.name}: up/down MiB={srv.link.up_bytes / 2**20:.2f}/{srv.link.down_bytes / 2**20:.2f}"
            if srv.link
            else ""
        )
    )


def write_reports(rep: LadderResult, report_dir: Path) -> None:
    """report.json and report.md of the run so far."""
    (report_dir / "report.json").write_text(json.dumps(rep.as_json(), indent=2, default=str) + "\n", encoding="utf-8")
    (report_dir / "report.md").write_text(markdown_report(rep), encoding="utf-8")
