"""The intro's figure: what adapting the draft length buys, measured and bounded, per regime and batch size."""

from __future__ import annotations

import altair as alt
import pandas as pd

from speclimits.figures._common import HEIGHT, WIDTH, tips

#: Shapes of the marks (legend order): the measured two a circle and a square, the offline bounds
#: triangles and a diamond.
_SHAPES = ("circle", "square", "triangle-up", "diamond", "triangle-down")
#: Their colours: the measured two dark (grey, orange), the bounds blues darkening toward the exact Oracle.
_COLOURS = ("#595959", "#e6550d", "#6baed6", "#2171b5", "#08306b")


def speed_ladder(rows: pd.DataFrame) -> alt.FacetChart:
    """Speed over plain decoding of each mark (:func:`speclimits.book.views.headline.headline_speeds` rows)
    per batch size, a panel per regime, plain decoding's 1 dashed."""
    df = rows.copy()
    df["legend"] = df["mark"] + " (" + df["harness"] + ")"
    legend = list(dict.fromkeys(df["legend"]))  # the rows come in the legend's order
    df["panel"] = df["regime"] + ", " + df["machine"]
    df["batch size"] = df["batch"].astype(str)
    # one legend: colour and shape on the same field, each with its scale's domain and range given
    enc = dict(color=alt.Color("legend:N", title=None, scale=alt.Scale(domain=legend, range=list(_COLOURS))),
               shape=alt.Shape("legend:N", title=None, scale=alt.Scale(domain=legend, range=list(_SHAPES))))
    pts = alt.Chart().mark_point(filled=True, size=70, opacity=0.9).encode(
        x=alt.X("batch size:N", title="batch size", sort=sorted(df["batch size"].unique(), key=int),
                axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("legend:N", sort=legend),
        y=alt.Y("speed:Q", title="speed over plain decoding (×)", scale=alt.Scale(zero=False)),
        tooltip=["regime", "machine", "batch", "mark", "harness", *tips("speed", "over_best_static"), "best_static",
                 "source"],
        **enc)
    plain = alt.Chart().mark_rule(strokeDash=[4, 3], color="gray").encode(y=alt.datum(1.0))
    return (alt.layer(plain, pts, data=df).properties(width=WIDTH * 0.62, height=HEIGHT)
            .facet(column=alt.Column("panel:N", title=None, sort=list(dict.fromkeys(df["panel"]))))
            .configure_legend(orient="bottom", columns=3))
