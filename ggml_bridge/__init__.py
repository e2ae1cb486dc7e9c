"""ggml-bridge: fetch a pinned llama.cpp, apply our patch series, build llama-server, launch it, verify outputs."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
