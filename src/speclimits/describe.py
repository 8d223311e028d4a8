"""Descriptive summaries of a trace (book section 1): per-K means, their cluster-bootstrap intervals
(:func:`per_k_rates`), quantiles and per-position acceptance."""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits.bootstrap import ratio_bootstrap
from speclimits.trace import decode_rounds

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def per_k_summary(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per K over decode rounds with non-zero target timing.

    Columns: generations, rounds, mean ``t_target_ms``, ``t_draft_ms``, ``u_bar``,
    ``context_len``, acceptance rate (accepted / drafted), mean accepted and emitted per round,
    and tokens per ms of target+draft time (a throughput proxy that ignores other overheads).
    """
    dec, _ = decode_rounds(rounds, timing="target")
    g = dec.groupby("K")
    out = pd.DataFrame({
        "generations": g["generation_id"].nunique(),
        "rounds": g.size(),
        "t_target_ms": g["t_target_ms"].mean(),
        "t_draft_ms": g["t_draft_ms"].mean(),
        "u_bar": g["u_bar"].mean(),
        "context_len": g["context_len"].mean(),
        "acceptance": g["n_accepted"].sum() / g["n_draft"].sum().replace(0, np.nan),
        "accepted_per_round": g["n_accepted"].mean(),
        "emitted_per_round": g["n_emitted"].mean(),
    })
    time_ms = g["t_target_ms"].sum() + g["t_draft_ms"].sum()
    out["tokens_per_s"] = 1000.0 * g["n_emitted"].sum() / time_ms
    return out


#: Per-K ratios with an interval: name -> (numerator column, denominator column or None for rounds).
_RATES = {
    "accepted_per_round": ("n_accepted", None),
    "emitted_per_round": ("n_emitted", None),
    "acceptance": ("n_accepted", "n_draft"),
}


def per_k_rates(rounds: pd.DataFrame, n_boot: int = 999, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """One row per K: the decode-round ratios of :data:`_RATES` with percentile intervals.

    Each ratio is ``sum(numerator) / sum(denominator)`` over the decode rounds (non-zero target
    time, as :func:`per_k_summary`), so the point estimates equal that summary's.
    Generations are the resampling unit; every K is resampled on its own (each K is its own sweep).
    Columns: ``K``, then ``<name>``, ``<name>_lo``, ``<name>_hi`` for every name (NaN where the
    denominator is zero, e.g. acceptance at K = 0).
    """
    dec, _ = decode_rounds(rounds, timing="target")
    dec = dec.assign(_one=1.0)
    rows = []
    for i, (k, d) in enumerate(dec.groupby("K", sort=True)):
        sums = d.groupby("generation_id", sort=True, observed=True)[
            ["n_accepted", "n_emitted", "n_draft", "_one"]].sum()
        row: dict[str, float] = {"K": int(k)}
        for name, (num, den) in _RATES.items():
            den_v = sums[den or "_one"].to_numpy(dtype=float)
            if den_v.sum() <= 0:
                row.update({name: np.nan, f"{name}_lo": np.nan, f"{name}_hi": np.nan})
                continue
            est, lo, hi = ratio_bootstrap(sums[num].to_numpy(dtype=float), den_v, n_boot, seed + i, level)
            row.update({name: est, f"{name}_lo": lo, f"{name}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def quantiles_by(rounds: pd.DataFrame, value: str, by: str, quantiles=QUANTILES) -> pd.DataFrame:
    """Long table ``(by, q05, q25, q50, q75, q95, mean)`` of ``value`` within each level of ``by``."""
    g = rounds.groupby(by)[value]
    q = g.quantile(list(quantiles)).unstack()
    q.columns = [f"q{int(round(100 * c)):02d}" for c in q.columns]
    q["mean"] = g.mean()
    return q.reset_index()


def acceptance_by_position(rounds: pd.DataFrame) -> pd.DataFrame:
    """Share of rounds whose draft position i (1..K) was accepted, per K: columns ``K, position, share``.

    Position i is accepted when ``n_accepted >= i``; this is the per-position acceptance vLLM reports.
    """
    dec = rounds[(rounds["phase"] == "decode") & (rounds["K"] > 0)]
    rows = []
    for k, d in dec.groupby("K"):
        acc = d["n_accepted"].to_numpy()
        for i in range(1, int(k) + 1):
            rows.append((int(k), i, float((acc >= i).mean())))
    return pd.DataFrame(rows, columns=["K", "position", "share"])


def histogram(values: pd.Series, bins: int = 40) -> pd.DataFrame:
    """Binned counts ``(left, right, count)`` for a light histogram chart."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    counts, edges = np.histogram(v, bins=bins)
    return pd.DataFrame({"left": edges[:-1], "right": edges[1:], "count": counts})
