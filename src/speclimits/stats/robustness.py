"""Robustness of the per-K fit ``T_T ~ Ū + L`` on one K (the paper used K = 8).

Five re-estimations of α and c (cluster bootstrap over generations, Huber M-estimation, 1%
trimming by |residual|, separate fits on the two halves of the run, leave-one-category-out),
c across the per-K fits, binned mean residuals, Breusch–Pagan and corr(Ū, L).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from statsmodels.stats.diagnostic import het_breuschpagan

from speclimits.bootstrap import draw_counts
from speclimits.errors import SpeclimitsError
from speclimits import paper
from speclimits.stats._ols import (CellMoments, Design, OLSResults, ResultsMixin,
                                   cluster_bootstrap, fit_ols, predict)
from speclimits.trace import FilterReport, decode_rounds

DESIGN = Design.linear("u_bar", "context_len", label="Ū + L")


@dataclass(frozen=True)
class RobustnessResults(ResultsMixin):
    """Robustness checks on one K.

    ``estimates``: one row per method/refit with ``alpha``, ``c`` and their 95% CI where defined
    (``method``, ``variant``). ``ranges``: min–max of α (ms/expert) and c (1e-3 ms/token) over the
    estimates beside the paper's.
    ``boot``: (n_boot, 3) bootstrap estimates. ``c_by_k``: c of the per-K fits (all K >= 1).
    ``bins``: mean residual by decile of ``context_len``, ``kv_usage`` and ``round`` (position).
    ``breusch_pagan``: LM statistic, p-value. ``corr_u_l``: on this K and pooled.
    ``loo_by``: what leave-one-out removed (``category`` or ``generation block``).
    """

    k: int
    base: OLSResults
    estimates: pd.DataFrame
    boot: pd.DataFrame
    c_by_k: pd.DataFrame
    bins: pd.DataFrame
    breusch_pagan: dict[str, float]
    corr_u_l: dict[str, float]
    loo_by: str
    report: FilterReport

    @property
    def params(self) -> pd.Series:
        return self.base.params

    @property
    def bse(self) -> pd.Series:
        return self.base.bse

    @property
    def ranges(self) -> pd.DataFrame:
        e = self.estimates
        c_spread = self.c_by_k["c"]
        return pd.DataFrame({
            "ours_min": [e["alpha"].min(), 1e3 * e["c"].min(), 1e3 * c_spread.min()],
            "ours_max": [e["alpha"].max(), 1e3 * e["c"].max(), 1e3 * c_spread.max()],
            "paper_min": [paper.ROBUST_ALPHA[0], 1e3 * paper.ROBUST_C[0], 1e3 * paper.C_RANGE[0]],
            "paper_max": [paper.ROBUST_ALPHA[1], 1e3 * paper.ROBUST_C[1], 1e3 * paper.C_RANGE[1]],
        }, index=[f"alpha, ms/expert (K={self.k}, all checks)", f"c, 1e-3 ms/token (K={self.k}, all checks)",
                  "c, 1e-3 ms/token, across per-K fits"])

    def to_frame(self) -> pd.DataFrame:
        return self.estimates

    def to_dict(self) -> dict[str, Any]:
        boot = self.boot
        return {"k": self.k, "base": self.base.to_dict(), "estimates": self.estimates,
                "ranges": self.ranges.rename_axis("quantity"), "bootstrap": {
                    "n_boot": len(boot), "se": boot.std(ddof=1), "lower": boot.quantile(0.025),
                    "upper": boot.quantile(0.975)},
                "c_by_k": self.c_by_k, "binned_residuals": self.bins, "breusch_pagan": self.breusch_pagan,
                "corr_u_l": self.corr_u_l, "leave_one_out_by": self.loo_by, "filter": self.report.to_dict()}

    def summary(self) -> str:
        return (f"Robustness on K = {self.k} ({self.base.nobs:,} rounds, {self.base.n_clusters} generations)\n"
                + self.estimates.to_string(index=False, float_format=lambda v: f"{v:.6g}") + "\n\n"
                + self.ranges.to_string(float_format=lambda v: f"{v:.6g}") + "\n"
                + f"Breusch–Pagan LM = {self.breusch_pagan['lm']:.4g}, p = {self.breusch_pagan['p']:.3g}; "
                f"corr(Ū, L) = {self.corr_u_l['k']:.3f} (K = {self.k}), {self.corr_u_l['pooled']:.3f} pooled; "
                f"leave-one-out by {self.loo_by}")


def _row(method: str, variant: str, fit: OLSResults | None = None, alpha: float = np.nan, c: float = np.nan,
         ci: tuple[float, float, float, float] | None = None, n: int = 0) -> dict[str, Any]:
    if fit is not None:
        cis = fit.conf_int()
        alpha, c, n = fit.params["u_bar"], fit.params["context_len"], fit.nobs
        ci = (cis.loc["u_bar", "lower"], cis.loc["u_bar", "upper"], cis.loc["context_len", "lower"],
              cis.loc["context_len", "upper"])
    ci = ci or (np.nan,) * 4
    return {"method": method, "variant": variant, "n": n, "alpha": alpha, "alpha_lower": ci[0],
            "alpha_upper": ci[1], "c": c, "c_lower": ci[2], "c_upper": ci[3]}


def robustness_checks(rounds: pd.DataFrame, k: int = 8, n_boot: int = 999, seed: int = 0, n_bins: int = 10,
                      trim: float = 0.01, n_blocks: int = 14) -> RobustnessResults:
    """Run the robustness checks on the decode rounds of budget ``k``.

    Leave-one-out uses the ``category`` column when the rounds have one with at least two values,
    otherwise ``n_blocks`` consecutive blocks of generations (by ``generation_id``).
    """
    dec, report = decode_rounds(rounds, timing="target")
    if k not in set(dec["K"].unique().tolist()):
        raise SpeclimitsError(f"no decode rounds with K = {k} in the trace (K present: {sorted(dec['K'].unique())})")
    dk = dec.loc[dec["K"].to_numpy() == k].reset_index(drop=True)
    mom = CellMoments.from_rounds(dk)
    base = fit_ols(mom, DESIGN)
    rows = [_row("OLS (clustered SE)", "all rounds", base)]

    boot = cluster_bootstrap(mom, DESIGN, draw_counts(mom.n_clusters, n_boot, seed))
    bq = boot.quantile([0.025, 0.975])
    rows.append(_row("cluster bootstrap", f"{n_boot} resamples of generations, percentile CI",
                     alpha=float(boot["u_bar"].mean()), c=float(boot["context_len"].mean()), n=base.nobs,
                     ci=(bq.loc[0.025, "u_bar"], bq.loc[0.975, "u_bar"], bq.loc[0.025, "context_len"],
                         bq.loc[0.975, "context_len"])))

    x = np.column_stack([np.ones(len(dk)), dk["u_bar"].to_numpy(float), dk["context_len"].to_numpy(float)])
    y = dk["t_target_ms"].to_numpy(float)
    rlm = sm.RLM(y, x, M=sm.robust.norms.HuberT()).fit()
    rci = rlm.conf_int()
    rows.append(_row("Huber (statsmodels RLM)", "HuberT, t = 1.345", alpha=rlm.params[1], c=rlm.params[2],
                     n=len(y), ci=(rci[1, 0], rci[1, 1], rci[2, 0], rci[2, 1])))

    resid = y - predict(mom, DESIGN, base.params)  # moments keep the rows in dk's order
    keep = np.abs(resid) <= np.quantile(np.abs(resid), 1 - trim)
    rows.append(_row("trimmed", f"{100 * trim:g}% largest |residual| dropped",
                     fit_ols(CellMoments.from_rounds(dk.loc[keep]), DESIGN)))

    gens = np.sort(dk["generation_id"].unique())
    half = gens[: len(gens) // 2]
    first = np.isin(mom.cells["generation_id"].to_numpy(), half)
    rows.append(_row("run halves", "first half of generations", fit_ols(mom.subset(first), DESIGN)))
    rows.append(_row("run halves", "second half of generations", fit_ols(mom.subset(~first), DESIGN)))

    if "category" in mom.cells and mom.cells["category"].nunique() >= 2:
        loo_by, labels = "category", mom.cells["category"].to_numpy()
    else:
        loo_by = "generation block"
        rank = np.searchsorted(gens, mom.cells["generation_id"].to_numpy())
        labels = np.array([f"block {b + 1}" for b in rank * n_blocks // len(gens)])
    for lab in sorted(set(labels.tolist())):
        rows.append(_row(f"leave one {loo_by} out", f"without {lab}", fit_ols(mom.subset(labels != lab), DESIGN)))
    estimates = pd.DataFrame(rows)

    all_mom = CellMoments.from_rounds(dec.loc[dec["K"].to_numpy() >= 1])
    c_rows = []
    for kk in sorted(all_mom.cells["K"].unique()):
        f = fit_ols(all_mom.where(K=int(kk)), DESIGN)
        c_rows.append({"K": int(kk), "c": f.params["context_len"], "c_se": f.bse["context_len"]})
    c_by_k = pd.DataFrame(c_rows)

    bins = []
    for var in ("context_len", "kv_usage", "round"):
        v = dk[var].to_numpy(float)
        edges = np.unique(np.quantile(v, np.linspace(0, 1, n_bins + 1)))
        b = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)
        g = pd.DataFrame({"b": b, "r": resid, "v": v}).groupby("b")
        agg = g.agg(center=("v", "mean"), mean_resid=("r", "mean"), sd=("r", "std"), n=("r", "size")).reset_index()
        agg["se"] = agg["sd"] / np.sqrt(agg["n"])
        agg.insert(0, "variable", var)
        bins.append(agg.drop(columns=["sd"]).rename(columns={"b": "bin"}))
    bp = het_breuschpagan(resid, x)
    corr_k = float(np.corrcoef(dk["u_bar"], dk["context_len"])[0, 1])
    corr_all = float(np.corrcoef(all_mom.column("u_bar"), all_mom.column("context_len"))[0, 1])
    return RobustnessResults(k, base, estimates, boot, c_by_k, pd.concat(bins, ignore_index=True),
                             {"lm": float(bp[0]), "p": float(bp[1]), "paper_p": paper.BP_P},
                             {"k": corr_k, "pooled": corr_all, "paper": paper.CORR_U_L}, loo_by, report)
