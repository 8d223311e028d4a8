"""Charts of the "Beyond batch 1" section: time per token, unique experts of a step, the bound at batch b."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from speclimits.costmodel import saturation_curve
from speclimits.figures._common import HEIGHT, WIDTH, sample_rows, tips

__all__ = ["batch_time_per_token", "batch_step_union", "batch_bounds"]


def batch_time_per_token(table: pd.DataFrame, value: str = "measured_ms_per_token",
                         predicted: str | None = "predicted_ms_per_token", title: str = "ms per token") -> alt.LayerChart:
    """ms per token against batch size b (log axis; ``table``: a row per (b, K)), a line per K (K = 0, plain
    decoding, black): measured solid, the prediction (when ``predicted`` names a column) dashed."""
    df = table.copy()
    df["K"] = df["K"].astype(int)
    df["series"] = np.where(df["K"] == 0, "K = 0 (plain)", "K = " + df["K"].astype(str))
    order = sorted(df["series"].unique(), key=lambda s: int(s.split("=")[1].split()[0]))
    x = alt.X("b:Q", title="batch size b (requests in flight)", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=sorted(df["b"].unique().tolist())))
    color = alt.Color("series:N", title=None, sort=order,
                      scale=alt.Scale(domain=order, range=["black", *_palette(len(order) - 1)]))
    tooltip = ["b", "K", alt.Tooltip(f"{value}:Q", format=".3f")]
    measured = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y(f"{value}:Q", title=title, scale=alt.Scale(zero=False)), color=color, tooltip=tooltip)
    layers = [measured]
    if predicted is not None and predicted in df:
        layers.append(alt.Chart(df).mark_line(strokeDash=[4, 3], opacity=0.7).encode(
            x=x, y=f"{predicted}:Q", color=color,
            tooltip=["b", "K", alt.Tooltip(f"{predicted}:Q", format=".3f", title="predicted")]))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT)


def _palette(n: int) -> list[str]:
    base = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    return (base * (n // len(base) + 1))[:n]


def batch_step_union(steps: pd.DataFrame, n_experts: int, top_k: int, seed: int = 0) -> alt.LayerChart:
    """Unique experts per layer of an engine step (``u_step``, a seeded sample coloured by ``b``) against the
    tokens it verifies, beside the saturation curve of uniform independent routing ``E (1 - (1 - k/E)^n)``
    and the expert count E."""
    df = sample_rows(steps[["n_tokens", "u_step", "b"]], seed=seed).copy()
    df["b"] = df["b"].astype(int)
    n_max = max(int(df["n_tokens"].max()) if len(df) else 1, 1)
    grid = np.unique(np.geomspace(1, n_max, 60).round().astype(int))
    curve = pd.DataFrame({"n_tokens": grid, "u": saturation_curve(grid, n_experts, top_k)})
    x = alt.X("n_tokens:Q", title="tokens verified in the step (rows of the pass)", scale=alt.Scale(type="log"))
    pts = alt.Chart(df).mark_circle(size=14, opacity=0.45).encode(
        x=x, y=alt.Y("u_step:Q", title="unique experts per layer (Ū of the step)"),
        color=alt.Color("b:O", title="batch size b"),
        tooltip=["b", "n_tokens", *tips("u_step", fmt=".2f")])
    line = alt.Chart(curve).mark_line(color="black").encode(x=x, y="u:Q")
    cap = alt.Chart(pd.DataFrame({"u": [float(n_experts)]})).mark_rule(strokeDash=[3, 3], color="gray").encode(y="u:Q")
    return alt.layer(pts, line, cap).properties(width=WIDTH, height=HEIGHT)


def batch_bounds(bounds: pd.DataFrame) -> alt.Chart:
    """Speedup over plain decoding at the same batch size per b (``bounds``: ``b``, ``what``, ``speedup``):
    the bound, the best batch-size table, the best static K and (b = 2) the exact Oracle."""
    order = ["bound (relaxation)", "exact Oracle (b = 2)", "best batch→K table", "best static K"]
    present = [w for w in order if w in set(bounds["what"])]
    return alt.Chart(bounds).mark_line(point=True).encode(
        x=alt.X("b:Q", title="batch size b", scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(values=sorted(bounds["b"].unique().tolist()))),
        y=alt.Y("speedup:Q", title="speedup over plain decoding at the same b", scale=alt.Scale(zero=False)),
        color=alt.Color("what:N", title=None, sort=present),
        tooltip=["b", "what", *tips("speedup")],
    ).properties(width=WIDTH, height=HEIGHT)
