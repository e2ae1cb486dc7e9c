"""Configure and build llama-server (plus llama-bench, llama-perplexity and our test programs) with CMake + Ninja.

Build directories are keyed by (upstream tree, patch series, CMake options, backend, compilers):
``<cache>/builds/<variant>-<backend>-<key>/``. When the key and the completed marker match, nothing is configured
or compiled ("up to date"). Each build writes ``manifest.json`` into its directory and the pointer
``<cache>/latest-<variant>-<backend>.json`` that :func:`ggml_bridge.distribution.builder.locate.find_binary` reads.
Modules: ``single`` (one variant), ``shared`` (several from one tree), ``locate`` (what a build made), ``plan``,
``steps``, ``toolchain``, ``installed``, ``prefixes``.
"""

from __future__ import annotations
