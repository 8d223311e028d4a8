"""The final target-time model (Eq. 4) and everything the appendix compares it with.

* per-K OLS ``T_T ~ Ū + L`` (SEs clustered by generation; GroupKFold(5) out-of-sample metrics);
* the joint categorical model: free ``β0(m)``, ``α(m)`` per m, shared ``c`` (:func:`fit_joint`);
* the pooled linear model with ``γ·K``, the comparison table, MAPE by K, leave-one-K-out;
* the regime boundary detected from the data by nested cross-validation (:func:`detect_boundary`);
* interpolation of per-K coefficients within a regime vs transfer across its boundary;
* the specification ladder.

:func:`fit_cost_model` is the public entry point used by the Oracle: it fits the joint model on
every decode round (including K = 0, which gives m = 1) and the draft line, and returns a
:class:`speclimits.costmodel.CostModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits import paper
from speclimits.stats._ols import (CellMoments, CVResult, Design, OLSResults, ResultsMixin, Term, ape,
                                   cross_products, cross_validate, cv_sse, fit_ols, group_folds, predict,
                                   t_interval)
from speclimits.stats.factors import select_k
from speclimits.trace import FilterReport, decode_rounds

M1_NOTE = ("m = 1 (K = 0, plain decoding): u_bar is constant (= top_k) so alpha(1) is not identified; "
           "convention alpha(1) := alpha(2), beta0(1) := intercept(1) - alpha(1) * top_k")


# ---------------------------------------------------------------------------
# joint categorical model (Eq. 4)
# ---------------------------------------------------------------------------


def _u_identified(mom: CellMoments, m: int) -> bool:
    sel = mom.cells["m"].to_numpy() == m
    n = mom.n[sel].sum()
    iu = mom.names.index("u_bar")
    s1, s2 = mom.zz[sel, iu, 0].sum(), mom.zz[sel, iu, iu].sum()
    var = s2 / n - (s1 / n) ** 2
    return bool(var > 1e-10 * max(1.0, (s1 / n) ** 2))


def categorical_design(mom: CellMoments) -> tuple[Design, list[int]]:
    """Eq. 4 on the m values present: ``beta0[m]`` and ``alpha[m]`` per m, shared ``c``.

    Returns the design and the m values whose α is not identified (Ū constant within m).
    """
    terms, unident = [], []
    for m in sorted(int(v) for v in mom.cells["m"].unique()):
        active = (lambda cells, lv=m: cells["m"].to_numpy() == lv)
        terms.append(Term(f"beta0[{m}]", "const", None, active))
        if _u_identified(mom, m):
            terms.append(Term(f"alpha[{m}]", "u_bar", None, active))
        else:
            unident.append(m)
    terms.append(Term("c", "context_len"))
    return Design(tuple(terms), "categorical: beta0(m) + alpha(m)·Ū + c·L"), unident


@dataclass(frozen=True)
class JointResults(ResultsMixin):
    """The joint categorical fit: the regression and its per-m coefficient table.

    ``by_m`` has one row per m: ``K``, ``n``, ``beta0``, ``beta0_se``, ``beta0_lower``/``upper``,
    ``alpha`` (...), ``identified`` (False where the m = 1 convention supplied α).
    ``c``/``c_se`` the shared context coefficient; ``top_k`` and ``notes`` record conventions.
    """

    ols: OLSResults
    by_m: pd.DataFrame
    top_k: float | None
    notes: tuple[str, ...] = ()

    @property
    def params(self) -> pd.Series:
        return self.ols.params

    @property
    def bse(self) -> pd.Series:
        return self.ols.bse

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        return self.ols.conf_int(alpha)

    @property
    def c(self) -> float:
        return float(self.ols.params["c"])

    def to_frame(self) -> pd.DataFrame:
        return self.by_m

    def to_dict(self) -> dict[str, Any]:
        return {"fit": self.ols.to_dict(), "by_m": self.by_m, "c": self.c, "c_se": float(self.ols.bse["c"]),
                "top_k": self.top_k, "notes": list(self.notes)}

    def summary(self) -> str:
        return (f"Joint categorical model (Eq. 4), {self.ols.nobs:,} rounds, {self.ols.n_clusters:,} generations\n"
                f"c = {self.c:.4e} ms/token (SE {self.ols.bse['c']:.2e})\n"
                + self.by_m.to_string(float_format=lambda v: f"{v:.5g}") + "".join(f"\nnote: {n}" for n in self.notes))


def fit_joint(mom: CellMoments, top_k: float | None = None) -> JointResults:
    """Fit Eq. 4 jointly on every cell of ``mom``; apply the m = 1 convention where α is unidentified.

    ``top_k`` is the constant Ū of an m = 1 pass (the target's experts per token); when None it is
    taken from the data (the constant Ū observed at that m).
    """
    design, unident = categorical_design(mom)
    ols = fit_ols(mom, design)
    p, cov = ols.params, ols.cov
    from scipy import stats as sps

    q = sps.t.ppf(0.975, ols.df_t)
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    ident = [m for m in ms if m not in unident]
    notes: list[str] = []
    rows = []
    for m in ms:
        sel = mom.cells["m"].to_numpy() == m
        n = int(mom.n[sel].sum())
        k = int(mom.cells.loc[sel, "K"].iloc[0])
        b_name = f"beta0[{m}]"
        if m in ident:
            a_name = f"alpha[{m}]"
            alpha, alpha_var = p[a_name], cov.loc[a_name, a_name]
            beta0, beta0_var = p[b_name], cov.loc[b_name, b_name]
        else:
            if not ident:
                raise SpeclimitsError("alpha is not identified at any m (u_bar is constant everywhere)")
            donor = min(ident, key=lambda v: (abs(v - m), v))
            a_name = f"alpha[{donor}]"
            iu = mom.names.index("u_bar")
            u_obs = float(mom.zz[sel, iu, 0].sum() / n)
            tk = float(top_k) if top_k is not None else u_obs
            if top_k is not None and abs(tk - u_obs) > 1e-6:
                notes.append(f"m = {m}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
            alpha, alpha_var = p[a_name], cov.loc[a_name, a_name]
            beta0 = p[b_name] - alpha * tk
            beta0_var = cov.loc[b_name, b_name] + tk ** 2 * alpha_var - 2 * tk * cov.loc[b_name, a_name]
            notes.append(f"m = {m}: alpha({m}) := alpha({donor}) = "
                         f"{alpha:.4g}, beta0({m}) = intercept({m}) - alpha({m}) * {tk:g} "
                         f"(top_k from {'the trace meta' if top_k is not None else 'the observed constant u_bar'}); "
                         f"u_bar is constant at this m so alpha({m}) is not identified from the data")
        b_se, a_se = math.sqrt(max(beta0_var, 0)), math.sqrt(max(alpha_var, 0))
        rows.append({"m": m, "K": k, "n": n, "beta0": beta0, "beta0_se": b_se, "beta0_lower": beta0 - q * b_se,
                     "beta0_upper": beta0 + q * b_se, "alpha": alpha, "alpha_se": a_se,
                     "alpha_lower": alpha - q * a_se, "alpha_upper": alpha + q * a_se, "identified": m in ident})
    return JointResults(ols, pd.DataFrame(rows), float(top_k) if top_k is not None else None, tuple(notes))


# ---------------------------------------------------------------------------
# per-K fits
# ---------------------------------------------------------------------------

PER_K_DESIGN = Design.linear("u_bar", "context_len", label="Ū + L (per K)")


def fit_per_k(mom: CellMoments, n_splits: int = 5) -> tuple[pd.DataFrame, dict[int, OLSResults], dict[int, CVResult]]:
    """Per-K OLS ``T_T ~ Ū + L`` with clustered SEs and GroupKFold metrics within each K.

    Returns (table with one row per K, fits by K, CV results by K).
    """
    rows, fits, cvs = [], {}, {}
    for k in sorted(int(v) for v in mom.cells["K"].unique()):
        sub = mom.where(K=k)
        fit = fit_ols(sub, PER_K_DESIGN)
        cv = cross_validate(sub, PER_K_DESIGN, group_folds(sub, n_splits))
        fits[k], cvs[k] = fit, cv
        ci = fit.conf_int()
        row = {"K": k, "m": int(sub.cells["m"].iloc[0]), "n": fit.nobs, "n_generations": fit.n_clusters}
        for col, name in (("const", "beta0"), ("u_bar", "alpha"), ("context_len", "c")):
            row[name] = fit.params[col]
            row[f"{name}_se"] = fit.bse[col]
            row[f"{name}_lower"] = ci.loc[col, "lower"]
            row[f"{name}_upper"] = ci.loc[col, "upper"]
        for met in ("r2", "rmse", "mape"):
            row[f"cv_{met}"], row[f"cv_{met}_ci"] = cv.mean_ci(met)
        rows.append(row)
    return pd.DataFrame(rows), fits, cvs


# ---------------------------------------------------------------------------
# regime boundary from the data
# ---------------------------------------------------------------------------


def regime_design(split: int | None, ms: Sequence[int]) -> Design:
    """Two regimes split after m = ``split`` (None: one regime): per regime a free intercept, slope in m
    (dropped for a regime holding a single m) and α; ``c`` shared. ``ms``: the m values present."""
    if split is None:
        return Design.linear("m", "u_bar", "context_len", label="one regime")
    terms = []
    for lv, members in ((0, [m for m in ms if m <= split]), (1, [m for m in ms if m > split])):
        active = (lambda cells, s=split, lv=lv: (cells["m"].to_numpy() > s) == bool(lv))
        terms.append(Term(f"const[r{lv}]", "const", None, active))
        if len(members) > 1:
            terms.append(Term(f"m[r{lv}]", "const", "m", active))
        terms.append(Term(f"u_bar[r{lv}]", "u_bar", None, active))
    terms.append(Term("context_len", "context_len"))
    return Design(tuple(terms), f"regimes m <= {split} | m > {split}")


def _split_scores(mom: CellMoments, splits: Sequence[int | None], n_splits: int) -> pd.DataFrame:
    folds = group_folds(mom, n_splits)
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    out = []
    for s in splits:
        sse, n = cv_sse(mom, regime_design(s, ms), folds)
        out.append({"split": s, "cv_rmse": math.sqrt(sse / n)})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class BoundaryResults(ResultsMixin):
    """Where the regime change is, chosen by out-of-sample error.

    ``curve``: CV RMSE (GroupKFold on all rounds) of each candidate split (``split`` = last m of the
    lower regime; NaN = no split). ``outer``: per outer fold the split selected by inner GroupKFold
    on the training folds alone, and the held-out RMSE / MAPE of that selection. ``split`` is the
    selection on all the data; ``method`` says how it was chosen.
    """

    split: int | None
    curve: pd.DataFrame
    outer: pd.DataFrame
    method: str

    @property
    def params(self) -> pd.Series:
        return pd.Series({"split": self.split})

    def to_frame(self) -> pd.DataFrame:
        return self.curve

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split, "method": self.method, "curve": self.curve, "outer_folds": self.outer}

    def summary(self) -> str:
        agree = int((self.outer["selected"] == self.split).sum())
        return (f"Regime boundary: m <= {self.split} | m > {self.split} "
                f"(selected in {agree}/{len(self.outer)} outer folds)\n{self.method}\n"
                + self.curve.to_string(float_format="{:.5f}".format))


def detect_boundary(mom: CellMoments, n_splits: int = 5) -> BoundaryResults:
    """Choose the m split by out-of-sample RMSE, with the choice itself cross-validated.

    Candidates: no split, or a split after each m but the largest. For each outer GroupKFold fold
    the split is chosen by inner GroupKFold(``n_splits``) on the four training folds only, and the
    chosen model is scored on the held-out fold, so the reported error includes the search.
    """
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    splits: list[int | None] = [None, *ms[:-1]]
    curve = _split_scores(mom, splits, n_splits)
    best = curve.loc[curve["cv_rmse"].idxmin(), "split"]
    best = None if best is None or (isinstance(best, float) and math.isnan(best)) else int(best)
    folds = group_folds(mom, n_splits)
    cell_fold = folds[mom.cells["cluster"].to_numpy()]
    outer = []
    for f in range(n_splits):
        train, test = mom.subset(cell_fold != f), mom.subset(cell_fold == f)
        inner = _split_scores(train, splits, n_splits)
        sel = inner.loc[inner["cv_rmse"].idxmin(), "split"]
        sel = None if sel is None or (isinstance(sel, float) and math.isnan(sel)) else int(sel)
        design = regime_design(sel, ms)
        fit = fit_ols(train, design)
        yhat = predict(test, design, fit.params)
        outer.append({"fold": f, "selected": sel, "test_rmse": float(np.sqrt(np.mean((test.y - yhat) ** 2))),
                      "test_mape": float(ape(test.y, yhat).mean())})
    method = (f"Candidates: no split, or m <= s | m > s for s in {ms[:-1]}; each candidate model has a free "
              f"intercept, slope in m and α per regime and a shared c. The split minimizing GroupKFold({n_splits}) "
              f"out-of-sample RMSE is chosen; nested CV (the choice repeated inside each outer training set) "
              f"shows how stable the choice is and gives its honest held-out error.")
    curve = curve.assign(split=curve["split"].astype("float"))
    return BoundaryResults(best, curve, pd.DataFrame(outer), method)


# ---------------------------------------------------------------------------
# interpolation within a regime vs transfer across the boundary
# ---------------------------------------------------------------------------


def interpolation_table(mom: CellMoments, fits: dict[int, OLSResults], split: int | None) -> pd.DataFrame:
    """Predict each K's rounds with coefficients taken from other Ks' per-K fits.

    ``interpolate``: the mean of the coefficients of m-1 and m+1 (both present); ``within`` when all
    three m lie in one regime, ``across`` when the pair straddles the boundary. ``transfer``: the
    boundary m's predicted with the coefficients of the adjacent m on the other side.
    Columns: ``K``, ``m``, ``scheme``, ``relation``, ``sources`` (Ks), ``mape`` (%).
    """
    by_m = {int(f_k) + 1: fit for f_k, fit in fits.items()}
    ms = sorted(by_m)
    regime = (lambda m: 0 if split is None or m <= split else 1)
    rows = []

    def score(m: int, params: np.ndarray) -> float:
        sub = mom.where(m=m)
        return float(ape(sub.y, predict(sub, PER_K_DESIGN, params)).mean())

    for m in ms:
        if m - 1 in by_m and m + 1 in by_m:
            params = (by_m[m - 1].params.to_numpy() + by_m[m + 1].params.to_numpy()) / 2
            rel = "within regime" if regime(m - 1) == regime(m) == regime(m + 1) else "across boundary"
            rows.append({"K": m - 1, "m": m, "scheme": "interpolate", "relation": rel,
                         "sources": f"K={m - 2},{m}", "mape": score(m, params)})
    if split is not None and split in by_m and split + 1 in by_m:
        for m, src in ((split, split + 1), (split + 1, split)):
            rows.append({"K": m - 1, "m": m, "scheme": "transfer", "relation": "across boundary",
                         "sources": f"K={src - 1}", "mape": score(m, by_m[src].params.to_numpy())})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# the whole section
# ---------------------------------------------------------------------------

LADDER = [
    ("Ū", ("u_bar",)),
    ("Ū + L", ("u_bar", "context_len")),
    ("+ linear m", ("u_bar", "context_len", "m")),
    ("+ m·L", ("u_bar", "context_len", "m", "m:context_len")),
    ("+ m·Ū", ("u_bar", "context_len", "m", "m:context_len", "m:u_bar")),
    ("+ E_max", ("u_bar", "context_len", "m", "m:context_len", "m:u_bar", "e_max")),
]


@dataclass(frozen=True)
class FinalModelResults(ResultsMixin):
    """Everything of the final-model section (see the module docstring); tables are DataFrames."""

    per_k: pd.DataFrame
    joint: JointResults
    pooled: OLSResults
    comparison: pd.DataFrame
    pooled_std: pd.DataFrame
    mape_by_k: pd.DataFrame
    loko: pd.DataFrame
    boundary: BoundaryResults
    interpolation: pd.DataFrame
    ladder: pd.DataFrame
    report: FilterReport
    n_rows: int
    n_generations: int
    per_k_fits: dict[int, OLSResults] = field(default_factory=dict, repr=False)

    @property
    def params(self) -> pd.Series:
        return self.joint.params

    @property
    def bse(self) -> pd.Series:
        return self.joint.bse

    def to_frame(self) -> pd.DataFrame:
        return self.per_k

    def to_dict(self) -> dict[str, Any]:
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "per_k": self.per_k, "joint": self.joint.to_dict(), "pooled": self.pooled.to_dict(),
                "comparison": self.comparison,
                "pooled_vs_base": {"cv_rmse_reduction": self.comparison.attrs["pooled_drmse"][0],
                                   "cv_rmse_reduction_ci": self.comparison.attrs["pooled_drmse"][1],
                                   "cv_rmse_reduction_pct": self.comparison.attrs["pooled_drmse_pct"],
                                   "mape_ratio_base_over_categorical": self.comparison.attrs["mape_ratio"]},
                "pooled_standardized": self.pooled_std, "mape_by_k": self.mape_by_k,
                "leave_one_k_out": self.loko, "boundary": self.boundary.to_dict(),
                "interpolation": self.interpolation, "ladder": self.ladder,
                "paper_comparison": self.headline().reset_index()}

    def headline(self) -> pd.DataFrame:
        """The section's numbers beside the paper's: one row per quantity (``ours``, ``paper`` as text)."""
        pk, split = self.per_k, self.boundary.split
        small = pk[pk["m"] <= split] if split is not None else pk.iloc[:0]
        large = pk[pk["m"] > split] if split is not None else pk

        def rng(s: pd.Series, fmt: str = "{:.3f}") -> str:
            return "—" if s.empty else f"{fmt.format(s.min())}–{fmt.format(s.max())}"

        pooled, pse = self.pooled.params, self.pooled.bse
        interp = self.interpolation
        within = interp[(interp["scheme"] == "interpolate") & (interp["relation"] == "within regime")]["mape"]
        across = interp[interp["relation"] == "across boundary"]["mape"]
        mk = self.mape_by_k
        comp = self.comparison
        d, dh = comp.attrs["pooled_drmse"]

        def at_k(k: int) -> str:
            v = mk.loc[mk["K"] == k, "pooled"]
            return f"{v.iloc[0]:.1f}" if len(v) else "—"

        rows = [
            ("regime boundary (last m of the small regime)", f"{split} (nested GroupKFold)", "4 (by eye)"),
            ("α(m), small regime (ms/expert)", rng(small["alpha"]), paper.fmt_range(paper.ALPHA_SMALL)),
            ("α(m), large regime (ms/expert)", rng(large["alpha"]), paper.fmt_range(paper.ALPHA_LARGE)),
            ("β0(m), small regime (ms)", rng(small["beta0"], "{:.2f}"), paper.fmt_range(paper.BETA0_SMALL, digits=1)),
            ("β0 at the first large m (ms)", f"{large['beta0'].iloc[0]:.2f}" if len(large) else "—",
             f"{paper.BETA0_LARGE_START}"),
            ("c across per-K fits (1e-3 ms/token)", rng(pk["c"] * 1e3), paper.fmt_range(paper.C_RANGE, 1e3)),
            ("c, joint categorical (1e-3 ms/token)", f"{self.joint.c * 1e3:.4f} ({self.joint.bse['c'] * 1e3:.4f})", "—"),
            ("pooled α (SE)", f"{pooled['u_bar']:.4f} ({pse['u_bar']:.4f})", "0.2528 (0.0014)"),
            ("pooled c (SE), 1e-3", f"{pooled['context_len'] * 1e3:.3f} ({pse['context_len'] * 1e3:.3f})",
             "1.09 (0.02)"),
            ("pooled γ per K (SE)", f"{pooled['K']:.3f} ({pse['K']:.3f})", "−0.081 (0.004)"),
            ("pooled β0 (SE)", f"{pooled['const']:.3f} ({pse['const']:.3f})", "5.971 (0.035)"),
            ("R²: Ū + L → + γK", f"{comp.loc['Ū + L', 'r2']:.3f} → {comp.iloc[1]['r2']:.3f}", "0.856 → 0.861"),
            ("CV RMSE reduction by γK (ms)", f"{d:.4f} ± {dh:.4f} ({comp.attrs['pooled_drmse_pct']:.1f}%)",
             paper.POOLED_DRMSE),
            ("CV MAPE ratio, Ū + L over categorical", f"{comp.attrs['mape_ratio']:.1f}×", "≈12×"),
            ("pooled CV MAPE at K ≥ 5 (%)", rng(mk.loc[mk["K"] >= 5, "pooled"], "{:.1f}"),
             paper.fmt_range(paper.POOLED_MAPE_LARGE, digits=1)),
            ("pooled CV MAPE at K = 1 / K = 3 (%)", f"{at_k(1)} / {at_k(3)}", "7.2 / 12.7"),
            ("leave-one-K-out MAPE, mean (%)", f"{self.loko['loko_mape'].mean():.1f}", f"{paper.LOKO_MEAN}"),
            ("within-K CV MAPE (%)", rng(pk["cv_mape"], "{:.2f}"), paper.fmt_range(paper.WITHIN_K_MAPE, digits=2)),
            ("interpolation within a regime, MAPE (%)", rng(within, "{:.2f}"),
             paper.fmt_range(paper.INTERP_WITHIN, digits=2)),
            ("across the boundary, MAPE (%)", rng(across, "{:.1f}"), paper.fmt_range(paper.TRANSFER_ACROSS, digits=1)),
            ("categorical CV MAPE (%) / R²", f"{comp.iloc[2]['cv_mape']:.2f} / {comp.iloc[2]['r2']:.3f}",
             "0.37 / 0.999"),
        ]
        return pd.DataFrame(rows, columns=["quantity", "ours", "paper"]).set_index("quantity")

    def summary(self) -> str:
        cols = ["K", "m", "alpha", "alpha_se", "beta0", "c", "cv_r2", "cv_mape"]
        return "\n\n".join([
            f"Final model (Eq. 4): {self.n_rows:,} rounds, {self.n_generations:,} generations",
            "Per-K OLS T_T ~ Ū + L (SE clustered by generation):\n"
            + self.per_k[cols].to_string(index=False, float_format=lambda v: f"{v:.5g}"),
            self.boundary.summary(),
            "Comparison:\n" + self.comparison.to_string(float_format=lambda v: f"{v:.4g}"),
            "Specification ladder:\n" + self.ladder.to_string(float_format=lambda v: f"{v:.4g}"),
        ])


def fit_final_model(rounds: pd.DataFrame, k_values: Sequence[int] | None = None, n_splits: int = 5) -> FinalModelResults:
    """Fit the final model and its comparisons on the decode rounds with K in ``k_values`` (default K >= 1)."""
    dec, report = decode_rounds(rounds, timing="target")
    dec = select_k(dec, k_values)
    mom = CellMoments.from_rounds(dec)
    if mom.cells["K"].nunique() < 2:
        raise SpeclimitsError("the final-model comparisons need at least two K values in the trace")
    per_k, fits, cvs = fit_per_k(mom, n_splits)
    joint = fit_joint(mom)
    folds = group_folds(mom, n_splits)
    cat_design, _ = categorical_design(mom)
    base_design = Design.linear("u_bar", "context_len")
    pooled_design = Design.linear("u_bar", "context_len", "K", label="Ū + L + γK (pooled)")
    pooled = fit_ols(mom, pooled_design)
    cv_base = cross_validate(mom, base_design, folds)
    cv_pooled = cross_validate(mom, pooled_design, folds)
    cv_cat = cross_validate(mom, cat_design, folds)
    base_fit = fit_ols(mom, base_design)

    comp = []
    for name, fit, cv, p_r2 in (("Ū + L", base_fit, cv_base, paper.POOLED_R2[0]),
                                ("Ū + L + γK (pooled)", pooled, cv_pooled, paper.POOLED_R2[1]),
                                ("categorical (Eq. 4)", joint.ols, cv_cat, 0.999)):
        r = {"model": name, "r2": fit.rsquared, "paper_r2": p_r2}
        for met in ("r2", "rmse", "mape"):
            r[f"cv_{met}"], r[f"cv_{met}_ci"] = cv.mean_ci(met)
        comp.append(r)
    comparison = pd.DataFrame(comp).set_index("model")
    comparison["paper_cv_mape"] = [4.4, None, 0.37]
    d_rmse = t_interval(cv_base.folds["rmse"].to_numpy() - cv_pooled.folds["rmse"].to_numpy())
    comparison.attrs.update(pooled_drmse=d_rmse, pooled_drmse_pct=100 * d_rmse[0] / comparison.loc["Ū + L", "cv_rmse"],
                            mape_ratio=comparison.loc["Ū + L", "cv_mape"] / comparison.loc["categorical (Eq. 4)", "cv_mape"])
    st = pooled.standardized()
    pooled_std = pd.DataFrame({"beta_std": st["beta_std"], "paper": pd.Series(paper.POOLED_STD)}).loc[
        ["K", "u_bar", "context_len"]]

    # MAPE by K of the out-of-fold predictions
    row_k = mom.row_attr("K")
    mk = []
    for k in sorted(np.unique(row_k)):
        sel = row_k == k
        mk.append({"K": int(k), "pooled": float(ape(mom.y[sel], cv_pooled.oof[sel]).mean()),
                   "categorical": float(ape(mom.y[sel], cv_cat.oof[sel]).mean()),
                   "per_k": float(per_k.loc[per_k["K"] == k, "cv_mape"].iloc[0]),
                   "paper_pooled": paper.POOLED_MAPE_BY_K.get(int(k), np.nan)})
    mape_by_k = pd.DataFrame(mk)

    # leave one K out, pooled form
    a_all = pooled_design.matrices(mom)
    xtx_c, xty_c = cross_products(mom, a_all)
    cell_k = mom.cells["K"].to_numpy()
    lk = []
    from speclimits.stats._ols import _solve

    for k in sorted(np.unique(cell_k)):
        beta = _solve(xtx_c[cell_k != k].sum(0), xty_c[cell_k != k].sum(0), pooled_design.columns)
        sub = mom.where(K=int(k))
        lk.append({"K": int(k), "loko_mape": float(ape(sub.y, predict(sub, pooled_design, beta)).mean()),
                   "within_k_mape": float(per_k.loc[per_k["K"] == k, "cv_mape"].iloc[0]),
                   "paper_loko": paper.LOKO_PEAKS.get(int(k), np.nan)})
    loko = pd.DataFrame(lk)

    boundary = detect_boundary(mom, n_splits)
    interp = interpolation_table(mom, fits, boundary.split)

    lad = []
    for name, specs in LADDER:
        d = Design.linear(*specs, label=name)
        cv = cross_validate(mom, d, folds)
        lad.append({"spec": name, "r2": fit_ols(mom, d).rsquared, "cv_mape": cv.mean_ci("mape")[0],
                    "cv_mape_ci": cv.mean_ci("mape")[1], "cv_rmse": cv.mean_ci("rmse")[0]})
    lad.append({"spec": "categorical (Eq. 4)", "r2": joint.ols.rsquared, "cv_mape": cv_cat.mean_ci("mape")[0],
                "cv_mape_ci": cv_cat.mean_ci("mape")[1], "cv_rmse": cv_cat.mean_ci("rmse")[0]})
    ladder = pd.DataFrame(lad).set_index("spec")
    ladder["paper_cv_mape"] = [paper.LADDER[s][0] for s in ladder.index]
    ladder["paper_r2"] = [paper.LADDER[s][1] for s in ladder.index]
    return FinalModelResults(per_k, joint, pooled, comparison, pooled_std, mape_by_k, loko, boundary, interp,
                             ladder, report, mom.n_rows, mom.n_clusters, fits)


# ---------------------------------------------------------------------------
# the cost model for the Oracle
# ---------------------------------------------------------------------------


def fit_cost_model(rounds: pd.DataFrame, top_k: int | None = None, source: str = "") -> CostModel:
    """Fit the cost model of DESIGN §4 on a trace's ``rounds`` table.

    Target: the joint categorical model (free ``beta0(m)``, ``alpha(m)``, shared ``c``) on every
    decode round with a non-zero target time, K = 0 included (it gives m = 1; see :data:`M1_NOTE`
    for the convention; pass ``top_k`` from ``meta["models"]["target"]["top_k"]``, else the constant
    Ū observed at m = 1 is used). Draft: ``T_D = a·K + b`` on decode rounds with K >= 1 and a
    non-zero draft time. Standard errors, row counts and conventions are recorded in ``extra``
    (written to the JSON under ``"fit"``).
    """
    dec, report = decode_rounds(rounds, timing="target")
    joint = fit_joint(CellMoments.from_rounds(dec, base=("u_bar", "context_len")), top_k=top_k)
    from speclimits.stats.draft import fit_draft_line

    draft = fit_draft_line(rounds)
    by_m = joint.by_m.set_index("m")
    extra = {"fit": {
        "target": {"n_rounds": joint.ols.nobs, "n_generations": joint.ols.n_clusters, "r2": joint.ols.rsquared,
                   "c_se": float(joint.ols.bse["c"]), "filter": report.to_dict(),
                   "se_by_m": {str(m): {"beta0": float(r.beta0_se), "alpha": float(r.alpha_se)}
                               for m, r in by_m.iterrows()},
                   "alpha_identified": {str(m): bool(r.identified) for m, r in by_m.iterrows()},
                   "top_k": joint.top_k},
        "draft": {"n_rounds": draft.nobs, "n_generations": draft.n_clusters, "r2": draft.rsquared,
                  "a_se": float(draft.bse["K"]), "b_se": float(draft.bse["const"])},
        "notes": list(joint.notes) + ["standard errors clustered by generation (statsmodels' correction)"],
    }}
    return CostModel(c=joint.c, beta0={int(m): float(r.beta0) for m, r in by_m.iterrows()},
                     alpha={int(m): float(r.alpha) for m, r in by_m.iterrows()},
                     a=float(draft.params["K"]), b=float(draft.params["const"]),
                     source=source or "speclimits fit: joint categorical target model + draft line", extra=extra)
