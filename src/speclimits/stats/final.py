"""The final target-time model (Eq. 4) and everything the appendix compares it with.

* per-K OLS ``T_T ~ Ū + L`` (SEs clustered by generation; GroupKFold(5) out-of-sample metrics);
* the joint categorical model: free ``β0(m)``, ``α(m)`` per m, shared ``c`` (:func:`fit_joint`);
* the pooled linear model with ``γ·K``, MAPE by K, leave-one-K-out, other smooth forms in m
  (:mod:`speclimits.stats.comparisons`);
* whether and where the regime changes, by a parsimonious rule (:mod:`speclimits.stats.boundary`),
  and every regime-dependent row both at the rule's split and at the paper's m <= 4 | m >= 5
  (:mod:`speclimits.stats.regimes`);
* 95% cluster-bootstrap intervals on the headline cells (:mod:`speclimits.stats.uncertainty`) and
  the headline SEs clustered by generation and by prompt side by side.

:func:`fit_cost_model` is the public entry point used by the Oracle: it fits the joint model on
every decode round (including K = 0, which gives m = 1) and the draft line, and returns a
:class:`speclimits.costmodel.CostModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from speclimits import paper
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.stats import comparisons as cmp
from speclimits.stats import uncertainty as unc
from speclimits.stats._ols import (CellMoments, CVResult, Design, OLSResults, ResultsMixin, Term, cross_validate,
                                   fit_ols, group_folds)
from speclimits.stats.boundary import BoundaryResults, detect_boundary
from speclimits.stats.draft import fit_draft_line
from speclimits.stats.factors import select_k
from speclimits.stats.regimes import as_headline, regime_rows
from speclimits.trace import FilterReport, Trace, decode_rounds, read_trace

M1_NOTE = ("m = 1 (K = 0, plain decoding): u_bar is constant (= top_k) so alpha(1) is not identified; "
           "convention alpha(1) := alpha(2), beta0(1) := intercept(1) - alpha(1) * top_k")
PER_K_DESIGN = cmp.PER_K_DESIGN


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
    design: Design | None = field(default=None, repr=False)

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


def _convention(mom: CellMoments, ols: OLSResults, m: int, donor: int, top_k: float | None,
                notes: list[str]) -> tuple[float, float, float, float]:
    """α, var α, β0, var β0 at an m whose α is unidentified: α(m) := α(donor), β0 = intercept - α·top_k."""
    p, cov = ols.params, ols.cov
    sel = mom.cells["m"].to_numpy() == m
    iu = mom.names.index("u_bar")
    u_obs = float(mom.zz[sel, iu, 0].sum() / mom.n[sel].sum())
    tk = float(top_k) if top_k is not None else u_obs
    if top_k is not None and abs(tk - u_obs) > 1e-6:
        notes.append(f"m = {m}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
    a_name, b_name = f"alpha[{donor}]", f"beta0[{m}]"
    alpha, alpha_var = p[a_name], cov.loc[a_name, a_name]
    beta0 = p[b_name] - alpha * tk
    beta0_var = cov.loc[b_name, b_name] + tk ** 2 * alpha_var - 2 * tk * cov.loc[b_name, a_name]
    notes.append(f"m = {m}: alpha({m}) := alpha({donor}) = {alpha:.4g}, beta0({m}) = intercept({m}) - "
                 f"alpha({m}) * {tk:g} (top_k from {'the trace meta' if top_k is not None else 'the observed constant u_bar'}); "
                 f"u_bar is constant at this m so alpha({m}) is not identified from the data")
    return alpha, alpha_var, beta0, beta0_var


def fit_joint(mom: CellMoments, top_k: float | None = None) -> JointResults:
    """Fit Eq. 4 jointly on every cell of ``mom``; apply the m = 1 convention where α is unidentified.

    ``top_k`` is the constant Ū of an m = 1 pass (the target's experts per token); when None it is
    taken from the data (the constant Ū observed at that m).
    """
    design, unident = categorical_design(mom)
    ols = fit_ols(mom, design)
    q = sps.t.ppf(0.975, ols.df_t)
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    ident = [m for m in ms if m not in unident]
    if not ident:
        raise SpeclimitsError("alpha is not identified at any m (u_bar is constant everywhere)")
    notes: list[str] = []
    rows = []
    for m in ms:
        sel = mom.cells["m"].to_numpy() == m
        if m in ident:
            alpha, alpha_var = ols.params[f"alpha[{m}]"], ols.cov.loc[f"alpha[{m}]", f"alpha[{m}]"]
            beta0, beta0_var = ols.params[f"beta0[{m}]"], ols.cov.loc[f"beta0[{m}]", f"beta0[{m}]"]
        else:
            donor = min(ident, key=lambda v: (abs(v - m), v))
            alpha, alpha_var, beta0, beta0_var = _convention(mom, ols, m, donor, top_k, notes)
        b_se, a_se = math.sqrt(max(beta0_var, 0)), math.sqrt(max(alpha_var, 0))
        rows.append({"m": m, "K": int(mom.cells.loc[sel, "K"].iloc[0]), "n": int(mom.n[sel].sum()),
                     "beta0": beta0, "beta0_se": b_se, "beta0_lower": beta0 - q * b_se,
                     "beta0_upper": beta0 + q * b_se, "alpha": alpha, "alpha_se": a_se,
                     "alpha_lower": alpha - q * a_se, "alpha_upper": alpha + q * a_se, "identified": m in ident})
    return JointResults(ols, pd.DataFrame(rows), float(top_k) if top_k is not None else None, tuple(notes), design)


# ---------------------------------------------------------------------------
# per-K fits
# ---------------------------------------------------------------------------


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
# the whole section
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalModelResults(ResultsMixin):
    """Everything of the final-model section (see the module docstring); tables are DataFrames.

    ``regimes``: the regime-dependent rows at the rule's split (``basis`` "rule") and at the paper's
    m <= 4 | m >= 5 (``basis`` "paper split"), see :func:`speclimits.stats.regimes.regime_rows`.
    ``interpolation`` / ``interpolation_paper``: interpolation vs transfer at those two splits.
    ``smooth``: leave-one-K-out MAPE of the smooth forms in m. ``cluster_se``: the headline SEs
    clustered by generation and by prompt. Columns ending ``_lo``/``_hi`` are 95% cluster-bootstrap
    intervals (``n_boot`` resamples of generations within K); ``intervals`` holds the scalar ones.
    """

    per_k: pd.DataFrame
    joint: JointResults
    pooled: OLSResults
    comparison: pd.DataFrame
    pooled_std: pd.DataFrame
    mape_by_k: pd.DataFrame
    loko: pd.DataFrame
    boundary: BoundaryResults
    interpolation: pd.DataFrame
    interpolation_paper: pd.DataFrame
    regimes: pd.DataFrame
    ladder: pd.DataFrame
    smooth: pd.DataFrame
    cluster_se: pd.DataFrame
    intervals: dict[str, tuple[float, float]]
    report: FilterReport
    n_rows: int
    n_generations: int
    n_boot: int
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
        comp = self.comparison.attrs
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "n_boot": self.n_boot, "per_k": self.per_k, "joint": self.joint.to_dict(),
                "pooled": self.pooled.to_dict(), "comparison": self.comparison,
                "pooled_vs_base": {"cv_rmse_reduction": comp["pooled_drmse"][0],
                                   "cv_rmse_reduction_ci": comp["pooled_drmse"][1],
                                   "cv_rmse_reduction_pct": comp["pooled_drmse_pct"],
                                   "mape_ratio_base_over_categorical": comp["mape_ratio"]},
                "pooled_standardized": self.pooled_std, "mape_by_k": self.mape_by_k,
                "leave_one_k_out": self.loko, "boundary": self.boundary.to_dict(),
                "interpolation": self.interpolation, "interpolation_paper_split": self.interpolation_paper,
                "regimes": self.regimes, "ladder": self.ladder, "smooth_forms": self.smooth.reset_index(),
                "cluster_se": self.cluster_se, "intervals": {k: list(v) for k, v in self.intervals.items()},
                "paper_comparison": self.headline().reset_index()}

    def headline(self) -> pd.DataFrame:
        """The section's numbers beside the paper's, one row per quantity (numbers; see :func:`headline_table`);
        ``basis`` says which split a regime-dependent row uses."""
        return headline_table(self)

    def summary(self) -> str:
        cols = ["K", "m", "alpha", "alpha_se", "beta0", "c", "cv_r2", "cv_mape"]
        return "\n\n".join([
            f"Final model (Eq. 4): {self.n_rows:,} rounds, {self.n_generations:,} generations",
            "Per-K OLS T_T ~ Ū + L (SE clustered by generation):\n"
            + self.per_k[cols].to_string(index=False, float_format=lambda v: f"{v:.5g}"),
            self.boundary.summary(),
            "Comparison:\n" + self.comparison.to_string(float_format=lambda v: f"{v:.4g}"),
            "Specification ladder:\n" + self.ladder.to_string(float_format=lambda v: f"{v:.4g}"),
            "Headline (95% intervals):\n"
            + self.headline()[["basis", "est", "lo", "hi", "est2", "se", "paper", "paper_est"]].to_string(
                float_format=lambda v: f"{v:.4g}", na_rep=""),
        ])


#: Columns of :func:`headline_table` (index: ``quantity``).
HEADLINE_COLUMNS = ["basis", "key", "shape", "est", "lo", "hi", "est2", "lo2", "hi2", "se", "se_prompt", "half",
                    "note", "paper", "paper_est", "paper_se", "paper_est2"]


def _se_prompt(res: FinalModelResults, model: str, term: str, scale: float = 1.0) -> float:
    cs = res.cluster_se
    row = cs[(cs["model"] == model) & (cs["term"] == term)]
    return np.nan if row.empty else float(row["se_prompt"].iloc[0]) * scale


def _pooled_row(res: FinalModelResults, key: str, quantity: str, term: str, scale: float = 1.0) -> dict[str, Any]:
    est, se = paper.POOLED[term]
    return dict(key=key, quantity=quantity, shape="se", est=res.pooled.params[term] * scale,
                se=res.pooled.bse[term] * scale, se_prompt=_se_prompt(res, "pooled", term, scale),
                paper_est=est * scale, paper_se=se * scale)


def headline_table(res: FinalModelResults) -> pd.DataFrame:
    """See :meth:`FinalModelResults.headline`: numbers only (the book's view writes the cells).

    Index ``quantity`` (in the quantity's unit, e.g. 1e-3 ms/token for c); columns
    :data:`HEADLINE_COLUMNS`: ``basis`` (the split a regime-dependent row uses, else "—"), ``key`` (a
    stable id), ``shape`` (how the numbers read):

    * ``split``: ``est`` the rule's last small m (NaN: no split), ``note`` its reason, ``paper_est`` the paper's;
    * ``range``: ``est``–``est2`` (min–max), ``lo``/``hi`` the interval of the minimum, ``lo2``/``hi2``
      of the maximum;
    * ``value``: ``est`` with ``lo``/``hi``;
    * ``se``: ``est`` (``se``), and ``se_prompt`` the SE clustered by prompt; the paper's ``paper_est`` (``paper_se``);
    * ``pair``: two numbers ``est`` and ``est2``, each with its interval (``lo``/``hi``, ``lo2``/``hi2``);
    * ``reduction``: ``est`` ms (``est2`` %), ``half`` the t half-width over folds.

    ``note``: text that stands in for an interval; ``paper``: the paper's text (from :mod:`speclimits.paper`),
    else its numbers ``paper_est``, ``paper_se``, ``paper_est2``. Intervals are 95% (cluster bootstrap unless
    the note says otherwise).
    """
    pk, b, iv = res.per_k, res.boundary, res.intervals
    mk, comp, lad = res.mape_by_k, res.comparison, res.ladder
    d, dh = comp.attrs["pooled_drmse"]
    big = mk[mk["K"] >= 5]

    def at_k(k: int) -> tuple[float, float, float]:
        row = mk.loc[mk["K"] == k]
        cols = ("pooled", "pooled_lo", "pooled_hi")
        return (np.nan,) * 3 if row.empty else tuple(float(row[c].iloc[0]) for c in cols)

    def ladder(spec: str, col: str) -> tuple[float, float, float]:
        return lad.loc[spec, col], lad.loc[spec, f"{col}_lo"], lad.loc[spec, f"{col}_hi"]

    def pair(key: str, quantity: str, first: tuple, second: tuple, **kw) -> dict[str, Any]:
        return dict(key=key, quantity=quantity, shape="pair", est=first[0], lo=first[1], hi=first[2],
                    est2=second[0], lo2=second[1], hi2=second[2], **kw)

    def rng(key: str, quantity: str, values: pd.Series, lo_hi=None, lo_hi2=None, scale: float = 1.0,
            **kw) -> dict[str, Any]:
        row = dict(key=key, quantity=quantity, shape="range", **kw)
        if len(values):
            row.update(est=float(values.min()) * scale, est2=float(values.max()) * scale)
        if lo_hi is not None:
            row.update(lo=lo_hi[0], hi=lo_hi[1], lo2=lo_hi2[0], hi2=lo_hi2[1])
        return row

    rows: list[dict[str, Any]] = [
        dict(key="boundary", quantity="regime boundary (last m of the small regime)", basis="rule", shape="split",
             est=np.nan if b.split is None else float(b.split), note=b.reason, paper_est=float(paper.BOUNDARY_M)),
    ]
    rows += as_headline(res.regimes).to_dict("records")
    rows += [
        rng("c_per_k", "c across per-K fits (1e-3 ms/token)", pk["c"], iv["c_min"], iv["c_max"], scale=1e3,
            paper=paper.fmt_range(paper.C_RANGE, 1e3)),
        dict(key="c_joint", quantity="c, joint categorical (1e-3 ms/token)", shape="se", est=res.joint.c * 1e3,
             se=res.joint.bse["c"] * 1e3, se_prompt=_se_prompt(res, "categorical (Eq. 4)", "c", 1e3), paper="—"),
        _pooled_row(res, "pooled_u_bar", "pooled α (SE)", "u_bar"),
        _pooled_row(res, "pooled_context_len", "pooled c (SE), 1e-3", "context_len", 1e3),
        _pooled_row(res, "pooled_K", "pooled γ per K (SE)", "K"),
        _pooled_row(res, "pooled_const", "pooled β0 (SE)", "const"),
        pair("r2_ladder", "R²: Ū + L → + γK", ladder("Ū + L", "r2"), ladder("+ linear m", "r2"),
             paper_est=paper.POOLED_R2[0], paper_est2=paper.POOLED_R2[1]),
        dict(key="cv_rmse_reduction", quantity="CV RMSE reduction by γK (ms)", shape="reduction", est=d,
             est2=comp.attrs["pooled_drmse_pct"], half=dh, note="t over folds", paper=paper.POOLED_DRMSE),
        dict(key="mape_ratio", quantity="CV MAPE ratio, Ū + L over categorical", shape="value",
             est=comp.attrs["mape_ratio"], lo=iv["mape_ratio"][0], hi=iv["mape_ratio"][1],
             paper_est=paper.CATEGORICAL_MAPE_RATIO),
        rng("pooled_mape_k5", "pooled CV MAPE at K ≥ 5 (%)", big["pooled"], iv["pooled_mape_k5_min"],
            iv["pooled_mape_k5_max"], paper=paper.fmt_range(paper.POOLED_MAPE_LARGE, digits=1)),
        pair("pooled_mape_k1_k3", "pooled CV MAPE at K = 1 / K = 3 (%)", at_k(1), at_k(3),
             paper_est=paper.POOLED_MAPE_BY_K[1], paper_est2=paper.POOLED_MAPE_BY_K[3]),
        dict(key="loko_mean", quantity="leave-one-K-out MAPE, mean (%)", shape="value",
             est=res.loko["loko_mape"].mean(), lo=iv["loko_mean"][0], hi=iv["loko_mean"][1],
             paper_est=paper.LOKO_MEAN),
        rng("loko_smooth", "leave-one-K-out MAPE, other smooth forms in m (%)", res.smooth["loko_mape_mean"].iloc[1:],
            note="per form in the smooth-forms table",
            paper=paper.fmt_range(paper.SMOOTH_PARAMETERIZATIONS_MAPE, digits=1)),
        rng("within_k_mape", "within-K CV MAPE (%)", pk["cv_mape"], note="t over folds per K",
            paper=paper.fmt_range(paper.WITHIN_K_MAPE, digits=2)),
        pair("categorical", "categorical CV MAPE (%) / R²", ladder("categorical (Eq. 4)", "cv_mape"),
             ladder("categorical (Eq. 4)", "r2"), paper=" / ".join(paper.LADDER["categorical (Eq. 4)"])),
    ]
    out = pd.DataFrame(rows, columns=["quantity", *HEADLINE_COLUMNS])
    out["basis"] = out["basis"].fillna("—")
    return out.set_index("quantity")


# -- steps of fit_final_model ------------------------------------------------


def _per_k_replicates(mom: CellMoments, per_k: pd.DataFrame, weights: np.ndarray) -> dict[str, pd.DataFrame]:
    """(B, nK) bootstrap replicates of the per-K α, β0 and c (columns: m, in per_k's order)."""
    reps = unc.coefficient_replicates(mom, PER_K_DESIGN, weights, [("K", int(k)) for k in per_k["K"]])
    out = {}
    for name, col in (("alpha", "u_bar"), ("beta0", "const"), ("c", "context_len")):
        out[name] = pd.DataFrame({int(m): reps[int(k)][col].to_numpy() for k, m in zip(per_k["K"], per_k["m"])})
    return out


def _metric_intervals(mom: CellMoments, folds: np.ndarray, weights: np.ndarray, ladder: pd.DataFrame,
                      fitted: dict[str, tuple[Design, CVResult]]) -> pd.DataFrame:
    """The ladder with 95% bootstrap intervals: ``r2_lo/hi`` (refitted), ``cv_mape_lo/hi`` (held-out
    errors resampled, fold fits fixed)."""
    out = ladder.copy()
    for spec, (design, cv) in fitted.items():
        out.loc[spec, ["r2_lo", "r2_hi"]] = unc.interval(unc.r2_replicates(mom, design, weights))
        out.loc[spec, ["cv_mape_lo", "cv_mape_hi"]] = unc.interval(
            unc.fold_mape_replicates(mom, cv.oof, folds, weights))
    return out


def _by_k_intervals(mom: CellMoments, preds: dict[str, np.ndarray], weights: np.ndarray,
                    ks: Sequence[int]) -> dict[str, np.ndarray]:
    """(B, nK) replicates of the MAPE by K of each prediction array (held-out rows resampled)."""
    row_k = mom.row_attr("K")
    out = {}
    for name, pred in preds.items():
        cols = [unc.mape_replicates(weights, *unc.ape_sums(mom, pred, row_k == k)) for k in ks]
        out[name] = np.column_stack(cols)
    return out


def _regimes(mom: CellMoments, per_k: pd.DataFrame, fits: dict[int, OLSResults], reps: dict[str, pd.DataFrame],
             split: int | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Regime rows and interpolation tables at the rule's split and at the paper's."""
    interp = cmp.interpolation_table(mom, fits, split)
    interp_paper = cmp.interpolation_table(mom, fits, paper.BOUNDARY_M)
    rule_label = "rule: no regime" if split is None else f"rule: m ≤ {split} | m > {split}"
    rows = pd.concat([
        regime_rows(per_k, reps["alpha"], reps["beta0"], interp, split, rule_label),
        regime_rows(per_k, reps["alpha"], reps["beta0"], interp_paper, paper.BOUNDARY_M,
                    f"paper split m ≤ {paper.BOUNDARY_M} | m ≥ {paper.BOUNDARY_M + 1}"),
    ], ignore_index=True)
    return rows, interp, interp_paper


def fit_final_model(rounds: pd.DataFrame, k_values: Sequence[int] | None = None, n_splits: int = 5,
                    n_boot: int = 999, seed: int = 0) -> FinalModelResults:
    """Fit the final model and its comparisons on the decode rounds with K in ``k_values`` (default K >= 1).

    ``n_boot`` cluster-bootstrap resamples (generations within K, ``seed``) give the 95% intervals.
    """
    dec, report = decode_rounds(rounds, timing="target")
    mom = CellMoments.from_rounds(select_k(dec, k_values))
    if mom.cells["K"].nunique() < 2:
        raise SpeclimitsError("the final-model comparisons need at least two K values in the trace")
    per_k, fits, _ = fit_per_k(mom, n_splits)
    joint = fit_joint(mom)
    folds = group_folds(mom, n_splits)
    cvs = {"base": cross_validate(mom, cmp.BASE_DESIGN, folds), "pooled": cross_validate(mom, cmp.POOLED_DESIGN, folds),
           "categorical": cross_validate(mom, joint.design, folds)}
    pooled = fit_ols(mom, cmp.POOLED_DESIGN)
    weights = unc.stratified_counts(mom, n_boot, seed)
    ks = [int(k) for k in per_k["K"]]

    ladder, fitted = cmp.ladder_table(mom, folds, joint.ols, cvs["categorical"])
    fitted["categorical (Eq. 4)"] = (joint.design, cvs["categorical"])
    ladder = _metric_intervals(mom, folds, weights, ladder, fitted)
    comparison = cmp.comparison_table(mom, joint.ols, cvs)

    loko_pred = cmp.loko_predictions(mom, cmp.POOLED_DESIGN)
    smooth, smooth_preds = cmp.smooth_table(mom, loko_pred)
    by_k = _by_k_intervals(mom, {"pooled": cvs["pooled"].oof, "categorical": cvs["categorical"].oof,
                                 "loko": loko_pred, **{f"smooth:{n}": p for n, p in smooth_preds.items()}}, weights, ks)
    mape_by_k = cmp.mape_by_k(mom, {"pooled": cvs["pooled"].oof, "categorical": cvs["categorical"].oof}, per_k)
    for name in ("pooled", "categorical"):
        mape_by_k[f"{name}_lo"], mape_by_k[f"{name}_hi"] = np.array([unc.interval(c) for c in by_k[name].T]).T
    loko = cmp.loko_table(mom, loko_pred, per_k)
    loko["loko_lo"], loko["loko_hi"] = np.array([unc.interval(c) for c in by_k["loko"].T]).T
    smooth[["loko_mape_mean_lo", "loko_mape_mean_hi"]] = [unc.interval(by_k[f"smooth:{n}"].mean(1))
                                                          for n in smooth.index]

    boundary = detect_boundary(mom, n_splits)
    reps = _per_k_replicates(mom, per_k, weights)
    regimes, interp, interp_paper = _regimes(mom, per_k, fits, reps, boundary.split)
    big = np.array(ks) >= 5
    cat_fold = _mape_ratio_interval(mom, folds, weights, fitted)
    intervals = {"c_min": unc.interval(reps["c"].min(axis=1) * 1e3), "c_max": unc.interval(reps["c"].max(axis=1) * 1e3),
                 "loko_mean": unc.interval(by_k["loko"].mean(1)), "mape_ratio": cat_fold,
                 "pooled_mape_k5_min": unc.interval(by_k["pooled"][:, big].min(1)) if big.any() else (np.nan, np.nan),
                 "pooled_mape_k5_max": unc.interval(by_k["pooled"][:, big].max(1)) if big.any() else (np.nan, np.nan)}
    cluster_se = cmp.cluster_sensitivity(mom, [("categorical (Eq. 4)", joint.design, joint.ols),
                                               ("pooled", cmp.POOLED_DESIGN, pooled)])
    return FinalModelResults(per_k, joint, pooled, comparison, cmp.pooled_standardized(pooled), mape_by_k, loko,
                             boundary, interp, interp_paper, regimes, ladder, smooth, cluster_se, intervals, report,
                             mom.n_rows, mom.n_clusters, n_boot, fits)


def _mape_ratio_interval(mom: CellMoments, folds: np.ndarray, weights: np.ndarray,
                         fitted: dict[str, tuple[Design, CVResult]]) -> tuple[float, float]:
    """95% interval of CV MAPE(Ū + L) / CV MAPE(categorical), both from the same resamples."""
    base = unc.fold_mape_replicates(mom, fitted["Ū + L"][1].oof, folds, weights)
    cat = unc.fold_mape_replicates(mom, fitted["categorical (Eq. 4)"][1].oof, folds, weights)
    return unc.interval(base / cat)




def fit_cost_model(rounds: pd.DataFrame, top_k: int | None = None, source: str = "") -> CostModel:
    """Fit the cost model (the JSON of :mod:`speclimits.costmodel`) on a trace's ``rounds`` table.

    Target: the joint categorical model (free ``beta0(m)``, ``alpha(m)``, shared ``c``) on every
    decode round with a non-zero target time, K = 0 included (it gives m = 1; see :data:`M1_NOTE`
    for the convention; pass ``top_k`` from ``meta["models"]["target"]["top_k"]``, else the constant
    Ū observed at m = 1 is used). Draft: ``T_D = a·K + b`` on decode rounds with K >= 1 and a
    non-zero draft time. Standard errors, row counts and conventions are recorded in ``extra``
    (written to the JSON under ``"fit"``).
    """
    dec, report = decode_rounds(rounds, timing="target")
    joint = fit_joint(CellMoments.from_rounds(dec, base=("u_bar", "context_len")), top_k=top_k)


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


def fit_trace_cost_model(trace: Trace | str | Path) -> CostModel:
    """The cost model of a trace: the one route from a trace to a cost-model JSON.

    :func:`fit_cost_model` on the trace's ``rounds`` with the target's ``top_k`` from
    ``meta.json``. ``speclimits fit --out``, the book's section 3 and the Oracle's default (no
    cost model given) all call this, so they write and solve with the same bytes. The recorded
    ``source`` names the trace by its directory name and its source label, not by the path it
    was opened with, so the JSON does not depend on the working directory or the machine.
    """
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    return fit_cost_model(tr.rounds, top_k=tr.top_k,
                          source=f"speclimits fit on trace {tr.path.resolve().name} ({tr.source_label})")
