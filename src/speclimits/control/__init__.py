"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

Modules: :mod:`~speclimits.control.policies` (the rules and the offline harness),
:mod:`~speclimits.control.fit` (``speclimits control fit``: parameters from a trace's train
split into a JSON), :mod:`~speclimits.control.extension` (the worker extension that applies a
policy per request per round), :mod:`~speclimits.control.bench` (``speclimits control bench``),
:mod:`~speclimits.control.cli`.
"""
