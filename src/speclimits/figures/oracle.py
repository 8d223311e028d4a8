"""Charts of the Oracle section: value along a sequence, k*, the K_max plateau, Delta Space,
the α = 0 ablation and the policy comparison."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from speclimits.figures._common import HEIGHT, MAX_POINTS, WIDTH, sample_rows, tips

__all__ = ["oracle_value_along_sequence", "oracle_k_star_distribution", "oracle_speedup_by_k_max", "oracle_validation",
           "oracle_delta_space", "oracle_ablation_moves", "oracle_policy_comparison"]


def oracle_value_along_sequence(states: pd.DataFrame, seq_id: str) -> alt.VConcatChart:
    """V(n) (ms still to spend) and k*(n) against position n for one sequence of ``states``
    (:meth:`OracleResult.to_frame`)."""
    df = states.loc[states["seq_id"] == seq_id, ["pos", "value_ms", "k_star", "remaining"]]
    base = alt.Chart(df).encode(x=alt.X("pos:Q", title="state n (tokens already emitted)"))
    value = base.mark_line().encode(y=alt.Y("value_ms:Q", title="V(n), ms to finish"),
                                    tooltip=["pos", *tips("value_ms", fmt=".1f"), "k_star"])
    k_star = base.mark_bar(width=1.5).encode(y=alt.Y("k_star:Q", title="k*(n)"), tooltip=["pos", "k_star"])
    return alt.vconcat(value.properties(width=WIDTH, height=HEIGHT * 0.7),
                       k_star.properties(width=WIDTH, height=HEIGHT * 0.45))


def oracle_k_star_distribution(states: pd.DataFrame) -> alt.Chart:
    """Share of states by the Oracle's k*."""
    share = states["k_star"].value_counts(normalize=True).sort_index().rename("share").reset_index()
    return alt.Chart(share).mark_bar().encode(
        x=alt.X("k_star:O", title="k* (Oracle's draft length)"), y=alt.Y("share:Q", title="share of states"),
        tooltip=["k_star", *tips("share")],
    ).properties(width=WIDTH, height=HEIGHT)


def oracle_speedup_by_k_max(sweep: pd.DataFrame) -> alt.Chart:
    """Oracle and best-static-K speedup against K_max (:func:`speclimits.oracle.sweep_k_max`); ms per token
    instead without an autoregressive baseline (no m = 1 in the cost model: speedups are NaN)."""
    df = sweep.copy()
    if df["speedup"].notna().any():
        cols, title = ["speedup", "best_static_speedup"], "speedup over autoregressive"
    else:
        df["best_static_ms_per_token"] = df["ms_per_token"] * df["gain_over_best_static"]
        cols, title = ["ms_per_token", "best_static_ms_per_token"], "ms per token (no autoregressive baseline)"
    long = df.melt(id_vars="k_max", value_vars=cols, var_name="bound", value_name="x")
    long["bound"] = np.where(long["bound"] == cols[0], "Oracle", "best static K")
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("k_max:Q", title="K_max", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("x:Q", title=title, scale=alt.Scale(zero=False)),
        color=alt.Color("bound:N", title=None), tooltip=["k_max", "bound", *tips("x")])
    return lines.properties(width=WIDTH, height=HEIGHT)


def oracle_delta_space(points: pd.DataFrame, slope: float, lambda_: float, n: int = MAX_POINTS,
                       seed: int = 0) -> alt.LayerChart:
    """Delta Space: (ΔE[a], ΔE[Cost]) per state and extension, accepted vs rejected by k*, with the
    fitted through-origin line (slope s) and the line of slope λ (Oracle time per token).
    ``points``: :func:`speclimits.oracle.delta.delta_points` output (a seeded sample is drawn)."""
    df = sample_rows(points, n, seed)[["delta_accept", "delta_cost", "accepted", "k"]].copy()
    df["label"] = np.where(df["accepted"], "accepted (k+1 ≤ k*)", "rejected")
    pts = alt.Chart(df).mark_circle(size=10, opacity=0.35).encode(
        x=alt.X("delta_accept:Q", title="ΔE[a] = P(a ≥ k+1)"),
        y=alt.Y("delta_cost:Q", title="ΔE[Cost] = C(n, k+1) − C(n, k), ms"),
        color=alt.Color("label:N", title=None, scale=alt.Scale(range=["#1f77b4", "#d62728"])),
        tooltip=["k", *tips("delta_accept", "delta_cost")])
    xmax = float(df["delta_accept"].max()) if len(df) else 1.0
    lines = pd.DataFrame({"delta_accept": [0, xmax, 0, xmax],
                          "delta_cost": [0, slope * xmax, 0, lambda_ * xmax],
                          "line": [f"fitted slope s = {slope:.2f}"] * 2 + [f"λ = {lambda_:.2f} ms/token"] * 2})
    rule = alt.Chart(lines).mark_line(color="black").encode(
        x="delta_accept:Q", y="delta_cost:Q", strokeDash=alt.StrokeDash("line:N", title=None))
    return (pts + rule).properties(width=WIDTH, height=HEIGHT * 1.3)


def oracle_ablation_moves(transitions: pd.DataFrame) -> alt.LayerChart:
    """Heat map of states by (k* with the full cost, k* with α = 0) (:attr:`AlphaAblation.transitions`)."""
    base = alt.Chart(transitions).encode(
        x=alt.X("k_star_alpha0:O", title="k* with α = 0"), y=alt.Y("k_star:O", title="k* with the full cost"))
    heat = base.mark_rect().encode(color=alt.Color("n_states:Q", title="states", scale=alt.Scale(type="log")),
                                   tooltip=["k_star", "k_star_alpha0", "n_states"])
    text = base.mark_text(fontSize=9).encode(text="n_states:Q")
    return (heat + text).properties(width=WIDTH * 0.7, height=HEIGHT)


def oracle_policy_comparison(table: pd.DataFrame) -> alt.LayerChart:
    """Expected time on held-out sequences per policy (:attr:`PolicyComparison.table`), ±2 s.e. for
    rollout estimates."""
    df = table[["policy", "time_ms", "time_se", "evaluation"]].copy()
    df["lo"], df["hi"] = df["time_ms"] - 2 * df["time_se"], df["time_ms"] + 2 * df["time_se"]
    order = df.sort_values("time_ms")["policy"].tolist()
    base = alt.Chart(df).encode(y=alt.Y("policy:N", sort=order, title=None))
    bars = base.mark_point(filled=True, size=60).encode(
        x=alt.X("time_ms:Q", title="expected time on held-out sequences (ms)", scale=alt.Scale(zero=False)),
        # legend below: the policy names already take the left of the column
        color=alt.Color("evaluation:N", title="evaluation", legend=alt.Legend(orient="bottom")),
        tooltip=["policy", *tips("time_ms", "time_se", fmt=".1f")])
    err = base.mark_rule().encode(x="lo:Q", x2="hi:Q")
    return (bars + err).properties(width=WIDTH, height=max(HEIGHT, 16 * len(df)))


def oracle_validation(stacked: pd.DataFrame) -> alt.LayerChart:
    """Static-K speedups: the measured sweep (black) against each surrogate's Oracle model
    (from :func:`speclimits.oracle.validation.validation_by_surrogate`)."""
    measured = stacked.drop_duplicates("K")[["K", "measured_speedup"]].rename(columns={"measured_speedup": "speedup"})
    measured["source"] = "measured sweep"
    predicted = stacked[["K", "surrogate", "predicted_speedup", "rel_error"]].rename(
        columns={"predicted_speedup": "speedup", "surrogate": "source"})
    df = pd.concat([measured, predicted], ignore_index=True)
    order = ["measured sweep", *dict.fromkeys(predicted["source"])]
    color = alt.Color("source:N", title=None, sort=order,
                      scale=alt.Scale(domain=order, range=["black", "#d1495b", "#1f77b4", "#2ca02c"][: len(order)]))
    base = alt.Chart(df).encode(x=alt.X("K:Q", title="static K", axis=alt.Axis(tickMinStep=1)),
                                y=alt.Y("speedup:Q", title="speedup over plain decoding", scale=alt.Scale(zero=False)),
                                color=color)
    lines = base.mark_line(point=True).encode(
        strokeDash=alt.condition("datum.source == 'measured sweep'", alt.value([1, 0]), alt.value([5, 3])),
        tooltip=["source", "K", *tips("speedup"), *tips("rel_error", fmt="+.1%")])
    return lines.properties(width=WIDTH, height=HEIGHT)
