"""The policy's side of the engine's rounds: :class:`RoundDriver`, free of vLLM, driven by the worker extension
from vLLM's hooks and by the offline harness from recorded confidences: one decision path for both.
"""

from __future__ import annotations

import math
import time
from typing import Any

from speclimits.control.rules import P_EPS, Policy


class EngineRound:
    """One drafting round of the batch: request ids, caps, contexts, kept k (-1: still drafting), running
    confidence products, drafted confidences (for a batch-level keep), steps drafted."""

    __slots__ = ("rids", "cap", "cap_max", "ctx", "keep", "prod", "confs", "live", "j", "k_call", "tokens", "early",
                 "prods", "hist", "log_before", "pols", "skip")

    def __init__(self, rids: list[str], cap: list[int], ctx: list[float], k_call: int, keep_confs: bool,
                 shared: bool = False) -> None:
        self.rids, self.cap, self.ctx, self.k_call = rids, cap, ctx, k_call
        self.cap_max = max(max(cap), 1) if cap else 0  # a cap of 0 (keep no draft) still drafts one step
        n = len(rids)
        self.keep, self.prod, self.live, self.j = [-1] * n, [1.0] * n, n, 0
        self.confs: list[list[float]] | None = [[] for _ in rids] if keep_confs else None
        #: one decision for the batch: each request's running products P_1..P_j (else None)
        self.prods: list[list[float]] | None = [[] for _ in rids] if shared else None
        self.tokens: list[Any] = []
        self.early = False
        #: with an acceptance model: each request's history feature, and the log top-1 product before step j
        self.hist: list[float] | None = None
        self.log_before: list[float] = []
        #: in a mixed batch, each request's policy (else None: the driver's one policy decides every request)
        self.pols: list[Policy] | None = None
        #: every request planned k = 0 and the rule skips the drafter then: no draft step at all
        self.skip = False


class RoundDriver:
    """The policy's side of the engine's rounds, in Python scalars: per-request memory by request id,
    :meth:`begin` before drafting, :meth:`step` after each draft step, :meth:`finish` when the drafter stopped
    (kept k), :meth:`verified` after verification (one round late, as in the engine).

    A mixed batch (:mod:`speclimits.control.policyset`): ``parts``, one policy per fit (``parts[0]`` is
    ``policy``), and ``part_of``, request id -> part index, asked once per request. Each request's plan,
    confidences, stops and memory are its part's; what the batch shares (batch decision, pooled plan, price
    scale) is ``policy``'s."""

    def __init__(self, policy: Policy, parts: list[Policy] | None = None, part_of: Any = None) -> None:
        self.policy = policy
        self.parts = list(parts) if parts is not None and len(parts) > 1 else None
        if self.parts is not None and (self.parts[0] is not policy or part_of is None):
            raise ValueError("a mixed RoundDriver needs parts[0] to be its policy and a part_of callable")
        self.part_of = part_of
        #: each request's part (mixed batches), from its first round until it is released
        self.group: dict[Any, int] = {}
        self.state: dict[str, Any] = {}
        #: per request, its last round whose outcome the policy has not seen (:meth:`verified`):
        #: ``(k, its ms, output tokens before it, Ū)``
        self.pending: dict[Any, tuple[int, float, int, float]] = {}
        self.plan_only = policy.plan_only
        #: a plan-only rule whose rounds that plan k = 0 for every request skip the drafter
        self.skips = self.plan_only and policy.skips_drafter
        self.has_state = policy.engine_state() is not None
        #: whether the outcome of each round is passed on (a rule with no memory has nothing to update)
        self.observes = self.has_state and type(policy).engine_observe is not Policy.engine_observe
        self.batch_keep = type(policy).engine_final_keep is not Policy.engine_final_keep
        self.shared = bool(getattr(policy, "shared", False)) and not self.plan_only
        #: one plan for the batch from all live requests' states (a plan-only rule that pools them)
        self.batch_plan = type(policy).engine_batch_plan is not Policy.engine_batch_plan
        # bound once: a draft step calls them per request
        self._calibrate, self._more = policy.engine_calibrate, policy.engine_more
        self._batch_more = getattr(policy, "engine_batch_more", None)
        #: a rule reading an acceptance model: each step's probability from the request's features
        self.acceptance = getattr(policy, "acceptance", None) is not None and not self.plan_only

    def policy_of(self, rid: Any) -> Policy:
        """The policy that decides request ``rid`` (its part's in a mixed batch)."""
        if self.parts is None:
            return self.policy
        g = self.group.get(rid)
        if g is None:
            g = self.group[rid] = int(self.part_of(rid))
        return self.parts[g]

    def _state(self, rid: str) -> Any:
        st = self.state.get(rid)
        if st is None:
            st = self.state[rid] = self.policy_of(rid).engine_state()
        return st

    def begin(self, rids: list[str], k_call: int, weights: list[float] | None = None) -> EngineRound:
        """The round's caps (0..k_call; 0: the request keeps no draft, though the drafter runs one step) and
        contexts, before drafting. ``weights``: per request a factor on the value the rule puts on its tokens (its
        λ; offline only: the block-aware planner of ``benchmarks/batch_tails.py``)."""
        pol, hi, n = self.policy, max(k_call, 1), len(rids)
        pols = None
        if self.parts is not None:  # a mixed batch: each request's own policy, at the batch's price scale
            pols = [self.policy_of(r) for r in rids]
            for p in self.parts:
                p.price_scale = pol.price_scale
        sts = [self._state(r) for r in rids] if self.has_state else [None] * n
        batch = pol.engine_batch_plan(sts) if self.batch_plan else None
        cap, ctx = [], []
        for i, st in enumerate(sts):
            p = pol if pols is None else pols[i]
            cap.append(min(max(p.engine_plan(st) if batch is None else batch[i], 0), hi))
            if not self.plan_only:
                c = p.engine_context(st)
                if weights is not None:  # λ, or (λ, the request's price row)
                    c = (c[0] * weights[i], c[1]) if c.__class__ is tuple else c * weights[i]
                ctx.append(c)
        shared = self.shared and n > 1
        rnd = EngineRound(rids, cap, ctx, k_call, self.batch_keep and n > 1 and not shared, shared)
        rnd.pols = pols
        if self.acceptance:
            rnd.hist = [(pol if pols is None else pols[i]).engine_history(st) for i, st in enumerate(sts)]
            rnd.log_before = [0.0] * n
        if self.plan_only and 0 < rnd.cap_max < k_call:  # a plan: the drafter is asked for the longest cap only
            rnd.k_call = rnd.cap_max
        rnd.skip = self.plan_only and pol.skips_drafter and n > 0 and max(cap) == 0
        return rnd

    def wants_confidence(self, rnd: EngineRound) -> bool:
        """Whether the draft step about to be booked needs the confidences: a request may still
        stop there (or a batch-level keep rule reads every step's)."""
        if self.plan_only:
            return False
        if rnd.confs is not None or rnd.prods is not None:
            return True
        j = rnd.j + 1
        if j >= rnd.k_call or j >= rnd.cap_max:
            return False
        for k, c in zip(rnd.keep, rnd.cap):
            if k < 0 and c > j:
                return True
        return False

    def _probs(self, rnd: EngineRound, j: int, top1: list[float]) -> list[float]:
        """Step j's match probability per request: the calibration of its top-1, or the acceptance model's."""
        pols = rnd.pols
        if rnd.hist is None:
            if pols is not None:
                return [q.engine_calibrate(p) for q, p in zip(pols, top1)]
            return list(map(self._calibrate, top1))
        match, lb, out = self.policy.engine_match, rnd.log_before, []
        for i, (p, h) in enumerate(zip(top1, rnd.hist)):
            p = min(max(p, P_EPS), 1.0 - P_EPS)
            out.append((match if pols is None else pols[i].engine_match)(j, p, lb[i], h))
            lb[i] += math.log(p)
        return out

    def step(self, rnd: EngineRound, top1: list[float] | None) -> bool:
        """Book draft step j = ``rnd.j + 1`` (``top1``: its top-1 probabilities, or None when
        :meth:`wants_confidence` said no); True when every request has stopped."""
        rnd.j = j = rnd.j + 1
        probs = None if top1 is None else self._probs(rnd, j, top1)
        prods = rnd.prods
        if prods is not None:  # one decision for the batch: every request drafts until it stops
            prod, i = rnd.prod, 0
            for c in probs:
                prod[i] = c = prod[i] * c
                prods[i].append(c)
                i += 1
            last = min(rnd.k_call, rnd.cap_max)
            if j >= last or not self._batch_more(j, prods, rnd.ctx, last):
                rnd.live = 0
            return rnd.live == 0
        keep, cap, prod, confs, ctx, pols = rnd.keep, rnd.cap, rnd.prod, rnd.confs, rnd.ctx, rnd.pols
        more = self._more
        for i in range(len(keep)):
            if keep[i] >= 0 or cap[i] <= j:
                if keep[i] < 0:
                    keep[i] = cap[i]
                    rnd.live -= 1
                if confs is not None:
                    confs[i].append(probs[i])
                continue
            if probs is None:  # no request can stop here (wants_confidence; a plan): the cap or k_call ends them
                continue
            c = probs[i]
            if confs is not None:
                confs[i].append(c)
            prod[i] *= c
            out = (more if pols is None else pols[i].engine_more)(j, c, prod[i], ctx[i])
            if out >= 0:
                keep[i] = out
                rnd.live -= 1
        if j >= rnd.k_call and rnd.live:
            for i in range(len(keep)):
                if keep[i] < 0:
                    keep[i] = j
            rnd.live = 0
        return rnd.live == 0

    def finish(self, rnd: EngineRound) -> list[int]:
        """The k each request keeps once the drafter stopped after ``rnd.j`` steps (a request that
        stopped before the last one may keep more of the paid steps: the rule's batch-level keep)."""
        drafted = rnd.j
        if rnd.prods is not None:
            return self.policy.batch_select(rnd.prods, rnd.ctx, drafted)[1] if drafted else [0] * len(rnd.rids)
        keep = [drafted if k < 0 else k for k in rnd.keep]
        if rnd.confs is not None:
            pols = rnd.pols or [self.policy] * len(keep)
            keep = [pols[i].engine_final_keep(rnd.confs[i], k, rnd.ctx[i]) if k < drafted else k
                    for i, k in enumerate(keep)]
        return keep

    def run_round(self, rids: list[str], conf: Any, k_call: int, weights: list[float] | None = None
                  ) -> tuple[list[int], int]:
        """One whole round from recorded top-1 probabilities ``conf`` (row i for request i, >= k_call columns),
        as the engine's hooks drive it (``weights``: :meth:`begin`'s). Returns (kept k, steps drafted)."""
        rnd = self.begin(rids, k_call, weights)
        if rnd.skip:  # no draft step (the engine also drafts on prefill: offline every state is a decode)
            return self.finish(rnd), 0
        rows = conf.tolist() if hasattr(conf, "tolist") else conf  # Python floats, as the engine reads them
        for j in range(1, k_call + 1):
            top1 = [row[j - 1] for row in rows] if self.wants_confidence(rnd) else None
            if self.step(rnd, top1):
                break
        return self.finish(rnd), rnd.j

    def verified(self, rids: list[Any], ks: list[int], costs: list[float], n_before: list[int],
                 u_bars: list[float] | None = None) -> None:
        """The engine's observation timing: request ``rids[i]`` verified ``ks[i]`` drafts for ``costs[i]`` ms, with
        ``n_before[i]`` output tokens before. The policy is handed each request's *previous* round (its tokens
        ``n_before[i]`` less the count then) and this one waits, as the emitted tokens reach the host after the
        next round's drafting: a rule deciding round r + 1 has seen rounds 1..r - 1. ``u_bars``: Ū (offline)."""
        if not self.observes:
            return
        pend = self.pending
        for i, rid in enumerate(rids):
            prev = pend.get(rid)
            if prev is not None:
                self.observe_one(rid, prev[0], prev[1], float(n_before[i] - prev[2]), prev[3])
            pend[rid] = (ks[i], costs[i], n_before[i], math.nan if u_bars is None else u_bars[i])

    def observe_one(self, rid: str, k: int, cost_ms: float, emitted: float, u_bar: float = math.nan) -> None:
        """One request's round outcome to the policy now; ``u_bar``: the pass's Ū."""
        if self.observes:
            self.policy_of(rid).engine_observe(self._state(rid), k, cost_ms, emitted, u_bar)

    def release(self, rids: Any) -> None:
        """Forget finished requests (a round not observed yet is dropped, as in the engine)."""
        for rid in rids:
            self.state.pop(rid, None)
            self.pending.pop(rid, None)
            self.group.pop(rid, None)


class LoggingDriver(RoundDriver):
    """A :class:`RoundDriver` that also keeps, in order, everything it was given (:attr:`log`, for
    :func:`replay`): ``["scale", s]`` when the price scale changed, ``["begin", rids, k_call]``, ``["step",
    top1]`` (None where no top-1 was read), ``["keep", keep]``, ``["observe", rid, k, cost_ms, emitted]``,
    ``["release", rids]``."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.log: list[list[Any]] = []
        self._scale = math.nan

    def begin(self, rids: list[str], k_call: int, weights: list[float] | None = None) -> EngineRound:
        if weights is not None:  # the engine gives none, and the log would not replay them
            raise ValueError("a logged round takes no weights")
        if self.policy.price_scale != self._scale:
            self._scale = self.policy.price_scale
            self.log.append(["scale", self._scale])
        self.log.append(["begin", list(rids), int(k_call)])
        return super().begin(rids, k_call)

    def step(self, rnd: EngineRound, top1: list[float] | None) -> bool:
        self.log.append(["step", None if top1 is None else list(top1)])
        return super().step(rnd, top1)

    def finish(self, rnd: EngineRound) -> list[int]:
        keep = super().finish(rnd)
        self.log.append(["keep", list(keep)])
        return keep

    def observe_one(self, rid: str, k: int, cost_ms: float, emitted: float, u_bar: float = math.nan) -> None:
        if self.observes:
            self.log.append(["observe", rid, int(k), float(cost_ms), float(emitted)])
        super().observe_one(rid, k, cost_ms, emitted, u_bar)

    def release(self, rids: Any) -> None:
        rids = list(rids)
        self.log.append(["release", rids])
        super().release(rids)


def replay(policy: Policy, log: list[list[Any]]) -> list[dict[str, Any]]:
    """Decide again with a fresh :class:`RoundDriver` of ``policy`` from a :class:`LoggingDriver`'s log. Per round:
    ``k`` and ``steps`` as recorded, ``k_now`` and ``steps_now`` as decided again (-1: it would have drafted on
    past the recorded steps); equal when the offline driver decides as the engine's did."""
    driver, rnd, out, steps, stop = RoundDriver(policy), None, [], 0, None
    for ev in log:
        kind = ev[0]
        if kind == "scale":
            policy.price_scale = ev[1]
        elif kind == "begin":
            rnd, steps, stop = driver.begin(ev[1], ev[2]), 0, None
        elif kind == "step":
            steps += 1
            if stop is None and (driver.step(rnd, ev[1]) or rnd.j >= rnd.k_call):
                stop = rnd.j
        elif kind == "keep":
            out.append({"k": ev[1], "steps": steps, "k_now": driver.finish(rnd), "steps_now": -1 if stop is None else stop})
        elif kind == "observe":
            driver.observe_one(ev[1], ev[2], ev[3], ev[4])
        elif kind == "release":
            driver.release(ev[1])
        else:
            raise ValueError(f"unknown event {kind!r} in a driver log")
    return out


class RoundRecords:
    """What the engine's rounds leave for :meth:`drain`: each round's kept k, caps, steps drafted and early end;
    the time in the controller's hooks per hook, the token choice's apart (it runs inside vLLM's draft step)."""

    def __init__(self) -> None:
        self.records: list[tuple[list[int], list[int], int, bool, list[str]]] = []
        self.hook_s: dict[str, float] = {}
        #: the token choice's time, added to the decision time when drained
        self.choice_s = 0.0
        #: steps without a draft to verify, sampled by vLLM's plain sampler (the extension's ``_sample`` hook)
        self.plain_samples = 0

    def spent(self, hook: str, t0: float) -> float:
        """Book the time since ``t0`` to ``hook``; returns now."""
        now = time.perf_counter()
        self.hook_s[hook] = self.hook_s.get(hook, 0.0) + now - t0
        return now

    def round(self, keep: list[int], rnd: EngineRound) -> None:
        """A round ended: ``keep``, the k kept per request of ``rnd``."""
        self.records.append((keep, rnd.cap, rnd.j, rnd.early, rnd.rids))  # made dicts when drained

    def drain(self) -> dict[str, Any]:
        """Since the last drain, and forget them: ``rounds`` (``k``, ``cap``, ``drafted``, ``early``, ``n_batch``),
        ``requests`` (per request id its kept k per round), ``decide_us`` (µs in the controller, token choice
        included), ``n_rounds``, ``early_exits``, ``hook_us`` (per hook) and ``plain_samples``."""
        hook_s = dict(self.hook_s)
        if self.choice_s:
            hook_s["token_choice"] = self.choice_s
        requests: dict[str, list[int]] = {}
        for k, _cap, _j, _early, rids in self.records:
            for rid, ki in zip(rids, k):
                requests.setdefault(str(rid), []).append(int(ki))
        out = {"rounds": [{"k": k, "cap": cap, "drafted": j, "early": early, "n_batch": len(k)}
                          for k, cap, j, early, _rids in self.records], "requests": requests,
               "decide_us": sum(hook_s.values(), 0.0) * 1e6, "n_rounds": len(self.records),
               "early_exits": sum(r[3] for r in self.records), "hook_us": {k: v * 1e6 for k, v in hook_s.items()},
               "plain_samples": self.plain_samples}
        self.__init__()
        return out
