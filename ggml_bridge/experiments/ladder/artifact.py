"""What a rung produces and compares: the :class:`Artifact` Protocol, what a mode's processes run with, and the
byte comparison of two runs' artifacts (:class:`Comparison`, serialized once, in the report)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from ...runtime import logparse
from ...runtime.llama_server import CONTRACT_VERBOSITY, Server
from ...runtime.modes import Mode
from .diff import first_difference, sha256_file
from .schema import Rung

#: when a mode produces an artifact: while its llama-server runs (for requests), or after it stopped
Stage = Literal["server", "after"]


@dataclass(frozen=True)
class Job:
    """What one mode's processes run with: the rung (as the mode sees it), its side's programs and environment."""

    mode: Mode
    rung: Rung
    programs: dict[str, Path]
    env: dict[str, str]
    out: Path
    threads: int
    extra: tuple[str, ...] = ()  # the rpc-servers' llama arguments, once they started

    def common_args(self) -> list[str]:
        """The llama arguments every process of the mode gets (devices, batch sizes, threads, -lv 4)."""
        rung = self.rung
        ngl = rung.gpu_layers if rung.gpu_layers is not None else (999 if rung.devices > 0 else 0)
        # -lv 4: the contract's INFO lines (bridge enabled/stats, "using device") are dropped below it
        a = [
            "-lv",
            str(CONTRACT_VERBOSITY),
            "-t",
            str(self.threads),
            "-ngl",
            str(ngl),
            "-b",
            str(rung.batch),
            "-ub",
            str(rung.ubatch),
        ]
        if rung.devices > 0 or rung.split_mode == "tensor":  # tensor: also over rpc-servers of CPU devices
            a += ["-sm", rung.split_mode]
        return a


@dataclass(frozen=True)
class Inputs:
    """What every mode of a rung is fed: the model, the perplexity text and the requests' prompts."""

    model: Path
    text: Path
    prompts: Sequence[str]


@dataclass(frozen=True)
class Production:
    """One artifact's production in one mode: the job, the rung's inputs, and the running llama-server (for an
    artifact of the ``server`` stage; None after it stopped)."""

    job: Job
    inputs: Inputs
    server: Server | None = None


@dataclass(frozen=True)
class Produced:
    """An artifact's file and the logs of the processes that made it (by process name, for the validity)."""

    path: Path
    logs: tuple[tuple[str, logparse.LogInfo], ...] = ()


class Artifact(Protocol):
    """One thing every mode of a rung produces and the ladder compares byte for byte with the reference's."""

    @property
    def name(self) -> str:
        """Its key in the report (``responses``, ``logits``) and the column of the Markdown table."""
        ...

    @property
    def stage(self) -> Stage: ...

    @property
    def disposable(self) -> bool:
        """Removed after a passing rung unless ``--keep-logits`` (large, and only needed to inspect a mismatch)."""
        ...

    def produce(self, run: Production) -> Produced:
        """Make the artifact of one mode (a FatalError when the programs fail or make nothing)."""
        ...

    def describe(self, ref: Path, other: Path, offset: int) -> dict[str, object]:
        """The first differing byte, ``offset``, in the artifact's own terms (``offset`` and ``where`` at least)."""
        ...


@dataclass(frozen=True)
class Record:
    """An artifact as the report lists it."""

    bytes: int
    sha256: str

    @classmethod
    def of(cls, path: Path | None) -> Record | None:
        if path is None or not path.is_file():
            return None
        return cls(path.stat().st_size, sha256_file(path))

    def as_json(self) -> dict[str, object]:
        return {"bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class Comparison:
    """Two runs' artifacts compared byte for byte."""

    bytes_compared: int
    reference_bytes: int
    mode_bytes: int
    first_difference: dict[str, object] | None = None
    """None: identical; else where they first differ (:meth:`Artifact.describe`)."""

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    def as_json(self) -> dict[str, object]:
        res: dict[str, object] = {
            "identical": self.identical,
            "bytes_compared": self.bytes_compared,
            "reference_bytes": self.reference_bytes,
            "mode_bytes": self.mode_bytes,
        }
        if self.first_difference is not None:
            res["first_difference"] = self.first_difference
        return res


def compare(artifact: Artifact, ref: Path, other: Path) -> Comparison:
    """``other`` against ``ref`` byte for byte; the first difference described by the artifact."""
    off, n = first_difference(ref, other)
    fd: dict[str, object] | None = None
    if off is not None:
        try:
            fd = artifact.describe(ref, other, off)
        except Exception as e:  # noqa: BLE001 - the description is a courtesy; the offset is the fact
            fd = {"offset": off, "where": f"(could not describe: {e})"}
    return Comparison(n, ref.stat().st_size, other.stat().st_size, fd)
