"""The sides of a ladder: the sets of binaries it runs modes of (``[sides.NAME]``), and a rung's runs (``MODE`` or
``SIDE:MODE``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...foundations.errors import LadderSetupError
from ...runtime import modes
from ...runtime.modes import MODES

#: keys of a ``[sides.NAME]`` table
SIDE_KEYS = ("variant", "about", "cpu_variant")


@dataclass(frozen=True)
class Side:
    """One set of binaries a ladder runs modes of: a build variant's latest build (the sides named ``patched`` and
    ``upstream`` exist in every ladder), or any folder given with ``--side NAME=DIR`` (an installed wheel's bin/,
    another build of the same series). A rung names a mode on a side as ``SIDE:MODE``; a bare mode runs on the side
    named after its variant. The side's variant must be the mode's (a patched mode on an upstream build would prove
    nothing)."""

    name: str
    variant: str
    about: str = ""
    cpu_variant: str | None = None
    """The one ggml CPU variant module (``libggml-cpu-<name>.so``) the side's folder must hold (ggml loads the
    best one it finds beside the program: a comparison per CPU variant needs exactly one on each side)."""


#: the sides every ladder has
DEFAULT_SIDES = {
    v: Side(v, v, "the latest build of this variant, or --side %s=DIR" % v) for v in ("patched", "upstream")
}


def run_parts(run: str) -> tuple[str | None, str]:
    """``"wheel:off"`` -> ("wheel", "off"); ``"off"`` -> (None, "off")."""
    side, sep, mode = run.rpartition(":")
    return (side if sep else None), mode


def mode_of(run: str) -> modes.Mode:
    """The mode of a rung's run (``MODE`` or ``SIDE:MODE``)."""
    return MODES[run_parts(run)[1]]


def side_of(run: str) -> str:
    """The side a rung's run runs on: the one it names, else the one named after its mode's variant."""
    side, mode = run_parts(run)
    return side or MODES[mode].variant


def canonical_run(text: str, sides: dict[str, Side], where: str) -> str:
    """``SIDE:MODE`` or ``MODE`` with the mode's current name; the side written only where it is not the default
    one of the mode's variant. The side must exist and build the mode's variant."""
    side, name = run_parts(text)
    mode = modes.lookup(name, where)
    if side is None:
        return mode.name
    if side not in sides:
        raise LadderSetupError(
            f"{where}: {text!r} names the side {side!r}, which the ladder does not declare",
            fix=f"sides: {', '.join(sides)}; declare others as [sides.{side}] with variant = ...",
        )
    if sides[side].variant != mode.variant:
        raise LadderSetupError(
            f"{where}: {text!r}: mode {mode.name} runs the {mode.variant} build, side {side} is {sides[side].variant}",
            why="a mode of one build on binaries of another proves nothing",
        )
    return mode.name if side == mode.variant else f"{side}:{mode.name}"


def parse_sides(table: Any, where: str) -> dict[str, Side]:
    """The ladder's ``[sides.NAME]`` tables over the default ones (``patched``, ``upstream``)."""
    out = dict(DEFAULT_SIDES)
    if table is None:
        return out
    if not isinstance(table, dict):
        raise LadderSetupError(f"{where}: [sides] must hold tables [sides.NAME]")
    for name, t in table.items():
        if not isinstance(t, dict) or set(t) - set(SIDE_KEYS) or not all(isinstance(v, str) for v in t.values()):
            raise LadderSetupError(
                f"{where}: [sides.{name}] must be a table of strings", fix=f"keys: {', '.join(SIDE_KEYS)}"
            )
        if not name or ":" in name or "/" in name:
            raise LadderSetupError(f"{where}: side name {name!r} may not be empty or hold ':' or '/'")
        variant = t.get("variant", out[name].variant if name in out else None)
        if variant not in ("patched", "upstream"):
            raise LadderSetupError(
                f"{where}: [sides.{name}] variant = {variant!r}", fix="variant = \"patched\" or \"upstream\""
            )
        out[name] = Side(name, variant, t.get("about", ""), t.get("cpu_variant"))
    return out
