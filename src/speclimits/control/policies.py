"""The offline harness of the online policies (beyond the paper): evaluation on Oracle inputs, and fitting.

The policy objects are those of :mod:`speclimits.control.rules` (numpy alone), which the vLLM worker
(:mod:`speclimits.control.extension`) runs too; see :class:`~speclimits.control.rules.Policy` for the
interface both harnesses drive. This module adds what needs the Oracle and the statistics stack.

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

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.control.rules import (ConfidenceThreshold, DeltaRule, EmaAcceptedLength, FixedActions, Policy,
                                      StaticK, UtilityTestAndSet)
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.calibration import fit_isotonic, reached_steps
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.solver import evaluate_policy


def split_sequences(inputs: OracleInputs, test_share: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of sequence indices into (train, test) by ``seq_id``; both non-empty."""
    if inputs.n_sequences < 2:
        raise SpeclimitsError("a train/test split needs at least 2 reference sequences")
    perm = np.random.default_rng(seed).permutation(inputs.n_sequences)
    n_test = int(np.clip(round(test_share * inputs.n_sequences), 1, inputs.n_sequences - 1))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


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
