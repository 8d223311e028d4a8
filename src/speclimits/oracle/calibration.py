"""Is the draft's probability of the reference token a calibrated surrogate for acceptance?

``match_prob`` is the Oracle's chance that draft step i matches given the chain so far; under greedy
verification the outcome is observed too (step i matched iff ``accept_len >= i``). A small trained head
can be far from calibrated, and then the "bound" understates greedy speculation. :func:`calibration_table`
and :func:`gap_interval` measure the gap; :func:`cross_fitted_match_prob` replaces ``match_prob`` by
per-position isotonic maps fitted on other sequences, keeping the draft's ranking at each position.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.oracle.inputs import OracleInputs


def reached_steps(inputs: OracleInputs, k_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(reached, matched)``, (n, k_max) bool: draft step ``i`` (0-based) of a state was tested by a
    greedy round (``accept_len >= i``, within ``k_max``, ``i < N - pos - 1``) and matched (``accept_len >= i + 1``)."""
    k = inputs.match_prob.shape[1] if k_max is None else int(k_max)
    acc = inputs.accept_len[:, None]
    steps = np.arange(k)[None, :]
    reached = (acc >= steps) & (steps < inputs.remaining[:, None] - 1)
    return reached, np.broadcast_to(acc >= steps + 1, reached.shape)


def fit_isotonic(probability: np.ndarray, matched: np.ndarray) -> IsotonicRegression:
    """The one monotone calibration map used everywhere: observed match (0/1) on a probability,
    clipped to [0, 1] (scikit-learn's isotonic regression)."""
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip", increasing=True)
    return iso.fit(np.asarray(probability, dtype=float), np.asarray(matched, dtype=float))


def _reached(inputs: OracleInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled (position index i 0-based, match_prob, matched) over reached draft steps."""
    reached, matched = reached_steps(inputs)
    i = np.broadcast_to(np.arange(reached.shape[1])[None, :], reached.shape)[reached]
    return i, inputs.match_prob[reached], matched[reached]


def calibration_table(inputs: OracleInputs, max_position: int = 6) -> pd.DataFrame:
    """Per draft position: states whose chain reached it, mean ``match_prob``, mean ``draft_conf``
    and the observed greedy match rate, plus the Brier score of ``match_prob``."""
    i, p, hit = _reached(inputs)
    k = inputs.match_prob.shape[1]
    conf = inputs.draft_conf
    acc = inputs.accept_len[:, None]
    rows = []
    for pos in range(min(k, max_position)):
        sel = i == pos
        if not sel.any():
            continue
        reach_conf = conf[:, pos][acc[:, 0] >= pos]
        rows.append({"position": pos + 1, "states": int(sel.sum()), "mean_match_prob": float(p[sel].mean()),
                     "mean_draft_conf": float(reach_conf.mean()), "observed_match_rate": float(hit[sel].mean()),
                     "brier": float(np.mean((p[sel] - hit[sel]) ** 2))})
    return pd.DataFrame(rows).set_index("position")


def calibration_gap(inputs: OracleInputs) -> float:
    """Observed greedy match rate minus mean ``match_prob``, pooled over reached draft steps."""
    _, p, hit = _reached(inputs)
    return float(hit.mean() - p.mean()) if p.size else 0.0


def gap_interval(inputs: OracleInputs, n_boot: int = 199, seed: int = 0) -> tuple[float, float, float]:
    """``(gap, lo, hi)``: :func:`calibration_gap` with a 95% bootstrap interval over sequences."""
    reached, matched = reached_steps(inputs)
    seq = inputs.seq_index
    hits = np.bincount(seq, weights=(reached & matched).sum(axis=1), minlength=inputs.n_sequences)
    probs = np.bincount(seq, weights=np.where(reached, inputs.match_prob, 0.0).sum(axis=1),
                        minlength=inputs.n_sequences)
    counts = np.bincount(seq, weights=reached.sum(axis=1), minlength=inputs.n_sequences)
    gap = (hits.sum() - probs.sum()) / counts.sum() if counts.sum() else 0.0
    w = draw_counts(inputs.n_sequences, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (w @ hits - w @ probs) / (w @ counts)
    lo, hi = percentile_interval(reps)
    return float(gap), lo, hi


def cross_fitted_match_prob(inputs: OracleInputs, n_folds: int = 5, seed: int = 0,
                            min_steps: int = 100) -> OracleInputs:
    """Inputs whose ``match_prob`` is recalibrated per draft position, cross-fitted by sequence: each of
    ``n_folds`` seeded folds of sequences gets maps fitted on the other folds only. Each position has its
    own isotonic map (:func:`fit_isotonic`) on the steps greedy rounds tested there; from the first position
    with fewer than ``min_steps`` such steps in a training split on, positions share one pooled map.
    """
    k = inputs.k_list
    reached, matched = reached_steps(inputs)
    n_folds = max(2, min(n_folds, inputs.n_sequences))
    order = np.random.default_rng(seed).permutation(inputs.n_sequences)
    fold_of_seq = np.empty(inputs.n_sequences, np.int64)
    fold_of_seq[order] = np.arange(inputs.n_sequences) % n_folds
    fold = fold_of_seq[inputs.seq_index]
    out = np.empty_like(inputs.match_prob)
    for f in range(n_folds):
        train, test = fold != f, fold == f
        counts = (reached & train[:, None]).sum(axis=0)
        pool_from = next((i for i in range(k) if counts[i] < min_steps), k)
        for i in range(k):
            cols = [i] if i < pool_from else list(range(pool_from, k))
            sel = reached[:, cols] & train[:, None]
            x = inputs.match_prob[:, cols][sel]
            if x.size == 0:  # no training step at all: keep the recorded probability
                out[test, i] = inputs.match_prob[test, i]
                continue
            iso = fit_isotonic(x, matched[:, cols][sel])
            out[test, i] = iso.predict(inputs.match_prob[test, i])
    return replace(inputs, match_prob=out, _cache={})
