"""``ggml-bridge bench``: upstream P2P, upstream staged and no-peer paths, and our mechanisms, side by side.

One run, one suite's settings: every case is a (build variant, selectors) pair, and the cases are interleaved
round by round (the order rotates each round, :func:`running.plan_round`) so that clock ramps and thermal drift
fall on all of them alike. A round runs every case on every shape of the run, once per run length (``-r N``, every
repetition kept, so one-shot runs' first-call costs show; without run lengths, ``--reps`` kept after
``--warmup-reps`` discarded), and where the suite has them llama-perplexity and llama-server (:mod:`.perplexity`, :mod:`.server`) and
batching against its baseline inside one process (:mod:`inproc`, free of the spread between processes).
Every sample is kept; a case's figure is the median of its samples and its spread the interquartile range. A
difference smaller than the two spreads together is called noise.

A mechanism case counts only if the mechanism says it engaged in every process: the bridge's stats line (or
llama-server's /metrics) must show boundaries, batching's must show staged uploads. Otherwise the case is
reported as *not engaged* and its figures are not used for ratios.

On a CPU-only machine the GPU cases cannot be measured; the report says so and runs the CPU cases.
A boundary microbenchmark (``test-mapped-host-bridge --bench``) measures copy throughput per boundary size
for the bridge, upstream's peer copy and synchronous fallback, and the one-way pinned limits.

Pooling: every round runs every case; per case and test the report pools all kept samples into a median and
interquartile range, and per pair of cases the *paired* ratio (median over rounds of the ratio within a round)
with a 95 % bootstrap interval that resamples whole rounds. ``--smi [MS]`` samples nvidia-smi while the cases run
and records, per llama-bench process, the GPUs' clocks, utilisation, peak power and temperature and throttle
reasons (``logs/smi.csv`` and a table in the report). ``--pool REPORT...`` runs nothing and pools the rounds of
several reports of one suite and settings into one. The report carries the build manifest of every variant.

Modules: ``orchestrate`` (``run``: resolves a run (cases, builds, models) and assembles its report), ``suites``
(the suites and the part of a suite's matrix a run measures), ``options`` (the command line), ``measures`` (the
registry of the measures, each one module behind ``measure.Measure``: ``llamabench``, ``perplexity``, ``server``,
``inproc``), ``running`` (the rounds), ``proof`` (engagement from a process's lines), ``stats``, ``report``,
``telemetry``.
"""
