"""The batch cost model (speclimits.stats.batch) on simulated batch traces with a planted truth:
recovery within the intervals (and a wrong implementation fails), the batch-1 reduction, the
validation by (b, K), the union of a step's experts, the frontier, the CLI and the errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits.cli import main
from speclimits.costmodel import BatchCostModel, CostModel
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps
from speclimits.simulate import BatchSim, preset, simulate_batch
from speclimits.stats import batch as sb
from speclimits.stats import fit_cost_model
from speclimits.trace import read_trace
from test_stats_recovery import _mean_truth as batch1_mean_truth

#: The test size: 32 prompts (2 batches of 16), K in {0, 1, 2, 3, 5, 7}: a second or two per trace.
SIZE = dict(n_prompts=32, k_values=(0, 1, 2, 3, 5, 7))


def _cfg():
    return preset("smoke", **SIZE)


@pytest.fixture(scope="module")
def batch_traces(tmp_path_factory):
    """Two seeded simulated batch traces (b = 1, 2, 4, 8, 16) and their config."""
    root = tmp_path_factory.mktemp("batch")
    cfg = _cfg()
    out = []
    for seed in (21, 22):
        simulate_batch(cfg, seed=seed, out=root / f"s{seed}", progress=False)
        out.append(root / f"s{seed}")
    return cfg, out


def _mean_truth(cfg) -> BatchCostModel:
    """The planted model as a conditional mean (the spikes do not depend on n: only the batch-1 part moves)."""
    t = BatchSim().truth(cfg)
    return BatchCostModel(batch1_mean_truth(cfg, t.base), dict(t.gamma), t.a_req, t.b_req, t.n_experts, t.top_k)


def _z_scores(model: BatchCostModel, truth: BatchCostModel) -> pd.DataFrame:
    """Every fitted coefficient against the truth: estimate, 95% interval, truth, inside, z."""
    tab = sb.coefficient_table(model)
    by_m = {"beta0": truth.base.beta0, "gamma": truth.gamma, "alpha": truth.base.alpha}
    scalar = {"c": truth.base.c, "a": truth.base.a, "b": truth.base.b, "a_req": truth.a_req, "b_req": truth.b_req}
    tab["truth"] = [by_m[n][m] if n in by_m else scalar[n] for n, m in zip(tab["name"], tab["m"])]
    tab["inside"] = (tab["truth"] >= tab["lower"]) & (tab["truth"] <= tab["upper"])
    half = (tab["upper"] - tab["lower"]) / 2
    tab["z"] = (tab["estimate"] - tab["truth"]) / (half / 1.97)
    return tab


def _recovered(tabs: list[pd.DataFrame]) -> bool:
    """Over the seeds >= 85% of the coefficients inside their 95% intervals, and none beyond 3.5 SEs on any
    seed (one m's coefficients are correlated, so an unlucky seed misses a block; a wrong implementation covers
    under 70% and misses by >= 5 SEs)."""
    inside = pd.concat([t["inside"] for t in tabs])
    return bool(inside.mean() >= 0.85 and all(t["z"].abs().max() < 3.5 for t in tabs))


def test_fit_recovers_the_planted_truth_within_its_intervals(batch_traces):
    cfg, paths = batch_traces
    truth = _mean_truth(cfg)
    tabs = []
    for path in paths:
        model = sb.fit_batch_cost_model(path)
        tab = _z_scores(model, truth)
        tabs.append(tab)
        assert len(tab) == 3 * len(SIZE["k_values"]) + 5  # beta0, gamma, alpha per m; c; a, b, a_req, b_req
        assert tab[["lower", "upper"]].notna().all().all(), "every coefficient is identified at b = 1..16"
        fit = model.extra["fit"]
        assert fit["target"]["r2"] > 0.99 and fit["target"]["n_steps"] > 10_000
        assert fit["target"]["n_clusters"] == sum(-(-32 // b) for b in (1, 2, 4, 8, 16)) * len(SIZE["k_values"])
        assert fit["batch_sizes"] == [1, 2, 4, 8, 16]
        json.dumps(model.to_dict(), allow_nan=False)  # JSON-safe extras
    assert _recovered(tabs), "\n".join(t.to_string() for t in tabs)


@pytest.mark.parametrize("mutation", ["n instead of n - 1", "per-request Ū instead of the step's"])
def test_a_wrong_implementation_fails_the_recovery(batch_traces, monkeypatch, mutation):
    """The recovery criterion has power: fitting with n for n - 1, or with the mean of the requests'
    own Ū in place of the step's Ū, misses the planted truth by many standard errors."""
    cfg, paths = batch_traces
    tr = read_trace(paths[0])
    right = sb.uniform_decode_steps

    def wrong(steps, rounds=None):
        uni = right(steps, rounds)
        if mutation.startswith("n "):
            uni["n"] = uni["n"] + 1
        else:
            dec = tr.rounds.loc[tr.rounds["phase"] == "decode"]
            own = dec.groupby(["batch_id", "step"])["u_bar"].mean()
            uni["u_bar"] = own.reindex(pd.MultiIndex.from_frame(uni[["batch_id", "step"]])).to_numpy()
        return uni

    monkeypatch.setattr(sb, "uniform_decode_steps", wrong)
    tab = _z_scores(sb.fit_batch_cost_model(tr), _mean_truth(cfg))
    assert not _recovered([tab])
    assert tab["z"].abs().max() > 5 and tab["inside"].mean() < 0.7, tab.to_string()


def test_intervals_are_the_cluster_jackknife_and_cr1_is_kept(batch_traces):
    """Default intervals come from the leave-one-batch-out jackknife, wider than statsmodels' CR1 for
    gamma (few large batches carry it); ``cov_type="cr1"`` gives statsmodels' own intervals."""
    _, paths = batch_traces
    jk = sb.fit_batch_cost_model(paths[0])
    cr1 = sb.fit_batch_cost_model(paths[0], cov_type="cr1")
    fj, fc = jk.extra["fit"]["target"], cr1.extra["fit"]["target"]
    assert fj["cov_type"].startswith("cluster jackknife") and fc["cov_type"].startswith("cluster-robust CR1")
    assert jk.gamma == cr1.gamma and jk.base.beta0 == cr1.base.beta0  # same point estimates
    assert fj["se_cr1"] == fc["se"]
    ratio = [fj["se"]["gamma"][m] / fj["se_cr1"]["gamma"][m] for m in fj["se"]["gamma"]]
    assert np.mean(ratio) > 1.05
    with pytest.raises(SpeclimitsError, match="cov_type"):
        sb.fit_batch_cost_model(paths[0], cov_type="hc3")


def test_batch1_reduction(batch_traces):
    """On the b = 1 steps the fit is fit_cost_model's (coefficients and clustered SEs), gamma and the per-request
    draft terms 0 and noted; the full fit's batch-1 part agrees within the intervals."""
    cfg, paths = batch_traces
    tr = read_trace(paths[0])
    one = sb.fit_batch_cost_model(tr, batch_sizes=[1])
    ref = fit_cost_model(tr.rounds.loc[tr.rounds["b"] == 1], top_k=cfg.top_k)
    fit, rfit = one.extra["fit"], ref.extra["fit"]
    # the batch-1 fit interpolates the m that no K of the sweep reaches (recorded); the batch fit does not
    filled = rfit["target"].get("interpolated_m", [])
    assert sorted(set(ref.ms) - set(filled)) == list(one.ms)
    for m in one.ms:
        assert one.base.beta0[m] == pytest.approx(ref.beta0[m], rel=1e-10, abs=1e-10)
        assert one.base.alpha[m] == pytest.approx(ref.alpha[m], rel=1e-10, abs=1e-12)
        assert fit["target"]["se_cr1"]["beta0"][str(m)] == pytest.approx(rfit["target"]["se_by_m"][str(m)]["beta0"],
                                                                         rel=1e-8)
        assert one.gamma[m] == 0.0 and fit["target"]["ci95"]["gamma"][str(m)] is None
    assert one.base.c == pytest.approx(ref.c, rel=1e-10)
    assert (one.base.a, one.base.b) == pytest.approx((ref.a, ref.b), rel=1e-10)
    assert fit["draft"]["se_cr1"]["a"] == pytest.approx(rfit["draft"]["a_se"], rel=1e-8)
    assert (one.a_req, one.b_req) == (0.0, 0.0)
    assert fit["target"]["identified"]["alpha"]["1"] is False
    assert any("alpha(1) := alpha(2)" in n for n in fit["notes"])
    assert any("a_req, b_req := 0" in n for n in fit["notes"])
    # the BatchCostModel at n = 1 is the batch-1 CostModel
    ks = np.array(SIZE["k_values"])
    assert np.allclose(one.step_ms(1, ks, 20.0, 500), one.base.round_ms(ks, 20.0, 500))
    # the fit on every b: its batch-1 part within the batch-1 fit's intervals of the difference
    full = sb.fit_batch_cost_model(tr)
    ff = full.extra["fit"]
    # (alpha(1) is a convention at batch 1, an estimate at batch > 1)
    misses = sum(abs(getattr(full.base, name)[m] - getattr(ref, name)[m])
                 > 1.97 * np.hypot(ff["target"]["se"][name][str(m)], rfit["target"]["se_by_m"][str(m)][name])
                 for m in one.ms for name in ("beta0", "alpha") if (m, name) != (1, "alpha"))
    assert misses <= 1
    assert abs(full.base.c - ref.c) < 1.97 * np.hypot(ff["target"]["se"]["c"], rfit["target"]["c_se"])
    assert abs(full.base.a - ref.a) < 1.97 * np.hypot(ff["draft"]["se"]["a"], rfit["draft"]["a_se"])


def test_uniform_decode_steps_on_a_constructed_table():
    steps = pd.DataFrame({
        "batch_id": [0, 0, 0, 0, 0], "b": 2, "K": 2, "step": [1, 2, 3, 4, 5],
        "n_reqs": [2, 2, 2, 1, 2], "n_decode": [0, 1, 2, 1, 2], "n_tokens": [300, 153, 6, 3, 6],
        "m_max": [160, 150, 3, 3, 3], "u_bar": 30.0, "context_total": 500, "t_target_ms": 10.0, "t_draft_ms": 1.0,
        "phase": ["prefill", "mixed", "decode", "decode", "decode"], "n_drafted_next": [4, 4, 4, 2, 4]})
    uni = sb.uniform_decode_steps(steps)
    assert uni["step"].tolist() == [3, 4, 5]
    assert uni[["m", "n", "k"]].to_numpy().tolist() == [[3, 2, 2.0], [3, 1, 2.0], [3, 2, 2.0]]
    # with rounds: step 5 has n_tokens == n * m_max but its requests verify 4 and 2 rows
    rounds = pd.DataFrame({"batch_id": 0, "step": [3, 3, 4, 5, 5], "m": [3, 3, 3, 4, 2], "phase": "decode"})
    assert sb.uniform_decode_steps(steps, rounds)["step"].tolist() == [3, 4]
    with pytest.raises(SpeclimitsError, match="lacks column"):
        sb.uniform_decode_steps(steps.drop(columns=["m_max"]))


def test_validation_table_small_errors_on_the_simulator_and_flags_a_wrong_model(batch_traces):
    cfg, paths = batch_traces
    tr = read_trace(paths[0])
    val = sb.validate_by_batch_k(tr)
    assert val[["b", "K"]].to_numpy().tolist() == [[b, k] for b in (1, 2, 4, 8, 16) for k in SIZE["k_values"]]
    assert val["err_cross_pct"].abs().max() < 2.0 and val["err_model_pct"].abs().max() < 2.0, val.to_string()
    assert (val["unmodelled_share"] > 0).all() and (val["unmodelled_share"] < 0.3).all()
    # the measured side: every step's time over the rounds' tokens
    steps, rounds = tr.steps if hasattr(tr, "steps") else sb.trace_steps(tr), tr.rounds
    sel = (steps["b"] == 4) & (steps["K"] == 3)
    tok = rounds.loc[(rounds["b"] == 4) & (rounds["K"] == 3), "n_emitted"].sum()
    row = val[(val["b"] == 4) & (val["K"] == 3)].iloc[0]
    assert row["ms_per_token"] == pytest.approx((steps.loc[sel, "t_target_ms"] + steps.loc[sel, "t_draft_ms"]).sum() / tok)
    assert row["n_batches"] == 8
    worst = val.attrs["worst"]
    assert worst == sb.worst_error(val) and f"b = {worst['b']}, K = {worst['K']}" in worst["text"]
    # the planted truth prices it as well as the fit does
    truth = _mean_truth(cfg)
    assert sb.validate_by_batch_k(tr, model=truth)["err_model_pct"].abs().max() < 2.0
    # a model that forgets the per-request terms is flagged, worst at the largest batch
    wrong = BatchCostModel.from_batch1(truth.base, cfg.n_experts, cfg.top_k)
    bad = sb.validate_by_batch_k(tr, model=wrong)
    assert bad["err_model_pct"].abs().max() > 5.0
    assert sb.worst_error(bad, "err_model_pct")["b"] == 16
    assert (bad.loc[bad["b"] == 1, "err_model_pct"].abs() < 2.0).all()  # at b = 1 it is the right model
    assert np.allclose(bad["err_cross_pct"], val["err_cross_pct"])  # cross-fits do not use the given model
    text = sb.validation_summary(val)
    assert "worst err_cross_pct" in text


def test_batch_folds_alternate_within_each_batch_size_and_k(batch_traces):
    _, paths = batch_traces
    steps = sb.trace_steps(paths[0])
    folds = sb.batch_folds(steps, 2)
    ids = steps[["b", "K", "batch_id"]].drop_duplicates().sort_values(["b", "K", "batch_id"])
    for (_, _), g in ids.groupby(["b", "K"]):
        assert folds.reindex(g["batch_id"]).tolist() == [i % 2 for i in range(len(g))]
    with pytest.raises(SpeclimitsError, match="folds >= 2"):
        sb.batch_folds(steps, 1)


def test_union_table_matches_independent_routing(batch_traces):
    """The simulator routes a step's requests independently: the step's Ū is the union formula of its requests' Ū,
    exactly at b = 1 and within 1% above (the formula on layer means overstates slightly); it sits below the
    saturation curve of the step's tokens, which it approaches as b grows."""
    cfg, paths = batch_traces
    ut = sb.step_union_table(paths[0])
    by = ut.by_batch_k
    one = by[by["b"] == 1]
    assert np.allclose(one["ratio_independent"], 1.0, atol=1e-9)
    many = by[by["b"] > 1]
    assert ((many["ratio_independent"] - 1).abs() < 0.01).all(), by.to_string()
    assert (many["ratio_independent"] <= 1 + 3 * many["ratio_independent_se"].fillna(0.001)).all()
    spec = by[by["K"] > 0]
    assert (spec["ratio_saturation"] < 0.95).all()
    k3 = by[by["K"] == 3].sort_values("b")
    assert k3["u_measured"].is_monotonic_increasing and (k3["u_measured"] <= cfg.n_experts).all()
    # K = 0, b = 1: one token per step, Ū = top_k
    assert np.allclose(by.loc[(by["b"] == 1) & (by["K"] == 0), "u_measured"], cfg.top_k)
    assert set(ut.steps.columns) >= {"u_measured", "u_independent", "u_saturation", "ratio_saturation"}
    assert "saturation" in ut.summary() and json.loads(dumps(ut.to_dict()))["n_experts"] == cfg.n_experts


def test_speedup_frontier_on_a_constructed_table():
    ms = {  # ms per token by (b, K); K = 0 is plain decoding
        0: {1: 10.0, 2: 6.0, 4: 4.0, 8: 3.0},
        1: {1: 7.0, 2: 4.5, 4: 3.5, 8: 2.9},   # pays at every b
        2: {1: 8.0, 2: 5.5, 4: 4.2, 8: 3.3},   # stops at b = 4
        3: {1: 11.0, 2: 7.0, 4: 5.0, 8: 4.0},  # never pays
        4: {1: 9.0, 2: 6.5, 4: 3.9, 8: 3.1},   # stops at 2, pays again at 4
    }
    val = pd.DataFrame([{"b": b, "K": k, "ms_per_token": v} for k, row in ms.items() for b, v in row.items()])
    fr = sb.speedup_frontier(val).set_index("K")
    assert np.isnan(fr.loc[1, "b_stop"]) and fr.loc[1, "last_b_paying"] == 8
    assert fr.loc[2, "b_stop"] == 4 and fr.loc[2, "last_b_paying"] == 2 and not fr.loc[2, "resumes"]
    assert fr.loc[3, "b_stop"] == 1 and np.isnan(fr.loc[3, "last_b_paying"])
    assert fr.loc[4, "b_stop"] == 2 and fr.loc[4, "resumes"]
    assert fr.loc[2, "speedup_b4"] == pytest.approx(4.0 / 4.2)
    with pytest.raises(SpeclimitsError, match="K = 0"):
        sb.speedup_frontier(val[val["K"] > 0])


def test_fit_batch_cli_writes_a_json_the_model_reads(batch_traces, tmp_path, capsys):
    _, paths = batch_traces
    out = tmp_path / "batch-cost.json"
    assert main(["fit", "--batch", str(paths[0]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Validation by (b, K)" in text and "worst err_cross_pct" in text and "stops paying" in text
    model = BatchCostModel.read(out)
    assert model.n_experts == 128 and model.top_k == 8 and set(model.gamma) == set(model.ms)
    assert "ci95" in model.extra["fit"]["target"]
    CostModel.read(out)  # also a valid batch-1 cost model
    assert main(["fit", str(paths[0]), "--batch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"batch_cost_model", "validation", "worst", "union", "frontier"} <= set(data)


def test_clear_errors_on_a_trace_without_steps(smoke_trace, capsys):
    for fn in (sb.fit_batch_cost_model, sb.validate_by_batch_k, sb.step_union_table):
        with pytest.raises(SpeclimitsError) as err:
            fn(smoke_trace)
        msg = str(err.value)
        assert str(smoke_trace) in msg and "no steps table" in msg and "--batch" in msg
    assert main(["fit", "--batch", str(smoke_trace)]) == 2
    assert "no steps table" in capsys.readouterr().err
