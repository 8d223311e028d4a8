"""Delta Space (the book's methods page, "The Oracle"): each state's candidate extensions k -> k+1 as points (ΔE[a], ΔE[Cost]).

A point is *accepted* when the Oracle's k*(n) >= k + 1 and *rejected* otherwise. If
V(n) ≈ λ·(N - n), extending pays exactly when ``ΔE[Cost] <= λ·ΔE[a]``: a straight line through
the origin whose slope is the Oracle's time per token λ. We fit the line two ways:

* through the origin: the slope s that classifies ``ΔE[Cost] <= s·ΔE[a]`` best (an exact scan
  over the sorted ratios ΔE[Cost]/ΔE[a]), with a cluster-bootstrap CI over sequences;
* a max-margin line with intercept (scikit-learn ``LinearSVC`` on standardized features).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.svm import LinearSVC
from tqdm.auto import tqdm

from speclimits.bootstrap import draw_counts, resample_indices
from speclimits.oracle.solver import OracleResult


def delta_points(result: OracleResult) -> pd.DataFrame:
    """One row per state and extension k -> k + 1 that can still add progress (k + 1 < tokens remaining).

    Columns: ``seq_id``, ``seq``, ``pos``, ``k`` (from), ``delta_accept`` (ΔE[a] = P(a >= k + 1)),
    ``delta_cost`` (C(n, k + 1) - C(n, k), ms), ``delta_q`` (Q(n, k + 1) - Q(n, k)),
    ``local_lambda`` (V(n + k + 1) - V(n + k + 2): the value of one more token at that point),
    ``accepted`` (bool: k + 1 <= k*(n)), ``boundary`` (the last accepted or first rejected extension).
    """
    inp = result.inputs
    k_lo = 0 if result.allow_k0 else 1
    ks = np.arange(k_lo, result.k_max)
    n = inp.n_states
    cost, surv = result.cost, result.survival
    rows = np.repeat(np.arange(n), len(ks))
    k = np.tile(ks, n)
    keep = k + 1 < inp.remaining[rows]
    rows, k = rows[keep], k[keep]
    seq = inp.seq_index[rows]
    # value of the successor states n + k + 1 and n + k + 2 (0 once past the end)
    v1, v2 = (np.where(p < inp.n_tokens[seq], result.value[np.minimum(inp.offsets[seq] + p, n - 1)], 0.0)
              for p in (inp.pos[rows] + k + 1, inp.pos[rows] + k + 2))
    k_star = result.k_star[rows]
    return pd.DataFrame({
        "seq_id": inp.seq_ids[seq],
        "seq": seq,
        "pos": inp.pos[rows],
        "k": k,
        "delta_accept": surv[rows, k],
        "delta_cost": cost[rows, k + 1] - cost[rows, k],
        "delta_q": result.q[rows, k + 1] - result.q[rows, k],
        "local_lambda": v1 - v2,
        "accepted": k + 1 <= k_star,
        "boundary": (k == k_star - 1) | (k == k_star),
    })


def _ratio(points: pd.DataFrame) -> np.ndarray:
    dx, dy = points["delta_accept"].to_numpy(), points["delta_cost"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        r = dy / dx
    return np.where(dx > 0, r, np.where(dy > 0, np.inf, -np.inf))


def best_slope(ratio: np.ndarray, accepted: np.ndarray) -> tuple[float, float]:
    """The through-origin slope s maximizing the share classified right by ``ratio <= s``.

    Returns ``(s, accuracy)``; s is the midpoint between the two ratios around the best cut.
    """
    order = np.argsort(ratio, kind="stable")
    r, acc = ratio[order], accepted[order].astype(np.int64)
    # cut after position i: points 0..i predicted accepted
    correct = np.concatenate([[0], np.cumsum(acc)]) + np.concatenate([[acc.size - acc.sum()],
                                                                      acc.size - acc.sum() - np.cumsum(1 - acc)])
    # only cut between distinct ratios
    distinct = np.concatenate([[True], r[1:] != r[:-1], [True]])
    correct = np.where(distinct, correct, -1)
    i = int(np.argmax(correct))
    lo = r[i - 1] if i > 0 else -np.inf
    hi = r[i] if i < r.size else np.inf
    if np.isfinite(lo) and np.isfinite(hi):
        s = 0.5 * (lo + hi)
    else:
        s = float(lo if np.isfinite(lo) else hi)
    return float(s), float(correct[i] / r.size)


@dataclass(frozen=True)
class DeltaLine:
    """The separating line of Delta Space and how it compares with λ.

    Attributes
    ----------
    slope : through-origin slope s (ms per accepted token) of the best line ``ΔE[Cost] = s·ΔE[a]``.
    slope_ci : (lo, hi) percentile cluster-bootstrap interval over sequences.
    accuracy : share of points the through-origin line classifies right.
    lambda_ : the Oracle's time per token (ms).
    accuracy_at_lambda : share classified right by the line with slope λ.
    svm_slope, svm_intercept, svm_accuracy : the max-margin line ``ΔE[Cost] = slope·ΔE[a] + intercept``.
    boundary_accuracy : accuracy of the through-origin line on the boundary points only.
    local_accuracy : share of points where ``ΔE[Cost] <= local_lambda·ΔE[a]`` matches the label.
    n_points, n_accepted, n_boot : counts.
    """

    slope: float
    slope_ci: tuple[float, float]
    accuracy: float
    lambda_: float
    accuracy_at_lambda: float
    svm_slope: float
    svm_intercept: float
    svm_accuracy: float
    boundary_accuracy: float
    local_accuracy: float
    n_points: int
    n_accepted: int
    n_boot: int

    @property
    def lambda_inside_interval(self) -> bool:
        """The testable prediction: if V(n) ≈ λ·(N − n), the separating slope equals λ, so λ should
        lie inside the slope's 95% interval."""
        return bool(self.slope_ci[0] <= self.lambda_ <= self.slope_ci[1])

    def verdict(self) -> str:
        """One sentence: does the slope equal λ within its interval?"""
        line = f"the separating slope s = {self.slope:.3f} [{self.slope_ci[0]:.3f}; {self.slope_ci[1]:.3f}] ms per token"
        if self.lambda_inside_interval:
            return f"{line} contains λ = {self.lambda_:.3f}: the prediction V(n) ≈ λ(N − n) holds here"
        return (f"{line} excludes λ = {self.lambda_:.3f} (s/λ = {self.slope / self.lambda_:.2f}): the prediction "
                "V(n) ≈ λ(N − n) does not hold as a separating line")

    def to_frame(self) -> pd.DataFrame:
        """Table (quantity, value, paper) for the book; the paper column quotes the abstract."""
        rows = [
            ("points (state x extension)", self.n_points), ("accepted share", self.n_accepted / self.n_points),
            ("through-origin slope s (ms/token)", self.slope),
            (f"95% CI of s ({self.n_boot} cluster-bootstrap resamples)", f"[{self.slope_ci[0]:.3f}; {self.slope_ci[1]:.3f}]"),
            ("share separated correctly by s", self.accuracy),
            ("share correct on boundary points", self.boundary_accuracy),
            ("Oracle time per token λ (ms)", self.lambda_), ("share separated correctly by λ", self.accuracy_at_lambda),
            ("max-margin line: slope", self.svm_slope), ("max-margin line: intercept (ms)", self.svm_intercept),
            ("max-margin line: share correct", self.svm_accuracy),
            ("share correct with the local value of a token", self.local_accuracy),
        ]
        out = pd.DataFrame(rows, columns=["quantity", "value"])
        out["paper"] = ""
        out.loc[out["quantity"] == "share separated correctly by s", "paper"] = \
            "rejected points form a strict linear boundary (no number given)"
        out.loc[out["quantity"] == "Oracle time per token λ (ms)", "paper"] = "not reported"
        return out


def fit_line(points: pd.DataFrame, lambda_: float, n_boot: int = 199, seed: int = 0,
             svm_max_points: int = 50_000, progress: bool = False) -> DeltaLine:
    """Fit the separating line of :func:`delta_points` output; see :class:`DeltaLine`."""
    if points.empty or points["accepted"].all() or not points["accepted"].any():
        raise ValueError("Delta Space needs both accepted and rejected points to fit a separating line")
    ratio = _ratio(points)
    accepted = points["accepted"].to_numpy()
    slope, accuracy = best_slope(ratio, accepted)
    rng = np.random.default_rng(seed)
    seq = points["seq"].to_numpy()
    seqs, inv = np.unique(seq, return_inverse=True)
    members = [np.flatnonzero(inv == i) for i in range(len(seqs))]
    boots = []
    picks = resample_indices(draw_counts(len(seqs), n_boot, rng))
    for pick in tqdm(picks, desc="Delta Space bootstrap", disable=not progress):
        idx = np.concatenate([members[i] for i in pick])
        if accepted[idx].all() or not accepted[idx].any():
            continue
        boots.append(best_slope(ratio[idx], accepted[idx])[0])
    ci = tuple(np.percentile(boots, [2.5, 97.5]).tolist()) if boots else (np.nan, np.nan)
    boundary = points["boundary"].to_numpy()
    b_acc = float(((ratio[boundary] <= slope) == accepted[boundary]).mean()) if boundary.any() else np.nan
    dx, dy = points["delta_accept"].to_numpy(), points["delta_cost"].to_numpy()
    local = float(((dy <= points["local_lambda"].to_numpy() * dx) == accepted).mean())
    # max-margin line with intercept, on a seeded sample when large
    sub = rng.choice(len(points), min(len(points), svm_max_points), replace=False)
    x = np.column_stack([dx[sub], dy[sub]])
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd[sd == 0] = 1.0
    svm = LinearSVC(C=1.0, max_iter=20_000).fit((x - mu) / sd, accepted[sub])
    (wx, wy), b0 = svm.coef_[0], svm.intercept_[0]
    svm_slope = float(-(sd[1] * wx) / (wy * sd[0])) if wy != 0 else np.nan
    svm_icpt = float(mu[1] - sd[1] / wy * (b0 - wx * mu[0] / sd[0])) if wy != 0 else np.nan
    svm_acc = float((svm.predict((np.column_stack([dx, dy]) - mu) / sd) == accepted).mean())
    return DeltaLine(
        slope=slope, slope_ci=(float(ci[0]), float(ci[1])), accuracy=accuracy, lambda_=float(lambda_),
        accuracy_at_lambda=float(((ratio <= lambda_) == accepted).mean()), svm_slope=svm_slope,
        svm_intercept=svm_icpt, svm_accuracy=svm_acc, boundary_accuracy=b_acc, local_accuracy=local,
        n_points=int(len(points)), n_accepted=int(accepted.sum()), n_boot=len(boots))


@dataclass(frozen=True)
class DeltaSpace:
    """Points and the fitted line (see :func:`delta_space`)."""

    points: pd.DataFrame
    line: DeltaLine


def delta_space(result: OracleResult, n_boot: int = 199, seed: int = 0, progress: bool = False) -> DeltaSpace:
    """Delta Space of a solved Oracle: its points and separating line, λ = the Oracle's ms per token."""
    points = delta_points(result)
    return DeltaSpace(points, fit_line(points, result.ms_per_token, n_boot=n_boot, seed=seed, progress=progress))
