"""Round costs measured where the policy runs: profiled at engine start, refreshed while serving.

A trace's cost model prices the target and draft steps on the machine and day it was recorded; in the engine a
policy needs *this* engine's wall-clock costs, the time outside both included, so the controller times them
(numpy alone at import: the worker imports this module):

* **Profile** (:class:`ProfileCycle`, :func:`fit_profile`): the first rounds draft k = 0..K_max in turn (every
  request the same k; at k = 0 one draft step, none kept), timing each step's pass (m = k + 1 rows per
  request), drafter call and the time outside both.
* **Price** (:meth:`EngineProfile.cost_model`): a :class:`~speclimits.costmodel.CostModel` in wall-clock ms per
  request; from the offline fit only what timing cannot give (α(m) and the Ū predictor at batch 1, c).
* **Refresh** (:meth:`EnginePricing.refresh`): each later round at the profiled batch size, measured against
  priced time, an exponentially weighted ratio (clipped to [1/3, 3]) scaling every price. Steps with fewer
  requests (a batch's tail) are left out (counted in, they tripled the scale at batch 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from speclimits.control.rules import Policy
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError

#: Rounds the controller profiles before applying a policy (20 per k = 0..6 at K_max = 6, about 2 s at batch 1 here).
PROFILE_ROUNDS = 140


class ProfileCycle(Policy):
    """k = 0, 1, ..., K_max, 0, 1, ... round after round, the same for every request (profiling; at k = 0 the
    drafter runs one step and every request keeps none, so the pass verifies one row per request)."""

    name = "profile"
    markov = False

    def __init__(self) -> None:
        self.step = 0

    def engine_batch_plan(self, sts):  # once per round, for all its requests
        k = self.step % (self.k_max + 1)
        self.step += 1
        return [k] * len(sts)


@dataclass
class StepSample:
    """One timed engine step: ``m`` rows verified per request (None when ragged), its pass, drafter call and the
    time from the drafter's end to the next step (ms), the requests in it."""

    m: int | None
    verify_ms: float
    drafted: int
    draft_ms: float
    other_ms: float = float("nan")
    n_batch: int = 1


@dataclass(frozen=True)
class EngineProfile:
    """Costs of this engine measured at start (wall-clock ms per step at ``batch`` requests): ``verify_ms`` {m:
    median pass with m rows per request} made non-decreasing in m (every rule's price); ``pass_ms`` the medians
    as measured, for the Delta rules' batch decision (CPU kernels run rows in tiles: at batch 8 passes of 16, 32
    and 48 rows ran 8–12% faster than the non-decreasing fit said); the drafter call of j steps ≈ ``draft_ms0 +
    draft_ms1 · j``; ``other_ms`` the median time outside both."""

    batch: int
    verify_ms: dict[int, float]
    pass_ms: dict[int, float]
    draft_ms0: float
    draft_ms1: float
    other_ms: float
    n_steps: int
    context_len: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "verify_ms": {str(m): v for m, v in self.verify_ms.items()},
                "verify_raw_ms": {str(m): v for m, v in self.pass_ms.items()}, "draft_ms0": self.draft_ms0,
                "draft_ms1": self.draft_ms1, "other_ms": self.other_ms, "n_steps": self.n_steps,
                "context_len": self.context_len, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineProfile":
        """The profile of :meth:`to_dict` (a benchmark result's ``profile``)."""
        d = dict(d)
        ms = {k: {int(m): float(v) for m, v in d.pop(k).items()} for k in ("verify_ms", "verify_raw_ms")}
        return cls(batch=int(d.pop("batch")), verify_ms=ms["verify_ms"], pass_ms=ms["verify_raw_ms"],
                   draft_ms0=float(d.pop("draft_ms0")), draft_ms1=float(d.pop("draft_ms1")),
                   other_ms=float(d.pop("other_ms")), n_steps=int(d.pop("n_steps")),
                   context_len=float(d.pop("context_len", 0.0)), extra=d)

    def pass_prices(self, k_max: int) -> list[float]:
        """The measured pass of k + 1 rows per request, ms per request, k = 0..k_max (k = 0 as k = 1 where m = 1
        was not profiled)."""
        raw = self.pass_ms
        return [raw[k + 1 if k + 1 in raw else max(k + 1, 2)] / self.batch for k in range(k_max + 1)]

    def pass_at(self, rows: float) -> float:
        """The pass of ``rows`` rows in all: the next profiled width's (``batch · m`` rows); below the narrowest,
        the line through the two narrowest (a batch's tail)."""
        ms = sorted(self.pass_ms)
        xs = np.array(ms, dtype=float) * self.batch
        ys = np.array([self.pass_ms[m] for m in ms], dtype=float)
        if len(xs) >= 2 and rows < xs[0]:
            return float(max(ys[0] + (ys[1] - ys[0]) / (xs[1] - xs[0]) * (rows - xs[0]), 0.0))
        i = int(np.searchsorted(xs, rows - 1e-9))
        if i >= len(xs):
            return float(ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (rows - xs[-1])) if len(xs) >= 2 else float(ys[-1])
        return float(ys[i])

    def step_ms(self, rows: float, drafted: int) -> float:
        """A step as profiled (what the offline batch replay charges): a pass of ``rows`` rows in all, the
        drafter's line at ``drafted`` steps and the time outside both."""
        return self.pass_at(rows) + (self.draft_ms0 + self.draft_ms1 * drafted if drafted else 0.0) + self.other_ms

    def cost_model(self, base: CostModel, u_bar_mean: Any, k_max: int) -> CostModel:
        """The per-request price in wall-clock ms (see the module docstring)."""
        b = float(self.batch)
        u = np.asarray(u_bar_mean, dtype=float)
        beta0, alpha = {}, {}
        for m in range(1 if 1 in self.verify_ms else 2, k_max + 2):
            a_m = float(base.alpha.get(m, 0.0)) if self.batch == 1 else 0.0
            beta0[m] = self.verify_ms[m] / b - a_m * u[m] - base.c * self.context_len
            alpha[m] = a_m
        m1 = min(beta0)
        beta0.setdefault(1, beta0[m1])
        alpha.setdefault(1, alpha[m1])
        return CostModel(c=base.c, beta0=beta0, alpha=alpha, a=self.draft_ms1 / b,
                         b=(self.draft_ms0 + self.other_ms) / b,
                         source=f"profiled in the engine at batch {self.batch} ({self.n_steps} steps, wall-clock ms "
                                f"per request); alpha and c from {base.source or 'the fit'}")

    def priced(self, fit: Any) -> Any:
        """``fit`` with its rounds priced by this profile (:meth:`cost_model`) and λ in the same units
        (:meth:`~speclimits.control.rules.PolicyFit.engine_lambda`): what the engine runs."""
        model = self.cost_model(fit.cost_model, fit.u_bar_mean, fit.k_max)
        return replace(fit, cost_model=model, lambda_=fit.engine_lambda(model))


def fit_profile(samples: list[StepSample], k_max: int, batch: int, context_len: float = 0.0) -> EngineProfile:
    """:class:`EngineProfile` from timed steps (at the full batch where there are such); widths m not profiled are
    filled by a line through those that were."""
    from sklearn.isotonic import isotonic_regression  # (the worker imports this module: only when it fits)

    full = [s for s in samples if s.n_batch == batch] or samples
    if not full:
        raise SpeclimitsError("speclimits control: no timed steps to profile (generate some tokens first)")
    by_m: dict[int, list[float]] = {}
    by_j: dict[int, list[float]] = {}
    for s in full:
        if s.m is not None and s.m >= 1:
            by_m.setdefault(s.m, []).append(s.verify_ms)
        if s.drafted >= 1:
            by_j.setdefault(s.drafted, []).append(s.draft_ms)
    if not by_m or not by_j:
        raise SpeclimitsError("speclimits control: the profiled steps verified no drafts")
    ms = np.array(sorted(by_m))
    raw_med = np.array([np.median(by_m[m]) for m in ms])
    # a wider pass never costs less: the weighted non-decreasing fit to the medians (a noisy median of a few
    # steps must not say otherwise)
    med = isotonic_regression(raw_med, sample_weight=np.array([len(by_m[m]) for m in ms], dtype=float))
    if len(ms) >= 2:
        slope, icpt = np.polyfit(ms, med, 1)
    else:
        slope, icpt = 0.0, float(med[0])
    verify = {int(m): float(v) for m, v in zip(ms, med)}
    raw = {int(m): float(v) for m, v in zip(ms, raw_med)}
    for m in range(2, k_max + 2):
        verify.setdefault(m, float(icpt + slope * m))
        raw.setdefault(m, verify[m])
    js = np.array(sorted(by_j))
    dmed = np.array([np.median(by_j[j]) for j in js])
    d1, d0 = np.polyfit(js, dmed, 1) if len(js) >= 2 else (float(dmed[0]), 0.0)
    other = np.array([s.other_ms for s in full if np.isfinite(s.other_ms)])
    return EngineProfile(batch=int(batch), verify_ms=verify, pass_ms=raw, draft_ms0=float(d0), draft_ms1=float(d1),
                         other_ms=float(np.median(other)) if other.size else 0.0, n_steps=len(full),
                         context_len=float(context_len),
                         extra={"verify_samples": {str(m): len(v) for m, v in by_m.items()},
                                "draft_median_ms": {str(int(j)): float(v) for j, v in zip(js, dmed)}})


class EnginePricing:
    """Profiling and the price refresh of one engine, kept across policy switches (see the module docstring):
    :attr:`scale` follows measured over priced round time, weight :attr:`weight` on the newest round, the
    ratio clipped to [1 / :attr:`clip`, :attr:`clip`]."""

    weight, clip = 0.05, 3.0

    def __init__(self) -> None:
        self.profile: EngineProfile | None = None
        self.samples: list[StepSample] = []
        self.scale = 1.0
        #: rounds still to profile before the policy applies
        self.left = 0
        #: price of a request's round by its k (0..k_max), a list: the refresh reads it per request per round
        self.prices: list[float] = []
        self.k_max = 0
        #: the last profiled step, its time outside still to come (:meth:`step_started`)
        self.pending: StepSample | None = None
        self._ctx_sum, self._ctx_n = 0.0, 0

    def arm(self, profile_rounds: int) -> None:
        """Profile the next ``profile_rounds`` rounds, unless a profile was measured already."""
        self.left = int(profile_rounds) if self.profile is None else 0
        self.pending = None

    def policy(self, fit: Any, name: str, k_max: int) -> Policy:
        """The running policy: :class:`ProfileCycle` while profiling, else ``name`` of ``fit`` priced with the
        profiled costs when there are any (λ0 in the same units), at the refreshed price scale."""
        self.k_max = int(k_max)
        if self.left > 0:
            pol = ProfileCycle().setup(self.k_max, fit.cost_model)
        else:
            pol = fit.make(name)
            model = fit.cost_model
            if self.profile is not None:
                model = self.profile.cost_model(fit.cost_model, fit.u_bar_mean, self.k_max)
                if hasattr(pol, "lambda0"):
                    pol.lambda0 = fit.engine_lambda(model)
            pol.setup(self.k_max, model)
            if self.profile is not None and getattr(pol, "uses_pass_prices", False):
                pol.pass_ms = self.profile.pass_prices(self.k_max)
                pol.outside_ms = self.profile.other_ms / self.profile.batch
        pol.price_scale = self.scale
        self.price(pol, fit.u_bar_mean)
        return pol

    def price(self, policy: Policy, u_bar_mean: Any) -> None:
        """The prices the refresh compares ``policy``'s rounds with: each k's round at the mean Ū per m."""
        self.k_max = policy.k_max
        self.prices = np.nan_to_num(policy.model.mean_round_prices(policy.k_max, u_bar_mean)).tolist()

    def refreshes(self, policy: Policy, n_step: int) -> bool:
        """Whether a step of ``n_step`` requests refreshes ``policy``'s prices: only at the profiled batch size."""
        prof = self.profile
        return prof is not None and policy.reads_prices and n_step == prof.batch

    def refresh(self, policy: Policy, ks: list[int], n_step: int, round_ms: float) -> None:
        """A step of ``n_step`` requests (those verifying drafts drafted ``ks``) took ``round_ms``: updates
        ``policy.price_scale``."""
        priced = sum(self.prices[min(k, self.k_max)] for k in ks)
        if len(ks) != n_step:
            priced = priced * n_step / len(ks)
        policy.price_scale = self.update(round_ms, priced)

    def update(self, measured_ms: float, priced_ms: float) -> float:
        """One round measured against its price: the new :attr:`scale`."""
        if math.isfinite(measured_ms) and priced_ms > 0:
            ratio = min(max(measured_ms / priced_ms, 1.0 / self.clip), self.clip)
            self.scale += self.weight * (ratio - self.scale)
        return self.scale

    def context(self, lens: Any, idx: list[int]) -> None:
        """While profiling: the context lengths of the requests verifying drafts (the profile's c·L is taken out)."""
        self._ctx_sum += float(np.mean(np.asarray(lens)[idx]))
        self._ctx_n += 1

    def step_started(self, outside_ms: float) -> None:
        """A step starts ``outside_ms`` after the last drafter call ended: the last profiled step's time outside."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.other_ms = outside_ms

    def timed(self, sample: StepSample) -> bool:
        """A profiled round's step; True when it was the last to profile (then :meth:`fit`)."""
        self.pending = sample
        self.samples.append(sample)
        self.left -= 1
        return self.left == 0

    def fit(self, max_batch: int = 0) -> EngineProfile:
        """The profile of the steps timed so far, at the engine's batch size (``max_batch``, at most the
        largest step timed); the price scale starts again at 1."""
        seen = max((s.n_batch for s in self.samples), default=1)
        batch = min(int(max_batch or seen), seen)
        self.profile = fit_profile(self.samples, self.k_max, batch, context_len=self._ctx_sum / max(self._ctx_n, 1))
        self.left, self.scale = 0, 1.0
        return self.profile
