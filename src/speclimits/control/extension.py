"""The worker extension that applies a policy per request per round inside stock vLLM (no fork).

Load it with ``LLM(..., worker_extension_cls="speclimits.control.extension.ControlWorkerExtension",
async_scheduling=False)``; it subclasses :class:`speclimits.tracing.extension.TracingWorkerExtension`,
so the same engine can also be traced (``speclimits_install``), and the trace then records the k
chosen per round (its ``n_draft``). Arm it with ``llm.collective_rpc("speclimits_control_set",
args=(policy_json_dict, name))``.

What it wraps on the V1 model runner and its drafter (instance attributes, removed by
``speclimits_control_uninstall``; verified on vLLM 0.32.0, CPU, V1 runner):

``runner.execute_model``            start of a step (round timer)
``runner.propose_draft_token_ids``  before drafting: the verification outcome of the round that just
                                    ended (accepted + bonus per request: non ``-1`` entries of the
                                    sampled row) goes to ``policy.observe``; ``policy.plan`` caps k
``drafter.model.compute_logits``    keeps the logits of each draft step
``drafter._sample_draft_tokens``    after each draft step: top-1 probability per request ->
                                    ``policy.more``; when every request has stopped, a private
                                    exception ends the drafter's loop early
``drafter.propose``                 catches it and returns the steps drafted so far
``runner.take_draft_token_ids``     per-request truncation to the kept k (ragged k in a batch)

K_max is ``num_speculative_tokens`` (the K the runner hands to ``propose``, which the batch-size
table may already have lowered). Greedy drafting only. Refused with a clear error: asynchronous
scheduling (``async_scheduling=True``: placeholders are scheduled before drafting, so a shorter
draft would not shrink the pass), a runner other than the V1 one, a drafter without the hooks
(ngram, parallel drafting, ``use_local_argmax_reduction``), probabilistic draft sampling.
On GPU this path is untested (CUDA graphs with ragged k, host syncs per draft step).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from speclimits.control.fit import PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.tracing.extension import TracingWorkerExtension
from speclimits.tracing.vllm_api import runner_kind

DRAFTER_HOOKS = ("propose", "_sample_draft_tokens")
RUNNER_HOOKS = ("execute_model", "propose_draft_token_ids", "take_draft_token_ids")
#: Environment variables that arm a policy when the tracer installs (see ``speclimits_install``).
ENV_POLICY, ENV_NAME = "SPECLIMITS_CONTROL_POLICY", "SPECLIMITS_CONTROL_NAME"


class _EarlyExit(Exception):
    """Raised inside the drafter's loop once every request has stopped; carries the steps drafted."""

    def __init__(self, tokens: list[Any]) -> None:
        super().__init__("every request stopped drafting")
        self.tokens = tokens


def check_control_runner(runner: Any) -> Any:
    """Raise :class:`SpeclimitsError` naming the setting the controller cannot run with; returns the drafter."""
    name = f"{type(runner).__module__}.{type(runner).__name__}"
    if runner_kind(runner) != "v1":
        raise SpeclimitsError(f"speclimits control: unsupported model runner {name}: only vLLM's V1 runner "
                              "(GPUModelRunner or its CPU subclass) is hooked; on vLLM >= 0.33 set "
                              "VLLM_USE_V2_MODEL_RUNNER=0")
    if getattr(runner, "use_async_scheduling", False):
        raise SpeclimitsError("speclimits control: async_scheduling=True is not supported (the scheduler reserves "
                              "K placeholders before drafting, so a shorter draft cannot shrink the pass); create "
                              "the engine with async_scheduling=False")
    missing = [h for h in RUNNER_HOOKS if not callable(getattr(runner, h, None))]
    if missing:
        raise SpeclimitsError(f"speclimits control: the model runner {name} lacks {', '.join(missing)}")
    drafter = getattr(runner, "drafter", None)
    dname = type(drafter).__name__
    if drafter is None:
        raise SpeclimitsError("speclimits control: the engine has no drafter (set speculative_config)")
    missing = [h for h in DRAFTER_HOOKS if not callable(getattr(drafter, h, None))]
    if missing or not callable(getattr(getattr(drafter, "model", None), "compute_logits", None)):
        raise SpeclimitsError(f"speclimits control: drafter {dname} lacks {', '.join(missing) or 'model.compute_logits'}"
                              " (supported: eagle, eagle3, draft_model; not ngram)")
    if getattr(drafter, "parallel_drafting", False):
        raise SpeclimitsError(f"speclimits control: drafter {dname} drafts in parallel; the per-step decision needs "
                              "autoregressive drafting")
    if getattr(drafter, "use_local_argmax_reduction", False):
        raise SpeclimitsError("speclimits control: use_local_argmax_reduction bypasses compute_logits; disable it")
    return drafter


def top1_probability(logits: Any, n_rows: int) -> np.ndarray:
    """(b,) top-1 probability of each row of a draft step's logits, in numpy (one host copy; a
    softmax over the vocabulary in torch costs more in per-call overhead at these sizes)."""
    if logits is None or logits.shape[0] != n_rows:
        raise SpeclimitsError(f"speclimits control: the drafter's compute_logits gave "
                              f"{None if logits is None else logits.shape[0]} rows for {n_rows} requests")
    x = logits.detach().float().cpu().numpy()
    return 1.0 / np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1)


class DraftRound:
    """One drafting round of the batch: request ids, memory, caps, confidences, kept k."""

    __slots__ = ("rids", "mem", "cap", "conf", "keep", "tokens", "k_call", "early", "t0")

    def __init__(self, rids: list[str], mem: dict[str, np.ndarray], cap: np.ndarray, k_call: int) -> None:
        self.rids, self.mem, self.cap, self.k_call = rids, mem, cap, k_call
        self.conf: list[np.ndarray] = []
        self.keep = np.full(len(rids), -1)
        self.tokens: list[Any] = []
        self.early = False


class ControlWorkerExtension(TracingWorkerExtension):
    """Mixed into vLLM's worker; see the module docstring. Call through ``collective_rpc``."""

    def speclimits_install(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The tracer's install; then, when :data:`ENV_POLICY` names a policy JSON and the engine
        speculates, arm policy :data:`ENV_NAME` (default ``delta``) on top of it — so that
        ``speclimits trace --engine-arg worker_extension_cls=...ControlWorkerExtension`` traces a
        controlled run (the trace's ``n_draft`` is then the k chosen per round)."""
        if getattr(self, "_sl_installed", False):  # control wraps the tracer's wrappers: unwrap in reverse order
            self.speclimits_control_uninstall()
        info = super().speclimits_install(options)
        path = os.environ.get(ENV_POLICY)
        if path and getattr(self.model_runner, "speculative_config", None) is not None:  # type: ignore[attr-defined]
            info["control"] = self.speclimits_control_set(PolicyFit.read(path).to_dict(),
                                                          os.environ.get(ENV_NAME, "delta"))
        return info

    def speclimits_control_set(self, policy: dict[str, Any], name: str) -> dict[str, Any]:
        """Install (or switch to) policy ``name`` of the policy JSON dict ``policy``; resets memory and records."""
        runner = self.model_runner  # type: ignore[attr-defined]
        drafter = check_control_runner(runner)
        fit = PolicyFit.from_dict(policy)
        k_engine = int(runner.speculative_config.num_speculative_tokens)
        pol = fit.make(name)
        pol.setup(min(fit.k_max, k_engine), fit.cost_model)
        self._sl_policy, self._sl_name = pol, name
        self._sl_mem: dict[str, dict[str, np.ndarray]] = {}
        self._sl_last_draft_ms: dict[str, float] = {}
        self._sl_keep: dict[str, int] = {}
        self._sl_records: list[dict[str, Any]] = []
        self._sl_round: DraftRound | None = None
        self._sl_t_step = 0.0
        self._sl_logits: Any = None
        self._sl_decide_s = 0.0
        self._sl_rounds = 0
        self._sl_early_exits = 0
        if not getattr(self, "_sl_installed", False):
            self._sl_wrap(runner, drafter)
            self._sl_installed = True
        return {"policy": name, "k_max": pol.k_max, "k_engine": k_engine, "detail": pol.describe()}

    def speclimits_control_drain(self) -> dict[str, Any]:
        """Rounds since the last drain: ``rounds`` (list of ``{"req_id", "k", "cap", "drafted", "early"}``
        per request per drafting round), ``decide_us`` (total decision time, µs), ``n_rounds``
        (drafting calls), ``early_exits``; and forget them."""
        out = {"rounds": self._sl_records, "decide_us": self._sl_decide_s * 1e6, "n_rounds": self._sl_rounds,
               "early_exits": self._sl_early_exits, "policy": self._sl_name}
        self._sl_records, self._sl_decide_s, self._sl_rounds, self._sl_early_exits = [], 0.0, 0, 0
        self._sl_mem, self._sl_last_draft_ms, self._sl_keep = {}, {}, {}
        return out

    def speclimits_control_uninstall(self) -> None:
        """Restore what :meth:`speclimits_control_set` wrapped."""
        runner = self.model_runner  # type: ignore[attr-defined]
        for (obj, attr), orig in getattr(self, "_sl_originals", {}).items():
            target = {"runner": runner, "drafter": runner.drafter, "model": runner.drafter.model}[obj]
            if orig is None:
                target.__dict__.pop(attr, None)
            else:
                setattr(target, attr, orig)
        self._sl_originals = {}
        self._sl_installed = False

    # -- wrapping ---------------------------------------------------------------------------
    def _sl_wrap(self, runner: Any, drafter: Any) -> None:
        self._sl_originals = {}
        objs = {"runner": runner, "drafter": drafter, "model": drafter.model}

        def wrap(obj: str, attr: str, factory: Any) -> None:
            target = objs[obj]
            self._sl_originals[(obj, attr)] = target.__dict__.get(attr)
            setattr(target, attr, factory(getattr(target, attr)))

        wrap("runner", "execute_model", self._sl_execute_model)
        wrap("runner", "propose_draft_token_ids", self._sl_propose_ids)
        wrap("runner", "take_draft_token_ids", self._sl_take)
        wrap("drafter", "propose", self._sl_propose)
        wrap("drafter", "_sample_draft_tokens", self._sl_sample_draft)
        wrap("model", "compute_logits", self._sl_logits_hook)

    def _sl_execute_model(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._sl_t_step = time.perf_counter()
            return orig(*args, **kwargs)
        return wrapped

    def _sl_logits_hook(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            logits = orig(*args, **kwargs)
            if self._sl_round is not None:
                self._sl_logits = logits
            return logits
        return wrapped

    def _sl_propose_ids(self, orig: Any) -> Any:
        def wrapped(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            rids = list(self.model_runner.input_batch.req_ids)  # type: ignore[attr-defined]
            self._sl_observe(scheduler_output, sampled_token_ids, rids, t0)
            self._sl_decide_s += time.perf_counter() - t0
            try:
                return orig(scheduler_output, sampled_token_ids, *args, **kwargs)
            finally:
                rnd, self._sl_round = self._sl_round, None
                if rnd is not None:
                    self._sl_finish_round(rnd, time.perf_counter() - t0)
        return wrapped

    def _sl_propose(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            k_call = int(kwargs.get("num_speculative_tokens", args[0] if args else 0))
            t0 = time.perf_counter()
            rids = list(self.model_runner.input_batch.req_ids)  # type: ignore[attr-defined]
            mem = self._sl_gather(rids)
            cap = np.clip(np.asarray(self._sl_policy.plan(mem), dtype=np.int64), 1, max(k_call, 1))
            self._sl_round = DraftRound(rids, mem, cap, k_call)
            self._sl_decide_s += time.perf_counter() - t0
            try:
                return orig(*args, **kwargs)
            except _EarlyExit as stop:
                import torch  # vLLM's own dependency, present wherever this runs inside the worker

                self._sl_round.early = True
                return torch.stack(stop.tokens, dim=1)
        return wrapped

    def _sl_sample_draft(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            ids, probs = orig(*args, **kwargs)
            rnd = self._sl_round
            if rnd is None:
                return ids, probs
            if probs is not None:
                raise SpeclimitsError("speclimits control supports greedy drafting only (the draft returned "
                                      "probabilities: probabilistic draft sampling is on)")
            t0 = time.perf_counter()
            rnd.tokens.append(ids)
            self._sl_step(rnd)
            self._sl_decide_s += time.perf_counter() - t0
            j = len(rnd.tokens)
            if (rnd.keep >= 0).all() and j < rnd.k_call:
                raise _EarlyExit(rnd.tokens)
            return ids, probs
        return wrapped

    def _sl_take(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if out is None:
                return out
            for i, rid in enumerate(out.req_ids):
                k = self._sl_keep.get(rid)
                if k is not None and len(out.draft_token_ids[i]) > k:
                    out.draft_token_ids[i] = list(out.draft_token_ids[i][:k])
            return out
        return wrapped

    # -- decisions --------------------------------------------------------------------------
    def _sl_gather(self, rids: list[str]) -> dict[str, np.ndarray]:
        pol = self._sl_policy
        for rid in rids:
            if rid not in self._sl_mem:
                self._sl_mem[rid] = pol.init_memory(1)
        keys = list(self._sl_mem[rids[0]]) if rids else []
        mem = {key: np.concatenate([self._sl_mem[r][key] for r in rids]) for key in keys}
        mem["_n"] = np.zeros(len(rids))
        return mem

    def _sl_scatter(self, rids: list[str], mem: dict[str, np.ndarray]) -> None:
        for i, rid in enumerate(rids):
            self._sl_mem[rid] = {key: val[i: i + 1].copy() for key, val in mem.items() if key != "_n"}

    def _sl_step(self, rnd: DraftRound) -> None:
        """After draft step j: confidences, then stop decisions for the requests still drafting."""
        j = len(rnd.tokens)
        if self._sl_policy.uses_confidence:
            rnd.conf.append(top1_probability(self._sl_logits, len(rnd.rids)))
        live = rnd.keep < 0
        at_cap = live & (rnd.cap <= j)
        rnd.keep[at_cap] = rnd.cap[at_cap]
        ask = live & ~at_cap
        if ask.any():
            conf = (np.stack(rnd.conf, axis=1) if rnd.conf else np.zeros((len(rnd.rids), 0)))[ask]
            sub = {key: val[ask] for key, val in rnd.mem.items()}
            out = np.asarray(self._sl_policy.more(j, conf, sub))
            idx = np.flatnonzero(ask)
            rnd.keep[idx[out >= 0]] = out[out >= 0]
        if j >= rnd.k_call:
            rnd.keep[rnd.keep < 0] = j

    def _sl_finish_round(self, rnd: DraftRound, draft_s: float) -> None:
        drafted = len(rnd.tokens)
        keep = np.where(rnd.keep < 0, drafted, rnd.keep)
        self._sl_rounds += 1
        self._sl_early_exits += int(rnd.early)
        for i, rid in enumerate(rnd.rids):
            self._sl_keep[rid] = int(keep[i])
            self._sl_last_draft_ms[rid] = draft_s * 1e3
            self._sl_records.append({"req_id": rid, "k": int(keep[i]), "cap": int(rnd.cap[i]), "drafted": drafted,
                                     "early": rnd.early, "n_batch": len(rnd.rids)})

    def _sl_observe(self, sched: Any, sampled: Any, rids: list[str], now: float) -> None:
        """The verification outcome of the round that ended in this step, for requests that verified drafts."""
        spec = sched.scheduled_spec_decode_tokens
        idx = [i for i, r in enumerate(rids) if len(spec.get(r, ())) > 0]
        if not idx:
            return
        vr = [rids[i] for i in idx]
        if isinstance(sampled, list):
            emitted = np.array([len(sampled[i]) for i in idx], dtype=float)
        else:
            emitted = (sampled[idx] != -1).sum(dim=1).cpu().numpy().astype(float)
        k = np.array([len(spec[r]) for r in vr], dtype=np.int64)
        target_ms = (now - self._sl_t_step) * 1e3
        cost = np.array([target_ms + self._sl_last_draft_ms.get(r, 0.0) for r in vr])
        mem = self._sl_gather(vr)
        self._sl_policy.observe(mem, k, cost, emitted, np.full(len(vr), np.nan))
        self._sl_scatter(vr, mem)
