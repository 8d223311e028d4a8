"""The policies as the engine runs them: the rules and their configuration, in numpy alone.

Each rule is written once, in the engine's form: Python scalars, one request at a time (``engine_*``), driven
by :class:`speclimits.control.driver.RoundDriver` in the vLLM worker and offline alike. Inside vLLM a numpy
call right after a forward pass costs 10–20 µs (out of the caches), a float operation well under 1 µs, so the
rules decide from tables precomputed at ``setup``. Every rule sees only what a running system sees: the draft's
top-1 probability, a predicted Ū, a running time per token. Round costs come from a
:class:`~speclimits.costmodel.CostModel` scaled by :attr:`Policy.price_scale`; :class:`PolicyFit` is the one
configuration of every rule (the policy JSON).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speclimits.arms import DELTA_VARIANTS, POLICY_NAMES, arm, parse_policy_name, static_label
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError

if TYPE_CHECKING:  # the offline harness's types; never imported by the worker
    from speclimits.oracle.inputs import CostTable, OracleInputs

FORMAT = "speclimits-policy/1"
#: The acceptance model's features the engine computes when it decides (:mod:`speclimits.control.acceptance`
#: names them; it also offers Ū of the previous round and the context length, which the engine does not pass).
ENGINE_FEATURES = ("logit_conf", "conf", "position", "log_prod_before", "history")
#: Rounds of a request's history its acceptance features average (``history``).
HISTORY_ROUNDS = 3
#: The clip of a top-1 probability before its log-odds.
P_EPS = 1e-6


class Policy:
    """A rule that chooses the draft length k of each live request, round by round: :meth:`engine_plan` before
    drafting, :meth:`engine_more` after each draft step, :meth:`engine_final_keep` when the batch's drafter
    stopped, :meth:`engine_observe` after verification. ``price_scale`` multiplies the cost model's prices."""

    name = "policy"
    markov = True  # the action depends only on the state (no memory)
    reads_prices = False  # decisions read the round costs (the engine refreshes them only then)
    skips_drafter = False  # a round that plans k = 0 for every request skips the drafter (a plan-only rule)
    price_scale = 1.0

    @property
    def plan_only(self) -> bool:
        """True when the rule decides k before drafting (the engine stops the drafter at the round's largest k)."""
        return type(self).engine_more is Policy.engine_more and type(self).engine_final_keep is Policy.engine_final_keep

    def setup(self, k_max: int, model: CostModel) -> "Policy":
        self.k_max, self.model = int(k_max), model
        return self

    def bind(self, inputs: "OracleInputs", table: "CostTable") -> "Policy":
        """Offline: :meth:`setup` from a cost table, and the inputs it evaluates on."""
        self.setup(table.k_max, table.model)
        self.inputs, self.table = inputs, table
        return self

    # -- the engine's form: one request at a time, Python scalars ------------------------------
    def engine_state(self) -> list[Any] | None:
        """A fresh request's memory (a small list; None: the rule keeps none)."""
        return None

    def engine_plan(self, st: Any) -> int:
        """The most tokens one request drafts this round (1..k_max)."""
        return self.k_max

    def engine_batch_plan(self, sts: list[Any]) -> list[int] | None:
        """One plan for the batch from every live request's state (None: each request's :meth:`engine_plan`)."""
        return None

    def engine_context(self, st: Any) -> float:
        """What one request's decisions in this round share (the Delta rule's λ)."""
        return 0.0

    def engine_calibrate(self, p: float) -> float:
        """The map applied to each draft step's top-1 probability (here the identity)."""
        return p

    def engine_more(self, j: int, c: float, prod: float, ctx: float) -> int:
        """After draft step j: -1 to draft on, else the tokens to keep (<= j); ``c`` the step's calibrated
        confidence, ``prod`` the product over steps 1..j, ``ctx`` the :meth:`engine_context`."""
        return -1

    def engine_final_keep(self, confs: list[float], keep: int, ctx: float) -> int:
        """When the drafter stopped after ``len(confs)`` steps: the tokens a request that chose ``keep`` keeps."""
        return keep

    def engine_observe(self, st: Any, k: int, cost_ms: float, emitted: float, u_bar: float = math.nan) -> None:
        """After verification: drafted ``k``, paid ``cost_ms``, emitted ``emitted``; ``u_bar`` the pass's Ū (offline)."""

    def describe(self) -> str:
        return ""


class StaticK(Policy):
    """Always draft k tokens (capped at K_max)."""

    def __init__(self, k: int):
        self.k = int(k)
        self.name = static_label(self.k)

    def engine_plan(self, st):
        return min(self.k, self.k_max)


class RandomK(Policy):
    """A seeded random k in 1..K_max per request per round: a control arm for losslessness tests."""

    markov = False

    def __init__(self, seed: int = 0):
        self.seed, self.rng = int(seed), np.random.default_rng(seed)
        self.name = "random k"

    def engine_plan(self, st):
        return int(self.rng.integers(1, self.k_max + 1))


class ConfidenceThreshold(Policy):
    """Draft while the cumulative draft confidence ``prod_{i<=j} conf_i`` stays >= τ (SpecDec++ /
    DISCO-style); the token at which it falls below τ is kept (at least 1, at most K_max)."""

    def __init__(self, tau: float):
        self.tau = float(tau)
        self.name = "confidence threshold"

    def engine_more(self, j, c, prod, ctx):
        return -1 if prod >= self.tau else j

    def describe(self) -> str:
        return f"τ = {self.tau:.3g}"


class DeltaRule(Policy):
    """The Delta-Space rule online, with the Oracle's value replaced by ``V(n) ≈ λ·(N - n)``.

    Per round it scores ``Q̂(k) = Ĉ(k) - λ·Ê[a](k)``: ``Ê[a](k) = sum_{j<=k} prod_{i<=j} p_i`` (p the draft
    confidence, optionally calibrated), ``Ĉ(k) = a·k + b + beta0(k+1) + alpha(k+1)·Û(k+1)`` (the context term
    cancels), Û ``u_bar_mean[m]`` (``u_pred="mean"``) or the previous round's Ū rescaled by ``u_bar_mean[m] /
    u_bar_mean[m_prev]`` (``"previous"``). λ is ``lambda0`` (fixed) or running, ``(w·λ0 + elapsed ms) / (w +
    emitted tokens)``; λ0 follows :attr:`price_scale`, so a uniformly slower machine changes no decision.
    ``acceptance``: an :class:`AcceptanceModel` read in place of the calibration (:meth:`engine_match`).

    ``stop="lookahead"``: draft step j + 1 only if the best k >= j under Q̂ (undrafted confidences extrapolated
    from the last) is longer than j: no drafted token is discarded, and a non-convex stretch of Ĉ (the m = 4/5
    regime change) can be passed. ``stop="greedy"``: extend while ``ΔĈ <= λ·ΔÊ[a]``; a stop before K_max costs
    one draft step. ``shared``: at batch > 1 one decision for the batch (:meth:`batch_select`); ``zero``: it
    may keep no draft of a request (k = 0).
    """

    reads_prices = True

    def __init__(self, lambda0: float, u_bar_mean: np.ndarray, calibration: "CalibrationMap | None" = None,
                 u_pred: str = "mean", running_lambda: bool = True, prior_tokens: float = 32.0,
                 stop: str = "lookahead", name: str = "", shared: bool = False, zero: bool = False,
                 acceptance: "AcceptanceModel | None" = None):
        if u_pred not in ("mean", "previous"):
            raise ValueError("u_pred must be 'mean' or 'previous'")
        if stop not in ("lookahead", "greedy"):
            raise ValueError("stop must be 'lookahead' or 'greedy'")
        self.lambda0, self.u_bar_mean = float(lambda0), np.asarray(u_bar_mean, dtype=float)
        self.calibration, self.u_pred, self.stop = calibration, u_pred, stop
        self.running_lambda, self.prior_tokens = running_lambda, float(prior_tokens)
        self.acceptance = acceptance
        if acceptance is not None:
            acceptance.engine_check()
        self.markov = not running_lambda and u_pred == "mean" and (acceptance is None
                                                                   or "history" not in acceptance.features)
        self.name = name or "Delta rule"
        self.shared, self.zero = bool(shared), bool(zero)
        #: whether the engine gives it its measured passes (:attr:`pass_ms`): the batch decision prices them
        self.uses_pass_prices = self.shared

    def describe(self) -> str:
        return (f"{self.stop} stop, λ0 = {self.lambda0:.3f} ms/token"
                f"{' (running)' if self.running_lambda else ' (fixed)'}, "
                f"Ū: {'mean per m' if self.u_pred == 'mean' else 'previous round'}, "
                f"{self._reads()}"
                f"{', one decision per batch' if self.shared else ''}{', k = 0 allowed' if self.zero else ''}")

    def _reads(self) -> str:
        if self.acceptance is not None:
            return f"acceptance model ({', '.join(self.acceptance.features) or 'intercept'})"
        return f"confidence {'calibrated' if self.calibration is not None else 'raw'}"

    def setup(self, k_max, model):
        super().setup(k_max, model)
        if len(self.u_bar_mean) < self.k_max + 2:
            raise SpeclimitsError(f"u_bar_mean needs entries for m = 1..{self.k_max + 1}")
        self.terms = model.action_terms(self.k_max)
        #: Ĉ(k) without c·L at the mean Ū per m, k = 0..k_max, before :attr:`price_scale`
        self.row = self.model.round_prices(self.k_max, self.u_bar_mean[1:self.k_max + 2], terms=self.terms).tolist()
        if self.calibration is not None:  # one call deep: it runs per request per draft step
            self.engine_calibrate = self.calibration.predict_one
        #: the measured pass of k + 1 rows per request, k = 0..k_max (set by the engine; None: the cost model's)
        self.pass_ms: list[float] | None = None
        self._vtab: dict[int, list[float]] = {}  # batch_table per batch size
        return self

    def engine_state(self):
        # elapsed ms, tokens emitted; with the previous round's Ū also that Ū and its m (NaN, 0: none yet);
        # with an acceptance model also the (matched, reached) draft steps of its last rounds seen
        if self.acceptance is not None:
            return [0.0, 0.0, math.nan, 0, []]
        if self.u_pred == "previous":
            return [0.0, 0.0, math.nan, 0]
        return [0.0, 0.0] if self.running_lambda else None

    def engine_context(self, st):
        """λ in ms at :attr:`price_scale`; with the previous round's Ū, ``(λ, this request's Ĉ row)``."""
        lam0 = self.lambda0 * self.price_scale
        lam = lam0 if not self.running_lambda else (self.prior_tokens * lam0 + st[0]) / (self.prior_tokens + st[1])
        if self.u_pred == "mean":
            return lam
        u_prev, m_prev = st[2], st[3]
        if not (u_prev == u_prev and m_prev >= 1):  # no Ū observed yet: the mean per m
            return lam, self.row
        u_hat = self.u_bar_mean[1:self.k_max + 2] * (u_prev / self.u_bar_mean[m_prev])
        return lam, self.model.round_prices(self.k_max, u_hat, terms=self.terms).tolist()

    def engine_more(self, j, c, prod, lam):
        """Look-ahead: stop at j when ``Ĉ(k) - Ĉ(j) - λ·P_j·(c + c² + ... + c^(k-j)) >= 0`` for every k > j (P_j
        the product of steps 1..j, c step j's confidence). Greedy: extend while ``ΔĈ <= λ·ΔÊ[a]``."""
        row, s = self.row, self.price_scale
        if lam.__class__ is tuple:  # the previous round's Ū: the request's own row
            lam, row = lam
        if self.stop == "greedy":
            if j == 1:
                return -1
            return -1 if (row[j] - row[j - 1]) * s <= lam * prod else j - 1
        lp, power, total, base = lam * prod, 1.0, 0.0, row[j]
        for k in range(j + 1, self.k_max + 1):
            power *= c
            total += power
            if (row[k] - base) * s - lp * total < 0:
                return -1
        return j

    def engine_final_keep(self, confs, keep, lam):
        """Past its stop a request's draft steps are paid: keep the k >= ``keep`` minimizing ``Ĉ(k) - a·k - λ·Ê[a](k)``."""
        row, s = self.row, self.price_scale
        if lam.__class__ is tuple:
            lam, row = lam
        a_s = self.model.a * s
        power, e_a, best, best_k = 1.0, 0.0, math.inf, keep
        for k in range(len(confs) + 1):
            if k:
                power *= confs[k - 1]
                e_a += power
            if k >= keep:
                q = row[k] * s - a_s * k - lam * e_a
                if q < best:
                    best, best_k = q, k
        return best_k

    def engine_observe(self, st, k, cost_ms, emitted, u_bar=math.nan):
        st[0] += cost_ms
        st[1] += emitted
        if self.u_pred == "previous":
            st[2], st[3] = float(u_bar), int(k) + 1
        if self.acceptance is not None and k > 0:
            a = min(max(int(emitted) - 1, 0), int(k))
            hist = st[4]
            hist.append((a, min(a + 1, int(k))))
            if len(hist) > HISTORY_ROUNDS:
                del hist[0]

    def engine_history(self, st) -> float:
        """The ``history`` feature: of the draft steps the last :data:`HISTORY_ROUNDS` rounds seen reached (up to the
        first mismatch, at most k), the share that matched; NaN before any. Cut at each round's k, it reads a
        little higher than the K_max walk the model was fitted on: the rule then drafts more, never less."""
        hist = st[4]
        if not hist:
            return math.nan
        return sum(h[0] for h in hist) / sum(h[1] for h in hist)

    def engine_match(self, j: int, p: float, log_before: float, history: float) -> float:
        """Draft step j's match probability from the acceptance model (:meth:`AcceptanceModel.step_prob`)."""
        return self.acceptance.step_prob(p, j, log_before, history)

    # -- the engine's batch form (``shared``, batch > 1): one decision for the whole batch ----------
    def batch_table(self, b: int) -> list[float]:
        """The verification part of a step of ``b`` requests keeping ``n0 + n`` draft tokens in all (n = 0..b·K_max
        - n0; ``n0 = b``, or 0 with :attr:`zero`), before :attr:`price_scale`: ``b · v(⌈(n0 + n) / b⌉)``, ``v(k) =
        Ĉ(k) - a·k`` or the measured passes (:attr:`pass_ms`). A width between two profiled ones is priced as the
        wider (CPU kernels run rows in tiles: a narrower pass may cost as much)."""
        tab = self._vtab.get(b)
        if tab is None:
            a, kk = self.model.a, self.k_max
            v = self.pass_ms if self.pass_ms is not None else [self.row[k] - a * k for k in range(kk + 1)]
            n0 = 0 if self.zero else b
            tab = self._vtab[b] = [b * v[min(-(-(n0 + n) // b), kk)] for n in range(b * kk - n0 + 1)]
        return tab

    def _batch_gains(self, prods: list[list[float]], lams: list[float], j: int, last: int):
        """``(t, [λ_i·P_i,t / s per request i])`` for t = 1..last (none for t = 1 unless :attr:`zero`), P past step
        j extrapolated with step j's confidence ``P_j / P_(j-1)``."""
        inv_s = 1.0 / self.price_scale
        w = [lam * inv_s for lam in lams]
        yield 1, [wi * p[0] for wi, p in zip(w, prods)] if self.zero else []
        for t in range(2, j + 1):
            yield t, [wi * p[t - 1] for wi, p in zip(w, prods)]
        gains, ratio = [wi * p[j - 1] for wi, p in zip(w, prods)], []
        for p in prods:
            prev = p[j - 2] if j >= 2 else 1.0
            ratio.append(p[j - 1] / prev if prev > 0.0 else 0.0)
        for t in range(j + 1, last + 1):
            gains = [g * c for g, c in zip(gains, ratio)]
            yield t, gains

    def _batch_rounds(self, prods: list[list[float]], lams: list[float], j: int, last: int):
        """``(J, score, n)`` for J = j..last draft steps, lazily: the score ``b·a·J + min_n (V(n) - G_J(n))`` (over
        :attr:`price_scale`), ``G_J(n)`` the sum of the n largest gains of tokens t <= J, and its n."""
        b = len(prods)
        tab, a_b, gains = self.batch_table(b), b * self.model.a, []
        for t, level in self._batch_gains(prods, lams, j, last):
            gains += level
            if t < j:
                continue
            gains.sort(reverse=True)
            q, n, cum = tab[0], 0, 0.0
            for m, g in enumerate(gains, 1):
                cum += g
                x = tab[m] - cum
                if x < q:
                    q, n = x, m
            yield t, q + a_b * t, n

    def batch_select(self, prods: list[list[float]], lams: list[float], j: int, last: int | None = None
                     ) -> tuple[int, list[int]]:
        """The batch's best round after draft step ``j``: ``(J, k)``, the draft steps (``j``..``last``; ``last`` =
        ``j`` once the drafter stopped) and the tokens each request keeps (1..J; 0..J with :attr:`zero`).

        A step costs ``s·(b·a·J + V(n))`` (:meth:`batch_table`) and gains ``λ_i·P_i,t`` per kept token t of
        request i. Since ``P_i,t`` falls with t, the best n tokens for a J are the n largest gains with t <= J;
        J and n are searched exhaustively. Equal gains go to the later token, then the later request."""
        big_j, _, n = min(self._batch_rounds(prods, lams, j, j if last is None else last), key=lambda r: r[1])
        items = sorted(((g, t, i) for t, level in self._batch_gains(prods, lams, j, big_j)
                        for i, g in enumerate(level)), reverse=True)
        keep = [0 if self.zero else 1] * len(prods)
        for _, _, i in items[:n]:
            keep[i] += 1
        return big_j, keep

    def engine_batch_more(self, j: int, prods: list[list[float]], lams: list[float], last: int) -> bool:
        """After draft step j of a batch: True to draft on, when a longer round (up to ``last``) scores better."""
        rounds = self._batch_rounds(prods, lams, j, last)
        stop = next(rounds)[1]
        return any(q < stop for _, q, _ in rounds)


class EmaAcceptedLength(Policy):
    """SGLang-style adaptive ``speculative_num_steps`` (sglang #21599, from the issue's description), per request
    (SGLang shares one EMA across the batch). An EMA of the accept length (weight ``alpha`` on the newest round)
    picks k among the ``steps`` (clipped to K_max; the middle one first): after ``warmup`` rounds, every
    ``every`` rounds the target ``EMA + 1`` moves k up to the largest step s with target >= s - 0.5, and down
    only below the current step - 0.5 - ``hysteresis``."""

    markov = False

    def __init__(self, steps: tuple[int, ...] = (1, 3, 5, 7), alpha: float = 0.2, warmup: int = 10,
                 every: int = 5, hysteresis: float = 0.25):
        self.steps, self.alpha, self.warmup = tuple(int(s) for s in steps), float(alpha), int(warmup)
        self.every, self.hysteresis = int(every), float(hysteresis)
        self.name = "EMA of accepted length"

    def setup(self, k_max, model):
        super().setup(k_max, model)
        self.tiers = sorted({min(max(s, 1), self.k_max) for s in self.steps})
        self._edges = [t - 0.5 for t in self.tiers]
        return self

    def describe(self) -> str:
        return f"steps {self.tiers}, α = {self.alpha}, warm-up {self.warmup}, every {self.every}"

    def engine_state(self):
        return [math.nan, 0.0, float(self.tiers[len(self.tiers) // 2])]  # ema, rounds, k (the middle step first)

    def engine_plan(self, st):
        return int(st[2])

    def engine_observe(self, st, k, cost_ms, emitted, u_bar=math.nan):
        acc = float(emitted)
        st[0] = acc if math.isnan(st[0]) else (1 - self.alpha) * st[0] + self.alpha * acc
        st[1] += 1
        if not (st[1] >= self.warmup and (st[1] - self.warmup) % self.every == 0):
            return
        target, cur = st[0] + 1, st[2]
        up = self.tiers[max(bisect_right(self._edges, target) - 1, 0)]
        st[2] = float(up if up > cur else (up if target < cur - 0.5 - self.hysteresis else cur))


class UtilityTestAndSet(Policy):
    """Cascade-style test-and-set of K per request (arXiv 2506.20675, from its description): a *test* phase
    drafts each of the ``candidates`` for ``test_rounds`` rounds, measuring tokens per ms; a *set* phase of
    ``set_rounds`` rounds drafts the best. (The paper's slowdown cap is not reproduced.)"""

    markov = False

    def __init__(self, candidates: tuple[int, ...] = (1, 2, 3, 4, 6), test_rounds: int = 2, set_rounds: int = 16):
        self.candidates = tuple(int(c) for c in candidates)
        self.test_rounds, self.set_rounds = int(test_rounds), int(set_rounds)
        self.name = "utility test-and-set"

    def setup(self, k_max, model):
        super().setup(k_max, model)
        self.ks = sorted({min(max(c, 1), self.k_max) for c in self.candidates})
        self._n_test = len(self.ks) * self.test_rounds
        return self

    def describe(self) -> str:
        return f"candidates {self.ks}, test {self.test_rounds} rounds each, set {self.set_rounds} rounds"

    def engine_state(self):
        c = len(self.ks)
        return [0, self.ks[0], [0.0] * c, [0.0] * c]  # round, best k, tokens and ms per candidate

    def _testing(self, t: int) -> int:
        """The candidate tested in round ``t`` of a request (-1 in a set phase)."""
        cyc = t % (self._n_test + self.set_rounds)
        return min(cyc // self.test_rounds, len(self.ks) - 1) if cyc < self._n_test else -1

    def engine_plan(self, st):
        i = self._testing(st[0])
        return self.ks[i] if i >= 0 else st[1]

    def engine_observe(self, st, k, cost_ms, emitted, u_bar=math.nan):
        i = self._testing(st[0])
        if i >= 0:
            st[2][i] += emitted
            st[3][i] += cost_ms
        st[0] += 1
        if st[0] % (self._n_test + self.set_rounds) == self._n_test:
            util = [tok / max(ms, 1e-9) for tok, ms in zip(st[2], st[3])]
            st[1] = self.ks[max(range(len(util)), key=util.__getitem__)]
            st[2], st[3] = [0.0] * len(util), [0.0] * len(util)


class ThroughputAware(Policy):
    """SGLang-style throughput-aware draft length (sglang PR #28045, from its description); reads no confidences.

    Each round ``k* = argmax_k E[tokens | k] / C(k)``, ``E[tokens | k] = 1 + sum_{t<=k} prod_{s<=t} α_s``
    (``α_t`` the acceptance of position t given t - 1), ``C(k)`` a round's price (the profiled pass, drafter
    and time outside in the engine; the cost model at the mean Ū per m offline). ``α_t``: per position, counts
    of rounds that reached and accepted it, decayed by ``1/window`` per round, plus ``prior_weight``
    pseudo-rounds at the fit's acceptance; an untested position fades back to the prior over ``forget_rounds``.
    Defaults chosen on the batch replay of the *train* references at batch 1, 4, 8 (all within 2% there). At
    batch > 1 one k for all, from the summed counts.

    ``zero`` (``throughput:zero-k``): k = 0 is a candidate too, and a round in which every request plans k = 0
    **skips the drafter** (:attr:`skips_drafter`), costing a plain step. The draft model's KV cache then has
    holes at those positions (fewer accepted tokens later, never another output).
    """

    markov = False
    uses_pass_prices = True  # the engine gives it its measured passes (:attr:`pass_ms`)

    def __init__(self, prior_survival: Any, u_bar_mean: Any = None, window: float = 20.0, prior_weight: float = 4.0,
                 forget_rounds: float | None = 100.0, zero: bool = False):
        s = np.asarray(prior_survival, dtype=float)
        prev = np.concatenate([[1.0], s[:-1]])
        with np.errstate(invalid="ignore", divide="ignore"):
            self.prior_alpha = np.clip(np.nan_to_num(s / prev, nan=0.5), 0.01, 0.99)
        self.u_bar_mean = None if u_bar_mean is None else np.asarray(u_bar_mean, dtype=float)
        self.window, self.prior_weight = float(window), float(prior_weight)
        self.decay = 1.0 - 1.0 / self.window
        self.forget = 1.0 - 1.0 / (forget_rounds if forget_rounds else math.inf)
        self.name = "throughput-aware"
        self.zero = self.skips_drafter = bool(zero)
        #: the time of a step outside the pass and the drafter, per request (the engine's profile sets it)
        self.outside_ms = 0.0

    def describe(self) -> str:
        return (f"argmax E[tokens]/C(k), per-position acceptance decayed over {self.window:g} rounds, prior "
                f"{self.prior_weight:g} rounds, one k for the batch"
                f"{'; k = 0 allowed, a batch that plans k = 0 skips the drafter' if self.zero else ''}")

    def setup(self, k_max, model):
        super().setup(k_max, model)
        kk = self.k_max
        if len(self.prior_alpha) < kk:
            raise SpeclimitsError(f"throughput-aware: prior acceptance for positions 1..{kk} needed, got "
                                  f"{len(self.prior_alpha)}")
        u = np.zeros(kk + 2) if self.u_bar_mean is None else self.u_bar_mean
        prices = model.mean_round_prices(kk, u)
        self._model_prices, self._model_price0 = prices[1:].tolist(), float(prices[0])
        self._prior_acc = (self.prior_weight * self.prior_alpha[:kk]).tolist()
        self.pass_ms: list[float] | None = None
        return self

    def prices(self) -> list[float]:
        """The price of a round of k = 1..K_max (with the engine's measured passes once it set them)."""
        if self.pass_ms is None:
            return self._model_prices
        a, b = self.model.a, self.model.b
        return [self.pass_ms[k] + a * k + b for k in range(1, self.k_max + 1)]

    def price0(self) -> float:
        """The price of a round that drafts nothing (the drafter skipped): the pass of one row per request, and
        in the engine the time outside it."""
        return self._model_price0 if self.pass_ms is None else self.pass_ms[0] + self.outside_ms

    def engine_state(self):
        return [[0.0] * self.k_max, [0.0] * self.k_max]  # positions reached, accepted (decayed counts)

    def choose(self, reached: list[float], acc: list[float]) -> int:
        """k* from counts of positions reached and accepted (one request's, or the batch's summed)."""
        w, best, best_k = self.prior_weight, -1.0, 1
        surv, tokens = 1.0, 1.0
        for t, (r, c, c0, price) in enumerate(zip(reached, acc, self._prior_acc, self.prices())):
            surv *= (c + c0) / (r + w)
            tokens += surv
            score = tokens / price
            if score > best:
                best, best_k = score, t + 1
        if self.zero and 1.0 / self.price0() > best:
            return 0
        return best_k

    def engine_plan(self, st):
        return self.choose(st[0], st[1])

    def engine_batch_plan(self, sts):
        if len(sts) < 2:
            return None
        reached, acc = ([sum(col) for col in zip(*(st[i] for st in sts))] for i in (0, 1))
        return [self.choose(reached, acc)] * len(sts)

    def engine_observe(self, st, k, cost_ms, emitted, u_bar=math.nan):
        a = min(max(int(emitted) - 1, 0), k)
        reached, acc, d, f = st[0], st[1], self.decay, self.forget
        hi = min(a + 1, k)
        for t in range(self.k_max):  # the positions this round tested; the others fade slowly
            if t < hi:
                reached[t] = d * reached[t] + 1.0
                acc[t] = d * acc[t] + (1.0 if t < a else 0.0)
            else:
                reached[t] *= f
                acc[t] *= f


# -- Configuration: the policy JSON ----------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationMap:
    """A monotone map confidence -> match probability, linear between increasing thresholds ``x``, clipped at
    the ends (a fitted ``IsotonicRegression(out_of_bounds="clip")``)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        x, y = tuple(float(v) for v in self.x), tuple(float(v) for v in self.y)
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        # each segment's slope, divided as np.interp divides it (a segment of zero width is never used)
        object.__setattr__(self, "_slope", tuple((y[j + 1] - y[j]) / (x[j + 1] - x[j]) if x[j + 1] > x[j] else 0.0
                                                 for j in range(len(x) - 1)))

    @classmethod
    def from_isotonic(cls, iso: Any) -> "CalibrationMap":
        return cls(tuple(iso.X_thresholds_), tuple(iso.y_thresholds_))

    def predict_one(self, v: float) -> float:
        """The map at one float, computed as ``np.interp(v, x, y)`` does (the same float)."""
        x = self.x
        j = bisect_right(x, v) - 1
        if j < 0:
            return self.y[0]
        if j == len(self._slope) or x[j] == v:
            return self.y[j]
        return self._slope[j] * (v - x[j]) + self.y[j]


@dataclass(frozen=True)
class AcceptanceModel:
    """P(draft step j matches | steps 1..j-1 matched) = ``1 / (1 + exp(-(intercept + sum_i coef_i·x_i)))``, x the
    ``features`` (:data:`speclimits.control.acceptance.FEATURES`; ``walk_k_max`` the history's K_max), a missing
    one set to its ``fill`` (the train mean). ``selection``: ``(feature, held-out log loss)`` per step."""

    features: tuple[str, ...]
    coef: tuple[float, ...]
    intercept: float
    fill: tuple[float, ...]
    walk_k_max: int
    selection: tuple[tuple[str, float], ...] = ()

    def predict_one(self, values: Any) -> float:
        """The probability at one feature vector (in :attr:`features`' order; NaN: the fill)."""
        z = self.intercept
        for c, v, f in zip(self.coef, values, self.fill):
            z += c * (f if v != v else v)
        return 1.0 / (1.0 + math.exp(-z))

    def engine_check(self) -> None:
        """Raise unless every feature is one the engine computes (:data:`ENGINE_FEATURES`)."""
        bad = [f for f in self.features if f not in ENGINE_FEATURES]
        if bad:
            raise SpeclimitsError(f"acceptance model uses {', '.join(bad)}, which the engine does not know when it "
                                  f"decides (it knows {', '.join(ENGINE_FEATURES)}): refit it with `speclimits "
                                  "control fit`")

    def step_prob(self, p: float, j: int, log_before: float, history: float) -> float:
        """Draft step ``j``'s match probability in float operations (no numpy): ``p`` its top-1 probability
        (clipped by the caller), ``log_before`` the sum of the clipped log top-1 of steps 1..j-1, ``history``
        :meth:`DeltaRule.engine_history` (NaN: the fill)."""
        z = self.intercept
        for name, c, f in zip(self.features, self.coef, self.fill):
            if name == "logit_conf":
                z += c * math.log(p / (1.0 - p))
            elif name == "conf":
                z += c * p
            elif name == "position":
                z += c * j
            elif name == "log_prod_before":
                z += c * log_before
            else:  # history (engine_check rejects the rest)
                z += c * (f if history != history else history)
        return 1.0 / (1.0 + math.exp(-z))

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "coef": list(self.coef), "intercept": self.intercept,
                "fill": list(self.fill), "walk_k_max": self.walk_k_max, "selection": [list(s) for s in self.selection]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AcceptanceModel":
        return cls(tuple(d["features"]), tuple(float(v) for v in d["coef"]), float(d["intercept"]),
                   tuple(float(v) for v in d["fill"]), int(d["walk_k_max"]),
                   tuple((str(f), float(v)) for f, v in d.get("selection", [])))


@dataclass(frozen=True)
class PolicyFit:
    """Fitted policy parameters (the JSON the engine loads): ``k_max``, the threshold's ``tau``, the Delta rule's
    ``lambda_`` (ms per token) and the train Oracle's time per token (``lambda_oracle``), ``u_bar_mean`` ((k_max
    + 2,) mean Ū per m, index 0 = index 1), ``calibration``, ``cost_model``, the split, ``data`` (provenance),
    ``curves`` over τ and λ; ``tokens_per_round`` of static K = 1..k_max on the train references and
    ``lambda_ratio``, λ over the best static K's time per token (dimensionless: they price λ in the engine's
    units); ``acceptance`` (None in a file written before it)."""

    k_max: int
    tau: float
    lambda_: float
    lambda_oracle: float
    u_bar_mean: tuple[float, ...]
    calibration: CalibrationMap
    cost_model: CostModel
    train_seq_ids: tuple[str, ...]
    test_seq_ids: tuple[str, ...]
    data: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Any] = field(default_factory=dict)
    prior_tokens: float = 32.0
    tokens_per_round: tuple[float, ...] | None = None
    lambda_ratio: float | None = None
    acceptance: AcceptanceModel | None = None

    def match_model(self) -> tuple["AcceptanceModel | CalibrationMap", str]:
        """The rule's match model: the acceptance model, or (an older policy) the calibration and the line saying so."""
        if self.acceptance is not None:
            return self.acceptance, ""
        return self.calibration, "policy has no acceptance model (written before it): confidence-only calibration used"

    # -- policies ---------------------------------------------------------------------------
    def make(self, name: str) -> Policy:
        """The policy called ``name`` (``static:K``, ``random:SEED``, :data:`POLICY_NAMES` with variants), set up and
        labelled as :func:`speclimits.arms.arm` reads it: the one way a policy is configured."""
        a, (base, mods) = arm(name), parse_policy_name(name) or ("", ())
        u = np.asarray(self.u_bar_mean)
        if a.kind == "static" and a.k is not None:
            pol: Policy = StaticK(a.k)
        elif base == "threshold":
            pol = ConfidenceThreshold(self.tau)
        elif base in ("delta", "delta-fixed"):
            pol = DeltaRule(self.lambda_, u, None if "raw-confidence" in mods else self.calibration,
                            "previous" if "previous-u" in mods else "mean", running_lambda=base == "delta",
                            prior_tokens=self.prior_tokens, stop="greedy" if "greedy-stop" in mods else "lookahead",
                            shared="alone" not in mods, zero="zero-k" in mods,
                            acceptance=self.acceptance if "acceptance" in mods else None)
        elif base == "ema":
            pol = EmaAcceptedLength()
        elif base == "cascade":
            pol = UtilityTestAndSet()
        elif base == "throughput":
            if self.tokens_per_round is None:
                raise SpeclimitsError("policy 'throughput' needs the fit's static tokens per round (refit the policy "
                                      "file with `speclimits control fit`)")
            pol = ThroughputAware(np.diff(np.concatenate([[1.0], self.tokens_per_round])), u, zero="zero-k" in mods)
        elif name == "random" or name.startswith("random:") and name[7:].isdigit():
            pol = RandomK(int(name[7:] or 0))
        else:
            raise SpeclimitsError(f"unknown policy {name!r}; known: static:K, random:SEED, {', '.join(POLICY_NAMES)} "
                                  f"(delta and delta-fixed with variants :{', :'.join(DELTA_VARIANTS)}, each at most "
                                  "once)")
        if a.kind != "unknown":
            pol.name = a.label
        if "acceptance" in mods and self.acceptance is None:
            pol.name += " (" + self.match_model()[1] + ")"
        return pol.setup(self.k_max, self.cost_model)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "k_max": self.k_max, "tau": self.tau, "lambda": self.lambda_,
            "lambda_oracle": self.lambda_oracle, "prior_tokens": self.prior_tokens,
            "u_bar_mean": list(self.u_bar_mean),
            "calibration": {"x": list(self.calibration.x), "y": list(self.calibration.y)},
            "cost_model": self.cost_model.to_dict(),
            "split": {"train": list(self.train_seq_ids), "test": list(self.test_seq_ids)},
            "data": self.data, "curves": self.curves,
            "tokens_per_round": None if self.tokens_per_round is None else list(self.tokens_per_round),
            "lambda_ratio": self.lambda_ratio,
            "acceptance": None if self.acceptance is None else self.acceptance.to_dict(),
        }

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        from speclimits.jsonutil import dumps  # the curves are DataFrames: only the fit writes

        p.write_text(dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "policy JSON") -> "PolicyFit":
        if d.get("format") != FORMAT:
            raise SpeclimitsError(f"{origin}: 'format' must be {FORMAT!r}, got {d.get('format')!r}")
        try:
            return cls(k_max=int(d["k_max"]), tau=float(d["tau"]), lambda_=float(d["lambda"]),
                       lambda_oracle=float(d["lambda_oracle"]), u_bar_mean=tuple(float(v) for v in d["u_bar_mean"]),
                       calibration=CalibrationMap(tuple(d["calibration"]["x"]), tuple(d["calibration"]["y"])),
                       cost_model=CostModel.from_dict(d["cost_model"], origin=f"{origin}: cost_model"),
                       train_seq_ids=tuple(d["split"]["train"]), test_seq_ids=tuple(d["split"]["test"]),
                       data=dict(d.get("data", {})), curves=dict(d.get("curves", {})),
                       prior_tokens=float(d.get("prior_tokens", 32.0)),
                       tokens_per_round=None if d.get("tokens_per_round") is None else
                       tuple(float(v) for v in d["tokens_per_round"]),
                       lambda_ratio=None if d.get("lambda_ratio") is None else float(d["lambda_ratio"]),
                       acceptance=None if d.get("acceptance") is None else AcceptanceModel.from_dict(d["acceptance"]))
        except KeyError as exc:
            raise SpeclimitsError(f"{origin}: missing field {exc}") from None
        except (TypeError, ValueError) as exc:
            raise SpeclimitsError(f"{origin}: bad value ({exc})") from None

    @classmethod
    def read(cls, path: str | Path) -> "PolicyFit":
        from speclimits.jsonutil import read_json

        d = read_json(path, "policy file", SpeclimitsError,
                      missing_hint=f"write one with `speclimits control fit TRACE --out {path}`")
        return cls.from_dict(d, origin=f"policy file {Path(path)}")

    def engine_lambda(self, model: CostModel, u_bar_mean: Any = None) -> float:
        """λ0 in the units of ``model``: the fit's ratio times ``min_k Ĉ(k) / tokens_per_round[k]`` under ``model``;
        the fit's own λ when it has no ratio (an older file)."""
        if self.lambda_ratio is None or self.tokens_per_round is None:
            return self.lambda_
        u = self.u_bar_mean if u_bar_mean is None else u_bar_mean
        per_token = model.mean_round_prices(self.k_max, u)[1:] / np.asarray(self.tokens_per_round, dtype=float)
        return float(self.lambda_ratio * np.nanmin(per_token))
