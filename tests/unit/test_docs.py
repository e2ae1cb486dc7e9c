"""The docs that the code generates or that a newcomer reads first: the mode table of docs/DESIGN.md is
``python -m ggml_bridge.runtime.modetable``'s, and the README stays a landing page with the two set-up commands."""

from __future__ import annotations

import re
from pathlib import Path

from ggml_bridge.runtime import modes, modetable

ROOT = Path(__file__).resolve().parents[2]


def test_the_design_mode_table_is_generated_from_the_modes() -> None:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    start, end = modetable.section(text)
    assert text[start:end] == modetable.markdown_table(), (
        "run: python -m ggml_bridge.runtime.modetable --update docs/DESIGN.md"
    )


def test_the_mode_table_says_what_each_mode_sets() -> None:
    table = modetable.markdown_table()
    for m in modes.MODES.values():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{m.name}` |"))
        assert all(f"`{k}={v}`" in row for k, v in m.env().items()), row
    assert "`GGML_CUDA_MAPPED_HOST_BRIDGE=auto`" in next(r for r in table.splitlines() if r.startswith("| `bridge` |"))


def test_update_rewrites_only_the_table(tmp_path: Path) -> None:
    doc = tmp_path / "DESIGN.md"
    doc.write_text(f"# x\n\n{modetable.BEGIN}\n| old |\n{modetable.END}\n\ntext\n")
    assert modetable.update(doc) is True
    text = doc.read_text()
    assert text.startswith(f"# x\n\n{modetable.BEGIN}\n| mode |") and text.endswith(f"{modetable.END}\n\ntext\n")
    assert modetable.update(doc) is False


def test_the_readme_is_a_landing_page_with_the_two_set_up_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 200
    assert re.search(r"^make build +# ", readme, re.M) and re.search(r"^make test +# ", readme, re.M)
    for linked in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / linked).is_file(), linked
