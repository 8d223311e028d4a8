"""Where (and whether) the budget regime changes: a parsimonious rule on a cross-validated curve.

Candidates: "no split" and, for each m but the largest, ``m <= s | m > s`` (:func:`regime_design`), each
scored by GroupKFold(5) by generation. **The rule** (one standard error, Hastie, Tibshirani & Friedman
§7.10): ``s*``, the smallest mean fold RMSE, is declared only if no split's exceeds it by more than
``s*``'s SE. **Stability**: the rule is repeated inside every outer training set (nested CV) and the
split kept only if every outer fold selects it; otherwise "no regime", with why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from speclimits.stats._ols import CellMoments, Design, Term, ape, cv_fold_sse, fit_ols, group_folds, predict

RULE_TEXT = ("one-standard-error rule against 'no split' (a split is declared only if its GroupKFold RMSE "
             "beats no split by more than one SE of its fold RMSEs), then nested CV: the split is kept only "
             "if the same rule, repeated inside every outer training set, selects it in every outer fold")


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


def split_curve(mom: CellMoments, n_splits: int = 5) -> pd.DataFrame:
    """CV error of every candidate split (``split`` NaN = no split): ``cv_rmse`` (pooled), ``fold_rmse_mean``
    and ``_se``, ``d_vs_none`` (paired fold-RMSE reduction against no split) and ``_se``;
    ``attrs["fold_rmse"]``: the (candidates, folds) matrix."""
    folds = group_folds(mom, n_splits)
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    splits: list[int | None] = [None, *ms[:-1]]
    per_fold = []
    rows = []
    for s in splits:
        sse, n = cv_fold_sse(mom, regime_design(s, ms), folds)
        per_fold.append(np.sqrt(sse / n))
        rows.append({"split": np.nan if s is None else float(s), "cv_rmse": math.sqrt(sse.sum() / n.sum())})
    fr = np.array(per_fold)
    nf = fr.shape[1]
    d = fr[0][None, :] - fr
    out = pd.DataFrame(rows).assign(
        fold_rmse_mean=fr.mean(1), fold_rmse_se=fr.std(1, ddof=1) / math.sqrt(nf),
        d_vs_none=d.mean(1), d_vs_none_se=d.std(1, ddof=1) / math.sqrt(nf))
    out.attrs["fold_rmse"] = fr
    return out


def one_se_rule(curve: pd.DataFrame) -> tuple[int | None, int | None]:
    """``(selected, argmin)``: the split the one-SE rule keeps (None = no split) and the plain argmin."""
    best = int(curve["fold_rmse_mean"].to_numpy().argmin())
    s = curve["split"].iloc[best]
    argmin = None if math.isnan(s) else int(s)
    if argmin is None:
        return None, None
    none_rmse = float(curve.loc[curve["split"].isna(), "fold_rmse_mean"].iloc[0])
    within = none_rmse <= curve["fold_rmse_mean"].iloc[best] + curve["fold_rmse_se"].iloc[best]
    return (None if within else argmin), argmin


def _outer_folds(mom: CellMoments, n_splits: int) -> pd.DataFrame:
    """Per outer fold: the rule's selection on the training folds alone, and the held-out error of it."""
    ms = sorted(int(v) for v in mom.cells["m"].unique())
    cell_fold = group_folds(mom, n_splits)[mom.cells["cluster"].to_numpy()]
    outer = []
    for f in range(n_splits):
        train, test = mom.subset(cell_fold != f), mom.subset(cell_fold == f)
        sel, argmin = one_se_rule(split_curve(train, n_splits))
        design = regime_design(sel, ms)
        yhat = predict(test, design, fit_ols(train, design).params)
        outer.append({"fold": f, "selected": sel, "argmin": argmin,
                      "test_rmse": float(np.sqrt(np.mean((test.y - yhat) ** 2))),
                      "test_mape": float(ape(test.y, yhat).mean())})
    out = pd.DataFrame(outer)
    for col in ("selected", "argmin"):  # keep None (no split) as None, not NaN
        out[col] = pd.Series([r[col] for r in outer], dtype=object)
    return out


@dataclass(frozen=True)
class BoundaryResults:
    """Whether and where the regime changes: ``split`` (last m of the lower regime, or None), the rule's
    ``rule_split`` and the curve's ``argmin_split`` on all data, ``curve`` (:func:`split_curve`), ``outer``
    (per outer fold the rule's selection and the held-out error), ``n_agree`` and a one-sentence ``reason``.
    """

    split: int | None
    rule_split: int | None
    argmin_split: int | None
    curve: pd.DataFrame
    outer: pd.DataFrame
    n_agree: int
    reason: str
    method: str = RULE_TEXT

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split, "rule_split": self.rule_split, "argmin_split": self.argmin_split,
                "n_agree": self.n_agree, "reason": self.reason, "method": self.method, "curve": self.curve,
                "outer_folds": self.outer}

    def summary(self) -> str:
        head = ("Regime boundary: none" if self.split is None else
                f"Regime boundary: m <= {self.split} | m > {self.split}")
        return (f"{head} ({self.reason})\nrule: {self.method}\n"
                + self.curve.to_string(float_format="{:.5f}".format))


def _reason(rule: int | None, argmin: int | None, outer: pd.DataFrame, n_agree: int) -> str:
    picks = ", ".join("none" if v is None else str(v) for v in outer["selected"])
    if rule is None:
        why = ("the curve's minimum is no split" if argmin is None else
               f"the best split (m <= {argmin}) is within one SE of no split")
        return f"{why}; outer folds select {picks}"
    if n_agree < len(outer):
        return f"the rule selects m <= {rule} on all data but the outer folds disagree ({picks})"
    return f"the rule selects m <= {rule} on all data and in every outer fold"


def detect_boundary(mom: CellMoments, n_splits: int = 5) -> BoundaryResults:
    """Apply the parsimonious rule to the rounds of ``mom`` (all K of the section)."""
    curve = split_curve(mom, n_splits)
    rule, argmin = one_se_rule(curve)
    outer = _outer_folds(mom, n_splits)
    n_agree = int(sum((v == rule) for v in outer["selected"]))
    split = rule if n_agree == len(outer) else None
    return BoundaryResults(split, rule, argmin, curve, outer, n_agree, _reason(rule, argmin, outer, n_agree))
