"""Draft-time model ``T_D = a·K + b`` (the draft head is dense: no routing term) on decode rounds with
K >= 1 and a non-zero draft time (a zero is a failed measurement), SEs clustered by generation.
:attr:`DraftResults.zero_comparison` fits it with the zeros too (the appendix fits "all 925,752
rounds" and reports 0.3% zero timings without saying which it did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.stats._ols import (CellMoments, CVResult, Design, OLSResults, cross_validate, fit_ols,
                                   group_folds, predict)
from speclimits.stats.requirements import REQUIREMENTS
from speclimits.trace import FilterReport, decode_rounds

DRAFT_DESIGN = Design.linear("K", label="a·K + b")


@dataclass(frozen=True)
class DraftResults:
    """The draft section: the fit, ``by_k`` (mean T_D, the line, deviation %), ``cv`` (``medape`` is the
    paper's CV MedAPE), ``tail_share`` (|residual| > 1 ms), shares of zero draft (``zero_share_draft``) or
    any (``zero_share_any``) timing, and ``zero_comparison`` (the line without and with the zeros)."""

    ols: OLSResults
    by_k: pd.DataFrame
    cv: CVResult
    tail_share: float
    zero_share_draft: float
    zero_share_any: float
    residual_quantiles: pd.Series
    report: FilterReport
    zero_comparison: pd.DataFrame

    @property
    def params(self) -> pd.Series:
        return self.ols.params.rename({"K": "a", "const": "b"})

    @property
    def bse(self) -> pd.Series:
        return self.ols.bse.rename({"K": "a", "const": "b"})

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        return self.ols.conf_int(alpha).rename({"K": "a", "const": "b"})

    def table(self) -> pd.DataFrame:
        """The headline numbers by ``quantity``: ``key``, ``ours``, ``se_or_ci``."""
        ci = self.conf_int()
        rows = [
            ("a (ms/step)", "a", self.params["a"], self.bse["a"]),
            ("b (ms)", "b", self.params["b"], self.bse["b"]),
            ("mean |dev| of mean T_D by K from line (%)", "mean_dev_pct", self.by_k["dev_pct"].abs().mean(), np.nan),
            ("CV MedAPE (%)", "cv_medape_pct", self.cv.mean_ci("medape")[0], self.cv.mean_ci("medape")[1]),
            ("per-round R²", "r2", self.ols.rsquared, np.nan),
            ("rounds with |residual| > 1 ms (%)", "tail_share_pct", 100 * self.tail_share, np.nan),
            ("records with a zero timing (%)", "zero_share_pct", 100 * self.zero_share_any, np.nan),
        ]
        out = pd.DataFrame(rows, columns=["quantity", "key", "ours", "se_or_ci"]).set_index("quantity")
        out.attrs["ci"] = ci
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"fit": self.ols.to_dict(), "a": float(self.params["a"]), "b": float(self.params["b"]),
                "a_se": float(self.bse["a"]), "b_se": float(self.bse["b"]), "by_k": self.by_k,
                "cv": self.cv.to_dict(), "tail_share": self.tail_share, "zero_share_draft": self.zero_share_draft,
                "zero_share_any": self.zero_share_any, "residual_quantiles": self.residual_quantiles,
                "filter": self.report.to_dict(), "table": self.table().reset_index(),
                "zero_comparison": self.zero_comparison.rename_axis("variant").reset_index()}

    def summary(self) -> str:
        return (f"Draft model T_D = a·K + b ({self.ols.nobs:,} rounds, {self.ols.n_clusters:,} generations; "
                f"{self.report})\n" + self.table().to_string(float_format=lambda v: f"{v:.4g}"))


def fit_draft_model(rounds: pd.DataFrame, n_splits: int = 5) -> DraftResults:
    """Fit and check the draft line on the ``rounds`` table of a trace."""
    dec, report = decode_rounds(rounds, timing="draft")
    mom = CellMoments.from_rounds(dec, response="t_draft_ms", base=())
    fit = fit_ols(mom, DRAFT_DESIGN)
    resid = mom.y - predict(mom, DRAFT_DESIGN, fit.params)
    k = mom.row_attr("K")
    means = pd.Series(mom.y).groupby(k).mean()
    line = fit.params["const"] + fit.params["K"] * means.index.to_numpy()
    by_k = pd.DataFrame({"K": means.index.astype(int), "n": pd.Series(k).value_counts().sort_index().to_numpy(),
                         "mean_t_draft_ms": means.to_numpy(), "line_ms": line,
                         "dev_pct": 100 * (means.to_numpy() - line) / line})
    cv = cross_validate(mom, DRAFT_DESIGN, group_folds(mom, n_splits))
    _, both = decode_rounds(rounds.loc[rounds["K"].to_numpy() > 0], timing="both")
    q = pd.Series(np.quantile(resid, [0.001, 0.01, 0.5, 0.99, 0.999]), index=["0.1%", "1%", "50%", "99%", "99.9%"])
    return DraftResults(fit, by_k, cv, float(np.mean(np.abs(resid) > 1.0)), report.share_zero_timing,
                        both.share_zero_timing, q, report, _zero_comparison(rounds, fit))


def draft_model_or_reason(rounds: pd.DataFrame, n_splits: int = 5) -> tuple[DraftResults | None, str | None]:
    """:func:`fit_draft_model`, or None and why not: the requirement, what this trace has and the fit's
    own message (``speclimits fit``'s skipped line)."""
    try:
        return fit_draft_model(rounds, n_splits=n_splits), None
    except SpeclimitsError as exc:
        dec, _ = decode_rounds(rounds, timing="draft")
        ks = ", ".join(str(int(k)) for k in sorted(dec["K"].unique()))
        have = f"K = {ks}; {dec['generation_id'].nunique()} generations" if len(dec) else "no draft timings"
        return None, f"{REQUIREMENTS['draft']} (this trace: {have}; {exc})"


def _zero_comparison(rounds: pd.DataFrame, fit: OLSResults) -> pd.DataFrame:
    """The draft line without and with the rounds whose draft time is zero."""
    keep = (rounds["phase"].astype(str).to_numpy() == "decode") & (rounds["K"].to_numpy() > 0)
    mom = CellMoments.from_rounds(rounds.loc[keep].reset_index(drop=True), response="t_draft_ms", base=())
    with_zeros = fit_ols(mom, DRAFT_DESIGN)
    n_zero = int((mom.y <= 0).sum())
    rows = {}
    for name, f, nz in (("zero draft times excluded (reported)", fit, 0), ("zero draft times included", with_zeros,
                                                                           n_zero)):
        rows[name] = {"n": f.nobs, "n_zero": nz, "a": f.params["K"], "a_se": f.bse["K"], "b": f.params["const"],
                      "b_se": f.bse["const"], "r2": f.rsquared}
    return pd.DataFrame(rows).T
