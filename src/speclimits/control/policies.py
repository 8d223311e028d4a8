"""Online policies measured against the Oracle bound (beyond the paper): one implementation, two harnesses.

The same policy object runs offline here (on Oracle inputs) and inside vLLM
(:mod:`speclimits.control.extension`); see :class:`Policy` for the interface both drive.

Every policy sees only what a running system sees: the draft's own confidence (``draft_conf``,
top-1 probabilities) instead of the reference match probability, a predicted Ū instead of
the counterfactual one, a running estimate of the time per token. All are priced by the same
simulator as the Oracle: round cost C(n, k) from the cost model with the *true* window Ū,
acceptance drawn from ``match_prob`` (``P(a >= j) = prod_{i<j} match_prob[i]``), on held-out
sequences (split by ``seq_id``, seeded).

Policies whose action depends only on the state (static K, the confidence threshold, the
Delta-Space rule with a fixed λ and mean Ū) are evaluated exactly with the Oracle's policy
evaluation. Policies with memory (running λ, previous round's Ū) are evaluated by Monte Carlo
rollouts: per rollout, one greedy match length is drawn for every state from ``match_prob``;
walking a sequence then visits each state at most once, so for a state-only policy the
rollout mean is an unbiased estimate of the exact value, and every policy sees the same draws
(common random numbers).

A rule that looks at draft step k + 1's confidence and then stops at k has run that draft
step: it pays one extra ``a`` ms of draft time (the token is discarded; the greedy Delta rule).
The threshold rule keeps the token at which the cumulative confidence fell below τ, and the
look-ahead Delta rule decides before drafting each next step, so neither wastes a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression
from tqdm.auto import tqdm

from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.calibration import fit_isotonic, reached_steps
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.solver import evaluate_policy, solve


def split_sequences(inputs: OracleInputs, test_share: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of sequence indices into (train, test) by ``seq_id``; both non-empty."""
    if inputs.n_sequences < 2:
        raise SpeclimitsError("a train/test split needs at least 2 reference sequences")
    perm = np.random.default_rng(seed).permutation(inputs.n_sequences)
    n_test = int(np.clip(round(test_share * inputs.n_sequences), 1, inputs.n_sequences - 1))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


# ---------------------------------------------------------------------------
# Policies: one implementation, two harnesses
# ---------------------------------------------------------------------------


class Policy:
    """Base class of a rule that chooses the draft length k of each live request, round by round.

    The rule is written once, against what a running system has, and driven by two harnesses:

    * the engine (:class:`speclimits.control.extension.ControlWorkerExtension`) calls
      :meth:`plan` before drafting, :meth:`more` after each draft step with the confidences
      drafted so far, and :meth:`observe` after the verification pass;
    * the offline evaluation calls :meth:`decide`, which runs the same :meth:`plan` /
      :meth:`more` loop on the states' recorded ``draft_conf`` (exact policy evaluation for
      state-only rules, rollouts for rules with memory).

    Arrays are per request of the batch (``b``): ``mem`` is a dict of (b,) arrays created by
    :meth:`init_memory`; ``conf`` is (b, j), the draft's top-1 probability at steps 1..j.
    :meth:`setup` gives the policy K_max and the cost model (the engine's harness);
    :meth:`bind` does that and attaches Oracle inputs (the offline harness).
    """

    name = "policy"
    markov = True  # True: the action depends only on the state (no memory)
    uses_confidence = False  # True: more() reads the draft's confidences (the engine computes them only then)

    def setup(self, k_max: int, model: CostModel) -> "Policy":
        """K_max and the cost model; returns self."""
        self.k_max, self.model = int(k_max), model
        self.fixed_ms, self.slope_ms = model.action_terms(self.k_max)  # (k_max + 1,): round cost without c·L
        return self

    def bind(self, inputs: OracleInputs, table: CostTable) -> "Policy":
        """Offline: :meth:`setup` from a cost table and attach the inputs it evaluates on."""
        self.setup(table.k_max, table.model)
        self.inputs, self.table = inputs, table
        return self

    def init_memory(self, n: int) -> dict[str, np.ndarray]:
        return {}

    def plan(self, mem: dict[str, np.ndarray]) -> np.ndarray:
        """(b,) most tokens to draft this round, decided before drafting (1..k_max)."""
        return np.full(len(next(iter(mem.values()))) if mem else 0, self.k_max)

    def more(self, j: int, conf: np.ndarray, mem: dict[str, np.ndarray]) -> np.ndarray:
        """After draft step j: (b,) int, -1 to draft step j + 1, else the tokens to keep (<= j)."""
        return np.full(conf.shape[0], -1)

    def observe(self, mem: dict[str, np.ndarray], k: np.ndarray, cost_ms: np.ndarray, emitted: np.ndarray,
                u_bar: np.ndarray) -> None:
        """After verification: drafted ``k`` (b,), round ``cost_ms`` (b,), tokens ``emitted`` (b,) and
        the observed Ū of the pass (b,; NaN where not measured)."""
        return None

    # -- the offline driver of plan/more ----------------------------------------------------
    def conf_of(self, rows: np.ndarray) -> np.ndarray:
        """(b, k_max) recorded draft confidences of the bound states ``rows``."""
        return self.inputs.draft_conf[rows, : self.k_max]

    def decide(self, rows: np.ndarray, mem: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Offline: ``(k (b,), extra draft ms (b,))`` for the bound states ``rows``, by the loop the
        engine runs: draft step j, ask :meth:`more`; a token drafted and then dropped costs ``a`` ms."""
        b = len(rows)
        if not mem:
            mem = {"_n": np.zeros(b)}
        cap = np.clip(np.asarray(self.plan(mem), dtype=np.int64), 1, self.k_max)
        conf = self.conf_of(rows)
        keep = np.full(b, -1)
        drafted = np.zeros(b, dtype=np.int64)
        for j in range(1, self.k_max + 1):
            live = keep < 0
            if not live.any():
                break
            drafted[live] = j
            at_cap = live & (cap <= j)
            keep[at_cap] = cap[at_cap]
            ask = live & ~at_cap
            if ask.any():
                sub = {key: val[ask] for key, val in mem.items()}
                out = np.asarray(self.more(j, conf[ask, :j], sub))
                keep[np.flatnonzero(ask)[out >= 0]] = out[out >= 0]
        keep[keep < 0] = self.k_max
        return keep, (drafted - keep) * self.model.a

    def actions(self) -> tuple[np.ndarray, np.ndarray]:
        """Markov policies: (k, extra ms) for every state of the bound inputs."""
        if not self.markov:
            raise TypeError(f"{self.name} has memory: evaluate it with rollouts")
        rows = np.arange(self.inputs.n_states)
        return self.decide(rows, self.init_memory(len(rows)))

    def describe(self) -> str:
        return ""


class StaticK(Policy):
    """Always draft k tokens (capped at K_max)."""

    def __init__(self, k: int):
        self.k = int(k)
        self.name = f"static K = {self.k}"

    def plan(self, mem):
        return np.full(len(next(iter(mem.values()))), min(self.k, self.k_max))


class FixedActions(Policy):
    """A given action per state (e.g. the Oracle's k*); offline only."""

    def __init__(self, k: np.ndarray, name: str = "fixed"):
        self.k, self.name = np.asarray(k, dtype=np.int64), name

    def decide(self, rows, mem):
        return self.k[rows], np.zeros(len(rows))


class RandomK(Policy):
    """A seeded random k in 1..K_max per request per round: a control arm for losslessness tests
    (ragged k within a batch, early exits), not a serious rule."""

    markov = False

    def __init__(self, seed: int = 0):
        self.seed, self.rng = int(seed), np.random.default_rng(seed)
        self.name = "random k"

    def plan(self, mem):
        return self.rng.integers(1, self.k_max + 1, size=len(next(iter(mem.values()))))


class ConfidenceThreshold(Policy):
    """Draft while the cumulative draft confidence ``prod_{i<=j} conf_i`` stays >= τ (SpecDec++ /
    DISCO-style); the token at which it falls below τ is kept (at least 1, at most K_max)."""

    uses_confidence = True

    def __init__(self, tau: float):
        self.tau = float(tau)
        self.name = "confidence threshold"

    def more(self, j, conf, mem):
        return np.where(np.prod(conf, axis=1) >= self.tau, -1, j)

    def describe(self) -> str:
        return f"τ = {self.tau:.3g}"


class DeltaRule(Policy):
    """The Delta-Space rule online, with the Oracle's value replaced by ``V(n) ≈ λ·(N - n)``.

    Per round the rule scores ``Q̂(k) = Ĉ(k) - λ·Ê[a](k)`` with ``Ê[a](k) = sum_{j<=k} prod_{i<=j} p_i``
    (p the draft confidence, optionally calibrated by a monotone map fitted on training rounds)
    and ``Ĉ(k) = a·k + b + beta0(k+1) + alpha(k+1)·Û(k+1)`` (the context term cancels), with Û from
    ``u_bar_mean[m]`` (``u_pred="mean"``) or the previous round's observed Ū rescaled by
    ``u_bar_mean[m] / u_bar_mean[m_prev]`` (``"previous"``; falls back to the mean where no Ū was
    observed). λ is fixed at ``lambda0`` or running: ``(w·λ0 + elapsed ms) / (w + emitted tokens)``
    within a sequence.

    ``stop="lookahead"`` (default): after drafting j tokens the rule drafts step j + 1 only if
    the best k >= j under Q̂ — the confidences of steps not drafted yet extrapolated from the
    last one — is longer than j; so it never drafts a token it discards, and it can pass a
    non-convex stretch of Ĉ (the m = 4/5 regime change). ``stop="greedy"``: extend k -> k+1
    while ``ΔĈ <= λ·ΔÊ[a]`` (the Delta-Space necessary condition, first failure stops); it has
    to draft step k + 1 to see its confidence, so a stop before K_max costs one draft step (``a`` ms).
    """

    uses_confidence = True

    def __init__(self, lambda0: float, u_bar_mean: np.ndarray, calibration: IsotonicRegression | None = None,
                 u_pred: str = "mean", running_lambda: bool = True, prior_tokens: float = 32.0,
                 stop: str = "lookahead", name: str = ""):
        if u_pred not in ("mean", "previous"):
            raise ValueError("u_pred must be 'mean' or 'previous'")
        if stop not in ("lookahead", "greedy"):
            raise ValueError("stop must be 'lookahead' or 'greedy'")
        self.lambda0, self.u_bar_mean = float(lambda0), np.asarray(u_bar_mean, dtype=float)
        self.calibration, self.u_pred, self.stop = calibration, u_pred, stop
        self.running_lambda, self.prior_tokens = running_lambda, float(prior_tokens)
        self.markov = not running_lambda and u_pred == "mean"
        self.name = name or "Delta rule"

    def describe(self) -> str:
        return (f"{self.stop} stop, λ0 = {self.lambda0:.3f} ms/token"
                f"{' (running)' if self.running_lambda else ' (fixed)'}, "
                f"Ū: {'mean per m' if self.u_pred == 'mean' else 'previous round'}, "
                f"confidence {'calibrated' if self.calibration is not None else 'raw'}")

    def setup(self, k_max, model):
        super().setup(k_max, model)
        if len(self.u_bar_mean) < self.k_max + 2:
            raise SpeclimitsError(f"u_bar_mean needs entries for m = 1..{self.k_max + 1}")
        return self

    def calibrate(self, conf: np.ndarray) -> np.ndarray:
        """The calibration map applied to confidences of any shape."""
        if self.calibration is None:
            return conf
        return self.calibration.predict(conf.ravel()).reshape(conf.shape)

    def bind(self, inputs, table):
        super().bind(inputs, table)
        self._conf = self.calibrate(inputs.draft_conf[:, : self.k_max])
        return self

    def conf_of(self, rows):
        return self._conf[rows]

    def init_memory(self, n):
        return {"elapsed": np.zeros(n), "emitted": np.zeros(n), "u_prev": np.full(n, np.nan),
                "m_prev": np.zeros(n, dtype=np.int64)}

    def c_hat(self, mem: dict[str, np.ndarray], b: int) -> np.ndarray:
        """(b, k_max + 1) predicted round cost without c·L, for k = 0..k_max."""
        ms = np.arange(1, self.k_max + 2)
        u_hat = np.broadcast_to(self.u_bar_mean[ms], (b, len(ms))).copy()
        if self.u_pred == "previous":
            seen = np.isfinite(mem["u_prev"]) & (mem["m_prev"] >= 1)
            scale = mem["u_prev"][seen] / self.u_bar_mean[mem["m_prev"][seen]]
            u_hat[seen] = self.u_bar_mean[ms][None, :] * scale[:, None]
        return self.fixed_ms[None, :] + self.slope_ms[None, :] * u_hat

    def lam(self, mem: dict[str, np.ndarray], b: int) -> np.ndarray:
        """(b,) the value of one token of progress, ms."""
        if not self.running_lambda:
            return np.full(b, self.lambda0)
        return (self.prior_tokens * self.lambda0 + mem["elapsed"]) / (self.prior_tokens + mem["emitted"])

    def more(self, j, conf, mem):
        b, kk = conf.shape[0], self.k_max
        c_hat, lam = self.c_hat(mem, b), self.lam(mem, b)
        p = conf if self.inputs_calibrated else self.calibrate(conf)
        if self.stop == "greedy":
            if j == 1:
                return np.full(b, -1)
            ok = c_hat[:, j] - c_hat[:, j - 1] <= lam * np.prod(p, axis=1)
            return np.where(ok, -1, j - 1)
        # confidences known for steps 1..j; later ones extrapolated from step j
        full = np.concatenate([p, np.repeat(p[:, -1:], kk - j, axis=1)], axis=1)
        e_a = np.concatenate([np.zeros((b, 1)), np.cumsum(np.cumprod(full, axis=1), axis=1)], axis=1)
        q_hat = c_hat - lam[:, None] * e_a
        return np.where(np.argmin(q_hat[:, j:], axis=1) == 0, j, -1)

    @property
    def inputs_calibrated(self) -> bool:
        """Offline the bound confidences are calibrated once in :meth:`bind`; the engine calibrates per step."""
        return getattr(self, "_offline", False)

    def decide(self, rows, mem):
        self._offline = True
        try:
            return super().decide(rows, mem)
        finally:
            self._offline = False

    def observe(self, mem, k, cost_ms, emitted, u_bar):
        mem["elapsed"] += cost_ms
        mem["emitted"] += emitted
        mem["u_prev"] = np.asarray(u_bar, dtype=float).copy()
        mem["m_prev"] = np.asarray(k, dtype=np.int64) + 1


class EmaAcceptedLength(Policy):
    """SGLang-style adaptive ``speculative_num_steps`` (sglang #21599, EAGLE top-k = 1), per request.

    An EMA of the accept length (accepted drafts + the bonus token, as SGLang counts it; weight
    ``alpha`` on the newest round) drives the draft length
    among the ``steps`` tier (clipped to K_max): after ``warmup`` rounds at the starting step, every
    ``every`` rounds the target ``EMA + 1`` moves k up to the largest step s with target >= s - 0.5,
    and down only when the target falls below the current step - 0.5 - ``hysteresis``.
    Reimplemented from the description in the public issue thread; SGLang keys its tiers on the
    batch size and shares one EMA across the batch, here every request has its own.
    """

    markov = False

    def __init__(self, steps: tuple[int, ...] = (1, 3, 5, 7), alpha: float = 0.2, warmup: int = 10,
                 every: int = 5, hysteresis: float = 0.25, start: int | None = None):
        self.steps, self.alpha, self.warmup, self.every = tuple(int(s) for s in steps), float(alpha), int(warmup), \
            int(every)
        self.hysteresis, self.start = float(hysteresis), start
        self.name = "EMA of accepted length"

    def describe(self) -> str:
        return f"steps {list(self.tiers)}, α = {self.alpha}, warm-up {self.warmup}, every {self.every}"

    @property
    def tiers(self) -> np.ndarray:
        return np.unique(np.clip(np.asarray(self.steps), 1, self.k_max))

    def init_memory(self, n):
        tiers = self.tiers
        start = tiers[len(tiers) // 2] if self.start is None else min(int(self.start), self.k_max)
        return {"ema": np.full(n, np.nan), "rounds": np.zeros(n), "k": np.full(n, float(start))}

    def plan(self, mem):
        return mem["k"].astype(np.int64)

    def observe(self, mem, k, cost_ms, emitted, u_bar):
        acc = np.asarray(emitted, dtype=float)  # SGLang's accept length: accepted drafts + the bonus token
        mem["ema"] = np.where(np.isnan(mem["ema"]), acc, (1 - self.alpha) * mem["ema"] + self.alpha * acc)
        mem["rounds"] += 1
        due = (mem["rounds"] >= self.warmup) & ((mem["rounds"] - self.warmup) % self.every == 0)
        if not due.any():
            return
        target = mem["ema"][due] + 1
        tiers = self.tiers
        up = tiers[np.maximum(np.searchsorted(tiers - 0.5, target, side="right") - 1, 0)]
        cur = mem["k"][due]
        new = np.where(up > cur, up, np.where(target < cur - 0.5 - self.hysteresis, up, cur))
        mem["k"][due] = new


class UtilityTestAndSet(Policy):
    """Cascade-style test-and-set of K per request (arXiv 2506.20675), from its description.

    The rule alternates a *test* phase, which drafts each candidate k in ``candidates`` (clipped to
    K_max) for ``test_rounds`` rounds and measures its utility — tokens emitted per ms of round
    time — and a *set* phase of ``set_rounds`` rounds at the k of highest measured utility.
    The paper also caps the slowdown against plain decoding; without a plain-decoding arm inside
    a speculative engine, that cap is not reproduced here.
    """

    markov = False

    def __init__(self, candidates: tuple[int, ...] = (1, 2, 3, 4, 6), test_rounds: int = 2, set_rounds: int = 16):
        self.candidates, self.test_rounds, self.set_rounds = tuple(int(c) for c in candidates), int(test_rounds), \
            int(set_rounds)
        self.name = "utility test-and-set"

    def describe(self) -> str:
        return f"candidates {list(self.ks)}, test {self.test_rounds} rounds each, set {self.set_rounds} rounds"

    @property
    def ks(self) -> np.ndarray:
        return np.unique(np.clip(np.asarray(self.candidates), 1, self.k_max))

    def init_memory(self, n):
        c = len(self.ks)
        mem = {"t": np.zeros(n), "best": np.full(n, float(self.ks[0]))}
        for i in range(c):
            mem[f"tok{i}"], mem[f"ms{i}"] = np.zeros(n), np.zeros(n)
        return mem

    def _phase(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(testing (b,) bool, candidate index under test (b,))."""
        n_test = len(self.ks) * self.test_rounds
        cyc = t % (n_test + self.set_rounds)
        return cyc < n_test, np.minimum(cyc // self.test_rounds, len(self.ks) - 1).astype(np.int64)

    def plan(self, mem):
        testing, idx = self._phase(mem["t"])
        return np.where(testing, self.ks[idx], mem["best"]).astype(np.int64)

    def observe(self, mem, k, cost_ms, emitted, u_bar):
        testing, idx = self._phase(mem["t"])
        for i in range(len(self.ks)):
            sel = testing & (idx == i)
            mem[f"tok{i}"][sel] += emitted[sel]
            mem[f"ms{i}"][sel] += cost_ms[sel]
        mem["t"] += 1
        n_test = len(self.ks) * self.test_rounds
        ended = (mem["t"] % (n_test + self.set_rounds)) == n_test
        if ended.any():
            util = np.stack([mem[f"tok{i}"] / np.maximum(mem[f"ms{i}"], 1e-9) for i in range(len(self.ks))], axis=1)
            mem["best"][ended] = self.ks[np.argmax(util[ended], axis=1)]
            for i in range(len(self.ks)):
                mem[f"tok{i}"][ended] = 0.0
                mem[f"ms{i}"][ended] = 0.0


# ---------------------------------------------------------------------------
# Simulator
# ---------------------------------------------------------------------------


def draw_accept_lengths(inputs: OracleInputs, k_max: int, n_rollouts: int, seed: int = 0) -> np.ndarray:
    """(n_rollouts, n_states) greedy match lengths drawn from ``match_prob`` (0..k_max)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_rollouts, inputs.n_states), dtype=np.int16)
    mp = inputs.match_prob[:, :k_max]
    for r in range(n_rollouts):
        hit = rng.random(mp.shape) < mp
        out[r] = np.where(hit.all(axis=1), k_max, np.argmin(hit, axis=1))
    return out


def rollout(policy: Policy, accept: np.ndarray) -> pd.DataFrame:
    """Walk every sequence once per row of ``accept`` under ``policy`` (already bound).

    Returns per sequence: ``seq_id``, ``time_ms`` (mean over rollouts), ``time_se`` (its standard
    error), ``rounds`` (mean) and ``n_rollouts``.
    """
    inp, table = policy.inputs, policy.table
    cost = table.total()
    n_roll, n_seq = accept.shape[0], inp.n_sequences
    seq = np.tile(np.arange(n_seq), n_roll)
    rep = np.repeat(np.arange(n_roll), n_seq)
    pos = np.zeros(len(seq), dtype=np.int64)
    time_ms = np.zeros(len(seq))
    rounds = np.zeros(len(seq))
    live = np.arange(len(seq))
    mem = policy.init_memory(len(seq))
    n_tok = inp.n_tokens
    while live.size:
        s, p = seq[live], pos[live]
        rows = inp.offsets[s] + p
        sub = {key: val[live] for key, val in mem.items()}
        k, extra = policy.decide(rows, sub)
        a = np.minimum(k, accept[rep[live], rows])
        emitted = np.minimum(a + 1, n_tok[s] - p)
        c = cost[rows, k] + extra
        policy.observe(sub, k, c, emitted, inp.u_bar_window[rows, k])
        for key, val in sub.items():
            mem[key][live] = val
        time_ms[live] += c
        rounds[live] += 1
        pos[live] = p + emitted
        live = live[pos[live] < n_tok[s]]
    t = time_ms.reshape(n_roll, n_seq)
    return pd.DataFrame({
        "seq_id": inp.seq_ids, "time_ms": t.mean(axis=0),
        "time_se": t.std(axis=0, ddof=1) / np.sqrt(n_roll) if n_roll > 1 else np.nan,
        "rounds": rounds.reshape(n_roll, n_seq).mean(axis=0), "n_rollouts": n_roll,
    })


def evaluate_exact(policy: Policy, deterministic: bool = False) -> pd.DataFrame:
    """Exact expected time per sequence of a state-only policy (the Oracle's policy evaluation)."""
    k, extra = policy.actions()
    return evaluate_policy(policy.inputs, policy.table.model, actions=k, k_max=policy.k_max,
                           deterministic=deterministic, extra_cost=extra)


# ---------------------------------------------------------------------------
# Training: what the online rules learn from the training sequences
# ---------------------------------------------------------------------------


def fit_calibration(inputs: OracleInputs, k_max: int) -> IsotonicRegression:
    """Monotone map draft confidence -> P(draft step matches | chain matched so far).

    Fitted on the observed greedy match lengths (``accept_len``), the way a running system sees
    its own rounds: the steps each state's round tested (:func:`~speclimits.oracle.calibration.reached_steps`).
    """
    reached, matched = reached_steps(inputs, k_max)
    return fit_isotonic(inputs.draft_conf[:, :k_max][reached], matched[reached])


def mean_u_bar(inputs: OracleInputs, k_max: int, rounds: pd.DataFrame | None = None) -> np.ndarray:
    """(k_max + 2,) mean Ū per m (index m; index 0 unused).

    From the decode rounds of the trace's K sweep where it has that m (what the engine
    measured), else from the Oracle rows' windows of the given inputs.
    """
    out = np.full(k_max + 2, np.nan)
    out[1:] = inputs.u_bar_window[:, : k_max + 1].mean(axis=0)
    if rounds is not None and len(rounds):
        dec = rounds[(rounds["phase"].astype(str) == "decode") & np.isfinite(rounds["u_bar"])]
        by_m = dec.groupby("m")["u_bar"].mean()
        for m, v in by_m.items():
            if 1 <= int(m) <= k_max + 1:
                out[int(m)] = float(v)
    out[0] = out[1]
    return out


def tune_threshold(inputs: OracleInputs, table: CostTable, grid: np.ndarray | None = None,
                   deterministic: bool = False) -> tuple[float, pd.DataFrame]:
    """τ minimizing the exact expected time on ``inputs`` (the training sequences) over ``grid``
    (``deterministic``: the replayed greedy outcomes ``accept_len`` instead of ``match_prob``)."""
    grid = np.unique(np.concatenate([np.geomspace(1e-3, 0.98, 36), [0.0, 1.0]])) if grid is None else grid
    rows = []
    for tau in grid:
        pol = ConfidenceThreshold(tau).bind(inputs, table)
        rows.append((float(tau), float(evaluate_exact(pol, deterministic)["time_ms"].sum())))
    curve = pd.DataFrame(rows, columns=["tau", "train_time_ms"])
    return float(curve.loc[curve["train_time_ms"].idxmin(), "tau"]), curve


# ---------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyComparison:
    """Policies on the held-out sequences, against the Oracle bound.

    ``table`` columns: ``policy``, ``detail``, ``evaluation`` (exact / rollouts), ``time_ms`` (total
    expected over held-out sequences), ``time_se`` (Monte Carlo s.e.; 0 when exact),
    ``tokens_per_round``, ``speedup`` (vs autoregressive; NaN when m = 1 is missing),
    ``vs_best_static`` (best static K time / time), ``gain_captured`` (share of the Oracle's gain
    over the best static K in hindsight: (T_static - T) / (T_static - T_oracle)).
    """

    table: pd.DataFrame
    train_seq_ids: list[str]
    test_seq_ids: list[str]
    tau: float
    tau_curve: pd.DataFrame
    lambda0: float
    u_bar_mean: np.ndarray
    best_static_k_test: int
    best_static_k_train: int
    autoregressive_ms: float | None
    n_rollouts: int
    per_sequence: pd.DataFrame = field(repr=False)
    notes: list[str] = field(default_factory=list)


def compare_policies(inputs: OracleInputs, cost_model: CostModel, k_max: int | None = None,
                     test_share: float = 0.5, seed: int = 0, n_rollouts: int = 64,
                     rounds: pd.DataFrame | None = None, prior_tokens: float = 32.0,
                     progress: bool = False) -> PolicyComparison:
    """Tune the online rules on training sequences and measure everything on held-out ones.

    Parameters
    ----------
    inputs, cost_model : the Oracle inputs and cost model (m = 2..k_max + 1 needed; m = 1 for speedups).
    test_share, seed : the split by ``seq_id``.
    n_rollouts : Monte Carlo rollouts per held-out sequence for the policies with memory.
    rounds : the trace's rounds table, for Û = mean Ū per m (else the training windows' means).
    """
    k_max = inputs.k_list if k_max is None else int(k_max)
    train_idx, test_idx = split_sequences(inputs, test_share, seed)
    train, test = inputs.subset(train_idx), inputs.subset(test_idx)
    t_train, t_test = CostTable.build(train, cost_model, k_max), CostTable.build(test, cost_model, k_max)
    oracle_train = solve(train, cost_model, k_max=k_max)
    oracle_test = solve(test, cost_model, k_max=k_max)
    lambda0 = oracle_train.ms_per_token
    u_mean = mean_u_bar(train, k_max, rounds)
    calib = fit_calibration(train, k_max)
    tau, tau_curve = tune_threshold(train, t_train)
    k_train = oracle_train.bounds.best_static_k

    policies: list[tuple[Policy, str]] = [(StaticK(k), "exact") for k in range(1, k_max + 1)]
    policies += [
        (ConfidenceThreshold(tau), "exact"),
        (DeltaRule(lambda0, u_mean, calib, "mean", running_lambda=False, prior_tokens=prior_tokens,
                   name="Delta rule, fixed λ"), "exact"),
        (DeltaRule(lambda0, u_mean, calib, "mean", running_lambda=False, prior_tokens=prior_tokens,
                   stop="greedy", name="Delta rule, greedy stop, fixed λ"), "exact"),
        (DeltaRule(lambda0, u_mean, calib, "mean", running_lambda=True, prior_tokens=prior_tokens,
                   name="Delta rule, running λ"), "rollouts"),
        (DeltaRule(lambda0, u_mean, calib, "previous", running_lambda=True, prior_tokens=prior_tokens,
                   name="Delta rule, running λ, Ū of previous round"), "rollouts"),
        (DeltaRule(lambda0, u_mean, None, "mean", running_lambda=True, prior_tokens=prior_tokens,
                   name="Delta rule, running λ, raw confidence"), "rollouts"),
        (ConfidenceThreshold(tau), "rollouts"),
        (EmaAcceptedLength(), "rollouts"),
        (UtilityTestAndSet(), "rollouts"),
    ]
    accept = draw_accept_lengths(test, k_max, n_rollouts, seed=seed + 1)
    per_seq = pd.DataFrame({"seq_id": test.seq_ids})
    rows = []
    it = tqdm(policies, desc="policies", disable=not progress)
    for pol, how in it:
        pol.bind(test, t_test)
        ev = evaluate_exact(pol) if how == "exact" else rollout(pol, accept)
        label = pol.name + (" (rollouts)" if how == "rollouts" and pol.markov else "")
        per_seq[label] = ev["time_ms"].to_numpy()
        se = 0.0 if how == "exact" else float(np.sqrt((ev["time_se"] ** 2).sum()))
        rows.append(dict(policy=label, detail=pol.describe(), evaluation=how, time_ms=float(ev["time_ms"].sum()),
                         time_se=se, tokens_per_round=float(test.n_tokens.sum() / ev["rounds"].sum())))
    per_seq["Oracle"] = oracle_test.per_sequence["value_ms"].to_numpy()
    bd = oracle_test.bounds
    rows.append(dict(policy="Oracle (bound)", detail=f"K_max = {k_max}, knows match_prob and counterfactual Ū",
                     evaluation="exact", time_ms=bd.oracle_ms, time_se=0.0, tokens_per_round=bd.tokens_per_round))
    table = pd.DataFrame(rows)
    best_static = bd.best_static_ms
    static_train_label = f"static K = {k_train}"
    table.loc[table["policy"] == static_train_label, "detail"] = "best static K on the training sequences"
    ar = bd.autoregressive_ms
    table["speedup"] = np.nan if ar is None else ar / table["time_ms"]
    table["vs_best_static"] = best_static / table["time_ms"]
    gap = best_static - bd.oracle_ms
    table["gain_captured"] = (best_static - table["time_ms"]) / gap if gap > 0 else np.nan
    notes = []
    if ar is None:
        notes.append(f"speedup vs autoregressive unavailable: {bd.autoregressive_note}")
    return PolicyComparison(
        table=table, train_seq_ids=[str(s) for s in train.seq_ids], test_seq_ids=[str(s) for s in test.seq_ids],
        tau=tau, tau_curve=tau_curve, lambda0=lambda0, u_bar_mean=u_mean, best_static_k_test=bd.best_static_k,
        best_static_k_train=k_train, autoregressive_ms=ar, n_rollouts=n_rollouts, per_sequence=per_seq,
        notes=notes)
