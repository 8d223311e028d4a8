"""What the tests that start servers or Ray sessions share: they run only inside a loopback-only network
namespace (``speclimits.tracing.ray_sweep.loopback_command``), so nothing they start can reach beyond this
machine; where one cannot be made they skip, except under ``scripts/test.sh`` (the README's and CI's command,
which sets ``SPECLIMITS_REQUIRE_RAY_TESTS=1``), where they must run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

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


def ray_scenario(work: Path, scenario: str, *options: str) -> dict:
    """Run ``tests/ray_scenarios.py WORK SCENARIO [options]`` in a loopback-only namespace (skips as
    :func:`require`); its ``RESULT`` line, the trace in ``work / scenario``."""
    from speclimits.tracing.ray_sweep import loopback_command, loopback_env

    require("ray", "vllm", what="the distributed tests")
    (work / "home").mkdir(exist_ok=True)
    env = loopback_env(work / "home")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [sys.executable, str(Path(__file__).with_name("ray_scenarios.py")), str(work), scenario, *options]
    proc = subprocess.run(loopback_command(argv), capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
