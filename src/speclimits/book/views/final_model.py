"""Reader tables of section 3 (:class:`speclimits.stats.FinalModelResults`) with the paper's values
(:mod:`speclimits.paper`) beside ours; ``*_full`` frames are the downloads.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from speclimits import paper
from speclimits.book.present import (NOT_IDENTIFIED, Result, ci_cells, finite, fmt_ci, fmt_fixed, fmt_p, half_cells,
                                     with_ci)
from speclimits.stats.m_split import as_headline

#: What a missing number reads as in the headline and regime tables.
MISSING = "—"

#: Decimals of each headline and split quantity, by its ``key`` (:func:`speclimits.stats.final.headline_table`,
#: :func:`speclimits.stats.m_split.split_rows`); a pair has one per number. Intervals take the estimate's.
_DECIMALS: dict[str, int | tuple[int, int]] = {
    "alpha_one": 3, "alpha_small": 3, "alpha_large": 3, "beta0_one": 2, "beta0_small": 2, "beta0_first_large": 2,
    "alpha_ratio": 2, "interp_within": 2, "across_boundary": 1,
    "c_per_k": 3, "c_joint": 4, "pooled_u_bar": 4, "pooled_context_len": 3, "pooled_K": 3, "pooled_const": 3,
    "r2_ladder": (3, 3), "cv_rmse_reduction": 4, "mape_ratio": 1, "pooled_mape_k5": 1,
    "pooled_mape_k1_k3": (1, 1), "loko_mean": 1, "loko_smooth": 1, "within_k_mape": 2, "categorical": (2, 3),
}
#: The paper's value of each headline and split quantity, by ``key``: its text, or its numbers (a split, a
#: value, an (estimate, SE) with the decimals to write them in, or a pair), written by :func:`_paper_cell`.
_PAPER: dict[str, Any] = {
    "boundary": paper.BOUNDARY_M, "alpha_one": "—", "beta0_one": "—",
    "alpha_small": paper.fmt_range(paper.ALPHA_SMALL), "alpha_large": paper.fmt_range(paper.ALPHA_LARGE),
    "beta0_small": paper.fmt_range(paper.BETA0_SMALL, digits=1), "beta0_first_large": f"{paper.BETA0_LARGE_START}",
    "alpha_ratio": f"≈{paper.ALPHA_LEVEL_RATIO}", "interp_within": paper.fmt_range(paper.INTERP_WITHIN, digits=2),
    "across_boundary": paper.fmt_range(paper.TRANSFER_ACROSS, digits=1),
    "c_per_k": paper.fmt_range(paper.C_RANGE, 1e3), "c_joint": "—",
    "pooled_u_bar": (*paper.POOLED["u_bar"], 4), "pooled_context_len": (*(v * 1e3 for v in paper.POOLED["context_len"]), 2),
    "pooled_K": (*paper.POOLED["K"], 3), "pooled_const": (*paper.POOLED["const"], 3),
    "r2_ladder": paper.POOLED_R2, "cv_rmse_reduction": paper.POOLED_DRMSE, "mape_ratio": paper.CATEGORICAL_MAPE_RATIO,
    "pooled_mape_k5": paper.fmt_range(paper.POOLED_MAPE_LARGE, digits=1),
    "pooled_mape_k1_k3": (paper.POOLED_MAPE_BY_K[1], paper.POOLED_MAPE_BY_K[3]), "loko_mean": paper.LOKO_MEAN,
    "loko_smooth": paper.fmt_range(paper.SMOOTH_PARAMETERIZATIONS_MAPE, digits=1),
    "within_k_mape": paper.fmt_range(paper.WITHIN_K_MAPE, digits=2),
    "categorical": " / ".join(paper.LADDER["categorical (Eq. 4)"]),
}
#: How the two numbers of a pair are joined.
_JOIN = {"r2_ladder": " → ", "pooled_mape_k1_k3": " / ", "categorical": " / "}
#: A unit after the number (and the paper's), and text after the interval cell.
_UNIT = {"mape_ratio": "×"}
_CI_SUFFIX = {"c_per_k": " (×1e-3)"}


def _num(x: Any, decimals: int) -> str:
    return fmt_fixed(x, decimals, MISSING)


def _bracket(lo: Any, hi: Any, decimals: int) -> str:
    """``[lo, hi]`` (the section's interval cells), empty without an interval."""
    return f"[{fmt_fixed(lo, decimals)}, {fmt_fixed(hi, decimals)}]" if finite(lo) and finite(hi) else ""


def headline_cells(row: Any) -> tuple[str, str, str]:
    """``(ours, interval, paper)`` text of one row of the headline (or regime) table, by its ``shape``."""
    key, shape = row["key"], row["shape"]
    dec = _DECIMALS.get(key, 3)
    d1, d2 = dec if isinstance(dec, tuple) else (dec, dec)
    unit, note = _UNIT.get(key, ""), row.get("note") if isinstance(row.get("note"), str) else None
    if shape == "split":
        ours, ci = ("none" if not finite(row["est"]) else str(int(row["est"]))), note or ""
    elif shape == "range":
        ours = MISSING if not finite(row["est"]) else f"{_num(row['est'], d1)}–{_num(row['est2'], d1)}"
        has_ci = any(finite(row.get(c)) for c in ("lo", "hi", "lo2", "hi2"))
        ci = note or (f"min {_bracket(row['lo'], row['hi'], d1)}; max {_bracket(row['lo2'], row['hi2'], d1)}"
                      + _CI_SUFFIX.get(key, "") if has_ci else "")
    elif shape == "value":
        ours = _num(row["est"], d1) + (unit if finite(row["est"]) else "")
        ci = note or _bracket(row["lo"], row["hi"], d1)
    elif shape == "se":
        ours = f"{_num(row['est'], d1)} ({_num(row['se'], d1)})"
        ci = f"SE by prompt {_num(row['se_prompt'], d1)}" if finite(row["se_prompt"]) else ""
    elif shape == "pair":
        join = _JOIN.get(key, " / ")
        ours = f"{_num(row['est'], d1)}{join}{_num(row['est2'], d2)}"
        ci = join.join(_bracket(row[lo], row[hi], d) if finite(row[est]) else MISSING
                       for est, lo, hi, d in (("est", "lo", "hi", d1), ("est2", "lo2", "hi2", d2)))
    elif shape == "reduction":
        ours = f"{_num(row['est'], d1)} ({_num(row['est2'], 1)}%)"
        ci = f"± {_num(row['half'], d1)}" + (f" ({note})" if note else "")
    else:
        raise ValueError(f"headline row {key!r}: unknown shape {shape!r}")
    return ours, ci, _paper_cell(key, shape, unit)


def _paper_cell(key: str, shape: str, unit: str) -> str:
    """The paper's cell of the quantity ``key`` (:data:`_PAPER`; none: "—")."""
    value = _PAPER.get(key)
    if value is None or isinstance(value, str):
        return value or MISSING
    if shape == "split":
        return f"{int(value)} (chosen by eye)"
    if shape == "se":
        est, se, d = value
        return f"{fmt_fixed(est, d)} ({fmt_fixed(se, d)})"
    if shape == "pair":
        return f"{float(value[0]):g}{_JOIN.get(key, ' / ')}{float(value[1]):g}"
    return f"≈{float(value):g}{unit}" if unit else f"{float(value):g}"


def _cells_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Quantity, split, ours, interval, paper: the text of :func:`headline_cells` for every row."""
    cells = [headline_cells(r) for r in frame.to_dict("records")]
    return pd.DataFrame({"Quantity": frame["quantity"].to_numpy(), "Split": frame["basis"].to_numpy(),
                         "Ours": [c[0] for c in cells], "95% interval": [c[1] for c in cells],
                         "Paper": [c[2] for c in cells]})


def per_k(res) -> pd.DataFrame:
    """Per-K OLS coefficients with their 95% intervals, and the out-of-fold error."""
    f = res.per_k.copy()
    f = with_ci(f, "alpha", "alpha_lower", "alpha_upper", "α (ms/expert)")
    f = with_ci(f, "beta0", "beta0_lower", "beta0_upper", "β₀ (ms)")
    f = with_ci(f, "c", "c_lower", "c_upper", "c (ms per 1k tokens)", scale=1e3)
    f["CV MAPE (%)"] = half_cells(f["cv_mape"], f["cv_mape_ci"])
    return f[["K", "n", "α (ms/expert)", "β₀ (ms)", "c (ms per 1k tokens)", "CV MAPE (%)"]].rename(
        columns={"n": "Rounds"})


def outer_folds(res) -> pd.DataFrame:
    """Nested CV: what the rule selects inside each outer training set, and the held-out error."""
    o = res.boundary.outer.copy()
    return pd.DataFrame({
        "Outer fold": o["fold"] + 1,
        "Rule selects": ["no split" if s is None or pd.isna(s) else f"m ≤ {int(s)} | m > {int(s)}" for s in o["selected"]],
        "Plain argmin (last small m)": o["argmin"].map(lambda v: "none" if v is None or pd.isna(v) else str(int(v))),
        "Held-out RMSE (ms)": o["test_rmse"],
        "Held-out MAPE (%)": o["test_mape"],
    })


def regimes(res) -> pd.DataFrame:
    """The rows that depend on the split in m, at the rule's split and at the paper's, written as the headline's."""
    return _cells_frame(as_headline(res.regimes))


def joint_by_m(res) -> pd.DataFrame:
    j = res.joint.by_m.copy()
    j = with_ci(j, "alpha", "alpha_lower", "alpha_upper", "α(m) (ms/expert)")
    j = with_ci(j, "beta0", "beta0_lower", "beta0_upper", "β₀(m) (ms)")
    return j[["m", "K", "n", "β₀(m) (ms)", "α(m) (ms/expert)"]].rename(columns={"n": "Rounds"})


_TERMS = {"const": "β₀ (ms)", "u_bar": "α per unique expert (ms)", "context_len": "c per context token (ms)",
          "K": "γ per draft token (ms)"}


def pooled(res) -> pd.DataFrame:
    p = res.pooled.to_frame().reset_index().rename(columns={"index": "term"})
    p["Term"] = p["term"].map(lambda t: _TERMS.get(t, t))
    p["Estimate [95% CI]"] = ci_cells(p["coef"], p["ci_lower"], p["ci_upper"])
    p["SE"] = p["se"]
    p["p-value"] = p["p"].map(fmt_p)
    return p[["Term", "Estimate [95% CI]", "SE", "p-value"]]


def comparison_full(res) -> pd.DataFrame:
    """The comparison of the three models (a row per ``model``) with the paper's ``paper_r2``, ``paper_cv_mape``."""
    c = res.comparison.reset_index()
    cat_mape, cat_r2 = (float(v) for v in paper.LADDER["categorical (Eq. 4)"])
    return c.assign(paper_r2=c["model"].map({"Ū + L": paper.POOLED_R2[0], "Ū + L + γK (pooled)": paper.POOLED_R2[1],
                                             "categorical (Eq. 4)": cat_r2}),
                    paper_cv_mape=c["model"].map({"Ū + L": float(paper.LADDER["Ū + L"][0]),
                                                  "categorical (Eq. 4)": cat_mape}))


def comparison(res) -> pd.DataFrame:
    c = comparison_full(res)
    out = pd.DataFrame({"Model": c["model"]})
    out["$R^2$"] = c["r2"]
    out["Paper $R^2$"] = c["paper_r2"]
    out["CV $R^2$"] = half_cells(c["cv_r2"], c["cv_r2_ci"])
    out["CV MAPE (%)"] = half_cells(c["cv_mape"], c["cv_mape_ci"])
    out["Paper CV MAPE (%)"] = c["paper_cv_mape"]
    return out


def standardized(res) -> pd.DataFrame:
    s = res.pooled_std.reset_index()
    return pd.DataFrame({"Term": s.iloc[:, 0].map(lambda t: _TERMS.get(t, t).split(" (")[0]),
                         "Standardized β (ours)": s["beta_std"], "Paper": s.iloc[:, 0].map(paper.POOLED_STD)})


def cluster_se(res) -> pd.DataFrame:
    c = res.cluster_se
    return pd.DataFrame({"Model": c["model"], "Term": c["term"].map(lambda t: _TERMS.get(t, t).split(" (")[0]),
                         "Coefficient": c["coef"], "SE by generation": c["se_generation"],
                         "SE by prompt": c["se_prompt"], "Ratio": c["ratio"]})


def mape_by_k_full(res) -> pd.DataFrame:
    """MAPE by K with the leave-one-K-out columns where the trace gives them and the paper's
    ``paper_pooled``, ``paper_loko`` (the table's download)."""
    m = res.mape_by_k.assign(paper_pooled=res.mape_by_k["K"].map(paper.POOLED_MAPE_BY_K))
    return m.merge(res.loko.assign(paper_loko=res.loko["K"].map(paper.LOKO_PEAKS)), on="K") if res.loko is not None else m


def mape_by_k(res) -> pd.DataFrame:
    """MAPE by K of the pooled and categorical models, and leave-one-K-out where the trace gives it."""
    m = mape_by_k_full(res)
    out = pd.DataFrame({"K": m["K"]})
    out["Pooled CV MAPE (%)"] = ci_cells(m["pooled"], m["pooled_lo"], m["pooled_hi"])
    out["Paper pooled (%)"] = m["paper_pooled"]
    out["Categorical (%)"] = ci_cells(m["categorical"], m["categorical_lo"], m["categorical_hi"])
    if res.loko is not None:
        out["Leave-K-out (%)"] = ci_cells(m["loko_mape"], m["loko_lo"], m["loko_hi"])
        out["Paper leave-K-out (%)"] = m["paper_loko"]
    return out


def smooth(res) -> pd.DataFrame:
    s = res.smooth.reset_index()
    return pd.DataFrame({
        "Form of β₀(m), α(m)": s["form"],
        "Leave-K-out MAPE, mean (%)": ci_cells(s["loko_mape_mean"], s["loko_mape_mean_lo"], s["loko_mape_mean_hi"]),
        "Worst K": s["worst_k"], "MAPE at worst K (%)": s["loko_mape_max"]})


def interpolation(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"K": frame["K"], "Scheme": frame["scheme"], "Relation": frame["relation"],
                         "From": frame["sources"], "MAPE (%)": frame["mape"]})


def ladder_full(res) -> pd.DataFrame:
    """The specification ladder (a row per ``spec``) with the paper's ``paper_cv_mape``, ``paper_r2``."""
    l = res.ladder.reset_index()
    return l.assign(paper_cv_mape=[paper.LADDER[s][0] for s in l["spec"]],
                    paper_r2=[paper.LADDER[s][1] for s in l["spec"]])


def ladder(res) -> pd.DataFrame:
    l = ladder_full(res)
    return pd.DataFrame({
        "Specification": l["spec"],
        "$R^2$ [95% CI]": ci_cells(l["r2"], l["r2_lo"], l["r2_hi"]),
        "Paper $R^2$": l["paper_r2"],
        "CV MAPE (%) [95% CI]": ci_cells(l["cv_mape"], l["cv_mape_lo"], l["cv_mape_hi"]),
        "Paper CV MAPE (%)": l["paper_cv_mape"],
    })


def headline(res) -> pd.DataFrame:
    """:meth:`FinalModelResults.headline` (numbers) as the section's table: one text cell each for
    ours, its interval (or what stands in for one) and the paper's value."""
    return _cells_frame(res.headline().reset_index())


def cost_model_by_m(cost) -> pd.DataFrame:
    """The table the Oracle reads: per m, β₀(m), α(m) and the draft time of K = m − 1 drafted tokens."""
    ms = sorted(cost.beta0)
    beta0, alpha = cost.coefficients_by_m(max(ms))
    return pd.DataFrame({"m": ms, "K = m − 1": [m - 1 for m in ms], "β₀(m) (ms)": [beta0[m] for m in ms],
                         "α(m) (ms/expert)": [alpha[m] for m in ms],
                         "Draft time (ms)": [float(cost.draft_ms(m - 1)) for m in ms]})


def joint_c_cell(res) -> str:
    """The joint model's shared context coefficient in ms per 1000 tokens, with its 95% interval."""
    ci = res.joint.conf_int().loc["c"]
    return fmt_ci(res.joint.c * 1e3, ci.iloc[0] * 1e3, ci.iloc[1] * 1e3)


def key_results(res) -> list:
    """The section's headline numbers beside the paper's (the key-results box)."""
    p_mape, p_r2 = paper.LADDER["categorical (Eq. 4)"]
    boundary_paper = f"m ≤ {paper.BOUNDARY_M} | m ≥ {paper.BOUNDARY_M + 1} (by eye)"
    rows = []
    if res.ladder is not None:
        lad = res.ladder.loc["categorical (Eq. 4)"]
        rows += [
            Result.of("Categorical model (Eq. 4), CV MAPE", lad["cv_mape"], lad["cv_mape_lo"], lad["cv_mape_hi"],
                      paper=f"{p_mape} %", unit="%", ref="tbl-final-ladder"),
            Result.of("Categorical model, $R^2$", lad["r2"], lad["r2_lo"], lad["r2_hi"], paper=p_r2,
                      ref="tbl-final-ladder")]
    else:
        rows += [Result("Categorical model (Eq. 4), CV MAPE", NOT_IDENTIFIED, f"{p_mape} %"),
                 Result("Categorical model, $R^2$", NOT_IDENTIFIED, str(p_r2))]
    if res.boundary is not None:
        split = res.boundary.rule_split
        rows.append(Result("Regime boundary (rule, nested CV)",
                           "no split" if split is None else f"m ≤ {split} | m > {split}", boundary_paper,
                           "fig-final-boundary"))
    else:
        rows.append(Result("Regime boundary (rule, nested CV)", NOT_IDENTIFIED, boundary_paper))
    if res.pooled is not None:
        gamma = res.pooled.to_frame().loc["K"]
        rows.append(Result.of("Pooled γ per draft token (ms)", gamma["coef"], gamma["ci_lower"], gamma["ci_upper"],
                              paper=paper.POOLED["K"][0], ref="tbl-final-pooled"))
    else:
        rows.append(Result.of("Pooled γ per draft token (ms)", NOT_IDENTIFIED, paper=paper.POOLED["K"][0]))
    reg = res.regimes
    ratio = reg[(reg["key"] == "alpha_ratio") & reg["basis"].str.startswith("paper")] if reg is not None else []
    if len(ratio):
        ours, ci, _ = headline_cells(as_headline(ratio).iloc[0])
        rows.append(Result("α level ratio, large over small regime (paper split)",
                           f"{ours} {ci.replace(', ', '; ')}".strip(), f"≈{paper.ALPHA_LEVEL_RATIO:g}",
                           "tbl-final-regimes"))
    return rows
