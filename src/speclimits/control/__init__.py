"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

:mod:`~speclimits.control.rules` (the rules and the policy file), :mod:`~speclimits.control.driver` (the
round driver that the engine and the offline harness both run), :mod:`~speclimits.control.profile` (costs
measured in the engine and their refresh), :mod:`~speclimits.control.extension` (the vLLM worker extension)
with :mod:`~speclimits.control.top1op` (its compiled top-1); offline, :mod:`~speclimits.control.offline`
(evaluation beside the Oracle's bounds, the batch replay) and :mod:`~speclimits.control.fit` (``speclimits
control fit``). Around it: arm names in :mod:`speclimits.arms`, the engine benchmark in
:mod:`speclimits.bench`, section 8's views in :mod:`speclimits.book.views.control_runs`.
"""
