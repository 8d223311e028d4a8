"""Charts of the regime page: the designed experiment by expert width, the context slope, two CPUs."""

from __future__ import annotations

import altair as alt
import pandas as pd

from speclimits import paper
from speclimits.figures._common import HEIGHT, WIDTH, tips

__all__ = ["context_slope_chart", "designed_alpha_chart", "expert_share_chart", "machines_chart"]


def designed_alpha_chart(fits: pd.DataFrame) -> alt.LayerChart:
    """α(m) of the designed experiment (:func:`speclimits.regime.designed_fits`, 95% intervals) per expert
    width, log scale, with the paper's regression α (m ≤ 4 and m ≥ 5, A100) as a dashed line."""
    f = fits.dropna(subset=["alpha"]).copy()
    f["width"] = f["width"].astype(str)
    color = alt.Color("width:N", title="expert width", sort=sorted(f["width"].unique(), key=int))
    y = alt.Y("alpha:Q", title="α(m), ms per unique expert per layer", scale=alt.Scale(type="log"))
    pts = alt.Chart(f).mark_line(point=True).encode(
        x=alt.X("m:O", title="tokens verified per pass, m"), y=y, color=color,
        tooltip=["width", "m", *tips("alpha", "alpha_lo", "alpha_hi"), "n"])
    bars = alt.Chart(f).mark_rule().encode(x="m:O", y="alpha_lo:Q", y2="alpha_hi:Q", color=color)
    ref = pd.DataFrame([
        {"m": m, "paper": sum(paper.ALPHA_SMALL if m <= paper.BOUNDARY_M else paper.ALPHA_LARGE) / 2,
         "label": "paper (A100, regression)"} for m in sorted(f["m"].unique())])
    rule = alt.Chart(ref).mark_line(strokeDash=[4, 3], color="black").encode(
        x="m:O", y="paper:Q", detail="label:N", tooltip=["label", "paper"])
    return (bars + pts + rule).properties(width=WIDTH, height=HEIGHT)


def expert_share_chart(share: pd.DataFrame) -> alt.Chart:
    """Share of a verification pass the expert term explains, ``α(m)·Ū/(β0(m) + α(m)·Ū)`` at the natural
    Ū of m (:func:`speclimits.regime.share_by_width`), by expert width, a line per m; the band is the
    paper's range (one half to three quarters at m ≥ 5)."""
    s = share.copy()
    s["m"] = s["m"].astype(str)
    band = alt.Chart(pd.DataFrame({"lo": [0.5], "hi": [0.75]})).mark_rect(opacity=0.12, color="gray").encode(
        y="lo:Q", y2="hi:Q")
    lines = alt.Chart(s).mark_line(point=True).encode(
        x=alt.X("width:Q", title="expert width (intermediate units)", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("expert_share:Q", title="expert share of a pass", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("m:N", title="m", sort=sorted(s["m"].unique(), key=int)),
        tooltip=["width", "m", *tips("u_natural", fmt=".1f"), *tips("alpha"),
                 *tips("t_pass_ms", "expert_share", fmt=".2f")])
    return (band + lines).properties(width=WIDTH, height=HEIGHT)


def context_slope_chart(slopes: dict[str, pd.DataFrame], legend: str = "target") -> alt.LayerChart:
    """The per-K context slope c (10⁻³ ms/token, 95% intervals) against m per target (``slopes``: label →
    :attr:`speclimits.regime.ContextSlope.by_k`-like rows: m, c, c_se, c_line), each target's weighted line
    in m (dashed) and the paper's c on an A100 (gray rule); ``legend``: what the labels are."""
    frames = []
    for label, b in slopes.items():
        f = b.assign(target=label)
        f["c_ms"], f["lo"], f["hi"] = 1e3 * f["c"], 1e3 * (f["c"] - 1.96 * f["c_se"]), 1e3 * (f["c"] + 1.96 * f["c_se"])
        f["line"] = 1e3 * f["c_line"]
        f["m_shown"] = f["m"] + 0.12 * (len(frames) - (len(slopes) - 1) / 2)  # side by side, not on top
        frames.append(f)
    d = pd.concat(frames, ignore_index=True)
    color = alt.Color("target:N", title=legend)
    x_scale = alt.Scale(domain=[1, int(d["m"].max()) + 1])
    x = alt.X("m:Q", title="tokens verified per pass, m = K + 1", scale=x_scale)
    band = alt.Chart(pd.DataFrame({"paper": [1e3 * sum(paper.C_RANGE) / 2], "label": ["paper (A100), every K"]})
                     ).mark_rule(color="gray", strokeWidth=3, opacity=0.6).encode(y="paper:Q", tooltip=["label", "paper"])
    xs = alt.X("m_shown:Q", title="tokens verified per pass, m = K + 1", scale=x_scale)
    bars = alt.Chart(d).mark_rule().encode(x=xs, y="lo:Q", y2="hi:Q", color=color)
    pts = alt.Chart(d).mark_point(filled=True).encode(
        x=xs, y=alt.Y("c_ms:Q", title="c, 10⁻³ ms per context token"), color=color,
        tooltip=["target", "K", "m", alt.Tooltip("c_ms:Q", format=".3f", title="c"), *tips("lo", "hi"), "context_max"])
    line = alt.Chart(d).mark_line(strokeDash=[4, 3]).encode(x=x, y="line:Q", color=color)
    return (band + bars + pts + line).properties(width=WIDTH, height=HEIGHT)


def machines_chart(passes: pd.DataFrame, shares: pd.DataFrame) -> alt.HConcatChart:
    """The same twin on several CPUs: mean T_T by m (``passes``: :func:`speclimits.regime.pass_times` rows)
    and the regression's α(m) (``shares``: :func:`speclimits.regime.expert_share` rows), a colour per
    ``machine``, 95% intervals as rules."""
    color = alt.Color("machine:N", title="CPU")
    x = alt.X("m:O", title="tokens verified per pass, m")

    def panel(d: pd.DataFrame, y: str, lo: str, hi: str, title: str) -> alt.LayerChart:
        pts = alt.Chart(d).mark_line(point=True).encode(
            x=x, y=alt.Y(f"{y}:Q", title=title), color=color,
            tooltip=["machine", "m", *tips(y, lo, hi)])
        bars = alt.Chart(d).mark_rule().encode(x=x, y=f"{lo}:Q", y2=f"{hi}:Q", color=color)
        return (bars + pts).properties(width=WIDTH // 2, height=HEIGHT)

    return alt.hconcat(panel(passes, "t_ms", "t_lo", "t_hi", "mean target time T_T (ms)"),
                       panel(shares, "alpha", "alpha_lo", "alpha_hi", "α(m), ms per unique expert (regression)"))
