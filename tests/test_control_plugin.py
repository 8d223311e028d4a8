"""The vLLM plugin that arms the controller from the environment (speclimits.control.plugin), on stand-in
workers: what it does with and without the variable, the extension and a speculating engine. The real
server is tests/test_control_serve.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from speclimits.control import plugin  # noqa: E402
from speclimits.control.extension import ControlWorkerExtension  # noqa: E402


class Worker(ControlWorkerExtension):
    def __init__(self, speculates: bool) -> None:
        self.calls: list[str] = []
        self.model_runner = SimpleNamespace(speculative_config=object() if speculates else None)

    def compile_or_warm_up_model(self) -> str:
        self.calls.append("warm-up")
        return "warmed"

    def speclimits_control_arm(self) -> dict:
        self.calls.append("arm")
        return {"policy": "delta", "k_max": 6, "profiling_rounds": 12}


def test_the_worker_wrapper_warms_up_then_arms(monkeypatch, caplog):
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    plugin.register()
    plugin.register()  # vLLM may load plugins more than once
    assert WorkerWrapperBase.__dict__["compile_or_warm_up_model"] is plugin.warm_up_then_arm
    monkeypatch.delenv(plugin.ENV_POLICY, raising=False)
    monkeypatch.delenv(plugin.ENV_REPAIR, raising=False)
    quiet = Worker(speculates=True)
    assert plugin.warm_up_then_arm(SimpleNamespace(worker=quiet)) == "warmed" and quiet.calls == ["warm-up"]

    monkeypatch.setenv(plugin.ENV_POLICY, "policy.json")
    armed = Worker(speculates=True)
    with caplog.at_level(logging.WARNING, logger="speclimits.control"):
        assert plugin.warm_up_then_arm(SimpleNamespace(worker=armed)) == "warmed"
    assert armed.calls == ["warm-up", "arm"]
    assert "armed policy delta of policy.json (K_max 6, 12 profiling rounds first)" in caplog.text

    plain = Worker(speculates=False)  # an engine that does not speculate serves unarmed, and says so
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="speclimits.control"):
        plugin.warm_up_then_arm(SimpleNamespace(worker=plain))
    assert plain.calls == ["warm-up"] and "does not speculate" in caplog.text

    stock = SimpleNamespace(compile_or_warm_up_model=lambda: "warmed")  # no control extension in the worker
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="speclimits.control"):
        assert plugin.warm_up_then_arm(SimpleNamespace(worker=stock)) == "warmed"
    assert "no control extension" in caplog.text
