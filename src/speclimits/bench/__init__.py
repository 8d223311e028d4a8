"""The engine benchmark of the controller's policies (``speclimits control bench``), tooling around
:mod:`speclimits.control`: :mod:`~speclimits.bench.control` (the interleaved runs and their paired summary),
:mod:`~speclimits.bench.engines` (plain, stock and controlled engines), :mod:`~speclimits.bench.cli`. The
served-load benchmark is ``benchmarks/bench_serve.py``.
"""
