"""The sufficient-statistics OLS engine and every analysis the statistics sections show, against an
independent reference: scikit-learn's metrics and refits, statsmodels (clustered, z-scored OLS, RLM,
het_breuschpagan, f_test), scipy, and hand-built refits on planted data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats as sps
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_absolute_percentage_error, median_absolute_error
from sklearn.model_selection import GroupKFold

from speclimits import stats
from speclimits.errors import SpeclimitsError
from speclimits.stats import diagnostics as diag
from speclimits.stats import uncertainty as unc
from speclimits.stats import (CellMoments, ClusterSums, Design, cluster_bootstrap, cross_validate, fit_joint, fit_ols,
                              group_folds, t_interval)
from speclimits.stats.comparisons import cluster_sensitivity, smooth_designs
from speclimits.trace import read_trace


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


def _categorical_x(df):
    cols = []
    for m in sorted(df["m"].unique()):
        d = (df["m"] == m).to_numpy(float)
        cols += [d, d * df["u_bar"].to_numpy()]
    return np.column_stack(cols + [df["context_len"].to_numpy(float)])


def _log_m_x(df):
    lm = np.log(df["m"].to_numpy(float))
    return np.column_stack([np.ones(len(df)), df["u_bar"], lm, lm * df["u_bar"], df["context_len"]])


@pytest.mark.parametrize("design, x, columns", [
    (lambda mom: Design.linear("u_bar", "context_len", "K"),
     lambda df: sm.add_constant(df[["u_bar", "context_len", "K"]].to_numpy(float)), None),
    (lambda mom: fit_joint(mom).design, _categorical_x,
     [f"{name}[{m}]" for m in range(2, 7) for name in ("beta0", "alpha")] + ["c"]),
    (lambda mom: smooth_designs()["log m"][1], _log_m_x, None),
], ids=["pooled", "categorical", "log m"])
def test_clustered_ols_matches_statsmodels(design, x, columns):
    df = planted(seed=12, hetero=1.0)
    mom = CellMoments.from_rounds(df)
    res = fit_ols(mom, design(mom))
    ref = _cluster_ols(df["t_target_ms"].to_numpy(), x(df), df["generation_id"])
    assert columns is None or list(res.params.index) == columns
    np.testing.assert_allclose(res.params.to_numpy(), ref.params, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.bse, rtol=1e-8)
    np.testing.assert_allclose(res.conf_int().to_numpy(), ref.conf_int(), rtol=1e-8)
    np.testing.assert_allclose(res.pvalues.to_numpy(), ref.pvalues, rtol=1e-6, atol=1e-300)
    assert res.rsquared == pytest.approx(ref.rsquared, rel=1e-10)
    assert res.n_clusters == 80 and res.nobs == len(df)


def test_m1_convention_when_u_bar_is_constant():
    df = planted(seed=2, ks=(1, 2, 3))
    rng = np.random.default_rng(5)
    extra = []
    for g in range(100, 110):  # K = 0 generations: u_bar = top_k exactly
        n, L = 20, np.arange(20) + 300
        extra.append(pd.DataFrame({"generation_id": g, "K": 0, "m": 1, "u_bar": 8.0, "context_len": L,
                                   "t_target_ms": 7.0 + 0.1 * 8 + 1e-3 * L + rng.normal(0, 0.05, n),
                                   "kv_usage": L / 5000, "graph_bucket": 1, "e_max": 8.0, "round": np.arange(n)}))
    joint = fit_joint(CellMoments.from_rounds(pd.concat([df, *extra], ignore_index=True)), top_k=8)
    assert "alpha[1]" not in joint.params.index and "beta0[1]" in joint.params.index
    row1, row2 = joint.by_m.set_index("m").loc[1], joint.by_m.set_index("m").loc[2]
    assert not row1["identified"] and row1["alpha"] == row2["alpha"]
    assert row1["beta0"] == pytest.approx(joint.params["beta0[1]"] - row2["alpha"] * 8)
    assert any("alpha(1) := alpha(2)" in n for n in joint.notes)


def test_t_interval_matches_scipy():
    v = np.array([0.81, 0.79, 0.86, 0.83, 0.80])
    mean, half = t_interval(v)
    lo, hi = sps.t.interval(0.95, df=4, loc=v.mean(), scale=sps.sem(v))
    assert mean == pytest.approx(v.mean())
    assert mean - half == pytest.approx(lo) and mean + half == pytest.approx(hi)


def test_folds_never_split_a_generation_and_cv_matches_sklearn():
    df = planted(seed=1)
    mom = CellMoments.from_rounds(df)
    folds = group_folds(mom, 5)
    assert set(folds.tolist()) == set(range(5))
    row_fold = folds[mom.row_attr("cluster")]
    assert (pd.Series(row_fold).groupby(df["generation_id"].to_numpy()).nunique() == 1).all()
    cv = cross_validate(mom, Design.linear("u_bar", "context_len"), folds)
    x = df[["u_bar", "context_len"]].to_numpy(float)
    for f in range(5):
        tr, te = row_fold != f, row_fold == f
        y, yhat = mom.y[te], cv.oof[te]
        np.testing.assert_allclose(yhat, LinearRegression().fit(x[tr], mom.y[tr]).predict(x[te]), rtol=1e-9)
        assert cv.folds.loc[f, "rmse"] == pytest.approx(np.sqrt(np.mean((y - yhat) ** 2)), rel=1e-9)
        assert cv.folds.loc[f, "r2"] == pytest.approx(1 - ((y - yhat) ** 2).sum() / ((y - y.mean()) ** 2).sum())
        assert cv.folds.loc[f, "mape"] == pytest.approx(100 * mean_absolute_percentage_error(y, yhat), rel=1e-12)
        assert cv.folds.loc[f, "medape"] == pytest.approx(100 * median_absolute_error(np.ones_like(y), yhat / y),
                                                          rel=1e-12)


def test_bad_input_names_the_problem():
    df = planted().drop(columns=["context_len"])
    with pytest.raises(SpeclimitsError, match="context_len"):
        CellMoments.from_rounds(df)
    df = planted()
    df.loc[7, "u_bar"] = np.nan
    with pytest.raises(SpeclimitsError, match=r"row 7.*u_bar"):
        CellMoments.from_rounds(df)
    mom = CellMoments.from_rounds(planted())
    with pytest.raises(SpeclimitsError, match="collinear|singular"):
        fit_ols(mom, Design.linear("u_bar", "u_bar"))
    with pytest.raises(SpeclimitsError, match="GroupKFold"):
        group_folds(mom.subset(mom.cells["cluster"].to_numpy() < 3), 5)


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


def test_bootstrap_from_sufficient_statistics_equals_refits():
    df = planted(seed=7)
    mom = CellMoments.from_rounds(df)
    w = unc.stratified_counts(mom, 12, seed=3)
    # every replicate keeps the number of generations of every K
    per_k = mom.cells.drop_duplicates("cluster").sort_values("cluster")["K"].to_numpy()
    for k in np.unique(per_k):
        assert (w[:, per_k == k].sum(1) == (per_k == k).sum()).all()
    design = Design.linear("u_bar", "context_len")
    beta, r2 = ClusterSums.of(mom, design).replicates(w)
    np.testing.assert_array_equal(cluster_bootstrap(mom, design, w).to_numpy(), beta)
    gens = mom.cells.drop_duplicates("cluster").sort_values("cluster")["generation_id"].to_numpy()
    by_gen = dict(tuple(df.groupby("generation_id")))
    for b in range(len(w)):
        sample = pd.concat([by_gen[g] for g, c in zip(gens, w[b].astype(int)) for _ in range(c)])
        ref = sm.OLS(sample["t_target_ms"].to_numpy(), sm.add_constant(sample[["u_bar", "context_len"]].to_numpy(float))).fit()
        np.testing.assert_allclose(beta[b], ref.params, rtol=1e-8)
        assert r2[b] == pytest.approx(ref.rsquared, rel=1e-9)


# -- robustness section --


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
    """A categorical design (an intercept per K, no constant column) gives het_breuschpagan's tests of the same
    column space written with a constant, at df = rank - 1; planted variance growing with Ū is found."""
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


def test_wald_test_of_binned_means_is_nan_with_fewer_clusters_than_bins():
    rng = np.random.default_rng(0)
    resid = rng.normal(size=200)
    bins = np.repeat(np.arange(10), 20)
    few = diag.bin_means_wald(resid, bins, np.tile(np.arange(4), 50))  # 4 generations, 10 bins
    assert np.isnan(few["wald_f"]) and np.isnan(few["wald_p"]) and few["wald_df"] == 10
    many = diag.bin_means_wald(resid, bins, np.arange(200) % 40)
    assert np.isfinite(many["wald_f"]) and 0 < many["wald_p"] < 1


def test_a_half_without_varying_experts_is_a_not_identified_row(smoke_trace):
    """On a thin trace a refit a subset cannot identify is a row that says so; the other checks stand."""
    rounds = read_trace(smoke_trace).rounds.copy()
    at8 = rounds["K"] == 8
    gens = np.sort(rounds.loc[at8, "generation_id"].unique())
    second = rounds["generation_id"].isin(gens[len(gens) // 2:]) & at8
    rounds.loc[second, "u_bar"] = 12.0  # no variation of Ū in the second half of the run
    res = stats.robustness_checks(rounds, k=8, n_boot=19)
    est = res.estimates.set_index("variant")
    first = est.loc["first half of the run"]
    assert np.isfinite(first["alpha"]) and np.isfinite(first["c"])
    late = [v for v in est.index if v.startswith("second half of the run (not identified: design is singular")]
    assert len(late) == 1 and np.isnan(est.loc[late[0], "alpha"])
    assert 0 < est.loc[late[0], "n"] < est.loc["all rounds", "n"]  # the rounds it had, not zero
    assert np.isfinite(est.loc["all rounds", "alpha"])  # the full fit still uses the first half's variation
