"""The private vLLM names the tracing harness relies on (:data:`NEEDS`, each once), checked on the installed
vLLM with ``hasattr`` and ``inspect`` (:func:`check`), at start-up (:func:`require_supported`) and on the live
runner (:func:`runner_members`); ``scripts/check_vllm_api.py`` prints the table.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Sequence

from speclimits.errors import SpeclimitsError

#: vLLM versions the hooks were run and verified against (on CPU, V1 runner).
VERIFIED_VLLM = ("0.32.0",)
V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"

RUNNER, BATCH = "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu_input_batch"
MOE = "vllm.model_executor.layers.fused_moe.runner.moe_runner"
ROUTER = "vllm.model_executor.layers.fused_moe.router.base_router"
PROPOSER, LLM = "vllm.v1.spec_decode.llm_base_proposer", "vllm.entrypoints.llm"
SAMPLER = "vllm.v1.sample.rejection_sampler"
EXT, ENG = "tracing/extension.py", "tracing/engine.py"


class UnsupportedVllmError(SpeclimitsError):
    """The installed vLLM lacks a private name the tracer needs (or runs Model Runner V2)."""


@dataclass(frozen=True)
class Need:
    """One row: ``name`` in ``module`` (``""``: the module itself; ``Class``, ``Class.attr``, or ``Class.method()``,
    which must be callable) and what ``used_by`` relies on: ``params``, the leading parameters after ``self``;
    ``kwargs``, keywords it accepts; ``fields``, attributes of the class (also annotations, or ``self.<field> =``
    in the source of the class or a base); ``keys``, keys of the dict; ``source``, regular expressions its
    source must match. ``live``: also checked on the live runner; ``required=False``: reported, not fatal."""

    module: str
    name: str
    used_by: str
    params: tuple[str, ...] = ()
    kwargs: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    source: tuple[str, ...] = ()
    live: bool = False
    required: bool = True


def _runner(name: str, used_by: str, live: bool = True, **kw: Any) -> Need:
    return Need(RUNNER, f"GPUModelRunner{name}", f"{EXT}: {used_by}", live=live, **kw)


#: Everything the harness relies on, in the order of a step.
NEEDS: tuple[Need, ...] = (
    # the worker and the extension mechanism
    Need("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", f"{EXT} check_runner: the CPU runner, a V1 subclass"),
    Need("vllm.v1.worker.gpu_worker", "Worker", f"{EXT}: self.model_runner", fields=("model_runner",)),
    Need("vllm.config.parallel", "ParallelConfig", f"{ENG}: names the extension", fields=("worker_extension_cls",)),
    Need("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker()", f"{ENG}: the extension is mixed in",
         source=(r"worker_extension_cls",)),
    # runner hooks, wrapped as instance attributes: the calls between them go through the wrappers
    _runner(".execute_model()", "step start; calls the forward", params=("scheduler_output",),
            source=(r"self\._model_forward\(",)),
    _runner("._model_forward()", "target forward, timed and routed", params=("input_ids", "positions")),
    _runner("._sample()", "Oracle mode forces the reference token"),
    _runner(".propose_draft_token_ids()", "drafter call, timed", params=("scheduler_output", "sampled_token_ids")),
    _runner(".sample_tokens()", "step end (recorded); calls the sampler and the drafter",
            source=(r"self\._sample\(", r"self\.propose_draft_token_ids\(")),
    _runner(".get_model()", "speclimits_install: the MoE routers"),
    _runner(".capture_model()", "recapture_cuda_graphs (GPU)", live=False),
    _runner("", "rows, request state, KV use, async refused, routing buffer, dtype, graph mode", fields=(
        "input_batch", "requests", "kv_cache_config", "speculative_config", "use_async_scheduling", "device",
        "model_config", "max_num_tokens", "compilation_config")),
    _runner("", "drafter.model.compute_logits (set only when speculating)", live=False, fields=("drafter",)),
    _runner("", "routing buffer size", live=False, required=False, fields=("cudagraph_batch_sizes",)),
    Need("vllm.compilation.cuda_graph", "CUDAGraphWrapper.clear_all_graphs()", f"{EXT} recapture_cuda_graphs"),
    Need("vllm.compilation.breakable_cudagraph", "BreakableCUDAGraphWrapper.clear_all_graphs()",
         f"{EXT} recapture_cuda_graphs", required=False),
    Need("vllm.config.compilation", "CompilationConfig", "tools/gpu_check.py: graph modes",
         fields=("mode", "cudagraph_mode", "cudagraph_capture_sizes")),
    # per-step state the hooks read
    Need(BATCH, "InputBatch", f"{EXT}: request row order", fields=("req_ids",)),
    Need(BATCH, "CachedRequestState", f"{EXT}: context, prompt, outputs, KV blocks",
         fields=("num_computed_tokens", "prompt_token_ids", "output_token_ids", "block_ids")),
    Need("vllm.v1.core.sched.output", "SchedulerOutput", f"{EXT}: rows and drafts verified per request",
         fields=("num_scheduled_tokens", "scheduled_spec_decode_tokens")),
    Need("vllm.v1.kv_cache_interface", "KVCacheConfig", f"{EXT}: KV usage", fields=("num_blocks",)),
    Need("vllm.v1.outputs", "SamplerOutput", f"{EXT} _speclimits_force", fields=("sampled_token_ids",)),
    Need("vllm.v1.outputs", "ModelRunnerOutput", f"{EXT} _speclimits_finish", fields=("sampled_token_ids",
                                                                                       "req_id_to_index")),
    # routing capture
    Need(MOE, "MoERunner", f"{EXT} find_moe_routers (monolithic refused)", fields=("router", "is_monolithic")),
    Need(MOE, "MoERunner", f"{EXT}: error messages", fields=("layer_name",), required=False),
    Need(ROUTER, "BaseRouter.set_capture_fn()", "tracing/capture.py RoutingCapture.bind", params=("capture_fn",)),
    Need(ROUTER, "BaseRouter._select_experts()", "tracing/capture.py: capture_fn(topk_ids), one argument",
         source=(r"self\.capture_fn\(\s*\w+\s*\)",)),
    Need(ROUTER, "BaseRouter", f"{EXT} speclimits_install: the MoE shape", fields=("top_k", "global_num_experts")),
    # the drafter (Oracle mode)
    Need(PROPOSER, "SpecDecodeBaseProposer", f"{EXT}: model.compute_logits wrapped; local argmax refused",
         fields=("model", "use_local_argmax_reduction")),
    Need(PROPOSER, "SpecDecodeBaseProposer._greedy_sample()", f"{EXT}: draft logits pass through the wrapper",
         source=(r"self\.model\.compute_logits\(\s*\w+\s*\)",)),
    # the rejection sampler (Oracle mode at temperature > 0: accept_prob, the target's choice at prefill)
    _runner("", "accept_prob: the rejection sampler (set only when speculating)", live=False,
            fields=("rejection_sampler",)),
    Need(BATCH, "InputBatch", f"{EXT} _speclimits_oracle_logits: the step's sampling", fields=("sampling_metadata",)),
    Need(SAMPLER, "RejectionSampler.apply_logits_processors()", f"{EXT} draft_accept_probs",
         params=("logits", "sampling_metadata", "metadata")),
    Need("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p()", f"{EXT} draft_accept_probs: top-k, top-p",
         params=("logits", "k", "p")),
    Need("vllm.v1.sample.metadata", "SamplingMetadata", f"{EXT} draft_accept_probs",
         fields=("all_greedy", "temperature", "top_k", "top_p")),
    Need("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata", f"{EXT} _speclimits_oracle_logits: draft rows",
         fields=("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens", "target_logits_indices",
                 "bonus_logits_indices")),
    Need("vllm.config.speculative", "SpeculativeConfig", "tracing/inputs.py check_sampled_oracle: a greedy draft",
         fields=("draft_sample_method",)),
    # the driver side
    Need(LLM, "LLM.collective_rpc()", f"{ENG}: calls the extension", params=("method",), kwargs=("args",)),
    Need(LLM, "LLM.get_metrics()", f"{ENG} spec_counters"),
    Need(LLM, "LLM", f"tracing/oracle_mode.py request ids; {ENG} close_llm", fields=("request_counter", "llm_engine")),
    Need("vllm.utils.counter", "Counter", "tracing/oracle_mode.py: request ids", fields=("counter",)),
    Need("vllm.v1.engine.llm_engine", "LLMEngine", f"{ENG} close_llm", fields=("engine_core",)),
    Need("vllm.v1.engine.core_client", "EngineCoreClient.shutdown()", f"{ENG} close_llm"),
    Need("vllm.v1.spec_decode.metrics", "", f"{ENG} spec_counters: counter names",
         source=("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")),
    # engine arguments and environment variables the harness sets
    Need("vllm.engine.arg_utils", "EngineArgs", f"{ENG} engine_kwargs", fields=(
        "worker_extension_cls", "async_scheduling", "disable_log_stats", "enforce_eager", "distributed_executor_backend",
        "block_size", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens", "speculative_config",
        "skip_tokenizer_init", "load_format", "max_model_len", "seed", "dtype", "compilation_config")),
    Need("vllm.config.speculative", "SpeculativeConfig", f"{ENG}: speculative_config",
         fields=("method", "num_speculative_tokens", "model")),
    Need("vllm.model_executor.models.llama_eagle3", "", "tracing/tinymodel.py: shallow EAGLE-3 aux layers",
         source=("eagle_aux_hidden_state_layer_ids",), required=False),
    Need("vllm.envs", "environment_variables", f"{ENG}: CPU defaults; V2 refused unless {V2_ENV}=0", keys=(
        "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND", V2_ENV)),
)


class Missing(NamedTuple):
    """A name of ``need`` that the installed vLLM lacks or has changed (``problem``)."""
    name: str
    problem: str
    need: Need


@lru_cache(maxsize=None)
def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):  # built-in, or no source file
        return ""


def _has_field(cls: Any, field: str) -> bool:
    if hasattr(cls, field):
        return True
    if not isinstance(cls, type):
        return False
    assigned = re.compile(rf"^\s*(?:[\w.]+\s*,\s*)*self\.{field}(?:\s*,\s*[\w.]+)*\s*(?::[^=\n]+)?=(?!=)", re.M)
    return any(field in inspect.get_annotations(c) or assigned.search(_source(c)) for c in cls.__mro__)


def _signature_problem(fn: Any, params: tuple[str, ...], kwargs: tuple[str, ...]) -> str | None:
    try:
        found = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "no readable signature"
    positional = [p.name for p in found if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = positional[1:] if positional[:1] in (["self"], ["cls"]) else positional
    if tuple(positional[:len(params)]) != params:
        return f"parameters ({', '.join(positional)}) instead of ({', '.join(params)}, ...)"
    lacking = [k for k in kwargs if k not in {p.name for p in found}]
    if lacking and not any(p.kind == p.VAR_KEYWORD for p in found):
        return f"no parameter {', '.join(lacking)}"
    return None


def _check_one(need: Need, load: Callable[[str], Any]) -> list[Missing]:
    try:
        obj = load(need.module)
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module raises while importing
        return [Missing(need.module, f"cannot import ({type(exc).__name__}: {exc})", need)]
    path = [p for p in need.name.removesuffix("()").split(".") if p]
    for i, part in enumerate(path):
        if not hasattr(obj, part):
            return [Missing(need.name if i == len(path) - 1 else ".".join(path[:i + 1]), "missing", need)]
        obj = getattr(obj, part)
    label = need.name or need.module
    if need.name.endswith("()") and not callable(obj):
        return [Missing(label, "not callable", need)]
    out = [Missing(f"{label}.{f}", "missing", need) for f in need.fields if not _has_field(obj, f)]
    out += [Missing(f"{label}[{k!r}]", "missing", need) for k in need.keys if k not in obj]
    problem = _signature_problem(obj, need.params, need.kwargs) if need.params or need.kwargs else None
    out += [Missing(label, problem, need)] if problem else []
    return out + [Missing(label, f"its source has no match for {p!r}", need) for p in need.source
                  if not re.search(p, _source(obj))]


def check(needs: Sequence[Need] = NEEDS, load: Callable[[str], Any] = importlib.import_module) -> list[Missing]:
    """Every name of ``needs`` the installed vLLM lacks or has changed, optional ones too."""
    return [m for need in needs for m in _check_one(need, load)]


def describe_missing(missing: Sequence[Missing]) -> str:
    """``name [problem; used by ...]`` for each, ``; ``-separated (one line)."""
    return "; ".join(f"{m.name} [{m.problem}; used by {m.need.used_by}]" for m in missing)


def installed_version() -> str:
    """The installed vLLM's version, without importing vLLM; ``"not installed"`` when there is none."""
    module = sys.modules.get("vllm")
    if getattr(module, "__version__", None):
        return str(module.__version__)
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        return importlib.metadata.version(dist)
    return "not installed" if importlib.util.find_spec("vllm") is None else "?"


def refuse_v2_runner(version: str, cuda: bool, env: dict[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedVllmError` when vLLM would run Model Runner V2: ``VLLM_USE_V2_MODEL_RUNNER``
    true, or unset on a GPU (vLLM >= 0.32's default there; on CPU, unset, it runs V1)."""
    value = (os.environ if env is None else env).get(V2_ENV)
    if value is None and cuda:
        reason = f"vLLM {version} runs Model Runner V2 by default on a GPU"
    elif value is not None and value.strip().lower() in ("1", "true", "yes", "on"):
        reason = f"{V2_ENV}={value} selects Model Runner V2"
    else:
        return
    raise v2_refused(reason)


def v2_refused(reason: str) -> UnsupportedVllmError:
    """The error that refuses Model Runner V2 (``reason``: what selects it)."""
    return UnsupportedVllmError(f"speclimits tracing: {reason}, which the tracer does not hook (it traces the V1 "
                                f"runner only); set {V2_ENV}=0 and run again")


def require_supported(*, cuda: bool = False, env: dict[str, str] | None = None) -> None:
    """The start-up check: refuse, in one line, a vLLM lacking a required name, and Model Runner V2."""
    missing = [m for m in check() if m.need.required]
    version = installed_version()
    if missing:
        raise UnsupportedVllmError(
            f"speclimits tracing: vLLM {version} lacks what the tracer needs: {describe_missing(missing)} "
            f"(verified: vLLM {', '.join(VERIFIED_VLLM)}; full table: python scripts/check_vllm_api.py)")
    refuse_v2_runner(version, cuda, env)


V1_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
#: Packages of Model Runner V2 (GPU and its CPU subclass) in vLLM 0.32 / 0.33.
V2_RUNNER_PACKAGES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")


def runner_kind(runner: Any) -> str:
    """``"v1"`` (the V1 ``GPUModelRunner`` or a subclass), ``"v2"`` or ``"other"``, from the class's MRO names."""
    mro = type(runner).__mro__
    if any((c.__module__, c.__name__) == V1_RUNNER for c in mro):
        return "v1"
    if any(c.__module__.startswith(V2_RUNNER_PACKAGES) and "ModelRunner" in c.__name__ for c in mro):
        return "v2"
    return "other"


def runner_members() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(methods, fields) of the V1 runner that the worker-side check verifies on the live runner."""
    live = [n for n in NEEDS if n.live and n.required]
    methods = tuple(n.name.split(".")[-1].removesuffix("()") for n in live if n.name.endswith("()"))
    return methods, tuple(f for n in live for f in n.fields)


def missing_on_runner(runner: Any) -> list[str]:
    """Names of :func:`runner_members` the live ``runner`` lacks (``name()`` for methods)."""
    methods, attrs = runner_members()
    out = [f"{m}()" for m in methods if not callable(getattr(runner, m, None))]
    return out + [a for a in attrs if not hasattr(runner, a)]
