"""Regimes: when the expert cost binds (cache-resident vs memory-bound), measured.

Two kinds of evidence, both from traces the tracing harness wrote: the **designed experiment**
(``speclimits trace --plant-routing``), whose planted Ū per pass makes ``T_T = β0(m) + α(m)·Ū`` a causal
line at each m (:func:`designed_alpha`); and the **observational trace** of the same target, whose mean Ū
by m gives the share of a pass the expert term explains (:func:`share_by_width`) and whose regression α
(:func:`regression_alpha`) stands beside the experiment's. ``python -m speclimits.regime record TRACE
--target DIR`` adds how the target was made and the load average to a trace's ``meta.json``.
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


def record(trace: Path, target: Path, command: str) -> dict[str, Any]:
    """Add ``regime`` to ``trace``'s meta.json and return it: how the target was made (its twin recipe, or
    a trained model's weights hash), its expert width, its routed experts over the trace CPU's
    last-level cache, the command and the load average."""
    import json

    from speclimits.machine import cache_ratio
    from speclimits.models.twin import DTYPE_BYTES, read_recipe
    from speclimits.trace import read_meta, write_meta

    meta = read_meta(trace)
    target = Path(target)
    recipe = read_recipe(target)
    config = json.loads((target / "config.json").read_text())
    width = config.get("moe_intermediate_size", config.get("intermediate_size"))
    if recipe is not None:
        made = {"regime_target": "memory-bound twin", "expert_width": width, "twin": recipe}
    else:
        weights = sorted(target.glob("*.safetensors"))
        made = {"regime_target": "trained target", "expert_width": width,
                "weights_sha256": file_sha256(weights[0]) if weights else None}
    params = (made.get("twin") or {}).get("experts_params_total")
    ratio = cache_ratio(params * DTYPE_BYTES.get(str(meta.get("dtype")), 4), meta.get("cpu")) if params else None
    llc = {"experts_over_llc": round(ratio, 2)} if ratio else {}
    meta["regime"] = {**made, **llc, "command": command,
                      "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    write_meta(trace, meta)
    return meta["regime"]


def decode_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds every fit uses (:func:`speclimits.trace.decode_rounds`: decode phase, a target time)."""
    from speclimits.trace import decode_rounds as usable

    return usable(rounds)[0]


def designed_alpha(rounds: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """α(m), β0(m) with ``level`` intervals from a designed-experiment trace's rounds: per m, OLS of T_T
    on the planted Ū, HC3 SEs (:func:`speclimits.planted.fit_expert_cost`; m = 1: α NaN, with a note)."""
    from speclimits.planted import fit_expert_cost

    d = decode_rounds(rounds)
    if d.empty:
        raise SpeclimitsError("designed experiment: no decode rounds with a target time")
    return fit_expert_cost(pd.DataFrame({"m": d["m"], "u_bar": d["u_bar"], "t_ms": d["t_target_ms"]}), level=level)


def _inverse_variance_mean(values: np.ndarray, se: np.ndarray) -> tuple[float, float]:
    """``(mean, se)``: the inverse-variance weighted mean of ``values`` and its standard error."""
    w = 1.0 / se ** 2
    return float(np.sum(w * values) / w.sum()), float(np.sqrt(1.0 / w.sum()))


def pooled_alpha(fit: pd.DataFrame, m_min: int = 5) -> dict[str, float]:
    """Inverse-variance mean of the identified α(m) at m ≥ ``m_min`` with a normal 95% interval."""
    f = fit[(fit["m"] >= m_min) & np.isfinite(fit["alpha"]) & (fit["alpha_se"] > 0)]
    if f.empty:
        return {"alpha": float("nan"), "lo": float("nan"), "hi": float("nan"), "m_min": m_min}
    a, se = _inverse_variance_mean(f["alpha"].to_numpy(), f["alpha_se"].to_numpy())
    return {"alpha": a, "lo": a - 1.96 * se, "hi": a + 1.96 * se, "m_min": m_min}


def designed_traces() -> dict[int, Path]:
    """The designed-experiment traces of ``data/traces``, by expert width: folders named ``designed-w<width>``."""
    from speclimits.paths import TRACES_DIR

    out = {int(p.name[len("designed-w"):]): p for p in sorted(TRACES_DIR.glob("designed-w*"))
           if (p / "rounds.parquet").exists() and p.name[len("designed-w"):].isdigit()}
    return dict(sorted(out.items()))


def designed_fits(traces: dict[int, Path]) -> pd.DataFrame:
    """:func:`designed_alpha` of every width's trace, stacked with a ``width`` column."""
    from speclimits.trace import read_table

    frames = [designed_alpha(read_table(p, "rounds")).assign(width=w) for w, p in traces.items()]
    if not frames:
        raise SpeclimitsError("no designed-experiment traces (data/traces/designed-w*): run scripts/make_regime.sh")
    return pd.concat(frames, ignore_index=True)


def share_by_width(fits: pd.DataFrame, natural_u: pd.Series, m_values: tuple[int, ...] = (2, 5, 9, 11)) -> pd.DataFrame:
    """Per width and m: the designed line's pass time at the *natural* Ū of m (``natural_u``: mean Ū by m
    of the target's own routing; the twin routes as its source) and its expert share
    ``α(m)·Ū / (β0(m) + α(m)·Ū)``."""
    f = fits[fits["m"].isin(m_values) & np.isfinite(fits["alpha"])].copy()
    f["u_natural"] = f["m"].map(natural_u)
    f["expert_ms"] = f["alpha"] * f["u_natural"]
    f["t_pass_ms"] = f["beta0"] + f["expert_ms"]
    f["expert_share"] = f["expert_ms"] / f["t_pass_ms"]
    return f[["width", "m", "u_natural", "alpha", "alpha_lo", "alpha_hi", "beta0", "t_pass_ms", "expert_share"]]


def regression_alpha(rounds: pd.DataFrame) -> pd.DataFrame:
    """The observational α(m) of the joint categorical model (Eq. 4): per m ``alpha`` with a 95%
    generation-clustered interval and ``identified``."""
    from speclimits.stats import CellMoments, fit_joint

    dec = decode_rounds(rounds)
    joint = fit_joint(CellMoments.from_rounds(dec, base=("u_bar", "context_len")))
    b = joint.by_m
    return pd.DataFrame({"m": b["m"].astype(int), "alpha": b["alpha"],
                         "alpha_lo": b["alpha"] - 1.96 * b["alpha_se"], "alpha_hi": b["alpha"] + 1.96 * b["alpha_se"],
                         "identified": b["identified"]}).reset_index(drop=True)


@dataclass(frozen=True)
class ContextSlope:
    """The context coefficient c of ``T_T = β0 + α·Ū + c·L`` per K and whether it depends on m: ``by_k``
    (``K``, ``m``, ``c``, ``c_se`` in ms/token, ``c_line``), ``flat`` (inverse-variance mean and its
    homogeneity test ``q``, ``df``, ``p``), ``line`` (:func:`slope_line`), ``spread`` (max/min of c) and
    ``spread_line`` (of c over the line)."""

    by_k: pd.DataFrame
    flat: dict[str, float]
    line: dict[str, float]
    spread: float
    spread_line: float


def context_slope(rounds: pd.DataFrame) -> ContextSlope:
    """Per-K fits of ``T_T ~ Ū + L`` and two descriptions of c across K: one constant (the paper's model)
    and a line in m. A positive slope means attention costs per query row (m rows × L keys), as on a
    CPU, rather than one shared read of the KV cache, as on the paper's GPU."""
    from scipy import stats as sps

    from speclimits.stats import CellMoments
    from speclimits.stats.robustness import context_slope_by_k

    dec = decode_rounds(rounds)
    dec = dec[dec["K"] >= 1]
    if dec.empty:
        raise SpeclimitsError("the context slope needs decode rounds with K >= 1")
    by_k = context_slope_by_k(CellMoments.from_rounds(dec, base=("u_bar", "context_len")))
    by_k["m"] = by_k["K"] + 1
    by_k["context_max"] = by_k["K"].map(dec.groupby("K")["context_len"].max()).astype(int)
    if len(by_k) < 3:
        raise SpeclimitsError(f"the context slope needs per-K fits at >= 3 values of K >= 1 with varied contexts "
                              f"(got {len(by_k)})")
    c, se = by_k["c"].to_numpy(), by_k["c_se"].to_numpy()
    mean, mean_se = _inverse_variance_mean(c, se)
    q_flat = float(np.sum(1.0 / se ** 2 * (c - mean) ** 2))
    flat = {"c": mean, "c_se": mean_se, "q": q_flat, "df": len(c) - 1, "p": float(sps.chi2.sf(q_flat, len(c) - 1))}
    # the per-K SEs are the weights; the line's SEs are scaled up (never down) by the residual dispersion
    line = slope_line(by_k)
    by_k["c_line"] = line["c0"] + line["c1"] * by_k["m"]
    ratio = c / by_k["c_line"].to_numpy()
    return ContextSlope(by_k, flat, line, float(c.max() / c.min()), float(ratio.max() / ratio.min()))


#: context lengths planted by :func:`planted_context_prompts` (tokens; the long-context prompts reach ~1,400)
CONTEXT_GRID = (64, 448, 832, 1216)


def planted_context_prompts(source: Path, lengths: tuple[int, ...] = CONTEXT_GRID, n_sources: int = 12,
                            seed: int = 0) -> list[dict[str, Any]]:
    """Prompts of planted lengths for the context-cost experiment: the first ``length`` token ids of
    ``n_sources`` prompts spread over ``source``. Each source is a **block** whose lengths run back to
    back in a seeded order, so the machine's drift is nearly constant within it and
    :func:`designed_context` removes it with one intercept per block. Ids read ``<source>-L<length>``."""
    from speclimits.trace.prompts import read_prompts

    sources = [p for p in read_prompts(source) if p.token_ids is not None]
    sources = sources[::max(1, len(sources) // n_sources)][:n_sources]  # spread over the file's kinds
    if len(sources) < n_sources:
        raise SpeclimitsError(f"{source}: needs {n_sources} prompts given as token ids, found {len(sources)}")
    rng = np.random.default_rng(seed)
    rows = []
    for p in sources:
        if len(p.token_ids) < max(lengths):
            raise SpeclimitsError(f"{source}: prompt {p.id!r} has {len(p.token_ids)} tokens, fewer than the "
                                  f"longest planted context {max(lengths)}")
        rows += [{"id": f"{p.id}-L{n}", "category": f"context-{n}", "prompt_token_ids": list(p.token_ids[:n])}
                 for n in rng.permutation(np.asarray(lengths))]
    return rows


def designed_context(rounds: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """c(m) from the context experiment's trace: per m, OLS of T_T on the context length and the planted
    Ū (both set by design), ``c``, ``c_lo``, ``c_hi`` in ms per token. Where every ``prompt_id`` names a
    block (:func:`planted_context_prompts`) each block gets its own intercept, removing the drift. SEs
    are clustered by generation (its rounds share its length and the machine's state)."""
    import statsmodels.api as sm

    d = decode_rounds(rounds)
    ids = d["prompt_id"].astype(str) if "prompt_id" in d else None
    planted = ids is not None and bool(ids.str.contains(r"-L\d+$").all())  # ids as planted_context_prompts writes
    blocks = ids.str.replace(r"-L\d+$", "", regex=True) if planted else None
    rows = []
    for m, g in d.groupby("m"):
        cols = ["context_len"] + (["u_bar"] if g["u_bar"].nunique() > 1 else [])
        x = g[cols].to_numpy(float)
        if blocks is not None and blocks[g.index].nunique() > 1:  # one intercept per block: the drift removed
            x = np.column_stack([x, pd.get_dummies(blocks[g.index], drop_first=True).to_numpy(float)])
        fit = sm.OLS(g["t_target_ms"].to_numpy(float), sm.add_constant(x)).fit(
            cov_type="cluster", cov_kwds={"groups": g["generation_id"].to_numpy()})
        lo, hi = fit.conf_int(1 - level)[1]
        rows.append({"m": int(m), "K": int(m) - 1, "n": len(g), "generations": int(g["generation_id"].nunique()),
                     "c": float(fit.params[1]), "c_lo": float(lo), "c_hi": float(hi),
                     "c_se": float(fit.bse[1]), "context_min": int(g["context_len"].min()),
                     "context_max": int(g["context_len"].max())})
    return pd.DataFrame(rows)


def slope_line(by_m: pd.DataFrame) -> dict[str, float]:
    """WLS of ``c`` on ``m`` (weights 1/c_se²): ``c0``, ``c1`` with SEs scaled up (never down) by the residual
    dispersion, and the residual test ``q``, ``df``, ``p``."""
    import statsmodels.api as sm
    from scipy import stats as sps

    w = 1.0 / by_m["c_se"].to_numpy() ** 2
    c = by_m["c"].to_numpy()
    wls = sm.WLS(c, sm.add_constant(by_m["m"].to_numpy(float)), weights=w).fit()
    q = float(np.sum(w * (c - wls.fittedvalues) ** 2))
    cov = np.linalg.inv(wls.model.wexog.T @ wls.model.wexog) * max(1.0, q / (len(c) - 2))
    return {"c0": float(wls.params[0]), "c0_se": float(np.sqrt(cov[0, 0])), "c1": float(wls.params[1]),
            "c1_se": float(np.sqrt(cov[1, 1])), "q": q, "df": len(c) - 2, "p": float(sps.chi2.sf(q, len(c) - 2))}


def _cluster_mean(y: np.ndarray, groups: np.ndarray) -> tuple[float, float, float]:
    """Mean of ``y`` with a 95% interval clustered by ``groups`` (statsmodels OLS on a constant)."""
    import statsmodels.api as sm

    fit = sm.OLS(y, np.ones((len(y), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups})
    lo, hi = fit.conf_int()[0]
    return float(fit.params[0]), float(lo), float(hi)


def pass_times(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per m: decode rounds ``n``, mean T_T with a generation-clustered 95% interval (``t_ms``,
    ``t_lo``, ``t_hi``) and mean Ū (``u_bar``)."""
    d = decode_rounds(rounds)
    rows = []
    for m, g in d.groupby("m"):
        mean, lo, hi = _cluster_mean(g["t_target_ms"].to_numpy(float), g["generation_id"].to_numpy())
        rows.append({"m": int(m), "n": len(g), "t_ms": mean, "t_lo": lo, "t_hi": hi, "u_bar": float(g["u_bar"].mean())})
    return pd.DataFrame(rows)


def expert_share(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per identified m: :func:`regression_alpha` and the share of a mean pass it explains,
    ``α(m)·Ū(m) / T_T(m)`` (``share``, ``share_lo``/``share_hi`` from α's interval)."""
    alpha = regression_alpha(rounds)
    passes = pass_times(rounds).set_index("m")
    a = alpha[alpha["identified"]].copy()
    scale = a["m"].map(passes["u_bar"] / passes["t_ms"])
    for col, src in (("share", "alpha"), ("share_lo", "alpha_lo"), ("share_hi", "alpha_hi")):
        a[col] = a[src] * scale
    return a.drop(columns="identified").reset_index(drop=True)


def transfer_error(model: Any, rounds: pd.DataFrame) -> pd.DataFrame:
    """How one machine's cost model prices another's rounds: per m the measured and predicted mean T_T,
    ``ratio`` predicted / measured (generation-clustered 95% interval), ``mape`` per round, and
    ``ratio_rescaled`` after one scale for all m. One factor at every m is a machine's speed; a ratio
    that moves with m is a shape that did not transfer."""
    d = decode_rounds(rounds)
    d = d[d["m"].isin(model.ms)]
    pred = np.asarray(model.target_ms(d["m"].to_numpy(), d["u_bar"].to_numpy(float), d["context_len"].to_numpy(float)))
    meas = d["t_target_ms"].to_numpy(float)
    scale = meas.sum() / pred.sum()
    rows = []
    for m in sorted(d["m"].unique()):
        sel = (d["m"] == m).to_numpy()
        g = d.loc[sel, "generation_id"].to_numpy()
        # the ratio of means, linearised per round about it (a cluster interval on the ratio estimator)
        ratio = pred[sel].mean() / meas[sel].mean()
        _, lo, hi = _cluster_mean(ratio + (pred[sel] - ratio * meas[sel]) / meas[sel].mean(), g)
        rows.append({"m": int(m), "n": int(sel.sum()), "measured_ms": float(meas[sel].mean()),
                     "predicted_ms": float(pred[sel].mean()), "ratio": float(ratio), "ratio_lo": lo, "ratio_hi": hi,
                     "mape": float(np.mean(np.abs(pred[sel] - meas[sel]) / meas[sel])),
                     "ratio_rescaled": float(ratio * scale)})
    return pd.DataFrame(rows).assign(scale=float(scale))


def decision_transfer(source: Any, target_setup: Any, k_max: int | None = None, n_boot: int = 999,
                      seed: int = 0) -> dict[str, Any]:
    """Whether one machine's decisions serve another: the Oracle's policy and best static K under
    ``source``'s cost model, evaluated on ``target_setup``. ``share_of_gain``: the part of the target
    Oracle's gain over its best static K the transferred policy keeps (95% interval over reference
    sequences resampled); ``static_loss``: how much slower the source's best static K is."""
    from speclimits.bootstrap import draw_indices
    from speclimits.oracle import evaluate_policy

    own = target_setup.solve(k_max=k_max)
    moved = target_setup.solve(k_max=k_max, model=source)
    kept = evaluate_policy(own.inputs, target_setup.model, actions=moved.k_star, k_max=own.k_max,
                           deterministic=own.deterministic)["time_ms"].to_numpy(float)
    b, ps = own.bounds, own.per_sequence
    best = ps[f"static_{b.best_static_k}_ms"].to_numpy(float)
    oracle = ps["value_ms"].to_numpy(float)
    draws = draw_indices(len(best), n_boot, seed)
    share = (best[draws].sum(1) - kept[draws].sum(1)) / (best[draws].sum(1) - oracle[draws].sum(1))
    moved_static = moved.bounds.best_static_k
    static_there = b.static_ms[moved_static]
    return {"oracle_ms": b.oracle_ms, "best_static_k": b.best_static_k, "best_static_ms": b.best_static_ms,
            "transferred_policy_ms": float(kept.sum()), "transferred_static_k": int(moved_static),
            "transferred_static_ms": float(static_there),
            "share_of_gain": float((best.sum() - kept.sum()) / (best.sum() - oracle.sum())),
            "share_lo": float(np.quantile(share, 0.025)), "share_hi": float(np.quantile(share, 0.975)),
            "static_loss": float(static_there / b.best_static_ms - 1.0)}


def same_outputs(reference: Path, other: Path) -> tuple[int, int]:
    """``(equal, matched)``: generations of ``reference`` (by K and prompt id) that ``other`` produced with
    the same output tokens (other kernels round differently, so greedy outputs can part)."""
    from speclimits.trace import read_generations

    def outputs(folder: Path) -> dict[tuple[int, str], list[int]]:
        return {(int(g["K"]), str(g["prompt_id"])): list(g.get("output_token_ids") or [])
                for g in read_generations(folder).values()}

    ref, oth = outputs(reference), outputs(other)
    keys = [k for k in ref if k in oth]
    return sum(ref[k] == oth[k] for k in keys), len(keys)


@dataclass(frozen=True)
class MachineComparison:
    """The same sweep measured on several CPUs, by label: recorded ``cpus``; :func:`pass_times` and
    :func:`expert_share` with a ``machine`` column; ``slopes`` (:class:`ContextSlope` or None); fitted cost
    ``models``; ``oracle`` reports (None without Oracle data); the first machine's model and decisions
    carried to the others (``transfer``, ``decisions``, ``outputs``: :func:`same_outputs`); ``notes``."""

    cpus: dict[str, dict[str, Any]]
    passes: pd.DataFrame
    shares: pd.DataFrame
    slopes: dict[str, ContextSlope | None]
    models: dict[str, Any]
    oracle: dict[str, Any]
    transfer: pd.DataFrame
    decisions: dict[str, dict[str, Any]]
    outputs: dict[str, tuple[int, int]]
    notes: tuple[str, ...] = ()


def compare_machines(traces: dict[str, Path], n_boot: int = 99, seed: int = 0) -> MachineComparison:
    """:class:`MachineComparison` of ``traces`` (label -> folder; the first is the reference). What a trace
    cannot give is left out with a note; the Oracle runs up to the longest draft its cost model prices."""
    from speclimits.oracle.prepare import oracle_data_missing, prepare_oracle
    from speclimits.oracle.report import oracle_report
    from speclimits.stats import fit_cost_model
    from speclimits.trace import read_trace

    if len(traces) < 2:
        raise SpeclimitsError(f"a comparison of machines needs two traces or more, got {len(traces)}")
    cpus, passes, shares, slopes, models, oracle, notes = {}, [], [], {}, {}, {}, []
    for label, folder in traces.items():
        tr = read_trace(folder)
        rounds = tr.rounds
        cpus[label] = dict(tr.meta.get("cpu") or {"model": tr.meta.get("hardware", "?")})
        passes.append(pass_times(rounds).assign(machine=label))
        shares.append(expert_share(rounds).assign(machine=label))
        try:
            slopes[label] = context_slope(rounds)
        except SpeclimitsError as exc:
            slopes[label] = None
            notes.append(f"{label}: no context slope ({exc})")
        models[label] = fit_cost_model(rounds, top_k=tr.top_k, source=f"{label}: {tr.path.name}")
        why = oracle_data_missing(Path(folder))
        if why is None:
            setup = prepare_oracle(tr, models[label])
            oracle[label] = oracle_report(tr, n_boot=n_boot, seed=seed, setup=setup, k_max=setup.priced_k_max()[0])
        else:
            oracle[label] = None
            notes.append(f"{label}: no Oracle ({why})")
    first = next(iter(traces))
    others = [label for label in traces if label != first]
    transfer = pd.concat([transfer_error(models[first], read_trace(traces[o]).rounds).assign(machine=o)
                          for o in others], ignore_index=True)
    decisions = {}
    for o in others:
        if oracle[first] is None or oracle[o] is None:
            continue
        target = oracle[o].setup.for_kind(oracle[o].headline_kind)
        k_max = min(oracle[o].result.k_max, max(models[first].ms) - 1)  # what both cost models price
        decisions[o] = decision_transfer(models[first], target, k_max=k_max)
    outputs = {o: same_outputs(traces[first], traces[o]) for o in others}
    return MachineComparison(cpus, pd.concat(passes, ignore_index=True), pd.concat(shares, ignore_index=True),
                             slopes, models, oracle, transfer, decisions, outputs, tuple(notes))


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
    c = sub.add_parser("context-prompts", help="write the context experiment's prompts (planted lengths) as JSONL")
    c.add_argument("source", type=Path, help="token-id prompts at least as long as the longest length")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--lengths", default=",".join(map(str, CONTEXT_GRID)))
    c.add_argument("--sources", type=int, default=12, help="prompts of SOURCE to cut (spread over the file)")
    c.add_argument("--seed", type=int, default=0)
    x = sub.add_parser("context", help="print c(m) of a context-experiment trace and its line in m")
    x.add_argument("trace", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "context-prompts":
        import json

        rows = planted_context_prompts(args.source, tuple(int(n) for n in args.lengths.split(",")),
                                       n_sources=args.sources, seed=args.seed)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} prompts to {args.out}")
    elif args.cmd == "context":
        from speclimits.trace import read_table

        by_m = designed_context(read_table(args.trace, "rounds"))
        print(by_m.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(slope_line(by_m))
    elif args.cmd == "record":
        print(record(args.trace, args.target, args.command))
    else:
        from speclimits.trace import read_table

        fit = designed_alpha(read_table(args.trace, "rounds"))
        print(fit[["m", "n", "u_min", "u_max", "alpha", "alpha_lo", "alpha_hi", "beta0", "t_mean"]]
              .to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
