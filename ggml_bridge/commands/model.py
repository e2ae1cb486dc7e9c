"""``ggml-bridge model``: write one generated GGUF model (:mod:`ggml_bridge.experiments.model`: a shape, a seed and the upstream
vocabulary give the same bytes on every machine); prints its path. Without ``--out`` it is the cached copy the
ladder and the bench use (``<cache>/models``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..experiments import model
from ..foundations import files, flags
from ..foundations.config import Settings
from ..foundations.errors import ModelError, UsageError, os_reason
from . import argtypes, optionset


@dataclass(frozen=True)
class ModelOptions:
    """``ggml-bridge model``'s options: the model's shape and seed, the vocabulary, where it goes."""

    shape: str = field(
        default="tiny",
        metadata=flags.flag(
            "--shape",
            parse=argtypes.shape_name,
            metavar="NAME",
            help=f"a preset shape: {', '.join(model.PRESETS)} (default tiny)",
        ),
    )
    seed: int = field(
        default=1, metadata=flags.flag("--seed", parse=flags.count(0), metavar="N", help="weights seed (default 1)")
    )
    vocab: Path | None = field(default=None, metadata=flags.vocab(model.VOCAB_FILE))
    out: Path | None = field(
        default=None,
        metadata=flags.also(
            "-o", flags.flag("--out", parse=flags.path, metavar="PATH", help="write here (default: the cached copy)")
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optionset.add(parser, ModelOptions)


def options(ns: argparse.Namespace) -> ModelOptions:
    return optionset.options(ModelOptions, ns)


def run(opts: ModelOptions, settings: Settings) -> int:
    shape = model.get_shape(opts.shape)
    out = files.output_file(opts.out, "--out") if opts.out is not None else None  # before any other work
    vocab = opts.vocab or model.find_vocab(settings.layout.root)
    if vocab is None or not Path(vocab).is_file():
        raise ModelError(
            f"cannot find the upstream vocabulary models/{model.VOCAB_FILE}"
            + (f" ({opts.vocab} does not exist)" if opts.vocab else ""),
            fix="pass --vocab PATH, set GGML_BRIDGE_VOCAB, or run `ggml-bridge fetch` first (it is in the tree's models/)",
        )
    if out is None:
        path = model.ensure_model(settings.layout.models, shape, opts.seed, vocab)
    else:
        try:
            path = model.write_model(out, shape, opts.seed, vocab)
        except OSError as e:
            raise UsageError(f"cannot write the model {opts.out}", why=os_reason(e), fix="pass another --out") from None
    print(path)
    return 0
