"""The private vLLM names the tracing harness relies on, and a checker that reads vLLM's source.

Every hook of :mod:`speclimits.tracing.extension` (and the engine plumbing of
:mod:`speclimits.tracing.engine`, :mod:`~speclimits.tracing.sweep` and
:mod:`~speclimits.tracing.oracle_mode`) touches vLLM internals that change between releases.
:data:`NEEDS` lists each of them once: the class, method, parameter, attribute, call or
environment variable, the vLLM file it lives in, and what the harness does with it.

:func:`check_source` checks the list against a vLLM source tree **without importing vLLM**
(``ast`` on the ``.py`` files, found with ``importlib.util.find_spec("vllm")`` or given as a
folder, e.g. an unpacked wheel), so it runs on a machine without CUDA, on any vLLM version.
Classes are followed through their base classes (by the imports of the file that defines
them), so a method that moved to a mixin is still found. Three uses:

* ``python scripts/check_vllm_api.py [--vllm-dir DIR]`` prints the table (name, where,
  present, signature as expected, used by);
* :func:`require_supported` is the harness's start-up check (``engine.make_llm``): an
  unsupported vLLM fails in one line naming what is missing, before an engine is built;
  it also refuses Model Runner V2 (see :func:`refuse_v2_runner`);
* :func:`runner_members` gives the worker-side check (``extension.check_runner``) the same
  runner methods and attributes, checked with ``hasattr`` on the live runner.

:data:`V2_NAMES` lists, for reference only, the Model Runner V2 steps a V2 tracer would hook
(``sample``, ``postprocess_sampled``, ``speculator.propose``); the harness does not use them.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from speclimits.errors import SpeclimitsError

#: vLLM versions the hooks were run and verified against (on CPU, V1 runner).
VERIFIED_VLLM = ("0.32.0",)

V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
V2_RUNNER_FILE = "v1/worker/gpu/model_runner.py"

RUNNER = "v1/worker/gpu_model_runner.py"
BATCH = "v1/worker/gpu_input_batch.py"
ROUTER = "model_executor/layers/fused_moe/router/base_router.py"
MOE_RUNNER = "model_executor/layers/fused_moe/runner/moe_runner.py"
PROPOSER = "v1/spec_decode/llm_base_proposer.py"
LLM_FILE = "entrypoints/llm.py"
ARGS = "engine/arg_utils.py"
EXT = "tracing/extension.py"
ENG = "tracing/engine.py"


class UnsupportedVllmError(SpeclimitsError):
    """The installed vLLM lacks a private hook the tracer needs (or runs Model Runner V2)."""


@dataclass(frozen=True)
class Need:
    """One private vLLM name the harness relies on.

    kind : ``class`` (a class defined in ``file``), ``method`` (``cls.member`` is a function,
        found in the class or its bases; ``params``: its leading parameters after ``self``,
        in order, when the harness passes or reads them by position), ``param`` (``cls.member``
        accepts the keyword parameters ``params``), ``attr`` (``cls.member`` is set on
        ``self``, declared as a field, or is a property/method), ``calls`` (method
        ``cls.member`` calls ``target``, with ``nargs`` positional arguments when given),
        ``reads`` (method ``cls.member`` reads an attribute named ``target``),
        ``env`` (``member`` is a key of a dict in ``file``: vLLM's environment variables),
        ``string`` (the constant ``member`` occurs in ``file``: metric names, config keys)
        or ``module`` (``file`` exists).
    file : path under the ``vllm`` package folder.
    used_by : the speclimits module (under ``speclimits/``) and what it does with the name.
    runtime : also checked with ``hasattr`` on the live model runner (worker side).
    required : a missing optional name is reported but does not fail the check.
    """

    kind: str
    file: str
    cls: str | None
    member: str | None
    used_by: str
    params: tuple[str, ...] = ()
    target: str | None = None
    nargs: int | None = None
    runtime: bool = False
    required: bool = True

    @property
    def name(self) -> str:
        if self.kind == "calls":
            return f"{self.cls}.{self.member} -> {self.target}()"
        if self.kind == "reads":
            return f"{self.cls}.{self.member} -> .{self.target}"
        if self.kind in ("env", "string"):
            return repr(self.member) if self.kind == "string" else str(self.member)
        if self.kind == "module":
            return f"vllm/{self.file}"
        parts = [p for p in (self.cls, self.member) if p]
        text = ".".join(parts)
        if self.kind == "method":
            return f"{text}()"
        if self.kind == "param":
            return f"{text}({', '.join(p + '=' for p in self.params)})"
        return text


def _runner(kind: str, member: str, used_by: str, runtime: bool | None = None, **kw: Any) -> Need:
    """A need on the V1 runner; methods and attributes are also checked on the live runner."""
    runtime = kind in ("method", "attr") if runtime is None else runtime
    return Need(kind, RUNNER, "GPUModelRunner", member, used_by, runtime=runtime, **kw)


#: Everything the harness relies on, in the order of a step.
NEEDS: tuple[Need, ...] = (
    # the worker and the extension mechanism
    Need("class", RUNNER, "GPUModelRunner", None, f"{EXT} check_runner: isinstance of the V1 runner"),
    Need("class", "v1/worker/cpu_model_runner.py", "CPUModelRunner", None, f"{EXT}: the CPU runner (subclass)"),
    Need("attr", "v1/worker/gpu_worker.py", "Worker", "model_runner", f"{EXT}: self.model_runner in the worker"),
    Need("attr", "config/parallel.py", "ParallelConfig", "worker_extension_cls",
         f"{ENG} engine_kwargs: names TracingWorkerExtension"),
    Need("reads", "v1/worker/worker_base.py", "WorkerWrapperBase", "init_worker",
         f"{ENG}: the worker wrapper mixes the extension class into the worker", target="worker_extension_cls"),
    # runner hooks (wrapped as instance attributes)
    _runner("method", "execute_model", f"{EXT}: start of a step, keeps scheduler_output (arg 0)",
            params=("scheduler_output",)),
    _runner("method", "_model_forward", f"{EXT}: target forward; reads input_ids / positions (args 0, 1)",
            params=("input_ids", "positions")),
    _runner("calls", "execute_model", f"{EXT}: the target forward goes through the wrapped hook",
            target="self._model_forward"),
    _runner("method", "_sample", f"{EXT}: Oracle mode forces the reference token in sampled_token_ids"),
    _runner("method", "sample_tokens", f"{EXT}: end of a step; the step record is kept"),
    _runner("calls", "sample_tokens", f"{EXT}: rejection sampling goes through the wrapped hook",
            target="self._sample"),
    _runner("method", "propose_draft_token_ids", f"{EXT}: the whole drafter call (t_draft_ms, drafts made)",
            params=("scheduler_output", "sampled_token_ids")),
    _runner("calls", "sample_tokens", f"{EXT}: the drafter call goes through the wrapped hook",
            target="self.propose_draft_token_ids"),
    _runner("method", "get_model", f"{EXT} speclimits_install: the target model (MoE routers)"),
    # runner attributes
    _runner("attr", "input_batch", f"{EXT}: input_batch.req_ids = row order of the forward"),
    _runner("attr", "requests", f"{EXT}: per-request state (context, prompt, outputs, blocks)"),
    _runner("attr", "kv_cache_config", f"{EXT}: kv_cache_config.num_blocks (KV usage)"),
    _runner("attr", "speculative_config", f"{EXT}: the runner is configured for speculation"),
    _runner("attr", "use_async_scheduling", f"{EXT}: refused when True (tracing reads steps synchronously)"),
    _runner("attr", "device", f"{EXT}: routing buffer device; CUDA events when cuda"),
    _runner("attr", "model_config", f"{EXT}: model_config.dtype for meta.json"),
    _runner("attr", "max_num_tokens", f"{EXT}: size of the static routing buffer"),
    _runner("attr", "cudagraph_batch_sizes", f"{EXT}: routing buffer covers every captured graph size",
            required=False),
    _runner("attr", "drafter", f"{EXT}: drafter.model.compute_logits (Oracle mode; set only when speculating)",
            runtime=False),
    # CUDA graphs: the routing callback must be recorded into the graphs, so they are captured again
    _runner("method", "capture_model", f"{EXT} recapture_cuda_graphs: graphs captured again once the callback "
            "is bound (GPU, graphs on)", runtime=False),
    _runner("attr", "compilation_config", f"{EXT} recapture_cuda_graphs: compilation_config.cudagraph_mode"),
    Need("method", "compilation/cuda_graph.py", "CUDAGraphWrapper", "clear_all_graphs",
         f"{EXT} recapture_cuda_graphs: drops the graphs captured without the callback"),
    Need("method", "compilation/breakable_cudagraph.py", "BreakableCUDAGraphWrapper", "clear_all_graphs",
         f"{EXT} recapture_cuda_graphs: the same for breakable graphs", required=False),
    *(Need("attr", "config/compilation.py", "CompilationConfig", name, f"tools/gpu_check.py: graphs run ({name})")
      for name in ("mode", "cudagraph_mode", "cudagraph_capture_sizes")),
    # per-step state the hooks read
    Need("attr", BATCH, "InputBatch", "req_ids", f"{EXT} _speclimits_before_forward: request row order"),
    Need("attr", BATCH, "CachedRequestState", "num_computed_tokens", f"{EXT}: context_len"),
    Need("attr", BATCH, "CachedRequestState", "prompt_token_ids", f"{EXT}: n_prompt"),
    Need("attr", BATCH, "CachedRequestState", "output_token_ids", f"{EXT}: n_out_before (prefill or decode)"),
    Need("attr", BATCH, "CachedRequestState", "block_ids", f"{EXT}: KV blocks in use"),
    Need("attr", "v1/core/sched/output.py", "SchedulerOutput", "num_scheduled_tokens", f"{EXT}: rows per request"),
    Need("attr", "v1/core/sched/output.py", "SchedulerOutput", "scheduled_spec_decode_tokens",
         f"{EXT}: drafts verified per request"),
    Need("attr", "v1/kv_cache_interface.py", "KVCacheConfig", "num_blocks", f"{EXT}: KV usage denominator"),
    Need("attr", "v1/outputs.py", "SamplerOutput", "sampled_token_ids", f"{EXT} _speclimits_force: [b, 0] written"),
    Need("attr", "v1/outputs.py", "ModelRunnerOutput", "sampled_token_ids", f"{EXT} _speclimits_finish: tokens"),
    Need("attr", "v1/outputs.py", "ModelRunnerOutput", "req_id_to_index", f"{EXT} _speclimits_finish: row of a request"),
    # routing capture
    Need("class", MOE_RUNNER, "MoERunner", None, f"{EXT} find_moe_routers: the target's MoE layers"),
    Need("attr", MOE_RUNNER, "MoERunner", "router", f"{EXT} find_moe_routers: router.set_capture_fn"),
    Need("attr", MOE_RUNNER, "MoERunner", "is_monolithic", f"{EXT}: monolithic kernels route inside the kernel"),
    Need("attr", MOE_RUNNER, "MoERunner", "layer_name", f"{EXT}: named in error messages", required=False),
    Need("method", ROUTER, "BaseRouter", "set_capture_fn", "tracing/capture.py RoutingCapture.bind",
         params=("capture_fn",)),
    Need("calls", ROUTER, "BaseRouter", "_select_experts", "tracing/capture.py: capture_fn(topk_ids), one argument",
         target="self.capture_fn", nargs=1),
    Need("attr", ROUTER, "BaseRouter", "top_k", f"{EXT} speclimits_install: top_k"),
    Need("attr", ROUTER, "BaseRouter", "global_num_experts", f"{EXT} speclimits_install: n_experts"),
    # the drafter (Oracle mode)
    Need("attr", PROPOSER, "SpecDecodeBaseProposer", "model", f"{EXT}: drafter.model.compute_logits is wrapped"),
    Need("attr", PROPOSER, "SpecDecodeBaseProposer", "use_local_argmax_reduction",
         f"{EXT} speclimits_set_oracle: refused when True (bypasses compute_logits)"),
    Need("calls", PROPOSER, "SpecDecodeBaseProposer", "_greedy_sample", f"{EXT}: draft logits pass through the wrapper",
         target="self.model.compute_logits", nargs=1),
    # the driver side
    Need("method", LLM_FILE, "LLM", "collective_rpc", f"{ENG} make_llm: calls the extension's methods",
         params=("method",)),
    Need("param", LLM_FILE, "LLM", "collective_rpc", f"{ENG}: collective_rpc(name, args=...)", params=("args",)),
    Need("method", LLM_FILE, "LLM", "get_metrics", f"{ENG} spec_counters: vLLM's spec-decode counters"),
    Need("attr", LLM_FILE, "LLM", "request_counter", "tracing/oracle_mode.py: request ids generate() assigns"),
    Need("attr", "utils/counter.py", "Counter", "counter", "tracing/oracle_mode.py: request_counter.counter"),
    Need("attr", LLM_FILE, "LLM", "llm_engine", f"{ENG} close_llm: llm_engine.engine_core.shutdown()"),
    Need("attr", "v1/engine/llm_engine.py", "LLMEngine", "engine_core", f"{ENG} close_llm"),
    Need("method", "v1/engine/core_client.py", "EngineCoreClient", "shutdown", f"{ENG} close_llm"),
    Need("string", "v1/spec_decode/metrics.py", None, "vllm:spec_decode_num_draft_tokens",
         f"{ENG} spec_counters: drafted tokens (cross-check)"),
    Need("string", "v1/spec_decode/metrics.py", None, "vllm:spec_decode_num_accepted_tokens",
         f"{ENG} spec_counters: accepted tokens (cross-check)"),
    # engine arguments the harness sets
    *(Need("attr", ARGS, "EngineArgs", name, f"{ENG} engine_kwargs: LLM({name}=...)") for name in (
        "worker_extension_cls", "async_scheduling", "disable_log_stats", "enforce_eager",
        "distributed_executor_backend", "block_size", "enable_prefix_caching", "max_num_seqs",
        "max_num_batched_tokens", "speculative_config", "skip_tokenizer_init", "load_format", "max_model_len",
        "seed", "dtype", "compilation_config")),
    *(Need("attr", "config/speculative.py", "SpeculativeConfig", name, f"{ENG}: speculative_config['{name}']")
      for name in ("method", "num_speculative_tokens", "model")),
    Need("string", "model_executor/models/llama_eagle3.py", None, "eagle_aux_hidden_state_layer_ids",
         "tracing/tinymodel.py: aux layers of a shallow EAGLE-3 target", required=False),
    # environment variables
    *(Need("env", "envs.py", None, name, f"{ENG}: {why}") for name, why in (
        ("VLLM_CPU_KVCACHE_SPACE", "CPU default 1 GiB"),
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "CPU default 0 (engine in-process)"),
        ("VLLM_CPU_OMP_THREADS_BIND", "CPU default nobind"),
        (V2_ENV, "Model Runner V2 is refused unless this is 0"))),
)

#: Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``): the steps a V2 tracer would hook.
#: For reference (README, the table's second part); the harness refuses V2 and hooks none of them.
V2_NAMES: tuple[Need, ...] = (
    Need("module", V2_RUNNER_FILE, None, None, "V2 runner (selected by default on GPU)", required=False),
    *(Need("method", V2_RUNNER_FILE, "GPUModelRunner", name, f"V2: {why}", required=False) for name, why in (
        ("execute_model", "prepares inputs, runs the forward (eager, PIECEWISE or FULL graph) inline"),
        ("sample_tokens", "sampling, post-processing, then the speculator"),
        ("sample", "target logits + (rejection) sampler: replaces _sample"),
        ("postprocess_sampled", "updates num_computed_tokens / last sampled tokens on the GPU"),
        ("take_draft_token_ids", "drafts handed to the scheduler"))),
    Need("calls", V2_RUNNER_FILE, "GPUModelRunner", "sample_tokens", "V2: the drafter call (replaces "
         "propose_draft_token_ids)", target="self.speculator.propose", required=False),
    Need("calls", V2_RUNNER_FILE, "GPUModelRunner", "sample_tokens", "V2: sampling step",
         target="self.sample", required=False),
    Need("calls", V2_RUNNER_FILE, "GPUModelRunner", "sample_tokens", "V2: post-processing step",
         target="self.postprocess_sampled", required=False),
    Need("attr", V2_RUNNER_FILE, "GPUModelRunner", "req_states", "V2: per-request state (GPU tensors) "
         "instead of requests / CachedRequestState", required=False),
    Need("attr", V2_RUNNER_FILE, "GPUModelRunner", "execute_model_state", "V2: the step's input_batch "
         "(a new InputBatch per step) lives here between execute_model and sample_tokens", required=False),
    Need("attr", V2_RUNNER_FILE, "GPUModelRunner", "step_timing", "V2: its own forward/drafter timing "
         "collector", required=False),
)


# ---------------------------------------------------------------------------
# finding and parsing vLLM's source
# ---------------------------------------------------------------------------


def find_vllm_root(path: str | Path | None = None) -> Path:
    """The ``vllm`` package folder: ``path`` (the package folder or a folder holding it, e.g. an
    unpacked wheel) or, when None, the installed one (``find_spec``; vLLM is not imported)."""
    if path is not None:
        p = Path(path)
        for cand in (p, p / "vllm"):
            if (cand / "__init__.py").is_file() and (cand / "envs.py").is_file():
                return cand.resolve()
        raise SpeclimitsError(f"{p}: not a vLLM source folder (expected vllm/__init__.py and vllm/envs.py in it)")
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SpeclimitsError("vLLM is not installed in this environment (importlib.util.find_spec('vllm') "
                              "found nothing); give its source folder with --vllm-dir")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def vllm_version(root: Path) -> str:
    """``__version__`` from ``vllm/_version.py`` (read, not imported); ``"?"`` when absent."""
    path = root / "_version.py"
    if not path.is_file():
        return "?"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets):
            return str(node.value.value)
    return "?"


def installed_version() -> str:
    """The installed vLLM's version: from the imported module when it is loaded, else read from
    its source (never imports it); ``"not installed"`` when there is none."""
    module = sys.modules.get("vllm")
    if getattr(module, "__version__", None):
        return str(module.__version__)
    try:
        return vllm_version(find_vllm_root())
    except SpeclimitsError:
        return "not installed"


class SourceIndex:
    """Parsed modules of one vLLM source tree, and class lookup through imports and bases.

    Paths are relative to the package folder, e.g. ``v1/worker/gpu_model_runner.py``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, rel: str) -> ast.Module | None:
        """The parsed module, or None when the file does not exist."""
        if rel not in self._trees:
            path = self.root / rel
            self._trees[rel] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) \
                if path.is_file() else None
        return self._trees[rel]

    def files_read(self) -> list[str]:
        """The files parsed so far (those that exist), relative to the package folder."""
        return [rel for rel, tree in self._trees.items() if tree is not None]

    def module_file(self, dotted: str) -> str | None:
        """``vllm.a.b`` -> ``a/b.py`` or ``a/b/__init__.py`` (None outside vLLM or when absent)."""
        parts = dotted.split(".")
        if parts[0] != "vllm":
            return None
        base = "/".join(parts[1:])
        for rel in (f"{base}.py", f"{base}/__init__.py" if base else "__init__.py"):
            if (self.root / rel).is_file():
                return rel
        return None

    def find_class(self, rel: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` as seen from module ``rel``: defined there, or imported (followed)."""
        tree = self.tree(rel)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return rel, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        src = self.module_file(node.module)
                        if src is not None:
                            found = self.find_class(src, alias.name, depth + 1)
                            if found is not None:
                                return found
        return None

    def class_chain(self, rel: str, name: str) -> list[tuple[str, ast.ClassDef]]:
        """The class and its vLLM base classes, depth first (what ``getattr`` would search)."""
        out: list[tuple[str, ast.ClassDef]] = []
        seen: set[tuple[str, str]] = set()

        def visit(module: str, cls_name: str) -> None:
            found = self.find_class(module, cls_name)
            if found is None or (found[0], found[1].name) in seen:
                return
            seen.add((found[0], found[1].name))
            out.append(found)
            for base in found[1].bases:
                if isinstance(base, ast.Name):
                    visit(found[0], base.id)
                elif isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name):  # Generic[...]
                    visit(found[0], base.value.id)

        visit(rel, name)
        return out


# ---------------------------------------------------------------------------
# checking one need
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: ``present`` (found), ``signature_ok`` (None: nothing to compare)."""

    name: str
    kind: str
    where: str
    present: bool
    signature: str
    signature_ok: bool | None
    used_by: str
    required: bool

    @property
    def ok(self) -> bool:
        return not self.required or (self.present and self.signature_ok is not False)


def _functions(cls: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _find_method(chain: list[tuple[str, ast.ClassDef]], member: str) -> tuple[str, Any] | None:
    for rel, cls in chain:
        for fn in _functions(cls):
            if fn.name == member:
                return rel, fn
    return None


def _assigned_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _assigned_names(elt)
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        yield target.attr


def _find_attr(chain: list[tuple[str, ast.ClassDef]], member: str) -> tuple[str, int] | None:
    """Where ``member`` is a class-level field, a method/property, or assigned on ``self``."""
    for rel, cls in chain:
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == member:
                return rel, node.lineno
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == member for t in node.targets):
                return rel, node.lineno
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == member:
                return rel, node.lineno
        for fn in _functions(cls):
            for node in ast.walk(fn):
                targets: list[ast.AST] = []
                if isinstance(node, ast.Assign):
                    targets = list(node.targets)
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets = [node.target]
                if any(name == member for t in targets for name in _assigned_names(t)):
                    return rel, node.lineno
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], bool]:
    """(positional parameter names after self/cls, keyword-only names, accepts **kwargs)."""
    positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return positional, [a.arg for a in fn.args.kwonlyargs], fn.args.kwarg is not None


def _check_method(need: Need, chain: list[tuple[str, ast.ClassDef]]) -> tuple[str, bool, str, bool | None]:
    found = _find_method(chain, need.member or "")
    if found is None:
        return "", False, "-", None
    rel, fn = found
    positional, kwonly, has_kwargs = _params(fn)
    where = f"{rel}:{fn.lineno}"
    if need.kind == "param":
        missing = [p for p in need.params if p not in positional + kwonly]
        if missing and not has_kwargs:
            return where, True, f"no parameter {', '.join(missing)} (has {', '.join(positional + kwonly)})", False
        return where, True, f"accepts {', '.join(need.params)}", True
    if not need.params:
        return where, True, f"({', '.join(positional)})" if positional else "()", None
    head = positional[:len(need.params)]
    shown = f"({', '.join(positional[:len(need.params) + 1])}{', ...' if len(positional) > len(need.params) + 1 else ''})"
    if tuple(head) != need.params:
        return where, True, f"expected ({', '.join(need.params)}, ...), found {shown}", False
    return where, True, shown, True


def _check_calls(need: Need, chain: list[tuple[str, ast.ClassDef]]) -> tuple[str, bool, str, bool | None]:
    found = _find_method(chain, need.member or "")
    if found is None:
        return "", False, f"no method {need.member}", None
    rel, fn = found
    calls = [node for node in ast.walk(fn) if isinstance(node, ast.Call) and ast.unparse(node.func) == need.target]
    if not calls:
        return f"{rel}:{fn.lineno}", False, f"{need.member} does not call {need.target}()", None
    if need.nargs is not None:
        good = [c for c in calls if len(c.args) == need.nargs and not c.keywords]
        if not good:
            c = calls[0]
            return (f"{rel}:{c.lineno}", True, f"expected {need.nargs} positional argument(s), found "
                    f"{len(c.args)} (+{len(c.keywords)} keyword)", False)
        calls = good
    return f"{rel}:{calls[0].lineno}", True, f"{need.target}({'x' if need.nargs == 1 else '...'})", True


def _check_reads(need: Need, chain: list[tuple[str, ast.ClassDef]]) -> tuple[str, bool, str, bool | None]:
    found = _find_method(chain, need.member or "")
    if found is None:
        return "", False, f"no method {need.member}", None
    rel, fn = found
    reads = [node for node in ast.walk(fn) if isinstance(node, ast.Attribute) and node.attr == need.target]
    if not reads:
        return f"{rel}:{fn.lineno}", False, f"{need.member} does not read .{need.target}", None
    return f"{rel}:{reads[0].lineno}", True, "-", None


def _constant_strings(tree: ast.Module, dict_keys_only: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if dict_keys_only:
            if isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        out.setdefault(key.value, key.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.setdefault(node.value, node.lineno)
    return out


def check_need(index: SourceIndex, need: Need) -> Row:
    """Check one :class:`Need` against the source tree of ``index``."""
    where, present, signature, sig_ok = f"{need.file} (missing)", False, "-", None
    if need.kind == "module":
        present = index.tree(need.file) is not None
        where = need.file if present else f"{need.file} (missing)"
    elif need.kind in ("env", "string"):
        tree = index.tree(need.file)
        if tree is None:
            where = f"{need.file} (file missing)"
        else:
            line = _constant_strings(tree, need.kind == "env").get(need.member or "")
            present = line is not None
            where = f"{need.file}:{line}" if present else f"{need.file} (not found)"
    else:
        chain = index.class_chain(need.file, need.cls or "")
        if not chain:
            where = f"{need.file} (no class {need.cls})"
        elif need.kind == "class":
            present, where = True, f"{chain[0][0]}:{chain[0][1].lineno}"
        elif need.kind in ("method", "param"):
            w, present, signature, sig_ok = _check_method(need, chain)
            where = w or f"{need.file} (no {need.cls}.{need.member})"
        elif need.kind == "calls":
            w, present, signature, sig_ok = _check_calls(need, chain)
            where = w or f"{need.file} (no {need.cls}.{need.member})"
        elif need.kind == "reads":
            w, present, signature, sig_ok = _check_reads(need, chain)
            where = w or f"{need.file} (no {need.cls}.{need.member})"
        elif need.kind == "attr":
            found = _find_attr(chain, need.member or "")
            present = found is not None
            where = f"{found[0]}:{found[1]}" if found else f"{need.file} (no {need.cls}.{need.member})"
        else:
            raise ValueError(f"unknown kind {need.kind!r} of {need.name}")
    return Row(need.name, need.kind, where, present, signature, sig_ok, need.used_by, need.required)


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiReport:
    """Result of :func:`check_source`: ``rows`` (one per :data:`NEEDS` entry), ``v2_rows``
    (:data:`V2_NAMES`, for reference), the version and folder checked."""

    root: str
    version: str
    rows: tuple[Row, ...]
    v2_rows: tuple[Row, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def missing(self) -> list[Row]:
        """Required rows that fail (absent, or present with another signature)."""
        return [r for r in self.rows if not r.ok]

    @property
    def v2_present(self) -> bool:
        return bool(self.v2_rows) and self.v2_rows[0].present

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "version": self.version, "ok": self.ok,
                "rows": [asdict(r) | {"ok": r.ok} for r in self.rows],
                "v2_rows": [asdict(r) for r in self.v2_rows]}


def check_source(path: str | Path | None = None, needs: Sequence[Need] = NEEDS,
                 v2_names: Sequence[Need] = V2_NAMES) -> ApiReport:
    """Check ``needs`` (and, for reference, ``v2_names``) against the vLLM source at ``path``
    (see :func:`find_vllm_root`; None: the installed vLLM). Nothing of vLLM is imported."""
    root = find_vllm_root(path)
    index = SourceIndex(root)
    return ApiReport(str(root), vllm_version(root), tuple(check_need(index, n) for n in needs),
                     tuple(check_need(index, n) for n in v2_names))


@lru_cache(maxsize=8)
def _cached_report(root: str, stamp: float) -> ApiReport:
    return check_source(root)


def installed_report() -> ApiReport:
    """:func:`check_source` of the installed vLLM, cached per process (by the runner file's mtime)."""
    root = find_vllm_root()
    runner = root / RUNNER
    return _cached_report(str(root), runner.stat().st_mtime if runner.exists() else 0.0)


def describe_missing(rows: Sequence[Row]) -> str:
    """``name (where: what)`` for each failing row, ``; ``-separated (one line)."""
    parts = []
    for r in rows:
        what = "missing" if not r.present else r.signature
        parts.append(f"{r.name} [{what}; {r.where}]")
    return "; ".join(parts)


def refuse_v2_runner(version: str, cuda: bool, env: dict[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedVllmError` when vLLM would run Model Runner V2.

    ``VLLM_USE_V2_MODEL_RUNNER`` set to a true value always selects it; unset, vLLM >= 0.32
    selects V2 by default on a GPU (where Triton is present), so on CUDA the harness asks for
    an explicit ``0``. On CPU, unset, vLLM runs the V1 runner (V2 needs Triton there)."""
    env = os.environ if env is None else env
    value = env.get(V2_ENV)
    if value is not None and value.strip().lower() in ("0", "false", "no", "off"):
        return
    if value is not None and value.strip().lower() in ("1", "true", "yes", "on"):
        reason = f"{V2_ENV}={value} selects Model Runner V2"
    elif value is None and cuda:
        reason = f"vLLM {version} runs Model Runner V2 by default on a GPU"
    else:
        return
    raise UnsupportedVllmError(
        f"speclimits tracing: {reason}, which the tracer does not hook (it traces the V1 runner only); "
        f"set {V2_ENV}=0 and run again")


def require_supported(path: str | Path | None = None, *, cuda: bool = False,
                      env: dict[str, str] | None = None) -> ApiReport:
    """The harness's start-up check: refuse Model Runner V2 and any vLLM lacking a name of
    :data:`NEEDS`, in one line naming what is missing. Returns the report (for its version)."""
    report = installed_report() if path is None else check_source(path)
    if not report.ok:
        raise UnsupportedVllmError(
            f"speclimits tracing: vLLM {report.version} at {report.root} lacks what the tracer needs: "
            f"{describe_missing(report.missing)} (verified: vLLM {', '.join(VERIFIED_VLLM)}; full table: "
            "python scripts/check_vllm_api.py)")
    refuse_v2_runner(report.version, cuda, env)
    return report


V1_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
#: Packages of Model Runner V2 (GPU and its CPU subclass) in vLLM 0.32 / 0.33.
V2_RUNNER_PACKAGES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")


def runner_kind(runner: Any) -> str:
    """``"v1"`` (the V1 ``GPUModelRunner`` or a subclass, e.g. the CPU runner), ``"v2"`` (a Model
    Runner V2 class) or ``"other"``, from the class's MRO names (vLLM is not imported)."""
    mro = type(runner).__mro__
    if any((c.__module__, c.__name__) == V1_RUNNER for c in mro):
        return "v1"
    if any(c.__module__.startswith(V2_RUNNER_PACKAGES) and "ModelRunner" in c.__name__ for c in mro):
        return "v2"
    return "other"


def missing_on_runner(runner: Any) -> list[str]:
    """Names of :func:`runner_members` the live ``runner`` lacks (``name()`` for methods)."""
    methods, attrs = runner_members()
    out = [f"{m}()" for m in methods if not callable(getattr(runner, m, None))]
    return out + [a for a in attrs if not hasattr(runner, a)]


def runner_members() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(methods, attributes) of the V1 runner that the worker-side check verifies with hasattr."""
    methods = tuple(n.member for n in NEEDS if n.runtime and n.kind == "method" and n.required)
    attrs = tuple(n.member for n in NEEDS if n.runtime and n.kind == "attr" and n.required)
    return methods, attrs  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


def _cells(r: Row) -> list[str]:
    present = "yes" if r.present else ("no" if r.required else "no (optional)")
    sig = {True: "yes", False: "NO", None: "-"}[r.signature_ok]
    if r.signature not in ("-", ""):
        sig = f"{sig}: {r.signature}" if r.signature_ok is not None else f"not compared: {r.signature}"
    return [r.name, r.where, present, sig, r.used_by]


def format_table(rows: Sequence[Row], markdown: bool = False) -> str:
    """The rows as a text table (or a Markdown table): name, where, present, signature, used by."""
    head = ["name", "where (under vllm/)", "present", "signature as expected", "used by (speclimits/)"]
    body = [_cells(r) for r in rows]
    if markdown:
        esc = [[c.replace("|", "\\|") for c in row] for row in body]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc])
    widths = [min(max(len(row[i]) for row in body + [head]), cap) for i, cap in enumerate((58, 48, 13, 48, 200))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(row) for row in body])


def format_report(report: ApiReport, markdown: bool = False, with_v2: bool = True) -> str:
    """The whole report: a header line, the table of :data:`NEEDS`, the V2 reference table, a verdict."""
    n_missing = len(report.missing)
    lines = [f"vLLM {report.version} at {report.root}: {len(report.rows)} names the tracer relies on, "
             f"{len(report.rows) - n_missing} as expected, {n_missing} missing or changed", "",
             format_table(report.rows, markdown)]
    if with_v2 and report.v2_rows:
        lines += ["", "Model Runner V2 (reference only: not hooked; the harness refuses V2):", "",
                  format_table(report.v2_rows, markdown)]
    verdict = "OK: every required name is present with the expected signature" if report.ok else \
        f"FAIL: {describe_missing(report.missing)}"
    return "\n".join(lines + ["", verdict])


def main(argv: Sequence[str] | None = None) -> int:
    """``check_vllm_api [--vllm-dir DIR] [--markdown | --json]``: exit 0 when every required name is present."""
    p = argparse.ArgumentParser(
        prog="check_vllm_api",
        description="Check the private vLLM names the speclimits tracer relies on against a vLLM source tree "
                    "(the installed vLLM, or --vllm-dir: e.g. an unpacked wheel). Reads the source with ast; "
                    "imports nothing of vLLM (no CUDA needed). Exit status 1 when a required name is missing.")
    p.add_argument("--vllm-dir", default=None, help="the vllm package folder, or a folder holding it")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print Markdown tables")
    fmt.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-v2", action="store_true", help="leave out the Model Runner V2 reference table")
    args = p.parse_args(argv)
    try:
        report = check_source(args.vllm_dir)
    except SpeclimitsError as exc:
        print(f"check_vllm_api: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report, markdown=args.markdown, with_v2=not args.no_v2))
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
