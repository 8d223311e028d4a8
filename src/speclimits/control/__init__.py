"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

The controller: :mod:`~speclimits.control.rules` (the rules, each written once in the form the engine
runs, and the policy file), :mod:`~speclimits.control.driver` (the round driver that both the engine and
the offline harness run, with the engine's observation timing; recording and replaying its inputs),
:mod:`~speclimits.control.profile` (the costs measured in the engine and their refresh),
:mod:`~speclimits.control.extension` (the worker extension that applies a policy per request per round)
and :mod:`~speclimits.control.top1op` (its compiled top-1 probability).

Offline and around it: :mod:`~speclimits.control.offline` (exact evaluation and rollouts through the
round driver, the prediction beside the Oracle's two bounds, the batch replay; the arms' names, kinds and
labels are :mod:`speclimits.arms`), :mod:`~speclimits.control.fit` and :mod:`~speclimits.control.cli`
(``speclimits control fit``). The engine benchmark (``speclimits control bench``) is tooling around it:
:mod:`speclimits.bench`. The book's section 8 reads the committed runs through
:mod:`speclimits.book.views.control_runs`; its charts are :mod:`speclimits.figures.control`.
"""
