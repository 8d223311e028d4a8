"""Charts of the linguistic section: decision panels, k* by context, routing contrasts, label agreement."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from speclimits.figures._common import HEIGHT, WIDTH, tips

__all__ = ["decision_panels", "k_by_context_chart", "k_star_distribution_chart", "routing_contrast_chart",
           "label_confusion_chart"]

STATUS_COLORS = {"match": "#4c9a5a", "first mismatch": "#d1495b", "after mismatch": "#b8b8b8"}


def decision_panels(panels: pd.DataFrame, width: int = WIDTH, row_height: int = 22) -> alt.FacetChart:
    """One panel per decision (:func:`speclimits.linguistic.gallery.panel_data`): target continuation above,
    draft below, cells coloured by status and faded past k*; a solid line after k*, a dashed one after the
    modal advancement a_mode, and (α = 0 panels) a dotted orange one after the α = 0 re-solve's k*."""
    df = panels.copy()
    df["x0"] = df["step"] - 0.5
    df["x1"] = df["step"] + 0.5
    df["k_line"] = df["k_star"] + 0.5
    df["a_line"] = df["a_mode"] + 0.5
    df["k0_line"] = pd.to_numeric(df["k_star_alpha0"], errors="coerce") + 0.5
    df["past"] = np.where(df["past_kstar"], "past k*", "within k*")
    n = int(df["step"].max()) if len(df) else 1
    xscale = alt.Scale(domain=[0.5, n + 0.5], nice=False)
    base = alt.Chart()
    cells = base.mark_rect(stroke="white", strokeWidth=1).encode(
        x=alt.X("x0:Q", scale=xscale, title="continuation step i", axis=alt.Axis(values=list(range(1, n + 1)))),
        x2="x1:Q",
        y=alt.Y("row:N", sort=["target", "draft"], title=None),
        color=alt.Color("status:N", scale=alt.Scale(domain=list(STATUS_COLORS), range=list(STATUS_COLORS.values())),
                        title="draft vs target"),
        opacity=alt.Opacity("past:N", scale=alt.Scale(domain=["within k*", "past k*"], range=[0.95, 0.3]),
                            title="chosen boundary"),
        tooltip=["row", "step", alt.Tooltip("raw_text:N", title="token"), "status", "past_kstar",
                 alt.Tooltip("match_prob:Q", format=".3f", title="q (match prob.)"),
                 alt.Tooltip("p_reach:Q", format=".3f", title="P(a ≥ i)"), "k_star", "a_mode", "label"],
    )
    text = base.mark_text(fontSize=10, font="monospace").encode(
        x=alt.X("step:Q", scale=xscale), y=alt.Y("row:N", sort=["target", "draft"]), text="text:N")
    # distinct output names: Vega-Lite may merge aggregates that differ only in their input field
    k_rule = base.transform_aggregate(k_x="max(k_line)", groupby=["panel"]).mark_rule(
        color="black", strokeWidth=2.5).encode(x=alt.X("k_x:Q", scale=xscale))
    a_rule = base.transform_aggregate(a_x="max(a_line)", groupby=["panel"]).mark_rule(
        color="#1f4e99", strokeWidth=2, strokeDash=[5, 3]).encode(x=alt.X("a_x:Q", scale=xscale))
    layers = [cells, text, k_rule, a_rule]
    if df["k0_line"].notna().any():
        layers.append(base.transform_filter("isValid(datum.k0_line)").transform_aggregate(
            k0_x="max(k0_line)", groupby=["panel"]).mark_rule(color="#e08214", strokeWidth=2, strokeDash=[2, 2]).encode(
            x=alt.X("k0_x:Q", scale=xscale)))
    order = list(dict.fromkeys(df.sort_values("order")["panel"]))
    return alt.layer(*layers, data=df).properties(width=width, height=2 * row_height).facet(
        row=alt.Row("panel:N", sort=order, title=None,
                    header=alt.Header(labelAngle=0, labelAlign="left", labelAnchor="start", labelOrient="top",
                                      labelFontSize=11)),
        spacing=6,
    )


def k_by_context_chart(table: pd.DataFrame, measure: str = "long") -> alt.LayerChart:
    """Share of k* >= 4 (``measure="long"``) or of k* = 1 (``"k1"``) per context with 95% CIs
    (from :func:`speclimits.linguistic.k_by_context`); the paper's values as open diamonds."""
    est, lo, hi = ("share_long", "long_lo", "long_hi") if measure == "long" else ("share_k1", "k1_lo", "k1_hi")
    title = f"share of decisions with k* {'≥ ' + str(table.attrs.get('k_long', 4)) if measure == 'long' else '= 1'}"
    df = table.copy()
    df["label"] = df["context"] + " (" + df["n_decisions"].astype(str) + "/" + df["n_responses"].astype(str) + ")"
    order = list(df["label"])
    y = alt.Y("label:N", sort=order, title="context (decisions/responses)")
    base = alt.Chart(df)
    bars = base.mark_rule(strokeWidth=2).encode(y=y, x=alt.X(f"{lo}:Q", scale=alt.Scale(domain=[0, 1]), title=title),
                                               x2=f"{hi}:Q")
    pts = base.mark_point(filled=True, size=60, color="black").encode(
        y=y, x=f"{est}:Q", tooltip=["context", "n_decisions", "n_responses", *tips(est, lo, hi)])
    layers = [bars, pts]
    paper_col = f"paper_{est}"
    if paper_col in df.columns and df[paper_col].notna().any():
        layers.append(base.transform_filter(f"isValid(datum.{paper_col})").mark_point(
            shape="diamond", size=90, color="#d1495b", filled=False, strokeWidth=2).encode(
            y=y, x=f"{paper_col}:Q", tooltip=["context", alt.Tooltip(f"{paper_col}:Q", title="paper")]))
    return alt.layer(*layers).properties(width=WIDTH, height=max(HEIGHT // 2, 26 * len(df)))


def k_star_distribution_chart(shares: pd.DataFrame, contexts: list[str] | None = None) -> alt.Chart:
    """Stacked share of each k* per context (from :func:`speclimits.linguistic.k_star_shares`)."""
    df = shares if contexts is None else shares[shares["context"].isin(contexts)]
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("context:N", sort=contexts, title=None),
        x=alt.X("share:Q", stack="normalize", title="share of decisions"),
        color=alt.Color("k_star:O", scale=alt.Scale(scheme="viridis"), title="k*"),
        order=alt.Order("k_star:Q"),
        tooltip=["context", "k_star", "n", *tips("share")],
    ).properties(width=WIDTH, height=max(HEIGHT // 2, 24 * df["context"].nunique()))


def routing_contrast_chart(table: pd.DataFrame) -> alt.LayerChart:
    """Difference in new experts per layer (event step − preceding step) with 95% CIs, ours (the
    step-adjusted window contrast a row of its own) and the paper's (:func:`speclimits.linguistic.routing_table`)."""
    rows = []
    for r in table.itertuples(index=False):
        rows.append({"contrast": r.contrast, "source": "this trace", "diff": r.diff, "lo": r.diff_lo,
                     "hi": r.diff_hi, "n": f"{r.n_events} events / {r.n_responses} responses"})
        if pd.notna(getattr(r, "adjusted", np.nan)):
            rows.append({"contrast": f"{r.contrast} (step-adjusted)", "source": "this trace", "diff": r.adjusted,
                         "lo": r.adjusted_lo, "hi": r.adjusted_hi, "n": f"{r.n_events} events"})
        rows.append({"contrast": r.contrast, "source": "paper", "diff": r.paper_diff, "lo": r.paper_diff_lo,
                     "hi": r.paper_diff_hi, "n": ""})
    df = pd.DataFrame(rows)
    order = list(dict.fromkeys(df["contrast"]))
    y = alt.Y("contrast:N", sort=order, title=None)
    yoff = alt.YOffset("source:N")
    color = alt.Color("source:N", scale=alt.Scale(domain=["this trace", "paper"], range=["black", "#d1495b"]))
    base = alt.Chart(df)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#888", strokeDash=[3, 3]).encode(x="x:Q")
    bars = base.mark_rule(strokeWidth=2).encode(y=y, yOffset=yoff, x=alt.X(
        "lo:Q", title="Δ new experts per layer (event − preceding step)"), x2="hi:Q", color=color)
    pts = base.mark_point(filled=True, size=60).encode(
        y=y, yOffset=yoff, x="diff:Q", color=color,
        tooltip=["contrast", "source", *tips("diff", "lo", "hi", fmt="+.3f"), "n"])
    return alt.layer(zero, bars, pts).properties(width=WIDTH, height=max(HEIGHT // 2, 40 * len(order)))


def label_confusion_chart(confusion: pd.DataFrame) -> alt.Chart:
    """Heat map of planted (rows) against rule-based (columns) labels, as shares of each planted
    context (from :attr:`LabelAgreement.confusion`)."""
    m = confusion.to_numpy(dtype=float)
    share = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    df = pd.DataFrame([{"planted": r, "labelled": c, "share": share[i, j], "n": int(m[i, j])}
                       for i, r in enumerate(confusion.index) for j, c in enumerate(confusion.columns)])
    order = list(confusion.index)
    base = alt.Chart(df).encode(x=alt.X("labelled:N", sort=order, title="rule-based label"),
                                y=alt.Y("planted:N", sort=order, title="planted context"))
    heat = base.mark_rect().encode(color=alt.Color("share:Q", scale=alt.Scale(scheme="blues", domain=[0, 1])),
                                   tooltip=["planted", "labelled", "n", *tips("share")])
    txt = base.mark_text(fontSize=9).encode(text=alt.Text("share:Q", format=".2f"),
                                            color=alt.condition("datum.share > 0.5", alt.value("white"),
                                                                alt.value("black")))
    return (heat + txt).properties(width=WIDTH - 160, height=WIDTH - 200)
