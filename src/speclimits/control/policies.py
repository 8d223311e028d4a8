"""The offline harness of the online policies (beyond the paper): evaluation on Oracle inputs, and fitting.

The policy objects are those of :mod:`speclimits.control.rules` (numpy alone), which the vLLM worker
(:mod:`speclimits.control.extension`) runs too, and every round is decided by the engine's own
:class:`~speclimits.control.driver.RoundDriver`: one decision path. This module adds what needs the
Oracle and the statistics stack. A round's outcome is observed at once here (the engine reads it one
round late, see :mod:`speclimits.control.extension`).

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

from typing import Any

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.control.driver import RoundDriver
from speclimits.control.rules import ConfidenceThreshold, Policy
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


def state_actions(policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    """A rule without memory at every state of the bound inputs: ``(k (n,), extra draft ms (n,))``, each
    state's round run alone through the engine's :class:`~speclimits.control.driver.RoundDriver` on the
    state's recorded confidences. A token drafted and then dropped costs ``a`` ms (the greedy stop)."""
    if not policy.markov:
        raise TypeError(f"{policy.name} has memory: evaluate it with rollouts")
    k_max, n = policy.k_max, policy.inputs.n_states
    conf = policy.inputs.draft_conf[:, :k_max].tolist()
    driver = RoundDriver(policy)
    keep, drafted = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    run, rid = driver.run_round, ["state"]
    for i in range(n):
        k, j = run(rid, [conf[i]], k_max)
        keep[i], drafted[i] = k[0], j
    return keep, (drafted - keep) * policy.model.a


def walk(policy: Policy, driver: RoundDriver, rid: Any, seq: int, accept: np.ndarray, conf: list[list[float]],
         cost: np.ndarray, visit: Any = None) -> tuple[float, int]:
    """Walk sequence ``seq`` of the bound inputs once as the engine runs a request at batch 1: each round
    through ``driver`` (as request ``rid``) on the state's recorded confidences, ``accept`` (per state) the
    greedy match length, the round priced ``cost[state, k]`` plus the draft steps dropped (``a`` ms each),
    its outcome observed at once (with the window's Ū). ``visit(state, k)`` is called per round. Returns the
    sequence's time (ms) and rounds."""
    inp, k_max, a_ms = policy.inputs, policy.k_max, policy.model.a
    u = inp.u_bar_window
    off, n = int(inp.offsets[seq]), int(inp.n_tokens[seq])
    pos, time_ms, rounds = 0, 0.0, 0
    rids = [rid]
    while pos < n:
        row = off + pos
        keep, drafted = driver.run_round(rids, [conf[row]], k_max)
        k = keep[0]
        emitted = min(min(k, int(accept[row])) + 1, n - pos)
        c = cost[row, k] + (drafted - k) * a_ms
        driver.observe_one(rid, k, c, emitted, u[row, k])
        if visit is not None:
            visit(row, k)
        time_ms += c
        rounds += 1
        pos += emitted
    return time_ms, rounds


def rollout(policy: Policy, accept: np.ndarray) -> pd.DataFrame:
    """Walk every sequence once per row of ``accept`` under ``policy`` (already bound; :func:`walk`: the
    engine's round driver, each sequence a request with its own memory).

    Returns per sequence: ``seq_id``, ``time_ms`` (mean over rollouts), ``time_se`` (its standard
    error), ``rounds`` (mean) and ``n_rollouts``.
    """
    inp = policy.inputs
    cost = policy.table.total()
    conf = inp.draft_conf[:, : policy.k_max].tolist()
    n_roll, n_seq = accept.shape[0], inp.n_sequences
    t, rounds = np.zeros((n_roll, n_seq)), np.zeros((n_roll, n_seq))
    driver = RoundDriver(policy)
    for r in range(n_roll):
        for s in range(n_seq):
            t[r, s], rounds[r, s] = walk(policy, driver, (r, s), s, accept[r], conf, cost)
        driver.release([(r, s) for s in range(n_seq)])
    return pd.DataFrame({
        "seq_id": inp.seq_ids, "time_ms": t.mean(axis=0),
        "time_se": t.std(axis=0, ddof=1) / np.sqrt(n_roll) if n_roll > 1 else np.nan,
        "rounds": rounds.mean(axis=0), "n_rollouts": n_roll,
    })


def evaluate_exact(policy: Policy, deterministic: bool = False) -> pd.DataFrame:
    """Exact expected time per sequence of a state-only policy (the Oracle's policy evaluation)."""
    k, extra = state_actions(policy)
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
