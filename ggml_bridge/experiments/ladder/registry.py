"""The ladder's artifacts, one row each: what every mode of a rung produces and compares with the reference's, in
this order (the report's keys and the Markdown table's columns). A new artifact is a module with a class that
satisfies :class:`~.artifact.Artifact` and one row here."""

from __future__ import annotations

from .artifact import Artifact
from .logits import Logits
from .responses import Responses

ARTIFACTS: dict[str, Artifact] = {a.name: a for a in (Responses(), Logits())}
