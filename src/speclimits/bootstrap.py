"""The cluster bootstrap every section uses: resample whole clusters with replacement and read
percentile intervals off the replicates.

A replicate is a vector of draw counts over the ``C`` clusters (summing to ``C``), so a statistic that
is a sum over clusters needs no resampled copy of the data: replicate sums are ``W @ S`` for counts ``W``
(B, C) and per-cluster sums ``S`` (C, J). Statistics that are not sums take :func:`resample_indices`,
drawn from the same counts so that both views of one seed agree.
"""

from __future__ import annotations

import numpy as np

#: Cost-model bootstrap replicates behind the Oracle's headline interval: the book's section 6,
#: ``oracle_report`` and ``speclimits oracle`` all default to this, so they print the same interval.
HEADLINE_N_BOOT = 199


def draw_counts(n_clusters: int, n_boot: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """(n_boot, n_clusters) float draw counts; ``seed``: an int or a ``Generator`` (consumed in place)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if n_clusters == 0:
        return np.zeros((n_boot, 0))
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(float)


def draw_indices(n: int, n_boot: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """(n_boot, n) indices of ``n`` paired units drawn uniformly with replacement."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.integers(0, n, size=(n_boot, n))


def resample_indices(counts: np.ndarray) -> list[np.ndarray]:
    """For each replicate row of ``counts``, the cluster indices it draws (cluster g repeated w_g times)."""
    counts = np.asarray(counts).astype(np.int64)
    idx = np.arange(counts.shape[1])
    return [np.repeat(idx, row) for row in counts]


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite replicates (NaN, NaN when there are none)."""
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return (float("nan"), float("nan"))
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(r, [tail, 1.0 - tail])
    return (float(lo), float(hi))


def geometric_mean_ratio(num: np.ndarray, den: np.ndarray, n_boot: int = 2000, seed: int | np.random.Generator = 0
                         ) -> tuple[float, float, float]:
    """``(estimate, lo, hi)``: the geometric mean of ``num / den`` over paired units and its 95% percentile
    bootstrap interval; non-finite log ratios left out (NaN: no pair left; no interval below two)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(np.asarray(num, dtype=float)) - np.log(np.asarray(den, dtype=float))
    lr = lr[np.isfinite(lr)]
    if lr.size == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(np.exp(lr.mean()))
    if lr.size < 2 or n_boot <= 0:
        return est, float("nan"), float("nan")
    lo, hi = np.percentile(lr[draw_indices(lr.size, n_boot, seed)].mean(axis=1), [2.5, 97.5])
    return est, float(np.exp(lo)), float(np.exp(hi))


def ratio_bootstrap(num: np.ndarray, den: np.ndarray, n_boot: int, seed: int | np.random.Generator = 0,
                    level: float = 0.95):
    """``(estimate, lo, hi)`` of ``sum(num) / sum(den)`` over clusters from (C,) per-cluster sums (or (C, J):
    J ratios as arrays, from the same replicates)."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        est = num.sum(axis=0) / den.sum(axis=0)
        w = draw_counts(num.shape[0], n_boot, seed)
        reps = (w @ num) / (w @ den)
    if num.ndim == 1:
        lo, hi = percentile_interval(reps, level)
        return float(est), lo, hi
    bounds = np.array([percentile_interval(reps[:, j], level) for j in range(num.shape[1])]).reshape(-1, 2)
    return est, bounds[:, 0], bounds[:, 1]


def cluster_sums(df, cluster: str, columns: list[str]):
    """Per-cluster sums of ``columns`` of DataFrame ``df`` plus ``n`` (rows per cluster), indexed by cluster."""
    g = df.groupby(cluster, sort=True, observed=True)
    out = g[columns].sum()
    out["n"] = g.size()
    return out
