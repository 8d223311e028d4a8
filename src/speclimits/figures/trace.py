"""Charts of book section 1 (tracing): what the trace holds."""

from __future__ import annotations

import altair as alt
import pandas as pd

from speclimits.describe import acceptance_by_position, histogram, quantiles_by
from speclimits.figures._common import HEIGHT, WIDTH, tips

__all__ = ["rounds_per_k", "quantile_boxes", "histogram_chart", "acceptance_positions", "emitted_per_k"]


def rounds_per_k(summary: pd.DataFrame) -> alt.Chart:
    """Bars of decode rounds per K from :func:`speclimits.describe.per_k_summary`."""
    df = summary.reset_index()[["K", "rounds", "generations"]]
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("K:O", title="K (draft tokens per round)"),
        y=alt.Y("rounds:Q", title="decode rounds"),
        tooltip=["K", "rounds", "generations"],
    ).properties(width=WIDTH, height=HEIGHT)


def quantile_boxes(rounds: pd.DataFrame, value: str, by: str = "K", title: str | None = None) -> alt.Chart:
    """Box-and-whisker per level of ``by`` from precomputed quantiles (whiskers 5-95%, box 25-75%,
    tick at the median), so the page carries a few numbers per box, not every round."""
    q = quantiles_by(rounds, value, by)
    base = alt.Chart(q).encode(x=alt.X(f"{by}:O", title=by))
    label = title or value
    whisker = base.mark_rule().encode(y=alt.Y("q05:Q", title=label), y2="q95:Q")
    box = base.mark_bar(size=18, opacity=0.6).encode(
        y="q25:Q", y2="q75:Q", tooltip=[by, "q05", "q25", "q50", "q75", "q95", "mean"])
    median = base.mark_tick(color="black", size=18, thickness=2).encode(y="q50:Q")
    return (whisker + box + median).properties(width=WIDTH, height=HEIGHT)


def histogram_chart(values: pd.Series, title: str, bins: int = 40) -> alt.Chart:
    """Histogram of ``values`` from pre-binned counts."""
    h = histogram(values, bins)
    return alt.Chart(h).mark_bar().encode(
        x=alt.X("left:Q", bin="binned", title=title), x2="right:Q",
        y=alt.Y("count:Q", title="rounds"), tooltip=["left", "right", "count"],
    ).properties(width=WIDTH, height=HEIGHT)


def acceptance_positions(rounds: pd.DataFrame) -> alt.Chart:
    """Share of rounds that accepted draft position i, one line per K."""
    df = acceptance_by_position(rounds)
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("position:O", title="draft position i"),
        y=alt.Y("share:Q", title="share of rounds with position i accepted", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("K:O", scale=alt.Scale(scheme="viridis")),
        tooltip=["K", "position", *tips("share")],
    ).properties(width=WIDTH, height=HEIGHT)


def emitted_per_k(summary: pd.DataFrame) -> alt.Chart:
    """Mean accepted and emitted tokens per round against K."""
    df = summary.reset_index().melt(id_vars="K", value_vars=["accepted_per_round", "emitted_per_round"],
                                    var_name="quantity", value_name="tokens")
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("K:O"), y=alt.Y("tokens:Q", title="tokens per round"), color="quantity:N",
        tooltip=["K", "quantity", *tips("tokens")],
    ).properties(width=WIDTH, height=HEIGHT)
