"""Planted routing for designed experiments on the per-expert cost of MoE layers.

The paper's α(m) comes from a regression on observed rounds, where the unique experts Ū_r move with
the budget m and with the text. A designed experiment holds m fixed and *plants* the routing: every
MoE layer of a pass of m tokens touches exactly ``u_bar`` unique experts, ``top_k`` to
``min(m * top_k, n_experts)``; fitting ``t = beta0(m) + alpha(m) * u_bar`` per m (:func:`fit_expert_cost`,
HC3 standard errors) measures the per-expert cost causally. Used by ``benchmarks/bench_expert_cost.py``
and the tracing harness (``speclimits trace --plant-routing``). Only numpy is imported with this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Columns of :func:`fit_expert_cost`'s frame.
FIT_COLUMNS = ("m", "n", "n_u", "u_min", "u_max", "alpha", "alpha_se", "alpha_lo", "alpha_hi",
               "beta0", "beta0_se", "beta0_lo", "beta0_hi", "t_mean", "r2", "note")


def u_bar_range(m: int, top_k: int, n_experts: int) -> tuple[int, int]:
    """``(lowest, highest)`` number of unique experts a layer can touch with ``m`` tokens of ``top_k``
    distinct experts each, out of ``n_experts``: ``(top_k, min(m * top_k, n_experts))``.

    >>> u_bar_range(1, 8, 128), u_bar_range(5, 8, 128), u_bar_range(11, 8, 64)
    ((8, 8), (8, 40), (8, 64))
    """
    m, top_k, n_experts = int(m), int(top_k), int(n_experts)
    if m < 1 or top_k < 1 or n_experts < 1:
        raise ValueError(f"m, top_k and n_experts must be at least 1 (got m={m}, top_k={top_k}, "
                         f"n_experts={n_experts})")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} distinct experts per token cannot be chosen from n_experts={n_experts}")
    return top_k, min(m * top_k, n_experts)


def u_bar_grid(m: int, top_k: int, n_experts: int, points: int | None = None) -> list[int]:
    """The ``u_bar`` values to plant at budget ``m``: the whole range of :func:`u_bar_range`, or
    ``points`` integers spread evenly over it (both ends included, no repeats).

    >>> u_bar_grid(2, 8, 128), u_bar_grid(11, 8, 128, points=4)
    ([8, 9, 10, 11, 12, 13, 14, 15, 16], [8, 35, 61, 88])
    """
    lo, hi = u_bar_range(m, top_k, n_experts)
    if points is None or points >= hi - lo + 1:
        return list(range(lo, hi + 1))
    if points < 2:
        raise ValueError(f"points must be at least 2 (both ends of the range), got {points}")
    return sorted({int(round(v)) for v in np.linspace(lo, hi, points)})


def planted_topk_ids(m: int, top_k: int, n_experts: int, u_bar: int, rng: np.random.Generator) -> np.ndarray:
    """Expert ids of one MoE layer for ``m`` tokens whose union is exactly ``u_bar`` experts.

    Returns an int64 array of shape ``(m, top_k)``: row ``t`` holds token ``t``'s ``top_k`` distinct
    experts (in random order), and ``np.unique(ids).size == u_bar``. Which experts form the union
    is drawn by ``rng`` from all ``n_experts``; the union is spread over the tokens as evenly as it
    can be (each token brings ``u_bar // m`` or one more of them, at most ``top_k``), and each token
    fills its other slots with experts drawn from the union.

    Raises :class:`ValueError` unless ``top_k <= u_bar <= min(m * top_k, n_experts)``.
    """
    lo, hi = u_bar_range(m, top_k, n_experts)
    if int(u_bar) != u_bar or not lo <= u_bar <= hi:
        raise ValueError(f"u_bar={u_bar} is outside its range for m={m}, top_k={top_k}, n_experts={n_experts}: "
                         f"a layer touches between top_k={lo} and min(m * top_k, n_experts)={hi} unique experts")
    m, top_k, u_bar = int(m), int(top_k), int(u_bar)
    union = rng.choice(n_experts, size=u_bar, replace=False)
    # how many of the union each token brings (sum u_bar, each <= ceil(u_bar / m) <= top_k)
    fresh = np.full(m, u_bar // m)
    fresh[rng.permutation(m)[: u_bar % m]] += 1
    ids = np.empty((m, top_k), dtype=np.int64)
    start = 0
    for t in range(m):
        own = union[start:start + fresh[t]]
        start += fresh[t]
        rest = np.setdiff1d(union, own, assume_unique=True)
        fill = rng.choice(rest, size=top_k - own.size, replace=False)
        ids[t] = rng.permutation(np.concatenate([own, fill]))
    return ids


def planted_layers(n_layers: int, m: int, top_k: int, n_experts: int, u_bar: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Planted routing of a whole pass: ``(n_layers, m, top_k)`` int64, every layer drawn
    independently by :func:`planted_topk_ids` with exactly ``u_bar`` unique experts."""
    if int(n_layers) < 1:
        raise ValueError(f"n_layers must be at least 1, got {n_layers}")
    return np.stack([planted_topk_ids(m, top_k, n_experts, u_bar, rng) for _ in range(int(n_layers))])


def routing_weights(m: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """Positive combine weights of the routed experts, ``(m, top_k)``, each row summing to 1 (a
    softmax of normal draws, as a top-k router renormalizes)."""
    z = rng.standard_normal((int(m), int(top_k)))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def fit_expert_cost(df: Any, level: float = 0.95) -> Any:
    """Per-m OLS of pass time on planted unique experts: ``t_ms = beta0(m) + alpha(m) * u_bar``.

    ``df``: a DataFrame (or anything ``pandas.DataFrame`` accepts) with columns ``m``, ``u_bar``,
    ``t_ms``, one row per timed pass (repeated passes are separate rows). Standard errors are
    heteroskedasticity-robust (HC3); intervals are ``level`` t-intervals with ``n - 2`` df.

    Returns a DataFrame with one row per m (ascending) and the columns of :data:`FIT_COLUMNS`:
    ``n`` passes, ``n_u`` distinct u_bar values and their range, ``alpha`` (ms per unique expert per
    layer, over the layers of the timed pass), ``beta0`` (ms), each with ``_se``, ``_lo``, ``_hi``;
    ``t_mean`` (mean pass time), ``r2`` and a ``note``. Where an m has a single u_bar value (m = 1
    always: u_bar = top_k), alpha and beta0 are not identified: they are NaN and ``note`` says so;
    ``t_mean`` is still given.
    """
    import pandas as pd
    import statsmodels.api as sm
    from scipy import stats as sps

    frame = pd.DataFrame(df)
    missing = {"m", "u_bar", "t_ms"} - set(frame.columns)
    if missing:
        raise ValueError(f"fit_expert_cost needs columns m, u_bar, t_ms; missing {sorted(missing)}")
    rows = []
    for m, g in frame.groupby("m", sort=True):
        u = g["u_bar"].to_numpy(dtype=float)
        t = g["t_ms"].to_numpy(dtype=float)
        row: dict[str, Any] = {c: np.nan for c in FIT_COLUMNS}
        row.update(m=int(m), n=int(len(g)), n_u=int(np.unique(u).size), u_min=float(u.min()), u_max=float(u.max()),
                   t_mean=float(t.mean()), note="")
        if row["n_u"] < 2:
            row["note"] = f"alpha not identified: one u_bar value ({u[0]:g}) at m = {int(m)}"
        elif len(g) < 4:
            row["note"] = f"too few passes ({len(g)}) for robust standard errors"
        else:
            res = sm.OLS(t, sm.add_constant(u)).fit(cov_type="HC3")
            q = sps.t.ppf(0.5 + level / 2, len(g) - 2)
            (b0, a), (se0, sea) = res.params, res.bse
            row.update(alpha=a, alpha_se=sea, alpha_lo=a - q * sea, alpha_hi=a + q * sea,
                       beta0=b0, beta0_se=se0, beta0_lo=b0 - q * se0, beta0_hi=b0 + q * se0, r2=res.rsquared)
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(FIT_COLUMNS))
    return out.astype({"m": int, "n": int, "n_u": int})


def regime_step(fit: Any, boundary: int = 4, level: float = 0.95) -> dict[str, Any]:
    """Is there a step in alpha between ``m = boundary`` and ``boundary + 1`` (the paper's 4 / 5)?

    ``fit``: the frame of :func:`fit_expert_cost` (any scale, e.g. alpha over all layers).
    Returns the mean alpha over the identified m <= boundary and over m > boundary, their ratio
    (the paper's is about 3.2), the jump alpha(b + 1) - alpha(b) with a ``level`` interval (normal,
    independent fits), the adjacent pair with the largest |jump|, and ``step``: True when the jump at
    the boundary has an interval that excludes zero and is the largest adjacent jump.
    """
    from scipy import stats as sps

    f = fit[np.isfinite(fit["alpha"])].set_index("m").sort_index()
    small, large = f.loc[f.index <= boundary, "alpha"], f.loc[f.index > boundary, "alpha"]
    out: dict[str, Any] = {"boundary": boundary, "alpha_small_mean": float(small.mean()) if len(small) else None,
                           "alpha_large_mean": float(large.mean()) if len(large) else None,
                           "ratio_large_to_small": None, "jump": None, "jump_lo": None, "jump_hi": None,
                           "largest_jump_at": None, "step": None}
    if len(small) and len(large) and out["alpha_small_mean"] > 0:
        out["ratio_large_to_small"] = out["alpha_large_mean"] / out["alpha_small_mean"]
    if boundary in f.index and boundary + 1 in f.index:
        z = sps.norm.ppf(0.5 + level / 2)
        jump = f.loc[boundary + 1, "alpha"] - f.loc[boundary, "alpha"]
        se = float(np.hypot(f.loc[boundary + 1, "alpha_se"], f.loc[boundary, "alpha_se"]))
        jumps = f["alpha"].diff().dropna()
        jumps = jumps[np.diff(f.index.to_numpy()) == 1]
        at = int(jumps.abs().idxmax()) - 1 if len(jumps) else None
        out.update(jump=float(jump), jump_lo=float(jump - z * se), jump_hi=float(jump + z * se),
                   largest_jump_at=f"{at}/{at + 1}" if at is not None else None)
        out["step"] = bool((out["jump_lo"] > 0 or out["jump_hi"] < 0) and at == boundary)
    return out
