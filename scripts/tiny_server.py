"""What scripts/soak.py and scripts/serve_overhead.py both start from: the patched CPU llama-server (or the one
given), a vocabulary GGUF (or the one given) and model.py's random-weight ``tiny`` model in a fresh work folder."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggml_bridge.distribution.builder import locate  # noqa: E402
from ggml_bridge.experiments import model  # noqa: E402
from ggml_bridge.foundations import config  # noqa: E402


def tiny_setup(server: Path | None, vocab: Path | None, prefix: str) -> tuple[Path, Path, Path] | None:
    """(llama-server, tiny GGUF, work folder); None (after one line on stderr) when no vocabulary is found."""
    settings = config.load({"build.backend": "cpu"})
    server = server or locate.find_binary(settings, "llama-server", variant="patched", backend="cpu")
    vocab = vocab or model.find_vocab(settings.cache_dir / "trees", settings.cache_dir)
    if vocab is None:
        print("no vocab GGUF found: pass --vocab", file=sys.stderr)
        return None
    work = Path(tempfile.mkdtemp(prefix=prefix))
    return server, model.ensure_model(work, "tiny", 1, vocab), work
