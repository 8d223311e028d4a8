"""Reader tables of the "Beyond batch 1" section (:mod:`speclimits.stats.batch`,
:mod:`speclimits.oracle.batch`), the batch trace that belongs to a trace, and the key results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.book.present import NOT_IDENTIFIED, Result, fmt_ci, fmt_num, se_ci
from speclimits.costmodel import BatchCostModel
from speclimits.paths import BATCH_TRACES, REPO_ROOT
from speclimits.trace import Trace, read_meta, read_trace


def _model_paths(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    """The target's and the drafter's paths in a trace's ``meta.json``."""
    models = meta.get("models") or {}
    return (models.get("target") or {}).get("path"), (models.get("draft") or {}).get("path")


def measured_batch_trace(trace: Trace, batch_trace: str | Path | None = None) -> Trace | None:
    """The measured batch trace to show beside ``trace``: ``batch_trace`` when given; else, for a measured
    ``trace``, the bundled batch sweep (:data:`~speclimits.paths.BATCH_TRACES`) of the same target and
    drafter; else None."""
    if batch_trace is not None:
        return read_trace(batch_trace)
    if trace.simulated:
        return None
    for path in BATCH_TRACES:
        if (path / "meta.json").exists() and _model_paths(read_meta(path)) == _model_paths(trace.meta):
            return read_trace(path)
    return None


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return Path(path).name


def describe_batch_trace(bt: Trace | None) -> str:
    if bt is None:
        return ("no measured batch trace for this trace's model pair: the measured part of this section is skipped "
                "(trace one with `speclimits trace --batch 1,2,4,8,16`, see scripts/make_batch_trace.sh)")
    sweep = bt.meta.get("sweep") or {}
    return (f"batch trace `{_rel(bt.path)}`: {bt.source_label}; batch sizes {bt.batch_sizes}, K = "
            f"{bt.meta.get('k_values')}, {sweep.get('max_tokens', '?')} tokens per request, "
            f"{len(bt.steps) if bt.steps is not None else 0:,} engine steps, {len(bt.rounds):,} request rounds")


# -- the cost model --------------------------------------------------------------------------------------

_NAMES = {"beta0": "β0(m), ms", "gamma": "γ(m), ms per extra request", "alpha": "α(m), ms per unique expert",
          "c": "c, ms per context token", "a": "a, ms per draft step", "b": "b, ms per drafter call",
          "a_req": "a_req, ms per draft step per extra request", "b_req": "b_req, ms per call per extra request"}


def coefficients(table: pd.DataFrame, truth: BatchCostModel | None = None) -> pd.DataFrame:
    """Fitted coefficients with their 95% intervals (``coefficient_table``), one row per coefficient;
    with ``truth`` (a simulator's planted model) the planted value and whether the interval covers it."""
    rows = []
    for r in table.itertuples(index=False):
        row = {"coefficient": _NAMES.get(r.name, r.name), "m": "" if pd.isna(r.m) else int(r.m),
               "estimate [95% CI]": fmt_ci(r.estimate, r.lower, r.upper)}
        if truth is not None:
            v = _planted(truth, r)
            row["planted"] = fmt_num(v)
            row["covered"] = "yes" if r.lower <= v <= r.upper else "no"
        rows.append(row)
    return pd.DataFrame(rows)


def _planted(truth: BatchCostModel, row: Any) -> float:
    """The planted value of a ``coefficient_table`` row (name, m)."""
    base, name, m = truth.base, row.name, None if pd.isna(row.m) else int(row.m)
    return {"beta0": lambda: base.beta0[m], "alpha": lambda: base.alpha[m], "gamma": lambda: truth.gamma[m],
            "c": lambda: base.c, "a": lambda: base.a, "b": lambda: base.b, "a_req": lambda: truth.a_req,
            "b_req": lambda: truth.b_req}[name]()


def coverage(table: pd.DataFrame, truth: BatchCostModel) -> tuple[int, int]:
    """(covered, total): planted coefficients inside their fitted 95% intervals."""
    hits = [r.lower <= _planted(truth, r) <= r.upper for r in table.itertuples(index=False)]
    return int(sum(hits)), len(hits)


# -- validation per (b, K) -----------------------------------------------------------------------------


def validation(val: pd.DataFrame) -> pd.DataFrame:
    """The (b, K) validation table: measured ms per token, cross-fitted prediction and its error, the
    in-sample error, and the share of time in steps the model does not price."""
    return pd.DataFrame({
        "b": val["b"].astype(int), "K": val["K"].astype(int), "batches": val["n_batches"].astype(int),
        "measured ms/token": val["ms_per_token"], "predicted (cross-fitted)": val["pred_cross"],
        "error, %": val["err_cross_pct"], "in-sample error, %": val["err_model_pct"],
        "time not modelled, %": 100 * val["unmodelled_share"],
    })


def time_grid(val: pd.DataFrame) -> pd.DataFrame:
    """Measured ms per token as a b × K grid (rows b, columns K)."""
    grid = val.pivot(index="b", columns="K", values="ms_per_token")
    grid.columns = [f"K = {k}" for k in grid.columns]
    return grid.reset_index()


def time_frame(val: pd.DataFrame) -> pd.DataFrame:
    """Long frame for :func:`speclimits.figures.batch.batch_time_per_token`."""
    return pd.DataFrame({"b": val["b"].astype(int), "K": val["K"].astype(int),
                         "measured_ms_per_token": val["ms_per_token"], "predicted_ms_per_token": val["pred_cross"]})


def frontier(front: pd.DataFrame) -> pd.DataFrame:
    """Where each K stops paying: the first b at which it no longer beats plain decoding, and its
    speedup over plain at each b."""
    out = pd.DataFrame({"K": front["K"].astype(int),
                        "stops paying at b": [("never (up to the largest b)" if pd.isna(v) else str(int(v)))
                                              for v in front["b_stop"]]})
    for col in [c for c in front.columns if c.startswith("speedup_b")]:
        out[f"speedup, b = {col.removeprefix('speedup_b')}"] = front[col]
    return out


def frontier_phrase(front: pd.DataFrame) -> str:
    stops = front.dropna(subset=["b_stop"])
    if stops.empty:
        return "every K ≥ 1 beats plain decoding at every batch size measured"
    parts = [f"K = {int(r.K)} at b = {int(r.b_stop)}" for r in stops.itertuples()]
    never = front.loc[front["b_stop"].isna(), "K"].astype(int).tolist()
    tail = f"; K = {', '.join(map(str, never))} pay at every b" if never else ""
    return "speculation stops paying for " + ", ".join(parts) + tail


# -- unique experts of a step ----------------------------------------------------------------------------


def union_points(union: Any) -> pd.DataFrame:
    """Per uniform decode step: tokens, measured Ū of the step and batch size (for the chart)."""
    s = union.steps
    return pd.DataFrame({"n_tokens": s["n_tokens"], "u_step": s["u_measured"], "b": s["b"]})


def union_summary(union: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(shown, full)``: Ū of a step per (b, K) against independent routing and the saturation curve;
    ``shown`` keeps b > 1 and every other K (``full`` every cell)."""
    t = union.by_batch_k
    full = pd.DataFrame({
        "b": t["b"].astype(int), "K": t["K"].astype(int), "steps": t["n_steps"].astype(int),
        "Ū measured": t["u_measured"], "Ū independent union": t["u_independent"],
        "Ū uniform saturation": t["u_saturation"],
        "measured / independent": [se_ci(r, s) for r, s in zip(t["ratio_independent"], t["ratio_independent_se"])],
        "measured / saturation": t["ratio_saturation"],
    })
    ks = sorted(full["K"].unique())[::2]
    shown = full.loc[(full["b"] > 1) & full["K"].isin(ks)].reset_index(drop=True)
    return shown, full


def union_phrase(union: Any) -> str:
    t = union.by_batch_k.loc[union.by_batch_k["b"] > 1]
    if t.empty:
        return ""
    r = t["ratio_independent"]
    s = t["ratio_saturation"]
    return (f"**Shared experts.** At b > 1 a step touches {100 * (1 - r.max()):.0f}–{100 * (1 - r.min()):.0f}% fewer "
            f"unique experts than independent routing of its requests would ({r.mean():.2f} of it on average), and "
            f"{s.min():.2f}–{s.max():.2f} of the uniform saturation curve: the requests of a batch route to overlapping "
            "experts. The bound below prices a step's expert term α(m)·Ū with the independent union, an over-estimate "
            "of the measured Ū by that share (the batch cost model itself is fitted on the measured Ū).")


# -- the bound ---------------------------------------------------------------------------------------------


def bounds(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(shown, full)``, one row per b: plain, best static K, best table, the bound, the exact Oracle
    (b ≤ 2), gains; ``full`` adds the tables themselves and how each was evaluated."""
    full = pd.DataFrame({
        "b": frame["b"].astype(int),
        "plain ms/token": frame["plain_ms_per_token"],
        "best static K": frame["best_static_k"].astype(int),
        "best static ms/token": frame["best_static_ms_per_token"],
        "best table (K for n = 1..b active)": frame["table"],
        "table ms/token": frame["table_ms_per_token"],
        "exact Oracle ms/token": frame["exact_ms_per_token"],
        "bound ms/token": frame["bound_ms_per_token"],
        "bound gain over best static": frame["gain_static"],
        "bound gain over table": frame["gain_table"],
        "slack of the bound vs exact": [("" if v is None or pd.isna(v) else f"{100 * v:+.1f}%") for v in frame["slack"]],
        "evaluation": frame["evaluation"],
    })
    shown = pd.DataFrame({
        "b": full["b"], "plain": full["plain ms/token"],
        "static": [f"{v:.3f} (K = {k})" for v, k in zip(full["best static ms/token"], full["best static K"])],
        "table": full["table ms/token"], "exact": full["exact Oracle ms/token"], "bound": full["bound ms/token"],
        "gain / static": full["bound gain over best static"], "gain / table": full["bound gain over table"],
        "slack": full["slack of the bound vs exact"],
    })
    return shown, full


def bounds_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Speedups over plain decoding per b, long, for :func:`speclimits.figures.batch.batch_bounds`."""
    rows = []
    for r in frame.itertuples(index=False):
        plain = r.plain_ms_per_token
        for what, v in (("bound (relaxation)", r.bound_ms_per_token), ("best static K", r.best_static_ms_per_token),
                        ("best batch→K table", r.table_ms_per_token), ("exact Oracle (b = 2)",
                                                                       r.exact_ms_per_token if r.b == 2 else None)):
            if v is not None and pd.notna(v) and plain is not None and pd.notna(plain):
                rows.append({"b": int(r.b), "what": what, "speedup": plain / v})
    return pd.DataFrame(rows)


def oracle_world(frame: pd.DataFrame, val: pd.DataFrame) -> pd.DataFrame:
    """Each static K at each b in the Oracle's world (the batch cost model on the greedy references)
    beside the measured batch sweep on the same prompts, and the difference in %."""
    rows = []
    for r in val.itertuples(index=False):
        col = f"static_{int(r.K)}_ms_per_token"
        hit = frame.loc[frame["b"] == r.b]
        if hit.empty or col not in hit:
            continue
        model = float(hit[col].iloc[0])
        rows.append({"b": int(r.b), "K": int(r.K), "measured ms/token": r.ms_per_token,
                     "Oracle's world ms/token": model, "difference, %": 100 * (model / r.ms_per_token - 1)})
    return pd.DataFrame(rows)


# -- key results -----------------------------------------------------------------------------------------


def key_rows(*, val: pd.DataFrame | None, worst: dict[str, Any] | None, front: pd.DataFrame | None,
             rep: pd.DataFrame | None,
             frame: pd.DataFrame | None, world: pd.DataFrame | None, sim_cov: tuple[int, int],
             sim_worst: dict[str, Any], sim_front: pd.DataFrame, measured: bool) -> list[Result]:
    """The section's key results; ``frame`` None: the trace gives no bound at batch b (no Oracle data)."""
    rows: list[Result] = []
    if val is not None and worst is not None:
        rows.append(Result("Batch cost model, worst (b, K) error in time per token (cross-fitted, measured)",
                           f"{worst['error_pct']:+.1f}% at b = {worst['b']}, K = {worst['K']}",
                           ref="tbl-batch-validation"))
        within = int((val["err_cross_pct"].abs() <= 5).sum())
        rows.append(Result("(b, K) cells within 5% (measured)", f"{within} of {len(val)}", ref="tbl-batch-validation"))
    if rep is not None:
        rows.append(Result("Run-to-run difference of a (b, K) cell (two passes, measured)",
                           f"{rep['repeat − this, %'].abs().median():.1f}% median, "
                           f"{rep['repeat − this, %'].abs().max():.0f}% largest", ref="tbl-batch-repeat"))
    if front is not None:
        rows.append(Result("Where speculation stops paying (measured, this pass)", frontier_phrase(front),
                           ref="tbl-batch-frontier"))
    if world is not None and len(world):
        w = world["difference, %"].abs()
        rows.append(Result("Oracle's world against the measured batch sweep, static K", f"within ±{w.max():.1f}%",
                           ref="tbl-batch-world"))
    if frame is None:
        rows.append(Result("Bound's gain over the best static K / the best table", NOT_IDENTIFIED))
        frame = pd.DataFrame({"b": []})
    for r in frame.itertuples(index=False):
        if int(r.b) in (2, int(frame["b"].max())):
            rows.append(Result(f"Bound's gain over the best static K / the best table, b = {int(r.b)}"
                               + ("" if measured else " (SIMULATED)"),
                               f"{r.gain_static:.3f}× / {r.gain_table:.3f}×", ref="tbl-batch-bounds"))
    pair = frame.loc[frame["b"] == 2]
    if len(pair) and pd.notna(pair["exact_ms_per_token"].iloc[0]):
        r = pair.iloc[0]
        rows.append(Result("Exact Oracle's gain over the best static K, b = 2",
                           f"{r.best_static_ms_per_token / r.exact_ms_per_token:.3f}×", ref="tbl-batch-bounds"))
    if len(pair) and pd.notna(pair["slack"].iloc[0]):
        rows.append(Result("Slack of the relaxation against the exact b = 2 Oracle", f"{100 * pair['slack'].iloc[0]:.1f}%",
                           ref="tbl-batch-bounds"))
    rows.append(Result("Planted batch truth recovered (SIMULATED, paper scale)",
                       f"{sim_cov[0]} of {sim_cov[1]} coefficients inside their 95% intervals", ref="tbl-batch-sim-coef"))
    rows.append(Result("Batch cost model, worst (b, K) error (SIMULATED)", f"{sim_worst['error_pct']:+.2f}%"))
    rows.append(Result("Where speculation stops paying (SIMULATED, planted per-request terms)",
                       frontier_phrase(sim_front)))
    return rows


# -- run-to-run variation -----------------------------------------------------------------------------------

REPEAT_FILE = "repeat-pass.json"


def read_repeat(bt: Trace | None) -> dict[str, Any] | None:
    """The batch trace's ``repeat-pass.json`` (a second pass of the same sweep, summarised), or None."""
    if bt is None or not (Path(bt.path) / REPEAT_FILE).exists():
        return None
    from speclimits.jsonutil import read_json

    return read_json(Path(bt.path) / REPEAT_FILE, "repeat pass", ValueError)


def repeat_table(val: pd.DataFrame, repeat: dict[str, Any]) -> pd.DataFrame:
    """Per (b, K): ms per token in the committed pass and in the repeat, their difference, and the
    model's cross-fitted error in each pass."""
    rep = pd.DataFrame(repeat["cells"])
    m = val[["b", "K", "ms_per_token", "err_cross_pct"]].merge(rep, on=["b", "K"], suffixes=("", "_rep"))
    return pd.DataFrame({"b": m["b"].astype(int), "K": m["K"].astype(int), "ms/token, this trace": m["ms_per_token"],
                         "ms/token, repeat": m["ms_per_token_rep"],
                         "repeat − this, %": 100 * (m["ms_per_token_rep"] / m["ms_per_token"] - 1),
                         "model error, this, %": m["err_cross_pct"], "model error, repeat, %": m["err_cross_pct_rep"]})


def repeat_phrase(table: pd.DataFrame) -> str:
    d = table["repeat − this, %"].abs()
    e = pd.concat([table["model error, this, %"], table["model error, repeat, %"]]).abs()
    return (f"the same (b, K) cell measured twice differs by {d.median():.1f}% (median; up to {d.max():.0f}%), "
            f"while the model's cross-fitted error within a pass is {e.median():.1f}% (median; up to {e.max():.0f}%)")


# -- verdicts --------------------------------------------------------------------------------------------


def measured_verdict(val: pd.DataFrame, worst: dict[str, Any], front: pd.DataFrame, rep: pd.DataFrame | None) -> str:
    """The measured part in a paragraph: the model's errors, where K stops paying, and whether the
    repeat pass agrees."""
    within = int((val["err_cross_pct"].abs() <= 5).sum())
    best = val.loc[val.groupby("b")["ms_per_token"].idxmin(), ["b", "K"]]
    text = (f"**Measured verdict.** The batch cost model's worst cross-fitted (b, K) error is "
            f"{worst['error_pct']:+.1f}% (b = {worst['b']}, K = {worst['K']}); {within} of {len(val)} cells are within "
            f"5%. In this pass {frontier_phrase(front)}; the best static K per b is "
            + ", ".join(f"{int(r.K)} (b = {int(r.b)})" for r in best.itertuples()) + ".")
    if rep is not None:
        rb = rep.loc[rep.groupby("b")["ms/token, repeat"].idxmin(), ["b", "K"]]
        agree = int((best["K"].to_numpy() == rb["K"].to_numpy()).sum())
        lo_b, hi_b = int(val["b"].min()), int(val["b"].max())

        def fall(t: pd.DataFrame, col: str) -> pd.Series:  # time per token at the smallest b over the largest
            return t.loc[t["b"] == lo_b].set_index("K")[col] / t.loc[t["b"] == hi_b].set_index("K")[col]

        both = pd.concat([fall(val, "ms_per_token"), fall(rep, "ms/token, repeat")])
        text += (f" The repeat pass names the same best K at {agree} of {len(best)} batch sizes ("
                 + ", ".join(f"{int(r.K)}" for r in rb.itertuples()) + f"): {repeat_phrase(rep)}. On this machine "
                 "the differences between K at a given b are mostly inside the run-to-run noise; what holds in both "
                 f"passes is the effect of b itself: time per token falls {both.min():.1f}–{both.max():.1f}-fold from "
                 f"b = {lo_b} to b = {hi_b}, at every K.")
    return text


def bound_verdict(frame: pd.DataFrame) -> str:
    """The bound in a paragraph: the exact pair Oracle's gain, the relaxation's slack, the gain bounds per b."""
    parts = []
    pair = frame.loc[frame["b"] == 2]
    if len(pair) and pd.notna(pair["exact_ms_per_token"].iloc[0]):
        r = pair.iloc[0]
        parts.append(f"At b = 2 the exact Oracle is {r.best_static_ms_per_token / r.exact_ms_per_token:.3f}× faster "
                     f"than the best static K (K = {int(r.best_static_k)}) and the relaxation bound "
                     f"{r.gain_static:.3f}× (the relaxation's slack: {100 * r.slack:.1f}%)")
    big = frame.loc[frame["b"] > 2]
    if len(big):
        parts.append("for larger b the bound caps any policy's gain over the best static K at "
                     + ", ".join(f"{r.gain_static:.2f}× (b = {int(r.b)})" for r in big.itertuples())
                     + " (upper limits: at b = 2 the relaxation is looser than the exact Oracle by the slack above, and "
                     "it is not measured at larger b)")
    gain_table = (frame["best_static_ms_per_token"] / frame["table_ms_per_token"])
    parts.append(f"the best batch-size→K table found in hindsight is at most {100 * (gain_table.max() - 1):.1f}% faster "
                 "than the best static K at any b: on these references a table keyed by the number of active "
                 "requests adds little")
    return "**The bound.** " + "; ".join(parts) + "."
