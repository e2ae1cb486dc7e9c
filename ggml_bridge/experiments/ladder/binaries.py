"""The binaries a ladder runs: each build variant's llama-server, llama-perplexity (and ggml-rpc-server), from a
folder the user named or the latest build; and the upstream vocabulary the models are made from."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from ...distribution.builder import locate
from ...foundations import cache
from ...foundations.config import Settings
from ...foundations.errors import FatalError, LadderSetupError
from ...runtime import rpc
from ...runtime.modes import VARIANTS
from .. import model
from .sides import Side


@dataclass(frozen=True)
class Binaries:
    """The programs of each side the ladder runs, by side name."""

    by_side: dict[str, dict[str, Path]]
    same_build: bool = False
    """Two sides of different variants are the same build (a comparison of a build with itself)."""

    @property
    def patched(self) -> dict[str, Path]:
        return self.by_side.get("patched", {})

    @property
    def upstream(self) -> dict[str, Path]:
        return self.by_side.get("upstream", {})

    def folders(self) -> dict[str, str]:
        return {side: str(next(iter(b.values())).parent) for side, b in self.by_side.items() if b}


def _dir_fingerprint(d: Path) -> str:
    return cache.dir_digest(d, sorted(p for p in d.iterdir() if p.is_file() and not p.is_symlink()))


def _option(side: str) -> str:
    return f"--bin-dir-{side}" if side in VARIANTS else f"--side {side}=DIR"


def _locate_side(
    side: Side, folder: Path | None, settings: Settings, backend: str, names: tuple[str, ...]
) -> dict[str, Path]:
    if folder is None and side.name not in VARIANTS:
        raise LadderSetupError(
            f"the ladder runs modes on the side {side.name!r}, and no folder was given for it",
            why=side.about or "only the sides named after a build variant have a default (its latest build)",
            fix=f"pass --side {side.name}=DIR",
        )
    found: dict[str, Path] = {}
    for name in names:
        try:
            found[name] = locate.locate(settings, side.variant, name, folder, backend=backend)
        except FatalError as e:
            if folder is not None:
                raise LadderSetupError(f"{name} not found in {_option(side.name)} {folder}") from None
            fix = (e.fix + ", or pass" if e.fix else "pass") + f" {_option(side.name)} DIR"
            raise LadderSetupError(e.what, why=e.why, fix=fix) from None
    if side.cpu_variant is not None:
        bindir = found["llama-server"].resolve().parent
        held = sorted(p.name for p in bindir.glob("libggml-cpu-*.so"))
        if held != [f"libggml-cpu-{side.cpu_variant}.so"]:
            raise LadderSetupError(
                f"side {side.name}: {bindir} must hold exactly libggml-cpu-{side.cpu_variant}.so",
                why=f"it holds {', '.join(held) or 'none'}: ggml loads the best CPU variant it finds beside the "
                "program, and the comparison is per CPU variant",
                fix=f"copy the binaries and libggml-cpu-{side.cpu_variant}.so alone into a folder",
            )
    return found


def resolve_binaries(
    folders: dict[str, Path],
    settings: Settings,
    backend: str,
    needed: dict[str, Side],
    with_rpc: bool = False,
) -> Binaries:
    """The binaries of every side in ``needed``: from its folder in ``folders`` (``--side NAME=DIR``), else the
    latest build of its variant."""
    names = ("llama-server", "llama-perplexity") + ((rpc.RPC_SERVER,) if with_rpc else ())
    found = {name: _locate_side(side, folders.get(name), settings, backend, names) for name, side in needed.items()}
    same = False
    for a, b in itertools.combinations(sorted(found), 2):
        if needed[a].variant != needed[b].variant:
            da, db = (found[x]["llama-server"].resolve().parent for x in (a, b))
            same = same or da == db or _dir_fingerprint(da) == _dir_fingerprint(db)
    return Binaries(found, same)


def find_vocab(vocab: Path | None, settings: Settings, bins: Binaries) -> Path:
    if vocab is not None:
        p = Path(vocab)
        if not p.is_file():
            raise LadderSetupError(f"--vocab {p} not found")
        return p
    roots: list[Path] = []
    for d in [next(iter(b.values())) for b in bins.by_side.values() if b]:
        roots += list(d.resolve().parents)[:5]
    found = model.find_vocab(*roots)
    if found is None:
        found = model.find_vocab(settings.layout.root)
    if found is None:
        raise LadderSetupError(
            f"cannot find the upstream vocabulary models/{model.VOCAB_FILE}",
            fix="pass --vocab PATH or set GGML_BRIDGE_VOCAB (it is in the upstream tree's models/)",
        )
    return found
