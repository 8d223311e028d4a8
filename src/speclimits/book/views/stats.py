"""Reader tables of the statistics sections, factors (2), the draft model (4) and robustness (5): the
section's result object (:mod:`speclimits.stats`) as a narrow frame, intervals in one cell, the paper's
value (:mod:`speclimits.paper`) in its own column; ``key_results_*``: the rows of each section's box."""

from __future__ import annotations

from typing import Any

import pandas as pd

from speclimits import paper
from speclimits.book.present import (NOT_IDENTIFIED, Result, ci_cells, fmt_ci, fmt_num, fmt_p, fmt_paper, fmt_se,
                                     half_cells)


# -- section 2: factors ----------------------------------------------------------------------------


def factor_table(res: Any) -> pd.DataFrame:
    """Table A2: each factor's standalone CV $R^2$ and RMSE and its paired RMSE gain over Ū alone."""
    t = res.table
    return pd.DataFrame({
        "Factor": list(t["label"]),
        "CV $R^2$ [95% CI]": half_cells(t["r2"], t["r2_ci"]),
        "Paper $R^2$": [fmt_paper(paper.FACTORS[f]["r2"]) for f in t.index],
        "CV RMSE (ms)": half_cells(t["rmse"], t["rmse_ci"]),
        "ΔRMSE over $\\bar U_r$ (ms)": half_cells(t["drmse"], t["drmse_ci"]),
        "Paper ΔRMSE (ms)": [fmt_paper(paper.FACTORS[f]["drmse"]) for f in t.index],
    })


def standardized_table(res: Any) -> pd.DataFrame:
    """β* of Ū and L within each K, intervals in one cell, the paper's values where it quotes them."""
    b = res.by_k

    def column(term: str, what: str) -> list[str]:
        d = b[b["term"] == term].set_index("K").reindex(ks)
        if what == "paper":
            return [fmt_paper(paper.STANDARDIZED_BY_K.get(k, (None, None))[term != "u_bar"]) for k in ks]
        return ci_cells(d["beta_std"], d["lower"], d["upper"])

    ks = sorted(int(k) for k in b["K"].unique())
    return pd.DataFrame({
        "K": ks,
        "$\\beta^*$ of $\\bar U_r$ [95% CI]": column("u_bar", "est"),
        "Paper ($\\bar U_r$)": column("u_bar", "paper"),
        "$\\beta^*$ of $L$ [95% CI]": column("context_len", "est"),
        "Paper ($L$)": column("context_len", "paper"),
    })


def paper_strongest_factor(res: Any) -> str | None:
    """The factor the paper names strongest (its Table A2 note), by our label."""
    for name, row in paper.FACTORS.items():
        if row.get("r2") == "strongest single factor" and name in res.table.index:
            return str(res.table.loc[name, "label"])
    return None


def key_results_factors(res: Any) -> list[Result]:
    """The section's key results (a row the trace cannot give, e.g. Table A2 without the generations
    for its folds, says so)."""
    t = res.table
    k1 = max(res.k_values)
    bk = res.by_k.set_index(["term", "K"])
    paper_u = paper.STANDARDIZED_BY_K.get(k1, (None, None))[0]
    if t.empty:
        rows = [Result("strongest single factor (H1)", NOT_IDENTIFIED, "Ū")]
    else:
        best = t["r2"].idxmax()
        rows = [
            Result.of("strongest single factor (H1)", str(t.loc[best, "label"]), paper=paper_strongest_factor(res),
                      ref="tbl-factors-a2"),
            Result.of(f"CV $R^2$ of {t.loc[best, 'label']}", t.loc[best, "r2"], t.loc[best, "r2"] - t.loc[best, "r2_ci"],
                      t.loc[best, "r2"] + t.loc[best, "r2_ci"], paper=fmt_paper(paper.FACTORS.get(best, {}).get("r2")),
                      ref="tbl-factors-a2"),
        ]
    if "context_len" in t.index:
        r = t.loc["context_len"]
        rows.append(Result.of("ΔRMSE of $L$ over $\\bar U_r$", r["drmse"], r["drmse"] - r["drmse_ci"],
                              r["drmse"] + r["drmse_ci"], paper=fmt_paper(paper.FACTORS["context_len"]["drmse"]), unit="ms",
                              ref="tbl-factors-a2"))
    if ("u_bar", k1) in bk.index:
        r = bk.loc[("u_bar", k1)]
        rows.append(Result.of(f"$\\beta^*$ of $\\bar U_r$ at K = {k1} (H3)", r["beta_std"], r["lower"], r["upper"],
                              paper=paper_u, ref="tbl-factors-standardized"))
    rows.append(Result.of("corr($\\bar U_r$, $L$)", res.corr.loc["u_bar", "context_len"], paper=paper.CORR_U_L,
                          ref="fig-factors-correlations"))
    return rows


# -- section 4: the draft model --------------------------------------------------------------------


def draft_table(res: Any) -> pd.DataFrame:
    """The fit's headline numbers beside the paper's: a and b with clustered 95% intervals, the errors."""
    t = res.table().reset_index()
    ci = res.conf_int()
    medape, medape_h = res.cv.mean_ci("medape")
    ours = []
    for q, est in zip(t["quantity"], t["ours"]):
        if q[:2] in ("a ", "b "):
            ours.append(fmt_ci(est, ci.loc[q[0], "lower"], ci.loc[q[0], "upper"]))
        elif q.startswith("CV MedAPE"):
            ours.append(half_cells([medape], [medape_h])[0])
        else:
            ours.append(fmt_num(est, 3 if "R²" in q else 2))
    return pd.DataFrame({"Quantity": t["quantity"], "Ours [95% CI]": ours,
                         "Paper": [fmt_paper(_DRAFT_PAPER[k]) for k in t["key"]]})


#: The paper's draft-line numbers by the key of :meth:`DraftResults.table`.
_DRAFT_PAPER = {**paper.DRAFT, "a": f"{paper.DRAFT['a'][0]} ({paper.DRAFT['a'][1]})",
                "b": f"{paper.DRAFT['b'][0]} ({paper.DRAFT['b'][1]})"}


def draft_by_k_table(res: Any) -> pd.DataFrame:
    b = res.by_k
    return pd.DataFrame({
        "K": b["K"].astype(int),
        "Rounds": b["n"].astype(int),
        "Mean $T_D$ (ms)": b["mean_t_draft_ms"].astype(float),
        "Line $aK + b$ (ms)": b["line_ms"].astype(float),
        "Deviation (%)": b["dev_pct"].astype(float),
    })


def residual_quantile_table(res: Any) -> pd.DataFrame:
    """One row: the residual quantiles (ms) as columns."""
    q = res.residual_quantiles
    return pd.DataFrame({f"{k} (ms)": [float(v)] for k, v in q.items()})


def zero_comparison_table(res: Any) -> pd.DataFrame:
    z = res.zero_comparison.reset_index()
    return pd.DataFrame({
        "Fit": z.iloc[:, 0],
        "Rounds": z["n"].astype(int),
        "Zero-time rounds": z["n_zero"].astype(int),
        "a (ms/step) (SE)": [fmt_se(e, s) for e, s in zip(z["a"], z["a_se"])],
        "b (ms) (SE)": [fmt_se(e, s) for e, s in zip(z["b"], z["b_se"])],
        "$R^2$": z["r2"].astype(float),
    })


def key_results_draft(res: Any, why: str | None = None) -> list[Result]:
    """The draft line's key results; ``res`` None (the trace cannot give the line, ``why``): each row says so."""
    pa, pb = paper.DRAFT["a"], paper.DRAFT["b"]
    if res is None:
        return [Result("draft step cost a", NOT_IDENTIFIED, f"{pa[0]:g} ({pa[1]:g})"),
                Result("draft intercept b", NOT_IDENTIFIED, f"{pb[0]:g} ({pb[1]:g})")]
    ci = res.conf_int()
    medape, medape_h = res.cv.mean_ci("medape")
    return [
        Result.of("draft step cost a", res.params["a"], ci.loc["a", "lower"], ci.loc["a", "upper"],
                  paper=f"{pa[0]:g} ({pa[1]:g})", unit="ms", ref="tbl-draft-fit"),
        Result.of("draft intercept b", res.params["b"], ci.loc["b", "lower"], ci.loc["b", "upper"],
                  paper=f"{pb[0]:g} ({pb[1]:g})", unit="ms", ref="tbl-draft-fit"),
        Result.of("CV MedAPE of the line", medape, medape - medape_h, medape + medape_h,
                  paper=paper.DRAFT["cv_medape_pct"], unit="%", ref="tbl-draft-fit"),
        Result.of("per-round $R^2$", res.ols.rsquared, paper=paper.DRAFT["r2"], decimals=3, ref="tbl-draft-fit"),
    ]


# -- section 5: robustness -------------------------------------------------------------------------


def robustness_table(res: Any) -> pd.DataFrame:
    """Every re-estimate of α and c (c in 1e-3 ms/token), each with its interval and how it was made."""
    e = res.estimates
    return pd.DataFrame({
        "Check": [f"{m}: {v}" for m, v in zip(e["method"], e["variant"])],
        "Rounds": e["n"].astype(int),
        "α (ms/expert) [95% CI]": ci_cells(e["alpha"], e["alpha_lower"], e["alpha_upper"]),
        "c (10⁻³ ms/token) [95% CI]": ci_cells(e["c"], e["c_lower"], e["c_upper"], scale=1e3),
        "Interval": e["interval"],
    })


def ranges_table(res: Any) -> pd.DataFrame:
    r = res.ranges.reset_index()
    theirs = (paper.ROBUST_ALPHA, [1e3 * v for v in paper.ROBUST_C], [1e3 * v for v in paper.C_RANGE])  # ranges' rows
    return pd.DataFrame({
        "Quantity": r.iloc[:, 0],
        "Ours (min–max)": [paper.fmt_range(ab) for ab in zip(r["ours_min"], r["ours_max"])],
        "Paper (min–max)": [paper.fmt_range(ab, digits=4 if ab[0] < 1 else 3) for ab in theirs],
    })


def c_by_k_table(res: Any) -> pd.DataFrame:
    cbk = res.c_by_k
    return pd.DataFrame({
        "K": cbk["K"].astype(int),
        "c (10⁻³ ms/token) (SE)": [fmt_se(e * 1e3, s * 1e3) for e, s in zip(cbk["c"], cbk["c_se"])],
    })


def trends_table(res: Any) -> pd.DataFrame:
    t = res.trends
    return pd.DataFrame({
        "Variable": t["variable"],
        "Slope per SD (ms)": t["slope_per_sd"].astype(float),
        "p (slope)": [fmt_p(p) for p in t["p"]],
        "Wald F (df)": [f"{f:.2f} ({int(d)})" for f, d in zip(t["wald_f"], t["wald_df"])],
        "p (bins, Wald)": [fmt_p(p) for p in t["wald_p"]],
    })


def breusch_pagan_table(res: Any) -> pd.DataFrame:
    bp = res.breusch_pagan
    return pd.DataFrame({
        "Scope": bp["scope"],
        "Version": bp["version"],
        "LM (df)": [f"{lm:.1f} ({int(df)})" for lm, df in zip(bp["lm"], bp["df"])],
        "Rounds": bp["n"].astype(int),
        "p": [fmt_p(p) for p in bp["p"]],
        "Paper p": f"≈ {paper.BP_P:.0e}",
    })


def key_results_robustness(res: Any) -> list[Result]:
    e = res.estimates
    boot = e[e["method"] == "cluster bootstrap"].iloc[0]
    ols = e[e["method"].str.startswith("OLS")].iloc[0]
    huber = e[e["interval"].str.contains("sandwich")].iloc[0]
    r = res.ranges
    alpha_all = r[r.index.str.startswith("alpha")].iloc[0]
    c_k = r[r.index.str.contains("across per-K")].iloc[0]
    a_range = paper.fmt_range(paper.ROBUST_ALPHA, digits=4)
    return [
        Result.of(f"α at K = {res.k}, OLS, cluster-bootstrap interval", boot["alpha"], boot["alpha_lower"],
                  boot["alpha_upper"], paper=f"{a_range} (all checks)", unit="ms/expert", ref="tbl-robust-estimates"),
        Result.of(f"α at K = {res.k}, Huber, clustered sandwich", huber["alpha"], huber["alpha_lower"],
                  huber["alpha_upper"], paper=f"{a_range} (all checks)", unit="ms/expert", ref="tbl-robust-estimates"),
        Result.of(f"spread of α over all checks (% of OLS α = {ols['alpha']:.3g})",
                  100 * (alpha_all["ours_max"] - alpha_all["ours_min"]) / ols["alpha"],
                  paper=round(100 * (paper.ROBUST_ALPHA[1] - paper.ROBUST_ALPHA[0]) / paper.ROBUST_ALPHA[0], 2),
                  unit="%", ref="tbl-robust-ranges"),
        Result.of("c across the per-K fits (10⁻³ ms/token)", paper.fmt_range((c_k["ours_min"], c_k["ours_max"])),
                  paper=paper.fmt_range(paper.C_RANGE, 1e3), ref="tbl-robust-c-by-k"),
    ]
