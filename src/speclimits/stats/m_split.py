"""The rows of the final-model section that depend on where m is split, with 95% intervals.

A *basis* is a split (the rule's, possibly None, or the appendix's :data:`FIXED_SPLIT`) and a label;
its rows: α and β0 ranges per regime, β0 at the first large m, the α level ratio, and interpolation vs
transfer. A range's minimum has the percentile interval of the per-K bootstrap replicates' minima;
likewise the maximum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from speclimits.bootstrap import percentile_interval

#: The appendix's split m <= 4 | m >= 5 (chosen there by eye): every split row is also given at it,
#: and the hinge form in m kinks after it.
FIXED_SPLIT = 4

COLUMNS = ["basis", "key", "quantity", "shape", "est_min", "est_max", "min_lo", "min_hi", "max_lo", "max_hi"]

AS_HEADLINE = {"est_min": "est", "min_lo": "lo", "min_hi": "hi", "est_max": "est2", "max_lo": "lo2", "max_hi": "hi2"}


def as_headline(rows: pd.DataFrame) -> pd.DataFrame:
    """Split rows in the headline table's columns (a ``value`` row's ``est2`` dropped: it repeats ``est``)."""
    out = rows.rename(columns=AS_HEADLINE)
    out.loc[out["shape"] == "value", ["est2", "lo2", "hi2"]] = np.nan
    return out


def _range_row(basis: str, key: str, quantity: str, est: np.ndarray, reps: np.ndarray | None) -> dict[str, Any]:
    """A min–max row over the columns of ``est`` (nM,) with bootstrap replicates ``reps`` (B, nM)."""
    row = {"basis": basis, "key": key, "quantity": quantity, "shape": "range"}
    if est.size == 0:
        return row
    row.update(est_min=float(est.min()), est_max=float(est.max()))
    if reps is not None:
        (a, b), (c, d) = percentile_interval(reps.min(axis=1)), percentile_interval(reps.max(axis=1))
        row.update(min_lo=a, min_hi=b, max_lo=c, max_hi=d)
    return row


def _value_row(basis: str, key: str, quantity: str, est: float, reps: np.ndarray | None) -> dict[str, Any]:
    row = {"basis": basis, "key": key, "quantity": quantity, "shape": "value", "est_min": est, "est_max": est}
    if reps is not None and np.isfinite(est):
        a, b = percentile_interval(reps)
        row.update(min_lo=a, min_hi=b)
    return row


def split_rows(per_k: pd.DataFrame, alpha_reps: pd.DataFrame, beta0_reps: pd.DataFrame,
                interp: pd.DataFrame, split: int | None, basis: str) -> pd.DataFrame:
    """The split rows (:data:`COLUMNS`) at ``split`` (None: one regime) from the per-K table, its (B, nK)
    bootstrap replicates (columns in ``per_k``'s order) and the interpolation table at this split;
    ``shape`` ``range`` (min–max) or ``value`` (``est_min``)."""
    m = per_k["m"].to_numpy()
    al, b0 = per_k["alpha"].to_numpy(), per_k["beta0"].to_numpy()
    ar, br = alpha_reps.to_numpy(), beta0_reps.to_numpy()
    if split is None:
        rows = [_range_row(basis, "alpha_one", "α(m), one regime (ms/expert)", al, ar),
                _range_row(basis, "beta0_one", "β0(m), one regime (ms)", b0, br)]
    else:
        small, large = m <= split, m > split
        ratio = (al[large].mean() / al[small].mean()) if small.any() and large.any() else np.nan
        ratio_reps = ar[:, large].mean(1) / ar[:, small].mean(1) if small.any() and large.any() else None
        rows = [
            _range_row(basis, "alpha_small", "α(m), small regime (ms/expert)", al[small], ar[:, small]),
            _range_row(basis, "alpha_large", "α(m), large regime (ms/expert)", al[large], ar[:, large]),
            _range_row(basis, "beta0_small", "β0(m), small regime (ms)", b0[small], br[:, small]),
            _value_row(basis, "beta0_first_large", "β0 at the first large m (ms)",
                       float(b0[large][0]) if large.any() else np.nan,
                       br[:, int(np.flatnonzero(large)[0])] if large.any() else None),
            _value_row(basis, "alpha_ratio", "α level ratio, large over small regime", float(ratio), ratio_reps),
        ]
    within = interp.loc[(interp["scheme"] == "interpolate") & (interp["relation"] == "within regime"), "mape"]
    across = interp.loc[interp["relation"] == "across boundary", "mape"]
    rows.append(_range_row(basis, "interp_within", "interpolation within a regime, MAPE (%)", within.to_numpy(), None))
    rows.append(_range_row(basis, "across_boundary", "across the boundary, MAPE (%)", across.to_numpy(), None))
    return pd.DataFrame(rows, columns=COLUMNS)
