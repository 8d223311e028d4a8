"""The final target-time model (Eq. 4) and everything the appendix compares it with: per-K OLS
``T_T ~ Ū + L``, the joint categorical model, the comparisons, the regime rule with the rows that
depend on the split in m, and 95% cluster-bootstrap intervals on the headline cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.bootstrap import percentile_interval
from speclimits.stats import comparisons as cmp
from speclimits.stats import uncertainty as unc
from speclimits.stats._ols import (CellMoments, ClusterSums, CVResult, Design, OLSResults, cross_validate,
                                   failed_replicates, fit_ols, group_folds)
from speclimits.stats.boundary import BoundaryResults, detect_boundary
from speclimits.stats.costfit import JointResults, fit_joint
from speclimits.stats.m_split import FIXED_SPLIT, as_headline, split_rows
from speclimits.stats.requirements import REQUIREMENTS, TABLES, Skip, Skips
from speclimits.trace import FilterReport, decode_rounds


def fit_per_k(mom: CellMoments, n_splits: int, skips: Skips) -> tuple[pd.DataFrame, dict[int, OLSResults]]:
    """Per-K OLS ``T_T ~ Ū + L`` with GroupKFold metrics within each K: the table (:data:`PER_K_COLUMNS`)
    and the fits by K. An unidentified K is left out, one too thin for the folds gets NaN CV columns
    (each recorded in ``skips``)."""
    rows, fits = [], {}
    for k in sorted(int(v) for v in mom.cells["K"].unique()):
        sub = mom.where(K=k)
        fit = skips.run("per_k", f"per-K fit at K = {k}", lambda: fit_ols(sub, cmp.BASE_DESIGN))
        if fit is None:
            continue
        cv = skips.run("per_k_cv", f"per-K cross-validation at K = {k}",
                       lambda: cross_validate(sub, cmp.BASE_DESIGN, group_folds(sub, n_splits)))
        fits[k] = fit
        ci = fit.conf_int()
        # an EAGLE-style K verifies m = K + 1 rows every round; a K whose drafter sometimes proposes
        # fewer (n-gram) spans several m, and its row stands for the full budget, the largest m
        row = {"K": k, "m": int(sub.cells["m"].max()), "n": fit.nobs, "n_generations": fit.n_clusters}
        for col, name in (("const", "beta0"), ("u_bar", "alpha"), ("context_len", "c")):
            row[name] = fit.params[col]
            row[f"{name}_se"] = fit.bse[col]
            row[f"{name}_lower"] = ci.loc[col, "lower"]
            row[f"{name}_upper"] = ci.loc[col, "upper"]
        for met in ("r2", "rmse", "mape"):
            row[f"cv_{met}"], row[f"cv_{met}_ci"] = cv.mean_ci(met) if cv is not None else (np.nan, np.nan)
        rows.append(row)
    return pd.DataFrame(rows, columns=PER_K_COLUMNS), fits


PER_K_COLUMNS = ["K", "m", "n", "n_generations"] + [f"{name}{suffix}" for name in ("beta0", "alpha", "c")
                                                     for suffix in ("", "_se", "_lower", "_upper")] + [
    f"cv_{met}{suffix}" for met in ("r2", "rmse", "mape") for suffix in ("", "_ci")]


@dataclass(frozen=True)
class FinalModelResults:
    """Everything of the final-model section (tables are DataFrames). ``regimes``: the split rows at the
    rule's split and the appendix's, ``interpolation``/``interpolation_paper`` at those two. Columns
    ending ``_lo``/``_hi`` are 95% cluster-bootstrap intervals (``n_boot`` resamples of generations within
    K); ``intervals`` holds the scalar ones. A table the trace cannot give is None, its step in ``skips``.
    """

    per_k: pd.DataFrame
    joint: JointResults
    pooled: OLSResults | None
    comparison: pd.DataFrame | None
    pooled_std: pd.DataFrame | None
    mape_by_k: pd.DataFrame | None
    loko: pd.DataFrame | None
    boundary: BoundaryResults | None
    interpolation: pd.DataFrame | None
    interpolation_paper: pd.DataFrame | None
    regimes: pd.DataFrame | None
    ladder: pd.DataFrame | None
    smooth: pd.DataFrame | None
    cluster_se: pd.DataFrame
    intervals: dict[str, tuple[float, float]]
    report: FilterReport
    n_rows: int
    n_generations: int
    n_boot: int
    skips: tuple[Skip, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def skipped(self) -> dict[str, str]:
        return {s.name: s.why for s in self.skips}

    def to_dict(self) -> dict[str, Any]:
        comp = self.comparison.attrs if self.comparison is not None else {}
        nan2 = (np.nan, np.nan)
        opt = (lambda v, f=(lambda x: x): None if v is None else f(v))
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "n_boot": self.n_boot, "per_k": self.per_k, "joint": self.joint.to_dict(),
                "pooled": opt(self.pooled, lambda v: v.to_dict()), "comparison": self.comparison,
                "pooled_vs_base": {"cv_rmse_reduction": comp.get("pooled_drmse", nan2)[0],
                                   "cv_rmse_reduction_ci": comp.get("pooled_drmse", nan2)[1],
                                   "cv_rmse_reduction_pct": comp.get("pooled_drmse_pct", np.nan),
                                   "mape_ratio_base_over_categorical": comp.get("mape_ratio", np.nan)},
                "pooled_standardized": self.pooled_std, "mape_by_k": self.mape_by_k,
                "leave_one_k_out": self.loko, "boundary": opt(self.boundary, lambda v: v.to_dict()),
                "interpolation": self.interpolation, "interpolation_paper_split": self.interpolation_paper,
                "regimes": self.regimes, "ladder": self.ladder,
                "smooth_forms": opt(self.smooth, lambda v: v.reset_index()),
                "cluster_se": self.cluster_se, "intervals": {k: list(v) for k, v in self.intervals.items()},
                "headline": self.headline().reset_index(), "skipped": self.skipped,
                "notes": list(self.notes)}

    def headline(self) -> pd.DataFrame:
        return headline_table(self)

    def skipped_lines(self) -> list[str]:
        return [f"skipped {name}: {why}" for name, why in self.skipped.items()]

    def why_missing(self, *tables: str) -> str | None:
        """Why the trace cannot give the tables named (keys of :data:`~speclimits.stats.requirements.TABLES`),
        or None when all are there: the skips of the first step each missing table rests on, ``"<name>:
        <why>"`` joined by ``"; "`` (one reason alone: its ``why``). A partial table counts as there."""
        reasons: list[str] = []
        for name in tables:
            steps = TABLES[name]
            value = getattr(self, name)
            if value is not None and not (isinstance(value, pd.DataFrame) and value.empty):
                continue
            found = next(([s for s in self.skips if s.step == step] for step in steps
                          if any(s.step == step for s in self.skips)), [])
            reasons += [r for r in (f"{s.name}: {s.why}" for s in found) if r not in reasons]
        if len(reasons) == 1:
            return reasons[0].split(": ", 1)[1]
        return "; ".join(reasons) if reasons else None

    def skipped_within(self, *steps: str) -> str | None:
        """The skips at ``steps`` (parts left out of a table that is shown), joined by ``"; "``, or None."""
        return "; ".join(f"{s.name}: {s.why}" for s in self.skips if s.step in steps) or None

    def summary(self) -> str:
        cols = ["K", "m", "alpha", "alpha_se", "beta0", "c", "cv_r2", "cv_mape"]
        fmt4 = (lambda v: f"{v:.4g}")
        parts = [
            f"Final model (Eq. 4): {self.n_rows:,} rounds, {self.n_generations:,} generations",
            "Per-K OLS T_T ~ Ū + L (SE clustered by generation):\n"
            + self.per_k[cols].to_string(index=False, float_format=lambda v: f"{v:.5g}"),
        ]
        if self.boundary is not None:
            parts.append(self.boundary.summary())
        if self.comparison is not None:
            parts.append("Comparison:\n" + self.comparison.to_string(float_format=fmt4))
        if self.ladder is not None:
            parts.append("Specification ladder:\n" + self.ladder.to_string(float_format=fmt4))
        parts.append("Headline (95% intervals):\n"
                     + self.headline()[["basis", "est", "lo", "hi", "est2", "se"]].to_string(
                         float_format=fmt4, na_rep=""))
        if self.notes:
            parts.append("\n".join(f"note: {n}" for n in self.notes))
        if self.skipped:
            parts.append("\n".join(self.skipped_lines()))
        return "\n\n".join(parts)


HEADLINE_COLUMNS = ["basis", "key", "shape", "est", "lo", "hi", "est2", "lo2", "hi2", "se", "se_prompt", "half",
                    "note"]


def _se_prompt(res: FinalModelResults, model: str, term: str, scale: float = 1.0) -> float:
    cs = res.cluster_se
    row = cs[(cs["model"] == model) & (cs["term"] == term)]
    return np.nan if row.empty else float(row["se_prompt"].iloc[0]) * scale


def _pooled_row(res: FinalModelResults, key: str, quantity: str, term: str, scale: float = 1.0) -> dict[str, Any]:
    row = dict(key=key, quantity=quantity, shape="se")
    if res.pooled is not None:
        row.update(est=res.pooled.params[term] * scale, se=res.pooled.bse[term] * scale,
                   se_prompt=_se_prompt(res, "pooled", term, scale))
    return row


def headline_table(res: FinalModelResults) -> pd.DataFrame:
    """The section's headline numbers (the book's view writes the cells, beside the paper's by ``key``).

    Index ``quantity`` (in its unit, e.g. 1e-3 ms/token for c); columns :data:`HEADLINE_COLUMNS`:
    ``basis`` (the split a regime-dependent row uses, else "—"), ``key``, ``shape`` (how the numbers read):

    * ``split``: ``est`` the rule's last small m (NaN: no split), ``note`` its reason;
    * ``range``: ``est``–``est2`` (min–max), ``lo``/``hi`` the interval of the minimum, ``lo2``/``hi2``
      of the maximum;
    * ``value``: ``est`` with ``lo``/``hi``;
    * ``se``: ``est`` (``se``), and ``se_prompt`` the SE clustered by prompt;
    * ``pair``: two numbers ``est`` and ``est2``, each with its interval (``lo``/``hi``, ``lo2``/``hi2``);
    * ``reduction``: ``est`` ms (``est2`` %), ``half`` the t half-width over folds.

    ``note``: text that stands in for an interval. Intervals are 95% (cluster bootstrap unless noted).
    """
    pk, b, iv = res.per_k, res.boundary, res.intervals
    mk, comp, lad = res.mape_by_k, res.comparison, res.ladder
    attrs = comp.attrs if comp is not None else {}
    d, dh = attrs.get("pooled_drmse", (np.nan, np.nan))
    big = mk[mk["K"] >= 5] if mk is not None else pd.DataFrame({"pooled": []})
    nan2 = (np.nan, np.nan)

    def at_k(k: int) -> tuple[float, float, float]:
        row = mk.loc[mk["K"] == k] if mk is not None else pd.DataFrame()
        cols = ("pooled", "pooled_lo", "pooled_hi")
        return (np.nan,) * 3 if row.empty else tuple(float(row[c].iloc[0]) for c in cols)

    def ladder(spec: str, col: str) -> tuple[float, float, float]:
        if lad is None or spec not in lad.index or f"{col}_lo" not in lad.columns:
            return (np.nan,) * 3
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
             est=np.nan if b is None or b.split is None else float(b.split),
             note=b.reason if b is not None else f"skipped: {res.why_missing('boundary')}"),
    ]
    if res.regimes is not None:
        rows += as_headline(res.regimes).to_dict("records")
    rows += [
        rng("c_per_k", "c across per-K fits (1e-3 ms/token)", pk["c"], iv["c_min"], iv["c_max"], scale=1e3),
        dict(key="c_joint", quantity="c, joint categorical (1e-3 ms/token)", shape="se", est=res.joint.c * 1e3,
             se=res.joint.bse["c"] * 1e3, se_prompt=_se_prompt(res, "categorical (Eq. 4)", "c", 1e3)),
        _pooled_row(res, "pooled_u_bar", "pooled α (SE)", "u_bar"),
        _pooled_row(res, "pooled_context_len", "pooled c (SE), 1e-3", "context_len", 1e3),
        _pooled_row(res, "pooled_K", "pooled γ per K (SE)", "K"),
        _pooled_row(res, "pooled_const", "pooled β0 (SE)", "const"),
        pair("r2_ladder", "R²: Ū + L → + γK", ladder("Ū + L", "r2"), ladder("+ linear m", "r2")),
        dict(key="cv_rmse_reduction", quantity="CV RMSE reduction by γK (ms)", shape="reduction", est=d,
             est2=attrs.get("pooled_drmse_pct", np.nan), half=dh, note="t over folds"),
        dict(key="mape_ratio", quantity="CV MAPE ratio, Ū + L over categorical", shape="value",
             est=attrs.get("mape_ratio", np.nan), lo=iv.get("mape_ratio", nan2)[0], hi=iv.get("mape_ratio", nan2)[1]),
        rng("pooled_mape_k5", "pooled CV MAPE at K ≥ 5 (%)", big["pooled"], iv["pooled_mape_k5_min"],
            iv["pooled_mape_k5_max"]),
        pair("pooled_mape_k1_k3", "pooled CV MAPE at K = 1 / K = 3 (%)", at_k(1), at_k(3)),
        dict(key="loko_mean", quantity="leave-one-K-out MAPE, mean (%)", shape="value",
             est=res.loko["loko_mape"].mean() if res.loko is not None else np.nan,
             lo=iv.get("loko_mean", nan2)[0], hi=iv.get("loko_mean", nan2)[1]),
        rng("loko_smooth", "leave-one-K-out MAPE, other smooth forms in m (%)",
            pd.Series(dtype=float) if res.smooth is None else
            res.smooth.loc[res.smooth.index != cmp.POOLED_LOKO_FORM, "loko_mape_mean"],
            note="per form in the smooth-forms table"),
        rng("within_k_mape", "within-K CV MAPE (%)", pk["cv_mape"], note="t over folds per K"),
        pair("categorical", "categorical CV MAPE (%) / R²", ladder("categorical (Eq. 4)", "cv_mape"),
             ladder("categorical (Eq. 4)", "r2")),
    ]
    out = pd.DataFrame(rows, columns=["quantity", *HEADLINE_COLUMNS])
    out["basis"] = out["basis"].fillna("—")
    return out.set_index("quantity")


def _per_k_replicates(mom: CellMoments, per_k: pd.DataFrame, weights: np.ndarray,
                      failed: dict[str, int]) -> dict[str, pd.DataFrame]:
    """(B, nK) bootstrap replicates of the per-K α, β0 and c (columns: m); unsolvable ones counted in ``failed``."""
    reps = unc.coefficient_replicates(mom, cmp.BASE_DESIGN, weights, [("K", int(k)) for k in per_k["K"]])
    for k, rep in reps.items():
        if failed_replicates(rep.to_numpy()):
            failed[f"per-K fit at K = {k}"] = failed_replicates(rep.to_numpy())
    return {name: pd.DataFrame({int(m): reps[int(k)][col].to_numpy() for k, m in zip(per_k["K"], per_k["m"])})
            for name, col in (("alpha", "u_bar"), ("beta0", "const"), ("c", "context_len"))}


def _metric_intervals(mom: CellMoments, folds: np.ndarray, weights: np.ndarray, ladder: pd.DataFrame,
                      fitted: dict[str, tuple[Design, CVResult]], failed: dict[str, int]) -> pd.DataFrame:
    """The ladder with 95% bootstrap intervals: ``r2_lo/hi`` (refitted; unsolvable replicates counted in
    ``failed``), ``cv_mape_lo/hi`` (held-out errors resampled, fold fits fixed)."""
    out = ladder.copy()
    for spec, (design, cv) in fitted.items():
        r2 = ClusterSums.of(mom, design).replicates(weights)[1]
        if (~np.isfinite(r2)).any():
            failed[f"ladder: {spec}"] = int((~np.isfinite(r2)).sum())
        out.loc[spec, ["r2_lo", "r2_hi"]] = percentile_interval(r2)
        out.loc[spec, ["cv_mape_lo", "cv_mape_hi"]] = percentile_interval(
            unc.fold_mape_replicates(mom, cv.oof, folds, weights))
    return out


def _split_tables(mom: CellMoments, per_k: pd.DataFrame, fits: dict[int, OLSResults], reps: dict[str, pd.DataFrame],
                  split: int | None, rule: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """Split rows and interpolation tables at the rule's split (unless ``rule`` is False: skipped) and at
    :data:`FIXED_SPLIT`."""
    interp = cmp.interpolation_table(mom, fits, split) if rule else None
    interp_paper = cmp.interpolation_table(mom, fits, FIXED_SPLIT)
    rule_label = "rule: no regime" if split is None else f"rule: m ≤ {split} | m > {split}"
    parts = [split_rows(per_k, reps["alpha"], reps["beta0"], interp, split, rule_label)] if rule else []
    parts.append(split_rows(per_k, reps["alpha"], reps["beta0"], interp_paper, FIXED_SPLIT,
                            f"paper split m ≤ {FIXED_SPLIT} | m ≥ {FIXED_SPLIT + 1}"))
    return pd.concat(parts, ignore_index=True), interp, interp_paper


def _missing(requirement: str, folds, pooled, cvs: dict[str, Any]) -> str:
    """``requirement``, and which of its inputs this trace lacks."""
    lacking = [name for name, ok in (("the folds", folds is not None), ("the pooled model", pooled is not None),
                                     ("the cross-validation of Ū + L", cvs.get("base") is not None),
                                     ("the categorical model's cross-validation", cvs.get("categorical") is not None))
               if not ok]
    return f"{requirement}; here it lacks {', '.join(lacking)} (skipped above)" if lacking else requirement


def fit_final_model(rounds: pd.DataFrame, n_splits: int = 5, n_boot: int = 999, seed: int = 0) -> FinalModelResults:
    """Fit the final model and its comparisons on the decode rounds with K >= 1, with ``n_boot``
    cluster-bootstrap resamples (generations within K) behind the 95% intervals. A table the trace does
    not identify (:data:`REQUIREMENTS`) is None and recorded in ``skips``; raises only when there is no
    section at all (no decode rounds with K >= 1, or α identified at no m).
    """
    dec, report = decode_rounds(rounds, timing="target")
    mom = CellMoments.from_rounds(dec.loc[dec["K"].to_numpy() >= 1].reset_index(drop=True))
    ks = [int(k) for k in sorted(mom.cells["K"].unique())]
    sk = Skips(f"K = {', '.join(map(str, ks))}; {mom.n_clusters} generations")
    per_k, fits = fit_per_k(mom, n_splits, sk)
    joint = fit_joint(mom)
    notes: list[str] = []  # the pooling of sparse m is in joint.notes
    nk = len(ks)
    folds = sk.run("cross_validation", "cross-validation", lambda: group_folds(mom, n_splits))
    cvs: dict[str, CVResult | None] = {"base": None, "pooled": None, "categorical": None}
    pooled = None
    if sk.need("pooled", "pooled model (γ·K)", nk >= 2):
        pooled = sk.run("pooled", "pooled model (γ·K)", lambda: fit_ols(mom, cmp.POOLED_DESIGN))
    if folds is not None:
        cvs["base"] = sk.run("cross_validation", "cross-validation of Ū + L",
                             lambda: cross_validate(mom, cmp.BASE_DESIGN, folds))
        if pooled is not None:
            cvs["pooled"] = sk.run("pooled", "cross-validation of the pooled model",
                                   lambda: cross_validate(mom, cmp.POOLED_DESIGN, folds))
        cvs["categorical"] = sk.run("categorical_cv", "cross-validation of the categorical model",
                                    lambda: cross_validate(mom, joint.design, folds))
    weights = unc.stratified_counts(mom, n_boot, seed)
    failed: dict[str, int] = {}

    ladder = None
    fitted: dict[str, tuple[Design, CVResult]] = {}
    if folds is not None:
        ladder, fitted = cmp.ladder_table(mom, folds, joint.ols, cvs["categorical"], sk)
        if cvs["categorical"] is not None:
            fitted["categorical (Eq. 4)"] = (joint.design, cvs["categorical"])
        ladder = _metric_intervals(mom, folds, weights, ladder, fitted, failed)
    comparison = None
    if sk.need("comparison", "comparison (Ū + L, pooled, categorical)", None not in cvs.values() and pooled is not None,
               _missing(REQUIREMENTS["comparison"], folds, pooled, cvs)):
        comparison = cmp.comparison_table(
            {"base": fit_ols(mom, cmp.BASE_DESIGN), "pooled": pooled, "categorical": joint.ols}, cvs)

    loko_pred = None
    if sk.need("leave_one_k_out", "leave-one-K-out", nk >= 3):
        loko_pred = sk.run("leave_one_k_out", "leave-one-K-out", lambda: cmp.loko_predictions(mom, cmp.POOLED_DESIGN))
    smooth, smooth_preds = cmp.smooth_table(mom, loko_pred, sk)
    preds = {**({"pooled": cvs["pooled"].oof} if cvs["pooled"] is not None else {}),
             **({"categorical": cvs["categorical"].oof} if cvs["categorical"] is not None else {}),
             **({"loko": loko_pred} if loko_pred is not None else {}),
             **{f"smooth:{n}": p for n, p in smooth_preds.items()}}
    row_k = mom.row_attr("K")  # (B, nK) replicates of each prediction's MAPE by K (held-out rows resampled)
    by_k = {name: np.column_stack([unc.mape_replicates(weights, *unc.ape_sums(mom, pred, row_k == k)) for k in ks])
            for name, pred in preds.items()}
    mape_by_k = None
    if sk.need("mape_by_k", "MAPE by K", cvs["pooled"] is not None and cvs["categorical"] is not None,
               _missing(REQUIREMENTS["mape_by_k"], folds, pooled, cvs)):
        mape_by_k = cmp.mape_by_k(mom, {"pooled": cvs["pooled"].oof, "categorical": cvs["categorical"].oof}, per_k)
        for name in ("pooled", "categorical"):
            mape_by_k[f"{name}_lo"], mape_by_k[f"{name}_hi"] = np.array([percentile_interval(c) for c in by_k[name].T]).T
    loko = None
    if loko_pred is not None:
        loko = cmp.loko_table(mom, loko_pred, per_k)
        loko["loko_lo"], loko["loko_hi"] = np.array([percentile_interval(c) for c in by_k["loko"].T]).T
    if smooth is not None:
        smooth[["loko_mape_mean_lo", "loko_mape_mean_hi"]] = [percentile_interval(by_k[f"smooth:{n}"].mean(1))
                                                              for n in smooth.index]

    boundary = None
    if sk.need("boundary", "regime boundary", mom.cells["m"].nunique() >= 2 and folds is not None):
        boundary = sk.run("boundary", "regime boundary", lambda: detect_boundary(mom, n_splits))
    regimes = interp = interp_paper = None
    reps = {name: pd.DataFrame(index=range(n_boot)) for name in ("alpha", "beta0", "c")}
    if sk.need("regimes", "regime rows", len(per_k) > 0):
        reps = _per_k_replicates(mom, per_k, weights, failed)
        regimes, interp, interp_paper = _split_tables(mom, per_k, fits, reps,
                                                      None if boundary is None else boundary.split,
                                                      rule=boundary is not None)
        sk.need("interpolation", "interpolation within a regime", (interp_paper["scheme"] == "interpolate").any())
    big = np.array(ks) >= 5
    nan2 = (np.nan, np.nan)
    c_reps = reps["c"].to_numpy() * 1e3
    intervals = {
        "c_min": percentile_interval(c_reps.min(axis=1)) if c_reps.shape[1] else nan2,
        "c_max": percentile_interval(c_reps.max(axis=1)) if c_reps.shape[1] else nan2,
        "loko_mean": percentile_interval(by_k["loko"].mean(1)) if "loko" in by_k else nan2,
        "mape_ratio": _mape_ratio_interval(mom, folds, weights, fitted)
        if folds is not None and {"Ū + L", "categorical (Eq. 4)"} <= set(fitted) else nan2,
        "pooled_mape_k5_min": percentile_interval(by_k["pooled"][:, big].min(1)) if big.any() and "pooled" in by_k else nan2,
        "pooled_mape_k5_max": percentile_interval(by_k["pooled"][:, big].max(1)) if big.any() and "pooled" in by_k else nan2}
    cluster_se = cmp.cluster_sensitivity(mom, [("categorical (Eq. 4)", joint.design, joint.ols)]
                                         + ([("pooled", cmp.POOLED_DESIGN, pooled)] if pooled is not None else []))
    for what, n_bad in failed.items():
        notes.append(f"cluster bootstrap ({what}): {n_bad} of {n_boot} resamples missed every generation of a cell "
                     "the fit needs; they are left out of its intervals")
    return FinalModelResults(
        per_k=per_k, joint=joint, pooled=pooled, comparison=comparison,
        pooled_std=cmp.pooled_standardized(pooled) if pooled is not None else None, mape_by_k=mape_by_k, loko=loko,
        boundary=boundary, interpolation=interp, interpolation_paper=interp_paper, regimes=regimes, ladder=ladder,
        smooth=smooth, cluster_se=cluster_se, intervals=intervals, report=report, n_rows=mom.n_rows,
        n_generations=mom.n_clusters, n_boot=n_boot, skips=tuple(sk.records), notes=tuple(notes))


def _mape_ratio_interval(mom: CellMoments, folds: np.ndarray, weights: np.ndarray,
                         fitted: dict[str, tuple[Design, CVResult]]) -> tuple[float, float]:
    """95% interval of CV MAPE(Ū + L) / CV MAPE(categorical), both from the same resamples."""
    base = unc.fold_mape_replicates(mom, fitted["Ū + L"][1].oof, folds, weights)
    cat = unc.fold_mape_replicates(mom, fitted["categorical (Eq. 4)"][1].oof, folds, weights)
    return percentile_interval(base / cat)
