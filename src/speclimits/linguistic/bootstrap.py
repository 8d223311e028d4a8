"""Response-clustered bootstrap for ratios of sums (shares and means over decisions or events).

A statistic such as "share of decisions with k* >= 4 in a context" is ``sum(x) / sum(1)`` over
the decisions of that context. Decisions of one response are not independent, so the bootstrap
resamples whole responses with replacement: each replicate draws ``C`` responses out of the ``C``
that contribute, and the statistic is recomputed from the drawn responses' sums. With the
per-response sums in a (C, J) matrix and the replicate draw counts in a (B, C) matrix ``W``, all
replicates are one matrix product ``W @ sums``. Intervals are percentile intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def draw_counts(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n_clusters) how often each cluster is drawn in each replicate (rows sum to n_clusters)."""
    if n_clusters == 0:
        return np.zeros((n_boot, 0))
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(float)


def cluster_sums(df: pd.DataFrame, cluster: str, columns: list[str]) -> pd.DataFrame:
    """Per-cluster sums of ``columns`` plus ``n`` (rows per cluster), indexed by cluster."""
    g = df.groupby(cluster, sort=True, observed=True)
    out = g[columns].sum()
    out["n"] = g.size()
    return out


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite replicates (NaN, NaN when there are none)."""
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return (float("nan"), float("nan"))
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(r, [tail, 1.0 - tail])
    return (float(lo), float(hi))


def ratio_bootstrap(num: np.ndarray, den: np.ndarray, n_boot: int, rng: np.random.Generator,
                    level: float = 0.95) -> tuple[float, float, float]:
    """Estimate and interval of ``sum(num) / sum(den)`` with clusters as the resampling unit.

    ``num`` and ``den`` are (C,) per-cluster sums (or (C, J): then J ratios are returned as arrays,
    all from the same replicates). Returns ``(estimate, lo, hi)``.
    """
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        est = num.sum(axis=0) / den.sum(axis=0)
        w = draw_counts(num.shape[0], n_boot, rng)
        reps = (w @ num) / (w @ den)
    if num.ndim == 1:
        lo, hi = percentile_interval(reps, level)
        return float(est), lo, hi
    bounds = np.array([percentile_interval(reps[:, j], level) for j in range(num.shape[1])]).reshape(-1, 2)
    return est, bounds[:, 0], bounds[:, 1]
