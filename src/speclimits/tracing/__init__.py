"""Tracing harness on stock vLLM (``speclimits trace``: K sweeps in :mod:`~speclimits.tracing.sweep`, the
Oracle pass in :mod:`~speclimits.tracing.oracle_mode`). Importing it imports neither vLLM nor torch."""
