"""The controller arms itself in ``vllm serve`` from its environment (a vLLM general plugin).

Entry point ``vllm.general_plugins: speclimits_control``: :func:`register` gives vLLM's worker wrapper a
``compile_or_warm_up_model`` that, after warm-up, arms policy ``SPECLIMITS_CONTROL_NAME`` (default ``delta``)
of ``SPECLIMITS_CONTROL_POLICY`` (profiling ``SPECLIMITS_CONTROL_PROFILE_ROUNDS`` rounds first) when the worker
carries the control extension and speculates::

    SPECLIMITS_CONTROL_POLICY=policy.json vllm serve TARGET --speculative-config '{...}' \\
        --worker-extension-cls speclimits.control.extension.ControlWorkerExtension --no-async-scheduling

Otherwise the wrapper only warms up (a non-speculating engine is told so in the log). ``SPECLIMITS_REPAIR_CPU_SAMPLER=1``
repairs vLLM's CPU rejection sampler (vllm-project/vllm#55005) in any server, stock ones included.
"""

from __future__ import annotations

import logging
import os
from typing import Any

#: The environment that arms the controller: the policy JSON and the policy's name in it (default ``delta``)
ENV_POLICY, ENV_NAME = "SPECLIMITS_CONTROL_POLICY", "SPECLIMITS_CONTROL_NAME"
#: Rounds profiled before the policy applies (``0``: price with the policy file's cost model).
ENV_PROFILE = "SPECLIMITS_CONTROL_PROFILE_ROUNDS"
#: ``1``: repair vLLM's CPU rejection sampler (vllm#55005) in this server, with or without the controller
ENV_REPAIR = "SPECLIMITS_REPAIR_CPU_SAMPLER"

log = logging.getLogger("speclimits.control")


def register() -> None:
    """vLLM's hook (any process, possibly several times): install :func:`warm_up_then_arm` on the worker
    wrapper, once."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if "compile_or_warm_up_model" not in WorkerWrapperBase.__dict__:  # the wrapper forwards it to the worker
        WorkerWrapperBase.compile_or_warm_up_model = warm_up_then_arm  # type: ignore[attr-defined]


def warm_up_then_arm(wrapper: Any) -> Any:
    """The worker's warm-up; then, with :data:`ENV_POLICY` set and the control extension in the worker,
    the policy armed (:meth:`~speclimits.control.extension.ControlWorkerExtension.speclimits_control_arm`)."""
    out = wrapper.worker.compile_or_warm_up_model()
    if os.environ.get(ENV_REPAIR) == "1":
        from speclimits.tracing.engine import cuda_available
        from speclimits.tracing.extension import fix_cpu_expand

        fix = None if cuda_available() else fix_cpu_expand()
        log.warning("speclimits: %s", fix or "vLLM's rejection sampler needs no repair here")
    if not os.environ.get(ENV_POLICY):
        return out
    worker = wrapper.worker
    # the extension (speclimits.control.extension) imports this module for its variables: read by its method
    if not callable(getattr(worker, "speclimits_control_arm", None)):
        log.warning("speclimits control: %s is set but the worker has no control extension "
                    "(--worker-extension-cls speclimits.control.extension.ControlWorkerExtension): not armed",
                    ENV_POLICY)
    elif getattr(worker.model_runner, "speculative_config", None) is None:
        log.warning("speclimits control: %s is set but the engine does not speculate "
                    "(--speculative-config): not armed", ENV_POLICY)
    else:
        info = worker.speclimits_control_arm()
        log.warning("speclimits control: armed policy %s of %s (K_max %s, %s profiling rounds first)",
                    info["policy"], os.environ[ENV_POLICY], info["k_max"], info["profiling_rounds"])
    return out
