"""``ggml-bridge doctor``: what this rig is, whether its peer paths are safe, and how to launch on it.

Modules: ``facts`` (the frozen options and the findings), ``nvml`` (GPUs, links and topology through nvidia-ml-py),
``inventory`` (builds, ``--list-devices``, CPU, model, RPC endpoints), ``probe`` (the patched build's
``test-mapped-host-bridge --probe``: run and parse), ``cost`` (the paper model's formulas), ``recommend`` (the
advice and the serve command line), ``report`` (text and JSON), ``plot`` (the pair bandwidth matrix),
``checkup`` (the run), ``command`` (argparse: options -> :class:`~ggml_bridge.experiments.doctor.facts.Options`; the only
module that sees argparse). This package module imports none of them, so that ``scripts/paper_model.py`` can import
``cost`` alone.
"""
