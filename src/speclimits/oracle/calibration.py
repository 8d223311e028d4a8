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


def _reached(inputs: OracleInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled (position index i 0-based, match_prob, matched) over states whose chain reached step i+1."""
    k = inputs.match_prob.shape[1]
    acc = inputs.accept_len[:, None]
    steps = np.arange(k)[None, :]
    lengths = np.diff(inputs.offsets)
    remaining = lengths.repeat(lengths) - inputs.pos  # tokens left in the sequence at each state
    reached = (acc >= steps) & (steps < remaining[:, None] - 1)
    i = np.broadcast_to(steps, reached.shape)[reached]
    return i, inputs.match_prob[reached], (acc >= steps + 1)[reached]


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
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip", increasing=True)
    iso.fit(p, hit.astype(float))
    mapped = iso.predict(inputs.match_prob.ravel()).reshape(inputs.match_prob.shape)
    return replace(inputs, match_prob=mapped, _cache={}), iso


def compare_transitions(inputs: OracleInputs, cost_model, k_max: int | None = None) -> pd.DataFrame:
    """The Oracle's bounds under three transition models: raw ``match_prob``, isotonic-calibrated
    ``match_prob``, and the exact greedy outcome (``accept_len``, the deterministic variant)."""
    from speclimits.oracle.solver import solve

    calibrated, _ = calibrate_match_prob(inputs)
    rows = {}
    for name, inp, det in (("raw q", inputs, False), ("calibrated q", calibrated, False),
                           ("exact greedy (accept_len)", inputs, True)):
        b = solve(inp, cost_model, k_max=k_max, deterministic=det).bounds
        rows[name] = {"oracle_speedup": b.speedup, "best_static_k": b.best_static_k,
                      "best_static_speedup": b.best_static_speedup, "gain_over_best_static": b.gain_over_best_static,
                      "mean_accepted": b.mean_accepted}
    return pd.DataFrame(rows).T
