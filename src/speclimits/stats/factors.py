"""Factor analysis of target time (Table A2) and the standardized associations by K (H3).

>>> res = analyze_factors(tr.rounds)            # doctest: +SKIP
>>> res.to_frame()                               # Table A2, paper beside ours
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.stats._ols import (CellMoments, Design, OLSResults, ResultsMixin, cross_validate, fit_ols,
                                   group_folds, t_interval)
from speclimits.trace import FilterReport, decode_rounds

#: The six candidate factors, in Table A2 order, with display labels.
FACTORS: dict[str, str] = {
    "u_bar": "Ū (unique experts)",
    "m": "m (budget)",
    "context_len": "L (context)",
    "kv_usage": "KV usage",
    "graph_bucket": "graph bucket",
    "e_max": "E_max",
}


def select_k(rounds: pd.DataFrame, k_values: Sequence[int] | None) -> pd.DataFrame:
    """Rows with K in ``k_values``; default K >= 1 (the paper's sweep; K = 0 only feeds m = 1)."""
    k = rounds["K"].to_numpy()
    keep = np.isin(k, list(k_values)) if k_values is not None else k >= 1
    return rounds.loc[keep].reset_index(drop=True)


@dataclass(frozen=True)
class FactorResults(ResultsMixin):
    """Table A2, the H3 associations and the factor correlations.

    Attributes
    ----------
    table : one row per factor: ``r2``, ``r2_ci`` (95% t half-width, 4 df), ``rmse``, ``rmse_ci``,
        ``drmse`` / ``drmse_ci`` (paired RMSE reduction of Ū + factor over Ū alone, ms), and the paper's.
    folds : per factor and fold: ``r2``, ``rmse``, ``rmse_with_u`` (Ū + factor), ``n_test``.
    by_k : per K and term (``u_bar``, ``context_len``): standardized β* with 95% CI (clustered).
    corr : Pearson correlations of the factors and T_T over the pooled rows.
    report : the decode-round filter report; n_rows, n_generations, k_values.
    """

    table: pd.DataFrame
    folds: pd.DataFrame
    by_k: pd.DataFrame
    corr: pd.DataFrame
    report: FilterReport
    n_rows: int
    n_generations: int
    k_values: tuple[int, ...]
    per_k_fits: dict[int, OLSResults] = field(default_factory=dict, repr=False)

    @property
    def params(self) -> pd.Series:
        """Standalone CV R² by factor (the headline numbers)."""
        return self.table["r2"]

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def to_dict(self) -> dict[str, Any]:
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "k_values": list(self.k_values), "table_a2": self.table.rename_axis("factor"),
                "folds": self.folds, "standardized_by_k": self.by_k, "correlation": self.corr.rename_axis("factor")}

    def summary(self) -> str:
        t = self.table.copy()
        lines = [f"Factor analysis (GroupKFold(5) by generation; {self.n_rows:,} rounds, "
                 f"{self.n_generations:,} generations, K = {list(self.k_values)})",
                 t.to_string(float_format=lambda v: f"{v:.4g}"), "",
                 "Standardized associations within K (β*, 95% CI, clustered):",
                 self.by_k.pivot(index="K", columns="term", values="beta_std").to_string(float_format="{:.3f}".format)]
        return "\n".join(lines)


def analyze_factors(rounds: pd.DataFrame, k_values: Sequence[int] | None = None, n_splits: int = 5) -> FactorResults:
    """Run the factor analysis on the ``rounds`` table of a trace.

    Decode rounds with a non-zero target time (:func:`speclimits.trace.decode_rounds`), K in
    ``k_values`` (default K >= 1). Each factor is fitted alone and together with Ū by OLS on four
    folds and scored on the fifth (GroupKFold by generation).
    """
    dec, report = decode_rounds(rounds, timing="target")
    dec = select_k(dec, k_values)
    mom = CellMoments.from_rounds(dec)
    folds = group_folds(mom, n_splits)
    base = cross_validate(mom, Design.linear("u_bar"), folds)
    rows, fold_rows = [], []
    for name, label in FACTORS.items():
        alone = cross_validate(mom, Design.linear(name), folds)
        both = base if name == "u_bar" else cross_validate(mom, Design.linear("u_bar", name), folds)
        d = base.folds["rmse"].to_numpy() - both.folds["rmse"].to_numpy()
        r2, r2h = alone.mean_ci("r2")
        rm, rmh = alone.mean_ci("rmse")
        dm, dh = t_interval(d) if name != "u_bar" else (np.nan, np.nan)
        rows.append({"factor": name, "label": label, "r2": r2, "r2_ci": r2h, "rmse": rm, "rmse_ci": rmh,
                     "drmse": dm, "drmse_ci": dh, "paper_r2": paper.FACTORS[name]["r2"],
                     "paper_drmse": paper.FACTORS[name]["drmse"]})
        for i, f in alone.folds.iterrows():
            fold_rows.append({"factor": name, "fold": int(f["fold"]), "r2": f["r2"], "rmse": f["rmse"],
                              "rmse_with_u": both.folds["rmse"].iloc[i], "n_test": int(f["n_test"])})
    table = pd.DataFrame(rows).set_index("factor")

    by_k, fits = [], {}
    for k in sorted(mom.cells["K"].unique()):
        fit = fit_ols(mom.where(K=int(k)), Design.linear("u_bar", "context_len"))
        fits[int(k)] = fit
        st = fit.standardized()
        for term in ("u_bar", "context_len"):
            pk = paper.STANDARDIZED_BY_K.get(int(k))
            by_k.append({"K": int(k), "term": term, "beta_std": st.loc[term, "beta_std"],
                         "lower": st.loc[term, "lower"], "upper": st.loc[term, "upper"],
                         "paper": (pk[0] if term == "u_bar" else pk[1]) if pk else np.nan})
    cols = {"t_target_ms": mom.y, **{f: (mom.row_attr("m").astype(float) if f == "m" else mom.column(f))
                                     for f in FACTORS}}
    corr = pd.DataFrame(np.corrcoef(np.vstack(list(cols.values()))), index=list(cols), columns=list(cols))
    return FactorResults(table, pd.DataFrame(fold_rows), pd.DataFrame(by_k), corr, report, mom.n_rows,
                         mom.n_clusters, tuple(int(k) for k in sorted(mom.cells["K"].unique())), fits)
