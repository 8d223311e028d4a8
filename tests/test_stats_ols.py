"""Unit tests of the sufficient-statistics OLS engine against statsmodels, scipy and scikit-learn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats as sps
from sklearn.linear_model import LinearRegression

from speclimits.bootstrap import draw_counts
from speclimits.errors import SpeclimitsError
from speclimits.stats import (CellMoments, Design, cluster_bootstrap, cross_validate, fit_ols,
                              group_folds, t_interval)
from speclimits.stats.costfit import categorical_design, fit_joint


def _rounds(n_gen: int = 30, seed: int = 0) -> pd.DataFrame:
    """Small synthetic rounds: generations at K = 1..3, a cluster effect, heteroscedastic noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_gen):
        k = g % 3 + 1
        n = int(rng.integers(5, 40))
        u = rng.normal(10 + 3 * k, 2, n)
        L = np.arange(n) + rng.integers(100, 900)
        shock = rng.normal(0, 0.3)
        y = 5 + k + (0.1 + 0.05 * k) * u + 1e-3 * L + shock + rng.normal(0, 0.2 + 0.02 * u, n)
        rows.append(pd.DataFrame({"generation_id": g, "K": k, "m": k + 1, "t_target_ms": y, "u_bar": u,
                                  "context_len": L, "kv_usage": L / 5000, "graph_bucket": 2 ** k,
                                  "e_max": u + rng.normal(3, 1, n), "round": np.arange(n)}))
    return pd.concat(rows, ignore_index=True)


def _sm_cluster(y, x, groups):
    return sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)


def test_clustered_ols_matches_statsmodels():
    df = _rounds()
    mom = CellMoments.from_rounds(df)
    res = fit_ols(mom, Design.linear("u_bar", "context_len", "K"))
    x = sm.add_constant(df[["u_bar", "context_len", "K"]].to_numpy(float))
    ref = _sm_cluster(df["t_target_ms"].to_numpy(), x, df["generation_id"].to_numpy())
    np.testing.assert_allclose(res.params.to_numpy(), ref.params, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.bse, rtol=1e-8)
    np.testing.assert_allclose(res.conf_int().to_numpy(), ref.conf_int(), rtol=1e-8)
    np.testing.assert_allclose(res.pvalues.to_numpy(), ref.pvalues, rtol=1e-6, atol=1e-300)
    assert res.rsquared == pytest.approx(ref.rsquared, rel=1e-10)
    assert res.n_clusters == 30 and res.nobs == len(df)


def test_categorical_design_matches_statsmodels_dummies():
    df = _rounds(seed=1)
    mom = CellMoments.from_rounds(df)
    design, unident = categorical_design(mom)
    assert unident == []
    res = fit_ols(mom, design)
    cols = []
    for m in (2, 3, 4):
        d = (df["m"] == m).to_numpy(float)
        cols += [d, d * df["u_bar"].to_numpy()]
    x = np.column_stack(cols + [df["context_len"].to_numpy(float)])
    ref = _sm_cluster(df["t_target_ms"].to_numpy(), x, df["generation_id"].to_numpy())
    assert list(res.params.index) == ["beta0[2]", "alpha[2]", "beta0[3]", "alpha[3]", "beta0[4]", "alpha[4]", "c"]
    np.testing.assert_allclose(res.params.to_numpy(), ref.params, rtol=1e-8)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.bse, rtol=1e-7)


def test_m1_convention_when_u_bar_is_constant():
    df = _rounds(seed=2)
    rng = np.random.default_rng(5)
    extra = []
    for g in range(100, 110):  # K = 0 generations: u_bar = top_k exactly
        n = 20
        L = np.arange(n) + 300
        extra.append(pd.DataFrame({"generation_id": g, "K": 0, "m": 1, "u_bar": 8.0, "context_len": L,
                                   "t_target_ms": 7.0 + 0.1 * 8 + 1e-3 * L + rng.normal(0, 0.05, n),
                                   "kv_usage": L / 5000, "graph_bucket": 1, "e_max": 8.0, "round": np.arange(n)}))
    df = pd.concat([df, *extra], ignore_index=True)
    joint = fit_joint(CellMoments.from_rounds(df), top_k=8)
    assert "alpha[1]" not in joint.params.index and "beta0[1]" in joint.params.index
    row1 = joint.by_m.set_index("m").loc[1]
    row2 = joint.by_m.set_index("m").loc[2]
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
    df = _rounds(n_gen=40, seed=3)
    mom = CellMoments.from_rounds(df)
    folds = group_folds(mom, 5)
    assert set(folds.tolist()) == set(range(5))
    row_fold = folds[mom.row_attr("cluster")]
    per_gen = pd.Series(row_fold).groupby(df["generation_id"].to_numpy()).nunique()
    assert (per_gen == 1).all()
    design = Design.linear("u_bar", "context_len")
    cv = cross_validate(mom, design, folds)
    for f in range(5):
        tr, te = row_fold != f, row_fold == f
        x = df[["u_bar", "context_len"]].to_numpy(float)
        lr = LinearRegression().fit(x[tr], df["t_target_ms"].to_numpy()[tr])
        pred = lr.predict(x[te])
        np.testing.assert_allclose(cv.oof[te], pred, rtol=1e-9)
        y = df["t_target_ms"].to_numpy()[te]
        assert cv.folds.loc[f, "rmse"] == pytest.approx(np.sqrt(np.mean((y - pred) ** 2)), rel=1e-9)
        assert cv.folds.loc[f, "r2"] == pytest.approx(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def test_bootstrap_from_sufficient_statistics_equals_refits():
    df = _rounds(n_gen=25, seed=4)
    mom = CellMoments.from_rounds(df)
    design = Design.linear("u_bar", "context_len")
    w = draw_counts(mom.n_clusters, 20, seed=7)
    boot = cluster_bootstrap(mom, design, w)
    gens = np.sort(df["generation_id"].unique())
    by_gen = {g: d for g, d in df.groupby("generation_id")}
    for b in range(20):
        sample = pd.concat([by_gen[g] for g, c in zip(gens, w[b].astype(int)) for _ in range(c)])
        x = sm.add_constant(sample[["u_bar", "context_len"]].to_numpy(float), has_constant="add")
        ref = sm.OLS(sample["t_target_ms"].to_numpy(), x).fit().params
        np.testing.assert_allclose(boot.iloc[b].to_numpy(), ref, rtol=1e-8, atol=1e-10)
    assert (w.sum(axis=1) == mom.n_clusters).all()


def test_bad_input_names_the_problem():
    df = _rounds().drop(columns=["context_len"])
    with pytest.raises(SpeclimitsError, match="context_len"):
        CellMoments.from_rounds(df)
    df = _rounds()
    df.loc[7, "u_bar"] = np.nan
    with pytest.raises(SpeclimitsError, match=r"row 7.*u_bar"):
        CellMoments.from_rounds(df)
    mom = CellMoments.from_rounds(_rounds())
    with pytest.raises(SpeclimitsError, match="collinear|singular"):
        fit_ols(mom, Design.linear("u_bar", "u_bar"))
    with pytest.raises(SpeclimitsError, match="GroupKFold"):
        group_folds(mom.subset(mom.cells["cluster"].to_numpy() < 3), 5)
