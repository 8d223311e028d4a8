"""Residual diagnostics and the Huber fit of the robustness section, on row-level arrays.

Breusch–Pagan in both versions: the **classic** test (1979) assumes normal errors, so heavy tails alone
can make it reject; the **studentized** one (Koenker 1981) is robust to that, but rare large spikes swamp
it. The binned residuals come with a clustered Wald test that every bin mean is zero: a shape test,
since for a regressor of the model the linear slope of OLS residuals is zero by construction.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.diagnostic import het_breuschpagan
from statsmodels.tools.sm_exceptions import SingularMatrixWarning

from speclimits.stats._ols import CellMoments, Design, cluster_cov, fit_ols


def breusch_pagan(resid: np.ndarray, exog: np.ndarray) -> dict[str, float]:
    """Classic and studentized Breusch–Pagan tests (statsmodels' ``het_breuschpagan``, ``robust`` False and
    True) of ``resid`` on ``exog``, whose column space contains the constant (a column is added where a
    categorical design spans it without one); p-values take df = rank(exog) - 1."""
    x = np.asarray(exog, dtype=float)
    df = int(np.linalg.matrix_rank(x)) - 1
    if not (np.ptp(x, axis=0) == 0).any():
        x = np.column_stack([np.ones(len(x)), x])
    out: dict[str, float] = {"df": df, "n": len(x)}
    with warnings.catch_warnings():  # the added constant is collinear: same column space, same R² and ESS
        warnings.simplefilter("ignore", SingularMatrixWarning)
        for key, robust in (("classic", False), ("koenker", True)):
            lm = float(het_breuschpagan(resid, x, robust=robust)[0])
            out.update({f"{key}_lm": lm, f"{key}_p": float(sps.chi2.sf(lm, df))})
    return out


def huber_fit(y: np.ndarray, x: np.ndarray, clusters: np.ndarray, t: float = 1.345) -> dict[str, Any]:
    """Huber regression by statsmodels RLM (MAD scale, HuberT(t)): ``params``, ``cov_rlm`` (RLM's H1, rows
    independent), ``cov_cluster`` (sandwich by ``clusters``: bread ``Σψ'(u)xx'``, scores ``ψ(u)x``, times
    scale²), ``scale``, ``df_t`` (clusters - 1), ``n``."""
    norm = sm.robust.norms.HuberT(t=t)
    rlm = sm.RLM(y, x, M=norm).fit()
    s = float(rlm.scale)
    u = (y - x @ rlm.params) / s
    bread = (x * norm.psi_deriv(u)[:, None]).T @ x
    scores = x * norm.psi(u)[:, None]
    cov = s ** 2 * cluster_cov(bread, scores, pd.factorize(clusters)[0], len(scores))
    return {"params": np.asarray(rlm.params), "cov_rlm": np.asarray(rlm.cov_params()), "cov_cluster": cov,
            "scale": s, "df_t": int(len(np.unique(clusters)) - 1), "n": int(len(y))}


def cluster_mean(values: np.ndarray, clusters: np.ndarray) -> tuple[float, float]:
    """Mean and SE clustered by ``clusters`` (intercept-only OLS with statsmodels' correction)."""
    v = np.asarray(values, dtype=float)
    codes, _ = pd.factorize(clusters)
    g = codes.max() + 1
    mean = v.mean()
    s = np.bincount(codes, weights=v - mean, minlength=g)
    se = math.sqrt(g / (g - 1.0) * (s ** 2).sum()) / v.size if g > 1 else math.nan
    return float(mean), float(se)


def quantile_bins(values: np.ndarray, n_bins: int = 10) -> np.ndarray:
    """(N,) bin index 0..B-1 of every value, by quantile edges (ties merge bins)."""
    v = np.asarray(values, dtype=float)
    edges = np.unique(np.quantile(v, np.linspace(0, 1, n_bins + 1)))
    return np.clip(np.searchsorted(edges, v, side="right") - 1, 0, max(len(edges) - 2, 0))


def bin_means_wald(resid: np.ndarray, bins: np.ndarray, clusters: np.ndarray) -> dict[str, float]:
    """Clustered Wald test that the mean residual is zero in every bin: ``F`` = W / q on (q, G - 1) df."""
    codes, _ = pd.factorize(bins, sort=True)
    x = np.eye(codes.max() + 1)[codes]
    r = np.asarray(resid, dtype=float)
    b = np.bincount(codes, weights=r) / np.bincount(codes)
    cov = cluster_cov(x.T @ x, x * (r - b[codes])[:, None], pd.factorize(clusters)[0], len(r))
    q = x.shape[1]
    g = len(np.unique(clusters))
    # a clustered covariance has rank at most G - 1: with no more clusters than bins the test is not
    # identified (a thin trace: few generations at this K), and is reported as NaN rather than raised
    if g - 1 < q:
        return {"wald_f": math.nan, "wald_df": q, "wald_p": math.nan}
    try:
        f = float(b @ np.linalg.solve(cov, b)) / q
    except np.linalg.LinAlgError:
        return {"wald_f": math.nan, "wald_df": q, "wald_p": math.nan}
    return {"wald_f": f, "wald_df": q, "wald_p": float(sps.f.sf(f, q, g - 1))}


def binned_residuals(resid: np.ndarray, values: np.ndarray, clusters: np.ndarray, n_bins: int = 10) -> pd.DataFrame:
    """Mean residual per quantile bin of ``values`` (``center``: mean value; ``se`` clustered)."""
    v = np.asarray(values, dtype=float)
    b = quantile_bins(v, n_bins)
    rows = []
    for k in np.unique(b):
        sel = b == k
        mean, se = cluster_mean(resid[sel], clusters[sel])
        rows.append({"bin": int(k), "center": float(v[sel].mean()), "mean_resid": mean, "se": se,
                     "n": int(sel.sum()), "n_clusters": int(len(np.unique(clusters[sel])))})
    return pd.DataFrame(rows)


def trend_test(resid: np.ndarray, values: np.ndarray, cells: pd.DataFrame, name: str,
               n_bins: int = 10) -> dict[str, float]:
    """Clustered OLS slope of the residual on ``values`` (``slope``, ``se``, ``t``, ``p``, ``slope_per_sd``)
    and :func:`bin_means_wald`; ``cells``: per row ``generation_id``, ``K``, ``m``."""
    df = cells[["generation_id", "K", "m"]].assign(resid=np.asarray(resid, float), **{name: np.asarray(values, float)})
    fit = fit_ols(CellMoments.from_rounds(df, response="resid", base=(name,)), Design.linear(name))
    slope, se = float(fit.params[name]), float(fit.bse[name])
    wald = bin_means_wald(resid, quantile_bins(values, n_bins), cells["generation_id"].to_numpy())
    return {"variable": name, "slope": slope, "se": se, "t": slope / se if se > 0 else math.nan,
            "p": float(fit.pvalues[name]), "slope_per_sd": slope * float(np.std(values)), **wald}
