"""The worker extension that applies a policy per request per round inside stock vLLM (no fork).

Load it with ``LLM(..., worker_extension_cls="speclimits.control.extension.ControlWorkerExtension",
async_scheduling=False)`` (it subclasses the tracer's extension, so the same engine can also be traced: the
trace's ``n_draft`` is then the k chosen per round); arm it with
``llm.collective_rpc("speclimits_control_set", args=(policy_json_dict, name))``.

What it wraps (instance attributes, removed by ``speclimits_control_uninstall``; vLLM 0.32.0, CPU, V1 runner):

``runner.execute_model``            start of a step (round timer)
``runner.propose_draft_token_ids``  before drafting: times the round that ended (price refresh), hands the
                                    previous round's outcome to the rule, ``engine_plan`` caps k; a rule that
                                    skips the drafter (``throughput:zero-k``) with k = 0 for every decoding
                                    request returns without vLLM's drafting (a plain step)
``drafter.model.compute_logits``    keeps each draft step's logits
``drafter.model.logits_processor``  keeps an EAGLE-3 head's own logits (a draft vocabulary: the cheaper input)
``drafter._greedy_sample``          the rules that read confidences: the token choice (``top1op.TokenChoice``)
``drafter._sample_draft_tokens``    after each draft step: top-1 per request -> ``engine_more``; once every
                                    request has stopped, a private exception ends the drafter's loop
``drafter.propose``                 catches it; for a plan-only rule passes the longest cap as
                                    ``num_speculative_tokens`` so the loop ends by itself (static K = 2 at
                                    batch 1: 0.986x stock with the early exit, as fast as stock this way)
``runner.take_draft_token_ids``     per-request truncation to the kept k (ragged k in a batch)
``runner._sample``                  a step with no draft to verify samples through vLLM's plain sampler
                                    (:meth:`ControlWorkerExtension._sl_sample`)

Rules with memory see each round's outcome one round late: the emitted tokens reach the host after this step's
drafting, so the controller reads the growth of ``output_token_ids`` at the next step (no second copy of the
sampled tensor: 10 µs at any batch size here).

K_max is ``num_speculative_tokens`` as the runner hands it to ``propose``; greedy drafting only. Refused with a
clear error: asynchronous scheduling (placeholders are scheduled before drafting, so a shorter draft would not
shrink the pass), a runner other than V1, a drafter without the hooks (ngram, parallel drafting,
``use_local_argmax_reduction``), probabilistic draft sampling. Untested on GPU.
"""

from __future__ import annotations

import os
import time
from typing import Any


from speclimits.control import top1op
from speclimits.control.top1op import TokenChoice
from speclimits.control.profile import PROFILE_ROUNDS, EnginePricing, StepSample
from speclimits.arms import OFFLINE_ONLY
from speclimits.control.driver import EngineRound, LoggingDriver, RoundDriver, RoundRecords
# the environment that arms a policy when the tracer installs (``speclimits_install``) or, in ``vllm serve``,
# once the worker has warmed up (:mod:`speclimits.control.plugin`)
from speclimits.control.plugin import ENV_NAME, ENV_POLICY, ENV_PROFILE
from speclimits.control.policyset import PolicySet, policy_from_dict, read_policy
from speclimits.control.rules import PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.tracing.extension import Patches, TracingWorkerExtension, fix_cpu_expand
from speclimits.tracing.vllm_api import runner_kind

DRAFTER_HOOKS = ("propose", "_sample_draft_tokens")
RUNNER_HOOKS = ("execute_model", "propose_draft_token_ids", "take_draft_token_ids", "_sample")


class _EarlyExit(Exception):
    """Raised inside the drafter's loop once every request has stopped; ``args[0]``: the steps drafted."""


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


def check_policy(fit: PolicyFit | PolicySet, name: str) -> bool:
    """Raise :class:`SpeclimitsError` where the engine cannot run policy ``name`` of ``fit`` (an offline-only
    variant, an unknown name; of every fit of a set), before a round runs; returns whether the policy reads
    confidences."""
    offline_only = OFFLINE_ONLY.intersection(str(name).split(":")[1:])
    if offline_only:
        raise SpeclimitsError(f"policy {name!r}: the variant {sorted(offline_only)[0]!r} runs offline only "
                              "(the engine does not count the experts a round touches)")
    fits = fit.fits if isinstance(fit, PolicySet) else (fit,)
    return not [f.make(name) for f in fits][0].plan_only


class ControlWorkerExtension(TracingWorkerExtension):
    """Mixed into vLLM's worker (module docstring), called through ``collective_rpc``: ``speclimits_pricing`` and
    ``speclimits_tokens`` are kept across policy switches, ``speclimits_records`` is what a drain returns."""

    def speclimits_install(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The tracer's install; then, when :data:`ENV_POLICY` is set and the engine speculates, arm the policy
        (so ``speclimits trace`` with this extension traces a controlled run)."""
        if getattr(self, "_sl_installed", False):  # control wraps the tracer's wrappers: unwrap in reverse order
            self.speclimits_control_uninstall()
        info = super().speclimits_install(options)
        speculates = getattr(self.model_runner, "speculative_config", None) is not None  # type: ignore[attr-defined]
        if os.environ.get(ENV_POLICY) and speculates:
            info["control"] = self.speclimits_control_arm()
        return info

    def speclimits_control_arm(self) -> dict[str, Any]:
        """Arm the policy named by the environment (:data:`ENV_POLICY`, :data:`ENV_NAME`, :data:`ENV_PROFILE`):
        the ``vllm serve`` plugin calls it after warm-up (:mod:`speclimits.control.plugin`), or ``/collective_rpc``."""
        path = os.environ.get(ENV_POLICY)
        if not path:
            raise SpeclimitsError(f"speclimits control: set {ENV_POLICY} to a policy JSON "
                                  "(`speclimits control fit TRACE --out policy.json`)")
        return self.speclimits_control_set(read_policy(path).to_dict(), os.environ.get(ENV_NAME, "delta"),
                                           int(os.environ.get(ENV_PROFILE, PROFILE_ROUNDS)))

    def speclimits_control_set(self, policy: dict[str, Any], name: str, profile_rounds: int = 0,
                               record_inputs: bool = False) -> dict[str, Any]:
        """Install (or switch to) policy ``name`` of the policy JSON dict ``policy`` (a fit, or a set of fits by
        temperature, :mod:`speclimits.control.policyset`); resets memory and records. ``profile_rounds > 0`` and
        no profile yet: the first rounds run :class:`~speclimits.control.profile.ProfileCycle`, then the costs
        are fitted (kept across switches, with the price scale). ``record_inputs``: a
        :class:`~speclimits.control.driver.LoggingDriver` (drained as ``inputs``, for ``driver.replay``)."""
        fit = policy_from_dict(policy)
        reads_confidence = check_policy(fit, name)
        if record_inputs and isinstance(fit, PolicySet):
            raise SpeclimitsError("speclimits control: recording the driver's inputs (for replay) takes one policy "
                                  "fit, not a set")
        runner = self.model_runner  # type: ignore[attr-defined]
        drafter = check_control_runner(runner)
        k_engine = int(runner.speculative_config.num_speculative_tokens)
        self._sl_fit, self._sl_name, self._sl_k = fit, name, min(fit.k_max, k_engine)
        self._sl_driver_cls = LoggingDriver if record_inputs else RoundDriver
        if not hasattr(self, "speclimits_pricing"):
            self.speclimits_pricing = EnginePricing()
            self.speclimits_tokens = TokenChoice()
        self.speclimits_pricing.arm(profile_rounds)
        self.speclimits_records = RoundRecords()
        self._sl_round: EngineRound | None = None
        self._sl_t_exec = self._sl_t_prop = self._sl_t_prop_end = float("nan")
        self._sl_booked = False  # the current draft step was booked by the greedy hook
        self._sl_planned: EngineRound | None = None  # a round planned before vLLM's drafting call
        tokens = self.speclimits_tokens
        tokens.logits = tokens.head = None
        if reads_confidence and tokens.op is None:  # (load() tries once per process)
            tokens.load_op()
        tokens.saved_s = 0.0  # like the records: what no drain collected since is dropped
        self._sl_keep: dict[str, int] = {}
        self._sl_part_counts: dict[str, int] = {}
        self._sl_apply()
        if not getattr(self, "_sl_installed", False):
            self._sl_wrap(runner, drafter)
            self._sl_installed = True
        # sampled requests are verified by vLLM's rejection sampler, whose CPU expansion is broken (vllm#55005)
        fix = fix_cpu_expand() if runner.device.type == "cpu" else None
        pol, pricing = self._sl_policy, self.speclimits_pricing
        return {"policy": name, "k_max": pol.k_max, "k_engine": k_engine, "detail": pol.describe(),
                **({"parts": fit.describe()} if isinstance(fit, PolicySet) else {}),
                **({"fixes": [fix]} if fix else {}),
                "profiling_rounds": pricing.left, "top1_op": top1op.status() or None,
                "profile": None if pricing.profile is None else pricing.profile.to_dict()}

    def _sl_apply(self) -> None:
        fit, pricing, name, k = self._sl_fit, self.speclimits_pricing, self._sl_name, self._sl_k
        self._sl_parts = None
        if not isinstance(fit, PolicySet):
            self._sl_policy = pricing.policy(fit, name, k)
        elif pricing.left > 0:  # profiling: one cycle for every request
            self._sl_policy = pricing.policy(fit.fits[0], name, k)
        else:  # one policy per fit, each priced by the profile; the first's prices are the refresh's
            self._sl_parts = [pricing.policy(f, name, k) for f in fit.fits]
            self._sl_policy = self._sl_parts[0]
            pricing.price(self._sl_policy, fit.fits[0].u_bar_mean)
        self._sl_new_driver()

    def _sl_new_driver(self) -> None:
        if self._sl_parts is None:
            self._sl_driver = self._sl_driver_cls(self._sl_policy)
        else:
            self._sl_driver = self._sl_driver_cls(self._sl_policy, self._sl_parts, self._sl_part_of)

    def _sl_part_of(self, rid: str) -> int:
        """The index of the fit that decides request ``rid``: by its temperature (its sampling parameters)."""
        req = self.model_runner.requests.get(rid)  # type: ignore[attr-defined]
        params = getattr(req, "sampling_params", None)
        t = float(getattr(params, "temperature", 0.0) or 0.0)
        g = self._sl_fit.part(t)
        key = f"{self._sl_fit.temperatures[g]:g}"
        self._sl_part_counts[key] = self._sl_part_counts.get(key, 0) + 1
        return g

    def speclimits_control_profile(self) -> dict[str, Any]:
        """Fit the costs from the steps timed so far (at this engine's batch size) and price the
        policy with them from now on; returns the profile (ms)."""
        prof = self.speclimits_pricing.fit(int(getattr(self.model_runner, "max_num_reqs", 0) or 0))  # type: ignore[attr-defined]
        self._sl_apply()
        return prof.to_dict()

    def speclimits_control_drain(self) -> dict[str, Any]:
        """Rounds since the last drain (:meth:`RoundRecords.drain`: ``rounds``, ``decide_us``, ``n_rounds``,
        ``early_exits``, ``hook_us``), the ``policy``, ``price_scale``, ``profile`` and the token choice's
        record; and forget them (memory too)."""
        pricing, tokens = self.speclimits_pricing, self.speclimits_tokens
        out = {**self.speclimits_records.drain(), "policy": self._sl_name, "price_scale": pricing.scale,
               "inputs": getattr(self._sl_driver, "log", None),
               "profile": None if pricing.profile is None else pricing.profile.to_dict(),
               "token_choice_saved_us": tokens.saved_s * 1e6, "token_choice": tokens.to_dict(),
               # requests whose state the controller holds (released when vLLM finishes or aborts them)
               "live_requests": len(set(self._sl_driver.state) | set(self._sl_driver.pending) | set(self._sl_keep)
                                    | set(self._sl_driver.group)),
               # a set of fits: requests first decided since the last drain, by the temperature of their fit
               "parts": dict(self._sl_part_counts) if self._sl_parts is not None else None,
               "draft_vocab_top1": tokens.head_ok,
               "top1_op": {**top1op.status(), "steps": tokens.op_steps, "torch_steps": tokens.torch_steps}}
        tokens.op_steps = tokens.torch_steps = 0
        tokens.saved_s = 0.0
        self._sl_keep, self._sl_part_counts = {}, {}
        self._sl_new_driver()
        return out

    def speclimits_control_uninstall(self) -> None:
        """Restore what :meth:`speclimits_control_set` wrapped."""
        patches = getattr(self, "_sl_patches", None)
        if patches is not None:
            patches.undo()
        self._sl_installed = False

    # -- wrapping ---------------------------------------------------------------------------
    def _sl_wrap(self, runner: Any, drafter: Any) -> None:
        self._sl_patches = patches = Patches()  # the tracer's mechanism (its wrappers are wrapped here)
        model = drafter.model
        patches.wrap(runner, "execute_model", self._sl_execute_model)
        patches.wrap(runner, "propose_draft_token_ids", self._sl_propose_ids)
        patches.wrap(runner, "take_draft_token_ids", self._sl_take)
        patches.wrap(runner, "_sample", self._sl_sample)
        patches.wrap(drafter, "propose", self._sl_propose)
        patches.wrap(drafter, "_sample_draft_tokens", self._sl_sample_draft)
        patches.wrap(model, "compute_logits", self._sl_keep_output("logits"))
        if callable(getattr(drafter, "_greedy_sample", None)):
            patches.wrap(drafter, "_greedy_sample", self._sl_greedy)
        # an EAGLE-3 head with its own (smaller) vocabulary: its logits before vLLM scatters them
        head = getattr(model, "logits_processor", None)
        if getattr(model, "draft_id_to_target_id", None) is not None and callable(getattr(head, "forward", None)):
            patches.wrap(head, "forward", self._sl_keep_output("head"))

    def _sl_execute_model(self, orig: Any) -> Any:
        def wrapped(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            self._sl_t_exec = t
            pricing = self.speclimits_pricing
            if pricing.pending is not None:  # the profiled step's time outside the pass and the drafter
                pricing.step_started((t - self._sl_t_prop_end) * 1e3)
            finished = getattr(scheduler_output, "finished_req_ids", None)
            if finished:
                self._sl_driver.release(finished)
                for rid in finished:
                    self._sl_keep.pop(rid, None)
            self.speclimits_records.spent("execute_model", t)
            return orig(scheduler_output, *args, **kwargs)
        return wrapped

    def _sl_sample(self, orig: Any) -> Any:
        """vLLM's ``_sample(logits, spec_decode_metadata)``. A step whose metadata has ``max_spec_len`` 0 (every
        request kept k = 0, or prompt chunks) would go through the rejection sampler, which draws recovered tokens
        over the whole vocabulary for drafts that are not there (0.7 ms of a 17 ms token at T = 0.7 on the twin);
        it is handed to the plain sampler, as a plain engine samples it (same distribution, logprobs and shape; a
        seeded request draws from its generator exactly as in plain decoding)."""
        def wrapped(logits: Any, spec_decode_metadata: Any, *args: Any, **kwargs: Any) -> Any:
            if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
                self.speclimits_records.plain_samples += 1
                return orig(logits, None, *args, **kwargs)
            return orig(logits, spec_decode_metadata, *args, **kwargs)
        return wrapped

    def _sl_keep_output(self, attr: str) -> Any:
        """A wrapper factory: during a drafting round, keep what the wrapped call returns in the token
        choice's ``attr`` (the drafter's target-vocabulary logits, or the head's own)."""
        def factory(orig: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                out = orig(*args, **kwargs)
                if self._sl_round is not None:
                    setattr(self.speclimits_tokens, attr, out)
                return out
            return wrapped
        return factory

    def _sl_greedy(self, orig: Any) -> Any:
        """vLLM's ``_greedy_sample`` (``compute_logits(h).argmax(-1)``) where the policy reads confidences:
        :class:`~speclimits.control.top1op.TokenChoice` (torch's fallback may pick another of two logits that
        round to the same probability: another draft token, never another output)."""
        drafter = self.model_runner.drafter  # type: ignore[attr-defined]
        hetero = bool(getattr(drafter, "use_heterogeneous_vocab", False))
        model_logits = drafter.model.compute_logits  # (the keep-output wrapper installed just before)

        def wrapped(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            rnd, tc = self._sl_round, self.speclimits_tokens
            if rnd is None or self._sl_driver.plan_only or args or kwargs or hetero or not tc.own:
                return orig(hidden_states, *args, **kwargs)
            t0 = time.perf_counter()
            reads = self._sl_driver.wants_confidence(rnd)
            records = self.speclimits_records
            records.choice_s += time.perf_counter() - t0  # the choice between paths is the controller's time
            if not reads:
                return orig(hidden_states)
            if tc.head_ok is None or len(rnd.rids) not in tc.argmax_s:
                # the first read steps: vLLM's argmax, timed (not the controller's time); the top-1 after the step
                return tc.argmax(model_logits(hidden_states))
            targets = tc.targets
            if targets is not None:
                # the head's own logits are all this step reads: vLLM's compute_logits would go on to
                # scatter them into the target vocabulary (a -inf tensor of the target's width and an
                # indexed copy), work whose only reader is the argmax replaced here
                model = drafter.model
                logits = model.logits_processor(model.lm_head, hidden_states)
            else:
                logits = model_logits(hidden_states)
            t0 = time.perf_counter()
            ids, top1 = tc.top1(logits, targets)  # the compiled call, or torch
            t1 = time.perf_counter()
            records.choice_s += t1 - t0
            # the draft step is booked here, not after vLLM's _sample_draft_tokens returns (which returns
            # these ids as they are): one hook per step instead of two
            tc.head = None
            self._sl_book_step(rnd, ids, top1, t1)
            self._sl_booked = True
            return ids
        return wrapped

    def _sl_propose_ids(self, orig: Any) -> Any:
        def wrapped(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            rids = list(self.model_runner.input_batch.req_ids)  # type: ignore[attr-defined]
            m = self._sl_observe(scheduler_output, rids, t0)
            self._sl_t_prop = t0
            self.speclimits_records.spent("observe", t0)
            try:
                driver, reqs = self._sl_driver, self.model_runner.requests  # type: ignore[attr-defined]
                # a rule that skips the drafter plans here, before vLLM prepares the drafter's inputs: when every
                # request planned k = 0 and every request is decoding (the drafter runs on every prefill chunk,
                # so that the draft model's cache holds the prompt), nothing of the drafter runs
                if driver.skips and all(reqs[r].output_token_ids for r in rids):
                    t1 = time.perf_counter()
                    k_call = int(getattr(scheduler_output, "num_spec_tokens_to_schedule", 0) or self._sl_k)
                    rnd = driver.begin(rids, k_call)
                    self.speclimits_records.spent("plan", t1)
                    if rnd.skip:
                        import torch  # vLLM's own dependency, present wherever this runs inside the worker

                        self._sl_round = rnd
                        # one column of placeholders, as a one-step draft; the kept k = 0 truncates it
                        return torch.zeros((len(rids), 1), dtype=torch.int64,
                                           device=self.model_runner.device)  # type: ignore[attr-defined]
                    self._sl_planned = rnd
                return orig(scheduler_output, sampled_token_ids, *args, **kwargs)
            finally:
                t1 = time.perf_counter()
                rnd, self._sl_round = self._sl_round, None
                if rnd is not None:  # the round's kept k; while profiling, its step's times (outside: next step)
                    keep = self._sl_driver.finish(rnd)
                    self._sl_keep.update(zip(rnd.rids, keep))
                    self.speclimits_records.round(keep, rnd)
                    pricing = self.speclimits_pricing
                    if pricing.left > 0 and pricing.timed(StepSample(m, (t0 - self._sl_t_exec) * 1e3, rnd.j,
                                                                     (t1 - t0) * 1e3, n_batch=len(rnd.rids))):
                        self.speclimits_control_profile()
                self._sl_t_prop_end = self.speclimits_records.spent("finish_round", t1)
        return wrapped

    def _sl_propose(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            k_call = int(kwargs.get("num_speculative_tokens", args[0] if args else 0))
            t0 = time.perf_counter()
            rids = list(self.model_runner.input_batch.req_ids)  # type: ignore[attr-defined]
            rnd, self._sl_planned = self._sl_planned, None  # planned already (a rule that skips the drafter)
            if rnd is None:
                rnd = self._sl_driver.begin(rids, k_call)
            self._sl_round = rnd
            self._sl_booked = False
            if rnd.k_call < k_call:
                # a rule that plans before drafting: the driver asks the drafter for the longest cap only
                # (vLLM's own per-step draft length, the argument its dynamic speculative decoding sets), so
                # that its loop ends by itself instead of through an early exit
                k_call = rnd.k_call
                if "num_speculative_tokens" in kwargs or not args:
                    kwargs["num_speculative_tokens"] = k_call
                else:
                    args = (k_call, *args[1:])
            self.speclimits_records.spent("plan", t0)
            try:
                return orig(*args, **kwargs)
            except _EarlyExit as stop:
                import torch  # vLLM's own dependency, present wherever this runs inside the worker

                self._sl_round.early = True
                return torch.stack(stop.args[0], dim=1)
        return wrapped

    def _sl_sample_draft(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            ids, probs = orig(*args, **kwargs)
            rnd = self._sl_round
            if rnd is None:
                return ids, probs
            if self._sl_booked:  # the greedy hook booked this step (it made the token choice)
                self._sl_booked = False
                return ids, probs
            if probs is not None:
                raise SpeclimitsError("speclimits control supports greedy drafting only (the draft returned "
                                      "probabilities: probabilistic draft sampling is on)")
            t0 = time.perf_counter()
            tc = self.speclimits_tokens
            head, tc.head = tc.head, None
            if self._sl_driver.wants_confidence(rnd):
                n = len(rnd.rids)
                if tc.head_ok is None:  # the first read step: may the head's own logits be read?
                    tc.check_head(head, n, getattr(self.model_runner.drafter.model, "draft_id_to_target_id", None))
                top1 = top1op.top1_probability(head if tc.head_ok else tc.logits, n)
            else:
                top1 = None
            self._sl_book_step(rnd, ids, top1, t0)
            return ids, probs
        return wrapped

    def _sl_book_step(self, rnd: EngineRound, ids: Any, top1: list[float] | None, t0: float) -> None:
        """Book a draft step (its token ids, its top-1 probabilities or None) with the round driver, the
        time since ``t0`` to the controller; end the drafter's loop early when every request has stopped."""
        rnd.tokens.append(ids)
        done = self._sl_driver.step(rnd, top1)
        self.speclimits_records.spent("draft_step", t0)
        if done and rnd.j < rnd.k_call:
            raise _EarlyExit(rnd.tokens)

    def _sl_take(self, orig: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if out is None:
                return out
            t0 = time.perf_counter()
            keep = self._sl_keep
            for i, rid in enumerate(out.req_ids):
                k = keep.get(rid)
                if k is not None and len(out.draft_token_ids[i]) > k:
                    out.draft_token_ids[i] = list(out.draft_token_ids[i][:k])
            self.speclimits_records.spent("take", t0)
            return out
        return wrapped

    def _sl_observe(self, sched: Any, rids: list[str], now: float) -> int | None:
        """The outcome of the round that ended in this step, for the requests that verified drafts: the round's
        time (drafter start to drafter start) for the price refresh and the rules with memory. Returns m when
        every request verified the same m."""
        pricing = self.speclimits_pricing
        refresh = pricing.refreshes(self._sl_policy, len(rids))  # at the profiled batch size only
        profiling = pricing.left > 0
        if not (refresh or profiling or self._sl_driver.observes):
            return None  # nothing reads the outcome (static K, the threshold after profiling)
        spec, kept = sched.scheduled_spec_decode_tokens or {}, self._sl_keep
        n_step = len(rids)
        idx, vr, ks = [], [], []
        for i, r in enumerate(rids):
            d = spec.get(r)
            if d or kept.get(r) == 0:  # a request that kept no draft of its round verified one row
                idx.append(i)
                vr.append(r)
                ks.append(len(d) if d else 0)
        if not idx:
            return None
        round_ms = (now - self._sl_t_prop) * 1e3
        if refresh and round_ms == round_ms:  # not NaN (no drafting call timed yet)
            pricing.refresh(self._sl_policy, ks, n_step, round_ms)
        if profiling:  # the context the profile is measured at (its c·L is taken out)
            lens = getattr(self.model_runner.input_batch, "num_tokens_no_spec", None)  # type: ignore[attr-defined]
            if lens is not None:
                pricing.context(lens, idx)
        driver = self._sl_driver
        if driver.observes and round_ms == round_ms:  # the previous round's outcome (module docstring)
            reqs = self.model_runner.requests  # type: ignore[attr-defined]
            driver.verified(vr, ks, [round_ms / n_step] * len(vr), [len(reqs[r].output_token_ids) for r in vr])
        return ks[0] + 1 if len(vr) == n_step and min(ks) == max(ks) else None
