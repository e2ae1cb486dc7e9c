"""The binaries a ladder runs: each build variant's llama-server, llama-perplexity (and ggml-rpc-server), from a
folder the user named or the latest build; and the upstream vocabulary the models are made from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import builder, cache, model, rpc
from ..config import Settings
from ..errors import FatalError, LadderSetupError


@dataclass
class Binaries:
    patched: dict[str, Path]
    upstream: dict[str, Path]
    same_build: bool = False


def _dir_fingerprint(d: Path) -> str:
    return cache.dir_digest(d, sorted(p for p in d.iterdir() if p.is_file() and not p.is_symlink()))


def resolve_binaries(
    bin_dirs: dict[str, Path], settings: Settings, backend: str, needed: set[str], with_rpc: bool = False
) -> Binaries:
    names = ("llama-server", "llama-perplexity") + ((rpc.RPC_SERVER,) if with_rpc else ())
    found: dict[str, dict[str, Path]] = {}
    for variant in ("patched", "upstream"):
        if variant not in needed:
            continue
        override = bin_dirs.get(variant)
        found[variant] = {}
        for name in names:
            try:
                p = builder.locate(settings, variant, name, override, backend=backend)
            except FatalError as e:
                if override is not None:
                    raise LadderSetupError(f"{name} not found in --bin-dir-{variant} {override}") from None
                fix = (e.fix + ", or pass" if e.fix else "pass") + f" --bin-dir-{variant} DIR"
                raise LadderSetupError(e.what, why=e.why, fix=fix) from None
            found[variant][name] = p
    same = False
    if "patched" in found and "upstream" in found:
        dp = found["patched"]["llama-server"].resolve().parent
        du = found["upstream"]["llama-server"].resolve().parent
        same = dp == du or _dir_fingerprint(dp) == _dir_fingerprint(du)
    return Binaries(found.get("patched", {}), found.get("upstream", {}), same)


def find_vocab(vocab: Path | None, settings: Settings, bins: Binaries) -> Path:
    if vocab is not None:
        p = Path(vocab)
        if not p.is_file():
            raise LadderSetupError(f"--vocab {p} not found")
        return p
    roots: list[Path] = []
    for d in list(bins.patched.values())[:1] + list(bins.upstream.values())[:1]:
        roots += list(d.resolve().parents)[:5]
    found = model.find_vocab(*roots)
    if found is None:
        cache = getattr(settings, "cache_dir", None)
        found = model.find_vocab(cache) if cache else None
    if found is None:
        raise LadderSetupError(
            f"cannot find the upstream vocabulary models/{model.VOCAB_FILE}",
            fix="pass --vocab PATH or set GGML_BRIDGE_VOCAB (it is in the upstream tree's models/)",
        )
    return found
