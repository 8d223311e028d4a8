"""Is the draft's probability of the reference token a calibrated surrogate for acceptance?

The Oracle's probabilistic transitions use ``match_prob`` as the chance that draft step i
matches, given the chain matched so far. Under greedy verification the observed outcome is
known too: step i matched iff ``accept_len >= i``. On the simulator the two agree by
construction; a small trained head can be far from calibrated (its probabilities sit well
below its greedy acceptance), and then the "bound" understates what greedy speculation
achieves. :func:`calibration_table` measures the gap; :func:`calibrate_match_prob` replaces
``match_prob`` by an isotonic map (scikit-learn) fitted to the observed matches, keeping the
ranking the draft's probabilities give.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.oracle.inputs import OracleInputs


def reached_steps(inputs: OracleInputs, k_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which draft steps a greedy round from each state actually tested, and their outcome.

    Step ``i`` (0-based) of state ``n`` is *reached* when the chain matched up to it
    (``accept_len >= i``), is within ``k_max`` and has a reference token to match
    (``i < N - pos - 1``). Returns ``(reached, matched)``, both (n, k_max) bool, ``matched``
    meaning ``accept_len >= i + 1``.
    """
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


def calibrate_match_prob(inputs: OracleInputs) -> tuple[OracleInputs, IsotonicRegression]:
    """Inputs whose ``match_prob`` is mapped through an isotonic fit of observed matches on
    ``match_prob`` (pooled over draft positions and the states that reached them)."""
    _, p, hit = _reached(inputs)
    iso = fit_isotonic(p, hit)
    mapped = iso.predict(inputs.match_prob.ravel()).reshape(inputs.match_prob.shape)
    return replace(inputs, match_prob=mapped, _cache={}), iso
