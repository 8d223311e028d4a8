"""The statistics and online-control charts encode the fields and carry the numbers of the results they draw,
at the package's common sizes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from chartspec import dataset_with, encodings

from speclimits import figures, stats
from speclimits.figures import _common
from speclimits.figures import control as fig
from speclimits.trace import read_trace


@pytest.fixture(scope="module")
def results(smoke_trace):
    rounds = read_trace(smoke_trace).rounds
    return (stats.fit_final_model(rounds, n_boot=49), stats.robustness_checks(rounds, k=8, n_boot=49),
            stats.analyze_factors(rounds), stats.fit_draft_model(rounds))


def test_boundary_and_coefficient_charts_mark_the_splits(results):
    final = results[0]
    spec = figures.boundary_chart(final).to_dict()
    d = dataset_with(spec, "candidate", "fold_rmse_mean", "reported")
    np.testing.assert_allclose(d["fold_rmse_mean"], final.boundary.curve["fold_rmse_mean"])
    np.testing.assert_allclose(d["hi"] - d["lo"], 2 * final.boundary.curve["fold_rmse_se"])
    chosen = "none" if final.boundary.split is None else f"m ≤ {final.boundary.split}"
    assert d.loc[d["reported"] == "reported", "candidate"].tolist() == [chosen]
    assert {("x", "candidate"), ("y", "fold_rmse_mean"), ("y2", "hi")} <= encodings(spec)
    spec = figures.coefficients_by_m_chart(final).to_dict()
    assert {("x", "m"), ("y", "est"), ("y", "lo"), ("y2", "hi"), ("x", "x")} <= encodings(spec)
    rules = dataset_with(spec, "x", "split")
    assert 4.5 in rules["x"].tolist()  # the paper's m = 4 | 5
    if final.boundary.split is not None:
        assert final.boundary.split + 0.5 in rules["x"].tolist()
    est = dataset_with(spec, "m", "est", "lo", "hi")
    np.testing.assert_allclose(est["est"], final.per_k["alpha"])


def test_mape_and_ladder_charts_carry_the_bootstrap_intervals(results):
    final = results[0]
    spec = figures.mape_by_k_chart(final).to_dict()
    assert {("x", "K"), ("y", "mape"), ("y2", "hi"), ("color", "model")} <= encodings(spec)
    d = dataset_with(spec, "K", "mape", "lo", "hi", "model")
    loko = d[d["model"] == "pooled, leave-one-K-out"]
    np.testing.assert_allclose(loko["lo"], final.loko["loko_lo"])
    np.testing.assert_allclose(loko["mape"], final.loko["loko_mape"])
    lad = dataset_with(figures.ladder_chart(final).to_dict(), "spec", "cv_mape", "lo", "hi")
    np.testing.assert_allclose(lad["hi"], final.ladder["cv_mape_hi"])
    assert (lad["lo"] <= lad["cv_mape"]).all() and (lad["cv_mape"] <= lad["hi"]).all()


def test_robustness_and_residual_charts(results):
    rob = results[1]
    spec = figures.robustness_chart(rob, "alpha").to_dict()
    assert {("y", "check"), ("x", "est"), ("x", "lo"), ("x2", "hi")} <= encodings(spec)
    d = dataset_with(spec, "check", "est", "lo", "hi")
    assert len(d) == len(rob.estimates)
    assert any("Huber" in c and "clustered by generation" in c for c in d["check"])
    np.testing.assert_allclose(d["est"], rob.estimates["alpha"])
    b = dataset_with(figures.binned_residuals_chart(rob).to_dict(), "variable", "mean_resid", "lo", "hi")
    np.testing.assert_allclose(b["hi"] - b["mean_resid"], 2 * rob.bins["se"])
    assert set(b["variable"]) == {"context_len", "kv_usage", "round"}


def test_factor_and_draft_charts(results):
    fac, draft = results[2], results[3]
    t = dataset_with(figures.factor_cv_chart(fac).to_dict(), "label", "r2", "r2_lo")
    np.testing.assert_allclose(t["r2"], fac.table["r2"])
    sk = dataset_with(figures.standardized_by_k_chart(fac).to_dict(), "K", "beta_std", "term_label")
    assert len(sk) == len(fac.by_k)
    dspec = figures.draft_line_chart(draft).to_dict()
    assert {("x", "K"), ("y", "mean_t_draft_ms"), ("y", "line_ms")} <= encodings(dspec)
    dl = dataset_with(dspec, "K", "mean_t_draft_ms", "line_ms")
    np.testing.assert_allclose(dl["line_ms"], draft.params["b"] + draft.params["a"] * dl["K"])


def test_bootstrap_chart_leaves_failed_resamples_out_and_says_how_many(results):
    import dataclasses

    rob = results[1]
    boot = rob.boot.copy()
    boot.loc[boot.index[:5], "u_bar"] = np.nan  # five resamples that missed a cell
    spec = figures.bootstrap_chart(dataclasses.replace(rob, boot=boot), "u_bar").to_dict()
    d = dataset_with(spec, "left", "right", "count")
    assert int(d["count"].sum()) == len(boot) - 5
    assert "5 of 49 resamples failed" in spec["encoding"]["x"]["title"]
    boot["u_bar"] = np.nan
    empty = figures.bootstrap_chart(dataclasses.replace(rob, boot=boot), "u_bar").to_dict()
    assert "no bootstrap resample could be fitted" in str(empty)


def _share(batch: int) -> pd.DataFrame:
    return pd.DataFrame({"policy": ["delta", "delta", "threshold", "threshold"],
                         "where": ["offline", "engine"] * 2, "share": [0.4, 0.3, 0.2, 0.25],
                         "lo": [0.3, 0.2, 0.1, 0.2], "hi": [0.5, 0.4, 0.3, 0.3], "batch": batch})


def test_share_captured_stacks_one_panel_per_batch_with_its_own_rows():
    spec = fig.share_captured_by_batch({1: _share(1), 4: _share(4)}).to_dict()
    assert len(spec["vconcat"]) == 2 and spec["resolve"]["scale"]["x"] == "shared"
    for panel, b in zip(spec["vconcat"], (1, 4)):
        assert panel["spec"]["width"] == _common.WIDTH and panel["spec"]["height"] == _common.HEIGHT * 0.8
        rows = pd.DataFrame(spec["datasets"][panel["data"]["name"]])
        assert set(rows["batch"]) == {b} and len(rows) == 4  # each panel draws its own batch only
    assert {("x", "share"), ("x", "lo"), ("x2", "hi"), ("y", "policy")} <= encodings(spec)


def test_k_along_reference_draws_the_policies_and_both_oracles():
    frame = pd.DataFrame({"pos": [0, 1, 2], "k_star_exact": [3, 2, 1], "k_star_surrogate": [3, 3, 1],
                          "delta": [2, np.nan, 1]})
    spec = fig.k_along_reference(frame, ["delta"]).to_dict()
    assert spec["width"] == _common.WIDTH and spec["height"] == _common.HEIGHT
    d = dataset_with(spec, "who", "pos", "k")
    assert sorted(set(d["who"])) == ["delta", "k_star_exact", "k_star_surrogate"]
    assert len(d) == 8  # the state delta's walk did not visit is left out
