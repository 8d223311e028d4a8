"""The cost model at batch > 1: fit, validation by (b, K), the union of a step's experts, and where
speculation stops paying.

A batch trace (``speclimits trace --batch``, ``speclimits simulate --batch``) has a ``steps``
table, one row per engine step shared by ``n_reqs`` requests (columns:
:data:`speclimits.trace.schema.STEPS_COLUMNS`). The model (:class:`speclimits.costmodel.BatchCostModel`)::

    target(n, m, Ū, L) = beta0(m) + gamma(m) * (n - 1) + alpha(m) * Ū + c * L
    draft(n, k)        = a * k + b + (n - 1) * (a_req * k + b_req)          (0 at k = 0)

with Ū the unique experts per layer of the whole step (averaged over layers) and L its summed
context. Both parts are fitted by OLS (statsmodels) on the **uniform decode steps**
(:func:`uniform_decode_steps`: every request decoding, every one verifying the same m rows) with
standard errors clustered by batch (``batch_id``; statsmodels' small-sample correction and a
t reference with G - 1 degrees of freedom, as the batch-1 fits use): one regression for the target
with free ``beta0``, ``gamma``, ``alpha`` per m and one shared ``c``; one for the drafter on the
steps with K > 0. Steps with a zero timing (a failed measurement) are left out of the part
whose timing is zero.

At n = 1 the design is the batch-1 one (:func:`speclimits.stats.fit_cost_model`): on a sweep
with b = 1 only, ``gamma`` and ``a_req``, ``b_req`` are not identified and are set to 0 (noted),
and ``alpha(1)`` (Ū constant at m = 1, n = 1) takes the batch-1 convention alpha(1) :=
alpha(2), beta0(1) := intercept(1) - alpha(1) * top_k.

What the model does **not** cover: prefill and mixed steps (a request prefilling beside others
decoding), and decode steps whose requests verify different m (a request with fewer drafts).
:func:`validate_by_batch_k` counts their measured time as-is on both sides of the comparison and
reports their share, so its error is the error of the modelled steps diluted by that share.
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

from speclimits.costmodel import BatchCostModel, CostModel, saturation_curve, union_unique
from speclimits.errors import CostModelError, SpeclimitsError
from speclimits.stats._ols import ResultsMixin
from speclimits.trace import Trace, read_trace
from speclimits.trace.io import read_table

#: Columns of the steps table this module reads.
STEP_COLUMNS = ("batch_id", "b", "K", "step", "n_reqs", "n_decode", "n_tokens", "m_max", "u_bar", "context_total",
                "t_target_ms", "t_draft_ms", "phase", "n_drafted_next")

BATCH1_NOTE = ("m = {m}: alpha({m}) := alpha({donor}) = {alpha:.4g}, beta0({m}) = intercept({m}) - alpha({m}) * {tk:g}: "
               "u_bar does not vary beyond what n explains at this m (every step has the same Ū, as at batch 1 "
               "where an m = 1 pass touches top_k experts), so alpha({m}) is not identified from the data")


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


def _trace(trace: Trace | str | Path) -> Trace:
    return trace if isinstance(trace, Trace) else read_trace(trace)


def trace_steps(trace: Trace | str | Path) -> pd.DataFrame:
    """The ``steps`` table of a batch trace; :class:`SpeclimitsError` naming the trace when it has none."""
    tr = _trace(trace)
    steps = tr.steps if hasattr(type(tr), "steps") else read_table(tr.path, "steps")
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


def _experts(tr: Trace) -> tuple[int, int]:
    n_experts = ((tr.meta.get("models") or {}).get("target") or {}).get("n_experts")
    if n_experts is None or tr.top_k is None:
        raise SpeclimitsError(f"trace {tr.path}: meta.json lacks models.target.n_experts / top_k "
                              "(the union of a step's experts needs both)")
    return int(n_experts), int(tr.top_k)


def uniform_decode_steps(steps: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """The steps the batch cost model is fitted on, with ``m``, ``n`` and ``k`` columns added.

    Kept: phase ``'decode'`` (every request decoding) and every request at the same m. With
    ``rounds`` (needs ``batch_id`` and ``step``), the step's decode rows must all have ``m ==
    m_max`` and there must be ``n_reqs`` of them; without, ``n_tokens == n_reqs * m_max``.
    Added: ``m = m_max``, ``n = n_reqs`` and ``k = n_drafted_next / n_reqs`` (drafts per request
    proposed in the step: K where the drafter ran for every request). Zero timings are kept here
    (the fits drop them per part).
    """
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


# ---------------------------------------------------------------------------
# the fit
# ---------------------------------------------------------------------------


#: Covariances :func:`fit_batch_steps` can put behind its intervals.
COV_TYPES = ("jackknife", "cr1")


@dataclass(frozen=True)
class _Fit:
    """One OLS: statsmodels' estimates, the covariance behind the intervals (``cov``, of type
    ``cov_type``) and statsmodels' own cluster-robust one (``cov_cr1``, or classical without clusters)."""

    params: pd.Series
    cov: pd.DataFrame
    cov_cr1: pd.DataFrame
    q: float
    nobs: int
    n_clusters: int | None
    rsquared: float
    cov_type: str

    def se(self, name: str, which: str = "cov") -> float:
        return math.sqrt(max(float(getattr(self, which).loc[name, name]), 0.0))

    def interval(self, name: str) -> list[float]:
        est, half = float(self.params[name]), self.q * self.se(name)
        return [est - half, est + half]


def _ols(y: np.ndarray, x: pd.DataFrame, groups: np.ndarray | None, cov_type: str = "jackknife") -> _Fit:
    """statsmodels OLS of ``y`` on ``x``.

    With ``groups``: statsmodels' cluster-robust covariance (``cov_type="cluster"``, its small-sample
    correction, t(G - 1)) is always computed (``cov_cr1``); the intervals use the cluster jackknife
    (statsmodels' CV3, ``cov_type="jackknife"``, the default, t(G - 1)) or its CR1
    (``"cr1"``). Without groups: the classical OLS covariance.
    """
    if cov_type not in COV_TYPES:
        raise SpeclimitsError(f"cov_type must be one of {COV_TYPES}, got {cov_type!r}")
    model = sm.OLS(y, x)
    if groups is None:
        res = model.fit()
        cov = res.cov_params()
        q = float(sps.t.interval(0.95, max(res.df_resid, 1))[1])
        return _Fit(res.params, cov, cov, q, int(res.nobs), None, float(res.rsquared), "classical OLS")
    codes = pd.factorize(groups, sort=True)[0]
    if codes.max() < 1:
        raise SpeclimitsError("clustered standard errors need at least two clusters (batches) in the fitted steps")
    res = model.fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
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


def _varies(v: np.ndarray, rel: float = 1e-10) -> bool:
    return bool(v.size > 1 and np.var(v) > rel * max(1.0, float(np.mean(v)) ** 2))


def _residual_varies(u: np.ndarray, n1: np.ndarray) -> bool:
    """Whether Ū varies beyond what an intercept and (n - 1) explain (alpha identified next to gamma)."""
    x = np.column_stack([np.ones(len(u)), n1]) if _varies(n1) else np.ones((len(u), 1))
    resid = u - x @ np.linalg.lstsq(x, u, rcond=None)[0]
    return bool(np.var(resid) > 1e-10 * max(1.0, float(np.mean(u)) ** 2))


def _groups(df: pd.DataFrame, clusters: str | None) -> np.ndarray | None:
    if clusters is None:
        return None
    if clusters not in df.columns:
        raise SpeclimitsError(f"cannot cluster by {clusters!r}: the steps table has no such column")
    return df[clusters].to_numpy()


def _fit_target(df: pd.DataFrame, top_k: int, clusters: str | None, cov_type: str) -> dict[str, Any]:
    """Target part: one OLS with beta0, gamma, alpha per m and a shared c (see the module docstring)."""
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
    x = pd.DataFrame(cols)
    ident = [mv for mv in ms if alpha_id[mv]]
    if not ident:
        raise SpeclimitsError("alpha is not identified at any m (the step's Ū is constant everywhere)")
    res = _ols(df["t_target_ms"].to_numpy(dtype=float), x, _groups(df, clusters), cov_type)
    p, q = res.params, res.q
    names = ("beta0", "alpha", "gamma")
    out: dict[str, Any] = {n: {} for n in names}
    out.update({"ci": {n: {} for n in names}, "se": {n: {} for n in names}, "se_cr1": {n: {} for n in names},
                "notes": []})
    for mv in ms:
        b_name = f"beta0[{mv}]"
        if alpha_id[mv]:
            a_name = f"alpha[{mv}]"
            alpha, beta0 = p[a_name], p[b_name]
            var = {w: (getattr(res, w).loc[a_name, a_name], getattr(res, w).loc[b_name, b_name])
                   for w in ("cov", "cov_cr1")}
        else:
            # the batch-1 convention (speclimits.stats.costfit.M1_NOTE): alpha from the nearest identified m
            donor = min(ident, key=lambda v: (abs(v - mv), v))
            a_name = f"alpha[{donor}]"
            tk = float(top_k)
            alpha = p[a_name]
            beta0 = p[b_name] - alpha * tk
            var = {}
            for w in ("cov", "cov_cr1"):
                c = getattr(res, w)
                var[w] = (c.loc[a_name, a_name],
                          c.loc[b_name, b_name] + tk ** 2 * c.loc[a_name, a_name] - 2 * tk * c.loc[b_name, a_name])
            out["notes"].append(BATCH1_NOTE.format(m=mv, donor=donor, alpha=alpha, tk=tk))
            u_obs = float(u[m == mv].mean())
            if abs(u_obs - tk) > 1e-6:
                out["notes"].append(f"m = {mv}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
        for i, (name, est) in enumerate((("alpha", alpha), ("beta0", beta0))):
            se = math.sqrt(max(float(var["cov"][i]), 0.0))
            out[name][mv] = float(est)
            out["se"][name][mv] = se
            out["se_cr1"][name][mv] = math.sqrt(max(float(var["cov_cr1"][i]), 0.0))
            out["ci"][name][mv] = [float(est) - q * se, float(est) + q * se]
        if gamma_id[mv]:
            g_name = f"gamma[{mv}]"
            out["gamma"][mv] = float(p[g_name])
            out["se"]["gamma"][mv] = res.se(g_name)
            out["se_cr1"]["gamma"][mv] = res.se(g_name, "cov_cr1")
            out["ci"]["gamma"][mv] = res.interval(g_name)
        else:
            out["gamma"][mv] = 0.0
            out["se"]["gamma"][mv] = out["se_cr1"]["gamma"][mv] = out["ci"]["gamma"][mv] = None
            out["notes"].append(f"m = {mv}: gamma({mv}) := 0, not identified: every fitted step at this m has n = 1 "
                                "(the batch-1 form)")
    out["c"] = float(p["c"])
    out["se"]["c"], out["se_cr1"]["c"], out["ci"]["c"] = res.se("c"), res.se("c", "cov_cr1"), res.interval("c")
    out["identified"] = {"alpha": {str(k): bool(v) for k, v in alpha_id.items()},
                         "gamma": {str(k): bool(v) for k, v in gamma_id.items()}}
    out.update(n_steps=res.nobs, n_clusters=res.n_clusters, r2=res.rsquared, t_quantile=q, cov_type=res.cov_type)
    return out


def _fit_draft(df: pd.DataFrame, clusters: str | None, cov_type: str) -> dict[str, Any]:
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
    res = _ols(df["t_draft_ms"].to_numpy(dtype=float), pd.DataFrame(cols), _groups(df, clusters), cov_type)
    out: dict[str, Any] = {"notes": [], "ci": {}, "se": {}, "se_cr1": {}}
    for name in ("a", "b", "a_req", "b_req"):
        if name in res.params.index:
            out[name] = float(res.params[name])
            out["se"][name], out["se_cr1"][name] = res.se(name), res.se(name, "cov_cr1")
            out["ci"][name] = res.interval(name)
        else:
            out[name], out["se"][name], out["se_cr1"][name], out["ci"][name] = 0.0, None, None, None
    if not per_req:
        out["notes"].append("a_req, b_req := 0, not identified: every fitted step has n = 1 (the batch-1 form)")
    out.update(n_steps=res.nobs, n_clusters=res.n_clusters, r2=res.rsquared, t_quantile=res.q, cov_type=res.cov_type)
    return out


def fit_batch_steps(steps: pd.DataFrame, rounds: pd.DataFrame | None = None, *, n_experts: int, top_k: int,
                    clusters: str | None = "batch_id", batch_sizes: Sequence[int] | None = None,
                    cov_type: str = "jackknife", source: str = "") -> BatchCostModel:
    """:func:`fit_batch_cost_model` on tables: ``steps`` (and ``rounds`` for the uniformity check).

    ``batch_sizes``: fit on the steps of these b only (default all). ``clusters``: a steps column
    (default ``batch_id``) or None for the classical OLS covariance. ``cov_type``: the covariance
    behind the intervals, ``"jackknife"`` (default) or ``"cr1"`` (see :func:`fit_batch_cost_model`).
    """
    uni = uniform_decode_steps(steps, rounds)
    if batch_sizes is not None:
        uni = uni.loc[uni["b"].isin([int(b) for b in batch_sizes])].reset_index(drop=True)
    n_zero_t = int((uni["t_target_ms"] <= 0).sum())
    tgt = _fit_target(uni.loc[uni["t_target_ms"] > 0].reset_index(drop=True), top_k, clusters, cov_type)
    with_draft = uni.loc[(uni["K"] > 0) & (uni["k"] > 0)]
    n_zero_d = int((with_draft["t_draft_ms"] <= 0).sum())
    drf = _fit_draft(with_draft.loc[with_draft["t_draft_ms"] > 0].reset_index(drop=True), clusters, cov_type)
    ms = sorted(tgt["beta0"])
    base = CostModel(c=tgt["c"], beta0={m: tgt["beta0"][m] for m in ms}, alpha={m: tgt["alpha"][m] for m in ms},
                     a=drf["a"], b=drf["b"],
                     source=source or "speclimits fit --batch: batch cost model on the uniform decode steps")

    def by_m(d: dict[int, Any]) -> dict[str, Any]:
        return {str(m): d[m] for m in ms}

    fit = {
        "target": {"n_steps": tgt["n_steps"], "n_clusters": tgt["n_clusters"], "r2": tgt["r2"],
                   "n_zero_timing_excluded": n_zero_t,
                   "ci95": {"beta0": by_m(tgt["ci"]["beta0"]), "alpha": by_m(tgt["ci"]["alpha"]),
                            "gamma": by_m(tgt["ci"]["gamma"]), "c": tgt["ci"]["c"]},
                   "se": {"beta0": by_m(tgt["se"]["beta0"]), "alpha": by_m(tgt["se"]["alpha"]),
                          "gamma": by_m(tgt["se"]["gamma"]), "c": tgt["se"]["c"]},
                   "se_cr1": {"beta0": by_m(tgt["se_cr1"]["beta0"]), "alpha": by_m(tgt["se_cr1"]["alpha"]),
                              "gamma": by_m(tgt["se_cr1"]["gamma"]), "c": tgt["se_cr1"]["c"]},
                   "cov_type": tgt["cov_type"], "t_quantile": tgt["t_quantile"],
                   "identified": tgt["identified"]},
        "draft": {"n_steps": drf["n_steps"], "n_clusters": drf["n_clusters"], "r2": drf["r2"],
                  "n_zero_timing_excluded": n_zero_d, "ci95": drf["ci"], "se": drf["se"], "se_cr1": drf["se_cr1"],
                  "cov_type": drf["cov_type"], "t_quantile": drf["t_quantile"]},
        "n_steps_total": int(len(steps)), "n_uniform_decode": int(len(uni)),
        "batch_sizes": sorted(int(b) for b in uni["b"].unique()),
        "clusters": clusters,
        "notes": tgt["notes"] + drf["notes"] + [
            "fitted on uniform decode steps (every request decoding at the same m); prefill, mixed and "
            "non-uniform steps are not covered by the model",
            "OLS (statsmodels); 95% intervals from the " + tgt["cov_type"] + " covariance"
            + (f" by {clusters}, t(G - 1)" if clusters else "")
            + "; se_cr1: statsmodels' cluster-robust standard errors (what the batch-1 fit reports)"],
    }
    return BatchCostModel(base=base, gamma={m: tgt["gamma"][m] for m in ms}, a_req=drf["a_req"], b_req=drf["b_req"],
                          n_experts=int(n_experts), top_k=int(top_k), extra={"fit": fit})


def fit_batch_cost_model(trace: Trace | str | Path, *, clusters: str | None = "batch_id",
                         batch_sizes: Sequence[int] | None = None, cov_type: str = "jackknife") -> BatchCostModel:
    """Fit the :class:`~speclimits.costmodel.BatchCostModel` of a batch trace.

    Target, per m: ``t_target = beta0(m) + gamma(m) * (n - 1) + alpha(m) * Ū_step + c * L_total``,
    one OLS over all m with m-specific intercepts and slopes and ``c`` shared; drafter:
    ``t_draft = a * k + b + (n - 1) * (a_req * k + b_req)`` on the steps with K > 0 (k = drafts
    per request of the step, ``n_drafted_next / n_reqs``). Both on :func:`uniform_decode_steps`
    (zero timings dropped), statsmodels OLS with covariance clustered by ``clusters`` (default
    ``batch_id``). The model's ``extra["fit"]`` (the JSON's ``batch.fit``) holds the 95%
    intervals (``ci95``) and standard errors of every coefficient (null where a coefficient was
    not identified and set by convention), which were identified, the steps fitted, clusters,
    R² and notes.

    **Intervals.** ``cov_type="jackknife"`` (default): the cluster jackknife (CV3: the spread of
    the estimates leaving one batch out, scaled by (G - 1) / G), with t(G - 1). statsmodels'
    cluster-robust covariance (CR1, ``se_cr1`` in the JSON; ``cov_type="cr1"`` to use it for
    the intervals) is too small here: gamma(m) is identified mostly by the few large batches
    (at b = 16 a sweep of a few dozen prompts has 2 batches per K), high-leverage clusters whose
    residuals OLS shrinks. On the simulator, refitting one design with fresh noise 60 times, the
    estimates spread 1.2-1.35x the mean CR1 standard error of beta0, gamma and alpha (c: 1.03x);
    the jackknife removes that (see ``tests/test_stats_batch.py``). ``batch_sizes`` restricts the fit to those b; with b = 1 only it reduces to
    the batch-1 model (see the module docstring). ``n_experts`` and ``top_k`` come from meta.json.
    """
    tr = _trace(trace)
    steps = trace_steps(tr)
    n_experts, top_k = _experts(tr)
    rounds = tr.rounds
    use_rounds = rounds if {"batch_id", "step"} <= set(rounds.columns) else None
    return fit_batch_steps(steps, use_rounds, n_experts=n_experts, top_k=top_k, clusters=clusters,
                           batch_sizes=batch_sizes, cov_type=cov_type,
                           source=f"speclimits fit --batch on trace {tr.path.resolve().name} ({tr.source_label})")


def coefficient_table(model: BatchCostModel) -> pd.DataFrame:
    """The fitted coefficients with their 95% intervals: one row per (part, name, m); columns
    ``estimate``, ``lower``, ``upper`` (NaN where the coefficient was set by a convention)."""
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


# ---------------------------------------------------------------------------
# validation by (b, K)
# ---------------------------------------------------------------------------


def _step_prediction(model: BatchCostModel, uni: pd.DataFrame) -> np.ndarray:
    """Model time (target + drafter) of uniform decode steps."""
    target = model.target_ms(uni["n"].to_numpy(), uni["m"].to_numpy(), uni["u_bar"].to_numpy(),
                             uni["context_total"].to_numpy())
    return target + model.draft_ms(uni["n"].to_numpy(), uni["k"].to_numpy())


def _modelled_mask(steps: pd.DataFrame, uni_keys: pd.MultiIndex) -> np.ndarray:
    key = pd.MultiIndex.from_arrays([steps["batch_id"].to_numpy(), steps["step"].to_numpy()])
    return key.isin(uni_keys)


def batch_folds(steps: pd.DataFrame, folds: int = 2) -> pd.Series:
    """Fold of every batch (indexed by ``batch_id``): within each (b, K) the batches, in
    ``batch_id`` order, alternate over folds 0, 1, ..., folds - 1."""
    if folds < 2:
        raise SpeclimitsError(f"cross-fitting needs folds >= 2, got {folds}")
    ids = steps[["b", "K", "batch_id"]].drop_duplicates().sort_values(["b", "K", "batch_id"])
    rank = ids.groupby(["b", "K"]).cumcount().to_numpy()
    return pd.Series(rank % folds, index=ids["batch_id"].to_numpy(), name="fold")


def validate_by_batch_k(trace: Trace | str | Path, model: BatchCostModel | None = None,
                        folds: int = 2) -> pd.DataFrame:
    """Measured against predicted time per emitted token, per (b, K), cross-fitted by batch.

    **Measured** ``ms_per_token``: the sum of ``t_target_ms + t_draft_ms`` over *every* step of
    (b, K) (prefill and mixed included) over the tokens the rounds of (b, K) emitted
    (``n_emitted``, the prefill's token included).

    **Predicted**: the same sum with each uniform decode step with non-zero timings priced by a
    model; every other step (prefill, mixed, decode steps with different m per request, steps
    with a zero timing, a failed measurement, and steps at K > 0 whose drafter proposed nothing)
    is counted as measured on both sides: the model does not price it. ``unmodelled_share`` is the share of the measured time in those
    steps, so the errors below are the modelled steps' error diluted by that share.

    * ``pred_cross`` / ``err_cross_pct``: each batch priced by the model fitted
      (:func:`fit_batch_steps`, same clusters) on the batches of the other folds
      (:func:`batch_folds`: within each (b, K) batches alternate over ``folds`` in ``batch_id``
      order). A (b, K) with one batch is priced by a model fitted without any batch of that
      (b, K) (an extrapolation from the other b at that K).
    * ``pred_model`` / ``err_model_pct``: priced by ``model`` (default: fitted on the whole
      trace, i.e. in sample).

    Errors are ``100 * (predicted - measured) / measured``. Returns a DataFrame sorted by b, K;
    ``attrs["worst"]`` (also :func:`worst_error`) names the (b, K) with the largest cross-fitted
    |error|.
    """
    tr = _trace(trace)
    steps = trace_steps(tr)
    n_experts, top_k = _experts(tr)
    rounds = tr.rounds
    use_rounds = rounds if {"batch_id", "step"} <= set(rounds.columns) else None
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
    key_uni = pd.MultiIndex.from_arrays([uni["batch_id"].to_numpy(), uni["step"].to_numpy()])
    modelled = _modelled_mask(steps, key_uni)
    meas_uni = uni["t_target_ms"].to_numpy(dtype=float) + uni["t_draft_ms"].to_numpy(dtype=float)
    base = pd.DataFrame({"b": steps["b"].to_numpy(), "K": steps["K"].to_numpy(), "measured": measured_step,
                         "unmodelled": np.where(modelled, 0.0, measured_step), "one": 1.0,
                         "modelled": modelled.astype(float), "batch_id": steps["batch_id"].to_numpy()})
    agg = base.groupby(["b", "K"]).agg(n_batches=("batch_id", "nunique"), n_steps=("one", "sum"),
                                       n_modelled=("modelled", "sum"), measured_ms=("measured", "sum"),
                                       unmodelled_ms=("unmodelled", "sum"))
    pu = pd.DataFrame({"b": uni["b"].to_numpy(), "K": uni["K"].to_numpy(), "cross": cross, "model": in_model,
                       "meas": meas_uni}).groupby(["b", "K"]).sum()
    tokens = rounds.groupby(["b", "K"])["n_emitted"].sum()
    out = agg.join(pu, how="left").join(tokens.rename("tokens"), how="left").fillna({"cross": 0.0, "model": 0.0})
    out["ms_per_token"] = out["measured_ms"] / out["tokens"]
    out["pred_cross"] = (out["unmodelled_ms"] + out["cross"]) / out["tokens"]
    out["pred_model"] = (out["unmodelled_ms"] + out["model"]) / out["tokens"]
    out["err_cross_pct"] = 100 * (out["pred_cross"] - out["ms_per_token"]) / out["ms_per_token"]
    out["err_model_pct"] = 100 * (out["pred_model"] - out["ms_per_token"]) / out["ms_per_token"]
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
    """The (b, K) row of a :func:`validate_by_batch_k` table with the largest |``column``|, as a dict
    (``b``, ``K``, ``error_pct``, ``ms_per_token``, ``predicted``, ``text``)."""
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


# ---------------------------------------------------------------------------
# the union of a step's experts
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UnionTable(ResultsMixin):
    """Measured Ū of the uniform decode steps against independent routing and the saturation curve.

    ``steps``: one row per uniform decode step: ``batch_id``, ``b``, ``K``, ``step``, ``n``, ``m``,
    ``n_tokens``, ``u_measured`` (the step's Ū), ``u_independent`` (:func:`union_unique` of the
    step's requests' own Ū: their rounds' ``u_bar``), ``u_saturation``
    (:func:`saturation_curve` of the step's tokens), ``ratio_independent`` and
    ``ratio_saturation`` (measured over each). ``by_batch_k``: per (b, K) the number of steps and
    batches, the means of the three Ū, the mean ratios and the standard error of the mean
    ``ratio_independent`` over batches (per-batch means, their sd / sqrt(batches)).
    """

    steps: pd.DataFrame
    by_batch_k: pd.DataFrame
    n_experts: int
    top_k: int

    def to_frame(self) -> pd.DataFrame:
        return self.by_batch_k

    def to_dict(self) -> dict[str, Any]:
        return {"n_experts": self.n_experts, "top_k": self.top_k, "by_batch_k": self.by_batch_k}

    def summary(self) -> str:
        return (f"Ū of a step (uniform decode steps; E = {self.n_experts}, top-{self.top_k}): measured vs the union "
                "of its requests' own Ū under independent routing, and vs the saturation curve of its tokens\n"
                + self.by_batch_k.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def step_union_table(trace: Trace | str | Path) -> UnionTable:
    """:class:`UnionTable` of a batch trace: per uniform decode step, its measured Ū, the
    independent-routing union of its requests' own Ū (``rounds.u_bar`` of the requests in the
    step, joined on ``(batch_id, step)``) and ``saturation_curve(n_tokens, E, top_k)``.

    The independent union uses each request's Ū averaged over layers (what ``rounds`` records);
    with routing that differs by layer in the same way for every request it slightly
    overstates the mean over layers of the per-layer unions.
    """
    tr = _trace(trace)
    steps = trace_steps(tr)
    E, top_k = _experts(tr)
    rounds = tr.rounds
    if not {"batch_id", "step"} <= set(rounds.columns):
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


# ---------------------------------------------------------------------------
# where speculation stops paying
# ---------------------------------------------------------------------------


def speedup_frontier(validation: pd.DataFrame, column: str = "ms_per_token") -> pd.DataFrame:
    """Per K > 0: the smallest b at which ``column`` (default the measured ms per token) at K no
    longer beats K = 0 (plain decoding) at the same b: "where speculation stops paying".

    Columns: ``K``, ``b_stop`` (the first b, in increasing order, with ms/token at K >= ms/token at
    K = 0; NaN when K beats plain at every b of the table), ``last_b_paying`` (the largest b
    below ``b_stop`` at which it still beats plain; NaN when it never does), ``resumes`` (True
    when K beats plain again at some b above ``b_stop``), and ``speedup_b{b}`` = ms/token at
    K = 0 over ms/token at K, per b. Only the b with a K = 0 row count.
    """
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
