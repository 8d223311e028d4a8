"""The offline harness of the online policies (beyond the paper): evaluation on Oracle inputs, and fitting.

The policy objects are those the vLLM worker runs (:mod:`speclimits.control.rules`), and every round is
decided by the engine's own :class:`~speclimits.control.driver.RoundDriver`, with the engine's observation
timing (a round's outcome reaches a rule with memory one round late, :meth:`RoundDriver.verified
<speclimits.control.driver.RoundDriver.verified>`). Rounds are priced by the same simulator as
the Oracle: round cost C(n, k) from the cost model with the *true* window Ū, acceptance drawn from
``match_prob`` (``P(a >= j) = prod_{i<j} match_prob[i]``), on held-out sequences (split by ``seq_id``).

Policies whose action depends only on the state (static K, the confidence threshold, the Delta rule with
a fixed λ and mean Ū) are evaluated exactly with the Oracle's policy evaluation; policies with memory by
Monte Carlo rollouts: per rollout one greedy match length is drawn for every state, so walking a sequence
visits each state at most once (for a state-only policy the rollout mean is unbiased for the exact value),
and every policy sees the same draws (common random numbers). A rule that drafts step k + 1 and then
keeps k pays the dropped step (``a`` ms; the greedy Delta rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.control.driver import RoundDriver
from speclimits.control.rules import Policy
from speclimits.errors import SpeclimitsError
from speclimits.oracle.calibration import fit_isotonic, reached_steps
from speclimits.oracle.inputs import OracleInputs
from speclimits.oracle.solver import evaluate_policy


def split_sequences(inputs: OracleInputs, test_share: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of sequence indices into (train, test) by ``seq_id``; both non-empty."""
    if inputs.n_sequences < 2:
        raise SpeclimitsError("a train/test split needs at least 2 reference sequences")
    perm = np.random.default_rng(seed).permutation(inputs.n_sequences)
    n_test = int(np.clip(round(test_share * inputs.n_sequences), 1, inputs.n_sequences - 1))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


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
    """A rule without memory at every state of the bound inputs, each state's round run alone through the
    round driver on its recorded confidences: ``(k (n,), extra draft ms (n,))`` (``a`` ms per dropped step)."""
    if not policy.markov:
        raise TypeError(f"{policy.name} has memory: evaluate it with rollouts")
    k_max, n = policy.k_max, policy.inputs.n_states
    conf = policy.inputs.draft_conf[:, :k_max].tolist()
    run = RoundDriver(policy).run_round
    keep, drafted = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i in range(n):
        k, drafted[i] = run(["state"], [conf[i]], k_max)
        keep[i] = k[0]
    return keep, (drafted - keep) * policy.model.a


def walk(driver: RoundDriver, rid: Any, seq: int, accept: np.ndarray, conf: list[list[float]], cost: np.ndarray,
         visit: Any = None) -> tuple[float, int]:
    """Walk sequence ``seq`` of the driver's bound policy's inputs once, as the engine runs a request at batch
    1 (as request ``rid``): ``accept`` (per state) the greedy match length, a round priced ``cost[state, k]``
    plus its dropped draft steps (``a`` ms each), its outcome observed one round late (as in the engine)
    with the window's Ū; ``visit(state, k)`` per round. Returns the sequence's time (ms) and rounds."""
    pol = driver.policy
    inp, k_max, a_ms = pol.inputs, pol.k_max, pol.model.a
    off, n = int(inp.offsets[seq]), int(inp.n_tokens[seq])
    pos, time_ms, rounds = 0, 0.0, 0
    while pos < n:
        row = off + pos
        (k,), drafted = driver.run_round([rid], [conf[row]], k_max)
        emitted = min(min(k, int(accept[row])) + 1, n - pos)
        c = cost[row, k] + (drafted - k) * a_ms
        driver.verified([rid], [k], [c], [pos], [inp.u_bar_window[row, k]])
        if visit is not None:
            visit(row, k)
        time_ms += c
        rounds += 1
        pos += emitted
    return time_ms, rounds


def rollout(policy: Policy, accept: np.ndarray) -> pd.DataFrame:
    """Walk every sequence of the bound ``policy`` once per row of ``accept`` (:func:`walk`, each sequence a
    request with its own memory). Per sequence: ``seq_id``, ``time_ms`` (mean over rollouts), ``time_se``
    (its standard error), ``rounds`` (mean) and ``n_rollouts``."""
    inp = policy.inputs
    cost, conf = policy.table.total(), inp.draft_conf[:, : policy.k_max].tolist()
    n_roll, n_seq = accept.shape[0], inp.n_sequences
    t, rounds = np.zeros((n_roll, n_seq)), np.zeros((n_roll, n_seq))
    driver = RoundDriver(policy)
    for r in range(n_roll):
        for s in range(n_seq):
            t[r, s], rounds[r, s] = walk(driver, (r, s), s, accept[r], conf, cost)
        driver.release([(r, s) for s in range(n_seq)])
    return pd.DataFrame({"seq_id": inp.seq_ids, "time_ms": t.mean(axis=0),
                         "time_se": t.std(axis=0, ddof=1) / np.sqrt(n_roll) if n_roll > 1 else np.nan,
                         "rounds": rounds.mean(axis=0), "n_rollouts": n_roll})


def evaluate_exact(policy: Policy, deterministic: bool = False) -> pd.DataFrame:
    """Exact expected time per sequence of a state-only policy (the Oracle's policy evaluation)."""
    k, extra = state_actions(policy)
    return evaluate_policy(policy.inputs, policy.table.model, actions=k, k_max=policy.k_max,
                           deterministic=deterministic, extra_cost=extra)


def fit_calibration(inputs: OracleInputs, k_max: int) -> IsotonicRegression:
    """Monotone map draft confidence -> P(draft step matches | chain matched so far), fitted on the observed
    greedy match lengths as a running system sees its rounds: the steps each state's round tested
    (:func:`~speclimits.oracle.calibration.reached_steps`)."""
    reached, matched = reached_steps(inputs, k_max)
    return fit_isotonic(inputs.draft_conf[:, :k_max][reached], matched[reached])


def mean_u_bar(inputs: OracleInputs, k_max: int, rounds: pd.DataFrame | None = None) -> np.ndarray:
    """(k_max + 2,) mean Ū per m (index m; index 0 = index 1): from the decode rounds of the trace's K sweep
    where it has that m (what the engine measured), else from the Oracle rows' windows of ``inputs``."""
    out = np.full(k_max + 2, np.nan)
    out[1:] = inputs.u_bar_window[:, : k_max + 1].mean(axis=0)
    if rounds is not None and len(rounds):
        dec = rounds[(rounds["phase"].astype(str) == "decode") & np.isfinite(rounds["u_bar"])]
        for m, v in dec.groupby("m")["u_bar"].mean().items():
            if 1 <= int(m) <= k_max + 1:
                out[int(m)] = float(v)
    out[0] = out[1]
    return out
