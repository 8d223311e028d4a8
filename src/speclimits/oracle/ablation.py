"""The α = 0 ablation (the book's methods page; appendix, cases C1-C4).

Zero the expert coefficient alpha(m), re-solve the whole DP, and compare the policies: how k*
moves, what the α = 0 policy costs when priced under the full cost model, and the states where
``Q⁰(k* + 1) - Q⁰(k*) < 0`` (Q⁰ the Q table of the re-solved α = 0 problem, k* the full
Oracle's choice): there, everything but the expert term favours a longer draft, so the expert
term alone sets the boundary. The paper shows four such cases with added-token match
probability 84.18%-98.45%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from speclimits.oracle.solver import OracleResult, evaluate_policy, solve



@dataclass(frozen=True)
class AlphaAblation:
    """Full Oracle vs the α = 0 re-solve.

    Attributes
    ----------
    full, zero : the two :class:`OracleResult` (same options, alpha scale 1 and 0).
    repriced_ms : total time of the α = 0 policy under the full cost model (>= ``full`` Oracle time).
    moves : direction of the k* change (``longer``, ``same``, ``shorter`` without α): states and share.
    transitions : long table ``k_star``, ``k_star_alpha0``, ``n_states``.
    cases : states with ``Q⁰(k*+1) - Q⁰(k*) < 0``: ``seq_id``, ``pos``, ``k_star``, ``k_star_alpha0``,
        ``boundary`` ("k*->k*+1"), ``q0_diff`` (ms), ``q_diff`` (full, ms), ``match_prob_added``
        (conditional match probability of draft k*+1), ``p_reach_added`` (P(a >= k*+1)),
        ``expert_ms_added`` (alpha·ΔŪ of the extension under the full model).
    """

    full: OracleResult
    zero: OracleResult
    repriced_ms: float
    moves: pd.DataFrame
    transitions: pd.DataFrame
    cases: pd.DataFrame

    @property
    def repriced_loss(self) -> float:
        """Relative slowdown of the α = 0 policy under the full cost (0.01 = 1% slower than the Oracle)."""
        return self.repriced_ms / self.full.bounds.oracle_ms - 1.0

    def case_summary(self) -> pd.DataFrame:
        """Cases by boundary: count, share of states, match-probability range and median."""
        c = self.cases
        if c.empty:
            return pd.DataFrame(columns=["boundary", "n_cases", "share_of_states", "match_prob_min",
                                         "match_prob_median", "match_prob_max"])
        g = c.groupby("boundary", sort=False)["match_prob_added"]
        out = pd.DataFrame({"n_cases": g.size(), "match_prob_min": g.min(), "match_prob_median": g.median(),
                            "match_prob_max": g.max()}).reset_index()
        out.insert(2, "share_of_states", out["n_cases"] / self.full.inputs.n_states)
        order = out["boundary"].str.split("->").str[0].astype(int)
        return out.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)


def alpha_ablation(full: OracleResult, draft_prob: np.ndarray | None = None) -> AlphaAblation:
    """Re-solve ``full``'s problem with alpha = 0 and compare (see :class:`AlphaAblation`).

    ``draft_prob`` : (n, K_list) the draft's own probability of each reference token, as recorded
    (``OracleSetup.raw_inputs.match_prob``). The appendix's "added-token match probability" of its
    cases is that probability, so it is reported from ``draft_prob`` when given, even when the
    Oracle solved a calibrated surrogate (default: the probabilities ``full`` solved with).
    """
    zero = solve(full.inputs, full.cost_model, k_max=full.k_max, allow_k0=full.allow_k0,
                 deterministic=full.deterministic, alpha_scale=0.0)
    repriced = float(evaluate_policy(full, actions=zero.k_star)["time_ms"].sum())
    k1, k0 = full.k_star, zero.k_star
    n = len(k1)
    direction = np.where(k0 > k1, "longer", np.where(k0 < k1, "shorter", "same"))
    moves = pd.DataFrame({"direction": ["longer", "same", "shorter"]})
    moves["n_states"] = [int((direction == d).sum()) for d in moves["direction"]]
    moves["share"] = moves["n_states"] / n
    moves["mean_step"] = [float(np.abs(k0 - k1)[direction == d].mean()) if (direction == d).any() else 0.0
                          for d in moves["direction"]]
    trans = pd.DataFrame({"k_star": k1, "k_star_alpha0": k0}).value_counts().rename("n_states").reset_index()
    trans = trans.sort_values(["k_star", "k_star_alpha0"]).reset_index(drop=True)
    # cases: Q0(k*+1) - Q0(k*) < 0 with an extension that can still add progress
    inp = full.inputs
    rows = np.flatnonzero((k1 < full.k_max) & (k1 + 1 < inp.remaining))
    kk = k1[rows]
    q0_diff = zero.q[rows, kk + 1] - zero.q[rows, kk]
    sel = q0_diff < 0
    rows, kk, q0_diff = rows[sel], kk[sel], q0_diff[sel]
    costs = full.costs
    u = inp.u_bar_window
    expert_added = costs.alpha[kk + 2] * u[rows, kk + 1] - costs.alpha[kk + 1] * u[rows, kk]
    if draft_prob is not None:
        p_added = np.asarray(draft_prob, dtype=float)[rows, kk]
    elif full.deterministic:
        p_added = (inp.accept_len[rows] >= kk + 1).astype(float)
    else:
        p_added = inp.match_prob[rows, kk]
    cases = pd.DataFrame({
        "seq_id": inp.seq_ids[inp.seq_index[rows]], "pos": inp.pos[rows], "k_star": kk, "k_star_alpha0": k0[rows],
        "boundary": [f"{a}->{a + 1}" for a in kk], "q0_diff": q0_diff,
        "q_diff": full.q[rows, kk + 1] - full.q[rows, kk], "match_prob_added": p_added,
        "p_reach_added": full.survival[rows, kk], "expert_ms_added": expert_added,
    })
    if inp.category is not None:
        cases["category"] = inp.category[inp.seq_index[rows]]
    return AlphaAblation(full, zero, repriced, moves, trans, cases)
