"""Regimes: when the expert cost binds (cache-resident vs memory-bound), measured.

Two kinds of evidence, both read from traces the tracing harness wrote:

* the **designed experiment** (``speclimits trace --plant-routing``, ``scripts/make_regime.sh``): every
  target pass routes by a planted routing whose unique experts per layer Ū are drawn per pass, so
  at a fixed width m, ``T_T = β0(m) + α(m)·Ū`` is a causal line: :func:`designed_alpha`;
* the **observational trace** of the same target (its own routing): its mean Ū by m gives the share of a
  pass that the expert term explains, ``α(m)·Ū(m) / (β0(m) + α(m)·Ū(m))`` (:func:`share_by_width`), and
  its regression α (:func:`regression_alpha`) stands beside the experiment's.

``python -m speclimits.regime record TRACE --target DIR`` adds to a trace's ``meta.json`` how its
target was made (the twin recipe, or the bundled target's hash) and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.models.twin import file_sha256


def target_record(target: Path) -> dict[str, Any]:
    """How a target folder was made: its twin recipe (``twin.json``) or, for a trained model, the hash
    of its weights and its expert width."""
    import json

    from speclimits.models.twin import read_recipe

    target = Path(target)
    recipe = read_recipe(target)
    config = json.loads((target / "config.json").read_text())
    width = config.get("moe_intermediate_size", config.get("intermediate_size"))
    if recipe is not None:
        return {"regime_target": "memory-bound twin", "expert_width": width, "twin": recipe}
    weights = sorted(target.glob("*.safetensors"))
    return {"regime_target": "trained target", "expert_width": width,
            "weights_sha256": file_sha256(weights[0]) if weights else None}


def record(trace: Path, target: Path, command: str) -> dict[str, Any]:
    """Add ``regime`` (target recipe, command, load average) to ``trace``'s meta.json; returns it."""
    from speclimits.trace import read_meta, write_meta

    meta = read_meta(trace)
    meta["regime"] = {**target_record(target), "command": command,
                      "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    write_meta(trace, meta)
    return meta["regime"]


def decode_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds every fit uses (:func:`speclimits.trace.decode_rounds`: decode phase, a target time)."""
    from speclimits.trace import decode_rounds as usable

    return usable(rounds)[0]


def designed_alpha(rounds: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """α(m), β0(m) with ``level`` intervals from a designed-experiment trace's ``rounds`` table
    (columns ``m``, ``u_bar``, ``t_target_ms``, ``phase``): per m, OLS of T_T on the planted Ū with
    HC3 standard errors (:func:`speclimits.planted.fit_expert_cost`). One row per m; m = 1 has a
    single Ū (= top_k), so its α is not identified (NaN, with a note)."""
    from speclimits.planted import fit_expert_cost

    d = decode_rounds(rounds)
    if d.empty:
        raise SpeclimitsError("designed experiment: no decode rounds with a target time")
    return fit_expert_cost(pd.DataFrame({"m": d["m"], "u_bar": d["u_bar"], "t_ms": d["t_target_ms"]}), level=level)


def pooled_alpha(fit: pd.DataFrame, m_min: int = 5) -> dict[str, float]:
    """Inverse-variance mean of the identified α(m) at m ≥ ``m_min`` with a normal 95% interval."""
    f = fit[(fit["m"] >= m_min) & np.isfinite(fit["alpha"]) & (fit["alpha_se"] > 0)]
    if f.empty:
        return {"alpha": float("nan"), "lo": float("nan"), "hi": float("nan"), "m_min": m_min}
    w = 1.0 / f["alpha_se"].to_numpy() ** 2
    a = float(np.sum(w * f["alpha"].to_numpy()) / w.sum())
    se = float(np.sqrt(1.0 / w.sum()))
    return {"alpha": a, "lo": a - 1.96 * se, "hi": a + 1.96 * se, "m_min": m_min}




# -- the designed experiments of every width, and the share of a pass they explain ---------------

def designed_traces(root: Path | None = None) -> dict[int, Path]:
    """The designed-experiment traces under ``root`` (default ``data/traces``), by expert width:
    folders named ``designed-w<width>``."""
    from speclimits.paths import TRACES_DIR

    root = Path(root) if root is not None else TRACES_DIR
    out = {}
    for p in sorted(root.glob("designed-w*")):
        if (p / "rounds.parquet").exists() and p.name[len("designed-w"):].isdigit():
            out[int(p.name[len("designed-w"):])] = p
    return dict(sorted(out.items()))


def designed_fits(traces: dict[int, Path]) -> pd.DataFrame:
    """:func:`designed_alpha` of every width's trace, stacked with a ``width`` column."""
    from speclimits.trace import read_table

    frames = [designed_alpha(read_table(p, "rounds")).assign(width=w) for w, p in traces.items()]
    if not frames:
        raise SpeclimitsError("no designed-experiment traces (data/traces/designed-w*): run scripts/make_regime.sh")
    return pd.concat(frames, ignore_index=True)


def share_by_width(fits: pd.DataFrame, natural_u: pd.Series, m_values: tuple[int, ...] = (2, 5, 9, 11)) -> pd.DataFrame:
    """For every width and m: the designed line's pass time at the *natural* Ū of m and the share of it
    that the expert term explains, ``α(m)·Ū / (β0(m) + α(m)·Ū)``.

    ``natural_u``: mean Ū by m of the target's own routing (one series serves every width: the twin
    routes exactly as its source)."""
    f = fits[fits["m"].isin(m_values) & np.isfinite(fits["alpha"])].copy()
    f["u_natural"] = f["m"].map(natural_u)
    f["expert_ms"] = f["alpha"] * f["u_natural"]
    f["t_pass_ms"] = f["beta0"] + f["expert_ms"]
    f["expert_share"] = f["expert_ms"] / f["t_pass_ms"]
    return f[["width", "m", "u_natural", "alpha", "alpha_lo", "alpha_hi", "beta0", "t_pass_ms", "expert_share"]]


def regression_alpha(rounds: pd.DataFrame) -> pd.DataFrame:
    """The observational α(m) of the joint categorical model (Eq. 4 with a shared c), one row per m:
    ``m``, ``alpha``, ``alpha_lo``, ``alpha_hi`` (95%, generation-clustered) and ``identified``: the
    regression beside the experiment."""
    from speclimits.stats import CellMoments, fit_joint

    dec = decode_rounds(rounds)
    joint = fit_joint(CellMoments.from_rounds(dec, base=("u_bar", "context_len")))
    b = joint.by_m
    return pd.DataFrame({"m": b["m"].astype(int), "alpha": b["alpha"],
                         "alpha_lo": b["alpha"] - 1.96 * b["alpha_se"], "alpha_hi": b["alpha"] + 1.96 * b["alpha_se"],
                         "identified": b["identified"]}).reset_index(drop=True)


# -- the context slope c: flat in m on the paper's GPU, growing with m on this CPU -------------------

@dataclass(frozen=True)
class ContextSlope:
    """The context coefficient c of ``T_T = β0 + α·Ū + c·L`` fitted per K, and whether it depends on m.

    ``by_k``: one row per K ≥ 1 (``K``, ``m`` = K + 1, ``c``, ``c_se``: generation-clustered, ms/token;
    ``c_line``: the weighted line's value at m). ``flat``: the inverse-variance mean c and the
    homogeneity test of the per-K c around it (``q``, ``df``, ``p``). ``line``: weighted least squares
    of c on m (``c0``, ``c1`` and SEs; ``q``, ``df``, ``p``: the residual test). ``spread``: max/min of
    the per-K c; ``spread_line``: of c over the line."""

    by_k: pd.DataFrame
    flat: dict[str, float]
    line: dict[str, float]
    spread: float
    spread_line: float


def context_slope(rounds: pd.DataFrame) -> ContextSlope:
    """Per-K fits of ``T_T ~ Ū + L`` (OLS, SEs clustered by generation) and two descriptions of how c
    moves across K: one constant (the paper's model; its c spans 1.098–1.107 × 10⁻³ ms/token over K on
    an A100) and a line in m. A pass's only work that grows with the context is attention; where
    the line's slope is positive, attention costs per query row (m rows × L keys), as on a CPU,
    rather than one read of the KV cache shared by the rows, as on the paper's GPU."""
    import statsmodels.api as sm
    from scipy import stats as sps

    from speclimits.stats import CellMoments
    from speclimits.stats.robustness import context_slope_by_k

    dec = decode_rounds(rounds)
    dec = dec[dec["K"] >= 1]
    if dec.empty:
        raise SpeclimitsError("the context slope needs decode rounds with K >= 1")
    # the per-K fits of section 5 ("c across the per-K fits")
    by_k = context_slope_by_k(CellMoments.from_rounds(dec, base=("u_bar", "context_len")))
    by_k["m"] = by_k["K"] + 1
    by_k["context_max"] = by_k["K"].map(dec.groupby("K")["context_len"].max()).astype(int)
    if len(by_k) < 3:
        raise SpeclimitsError(f"the context slope needs per-K fits at >= 3 values of K >= 1 with varied contexts "
                              f"(got {len(by_k)})")
    w = 1.0 / by_k["c_se"].to_numpy() ** 2
    c = by_k["c"].to_numpy()
    mean = float(np.sum(w * c) / w.sum())
    q_flat = float(np.sum(w * (c - mean) ** 2))
    flat = {"c": mean, "c_se": float(np.sqrt(1.0 / w.sum())), "q": q_flat, "df": len(c) - 1,
            "p": float(sps.chi2.sf(q_flat, len(c) - 1))}
    wls = sm.WLS(c, sm.add_constant(by_k["m"].to_numpy(float)), weights=w).fit()
    by_k["c_line"] = wls.fittedvalues
    # the per-K SEs are the weights; the coefficients' SEs are scaled up (never down) by the residual
    # dispersion q/df when the per-K c scatter about the line more than their SEs allow
    q_line = float(np.sum(w * (c - by_k["c_line"].to_numpy()) ** 2))
    cov = np.linalg.inv(wls.model.wexog.T @ wls.model.wexog) * max(1.0, q_line / (len(c) - 2))
    line = {"c0": float(wls.params[0]), "c0_se": float(np.sqrt(cov[0, 0])), "c1": float(wls.params[1]),
            "c1_se": float(np.sqrt(cov[1, 1])), "q": q_line, "df": len(c) - 2, "p": float(sps.chi2.sf(q_line, len(c) - 2))}
    ratio = c / by_k["c_line"].to_numpy()
    return ContextSlope(by_k, flat, line, float(c.max() / c.min()), float(ratio.max() / ratio.min()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclimits.regime", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="add the target's recipe and the load average to a trace's meta.json")
    r.add_argument("trace", type=Path)
    r.add_argument("--target", type=Path, required=True)
    r.add_argument("--command", default="")
    f = sub.add_parser("alpha", help="print the designed experiment's alpha(m) of a planted trace")
    f.add_argument("trace", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "record":
        print(record(args.trace, args.target, args.command))
    else:
        from speclimits.trace import read_table

        fit = designed_alpha(read_table(args.trace, "rounds"))
        print(fit[["m", "n", "u_min", "u_max", "alpha", "alpha_lo", "alpha_hi", "beta0", "t_mean"]]
              .to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
