"""The engine benchmark of the controller's policies (``speclimits control bench``): tooling around
:mod:`speclimits.control`, not part of it.

:mod:`~speclimits.bench.control` runs every policy against stock vLLM at every static K and plain
decoding in finely interleaved blocks and summarizes paired ratios; :mod:`~speclimits.bench.engines`
builds the engines (plain, stock, and with the control extension); :mod:`~speclimits.bench.cli` registers
``bench`` and ``summarize`` under ``speclimits control``. The served-load benchmark is
``benchmarks/bench_serve.py``.
"""
