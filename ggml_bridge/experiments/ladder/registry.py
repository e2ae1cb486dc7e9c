"""The ladder's artifacts, one row each: what every mode of a rung produces and compares with the reference's, in
this order (the report's keys and the Markdown table's columns). A new artifact is a module with a class that
satisfies :class:`~.artifact.Artifact` and one row here."""

from __future__ import annotations

from pathlib import Path

from .artifact import Artifact, compare
from .logits import Logits
from .responses import Responses

ARTIFACTS: dict[str, Artifact] = {a.name: a for a in (Responses(), Logits())}


def compare_files(ref: Path, other: Path, kind: str) -> dict[str, object]:
    """Two files of the artifact ``kind`` compared byte for byte, as the report writes it."""
    return compare(ARTIFACTS[kind], ref, other).as_json()
