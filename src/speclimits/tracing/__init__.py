"""Tracing harness on the real vLLM engine (stock vLLM, through its extension points).

``speclimits trace`` runs K sweeps and, with ``--oracle``, the dense Oracle pass; see
:mod:`speclimits.tracing.sweep` and :mod:`speclimits.tracing.oracle_mode` for the tables they
write, :mod:`speclimits.tracing.extension` for the hooks, :mod:`speclimits.tracing.capture` for
the static routing buffer and :mod:`speclimits.tracing.engine` for the CPU defaults.

Importing this package does not import vLLM or torch; only running a trace does.
"""
