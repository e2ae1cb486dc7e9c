"""Reports: the progress line and the Markdown rendering of report.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .registry import ARTIFACTS


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def progress_line(i: int, n: int, rep: dict[str, Any]) -> str:
    ref = rep["reference"]
    others = [m for m in rep["modes"] if m != ref]
    total = sum(c.get("bytes_compared", 0) for m in others for c in rep["modes"][m].get("compare", {}).values())
    verdict = {"pass": "PASS", "mismatch": "MISMATCH", "invalid": "INVALID", "error": "ERROR"}[rep["status"]]
    extra = ""
    notes = [n for m in rep["modes"].values() for n in (m.get("validity") or {}).get("notes", [])]
    if notes:
        extra = f" [{notes[0]}]"
    if rep["problems"]:
        extra += f" -- {rep['problems'][0]}"
    return (
        f"[{i}/{n}] {rep['name']}: {ref} vs {', '.join(others) or '-'}: {verdict}, "
        f"{_human(total)} compared, {rep.get('wall_s', 0):.1f}s{extra}"
    )


def markdown_report(rep: dict[str, Any]) -> str:
    L = [
        f"# Ladder `{rep['ladder']}`: {rep['status'].upper()}",
        "",
        f"- file: `{rep['file']}`",
        f"- started: {rep['started']}",
        f"- wall time: {rep['wall_s']:.1f}s",
    ]
    L += [f"- {side} binaries: `{d}`" for side, d in rep["binaries"].items() if side != "same_build"]
    if rep["binaries"].get("same_build"):
        L.append(
            "- **warning: patched and upstream binaries are the same build; upstream-vs-patched "
            "comparisons prove nothing about the patches**"
        )
    L += [
        "",
        "| rung | shape | devices | ub/b | reference | status | bytes compared | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["rungs"]:
        dev = (
            "cpu"
            if not r["devices"]
            else f"{r['devices']} GPU" + (f" as {r['virtual_devices']} cards" if r.get("virtual_devices") else "")
        )
        total = sum(c.get("bytes_compared", 0) for m in r["modes"].values() for c in m.get("compare", {}).values())
        L.append(
            f"| {r['name']} | {r['shape']['name']} ({r['shape']['n_embd']}x{r['shape']['n_layer']}, "
            f"{r['shape']['dtype']}) | {dev} {r['split_mode'] if r['devices'] else ''} | "
            f"{r['ubatch']}/{r['batch']} | {r['reference']} | {r['status']} | {_human(total)} | "
            f"{r.get('wall_s', 0):.1f}s |"
        )
    for r in rep["rungs"]:
        L += _rung_section(r)
    return "\n".join(L) + "\n"


def _rung_section(r: dict[str, Any]) -> list[str]:
    L = ["", f"## {r['name']}: {r['status']}", ""]
    if r.get("error"):
        L += [f"setup error: {r['error']}", ""]
    if r.get("n_params"):
        L.append(
            f"model: {r['n_params'] / 1e6:.1f}M params, seed {r['seed']}, boundary activation "
            f"{r['boundary_mib_f32']:.2f} MiB f32 (n_embd x ubatch); server ctx {r['ctx']}, "
            f"perplexity ctx {r['ppl_ctx']}"
        )
        L.append("")
    L += [
        "| mode | " + "".join(f"{a} sha256 | " for a in ARTIFACTS) + "vs reference | mechanism | wall |",
        "|---|" + "---|" * len(ARTIFACTS) + "---|---|---|",
    ]
    for name, m in r["modes"].items():
        shas = "".join(f"`{(m.get(a) or {}).get('sha256', '-')[:16]}` | " for a in ARTIFACTS)
        vs = "reference" if name == r["reference"] else _vs_reference(m)
        mech = _mechanisms(m)
        L.append(f"| {name} | {shas}{vs} | {'; '.join(mech) or '-'} | {m['wall_s']:.1f}s |")
    if r["problems"]:
        L += ["", "Problems:", ""] + [f"- {p}" for p in r["problems"]]
    return L


def _vs_reference(m: dict[str, Any]) -> str:
    if "compare" not in m:
        return "not compared"
    parts = []
    for kind, c in m["compare"].items():
        if c["identical"]:
            parts.append(f"{kind} identical ({_human(c['bytes_compared'])})")
        else:
            fd = c.get("first_difference", {})
            parts.append(
                f"{kind} DIFFER at byte {fd.get('offset')}: {fd.get('where')} "
                f"ref={fd.get('reference')} mode={fd.get('mode')}"
            )
    return "; ".join(parts)


def _mechanisms(m: dict[str, Any]) -> list[str]:
    """What engaged in one mode: the bridge, batching, each rpc-server; its error and problems."""
    v = m.get("validity") or {}
    mech = []
    if v.get("bridge"):
        bb = v["bridge"]
        slots = sorted(set(bb["slots"].values()))
        mech.append(
            f"bridge {bb['state']}" + (f", {slots[0]} slots" if slots else "") + f", boundaries={bb['boundaries']}"
        )
    if v.get("batched"):
        tb = v["batched"]
        mech.append(f"batched {tb['state']}, async up/down={tb['async_uploads']}/{tb['async_downloads']}")
    mech += [_rpc_server_line(ep, srv) for ep, srv in (v.get("rpc") or {}).items()]
    mech += [n for n in v.get("notes", []) if n.startswith("rpc-server")]  # e.g. the bridge proven idle
    if m.get("error"):
        mech.append(f"ERROR: {m['error'].splitlines()[0]}")
    problems: list[str] = v.get("problems", [])
    return mech + problems


def _rpc_server_line(ep: str, srv: dict[str, Any]) -> str:
    c = srv["counters"]
    return (
        f"rpc-server {ep} ({','.join(srv['devices'])}): graphs={c.get('rpc_graph_compute', '-')}"
        f" copy_tensor={c.get('rpc_copy_tensor', '-')} set/get MiB="
        f"{c.get('rpc_set_tensor_bytes', 0) / 2**20:.1f}/{c.get('rpc_get_tensor_bytes', 0) / 2**20:.1f}"
        + (
            f" bridge={'on' if srv['bridge_enabled'] else 'off'} boundaries={c.get('bridge_boundaries', '-')}"
            if c.get("bridge")
            else ""
        )
        + (
            f" link {srv['link']['link']}: up/down MiB={srv['link']['up']['bytes'] / 2**20:.2f}/"
            f"{srv['link']['down']['bytes'] / 2**20:.2f}"
            if srv.get("link")
            else ""
        )
    )


def write_reports(rep: dict[str, Any], report_dir: Path, wall: float) -> None:
    rep["wall_s"] = round(wall, 2)
    rep.setdefault("status", "running")
    (report_dir / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n", encoding="utf-8")
    (report_dir / "report.md").write_text(markdown_report(rep), encoding="utf-8")
