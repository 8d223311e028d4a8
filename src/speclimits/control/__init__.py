"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

Modules: :mod:`~speclimits.control.rules` (the rules, in the form the engine runs, and the policy file),
:mod:`~speclimits.control.driver` (the round driver both the engine and the offline harness run),
:mod:`~speclimits.control.policies` (the offline harness: exact evaluation, rollouts, fitting helpers;
the arms' names, kinds and labels are :mod:`speclimits.arms`),
:mod:`~speclimits.control.fit` (``speclimits control fit``: parameters from a trace's train split
into a JSON), :mod:`~speclimits.control.offline` (offline prediction beside the Oracle's two bounds),
:mod:`~speclimits.control.extension` (the worker extension that applies a policy per request per
round), :mod:`~speclimits.control.engine` (building the engines), :mod:`~speclimits.control.bench`
(``speclimits control bench``), :mod:`~speclimits.control.report` (the book's section 8; its charts
are in :mod:`speclimits.figures.control`), :mod:`~speclimits.control.cli` (``speclimits control fit``,
``speclimits control bench``).
"""
