"""Factor analysis of target time (Table A2) and the standardized associations by K (H3).

>>> res = analyze_factors(tr.rounds)            # doctest: +SKIP
>>> res.table                                    # Table A2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.stats._ols import CellMoments, Design, cross_validate, fit_ols, group_folds, t_interval
from speclimits.stats.comparisons import BASE_DESIGN
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


#: What the factor analysis needs; a factor (or a K) the trace cannot give is skipped with this
#: text in :attr:`FactorResults.skipped` (``speclimits factors`` prints one line each).
FACTOR_REQUIREMENTS = {
    "cv": "the cross-validated factor table needs >= 5 generations with K > 0 (GroupKFold(5) by generation)",
    "factor": "a factor is scored only where it varies among the decode rounds with K > 0",
    "m": ("m varies only with >= 2 values of K > 0 (or a drafter that proposes drafts of several lengths, "
          "e.g. n-gram)"),
    "by_k": "the standardized associations at a K need rounds at that K whose Ū and L vary",
}


@dataclass(frozen=True)
class FactorResults:
    """Table A2 (per factor ``r2``, ``rmse`` and ``drmse``, the paired RMSE reduction of Ū + factor over Ū
    alone in ms, each with a 95% t half-width ``_ci``) with its ``folds``, the H3 associations ``by_k``
    (standardized β* with clustered 95% CI) and the Pearson ``corr`` of the factors and T_T.
    """

    table: pd.DataFrame
    folds: pd.DataFrame
    by_k: pd.DataFrame
    corr: pd.DataFrame
    report: FilterReport
    n_rows: int
    n_generations: int
    k_values: tuple[int, ...]
    #: ``{what: why}`` for each factor or K the trace cannot give (left out of ``table`` / ``by_k``)
    skipped: dict[str, str] = field(default_factory=dict)

    def skipped_lines(self) -> list[str]:
        return [f"skipped {name}: {why}" for name, why in self.skipped.items()]

    def why_missing(self) -> str | None:
        """The ``skipped`` entries as one text, or None."""
        return "; ".join(f"{name}: {why}" for name, why in self.skipped.items()) or None

    def to_dict(self) -> dict[str, Any]:
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "k_values": list(self.k_values), "table_a2": self.table.rename_axis("factor"),
                "folds": self.folds, "standardized_by_k": self.by_k, "correlation": self.corr.rename_axis("factor"),
                "skipped": dict(self.skipped)}

    def summary(self) -> str:
        t = self.table.copy()
        lines = [f"Factor analysis (GroupKFold(5) by generation; {self.n_rows:,} rounds, "
                 f"{self.n_generations:,} generations, K = {list(self.k_values)})",
                 t.to_string(float_format=lambda v: f"{v:.4g}"), "",
                 "Standardized associations within K (β*, 95% CI, clustered):",
                 self.by_k.pivot(index="K", columns="term", values="beta_std").to_string(float_format="{:.3f}".format)
                 if len(self.by_k) else "(none)"]
        return "\n".join(lines + self.skipped_lines())


def analyze_factors(rounds: pd.DataFrame, n_splits: int = 5) -> FactorResults:
    """The factor analysis on the decode rounds with a target time and K >= 1: each factor fitted alone
    and with Ū on four folds and scored on the fifth (GroupKFold by generation). A factor the trace
    cannot score, a K whose associations cannot be fitted, or the whole table when there are too few
    generations, is left out and named in ``skipped`` (:data:`FACTOR_REQUIREMENTS`); raises only without
    decode rounds at K >= 1.
    """
    dec, report = decode_rounds(rounds, timing="target")
    dec = dec.loc[dec["K"].to_numpy() >= 1].reset_index(drop=True)
    if dec.empty:
        raise SpeclimitsError("the factor analysis needs decode rounds with K >= 1 (this trace has none)")
    mom = CellMoments.from_rounds(dec)
    ks = [int(k) for k in sorted(mom.cells["K"].unique())]
    have = f"K = {', '.join(map(str, ks))}; {mom.n_clusters} generations"
    skipped: dict[str, str] = {}
    rows, fold_rows = [], []
    try:
        folds = group_folds(mom, n_splits)
        base = cross_validate(mom, Design.linear("u_bar"), folds)
    except SpeclimitsError as exc:
        skipped["cross-validated factor table (Table A2)"] = f"{FACTOR_REQUIREMENTS['cv']} (this trace: {have}; {exc})"
        base = None
    for name, label in FACTORS.items() if base is not None else ():
        try:
            alone = cross_validate(mom, Design.linear(name), folds)
            both = base if name == "u_bar" else cross_validate(mom, Design.linear("u_bar", name), folds)
        except SpeclimitsError as exc:
            need = FACTOR_REQUIREMENTS["m" if name == "m" else "factor"]
            skipped[f"factor {label}"] = f"{need} (this trace: {have}; {exc})"
            continue
        d = base.folds["rmse"].to_numpy() - both.folds["rmse"].to_numpy()
        r2, r2h = alone.mean_ci("r2")
        rm, rmh = alone.mean_ci("rmse")
        dm, dh = t_interval(d) if name != "u_bar" else (np.nan, np.nan)
        rows.append({"factor": name, "label": label, "r2": r2, "r2_ci": r2h, "rmse": rm, "rmse_ci": rmh,
                     "drmse": dm, "drmse_ci": dh})
        for i, f in alone.folds.iterrows():
            fold_rows.append({"factor": name, "fold": int(f["fold"]), "r2": f["r2"], "rmse": f["rmse"],
                              "rmse_with_u": both.folds["rmse"].iloc[i], "n_test": int(f["n_test"])})
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS).set_index("factor")

    by_k = []
    for k in ks:
        try:
            fit = fit_ols(mom.where(K=int(k)), BASE_DESIGN)
        except SpeclimitsError as exc:
            skipped[f"standardized associations at K = {k}"] = f"{FACTOR_REQUIREMENTS['by_k']} ({exc})"
            continue
        st = fit.standardized()
        for term in ("u_bar", "context_len"):
            by_k.append({"K": int(k), "term": term, "beta_std": st.loc[term, "beta_std"],
                         "lower": st.loc[term, "lower"], "upper": st.loc[term, "upper"]})
    cols = {"t_target_ms": mom.y, **{f: (mom.row_attr("m").astype(float) if f == "m" else mom.column(f))
                                     for f in FACTORS}}
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant factor (skipped above) correlates as NaN
        corr = pd.DataFrame(np.corrcoef(np.vstack(list(cols.values()))), index=list(cols), columns=list(cols))
    return FactorResults(table, pd.DataFrame(fold_rows), pd.DataFrame(by_k, columns=BY_K_COLUMNS), corr, report,
                         mom.n_rows, mom.n_clusters, tuple(ks), skipped)


TABLE_COLUMNS = ["factor", "label", "r2", "r2_ci", "rmse", "rmse_ci", "drmse", "drmse_ci"]
BY_K_COLUMNS = ["K", "term", "beta_std", "lower", "upper"]
