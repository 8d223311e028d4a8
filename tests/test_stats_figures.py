"""The statistics charts encode the fields and carry the numbers of the results they draw."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits import figures, stats
from speclimits.trace import read_trace


@pytest.fixture(scope="module")
def results(smoke_trace):
    rounds = read_trace(smoke_trace).rounds
    return (stats.fit_final_model(rounds, n_boot=49), stats.robustness_checks(rounds, k=8, n_boot=49),
            stats.analyze_factors(rounds), stats.fit_draft_model(rounds))


def _datasets(spec: dict) -> list[pd.DataFrame]:
    return [pd.DataFrame(v) for v in spec.get("datasets", {}).values()]


def _encodings(spec: dict) -> list[dict]:
    out = []

    def walk(node):
        if isinstance(node, dict):
            if "encoding" in node:
                out.append(node["encoding"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return out


def _frame_with(spec: dict, *cols: str) -> pd.DataFrame:
    frames = [d for d in _datasets(spec) if set(cols) <= set(d.columns)]
    assert frames, f"no dataset with columns {cols}"
    return frames[0]


def test_boundary_chart_marks_the_reported_candidate(results):
    final = results[0]
    spec = figures.boundary_chart(final).to_dict()
    d = _frame_with(spec, "candidate", "fold_rmse_mean", "reported")
    np.testing.assert_allclose(d["fold_rmse_mean"], final.boundary.curve["fold_rmse_mean"])
    np.testing.assert_allclose(d["hi"] - d["lo"], 2 * final.boundary.curve["fold_rmse_se"])
    chosen = "none" if final.boundary.split is None else f"m ≤ {final.boundary.split}"
    assert d.loc[d["reported"] == "reported", "candidate"].tolist() == [chosen]
    assert any(e.get("y2", {}).get("field") == "hi" for e in _encodings(spec))


def test_coefficients_chart_draws_both_splits(results):
    final = results[0]
    spec = figures.coefficients_by_m_chart(final).to_dict()
    rules = _frame_with(spec, "x", "split")
    assert 4.5 in rules["x"].tolist()  # the paper's m = 4 | 5
    if final.boundary.split is not None:
        assert final.boundary.split + 0.5 in rules["x"].tolist()
    est = _frame_with(spec, "m", "est", "lo", "hi")
    np.testing.assert_allclose(est["est"], final.per_k["alpha"])


def test_mape_and_ladder_charts_carry_the_bootstrap_intervals(results):
    final = results[0]
    d = _frame_with(figures.mape_by_k_chart(final).to_dict(), "K", "mape", "lo", "hi", "model")
    loko = d[d["model"] == "pooled, leave-one-K-out"]
    np.testing.assert_allclose(loko["lo"], final.loko["loko_lo"])
    np.testing.assert_allclose(loko["mape"], final.loko["loko_mape"])
    lad = _frame_with(figures.ladder_chart(final).to_dict(), "spec", "cv_mape", "lo", "hi")
    np.testing.assert_allclose(lad["hi"], final.ladder["cv_mape_hi"])
    assert (lad["lo"] <= lad["cv_mape"]).all() and (lad["cv_mape"] <= lad["hi"]).all()


def test_robustness_and_residual_charts(results):
    rob = results[1]
    spec = figures.robustness_chart(rob, "alpha").to_dict()
    d = _frame_with(spec, "check", "est", "lo", "hi")
    assert len(d) == len(rob.estimates)
    assert any("Huber" in c and "clustered by generation" in c for c in d["check"])
    np.testing.assert_allclose(d["est"], rob.estimates["alpha"])
    b = _frame_with(figures.binned_residuals_chart(rob).to_dict(), "variable", "mean_resid", "lo", "hi")
    np.testing.assert_allclose(b["hi"] - b["mean_resid"], 2 * rob.bins["se"])
    assert set(b["variable"]) == {"context_len", "kv_usage", "round"}


def test_factor_and_draft_charts(results):
    fac, draft = results[2], results[3]
    t = _frame_with(figures.factor_cv_chart(fac).to_dict(), "label", "r2", "r2_lo")
    np.testing.assert_allclose(t["r2"], fac.table["r2"])
    sk = _frame_with(figures.standardized_by_k_chart(fac).to_dict(), "K", "beta_std", "term_label")
    assert len(sk) == len(fac.by_k)
    dl = _frame_with(figures.draft_line_chart(draft).to_dict(), "K", "mean_t_draft_ms", "line_ms")
    np.testing.assert_allclose(dl["line_ms"], draft.params["b"] + draft.params["a"] * dl["K"])
