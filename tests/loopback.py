"""What the tests that start servers or Ray sessions share: they run only inside a loopback-only network
namespace (``speclimits.tracing.ray_sweep.loopback_command``), so nothing they start can reach beyond this
machine; where one cannot be made they skip, except under ``scripts/test.sh`` (the README's and CI's command,
which sets ``SPECLIMITS_REQUIRE_RAY_TESTS=1``), where they must run."""

from __future__ import annotations

import importlib.util
import os

import pytest

#: vLLM's CPU settings for a server or engine a test starts in a subprocess, usage statistics off
QUIET_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                  "VLLM_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
                  "DO_NOT_TRACK": "1"}


def unavailable(*modules: str) -> str | None:
    """Why such a test cannot run here (None: it can): a module of ``modules`` not installed (found, not
    imported), or no loopback-only network namespace."""
    from speclimits.tracing.ray_sweep import loopback_available

    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    why = loopback_available()
    return None if why is None else f"no loopback-only network namespace: {why}"


def require(*modules: str, what: str = "this test") -> None:
    """Skip unless :func:`unavailable` is None; under ``scripts/test.sh`` fail instead, naming ``what``."""
    why = unavailable(*modules)
    if why:
        if os.environ.get("SPECLIMITS_REQUIRE_RAY_TESTS") == "1":
            pytest.fail(f"{what} cannot run: {why}")
        pytest.skip(why)
