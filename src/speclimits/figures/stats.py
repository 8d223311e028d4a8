"""Charts of the cost-model sections, from the small aggregated tables of :mod:`speclimits.stats` results."""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.figures._common import HEIGHT, WIDTH, tips

__all__ = ["factor_cv_chart", "standardized_by_k_chart", "factor_corr_chart", "coefficients_by_m_chart",
           "boundary_chart", "mape_by_k_chart", "ladder_chart", "draft_line_chart", "robustness_chart",
           "binned_residuals_chart", "bootstrap_chart"]

TERM_LABELS = {"u_bar": "Ū (unique experts)", "context_len": "L (context)"}


def _errorbars(df: pd.DataFrame, x: str, y: str, lo: str, hi: str, **enc: Any) -> alt.LayerChart:
    base = alt.Chart(df)
    pts = base.mark_point(filled=True, size=50).encode(x=x, y=y, **enc)
    bars = base.mark_rule().encode(x=x, y=alt.Y(lo), y2=hi, **enc)
    return bars + pts


def factor_cv_chart(res: Any) -> alt.HConcatChart:
    """Table A2 as two panels: standalone CV R² and the paired RMSE reduction over Ū, 95% t-intervals."""
    t = res.table.reset_index()
    t = t.assign(r2_lo=t["r2"] - t["r2_ci"], r2_hi=t["r2"] + t["r2_ci"],
                 d_lo=t["drmse"] - t["drmse_ci"], d_hi=t["drmse"] + t["drmse_ci"])
    order = list(t["label"])
    y = alt.Y("label:N", sort=order, title=None)
    left = alt.Chart(t).mark_bar(opacity=0.6).encode(
        y=y, x=alt.X("r2:Q", title="out-of-sample R² alone"), tooltip=["label", "r2", "r2_ci"])
    left += alt.Chart(t).mark_rule().encode(y=y, x="r2_lo:Q", x2="r2_hi:Q")
    d = t.dropna(subset=["drmse"])
    right = alt.Chart(d).mark_bar(opacity=0.6, color="#d62728").encode(
        y=alt.Y("label:N", sort=order, title=None),
        x=alt.X("drmse:Q", title="RMSE reduction of Ū + factor over Ū (ms)"), tooltip=["label", "drmse", "drmse_ci"])
    right += alt.Chart(d).mark_rule().encode(y=alt.Y("label:N", sort=order), x="d_lo:Q", x2="d_hi:Q")
    return alt.hconcat(left.properties(width=WIDTH // 2, height=HEIGHT // 1.5),
                       right.properties(width=WIDTH // 2, height=HEIGHT // 1.5))


def standardized_by_k_chart(res: Any) -> alt.LayerChart:
    """β* of T_T on Ū and on L within each K with 95% CIs (H3); the paper's endpoints as open squares."""
    df = res.by_k.assign(term_label=res.by_k["term"].map(TERM_LABELS), paper=[
        paper.STANDARDIZED_BY_K.get(k, (np.nan, np.nan))[t != "u_bar"] for k, t in zip(res.by_k["K"], res.by_k["term"])])
    color = alt.Color("term_label:N", title="standardized association with")
    line = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("K:O"), y=alt.Y("beta_std:Q", title="β* (σ of T_T per σ of the factor)"), color=color,
        tooltip=["K", "term", *tips("beta_std", "lower", "upper")])
    band = alt.Chart(df).mark_rule().encode(x="K:O", y="lower:Q", y2="upper:Q", color=color)
    pap = alt.Chart(df.dropna(subset=["paper"])).mark_point(shape="square", size=90, filled=False).encode(
        x="K:O", y="paper:Q", color=color, tooltip=["K", "term", "paper"])
    return (band + line + pap).properties(width=WIDTH, height=HEIGHT)


def factor_corr_chart(res: Any) -> alt.LayerChart:
    """Heat map of the Pearson correlations among the factors and T_T."""
    c = res.corr.rename_axis("a").reset_index().melt(id_vars="a", var_name="b", value_name="r")
    order = list(res.corr.index)
    base = alt.Chart(c).encode(x=alt.X("a:N", sort=order, title=None), y=alt.Y("b:N", sort=order, title=None))
    heat = base.mark_rect().encode(color=alt.Color("r:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1]),
                                                   title="corr"))
    text = base.mark_text(fontSize=10).encode(text=alt.Text("r:Q", format=".2f"))
    return (heat + text).properties(width=HEIGHT * 1.3, height=HEIGHT * 1.3)


def _split_rules(res: Any) -> alt.Chart:
    """Vertical rules between the regimes: the paper's split (dotted, grey) and the rule's (dashed, red)."""
    rows = [{"x": paper.BOUNDARY_M + 0.5, "split": f"paper: m ≤ {paper.BOUNDARY_M} | m ≥ {paper.BOUNDARY_M + 1}"}]
    if res.boundary is not None and res.boundary.split is not None:  # None: the trace gives no boundary
        rows.append({"x": res.boundary.split + 0.5, "split": f"rule: m ≤ {res.boundary.split}"})
    return alt.Chart(pd.DataFrame(rows)).mark_rule(strokeDash=[4, 4]).encode(
        x="x:Q", color=alt.Color("split:N", title="regime split",
                                 scale=alt.Scale(range=["gray", "#d62728"])), tooltip=["split"])


def coefficients_by_m_chart(res: Any, truth: Any = None) -> alt.HConcatChart:
    """α(m) and β0(m) of the per-K fits with 95% clustered CIs; dashed rules at the paper's split and
    at the rule's (when it declares one); the planted truth (a CostModel) as crosses when given."""
    pk = res.per_k
    panels = []
    for name, title in (("alpha", "α(m), ms per unique expert"), ("beta0", "β0(m), ms")):
        df = pk[["m", "K", name, f"{name}_lower", f"{name}_upper"]].rename(
            columns={name: "est", f"{name}_lower": "lo", f"{name}_upper": "hi"})
        chart = _errorbars(df, alt.X("m:Q", title="m = K + 1", axis=alt.Axis(tickMinStep=1)),
                           alt.Y("est:Q", title=title, scale=alt.Scale(zero=False)), "lo:Q", "hi:Q")
        if truth is not None:
            tv = getattr(truth, name)
            tdf = pd.DataFrame({"m": [m for m in pk["m"] if m in tv], "truth": [tv[m] for m in pk["m"] if m in tv]})
            chart += alt.Chart(tdf).mark_point(shape="cross", size=80, color="#d62728").encode(
                x="m:Q", y="truth:Q", tooltip=["m", "truth"])
        chart += _split_rules(res)
        panels.append(chart.properties(width=WIDTH // 2, height=HEIGHT))
    return alt.hconcat(*panels)


def boundary_chart(res: Any) -> alt.LayerChart:
    """Mean fold RMSE (GroupKFold) ± 1 SE of each candidate regime split (last m of the lower regime; 'none':
    one regime); the grey band is the one-SE rule's tolerance around no split's mean."""
    c = res.boundary.curve.copy()
    c["candidate"] = ["none" if pd.isna(s) else f"m ≤ {int(s)}" for s in c["split"]]
    c["lo"] = c["fold_rmse_mean"] - c["fold_rmse_se"]
    c["hi"] = c["fold_rmse_mean"] + c["fold_rmse_se"]
    chosen = "none" if res.boundary.split is None else f"m ≤ {res.boundary.split}"
    c["reported"] = np.where(c["candidate"] == chosen, "reported", "candidate")
    x = alt.X("candidate:N", sort=list(c["candidate"]), title="candidate split")
    y_title = "mean fold RMSE (ms), ± 1 SE"
    bars = alt.Chart(c).mark_rule().encode(x=x, y=alt.Y("lo:Q", title=y_title, scale=alt.Scale(zero=False)), y2="hi:Q")
    pts = alt.Chart(c).mark_point(filled=True, size=60).encode(
        x=x, y="fold_rmse_mean:Q", color=alt.Color("reported:N", title=None,
                                                   scale=alt.Scale(domain=["candidate", "reported"],
                                                                   range=["#4c78a8", "#d62728"])),
        tooltip=["candidate", *tips("fold_rmse_mean", "fold_rmse_se", "cv_rmse", fmt=".5f")])
    none = c[c["candidate"] == "none"].iloc[0]
    band = alt.Chart(pd.DataFrame({"lo": [none["lo"]], "hi": [none["hi"]]})).mark_rect(
        opacity=0.15, color="gray").encode(y="lo:Q", y2="hi:Q")
    return (band + bars + pts).properties(width=WIDTH, height=HEIGHT)


def mape_by_k_chart(res: Any) -> alt.LayerChart:
    """MAPE by K (log scale) with 95% cluster-bootstrap intervals: pooled and categorical models (out of
    fold) and the pooled form fitted without that K (where the trace gives it)."""
    parts = [(res.mape_by_k, "pooled", "pooled", "pooled Ū + L + γK (CV)"),  # (table, estimate, interval, model)
             (res.mape_by_k, "categorical", "categorical", "categorical Eq. 4 (CV)"),
             (res.loko, "loko_mape", "loko", "pooled, leave-one-K-out")]
    df = pd.concat([pd.DataFrame({"K": t["K"], "mape": t[est], "lo": t[f"{ci}_lo"], "hi": t[f"{ci}_hi"], "model": model})
                    for t, est, ci, model in parts if t is not None], ignore_index=True)
    color = alt.Color("model:N", title=None)
    line = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("K:O"), y=alt.Y("mape:Q", title="MAPE (%)", scale=alt.Scale(type="log")), color=color,
        tooltip=["K", "model", *tips("mape", "lo", "hi")])
    bars = alt.Chart(df).mark_rule().encode(x="K:O", y="lo:Q", y2="hi:Q", color=color)
    return (bars + line).properties(width=WIDTH, height=HEIGHT)


def ladder_chart(res: Any) -> alt.LayerChart:
    """CV MAPE of each rung of the specification ladder with its 95% cluster-bootstrap interval (log scale)."""
    d = res.ladder.reset_index()
    d = d.assign(lo=d["cv_mape_lo"].clip(lower=1e-3), hi=d["cv_mape_hi"])
    y = alt.Y("spec:N", sort=list(d["spec"]), title=None)
    pts = alt.Chart(d).mark_point(filled=True, size=60).encode(
        y=y, x=alt.X("cv_mape:Q", title="GroupKFold MAPE (%)", scale=alt.Scale(type="log")),
        tooltip=["spec", *tips("cv_mape"), *tips("r2", fmt=".4f")])
    bars = alt.Chart(d).mark_rule().encode(y=y, x="lo:Q", x2="hi:Q")
    return (bars + pts).properties(width=WIDTH, height=HEIGHT // 1.5)


def draft_line_chart(res: Any) -> alt.LayerChart:
    """Mean T_D by K (points) against the fitted line a·K + b."""
    d = res.by_k
    pts = alt.Chart(d).mark_point(filled=True, size=60).encode(
        x=alt.X("K:Q", title="K (draft steps)"), y=alt.Y("mean_t_draft_ms:Q", title="mean T_D (ms)"),
        tooltip=["K", "n", *tips("mean_t_draft_ms", fmt=".4f"), *tips("dev_pct", fmt=".2f")])
    line = alt.Chart(d).mark_line(color="#d62728").encode(x="K:Q", y="line_ms:Q")
    return (line + pts).properties(width=WIDTH, height=HEIGHT)


def robustness_chart(res: Any, param: str = "alpha") -> alt.LayerChart:
    """Estimate and 95% interval of ``alpha`` (or ``c``) under every robustness check; the paper's
    range as a grey band."""
    e = res.estimates.copy()
    e["check"] = e["method"] + ": " + e["variant"]
    e = e.rename(columns={param: "est", f"{param}_lower": "lo", f"{param}_upper": "hi"})
    y = alt.Y("check:N", sort=list(e["check"]), title=None)
    rng = paper.ROBUST_ALPHA if param == "alpha" else paper.ROBUST_C
    band = alt.Chart(pd.DataFrame({"lo": [rng[0]], "hi": [rng[1]]})).mark_rect(opacity=0.2, color="gray").encode(
        x="lo:Q", x2="hi:Q")
    bars = alt.Chart(e).mark_rule().encode(y=y, x="lo:Q", x2="hi:Q")
    pts = alt.Chart(e).mark_point(filled=True).encode(
        y=y, x=alt.X("est:Q", title=("α, ms per unique expert" if param == "alpha" else "c, ms per token"),
                     scale=alt.Scale(zero=False)),
        tooltip=["check", *tips("est", "lo", "hi", fmt=".6g")])
    return (band + bars + pts).properties(width=WIDTH // 1.4, height=max(HEIGHT, 14 * len(e)))


def binned_residuals_chart(res: Any) -> alt.FacetChart:
    """Mean residual (± 2 SE clustered by generation) by decile of context length, KV usage and
    position in the generation."""
    b = res.bins.assign(lo=res.bins["mean_resid"] - 2 * res.bins["se"], hi=res.bins["mean_resid"] + 2 * res.bins["se"])
    base = alt.Chart()  # data comes from the facet, so each panel gets its own variable's bins
    layer = (base.mark_rule().encode(x=alt.X("center:Q", title="bin mean"), y="lo:Q", y2="hi:Q")
             + base.mark_line(point=True).encode(x="center:Q", y=alt.Y("mean_resid:Q", title="mean residual (ms)"),
                                                 tooltip=["variable", "center", "mean_resid", "se", "n"])
             + alt.Chart().mark_rule(color="gray", strokeDash=[3, 3]).encode(y=alt.datum(0)))
    return layer.properties(width=WIDTH // 3, height=HEIGHT // 1.3).facet(
        column=alt.Column("variable:N", title=None), data=b).resolve_scale(x="independent")


def bootstrap_chart(res: Any, param: str = "u_bar", bins: int = 40) -> alt.Chart:
    """Histogram of the cluster-bootstrap estimates of one coefficient (pre-binned); failed replicates (NaN)
    are left out and counted in the axis title."""
    v = res.boot[param].to_numpy(dtype=float)
    ok = np.isfinite(v)
    title = {"u_bar": "α (bootstrap)", "context_len": "c (bootstrap)", "const": "β0 (bootstrap)"}.get(param, param)
    if not ok.all():
        title += f" ({int((~ok).sum())} of {len(v)} resamples failed, left out)"
    if not ok.any():
        return alt.Chart(pd.DataFrame({"text": [f"no bootstrap resample could be fitted ({len(v)} tried)"]})).mark_text(
            size=14).encode(text="text:N").properties(width=WIDTH, height=HEIGHT // 1.3)
    counts, edges = np.histogram(v[ok], bins=bins)
    h = pd.DataFrame({"left": edges[:-1], "right": edges[1:], "count": counts})
    return alt.Chart(h).mark_bar().encode(
        x=alt.X("left:Q", bin="binned", title=title), x2="right:Q", y=alt.Y("count:Q", title="resamples"),
    ).properties(width=WIDTH, height=HEIGHT // 1.3)
