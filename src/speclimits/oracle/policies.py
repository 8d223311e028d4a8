"""Online policies measured against the Oracle bound (beyond the paper).

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
# Policies: vectorized over a batch of live rollouts
# ---------------------------------------------------------------------------


class Policy:
    """Base class. ``decide`` maps a batch of states to actions; ``observe`` updates memory.

    ``rows`` index the states of the inputs the policy was ``bind``-ed to; ``mem`` is a dict of
    (batch,) arrays owned by the policy (created by ``init_memory``).
    """

    name = "policy"
    markov = True

    def bind(self, inputs: OracleInputs, table: CostTable) -> "Policy":
        self.inputs, self.table = inputs, table
        self.k_max = table.k_max
        return self

    def init_memory(self, n: int) -> dict[str, np.ndarray]:
        return {}

    def decide(self, rows: np.ndarray, mem: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(k (b,), extra draft ms (b,))."""
        raise NotImplementedError

    def observe(self, mem: dict[str, np.ndarray], rows: np.ndarray, k: np.ndarray, cost_ms: np.ndarray,
                emitted: np.ndarray) -> None:
        return None

    def actions(self) -> tuple[np.ndarray, np.ndarray]:
        """Markov policies: (k, extra ms) for every state of the bound inputs."""
        if not self.markov:
            raise TypeError(f"{self.name} has memory: evaluate it with rollouts")
        rows = np.arange(self.inputs.n_states)
        return self.decide(rows, self.init_memory(len(rows)))

    def describe(self) -> str:
        return ""


class StaticK(Policy):
    """Always draft k tokens."""

    def __init__(self, k: int):
        self.k = int(k)
        self.name = f"static K = {self.k}"

    def decide(self, rows, mem):
        return np.full(len(rows), self.k), np.zeros(len(rows))


class FixedActions(Policy):
    """A given action per state (e.g. the Oracle's k*)."""

    def __init__(self, k: np.ndarray, name: str = "fixed"):
        self.k, self.name = np.asarray(k, dtype=np.int64), name

    def decide(self, rows, mem):
        return self.k[rows], np.zeros(len(rows))


class ConfidenceThreshold(Policy):
    """Draft while the cumulative draft confidence ``prod_{i<=j} conf_i`` stays >= τ (SpecDec++ /
    DISCO-style); the token at which it falls below τ is kept (at least 1, at most K_max)."""

    def __init__(self, tau: float):
        self.tau = float(tau)
        self.name = "confidence threshold"

    def decide(self, rows, mem):
        cum = np.cumprod(self.inputs.draft_conf[rows, : self.k_max], axis=1)
        count = (cum >= self.tau).sum(axis=1)  # cumulative product is non-increasing: a prefix
        return np.minimum(count + 1, self.k_max), np.zeros(len(rows))

    def describe(self) -> str:
        return f"τ = {self.tau:.3g}"


class DeltaRule(Policy):
    """The Delta-Space rule online, with the Oracle's value replaced by ``V(n) ≈ λ·(N - n)``.

    Per round the rule scores ``Q̂(k) = Ĉ(k) - λ·Ê[a](k)`` with ``Ê[a](k) = sum_{j<=k} prod_{i<=j} p_i``
    (p the draft confidence, optionally calibrated by a monotone map fitted on training rounds)
    and ``Ĉ(k) = a·k + b + beta0(k+1) + alpha(k+1)·Û(k+1)`` (the context term cancels), with Û from
    ``u_bar_mean[m]`` (``u_pred="mean"``) or the previous round's observed Ū rescaled by
    ``u_bar_mean[m] / u_bar_mean[m_prev]`` (``"previous"``). λ is fixed at ``lambda0`` or running:
    ``(w·λ0 + elapsed ms) / (w + emitted tokens)`` within a sequence.

    ``stop="lookahead"`` (default): after drafting j tokens the rule drafts step j + 1 only if
    the best k >= j under Q̂ — the confidences of steps not drafted yet extrapolated from the
    last one — is longer than j; so it never drafts a token it discards, and it can pass a
    non-convex stretch of Ĉ (the m = 4/5 regime change). ``stop="greedy"``: extend k -> k+1
    while ``ΔĈ <= λ·ΔÊ[a]`` (the Delta-Space necessary condition, first failure stops); it has
    to draft step k + 1 to see its confidence, so a stop before K_max costs one draft step (``a`` ms).
    """

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

    def bind(self, inputs, table):
        super().bind(inputs, table)
        if len(self.u_bar_mean) < self.k_max + 2:
            raise SpeclimitsError(f"u_bar_mean needs entries for m = 1..{self.k_max + 1}")
        conf = inputs.draft_conf[:, : self.k_max]
        if self.calibration is not None:
            conf = self.calibration.predict(conf.ravel()).reshape(conf.shape)
        self._conf = conf
        # Ĉ(k) = fixed[k] + alpha(k + 1)·Û(k + 1): the cost model's round cost without c·L, which
        # is the same for every k and so cannot change a decision
        self._fixed, self._alpha = table.fixed, table.slope
        return self

    def init_memory(self, n):
        return {"elapsed": np.zeros(n), "emitted": np.zeros(n), "u_prev": np.full(n, np.nan),
                "m_prev": np.zeros(n, dtype=np.int64)}

    def _c_hat(self, mem, b):
        ms = np.arange(1, self.k_max + 2)
        u_hat = np.broadcast_to(self.u_bar_mean[ms], (b, len(ms))).copy()
        if self.u_pred == "previous":
            seen = np.isfinite(mem["u_prev"])
            scale = mem["u_prev"][seen] / self.u_bar_mean[mem["m_prev"][seen]]
            u_hat[seen] = self.u_bar_mean[ms][None, :] * scale[:, None]
        return self._fixed[None, :] + self._alpha[None, :] * u_hat  # (b, k_max + 1), k = 0..k_max

    def decide(self, rows, mem):
        b, kk = len(rows), self.k_max
        c_hat = self._c_hat(mem, b)
        lam = np.full(b, self.lambda0) if not self.running_lambda else \
            (self.prior_tokens * self.lambda0 + mem["elapsed"]) / (self.prior_tokens + mem["emitted"])
        conf = self._conf[rows]
        if self.stop == "greedy":
            gain = np.cumprod(conf, axis=1)  # column k: ΔÊ[a] of k -> k+1
            ok = np.diff(c_hat, axis=1) <= lam[:, None] * gain
            ok[:, 0] = True  # k >= 1 always
            stop = np.where((~ok).any(axis=1), np.argmax(~ok, axis=1), kk)
            return stop, np.where(stop < kk, self.table.model.a, 0.0)
        k = np.full(b, kk)
        undecided = np.ones(b, dtype=bool)
        steps = np.arange(1, kk + 1)
        for j in range(1, kk):
            # confidences known for steps 1..j; later ones extrapolated from step j
            p = np.where(steps[None, :] <= j, conf, conf[:, j - 1: j])
            e_a = np.concatenate([np.zeros((b, 1)), np.cumsum(np.cumprod(p, axis=1), axis=1)], axis=1)
            q_hat = c_hat - lam[:, None] * e_a
            stop_here = undecided & (np.argmin(q_hat[:, j:], axis=1) == 0)
            k[stop_here] = j
            undecided &= ~stop_here
            if not undecided.any():
                break
        return k, np.zeros(b)

    def observe(self, mem, rows, k, cost_ms, emitted):
        mem["elapsed"] += cost_ms
        mem["emitted"] += emitted
        mem["u_prev"] = self.inputs.u_bar_window[rows, k]
        mem["m_prev"] = k + 1


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
        policy.observe(sub, rows, k, c, emitted)
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


def tune_threshold(inputs: OracleInputs, table: CostTable, grid: np.ndarray | None = None
                   ) -> tuple[float, pd.DataFrame]:
    """τ minimizing the exact expected time on ``inputs`` (the training sequences) over ``grid``."""
    grid = np.unique(np.concatenate([np.geomspace(1e-3, 0.98, 36), [0.0, 1.0]])) if grid is None else grid
    rows = []
    for tau in grid:
        pol = ConfidenceThreshold(tau).bind(inputs, table)
        rows.append((float(tau), float(evaluate_exact(pol)["time_ms"].sum())))
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
