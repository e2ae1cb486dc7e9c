"""The package's import graph, read from the source (ast, every import including the ones inside functions):
no cycles, and no module importing one on a higher floor of :data:`FLOORS`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "ggml_bridge"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

#: The floors of the package, lowest first: a module may import modules of its own floor or below, never above
#: (a package, e.g. ``build``, is one entry: its submodules share its floor). Every module must be listed.
FLOORS: list[set[str]] = [
    {"ggml_bridge", "errors", "net", "cli_options", "argtypes", "logparse", "engagement"},  # the root
    # (__version__), errors, checked option types, the log-line parser and the one engagement decision
    {"runner", "modes", "config", "pin"},  # the subprocess runner; the table of variants, selectors and modes;
    # the settings and the pin
    {"cache", "shaper"},  # the cache primitives; the loopback link shaper
    {"fetch", "model", "ui"},  # upstream trees, the GGUF writer, the web UI assets
    {"patch"},  # the series applied to a tree
    {"build"},  # CMake + Ninja builds; the installed-wheel lookup
    {"wheel", "rebase"},  # the server distribution; moving the series onto another upstream
    {"rpc"},  # ggml-rpc-server topologies
    {"serve", "radar", "netbench", "doctor"},  # the launcher; the rebase check of every newer build; rpc cases over
    # shaped links for the bench; the rig's inventory, probe and launch advice (builds, rpc endpoints)
    {"bench", "ladder"},  # the measurements and the proof ladder, which launch servers and rpc-servers
    {"cli", "__main__"},  # the command line: imports anything
]
#: Not part of ggml_bridge's import graph: the templates of the server distribution (their own package).
EXCLUDED = ("server_dist",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(mod: str, names: list[str], known: set[str]) -> set[str]:
    """``from mod import a, b``: the submodules a, b where they are modules, else mod itself."""
    out = {f"{mod}.{n}" for n in names if f"{mod}.{n}" in known}
    if len(out) < len(names):
        out.add(mod)
    return out


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Project modules ``path`` imports (absolute or relative, at module level or inside functions)."""
    name = module_name(path)
    is_pkg = path.name == "__init__.py"
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == PACKAGE or mod.startswith(PACKAGE + "."):
                found |= _resolve(mod, [a.name for a in node.names], known)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == PACKAGE or a.name.startswith(PACKAGE + ".")}
    # importing a.b.c runs a.b's __init__ too (but a module inside a.b does not depend on a.b for that)
    for target in list(found):
        parts = target.split(".")
        for i in range(2, len(parts)):
            parent = ".".join(parts[:i])
            if not (name == parent or name.startswith(parent + ".")):
                found.add(parent)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for p in ROOT.rglob("*.py") if not any(x in p.relative_to(ROOT).parts for x in EXCLUDED)]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) & known for p in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def floor_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    for i, floor in enumerate(FLOORS):
        if top in floor:
            return i
    raise KeyError(module)


def upward(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
        for a, deps in g.items()
        for b in deps
        if floor_of(b) > floor_of(a)
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_submodule_import_counts_its_package() -> None:
    """``wheel`` importing ``build.steps`` runs ``build/__init__``: were that to import wheel, it is a cycle."""
    g = graph()
    assert "ggml_bridge.build" in g["ggml_bridge.wheel"] and "ggml_bridge.build.steps" in g["ggml_bridge.wheel"]
    assert "ggml_bridge.build" not in g["ggml_bridge.build.shared"], "a package's own modules do not count it"


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_floor() -> None:
    missing = []
    for m in graph():
        try:
            floor_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"add to FLOORS in {__file__}: {missing}"


def test_no_upward_imports() -> None:
    found = upward(graph())
    assert not found, "imports pointing up the floors:\n" + "\n".join(found)


@pytest.mark.parametrize("rel", ["tests/unit", "tests/integration"])
def test_no_test_module_imports_another(rel: str) -> None:
    """Shared test code lives in tests/helpers.py and tests/conftest.py, never in a test module."""
    tests = ROOT.parent / rel
    names = {p.stem for p in tests.parent.rglob("test_*.py")}
    bad = []
    for p in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            bad += [f"{p.name} imports {m}" for m in mods if m.split(".")[-1] in names or ".test_" in f".{m}"]
    assert not bad, bad


def test_no_module_over_500_lines_without_saying_why() -> None:
    """The house rule (issue 28): a module of the package over 500 lines says why in its docstring, in a paragraph
    starting "Over 500 lines:"; a module that grows past it without one fails here."""
    pkg = Path(__file__).resolve().parents[2] / "ggml_bridge"
    silent = []
    for path in sorted(pkg.rglob("*.py")):
        if "_data" in path.parts:
            continue
        text = path.read_text()
        if text.count("\n") > 500 and "\nOver 500 lines: " not in "\n" + (ast.get_docstring(ast.parse(text)) or ""):
            silent.append(f"{path.relative_to(pkg)} ({text.count(chr(10))} lines)")
    assert not silent, f"over 500 lines without saying why: {silent}"
