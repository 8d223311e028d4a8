"""Tables of the regimes page (``book/regimes.py``): the designed experiment, the measured targets, two CPUs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from speclimits import regime
from speclimits.book.present import ci_column, fmt_ci, se_ci


def width_table(fits: pd.DataFrame, share: pd.DataFrame) -> pd.DataFrame:
    """One row per expert width: α pooled over m ≥ 5 with its interval, the pass time at m = 1, and the
    expert share of a pass at m = 5 and m = 9 (at the target's own Ū)."""
    rows = []
    for w, f in fits.groupby("width"):
        pooled = regime.pooled_alpha(f)
        sh = share[share["width"] == w].set_index("m")["expert_share"]
        rows.append({"Expert width": int(w),
                     "α, m ≥ 5 (ms/expert)": fmt_ci(pooled["alpha"], pooled["lo"], pooled["hi"]),
                     "T_T at m = 1 (ms)": round(float(f.loc[f["m"] == 1, "t_mean"].iloc[0]), 2),
                     "Expert share, m = 5": round(float(sh.get(5, np.nan)), 2),
                     "Expert share, m = 9": round(float(sh.get(9, np.nan)), 2)})
    return pd.DataFrame(rows)


def targets_by_m(traces: dict[str, Path], m_values: tuple[int, ...] = (1, 2, 3, 5, 9, 11)) -> pd.DataFrame:
    """Mean target time by m (decode rounds) of each measured target, side by side: ``traces`` maps a
    column label to a trace folder."""
    from speclimits.trace import read_table

    cols = {}
    for label, path in traces.items():
        d = regime.decode_rounds(read_table(path, "rounds"))
        cols[f"{label}: T_T (ms)"] = d.groupby("m")["t_target_ms"].mean()
        cols[f"{label}: Ū"] = d.groupby("m")["u_bar"].mean()
    out = pd.DataFrame(cols)
    out = out[out.index.isin(m_values)].round(2)
    out.index.name = "m"
    return out.reset_index()


def experiment_vs_regression(designed: pd.DataFrame, regression: pd.DataFrame) -> pd.DataFrame:
    """Per m: the designed experiment's α (planted Ū, causal) beside the regression's (Eq. 4 on the target's
    own rounds), with 95% intervals, and whether the designed estimate lies inside the regression's interval."""
    d = designed.set_index("m")
    r = regression.set_index("m")
    rows = []
    for m in sorted(set(d.index) & set(r.index)):
        if not np.isfinite(d.loc[m, "alpha"]) or not bool(r.loc[m, "identified"]):
            continue
        inside = r.loc[m, "alpha_lo"] <= d.loc[m, "alpha"] <= r.loc[m, "alpha_hi"]
        rows.append({"m": int(m),
                     "Designed α (ms/expert)": fmt_ci(d.loc[m, "alpha"], d.loc[m, "alpha_lo"], d.loc[m, "alpha_hi"]),
                     "Regression α (ms/expert)": fmt_ci(r.loc[m, "alpha"], r.loc[m, "alpha_lo"], r.loc[m, "alpha_hi"]),
                     "Designed inside the regression's interval": "yes" if inside else "no",
                     "Ratio regression / designed": round(float(r.loc[m, "alpha"] / d.loc[m, "alpha"]), 2)})
    return pd.DataFrame(rows)


def context_slope_table(slopes: dict[str, "regime.ContextSlope"]) -> pd.DataFrame:
    """One row per quantity, one column per target: the longest context, the per-K c (10⁻³ ms per context
    token; range, max/min, test of one c for every K) and the weighted line c = c0 + c1·m with its test."""
    cols = {}
    for label, s in slopes.items():
        b, ln = s.by_k, s.line
        cols[label] = {
            "longest context (tokens)": f"{int(b['context_max'].max()):,}",
            "per-K c, min–max": f"{1e3 * b['c'].min():.2f}–{1e3 * b['c'].max():.2f}",
            "per-K c, max / min": f"{s.spread:.2f}",
            "one c for every K: p": f"{s.flat['p']:.1g}",
            "line: c0": se_ci(ln["c0"], ln["c0_se"], 1e3),
            "line: c1 per unit of m": se_ci(ln["c1"], ln["c1_se"], 1e3),
            "line: p of its residuals": f"{ln['p']:.2g}",
            "per-K c over the line, max / min": f"{s.spread_line:.2f}",
        }
    return pd.DataFrame(cols).rename_axis("Quantity").reset_index()


# -- the same twin on two CPUs --------------------------------------------------------------------

def machines_table(cmp: "regime.MachineComparison", m_values: tuple[int, ...] = (1, 5, 11)) -> pd.DataFrame:
    """One row per quantity, one column per machine: the CPU, T_T at a few m, α pooled over m ≥ 5
    (inverse-variance), the expert share of a pass, the context line, the cost model's R², the Oracle (95%
    intervals over cost-model refits) and its largest error against the measured static-K sweep."""
    from speclimits.machine import describe

    cols = {}
    for label in cmp.cpus:
        p = cmp.passes[cmp.passes["machine"] == label].set_index("m")
        sh = cmp.shares[cmp.shares["machine"] == label]
        big = sh[sh["m"] >= 5]
        se = (big["alpha_hi"] - big["alpha_lo"]) / (2 * 1.96)
        w = 1.0 / se ** 2
        a, a_se = float((w * big["alpha"]).sum() / w.sum()), float(np.sqrt(1.0 / w.sum()))
        ln = cmp.slopes[label].line if cmp.slopes[label] is not None else None
        rep = cmp.oracle[label]
        iv = rep.interval if rep is not None else None
        col = {"CPU": describe(cmp.cpus[label])}
        for m in m_values:
            if m in p.index:
                col[f"T_T at m = {m} (ms)"] = fmt_ci(p.loc[m, "t_ms"], p.loc[m, "t_lo"], p.loc[m, "t_hi"])
        col.update({
            "α, m ≥ 5 (ms per unique expert)": se_ci(a, a_se),
            "expert share of a pass, m ≥ 5": f"{big['share'].min():.2f}–{big['share'].max():.2f}",
            "context line: c0 (10⁻³ ms/token)": se_ci(ln["c0"], ln["c0_se"], 1e3) if ln else "–",
            "context line: c1 per unit of m (10⁻³ ms/token)": se_ci(ln["c1"], ln["c1_se"], 1e3) if ln else "–",
            "cost model R² (Eq. 4, in sample)": f"{cmp.models[label].extra['fit']['target']['r2']:.3f}",
            "Oracle speedup over plain decoding": iv.cell("speedup") if iv else "–",
            "best static K (share of refits agreeing)": (f"{iv.best_static_k} ({iv.best_static_k_share:.0%})"
                                                         if iv else "–"),
            "Oracle gain over the best static K": iv.cell("gain_over_best_static") if iv else "–",
            "Oracle against the measured sweep, largest |error|":
                (f"{rep.validation.max_abs_rel_error:.1%} (K = {rep.validation.worst_k})"
                 if rep is not None and rep.validation is not None else "–"),
        })
        cols[label] = col
    out = pd.DataFrame(cols)
    out.index.name = "quantity"
    return out.reset_index()


def transfer_table(cmp: "regime.MachineComparison") -> pd.DataFrame:
    """Per m: the first machine's cost model pricing each other machine's rounds, predicted / measured mean
    T_T (generation-clustered 95% interval) and the ratio left after one scale for every m."""
    out = None
    for label, t in cmp.transfer.groupby("machine", sort=False):
        cols = pd.DataFrame({
            "m": t["m"].to_numpy(),
            f"{label}: predicted / measured": ci_column(t, "ratio"),
            f"{label}: after one scale": t["ratio_rescaled"].round(3).to_numpy()})
        out = cols if out is None else out.merge(cols, on="m", how="outer")
    return out


def context_line_table(lines: dict[str, dict[str, float]]) -> pd.DataFrame:
    """One row per estimate: the weighted line c(m) = c0 + c1·m (:func:`speclimits.regime.slope_line`)
    with 95% intervals in 10⁻³ ms per context token, and the p-value of its residuals."""
    return pd.DataFrame([{"estimate": label, "c0 (10⁻³ ms/token)": se_ci(ln["c0"], ln["c0_se"], 1e3),
                          "c1 per unit of m (10⁻³ ms/token)": se_ci(ln["c1"], ln["c1_se"], 1e3),
                          "line: p of its residuals": f"{ln['p']:.2g}"} for label, ln in lines.items()])
