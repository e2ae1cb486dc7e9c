"""The package's import graph, read from the source (ast, every import including the ones inside functions):
no cycles, and no module importing one on a higher floor of :data:`FLOORS`."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = "ggml_bridge"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

#: The floors of the package, lowest first: a module may import modules of its own floor or below, never above
#: (a package, e.g. ``build``, is one entry: its submodules share its floor). Every module must be listed.
FLOORS: list[set[str]] = [
    {
        "ggml_bridge",
        "errors",
        "net",
        "logparse",
        "engagement",
        "mechanisms",
        "tomlfile",
        "files",
        "tables",
        "layout",
        "flags",
    },  # the root
    # (__version__), errors, TOML files and their schema, the JSON files read and the output folders, addresses and
    # ports, the log-line parser, the one engagement decision, the mechanism record and the tables of named rows; the
    # options declared on the fields of the options dataclasses
    {
        "runner",
        "signals",
        "modes",
        "modetable",
        "config",
        "pin",
    },  # the subprocess runner and the stop on signals; the table of
    # variants, selectors and modes;
    # the settings and the pin
    {"cache", "gitrepo", "shaper", "llama_server", "proof"},  # the cache primitives; the one door to git; the
    # loopback link shaper; one llama-server process; what its log and counters prove
    {"fetch", "model", "tensor_split", "ui"},  # upstream trees, the GGUF writer and how -sm tensor splits its shapes,
    # the web UI assets
    {"patch"},  # the series applied to a tree
    {"builder"},  # CMake + Ninja builds; the installed-wheel lookup
    {"wheel", "wheel_plan", "rebase"},  # the server distribution and what one wheel build compiles; moving the
    # series onto another upstream
    {"rpc"},  # ggml-rpc-server topologies
    {
        "serve",
        "radar",
        "netbench",
        "paper_model",
        "allreduce_check",
        "doctor",
    },  # the launcher; the rebase check of every newer build;
    # rpc cases over shaped links for the bench and the scale model calibrated on them; the rig's inventory, probe
    # and launch advice (builds, rpc endpoints)
    {"bench", "ladder"},  # the measurements and the proof ladder, which launch servers and rpc-servers
    {"cli", "commands", "__main__"},  # the command line, one module per command: imports anything
]
#: Not part of ggml_bridge's import graph: the templates of the server distribution (their own package).
EXCLUDED = ("server_dist",)


@functools.cache
def nodes(source: str) -> tuple[ast.AST, ...]:
    """Every node of ``source``'s tree in :func:`ast.walk` order: each rule below reads every package file, and
    parsing and walking them once, not once per rule, saves seconds of CPU."""
    return tuple(ast.walk(ast.parse(source)))


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
    for node in nodes(path.read_text()):
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


#: The wings: the packages that group the modules by concern (ggml_bridge/<wing>/<module>). A module keeps its
#: floor whatever its wing; a wing's ``__init__`` imports nothing and sits on the lowest floor.
WINGS = ("foundations", "upstream", "distribution", "runtime", "experiments")
#: The top level of the package: the wings, the command line and the package's own files.
TOP_LEVEL = {*WINGS, "commands", "cli.py", "__init__.py", "__main__.py"}


def floor_of(module: str) -> int:
    parts = module.split(".")[1:] or [module]
    if parts[0] in WINGS:
        if len(parts) == 1:
            return 0
        parts = parts[1:]
    top = parts[0]
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
    """``wheel`` importing ``builder.steps`` runs ``builder/__init__``: were that to import wheel, it is a cycle."""
    g = graph()
    assert (
        "ggml_bridge.distribution.builder" in g["ggml_bridge.distribution.wheel"]
        and "ggml_bridge.distribution.builder.steps" in g["ggml_bridge.distribution.wheel"]
    )
    assert "ggml_bridge.distribution.builder" not in g["ggml_bridge.distribution.builder.shared"], (
        "a package's own modules do not count it"
    )


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
    for p in sorted(tests.rglob("test_*.py")):
        for node in nodes(p.read_text()):
            mods = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            bad += [
                f"{p.relative_to(tests)} imports {m}" for m in mods if m.split(".")[-1] in names or ".test_" in f".{m}"
            ]
    assert not bad, bad


#: The command line: the only modules that see argparse (every other module receives frozen dataclasses).
CLI_LAYER = ("ggml_bridge.cli", "ggml_bridge.commands", "ggml_bridge.__main__")
#: The ratchet: no module and no function grows past the largest of the day the caps were last lowered (the caps
#: of 500 and 80 lines hold with room to spare); lower these as modules and functions shrink, never raise them.
MAX_MODULE_LINES = 490
MAX_FUNCTION_LINES = 77
#: At most 7 parameters (self aside): a longer chain becomes a context object. None is over it today; an entry
#: here (function: count) would let one stay over while it shrinks, and one that shrinks leaves the list.
MAX_PARAMETERS = 7
OVER_MAX_PARAMETERS: dict[str, int] = {}


def _package_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not any(x in p.relative_to(ROOT).parts for x in EXCLUDED))


def _in_cli_layer(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in CLI_LAYER)


def argparse_uses(source: str) -> list[str]:
    """Where ``source`` imports argparse or names a Namespace (an annotation, ``argparse.Namespace(...)``)."""
    found = []
    for node in nodes(source):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            found.append(f"line {node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
            found.append(f"line {node.lineno}: from argparse import ...")
        elif isinstance(node, ast.Attribute) and node.attr == "Namespace":
            found.append(f"line {node.lineno}: .Namespace")
        elif isinstance(node, ast.Name) and node.id == "Namespace":
            found.append(f"line {node.lineno}: Namespace")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\bNamespace\b", node.value):
            found.append(f"line {node.lineno}: 'Namespace' annotation")
    return found


def test_the_argparse_rule_finds_a_namespace() -> None:
    assert argparse_uses("import argparse\n") and argparse_uses("def f(a: 'argparse.Namespace') -> None: ...\n")
    assert argparse_uses("from argparse import Namespace\n") and argparse_uses("x = ns.Namespace(a=1)\n")
    assert not argparse_uses("def f(opts: 'ServeOptions') -> int: ...\n")


def test_only_the_command_line_sees_argparse() -> None:
    """argparse at the edge only: the commands turn their namespace into a frozen dataclass, and no other module
    imports argparse or takes a Namespace."""
    bad = [
        f"{module_name(p)}: {use}"
        for p in _package_files()
        if not _in_cli_layer(module_name(p))
        for use in argparse_uses(p.read_text())
    ]
    assert not bad, "argparse outside the command line:\n" + "\n".join(bad)


def test_no_module_grows_past_the_largest() -> None:
    """No module of the package over :data:`MAX_MODULE_LINES`, none exempt."""
    big = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in _package_files()
        if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    ]
    assert not big, f"over {MAX_MODULE_LINES} lines: {big}"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (and methods, nested ones too) of ``source`` longer than ``limit`` lines, decorators included."""
    out = []
    for node in nodes(source):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - first + 1
            if n > limit:
                out.append(f"{node.name} ({n} lines, line {node.lineno})")
    return out


def test_the_function_rule_measures_a_function() -> None:
    body = "def f():\n" + "    x = 1\n" * 80
    assert long_functions(body) == ["f (81 lines, line 1)"] and long_functions(body, 81) == []


def test_no_function_grows_past_the_longest() -> None:
    """No function of the package over :data:`MAX_FUNCTION_LINES`, none exempt."""
    long = [f"{p.relative_to(ROOT)}: {f}" for p in _package_files() for f in long_functions(p.read_text())]
    assert not long, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def parameter_counts(source: str) -> dict[str, int]:
    """Each function of ``source`` (methods and nested ones too) by name: its parameters, ``self``/``cls`` aside."""
    out: dict[str, int] = {}
    for node in nodes(source):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = [*a.posonlyargs, *a.args]
            n = len(named) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            out[node.name] = max(out.get(node.name, 0), n - (bool(named) and named[0].arg in ("self", "cls")))
    return out


def test_the_parameter_rule_counts_parameters() -> None:
    src = "def f(a, /, b, *c, d, **e): ...\nclass K:\n    def m(self, a, b=1): ...\n"
    assert parameter_counts(src) == {"f": 5, "m": 2}


def test_no_function_takes_more_parameters_than_the_ratchet_allows() -> None:
    found = {
        f"{p.relative_to(ROOT)}:{name}": n
        for p in _package_files()
        for name, n in parameter_counts(p.read_text()).items()
        if n > MAX_PARAMETERS
    }
    grown = {k: n for k, n in found.items() if n > OVER_MAX_PARAMETERS.get(k, MAX_PARAMETERS)}
    assert not grown, f"more than {MAX_PARAMETERS} parameters (or more than before): {grown}; pass a context object"
    shrunk = {k: n for k, n in OVER_MAX_PARAMETERS.items() if found.get(k, 0) < n}
    assert not shrunk, f"lower OVER_MAX_PARAMETERS in {__file__} to: {shrunk} (0: drop the entry)"


def floors_line() -> str:
    """The floors as docs/DESIGN.md states them: ``errors/logparse/...; cache/...; ...`` (lowest first)."""
    return "; ".join("/".join(sorted(f - {"ggml_bridge", "__main__"})) for f in FLOORS)


def test_design_states_the_floors_of_this_test() -> None:
    design = (ROOT.parent / "docs" / "DESIGN.md").read_text()
    assert floors_line() in " ".join(design.split()), f"docs/DESIGN.md must state the floors as: {floors_line()}"


#: The one module that may import GitPython (``git``): every git process goes through it and the runner.
GIT_FACADE = "ggml_bridge.foundations.gitrepo"


def git_uses(source: str) -> list[str]:
    """Where ``source`` imports GitPython (``import git``, ``from git import ...``, ``import git.cmd``) or runs git
    by name (a command line, a list, starting with ``"git"``)."""
    found = []
    for node in nodes(source):
        if isinstance(node, ast.Import) and any(a.name == "git" or a.name.startswith("git.") for a in node.names):
            found.append(f"line {node.lineno}: import git")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "git":
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif (
            isinstance(node, ast.List)
            and node.elts
            and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value == "git"
        ):
            found.append(f"line {node.lineno}: a command line starting with 'git'")
    return found


def test_the_git_rule_finds_gitpython_and_git_command_lines() -> None:
    assert git_uses("import git\n") and git_uses("from git import Repo\n") and git_uses("import git.cmd\n")
    assert git_uses("run(['git', '-C', wt, 'status'])\n") and git_uses("x = ['git', 'am']\n")
    assert not git_uses("from . import gitrepo\nimport gitdb\nx = ['gitx', 'git']\nGIT, A = 'git', 'a'\n")


def test_only_the_git_facade_imports_gitpython_or_runs_git() -> None:
    """GitPython and git itself are reached through ``ggml_bridge.foundations.gitrepo`` only, whose repositories run every git
    command through the runner (logged, stopped on a signal, one error wording)."""
    bad = [
        f"{module_name(p)}: {use}"
        for p in _package_files()
        if module_name(p) != GIT_FACADE
        for use in git_uses(p.read_text())
    ]
    assert not bad, "git outside ggml_bridge.foundations.gitrepo:\n" + "\n".join(bad)


def test_the_top_level_is_the_wings_and_the_command_line() -> None:
    """At most 12 entries at the top of the package: a new module goes into the wing of its concern."""
    found = {p.name for p in ROOT.iterdir() if p.name != "__pycache__"}
    assert found == TOP_LEVEL and len(found) <= 12, sorted(found ^ TOP_LEVEL)


@pytest.mark.parametrize("wing", WINGS)
def test_a_wing_is_only_a_folder(wing: str) -> None:
    """A wing's __init__ holds its docstring and imports nothing (the floors test counts it on the lowest floor)."""
    tree = ast.parse((ROOT / wing / "__init__.py").read_text())
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), wing
