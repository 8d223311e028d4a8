"""95% intervals for the final-model section's headline cells, by a cluster bootstrap over generations.

One matrix of draw counts ``W`` (B, G) serves every cell, generations resampled **within each K**.
Coefficients are refitted on every resample; held-out errors keep the out-of-fold predictions fixed and
resample the scored generations (their interval covers which generations were scored, not the refits).
The full-sample estimate is always the value reported.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from speclimits.bootstrap import draw_counts
from speclimits.stats._ols import CellMoments, ClusterSums, Design, ape


def stratified_counts(mom: CellMoments, n_boot: int, seed: int = 0, by: str = "K") -> np.ndarray:
    """(n_boot, G) draw counts over the generations of ``mom``, resampled within each level of ``by``."""
    rng = np.random.default_rng(seed)
    cells = mom.cells.drop_duplicates("cluster").sort_values("cluster")
    w = np.zeros((n_boot, mom.n_clusters))
    for _, grp in cells.groupby(by, sort=True):
        cols = grp["cluster"].to_numpy()
        w[:, cols] = draw_counts(len(cols), n_boot, rng)
    return w


def coefficient_replicates(mom: CellMoments, design: Design, weights: np.ndarray,
                           groups: Sequence[tuple[str, int]]) -> dict[int, pd.DataFrame]:
    """Per group ``(attr, value)`` (e.g. ``("K", 8)``) the (B, p) bootstrap estimates of ``design`` on its cells."""
    codes = dict(zip(mom.cells["generation_id"], mom.cells["cluster"]))
    out = {}
    for attr, value in groups:
        sub = mom.where(**{attr: value})
        first = sub.cells.drop_duplicates("cluster").sort_values("cluster")  # sub's clusters as mom's
        beta, _ = ClusterSums.of(sub, design).replicates(
            weights[:, np.array([codes[g] for g in first["generation_id"]], dtype=np.int64)])
        out[value] = pd.DataFrame(beta, columns=design.columns)
    return out


def ape_sums(mom: CellMoments, yhat: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-generation sums of the APE of ``yhat`` and row counts over ``rows`` (default all)."""
    rows = np.ones(mom.n_rows, bool) if rows is None else rows
    cl = mom.row_attr("cluster")[rows]
    g = mom.n_clusters
    e = ape(mom.y[rows], yhat[rows])
    return np.bincount(cl, weights=e, minlength=g), np.bincount(cl, minlength=g).astype(float)


def mape_replicates(weights: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """(B,) pooled MAPE of each resample from per-generation sums."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ num) / (weights @ den)


def fold_mape_replicates(mom: CellMoments, yhat: np.ndarray, folds: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(B,) across-fold mean of the per-fold MAPE (the statistic :class:`CVResult` reports)."""
    num, den = ape_sums(mom, yhat)
    out = []
    for f in np.unique(folds):
        mask = (folds == f).astype(float)
        out.append(mape_replicates(weights, num * mask, den * mask))
    return np.mean(out, axis=0)
