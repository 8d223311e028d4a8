"""Every analysis the statistics sections show, against an independent reference: scikit-learn's
metrics and refits, statsmodels (z-scored OLS, RLM, clustered OLS, het_breuschpagan, f_test),
and hand-built refits on planted data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_absolute_percentage_error, median_absolute_error
from sklearn.model_selection import GroupKFold

from speclimits import stats
from speclimits.stats import diagnostics as diag
from speclimits.stats import uncertainty as unc
from speclimits.stats import CellMoments, ClusterSums, Design, cross_validate, fit_ols, group_folds
from speclimits.stats.comparisons import cluster_sensitivity, smooth_designs


def planted(n_gen_per_k: int = 16, ks=range(1, 6), seed: int = 0, hetero: float = 0.0,
            heavy: bool = False, shift_sd: float = 0.05) -> pd.DataFrame:
    """Decode rounds with prompts recurring across K; noise sd grows with Ū when ``hetero`` > 0;
    Student-t(3) row noise when ``heavy``; a per-generation shift with sd ``shift_sd``."""
    rng = np.random.default_rng(seed)
    out, gid = [], 0
    for k in ks:
        for p in range(n_gen_per_k):
            n = int(rng.integers(15, 45))
            u = rng.normal(10 + 2 * k, 2, n)
            L = 300 + 25 * p + np.arange(n)
            sd = 0.05 * (1 + hetero * (u - u.mean()) / 2).clip(0.1)
            e = (rng.standard_t(3, n) if heavy else rng.normal(0, 1, n)) * sd
            y = 4 + 0.3 * k + (0.1 + 0.02 * k) * u + 1.2e-3 * L + rng.normal(0, shift_sd) + e
            out.append(pd.DataFrame({"generation_id": gid, "prompt_id": f"p{p}", "category": f"c{p % 4}",
                                     "K": k, "m": k + 1, "round": np.arange(1, n + 1), "step": 1000 - gid * 50 + np.arange(n),
                                     "phase": "decode", "t_target_ms": y, "t_draft_ms": 0.3 * k + 0.1, "u_bar": u,
                                     "e_max": u + rng.normal(3, 1, n), "context_len": L, "kv_usage": L / 4e4,
                                     "graph_bucket": k + 1}))
            gid += 1
    return pd.concat(out, ignore_index=True)


def _cluster_ols(y, x, groups):
    return sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(groups)[0]}, use_t=True)


def test_cv_mape_and_medape_match_sklearn():
    df = planted(seed=1)
    mom = CellMoments.from_rounds(df)
    folds = group_folds(mom, 5)
    cv = cross_validate(mom, Design.linear("u_bar", "context_len"), folds)
    row_fold = folds[mom.row_attr("cluster")]
    for f in range(5):
        te = row_fold == f
        y, yhat = mom.y[te], cv.oof[te]
        assert cv.folds.loc[f, "mape"] == pytest.approx(100 * mean_absolute_percentage_error(y, yhat), rel=1e-12)
        assert cv.folds.loc[f, "medape"] == pytest.approx(100 * median_absolute_error(np.ones_like(y), yhat / y),
                                                          rel=1e-12)


def test_standardized_coefficients_match_a_fit_on_z_scored_data():
    df = planted(seed=2)
    res = stats.analyze_factors(df)
    for k in (1, 5):
        d = df[df["K"] == k]
        z = lambda v: (v - v.mean()) / v.std(ddof=0)
        ref = sm.OLS(z(d["t_target_ms"]).to_numpy(), sm.add_constant(np.column_stack(
            [z(d["u_bar"]), z(d["context_len"])]))).fit().params
        bk = res.by_k[res.by_k["K"] == k].set_index("term")["beta_std"]
        assert bk["u_bar"] == pytest.approx(ref[1], rel=1e-9)
        assert bk["context_len"] == pytest.approx(ref[2], rel=1e-9)


def test_paired_rmse_reduction_matches_sklearn_refits():
    df = planted(seed=3)
    res = stats.analyze_factors(df)
    groups = df["generation_id"].to_numpy()
    d = []
    for tr, te in GroupKFold(n_splits=5).split(df, groups=groups):
        rmse = []
        for cols in (["u_bar"], ["u_bar", "context_len"]):
            x = df[cols].to_numpy(float)
            pred = LinearRegression().fit(x[tr], df["t_target_ms"].iloc[tr]).predict(x[te])
            rmse.append(np.sqrt(np.mean((df["t_target_ms"].iloc[te].to_numpy() - pred) ** 2)))
        d.append(rmse[0] - rmse[1])
    assert res.table.loc["context_len", "drmse"] == pytest.approx(np.mean(d), rel=1e-8)


def test_leave_one_k_out_matches_explicit_refits():
    df = planted(seed=4)
    res = stats.fit_final_model(df, n_boot=19)
    for k in (1, 3, 5):
        tr, te = df["K"] != k, df["K"] == k
        x = df[["u_bar", "context_len", "K"]].to_numpy(float)
        pred = LinearRegression().fit(x[tr], df["t_target_ms"][tr]).predict(x[te])
        ref = 100 * mean_absolute_percentage_error(df["t_target_ms"][te], pred)
        assert res.loko.set_index("K").loc[k, "loko_mape"] == pytest.approx(ref, rel=1e-9)


def test_smooth_form_matches_explicit_columns():
    df = planted(seed=5)
    mom = CellMoments.from_rounds(df)
    design = smooth_designs()["log m"][1]
    fit = fit_ols(mom, design)
    lm = np.log(df["m"].to_numpy(float))
    x = np.column_stack([np.ones(len(df)), df["u_bar"], lm, lm * df["u_bar"], df["context_len"]])
    ref = _cluster_ols(df["t_target_ms"].to_numpy(), x, df["generation_id"])
    np.testing.assert_allclose(fit.params.to_numpy(), ref.params, rtol=1e-8)
    np.testing.assert_allclose(fit.bse.to_numpy(), ref.bse, rtol=1e-6)


def test_prompt_clustered_se_matches_statsmodels():
    df = planted(seed=6)
    mom = CellMoments.from_rounds(df)
    design = Design.linear("u_bar", "context_len", "K")
    table = cluster_sensitivity(mom, [("pooled", design, fit_ols(mom, design))]).set_index("term")
    x = sm.add_constant(df[["u_bar", "context_len", "K"]].to_numpy(float))
    by_gen = _cluster_ols(df["t_target_ms"].to_numpy(), x, df["generation_id"])
    by_prompt = _cluster_ols(df["t_target_ms"].to_numpy(), x, df["prompt_id"])
    np.testing.assert_allclose(table["se_generation"].to_numpy(), by_gen.bse, rtol=1e-7)
    np.testing.assert_allclose(table["se_prompt"].to_numpy(), by_prompt.bse, rtol=1e-7)
    assert (table["n_prompts"] == 16).all()


def test_bootstrap_r2_and_stratified_counts():
    df = planted(seed=7)
    mom = CellMoments.from_rounds(df)
    w = unc.stratified_counts(mom, 12, seed=3)
    # every replicate keeps the number of generations of every K
    per_k = mom.cells.drop_duplicates("cluster").sort_values("cluster")["K"].to_numpy()
    for k in np.unique(per_k):
        assert (w[:, per_k == k].sum(1) == (per_k == k).sum()).all()
    design = Design.linear("u_bar", "context_len")
    beta, r2 = ClusterSums.of(mom, design).replicates(w)
    gens = mom.cells.drop_duplicates("cluster").sort_values("cluster")["generation_id"].to_numpy()
    by_gen = dict(tuple(df.groupby("generation_id")))
    for b in range(3):
        sample = pd.concat([by_gen[g] for g, c in zip(gens, w[b].astype(int)) for _ in range(c)])
        ref = sm.OLS(sample["t_target_ms"].to_numpy(), sm.add_constant(sample[["u_bar", "context_len"]].to_numpy(float))).fit()
        np.testing.assert_allclose(beta[b], ref.params, rtol=1e-8)
        assert r2[b] == pytest.approx(ref.rsquared, rel=1e-9)


# ---------------------------------------------------------------------------
# robustness section
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def robust():
    df = planted(n_gen_per_k=30, ks=(4, 8), seed=8, heavy=True)
    return df, stats.robustness_checks(df, k=8, n_boot=199, seed=2)


def _row(res, method, variant_part=""):
    e = res.estimates
    return e[(e["method"] == method) & e["variant"].str.contains(variant_part, regex=False)].iloc[0]


def test_bootstrap_row_reports_the_full_sample_estimate(robust):
    _, res = robust
    row = _row(res, "cluster bootstrap")
    assert row["alpha"] == res.base.params["u_bar"] and row["c"] == res.base.params["context_len"]
    assert row["alpha"] != pytest.approx(res.boot["u_bar"].mean(), rel=1e-9)  # not the bootstrap mean
    assert row["alpha_lower"] == pytest.approx(np.quantile(res.boot["u_bar"], 0.025))


def test_huber_matches_statsmodels_rlm_and_clustered_sandwich_reduces_to_ols(robust):
    df, res = robust
    d = df[df["K"] == 8]
    x = sm.add_constant(d[["u_bar", "context_len"]].to_numpy(float))
    y = d["t_target_ms"].to_numpy()
    ref = sm.RLM(y, x, M=sm.robust.norms.HuberT()).fit()
    for part in ("not clustered", "clustered by generation"):
        row = _row(res, "Huber (statsmodels RLM)", part)
        assert row["alpha"] == pytest.approx(ref.params[1], rel=1e-10)
    unclustered = _row(res, "Huber (statsmodels RLM)", "not clustered")
    assert unclustered["alpha_upper"] - ref.params[1] == pytest.approx(1.959964 * ref.bse[1], rel=1e-5)
    # with a huge threshold Huber is OLS, and the clustered sandwich is statsmodels' clustered covariance
    h = diag.huber_fit(y, x, d["generation_id"].to_numpy(), t=1e9)
    ols = _cluster_ols(y, x, d["generation_id"])
    np.testing.assert_allclose(h["params"], ols.params, rtol=1e-8)
    np.testing.assert_allclose(h["cov_cluster"], ols.cov_params(), rtol=1e-6)


def test_trim_matches_a_hand_trimmed_refit(robust):
    df, res = robust
    d = df[df["K"] == 8].reset_index(drop=True)
    x = sm.add_constant(d[["u_bar", "context_len"]].to_numpy(float))
    y = d["t_target_ms"].to_numpy()
    r = np.abs(sm.OLS(y, x).fit().resid)
    keep = np.argsort(r)[: int(np.ceil(0.99 * len(r)))]  # drop the 1% largest |residual|
    ref = _cluster_ols(y[keep], x[keep], d["generation_id"].to_numpy()[keep])
    row = _row(res, "trimmed")
    assert row["n"] == len(keep)
    assert row["alpha"] == pytest.approx(ref.params[1], rel=1e-9)
    assert row["alpha_upper"] == pytest.approx(ref.conf_int()[1, 1], rel=1e-8)


def test_run_halves_follow_the_engine_step_not_the_id(robust):
    df, res = robust
    # planted() numbers steps backwards: the last generation id ran first
    gens = sorted(df.loc[df["K"] == 8, "generation_id"].unique())
    first_run = gens[len(gens) // 2:]
    d = df[(df["K"] == 8) & df["generation_id"].isin(first_run)]
    ref = _cluster_ols(d["t_target_ms"].to_numpy(), sm.add_constant(d[["u_bar", "context_len"]].to_numpy(float)),
                       d["generation_id"])
    assert _row(res, "run halves", "first half")["alpha"] == pytest.approx(ref.params[1], rel=1e-9)
    assert "engine step" in res.halves["order_by"]


@pytest.mark.parametrize("hetero", [0.0, 1.5])
def test_breusch_pagan_on_a_categorical_design(hetero):
    """A categorical design (one intercept per K, no constant column, which het_breuschpagan wants) gives
    the tests of the same column space written with a constant, at df = rank - 1; planted variance that
    grows with Ū is found."""
    df = planted(seed=9, hetero=hetero, shift_sd=0.0)
    d = df[df["K"].isin([2, 3])]
    dummies, xs = pd.get_dummies(d["K"]).to_numpy(float), d[["u_bar", "context_len"]].to_numpy(float)
    x_const = np.column_stack([np.ones(len(d)), dummies[:, 1:], xs])
    resid = sm.OLS(d["t_target_ms"].to_numpy(), x_const).fit().resid
    ours, const = diag.breusch_pagan(resid, np.column_stack([dummies, xs])), diag.breusch_pagan(resid, x_const)
    assert ours["df"] == const["df"] == 3 and ours["n"] == len(d)
    for key in ("classic_lm", "classic_p", "koenker_lm", "koenker_p"):
        assert ours[key] == pytest.approx(const[key], rel=1e-8, abs=1e-300)
    if hetero:
        assert ours["classic_p"] < 1e-6 and ours["koenker_p"] < 1e-3  # planted: variance grows with Ū
    else:
        assert ours["classic_p"] > 1e-3 and ours["koenker_p"] > 1e-3


def test_robustness_reports_both_bp_versions_at_k_and_pooled():
    df = planted(n_gen_per_k=20, ks=(2, 8), seed=10, hetero=1.5)
    res = stats.robustness_checks(df, k=8, n_boot=19)
    bp = res.breusch_pagan
    assert len(bp) == 4 and set(bp["scope"].str.startswith("K = 8")) == {True, False}
    pooled = bp[bp["scope"].str.startswith("pooled")]
    assert (pooled["df"] == 4).all()  # categorical at m = 3, 9: 2 intercepts, 2 slopes, c -> 5 columns
    assert (pooled["p"] < 1e-6).all()


def test_binned_means_wald_and_trend_match_statsmodels():
    df = planted(seed=11)
    d = df[df["K"] == 2].reset_index(drop=True)
    rng = np.random.default_rng(0)
    resid = 0.02 * (d["round"].to_numpy() > 25) + rng.normal(0, 0.05, len(d))  # a step in position
    g = d["generation_id"].to_numpy()
    bins = diag.binned_residuals(resid, d["round"].to_numpy(float), g, n_bins=5)
    b = diag.quantile_bins(d["round"].to_numpy(float), 5)
    for _, row in bins.iterrows():
        sel = b == row["bin"]
        ref = _cluster_ols(resid[sel], np.ones(sel.sum()), g[sel])
        assert row["mean_resid"] == pytest.approx(ref.params[0], rel=1e-10)
        assert row["se"] == pytest.approx(ref.bse[0], rel=1e-8)
    dummies = np.eye(b.max() + 1)[b]
    f_ref = _cluster_ols(resid, dummies, g).f_test(np.eye(dummies.shape[1]))
    wald = diag.bin_means_wald(resid, b, g)
    # statsmodels' small-sample factor uses p = bins, as ours does
    assert wald["wald_f"] == pytest.approx(float(np.squeeze(f_ref.fvalue)), rel=1e-8)
    assert wald["wald_p"] == pytest.approx(float(f_ref.pvalue), rel=1e-6)
    tr = diag.trend_test(resid, d["round"].to_numpy(float), d, "round", n_bins=5)
    ref = _cluster_ols(resid, sm.add_constant(d["round"].to_numpy(float)), g)
    assert tr["slope"] == pytest.approx(ref.params[1], rel=1e-9)
    assert tr["p"] == pytest.approx(ref.pvalues[1], rel=1e-6)
    assert tr["p"] < 0.01  # the planted step shows as a trend
