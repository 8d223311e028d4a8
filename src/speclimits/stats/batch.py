"""The cost model at batch > 1 (:class:`speclimits.costmodel.BatchCostModel`): fit, validation by (b, K),
the union of a step's experts, and where speculation stops paying.

Each part is fitted by OLS (statsmodels) on a batch trace's **uniform decode steps** (``steps`` table;
every request decoding at the same m), SEs clustered by batch, zero timings left out of that part. At
n = 1 it is the batch-1 model (its alpha(1) convention included); with b = 1 only, ``gamma``, ``a_req``
and ``b_req`` are set to 0 (noted). Prefill, mixed and non-uniform steps are not modelled:
:func:`validate_by_batch_k` counts them as measured on both sides and reports their share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.sandwich_covariance import cov_cluster

from speclimits.costmodel import BatchCostModel, CostModel, saturation_curve
from speclimits.errors import CostModelError, SpeclimitsError
from speclimits.stats.costfit import alpha_donor, m1_convention
from speclimits.trace import Trace, read_trace

STEP_COLUMNS = ("batch_id", "b", "K", "step", "n_reqs", "n_decode", "n_tokens", "m_max", "u_bar", "context_total",
                "t_target_ms", "t_draft_ms", "phase", "n_drafted_next")

BATCH1_NOTE = ("m = {m}: alpha({m}) := alpha({donor}) = {alpha:.4g}, beta0({m}) = intercept({m}) - alpha({m}) * {tk:g}: "
               "u_bar does not vary beyond what n explains at this m (every step has the same Ū, as at batch 1 "
               "where an m = 1 pass touches top_k experts), so alpha({m}) is not identified from the data")


def trace_steps(trace: Trace | str | Path) -> pd.DataFrame:
    """The ``steps`` table of a batch trace; :class:`SpeclimitsError` naming the trace when it has none."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    steps = tr.steps
    if steps is None:
        raise SpeclimitsError(
            f"trace {tr.path} has no steps table (steps.parquet): it is not a batch trace "
            f"(meta batch_size {tr.meta.get('batch_size', 1)}). Trace one with --batch, e.g. "
            "`speclimits trace --batch 1,2,4,8,16 ...` or `speclimits simulate --batch 1,2,4,8,16 ...`; "
            "the cost model of a batch-1 trace is `speclimits fit TRACE`")
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise SpeclimitsError(f"trace {tr.path}: steps table lacks column(s) {missing}")
    return steps


def _batch_trace(trace: Trace | str | Path) -> tuple[Trace, pd.DataFrame, pd.DataFrame | None, int, int]:
    """The trace, its steps, its rounds where they join the steps (else None), meta's ``n_experts``, ``top_k``."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    steps = trace_steps(tr)
    n_experts = ((tr.meta.get("models") or {}).get("target") or {}).get("n_experts")
    if n_experts is None or tr.top_k is None:
        raise SpeclimitsError(f"trace {tr.path}: meta.json lacks models.target.n_experts / top_k "
                              "(the union of a step's experts needs both)")
    rounds = tr.rounds if {"batch_id", "step"} <= set(tr.rounds.columns) else None
    return tr, steps, rounds, int(n_experts), int(tr.top_k)


def uniform_decode_steps(steps: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """The steps the batch cost model is fitted on: phase ``'decode'`` with every request at the same m
    (with ``rounds``: the step's ``n_reqs`` decode rows all at ``m_max``; without: ``n_tokens == n_reqs *
    m_max``), plus ``m = m_max``, ``n = n_reqs``, ``k = n_drafted_next / n_reqs``. Zero timings are kept."""
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise SpeclimitsError(f"steps table lacks column(s) {missing}")
    keep = (steps["phase"].astype(str).to_numpy() == "decode") & (steps["n_decode"].to_numpy() == steps["n_reqs"].to_numpy())
    if rounds is not None:
        for col in ("batch_id", "step", "m", "phase"):
            if col not in rounds.columns:
                raise SpeclimitsError(f"rounds table lacks column {col!r} (a batch trace's rounds have batch_id and step)")
        dec = rounds.loc[rounds["phase"].astype(str) == "decode", ["batch_id", "step", "m"]]
        g = dec.groupby(["batch_id", "step"])["m"].agg(["min", "max", "size"])
        key = pd.MultiIndex.from_arrays([steps["batch_id"].to_numpy(), steps["step"].to_numpy()])
        agg = g.reindex(key)
        same = ((agg["min"].to_numpy() == steps["m_max"].to_numpy()) & (agg["max"].to_numpy() == steps["m_max"].to_numpy())
                & (agg["size"].to_numpy() == steps["n_reqs"].to_numpy()))
        keep &= np.nan_to_num(same.astype(float), nan=0.0).astype(bool)
    else:
        keep &= steps["n_tokens"].to_numpy() == steps["n_reqs"].to_numpy() * steps["m_max"].to_numpy()
    out = steps.loc[keep].reset_index(drop=True).copy()
    out["m"] = out["m_max"].astype(np.int64)
    out["n"] = out["n_reqs"].astype(np.int64)
    out["k"] = out["n_drafted_next"].to_numpy(dtype=float) / out["n_reqs"].to_numpy(dtype=float)
    return out


#: Covariances :func:`fit_batch_steps` can put behind its intervals.
COV_TYPES = ("jackknife", "cr1")


@dataclass(frozen=True)
class _Fit:
    """One OLS: estimates, the covariance behind the intervals (``cov``) and statsmodels' CR1 (``cov_cr1``)."""

    params: pd.Series
    cov: pd.DataFrame
    cov_cr1: pd.DataFrame
    q: float
    nobs: int
    n_clusters: int
    rsquared: float
    cov_type: str

    def var(self, name: str) -> tuple[float, float]:
        return self.cov.loc[name, name], self.cov_cr1.loc[name, name]


def _ols(y: np.ndarray, x: pd.DataFrame, groups: np.ndarray, cov_type: str = "jackknife") -> _Fit:
    """statsmodels OLS clustered by ``groups`` (batches): CR1 as ``cov_cr1``; behind the intervals the
    cluster jackknife (CV3, default) or CR1."""
    if cov_type not in COV_TYPES:
        raise SpeclimitsError(f"cov_type must be one of {COV_TYPES}, got {cov_type!r}")
    codes = pd.factorize(groups, sort=True)[0]
    if codes.max() < 1:
        raise SpeclimitsError("clustered standard errors need at least two clusters (batches) in the fitted steps")
    res = sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    n_clusters = int(codes.max()) + 1
    cr1 = res.cov_params()
    cov, label = cr1, "cluster-robust CR1 (statsmodels)"
    if cov_type == "jackknife":
        try:
            cov = pd.DataFrame(cov_cluster(res, codes, crv_type="cluster-crv3"), index=x.columns, columns=x.columns)
            label = "cluster jackknife CV3"
        except ValueError:  # leaving some cluster out leaves the design rank-deficient
            label = "cluster-robust CR1 (statsmodels; the jackknife was singular: some cluster is needed to identify a coefficient)"
    q = float(sps.t.interval(0.95, max(n_clusters - 1, 1))[1])
    return _Fit(res.params, cov, cr1, q, int(res.nobs), n_clusters, float(res.rsquared), label)


def _put(out: dict[str, Any], res: _Fit, name: str, est: float, var: tuple[float, float] | None,
         m: int | None = None) -> None:
    """Record one coefficient: ``out[name]`` (``[m]``) and its ``se``, ``se_cr1``, 95% ``ci`` at
    ``out[kind][name]`` (``[str(m)]``) from ``var`` (its two variances; None: set by a convention)."""
    se = None if var is None else math.sqrt(max(float(var[0]), 0.0))
    values = (None,) * 3 if var is None else (se, math.sqrt(max(float(var[1]), 0.0)),
                                              [float(est) - res.q * se, float(est) + res.q * se])
    for kind, v in zip(("se", "se_cr1", "ci"), values):
        (out[kind] if m is None else out[kind][name])[name if m is None else str(m)] = v
    (out if m is None else out[name])[name if m is None else m] = float(est)


def _fit_info(res: _Fit, notes: list[str]) -> dict[str, Any]:
    return {"notes": notes, "n_steps": res.nobs, "n_clusters": res.n_clusters, "r2": res.rsquared,
            "t_quantile": res.q, "cov_type": res.cov_type}


def _varies(v: np.ndarray, rel: float = 1e-10) -> bool:
    return bool(v.size > 1 and np.var(v) > rel * max(1.0, float(np.mean(v)) ** 2))


def _residual_varies(u: np.ndarray, n1: np.ndarray) -> bool:
    """Whether Ū varies beyond what an intercept and (n - 1) explain (alpha identified next to gamma)."""
    x = np.column_stack([np.ones(len(u)), n1]) if _varies(n1) else np.ones((len(u), 1))
    resid = u - x @ np.linalg.lstsq(x, u, rcond=None)[0]
    return bool(np.var(resid) > 1e-10 * max(1.0, float(np.mean(u)) ** 2))


def _fit_target(df: pd.DataFrame, top_k: int, cov_type: str) -> dict[str, Any]:
    """Target part: one OLS with beta0, gamma, alpha per m and a shared c."""
    if df.empty:
        raise SpeclimitsError("no uniform decode steps with a non-zero target time to fit")
    m = df["m"].to_numpy()
    n1 = df["n"].to_numpy(dtype=float) - 1.0
    u = df["u_bar"].to_numpy(dtype=float)
    ms = sorted(int(v) for v in np.unique(m))
    cols: dict[str, np.ndarray] = {}
    gamma_id, alpha_id = {}, {}
    for mv in ms:
        sel = (m == mv).astype(float)
        cols[f"beta0[{mv}]"] = sel
        gamma_id[mv] = _varies(n1[m == mv])
        if gamma_id[mv]:
            cols[f"gamma[{mv}]"] = sel * n1
        alpha_id[mv] = _residual_varies(u[m == mv], n1[m == mv])
        if alpha_id[mv]:
            cols[f"alpha[{mv}]"] = sel * u
    cols["c"] = df["context_total"].to_numpy(dtype=float)
    ident = [mv for mv in ms if alpha_id[mv]]
    if not ident:
        raise SpeclimitsError("alpha is not identified at any m (the step's Ū is constant everywhere)")
    res = _ols(df["t_target_ms"].to_numpy(dtype=float), pd.DataFrame(cols), df["batch_id"].to_numpy(), cov_type)
    p, notes = res.params, []
    names = ("beta0", "alpha", "gamma")
    out: dict[str, Any] = {n: {} for n in names}
    out.update({kind: {n: {} for n in names} for kind in ("ci", "se", "se_cr1")})
    for mv in ms:
        a_name, b_name = f"alpha[{mv}]", f"beta0[{mv}]"
        if alpha_id[mv]:
            _put(out, res, "alpha", p[a_name], res.var(a_name), mv)
            _put(out, res, "beta0", p[b_name], res.var(b_name), mv)
        else:  # the batch-1 convention (costfit.m1_convention)
            donor, tk = alpha_donor((mv,), [(v,) for v in ident])[0], float(top_k)
            (alpha, a_var, beta0, b_var), (_, a_cr1, _, b_cr1) = (
                m1_convention(p, cov, b_name, f"alpha[{donor}]", tk) for cov in (res.cov, res.cov_cr1))
            _put(out, res, "alpha", alpha, (a_var, a_cr1), mv)
            _put(out, res, "beta0", beta0, (b_var, b_cr1), mv)
            notes.append(BATCH1_NOTE.format(m=mv, donor=donor, alpha=alpha, tk=tk))
            u_obs = float(u[m == mv].mean())
            if abs(u_obs - tk) > 1e-6:
                notes.append(f"m = {mv}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
        g_name = f"gamma[{mv}]"
        _put(out, res, "gamma", p[g_name] if gamma_id[mv] else 0.0, res.var(g_name) if gamma_id[mv] else None, mv)
        if not gamma_id[mv]:
            notes.append(f"m = {mv}: gamma({mv}) := 0, not identified: every fitted step at this m has n = 1 "
                         "(the batch-1 form)")
    _put(out, res, "c", p["c"], res.var("c"))
    out["identified"] = {"alpha": {str(k): bool(v) for k, v in alpha_id.items()},
                         "gamma": {str(k): bool(v) for k, v in gamma_id.items()}}
    return {**out, **_fit_info(res, notes)}


def _fit_draft(df: pd.DataFrame, cov_type: str) -> dict[str, Any]:
    """Drafter part: ``t_draft ~ b + a k + b_req (n - 1) + a_req (n - 1) k`` on steps with K > 0."""
    if df.empty:
        raise SpeclimitsError("no uniform decode steps with K > 0 and a non-zero draft time: the drafter line "
                              "needs a trace with K > 0")
    k = df["k"].to_numpy(dtype=float)
    n1 = df["n"].to_numpy(dtype=float) - 1.0
    if not _varies(k):
        raise SpeclimitsError(f"the drafter line needs at least two K > 0 values (the steps have k = {k[0]:g} only)")
    cols = {"b": np.ones(len(df)), "a": k}
    per_req = _varies(n1)
    if per_req:
        cols.update({"b_req": n1, "a_req": n1 * k})
    res = _ols(df["t_draft_ms"].to_numpy(dtype=float), pd.DataFrame(cols), df["batch_id"].to_numpy(), cov_type)
    out: dict[str, Any] = {"ci": {}, "se": {}, "se_cr1": {}}
    for name in ("a", "b", "a_req", "b_req"):
        fitted = name in res.params.index
        _put(out, res, name, res.params[name] if fitted else 0.0, res.var(name) if fitted else None)
    notes = [] if per_req else ["a_req, b_req := 0, not identified: every fitted step has n = 1 (the batch-1 form)"]
    return {**out, **_fit_info(res, notes)}


def fit_batch_steps(steps: pd.DataFrame, rounds: pd.DataFrame | None = None, *, n_experts: int, top_k: int,
                    batch_sizes: Sequence[int] | None = None, cov_type: str = "jackknife",
                    source: str = "") -> BatchCostModel:
    """:func:`fit_batch_cost_model` on tables: ``steps`` (and ``rounds`` for the uniformity check)."""
    uni = uniform_decode_steps(steps, rounds)
    if batch_sizes is not None:
        uni = uni.loc[uni["b"].isin([int(b) for b in batch_sizes])].reset_index(drop=True)
    n_zero_t = int((uni["t_target_ms"] <= 0).sum())
    tgt = _fit_target(uni.loc[uni["t_target_ms"] > 0].reset_index(drop=True), top_k, cov_type)
    with_draft = uni.loc[(uni["K"] > 0) & (uni["k"] > 0)]
    n_zero_d = int((with_draft["t_draft_ms"] <= 0).sum())
    drf = _fit_draft(with_draft.loc[with_draft["t_draft_ms"] > 0].reset_index(drop=True), cov_type)
    base = CostModel(c=tgt["c"], beta0=tgt["beta0"], alpha=tgt["alpha"], a=drf["a"], b=drf["b"],
                     source=source or "speclimits fit --batch: batch cost model on the uniform decode steps")

    def record(part: dict[str, Any], n_zero: int) -> dict[str, Any]:
        return {"n_steps": part["n_steps"], "n_clusters": part["n_clusters"], "r2": part["r2"],
                "n_zero_timing_excluded": n_zero, "ci95": part["ci"], "se": part["se"], "se_cr1": part["se_cr1"],
                "cov_type": part["cov_type"], "t_quantile": part["t_quantile"]}

    fit = {
        "target": {**record(tgt, n_zero_t), "identified": tgt["identified"]},
        "draft": record(drf, n_zero_d),
        "n_steps_total": int(len(steps)), "n_uniform_decode": int(len(uni)),
        "batch_sizes": sorted(int(b) for b in uni["b"].unique()),
        "clusters": "batch_id",
        "notes": tgt["notes"] + drf["notes"] + [
            "fitted on uniform decode steps (every request decoding at the same m); prefill, mixed and "
            "non-uniform steps are not covered by the model",
            "OLS (statsmodels); 95% intervals from the " + tgt["cov_type"] + " covariance by batch_id, t(G - 1)"
            "; se_cr1: statsmodels' cluster-robust standard errors (what the batch-1 fit reports)"],
    }
    return BatchCostModel(base=base, gamma=tgt["gamma"], a_req=drf["a_req"], b_req=drf["b_req"],
                          n_experts=int(n_experts), top_k=int(top_k), extra={"fit": fit})


def fit_batch_cost_model(trace: Trace | str | Path, *, batch_sizes: Sequence[int] | None = None,
                         cov_type: str = "jackknife") -> BatchCostModel:
    """Fit the :class:`~speclimits.costmodel.BatchCostModel` of a batch trace (``batch_sizes``: those b only).

    ``extra["fit"]`` (the JSON's ``batch.fit``) holds every coefficient's 95% interval (``ci95``) and SEs
    (null where set by a convention), what was identified, the steps, clusters, R² and notes.

    **Intervals.** ``cov_type="jackknife"`` (default): the cluster jackknife (CV3, leave one batch out),
    t(G - 1). statsmodels' CR1 (``se_cr1``; ``cov_type="cr1"``) is too small here: gamma(m) rests mostly on
    the few large batches, high-leverage clusters whose residuals OLS shrinks (on the simulator the
    estimates spread 1.2-1.35x the mean CR1 SE).
    """
    tr, steps, rounds, n_experts, top_k = _batch_trace(trace)
    return fit_batch_steps(steps, rounds, n_experts=n_experts, top_k=top_k,
                           batch_sizes=batch_sizes, cov_type=cov_type,
                           source=f"speclimits fit --batch on trace {tr.path.resolve().name} ({tr.source_label})")


def coefficient_table(model: BatchCostModel) -> pd.DataFrame:
    """One row per (part, name, m): ``estimate``, ``lower``, ``upper`` (NaN where set by a convention)."""
    fit = (model.extra or {}).get("fit", {})
    ci_t = fit.get("target", {}).get("ci95", {})
    ci_d = fit.get("draft", {}).get("ci95", {})
    rows = []

    def add(part: str, name: str, m: Any, est: float, ci: Any) -> None:
        lo, hi = ci if ci else (np.nan, np.nan)
        rows.append({"part": part, "name": name, "m": m, "estimate": est, "lower": lo, "upper": hi})

    for m in model.ms:
        add("target", "beta0", m, model.base.beta0[m], ci_t.get("beta0", {}).get(str(m)))
        add("target", "gamma", m, model.gamma[m], ci_t.get("gamma", {}).get(str(m)))
        add("target", "alpha", m, model.base.alpha[m], ci_t.get("alpha", {}).get(str(m)))
    add("target", "c", None, model.base.c, ci_t.get("c"))
    for name, est in (("a", model.base.a), ("b", model.base.b), ("a_req", model.a_req), ("b_req", model.b_req)):
        add("draft", name, None, est, ci_d.get(name))
    return pd.DataFrame(rows)


def model_summary(model: BatchCostModel) -> str:
    """Text: the coefficient table and the fit's rows, clusters and R²."""
    fit = (model.extra or {}).get("fit", {})
    t, d = fit.get("target", {}), fit.get("draft", {})
    head = (f"Batch cost model (E = {model.n_experts}, top-{model.top_k}); b = {fit.get('batch_sizes')}\n"
            f"target: {t.get('n_steps', 0):,} uniform decode steps, {t.get('n_clusters')} clusters "
            f"({fit.get('clusters')}), R² {t.get('r2', math.nan):.4f}\n"
            f"drafter: {d.get('n_steps', 0):,} steps with K > 0, R² {d.get('r2', math.nan):.4f}\n")
    table = coefficient_table(model).to_string(index=False, float_format=lambda v: f"{v:.5g}")
    return head + table + "".join(f"\nnote: {n}" for n in fit.get("notes", []))


def _step_prediction(model: BatchCostModel, uni: pd.DataFrame) -> np.ndarray:
    """Model time (target + drafter) of uniform decode steps."""
    target = model.target_ms(uni["n"].to_numpy(), uni["m"].to_numpy(), uni["u_bar"].to_numpy(),
                             uni["context_total"].to_numpy())
    return target + model.draft_ms(uni["n"].to_numpy(), uni["k"].to_numpy())


def batch_folds(steps: pd.DataFrame, folds: int = 2) -> pd.Series:
    """Fold of every batch (by ``batch_id``): within each (b, K) the batches alternate over the folds."""
    if folds < 2:
        raise SpeclimitsError(f"cross-fitting needs folds >= 2, got {folds}")
    ids = steps[["b", "K", "batch_id"]].drop_duplicates().sort_values(["b", "K", "batch_id"])
    rank = ids.groupby(["b", "K"]).cumcount().to_numpy()
    return pd.Series(rank % folds, index=ids["batch_id"].to_numpy(), name="fold")


def validate_by_batch_k(trace: Trace | str | Path, model: BatchCostModel | None = None,
                        folds: int = 2) -> pd.DataFrame:
    """Measured against predicted time per emitted token, per (b, K), cross-fitted by batch.

    **Measured** ``ms_per_token``: ``t_target_ms + t_draft_ms`` summed over *every* step of (b, K) over
    the tokens its rounds emitted. **Predicted**: the same sum with each uniform decode step with
    non-zero timings priced by a model; every other step counts as measured on both sides
    (``unmodelled_share``: their share of the measured time, which dilutes the errors).
    ``pred_cross``/``err_cross_pct``: each batch priced by the model fitted on the other folds'
    batches (:func:`batch_folds`); ``pred_model``/``err_model_pct``: by ``model`` (default: fitted on the
    whole trace). Errors are ``100 * (predicted - measured) / measured``; ``attrs["worst"]``:
    :func:`worst_error`.
    """
    tr, steps, use_rounds, n_experts, top_k = _batch_trace(trace)
    rounds = tr.rounds
    for col in ("b", "K", "n_emitted"):
        if col not in rounds.columns:
            raise SpeclimitsError(f"trace {tr.path}: rounds table lacks column {col!r} (a batch trace's rounds have b)")
    uni = uniform_decode_steps(steps, use_rounds)
    # priced by a model: non-zero timings, and at K > 0 a drafter that ran (k > 0, which the fit covers)
    priced = (uni["t_target_ms"] > 0) & ((uni["K"] == 0) | ((uni["t_draft_ms"] > 0) & (uni["k"] > 0)))
    uni = uni.loc[priced].reset_index(drop=True)
    if model is None:
        model = fit_batch_steps(steps, use_rounds, n_experts=n_experts, top_k=top_k)
    fold_of = batch_folds(steps, folds)
    uni_fold = fold_of.reindex(uni["batch_id"].to_numpy()).to_numpy()
    cross = np.full(len(uni), np.nan)
    for f in range(folds):
        train_ids = fold_of.index[fold_of.to_numpy() != f]
        train = steps.loc[steps["batch_id"].isin(train_ids)]
        train_rounds = use_rounds.loc[use_rounds["batch_id"].isin(train_ids)] if use_rounds is not None else None
        try:
            # point estimates only: the cheaper covariance
            fold_model = fit_batch_steps(train, train_rounds, n_experts=n_experts, top_k=top_k, cov_type="cr1")
            sel = uni_fold == f
            cross[sel] = _step_prediction(fold_model, uni.loc[sel])
        except (SpeclimitsError, CostModelError) as exc:
            raise SpeclimitsError(f"trace {tr.path}: cross-fit fold {f} of {folds}: {exc}") from None
    in_model = _step_prediction(model, uni)
    measured_step = steps["t_target_ms"].to_numpy(dtype=float) + steps["t_draft_ms"].to_numpy(dtype=float)
    modelled = pd.MultiIndex.from_arrays([steps["batch_id"].to_numpy(), steps["step"].to_numpy()]).isin(
        pd.MultiIndex.from_arrays([uni["batch_id"].to_numpy(), uni["step"].to_numpy()]))
    base = pd.DataFrame({"b": steps["b"].to_numpy(), "K": steps["K"].to_numpy(), "measured": measured_step,
                         "unmodelled": np.where(modelled, 0.0, measured_step), "one": 1.0,
                         "modelled": modelled.astype(float), "batch_id": steps["batch_id"].to_numpy()})
    agg = base.groupby(["b", "K"]).agg(n_batches=("batch_id", "nunique"), n_steps=("one", "sum"),
                                       n_modelled=("modelled", "sum"), measured_ms=("measured", "sum"),
                                       unmodelled_ms=("unmodelled", "sum"))
    pu = pd.DataFrame({"b": uni["b"].to_numpy(), "K": uni["K"].to_numpy(), "cross": cross,
                       "model": in_model}).groupby(["b", "K"]).sum()
    tokens = rounds.groupby(["b", "K"])["n_emitted"].sum()
    out = agg.join(pu, how="left").join(tokens.rename("tokens"), how="left").fillna({"cross": 0.0, "model": 0.0})
    out["ms_per_token"] = out["measured_ms"] / out["tokens"]
    for kind in ("cross", "model"):
        out[f"pred_{kind}"] = (out["unmodelled_ms"] + out[kind]) / out["tokens"]
        out[f"err_{kind}_pct"] = 100 * (out[f"pred_{kind}"] - out["ms_per_token"]) / out["ms_per_token"]
    out["unmodelled_share"] = out["unmodelled_ms"] / out["measured_ms"]
    out = out.reset_index().sort_values(["b", "K"]).reset_index(drop=True)
    out = out[["b", "K", "n_batches", "n_steps", "n_modelled", "tokens", "measured_ms", "ms_per_token", "pred_cross",
               "err_cross_pct", "pred_model", "err_model_pct", "unmodelled_share"]]
    for col in ("n_batches", "n_steps", "n_modelled", "tokens"):
        out[col] = out[col].astype(np.int64)
    out.attrs["worst"] = worst_error(out)
    out.attrs["folds"] = folds
    return out


def worst_error(validation: pd.DataFrame, column: str = "err_cross_pct") -> dict[str, Any]:
    """The (b, K) row with the largest |``column``|, as a dict with a ``text`` line."""
    if validation.empty:
        raise SpeclimitsError("empty validation table")
    i = int(np.nanargmax(np.abs(validation[column].to_numpy(dtype=float))))
    r = validation.iloc[i]
    pred_col = "pred_cross" if column == "err_cross_pct" else "pred_model"
    out = {"b": int(r["b"]), "K": int(r["K"]), "error_pct": float(r[column]), "ms_per_token": float(r["ms_per_token"]),
           "predicted": float(r[pred_col]), "column": column}
    out["text"] = (f"worst {column}: b = {out['b']}, K = {out['K']}: {out['error_pct']:+.2f}% "
                   f"(measured {out['ms_per_token']:.4g} ms/token, predicted {out['predicted']:.4g})")
    return out


def validation_summary(validation: pd.DataFrame) -> str:
    """Text: the validation table and its worst cross-fitted error."""
    cols = ["b", "K", "n_batches", "n_modelled", "tokens", "ms_per_token", "pred_cross", "err_cross_pct",
            "pred_model", "err_model_pct", "unmodelled_share"]
    return ("Validation by (b, K): ms per emitted token, measured vs predicted "
            f"(cross-fitted over {validation.attrs.get('folds', '?')} folds of batches; model in sample)\n"
            + validation[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}")
            + "\n" + worst_error(validation)["text"])


@dataclass(frozen=True)
class UnionTable:
    """Measured Ū of the uniform decode steps against independent routing and the saturation curve.

    ``steps``: per step ``u_measured``, ``u_independent`` (the union of its requests' own Ū under
    independent routing), ``u_saturation`` (:func:`saturation_curve` of its tokens) and the ratios.
    ``by_batch_k``: per (b, K) counts, means and the SE of ``ratio_independent`` over batches.
    """

    steps: pd.DataFrame
    by_batch_k: pd.DataFrame
    n_experts: int
    top_k: int

    def to_dict(self) -> dict[str, Any]:
        return {"n_experts": self.n_experts, "top_k": self.top_k, "by_batch_k": self.by_batch_k}

    def summary(self) -> str:
        return (f"Ū of a step (uniform decode steps; E = {self.n_experts}, top-{self.top_k}): measured vs the union "
                "of its requests' own Ū under independent routing, and vs the saturation curve of its tokens\n"
                + self.by_batch_k.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def step_union_table(trace: Trace | str | Path) -> UnionTable:
    """:class:`UnionTable` of a batch trace (requests joined to steps on ``(batch_id, step)``). The
    independent union uses each request's Ū averaged over layers (what ``rounds`` records), so it
    slightly overstates the mean of the per-layer unions."""
    tr, steps, rounds, E, top_k = _batch_trace(trace)
    if rounds is None:
        raise SpeclimitsError(f"trace {tr.path}: rounds table lacks batch_id / step (needed to join requests to steps)")
    uni = uniform_decode_steps(steps, rounds)
    dec = rounds.loc[rounds["phase"].astype(str) == "decode", ["batch_id", "step", "u_bar"]]
    frac = np.clip(dec["u_bar"].to_numpy(dtype=float) / E, 0.0, 1.0 - 1e-12)
    logs = pd.Series(np.log1p(-frac)).groupby([dec["batch_id"].to_numpy(), dec["step"].to_numpy()]).sum()
    key = pd.MultiIndex.from_arrays([uni["batch_id"].to_numpy(), uni["step"].to_numpy()])
    independent = E * (1.0 - np.exp(logs.reindex(key).to_numpy()))
    out = pd.DataFrame({"batch_id": uni["batch_id"], "b": uni["b"], "K": uni["K"], "step": uni["step"], "n": uni["n"],
                        "m": uni["m"], "n_tokens": uni["n_tokens"], "u_measured": uni["u_bar"].astype(float),
                        "u_independent": independent,
                        "u_saturation": saturation_curve(uni["n_tokens"].to_numpy(), E, top_k)})
    out["ratio_independent"] = out["u_measured"] / out["u_independent"]
    out["ratio_saturation"] = out["u_measured"] / out["u_saturation"]
    per_batch = out.groupby(["b", "K", "batch_id"])["ratio_independent"].mean()
    se = per_batch.groupby(["b", "K"]).agg(lambda v: v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else np.nan)
    summ = out.groupby(["b", "K"]).agg(n_steps=("step", "size"), n_batches=("batch_id", "nunique"),
                                       u_measured=("u_measured", "mean"), u_independent=("u_independent", "mean"),
                                       u_saturation=("u_saturation", "mean"),
                                       ratio_independent=("ratio_independent", "mean"),
                                       ratio_saturation=("ratio_saturation", "mean"))
    summ["ratio_independent_se"] = se
    return UnionTable(out, summ.reset_index(), E, top_k)


def speedup_frontier(validation: pd.DataFrame, column: str = "ms_per_token") -> pd.DataFrame:
    """Per K > 0, where speculation stops paying: ``b_stop``, the first b at which ``column`` at K no
    longer beats K = 0 (NaN: never), ``last_b_paying`` (largest b below it that pays; NaN: none),
    ``resumes`` (pays again above ``b_stop``), ``speedup_b{b}`` = K = 0 over K. Only b with a K = 0 row."""
    for col in ("b", "K", column):
        if col not in validation.columns:
            raise SpeclimitsError(f"validation table lacks column {col!r}")
    wide = validation.pivot_table(index="K", columns="b", values=column, aggfunc="first")
    if 0 not in wide.index:
        raise SpeclimitsError("the table has no K = 0 (plain decoding) rows to compare with")
    bs = [b for b in sorted(wide.columns) if np.isfinite(wide.loc[0, b])]
    rows = []
    for K in sorted(k for k in wide.index if k != 0):
        speed = {b: float(wide.loc[0, b] / wide.loc[K, b]) for b in bs if np.isfinite(wide.loc[K, b])}
        pays = [(b, s > 1.0) for b, s in speed.items()]
        stop = next((b for b, p in pays if not p), None)
        before = [b for b, p in pays if p and (stop is None or b < stop)]
        after = [b for b, p in pays if p and stop is not None and b > stop]
        row = {"K": int(K), "b_stop": float(stop) if stop is not None else np.nan,
               "last_b_paying": float(before[-1]) if before else np.nan, "resumes": bool(after)}
        row.update({f"speedup_b{b}": speed.get(b, np.nan) for b in bs})
        rows.append(row)
    return pd.DataFrame(rows)
