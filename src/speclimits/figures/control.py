"""Charts of the online-control section (section 8): the share of the Oracle's gain each policy
captures, offline and in the engine, and the k a policy chose along one reference against k*."""

from __future__ import annotations

from typing import Mapping

import altair as alt
import pandas as pd

from speclimits.figures._common import HEIGHT, WIDTH, tips


def share_captured_by_batch(frames: Mapping[int, pd.DataFrame]) -> alt.VConcatChart:
    """Share of the exact-greedy Oracle's gain over the best static K captured per policy, offline and in the
    engine: a faceted chart per batch size (``{b: rows}`` of :func:`speclimits.book.views.control_runs.share_long`),
    stacked with one x scale (one chart of all batches would draw every batch's points in every panel)."""
    def panel(long: pd.DataFrame) -> alt.FacetChart:
        # every layer inherits the facet's data (a layer with data of its own would repeat in every panel)
        base = alt.Chart().encode(y=alt.Y("policy:N", title=None), color=alt.Color("where:N", title=None),
                                  yOffset="where:N")
        pts = base.mark_point(filled=True, size=60).encode(
            x=alt.X("share:Q", title="share of the exact Oracle's gain over the best static K"),
            tooltip=["policy", "where", *tips("share", "lo", "hi")])
        err = base.mark_rule().encode(x="lo:Q", x2="hi:Q")
        zero, whole = (alt.Chart().mark_rule(strokeDash=[4, 3], color="gray").encode(x=alt.datum(v)) for v in (0.0, 1.0))
        return alt.layer(zero, whole, err, pts, data=long).properties(width=WIDTH, height=HEIGHT * 0.8).facet(
            row=alt.Row("batch:O", title="batch size"))

    return (alt.vconcat(*[panel(frame) for frame in frames.values()])
            .resolve_scale(x="shared").configure_legend(orient="bottom"))


def k_along_reference(frame: pd.DataFrame, policies: list[str]) -> alt.Chart:
    """The k each policy chose at the states its replayed walk visited, beside the Oracles' k*
    (``frame``: :func:`speclimits.control.offline.k_chosen_along`)."""
    cols = ["k_star_exact", "k_star_surrogate", *policies]
    long = frame.melt(id_vars="pos", value_vars=cols, var_name="who", value_name="k").dropna()
    return alt.Chart(long).mark_line(point=True, strokeWidth=1).encode(
        x=alt.X("pos:Q", title="state n along the reference (tokens emitted)"),
        y=alt.Y("k:Q", title="k (draft length)"), color=alt.Color("who:N", title=None),
        tooltip=["who", "pos", "k"]).properties(width=WIDTH, height=HEIGHT)


def served_speed(long: pd.DataFrame) -> alt.FacetChart:
    """The controller's speed under served load against the best stock K and plain decoding, per metric (95%
    interval over repeats), against the request rate (``long``: :func:`speclimits.book.views.control.serve_long`)."""
    base = alt.Chart().encode(x=alt.X("rate:Q", title="request rate (req/s, Poisson)", scale=alt.Scale(type="log")),
                              color=alt.Color("against:N", title="against"))
    line = base.mark_line(point=True).encode(
        y=alt.Y("speed:Q", title="speed ratio (> 1: the controller is faster)", scale=alt.Scale(zero=False)),
        tooltip=["rate", "against", "reference", *tips("speed", "lo", "hi"), *tips("concurrency", fmt=".1f")])
    err = base.mark_rule().encode(y="lo:Q", y2="hi:Q")
    one = alt.Chart().mark_rule(strokeDash=[4, 3], color="gray").encode(y=alt.datum(1.0))
    return alt.layer(one, err, line, data=long).properties(width=WIDTH * 0.45, height=HEIGHT * 0.8).facet(
        column=alt.Column("metric:N", title=None)).configure_legend(orient="bottom")


def prediction_bias(bias: pd.DataFrame) -> alt.FacetChart:
    """Per draft step, the mean predicted match probability minus the observed match rate of each model (rows of
    :func:`speclimits.book.views.control.acceptance_scores`), one panel per set of references: below zero, the
    model expects fewer matches than there are (a rule reading it stops early)."""
    base = alt.Chart().encode(x=alt.X("position:O", title="draft step j"), color=alt.Color("model:N", title=None))
    line = base.mark_line(point=True).encode(
        y=alt.Y("bias:Q", title="mean predicted − observed match rate"),
        tooltip=["set", "model", "position", alt.Tooltip("bias:Q", format="+.3f"), "n"])
    zero = alt.Chart().mark_rule(strokeDash=[4, 3], color="gray").encode(y=alt.datum(0.0))
    return alt.layer(zero, line, data=bias).properties(width=WIDTH * 0.45, height=HEIGHT * 0.8).facet(
        column=alt.Column("set:N", title=None))
