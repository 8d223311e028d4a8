"""What the final model is compared with: the pooled linear model, MAPE by K, leave-one-K-out, the
specification ladder, smooth parameterizations of m, interpolation vs transfer, and SEs clustered by
prompt. Each takes the section's :class:`CellMoments` (K >= 1); held-out numbers use its GroupKFold folds.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from speclimits.stats._ols import (CellMoments, CVResult, Design, OLSResults, Term, ape, cross_validate, fit_ols,
                                   held_out_predictions, predict, t_interval)
from speclimits.stats.m_split import FIXED_SPLIT
from speclimits.stats.requirements import REQUIREMENTS, Skips

#: ``T_T ~ Ū + L``: the per-K fits' design and the base of the pooled comparison.
BASE_DESIGN = Design.linear("u_bar", "context_len", label="Ū + L")
POOLED_DESIGN = Design.linear("u_bar", "context_len", "K", label="Ū + L + γK (pooled)")
#: The first row of the smooth-forms table: the pooled form (γK), left out of each K in turn.
POOLED_LOKO_FORM = "pooled Ū + L + γK"

LADDER = [
    ("Ū", ("u_bar",)),
    ("Ū + L", ("u_bar", "context_len")),
    ("+ linear m", ("u_bar", "context_len", "m")),
    ("+ m·L", ("u_bar", "context_len", "m", "m:context_len")),
    ("+ m·Ū", ("u_bar", "context_len", "m", "m:context_len", "m:u_bar")),
    ("+ E_max", ("u_bar", "context_len", "m", "m:context_len", "m:u_bar", "e_max")),
]


def comparison_table(fits: dict[str, OLSResults], cvs: dict[str, CVResult]) -> pd.DataFrame:
    """Ū + L, pooled (γK) and categorical (``fits``, ``cvs`` keyed ``base``, ``pooled``, ``categorical``):
    in-sample R², GroupKFold R², RMSE, MAPE (mean, 95% t half-width). ``attrs``: ``pooled_drmse`` (paired
    fold RMSE reduction by γK), ``pooled_drmse_pct``, ``mape_ratio`` (Ū + L over categorical)."""
    rows = []
    for name, key in (("Ū + L", "base"), ("Ū + L + γK (pooled)", "pooled"), ("categorical (Eq. 4)", "categorical")):
        r = {"model": name, "r2": fits[key].rsquared}
        for met in ("r2", "rmse", "mape"):
            r[f"cv_{met}"], r[f"cv_{met}_ci"] = cvs[key].mean_ci(met)
        rows.append(r)
    comparison = pd.DataFrame(rows).set_index("model")
    d_rmse = t_interval(cvs["base"].folds["rmse"].to_numpy() - cvs["pooled"].folds["rmse"].to_numpy())
    comparison.attrs.update(
        pooled_drmse=d_rmse, pooled_drmse_pct=100 * d_rmse[0] / comparison.loc["Ū + L", "cv_rmse"],
        mape_ratio=comparison.loc["Ū + L", "cv_mape"] / comparison.loc["categorical (Eq. 4)", "cv_mape"])
    return comparison


def pooled_standardized(pooled: OLSResults) -> pd.DataFrame:
    """β* of the pooled model's K, Ū and L (column ``beta_std``, index the terms)."""
    return pooled.standardized()[["beta_std"]].loc[["K", "u_bar", "context_len"]]


def mape_by_k(mom: CellMoments, oof: dict[str, np.ndarray], per_k: pd.DataFrame) -> pd.DataFrame:
    """MAPE (%) by K of the out-of-fold predictions ``oof`` beside the per-K fits' own CV MAPE."""
    pooled, cat, within = _by_k(mom, oof["pooled"]), _by_k(mom, oof["categorical"]), per_k.set_index("K")["cv_mape"]
    return pd.DataFrame([{"K": k, "pooled": pooled[k], "categorical": cat[k], "per_k": float(within.loc[k])}
                         for k in pooled])


def _by_k(mom: CellMoments, pred: np.ndarray) -> dict[int, float]:
    """``{K: MAPE (%)}`` of the (N,) predictions ``pred`` on each K's rows, K ascending."""
    row_k = mom.row_attr("K")
    return {int(k): float(ape(mom.y[row_k == k], pred[row_k == k]).mean()) for k in np.unique(row_k)}


def loko_predictions(mom: CellMoments, design: Design) -> np.ndarray:
    """(N,) prediction of every row by ``design`` fitted on the rounds of all other K."""
    return held_out_predictions(mom, design, mom.cells["K"].to_numpy())


def loko_table(mom: CellMoments, loko_pred: np.ndarray, per_k: pd.DataFrame) -> pd.DataFrame:
    """Leave-one-K-out MAPE (%) of the pooled form per K beside the within-K CV MAPE."""
    within = per_k.set_index("K")["cv_mape"]
    return pd.DataFrame([{"K": k, "loko_mape": v, "within_k_mape": float(within.loc[k])}
                         for k, v in _by_k(mom, loko_pred).items()])


def _in_m(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> list[Term]:
    """A smooth function of m entering the intercept and the Ū slope."""
    scale = (lambda cells, f=fn: f(cells["m"].to_numpy(dtype=float)))
    return [Term(name, "const", None, None, scale), Term(f"{name}·Ū", "u_bar", None, None, scale)]


def smooth_designs(hinge_at: int = FIXED_SPLIT) -> dict[str, tuple[str, Design]]:
    """Smooth forms of β0(m) and α(m) (shared c) for leave-one-K-out, ``{name: (requirement key, design)}``:
    linear, quadratic, log m and a hinge after ``hinge_at`` (fixed in advance, not tuned in the folds)."""
    const, u, ctx = Term("const", "const"), Term("u_bar", "u_bar"), Term("context_len", "context_len")
    forms = {
        "linear m (β0 and α linear in m)": ("smooth_linear", _in_m("m", lambda m: m)),
        "quadratic m": ("smooth_quadratic", _in_m("m", lambda m: m) + _in_m("m²", lambda m: m ** 2)),
        "log m": ("smooth_log", _in_m("log m", np.log)),
        f"hinge after m = {hinge_at} (fixed)": ("smooth_hinge", _in_m("m", lambda m: m)
                                                + _in_m(f"(m-{hinge_at})+", lambda m: np.maximum(m - hinge_at, 0.0))),
    }
    return {name: (need, Design(tuple([const, u, *terms, ctx]), name)) for name, (need, terms) in forms.items()}


def smooth_table(mom: CellMoments, pooled_loko: np.ndarray | None, skips: Skips
                 ) -> tuple[pd.DataFrame | None, dict[str, np.ndarray]]:
    """Leave-one-K-out MAPE (%) of each smooth form (the pooled γK first, when given): the mean over K
    and the worst K; returns the table (None when no form is left) and the (N,) predictions by form.
    A form some fit cannot identify is left out and recorded in ``skips``."""
    preds = {POOLED_LOKO_FORM: pooled_loko} if pooled_loko is not None else {}
    for name, (need, d) in smooth_designs().items():
        pred = skips.run("smooth", f"smooth form '{name}'", lambda: loko_predictions(mom, d), REQUIREMENTS[need])
        if pred is not None:
            preds[name] = pred
    if not preds:
        return None, {}
    rows = []
    for name, pred in preds.items():
        by_k = _by_k(mom, pred)
        worst = max(by_k, key=by_k.get)
        rows.append({"form": name, "loko_mape_mean": float(np.mean(list(by_k.values()))),
                     "loko_mape_max": by_k[worst], "worst_k": worst})
    return pd.DataFrame(rows).set_index("form"), preds


def ladder_table(mom: CellMoments, folds: np.ndarray, cat_fit: OLSResults, cv_cat: CVResult | None,
                 skips: Skips) -> tuple[pd.DataFrame, dict[str, tuple[Design, CVResult]]]:
    """Nested specifications plus the categorical form: in-sample R², GroupKFold MAPE (mean, 95% t
    half-width), RMSE; returns the table and ``{spec: (design, cv)}``. An unidentified specification keeps
    a row of NaN and is recorded in ``skips``."""
    rows, fitted = [], {}

    def row(name: str, r2: float = np.nan, cv: CVResult | None = None) -> None:
        mape, half = cv.mean_ci("mape") if cv is not None else (np.nan, np.nan)
        rows.append({"spec": name, "r2": r2, "cv_mape": mape, "cv_mape_ci": half,
                     "cv_rmse": cv.mean_ci("rmse")[0] if cv is not None else np.nan})

    for name, specs in LADDER:
        d = Design.linear(*specs, label=name)
        got = skips.run("ladder", f"ladder row '{name}'", lambda: (cross_validate(mom, d, folds),
                                                                   fit_ols(mom, d).rsquared))
        cv, r2 = got if got is not None else (None, np.nan)
        if cv is not None:
            fitted[name] = (d, cv)
        row(name, r2, cv)
    row("categorical (Eq. 4)", cat_fit.rsquared, cv_cat)
    return pd.DataFrame(rows).set_index("spec"), fitted


def interpolation_table(mom: CellMoments, fits: dict[int, OLSResults], split: int | None) -> pd.DataFrame:
    """Each K's rounds predicted with other Ks' per-K coefficients: ``interpolate`` (the mean of m-1's and
    m+1's; ``within regime`` or ``across boundary``) and ``transfer`` (a boundary m with the adjacent m's on
    the other side); ``mape`` in %."""
    by_m = {int(f_k) + 1: fit for f_k, fit in fits.items()}
    regime = (lambda m: 0 if split is None or m <= split else 1)

    def score(m: int, params: np.ndarray) -> float:
        sub = mom.where(m=m)
        return float(ape(sub.y, predict(sub, BASE_DESIGN, params)).mean())

    rows = []
    for m in sorted(by_m):
        if m - 1 in by_m and m + 1 in by_m:
            params = (by_m[m - 1].params.to_numpy() + by_m[m + 1].params.to_numpy()) / 2
            rel = "within regime" if regime(m - 1) == regime(m) == regime(m + 1) else "across boundary"
            rows.append({"K": m - 1, "m": m, "scheme": "interpolate", "relation": rel,
                         "sources": f"K={m - 2},{m}", "mape": score(m, params)})
    if split is not None and split in by_m and split + 1 in by_m:
        for m, src in ((split, split + 1), (split + 1, split)):
            rows.append({"K": m - 1, "m": m, "scheme": "transfer", "relation": "across boundary",
                         "sources": f"K={src - 1}", "mape": score(m, by_m[src].params.to_numpy())})
    return pd.DataFrame(rows, columns=["K", "m", "scheme", "relation", "sources", "mape"])


def cluster_sensitivity(mom: CellMoments, fits: Sequence[tuple[str, Design, OLSResults]]) -> pd.DataFrame:
    """The SEs of each ``(label, design, fit)`` clustered by generation (as reported) and by prompt (one
    prompt's generations at every K form one cluster); empty when the rounds carry no ``prompt_id``."""
    cols = ["model", "term", "coef", "se_generation", "se_prompt", "ratio", "n_generations", "n_prompts"]
    if "prompt_id" not in mom.cells.columns:
        return pd.DataFrame(columns=cols)
    by_prompt = mom.recluster("prompt_id")
    rows = []
    for label, design, fit in fits:
        alt = fit_ols(by_prompt, design)
        for term in fit.params.index:
            se_g, se_p = float(fit.bse[term]), float(alt.bse[term])
            rows.append({"model": label, "term": term, "coef": float(fit.params[term]), "se_generation": se_g,
                         "se_prompt": se_p, "ratio": se_p / se_g if se_g > 0 else math.nan,
                         "n_generations": fit.n_clusters, "n_prompts": alt.n_clusters})
    return pd.DataFrame(rows, columns=cols)
