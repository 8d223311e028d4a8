"""Adaptive draft length K inside stock vLLM: one policy, evaluated offline and run in the engine.

``rules`` (the rules, the policy file), ``driver`` (the round driver engine and offline harness share),
``profile`` (costs measured in the engine), ``extension`` (the vLLM worker extension, with ``top1op``),
``offline`` and ``fit``. Arm names: :mod:`speclimits.arms`; the engine benchmark: :mod:`speclimits.bench`.
"""
