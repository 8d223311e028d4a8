"""Robustness of the per-K fit ``T_T ~ Ū + L`` on one K (the paper used K = 8): α and c re-estimated by
a cluster bootstrap, Huber M-estimation, 1% trimming, the two halves of the run **in run order** and
leave-one-category-out; c across the per-K fits; binned residuals with trend tests; both Breusch–Pagan
tests at this K and pooled (the categorical model's residuals); corr(Ū, L).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.errors import SpeclimitsError
from speclimits.stats import diagnostics as diag
from speclimits.stats._ols import CellMoments, OLSResults, cluster_bootstrap, fit_ols, predict
from speclimits.stats.comparisons import BASE_DESIGN
from speclimits.stats.costfit import fit_joint
from speclimits.trace import FilterReport, decode_rounds

BIN_VARS = ("context_len", "kv_usage", "round")


@dataclass(frozen=True)
class RobustnessResults:
    """Robustness checks on one K. ``estimates``: one row per method/refit (``alpha``, ``c`` with 95%
    ``_lower``/``_upper``; ``interval`` says how it was made); ``ranges``: min–max of α and c (1e-3) over
    them and of c across the per-K fits (``c_by_k``); ``boot``: bootstrap estimates; ``bins``/``trends``:
    binned residuals and clustered slopes; ``breusch_pagan``: per scope and version; ``halves``: the run
    order used and the categories in each half.
    """

    k: int
    base: OLSResults
    estimates: pd.DataFrame
    boot: pd.DataFrame
    c_by_k: pd.DataFrame
    bins: pd.DataFrame
    trends: pd.DataFrame
    breusch_pagan: pd.DataFrame
    corr_u_l: dict[str, float]
    loo_by: str
    halves: dict[str, Any]
    report: FilterReport

    @property
    def ranges(self) -> pd.DataFrame:
        e = self.estimates
        c_spread = self.c_by_k["c"]
        return pd.DataFrame({
            "ours_min": [e["alpha"].min(), 1e3 * e["c"].min(), 1e3 * c_spread.min()],
            "ours_max": [e["alpha"].max(), 1e3 * e["c"].max(), 1e3 * c_spread.max()],
        }, index=[f"alpha, ms/expert (K={self.k}, all checks)", f"c, 1e-3 ms/token (K={self.k}, all checks)",
                  "c, 1e-3 ms/token, across per-K fits"])

    def to_dict(self) -> dict[str, Any]:
        boot = self.boot
        return {"k": self.k, "base": self.base.to_dict(), "estimates": self.estimates,
                "ranges": self.ranges.rename_axis("quantity"), "bootstrap": {
                    "n_boot": len(boot), "se": boot.std(ddof=1), "lower": boot.quantile(0.025),
                    "upper": boot.quantile(0.975)},
                "c_by_k": self.c_by_k, "binned_residuals": self.bins, "trend_tests": self.trends,
                "breusch_pagan": self.breusch_pagan, "corr_u_l": self.corr_u_l, "leave_one_out_by": self.loo_by,
                "halves": self.halves, "filter": self.report.to_dict()}

    def summary(self) -> str:
        cr = self.corr_u_l
        return (f"Robustness on K = {self.k} ({self.base.nobs:,} rounds, {self.base.n_clusters} generations)\n"
                + self.estimates.to_string(index=False, float_format=lambda v: f"{v:.6g}") + "\n\n"
                + self.ranges.to_string(float_format=lambda v: f"{v:.6g}") + "\n\n"
                + "Breusch–Pagan:\n" + self.breusch_pagan.to_string(index=False, float_format=lambda v: f"{v:.4g}")
                + "\n\nTrend of the residual (clustered slope):\n"
                + self.trends.to_string(index=False, float_format=lambda v: f"{v:.4g}")
                + f"\n\ncorr(Ū, L) = {cr['k']:.3f} (K = {self.k}), {cr['pooled']:.3f} pooled; "
                f"leave-one-out by {self.loo_by}; run halves ordered by {self.halves['order_by']}")


def _row(method: str, variant: str, interval: str, fit: OLSResults | None = None, alpha: float = np.nan,
         c: float = np.nan, ci: tuple[float, float, float, float] | None = None, n: int = 0) -> dict[str, Any]:
    if fit is not None:
        cis = fit.conf_int()
        alpha, c, n = fit.params["u_bar"], fit.params["context_len"], fit.nobs
        ci = (cis.loc["u_bar", "lower"], cis.loc["u_bar", "upper"], cis.loc["context_len", "lower"],
              cis.loc["context_len", "upper"])
    ci = ci or (np.nan,) * 4
    return {"method": method, "variant": variant, "n": n, "alpha": alpha, "alpha_lower": ci[0],
            "alpha_upper": ci[1], "c": c, "c_lower": ci[2], "c_upper": ci[3], "interval": interval}


CLUSTERED_T = "t, SE clustered by generation"


def _refit_row(method: str, variant: str, mom: CellMoments) -> dict[str, Any]:
    """A refit on a subset as one row; where the subset does not identify the fit (a thin trace), a row of
    NaN whose variant says why, instead of an error that would lose every other check."""
    try:
        return _row(method, variant, CLUSTERED_T, fit_ols(mom, BASE_DESIGN))
    except SpeclimitsError as exc:
        return _row(method, f"{variant} (not identified: {exc})", CLUSTERED_T, n=int(mom.n.sum()))


def run_order(dk: pd.DataFrame) -> tuple[pd.Series, str]:
    """(generation ids in the order they ran, description of the key): by the engine step of their first
    round when the trace records ``step``, else by ``generation_id``."""
    if "step" in dk.columns:
        first = dk.groupby("generation_id")["step"].min().sort_values(kind="stable")
        return pd.Series(first.index), "engine step of each generation's first round (run order)"
    return pd.Series(np.sort(dk["generation_id"].unique())), "generation_id (the order the sweep produced them)"


def _huber_rows(dk: pd.DataFrame, x: np.ndarray) -> list[dict]:
    h = diag.huber_fit(dk["t_target_ms"].to_numpy(float), x, dk["generation_id"].to_numpy())
    rows = []
    for label, cov, q in (("RLM covariance, not clustered", h["cov_rlm"], sps.norm.ppf(0.975)),
                          ("sandwich clustered by generation", h["cov_cluster"], sps.t.ppf(0.975, h["df_t"]))):
        se = np.sqrt(np.diag(cov))
        p = h["params"]
        rows.append(_row("Huber (statsmodels RLM)", f"HuberT, t = 1.345; {label}", label,
                         alpha=p[1], c=p[2], n=h["n"],
                         ci=(p[1] - q * se[1], p[1] + q * se[1], p[2] - q * se[2], p[2] + q * se[2])))
    return rows


def _halves_rows(dk: pd.DataFrame, mom: CellMoments) -> tuple[list[dict], dict[str, Any]]:
    order, key = run_order(dk)
    first_ids = set(order.iloc[: len(order) // 2].tolist())
    first = np.isin(mom.cells["generation_id"].to_numpy(), list(first_ids))
    info: dict[str, Any] = {"order_by": key}
    if "category" in mom.cells:
        info["categories_first_half"] = sorted(set(mom.cells.loc[first, "category"]))
        info["categories_second_half"] = sorted(set(mom.cells.loc[~first, "category"]))
    rows = [_refit_row("run halves", "first half of the run", mom.subset(first)),
            _refit_row("run halves", "second half of the run", mom.subset(~first))]
    return rows, info


def _leave_one_out_rows(mom: CellMoments, n_blocks: int) -> tuple[list[dict], str]:
    if "category" in mom.cells and mom.cells["category"].nunique() >= 2:
        loo_by, labels = "category", mom.cells["category"].to_numpy()
    else:
        loo_by = "generation block"
        gens = np.sort(mom.cells["generation_id"].unique())
        rank = np.searchsorted(gens, mom.cells["generation_id"].to_numpy())
        labels = np.array([f"block {b + 1}" for b in rank * n_blocks // len(gens)])
    rows = [_refit_row(f"leave one {loo_by} out", f"without {lab}", mom.subset(labels != lab))
            for lab in sorted(set(labels.tolist()))]
    return rows, loo_by


def context_slope_by_k(mom: CellMoments) -> pd.DataFrame:
    """``K``, ``c``, ``c_se`` of the per-K fits ``T_T ~ Ū + L``, for every K of ``mom`` that identifies one."""
    rows = []
    for k in sorted(int(v) for v in mom.cells["K"].unique()):
        try:
            f = fit_ols(mom.where(K=k), BASE_DESIGN)
        except SpeclimitsError:
            continue
        rows.append({"K": k, "c": f.params["context_len"], "c_se": f.bse["context_len"]})
    return pd.DataFrame(rows, columns=["K", "c", "c_se"])


def _residual_checks(dk: pd.DataFrame, resid: np.ndarray, n_bins: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    gen = dk["generation_id"].to_numpy()
    bins, trends = [], []
    for var in BIN_VARS:
        v = dk[var].to_numpy(float)
        bins.append(diag.binned_residuals(resid, v, gen, n_bins).assign(variable=var))
        trends.append(diag.trend_test(resid, v, dk, var, n_bins))
    cols = ["variable", "bin", "center", "mean_resid", "se", "n", "n_clusters"]
    return pd.concat(bins, ignore_index=True)[cols], pd.DataFrame(trends)


def _bp_table(x: np.ndarray, resid: np.ndarray, all_mom: CellMoments, k: int) -> pd.DataFrame:
    """Both Breusch–Pagan versions at this K (``x``: const, Ū, L) and pooled over every K (the categorical model)."""
    joint = fit_joint(all_mom)
    x_all = joint.design.rows(all_mom)
    resid_all = all_mom.y - predict(all_mom, joint.design, joint.params)
    rows = []
    for scope, bp in ((f"K = {k}, Ū + L", diag.breusch_pagan(resid, x)),
                      ("pooled over K, categorical Eq. 4", diag.breusch_pagan(resid_all, x_all))):
        for version, key in (("classic (Breusch–Pagan 1979)", "classic"), ("studentized (Koenker 1981)", "koenker")):
            rows.append({"scope": scope, "version": version, "lm": bp[f"{key}_lm"], "df": bp["df"],
                         "p": bp[f"{key}_p"], "n": bp["n"]})
    return pd.DataFrame(rows)


def robust_k(rounds: pd.DataFrame, k: int = 8) -> tuple[int, str | None]:
    """The K the checks run on: ``k`` when the trace has decode rounds at it, else its largest K > 0, with
    one sentence saying why; raises where there are no decode rounds with K > 0."""
    dec, _ = decode_rounds(rounds, timing="target")
    present = sorted(int(v) for v in dec["K"].unique() if v >= 1)
    if not present:
        raise SpeclimitsError("the robustness checks need decode rounds with K >= 1 (this trace has none)")
    if k in present:
        return k, None
    return present[-1], (f"the trace has no decode rounds at K = {k} (K > 0 present: {', '.join(map(str, present))}), "
                         f"so the checks run on K = {present[-1]}, its largest; a sweep with K = {k} would allow them "
                         "there")


def robustness_checks(rounds: pd.DataFrame, k: int = 8, n_boot: int = 999, seed: int = 0, n_bins: int = 10,
                      trim: float = 0.01, n_blocks: int = 14) -> RobustnessResults:
    """Run the robustness checks on the decode rounds of budget ``k``; leave-one-out by ``category`` (two
    values or more), else by ``n_blocks`` consecutive blocks of generations."""
    dec, report = decode_rounds(rounds, timing="target")
    if k not in set(dec["K"].unique().tolist()):
        raise SpeclimitsError(f"no decode rounds with K = {k} in the trace (K present: {sorted(dec['K'].unique())})")
    dk = dec.loc[dec["K"].to_numpy() == k].reset_index(drop=True)
    mom = CellMoments.from_rounds(dk)
    base = fit_ols(mom, BASE_DESIGN)
    boot = cluster_bootstrap(mom, BASE_DESIGN, draw_counts(mom.n_clusters, n_boot, seed))
    a, c = percentile_interval(boot["u_bar"].to_numpy()), percentile_interval(boot["context_len"].to_numpy())
    boot_row = _row("cluster bootstrap", f"{n_boot} resamples of generations", "bootstrap percentile",
                    alpha=float(base.params["u_bar"]), c=float(base.params["context_len"]), n=base.nobs,
                    ci=(a[0], a[1], c[0], c[1]))
    x = BASE_DESIGN.rows(mom)  # const, Ū, L; the moments keep dk's row order
    resid = dk["t_target_ms"].to_numpy(float) - predict(mom, BASE_DESIGN, base.params)
    keep = np.abs(resid) <= np.quantile(np.abs(resid), 1 - trim)
    halves, halves_info = _halves_rows(dk, mom)
    loo, loo_by = _leave_one_out_rows(mom, n_blocks)
    rows = [_row("OLS (clustered SE)", "all rounds", CLUSTERED_T, base), boot_row, *_huber_rows(dk, x),
            _refit_row("trimmed", f"{100 * trim:g}% largest |residual| dropped", CellMoments.from_rounds(dk.loc[keep])),
            *halves, *loo]

    all_mom = CellMoments.from_rounds(dec.loc[dec["K"].to_numpy() >= 1])
    c_by_k = context_slope_by_k(all_mom)
    bins, trends = _residual_checks(dk, resid, n_bins)
    corr = {"k": float(np.corrcoef(dk["u_bar"], dk["context_len"])[0, 1]),
            "pooled": float(np.corrcoef(all_mom.column("u_bar"), all_mom.column("context_len"))[0, 1])}
    return RobustnessResults(k, base, pd.DataFrame(rows), boot, c_by_k, bins, trends,
                             _bp_table(x, resid, all_mom, k), corr, loo_by, halves_info, report)
