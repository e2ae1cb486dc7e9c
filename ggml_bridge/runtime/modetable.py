"""The mode table of docs/DESIGN.md, generated from :data:`ggml_bridge.runtime.modes.MODES` as the exit table is from
:mod:`ggml_bridge.foundations.errors`: ``python -m ggml_bridge.runtime.modetable`` prints it, ``--update docs/DESIGN.md`` rewrites the
table between the file's two markers (a test keeps the file and the code in step)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import modes

BEGIN = "<!-- the mode table: python -m ggml_bridge.runtime.modetable --update docs/DESIGN.md -->"
END = "<!-- end of the mode table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """One row per mode: its build variant, the environment it sets, what must prove it engaged, what it is; then
    the older names still accepted."""
    rows = ["| mode | variant | environment | must engage | what it is |", "|---|---|---|---|---|"]
    for m in modes.MODES.values():
        env = " ".join(f"`{k}={v}`" for k, v in sorted(m.env().items())) or "(none)"
        must = ", ".join([*m.mechanisms, *([f"all-reduce {m.allreduce}"] if m.allreduce else [])]) or "(none)"
        rows.append(f"| `{m.name}` | {m.variant} | {env} | {must} | {_cell(m.about)} |")
    aliases = ", ".join(f"`{old}` -> `{new}`" for old, new in modes.ALIASES.items())
    refused = "; ".join(f"`{old}` (refused: {' or '.join(new)})" for old, new in modes.AMBIGUOUS.items())
    return "\n".join(rows) + f"\n\nOlder names, accepted with a deprecation note: {aliases}; {refused}.\n"


def section(text: str) -> tuple[int, int]:
    """(start, end) of the generated table between the markers of ``text``; ValueError without them."""
    start = text.index(BEGIN) + len(BEGIN) + 1
    return start, text.index(END, start)


def update(path: Path) -> bool:
    """Rewrite the table in ``path`` from :func:`markdown_table`; True when it changed."""
    text = path.read_text(encoding="utf-8")
    start, end = section(text)
    new = text[:start] + markdown_table() + text[end:]
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--update"] and len(sys.argv) == 3:
        print("updated" if update(Path(sys.argv[2])) else "up to date")
    elif len(sys.argv) == 1:
        print(markdown_table(), end="")
    else:
        print("usage: python -m ggml_bridge.runtime.modetable [--update docs/DESIGN.md]", file=sys.stderr)
        sys.exit(2)
