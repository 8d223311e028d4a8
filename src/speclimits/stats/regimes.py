"""The regime-dependent rows of the final-model section, at a given split, with 95% intervals.

A *basis* is a split (last m of the small regime) and a label: the parsimonious rule's split
(possibly None: one regime) or the paper's fixed m <= 4 | m >= 5. For each basis the rows are the
α and β0 ranges per regime, β0 at the first large m, the ratio of the characteristic α levels
(mean α over the large regime's m over the mean over the small regime's), and interpolation
within a regime vs transfer across the boundary. Intervals come from per-K bootstrap replicates
of the per-K fits (:mod:`speclimits.stats.uncertainty`): the interval of a range's minimum is
the percentile interval of the replicates' minima, and likewise for the maximum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.stats.uncertainty import interval

COLUMNS = ["basis", "quantity", "est_min", "est_max", "min_lo", "min_hi", "max_lo", "max_hi", "ours", "ci", "paper"]


def _fmt(v: float, digits: int) -> str:
    return "—" if not np.isfinite(v) else f"{v:.{digits}f}"


def _range_row(basis: str, quantity: str, est: np.ndarray, reps: np.ndarray | None, paper_text: str,
               digits: int = 3) -> dict[str, Any]:
    """A min–max row over the columns of ``est`` (nM,) with bootstrap replicates ``reps`` (B, nM)."""
    if est.size == 0:
        return {"basis": basis, "quantity": quantity, "ours": "—", "ci": "", "paper": paper_text}
    lo, hi = float(est.min()), float(est.max())
    row = {"basis": basis, "quantity": quantity, "est_min": lo, "est_max": hi, "paper": paper_text,
           "ours": f"{_fmt(lo, digits)}–{_fmt(hi, digits)}", "ci": ""}
    if reps is not None:
        (a, b), (c, d) = interval(reps.min(axis=1)), interval(reps.max(axis=1))
        row.update(min_lo=a, min_hi=b, max_lo=c, max_hi=d,
                   ci=f"min [{_fmt(a, digits)}, {_fmt(b, digits)}]; max [{_fmt(c, digits)}, {_fmt(d, digits)}]")
    return row


def _value_row(basis: str, quantity: str, est: float, reps: np.ndarray | None, paper_text: str,
               digits: int = 3) -> dict[str, Any]:
    row = {"basis": basis, "quantity": quantity, "est_min": est, "est_max": est, "paper": paper_text,
           "ours": _fmt(est, digits), "ci": ""}
    if reps is not None and np.isfinite(est):
        a, b = interval(reps)
        row.update(min_lo=a, min_hi=b, ci=f"[{_fmt(a, digits)}, {_fmt(b, digits)}]")
    return row


def regime_rows(per_k: pd.DataFrame, alpha_reps: pd.DataFrame, beta0_reps: pd.DataFrame,
                interp: pd.DataFrame, split: int | None, basis: str) -> pd.DataFrame:
    """The regime rows at ``split`` (None: one regime over every m).

    ``per_k``: the per-K table (``m``, ``alpha``, ``beta0``); ``alpha_reps``/``beta0_reps``: (B, nK)
    bootstrap replicates with one column per m (same order as ``per_k``); ``interp``: the
    interpolation table at this split. Columns: :data:`COLUMNS` (numbers and formatted text).
    """
    m = per_k["m"].to_numpy()
    al, b0 = per_k["alpha"].to_numpy(), per_k["beta0"].to_numpy()
    ar, br = alpha_reps.to_numpy(), beta0_reps.to_numpy()
    if split is None:
        rows = [_range_row(basis, "α(m), one regime (ms/expert)", al, ar, "—"),
                _range_row(basis, "β0(m), one regime (ms)", b0, br, "—", 2)]
    else:
        small, large = m <= split, m > split
        ratio = (al[large].mean() / al[small].mean()) if small.any() and large.any() else np.nan
        ratio_reps = ar[:, large].mean(1) / ar[:, small].mean(1) if small.any() and large.any() else None
        rows = [
            _range_row(basis, "α(m), small regime (ms/expert)", al[small], ar[:, small],
                       paper.fmt_range(paper.ALPHA_SMALL)),
            _range_row(basis, "α(m), large regime (ms/expert)", al[large], ar[:, large],
                       paper.fmt_range(paper.ALPHA_LARGE)),
            _range_row(basis, "β0(m), small regime (ms)", b0[small], br[:, small],
                       paper.fmt_range(paper.BETA0_SMALL, digits=1), 2),
            _value_row(basis, "β0 at the first large m (ms)", float(b0[large][0]) if large.any() else np.nan,
                       br[:, int(np.flatnonzero(large)[0])] if large.any() else None,
                       f"{paper.BETA0_LARGE_START}", 2),
            _value_row(basis, "α level ratio, large over small regime", float(ratio), ratio_reps,
                       f"≈{paper.ALPHA_LEVEL_RATIO}", 2),
        ]
    within = interp.loc[(interp["scheme"] == "interpolate") & (interp["relation"] == "within regime"), "mape"]
    across = interp.loc[interp["relation"] == "across boundary", "mape"]
    rows.append(_range_row(basis, "interpolation within a regime, MAPE (%)", within.to_numpy(), None,
                           paper.fmt_range(paper.INTERP_WITHIN, digits=2), 2))
    rows.append(_range_row(basis, "across the boundary, MAPE (%)", across.to_numpy(), None,
                           paper.fmt_range(paper.TRANSFER_ACROSS, digits=1), 1))
    return pd.DataFrame(rows, columns=COLUMNS)
