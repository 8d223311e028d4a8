"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

``rules`` (the rules and the policy file), ``driver`` (the round driver the engine and the offline harness
both run), ``profile`` (costs measured in the engine and their refresh), ``extension`` (the vLLM worker
extension) with ``top1op`` (its token choice); offline, ``offline`` (evaluation beside the Oracle's bounds)
and ``fit`` (``speclimits control fit``). Arm names: :mod:`speclimits.arms`; the engine benchmark:
:mod:`speclimits.bench`; section 8's views: :mod:`speclimits.book.views.control_runs`.
"""
