"""Delta Space, the α = 0 ablation, online policies, the command line and the book section."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import executed_notebook_text
from speclimits.cli import main
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle import evaluate_policy, load_inputs, prepare_oracle, solve, sweep_k_max
from speclimits.oracle.ablation import alpha_ablation
from speclimits.oracle.delta import best_slope, delta_points, delta_space, fit_line
from speclimits.oracle.inputs import CostTable
from speclimits.control.compare import compare_policies
from speclimits.control.fit import mean_u_bar, split_sequences
from speclimits.control.offline import draw_accept_lengths, evaluate_exact, rollout, state_actions
from speclimits.control.rules import ConfidenceThreshold, DeltaRule, StaticK
from speclimits.trace import read_trace


@pytest.fixture(scope="module")
def smoke(smoke_trace):
    tr = read_trace(smoke_trace)
    return tr, load_inputs(tr), CostModel.from_dict(tr.meta["truth"])


@pytest.fixture(scope="module")
def solved(smoke):
    _, inputs, model = smoke
    return solve(inputs, model)


# -- Delta Space ----------------------------------------------------------------


def test_best_slope_on_hand_data():
    s, acc = best_slope(np.array([1.0, 2.0, 3.0, 4.0]), np.array([True, True, False, False]))
    assert s == 2.5 and acc == 1.0
    s, acc = best_slope(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([True, False, True, False, False]))
    assert acc == pytest.approx(0.8) and s in (1.5, 3.5)


def test_delta_points_obey_the_bellman_identity(solved):
    pts = delta_points(solved)
    # ΔQ = ΔC - ΔE[a] · (V(n+k+1) - V(n+k+2)) exactly: the local form of the Delta-Space line
    np.testing.assert_allclose(pts["delta_q"], pts["delta_cost"] - pts["delta_accept"] * pts["local_lambda"],
                               atol=1e-9)
    # at the boundary: the first rejected extension never lowers Q; labels follow k*
    first_rej = pts[~pts["accepted"] & pts["boundary"]]
    assert (first_rej["delta_q"] >= -1e-9).all()
    merged = pts.merge(solved.to_frame()[["seq_id", "pos", "k_star"]], on=["seq_id", "pos"])
    assert (merged["accepted"] == (merged["k"] + 1 <= merged["k_star"])).all()
    assert (pts["delta_accept"].between(0, 1)).all()


def test_fit_line_recovers_a_planted_slope():
    rng = np.random.default_rng(0)
    n = 4000
    x = rng.uniform(0.05, 1, n)
    y = rng.uniform(-1, 8, n)
    pts = pd.DataFrame({"seq": rng.integers(0, 40, n), "delta_accept": x, "delta_cost": y,
                        "accepted": y <= 3.0 * x, "boundary": np.ones(n, bool), "local_lambda": 3.0})
    line = fit_line(pts, lambda_=3.0, n_boot=49)
    assert line.accuracy == 1.0 and line.accuracy_at_lambda == 1.0 and line.local_accuracy == 1.0
    assert line.slope == pytest.approx(3.0, abs=0.05)
    assert line.slope_ci[0] <= 3.0 <= line.slope_ci[1] and line.slope_ci[1] - line.slope_ci[0] < 0.3
    assert line.svm_accuracy > 0.99 and line.svm_slope == pytest.approx(3.0, rel=0.1)
    assert abs(line.svm_intercept) < 0.3
    # the testable prediction: the planted line has slope λ = 3, so λ lies in the slope's interval ...
    assert line.lambda_inside_interval and "holds" in line.verdict()
    # ... and a λ the points do not follow is rejected
    other = fit_line(pts, lambda_=4.0, n_boot=49)
    assert not other.lambda_inside_interval and "does not hold" in other.verdict()


def test_delta_space_on_a_trace(solved):
    ds = delta_space(solved, n_boot=9)
    line = ds.line
    assert line.lambda_ == pytest.approx(solved.bounds.ms_per_token)
    # the reported accuracies, recomputed by hand from the points
    pts = ds.points
    dx, dy, acc = pts["delta_accept"].to_numpy(), pts["delta_cost"].to_numpy(), pts["accepted"].to_numpy()
    assert line.accuracy == pytest.approx(((dy <= line.slope * dx) == acc).mean())
    assert line.accuracy_at_lambda == pytest.approx(((dy <= line.lambda_ * dx) == acc).mean())
    # the scan is exact: no through-origin slope does better (brute force over every cut between ratios)
    ratio = np.sort(np.unique(dy / dx))
    cuts = np.concatenate([[ratio[0] - 1], 0.5 * (ratio[1:] + ratio[:-1]), [ratio[-1] + 1]])
    sample = cuts[:: max(1, len(cuts) // 400)]
    brute = max(((dy <= s * dx) == acc).mean() for s in sample)
    assert line.accuracy >= brute - 1e-12
    assert 0.5 < line.accuracy <= 1
    assert len(line.to_frame()) > 5


# -- α = 0 ablation --------------------------------------------------------------


def test_alpha_ablation(smoke, solved):
    ab = alpha_ablation(solved)
    assert (ab.zero.value <= solved.value + 1e-9).all()
    assert ab.repriced_ms >= solved.bounds.oracle_ms - 1e-9
    assert ab.moves["share"].sum() == pytest.approx(1.0)
    assert ab.transitions["n_states"].sum() == solved.inputs.n_states
    c = ab.cases
    assert len(c) > 0 and (c["q0_diff"] < 0).all() and (c["k_star_alpha0"] != c["k_star"]).all()
    # recompute one case from the α = 0 Q table
    row = int(np.flatnonzero((solved.inputs.seq_ids[solved.inputs.seq_index] == c["seq_id"].iloc[0])
                             & (solved.inputs.pos == c["pos"].iloc[0]))[0])
    k = int(c["k_star"].iloc[0])
    assert ab.zero.q[row, k + 1] - ab.zero.q[row, k] == pytest.approx(c["q0_diff"].iloc[0])
    assert c["match_prob_added"].iloc[0] == pytest.approx(solved.inputs.match_prob[row, k])
    assert ab.case_summary()["n_cases"].sum() == len(c)
    # without an expert cost the ablation changes nothing
    _, inputs, model = smoke
    ab = alpha_ablation(solve(inputs, model.with_alpha_scale(0.0)))
    assert ab.moves.set_index("direction").loc["same", "share"] == 1.0
    assert ab.cases.empty and ab.repriced_ms == pytest.approx(ab.full.bounds.oracle_ms)


# -- policies -------------------------------------------------------------------


def test_split_is_seeded_disjoint_and_complete(smoke):
    _, inputs, _ = smoke
    tr1, te1 = split_sequences(inputs, 0.5, seed=3)
    tr2, te2 = split_sequences(inputs, 0.5, seed=3)
    assert np.array_equal(tr1, tr2) and np.array_equal(te1, te2)
    assert not set(tr1) & set(te1) and sorted(set(tr1) | set(te1)) == list(range(inputs.n_sequences))


def test_rollouts_agree_with_exact_evaluation(smoke):
    _, inputs, model = smoke
    table = CostTable.build(inputs, model, inputs.k_list)
    accept = draw_accept_lengths(inputs, inputs.k_list, 200, seed=0)
    for pol in (StaticK(3), ConfidenceThreshold(0.2)):
        pol.bind(inputs, table)
        exact = evaluate_exact(pol)["time_ms"].to_numpy()
        mc = rollout(pol, accept)
        z = (mc["time_ms"].sum() - exact.sum()) / np.sqrt((mc["time_se"] ** 2).sum())
        assert abs(z) < 4
    # with the trace's own greedy match lengths as the only draw, a rollout is the deterministic variant exactly
    pol = StaticK(4).bind(inputs, table)
    det = rollout(pol, inputs.accept_len[None, :].astype(np.int16))
    exact_det = evaluate_policy(inputs, model, actions=np.full(inputs.n_states, 4), deterministic=True)
    np.testing.assert_allclose(det["time_ms"], exact_det["time_ms"], rtol=1e-12)


def test_policy_edge_cases(smoke):
    _, inputs, model = smoke
    table = CostTable.build(inputs, model, 6)
    k, _ = state_actions(ConfidenceThreshold(0.0).bind(inputs, table))
    assert (k == 6).all()
    k, _ = state_actions(ConfidenceThreshold(1.01).bind(inputs, table))
    assert (k == 1).all()
    u = mean_u_bar(inputs, 6)
    # λ = 0: progress is worthless, so the rule never extends past k = 1
    k, extra = state_actions(DeltaRule(0.0, u, running_lambda=False).bind(inputs, table))
    assert (k == 1).all() and (extra == 0).all()
    # a huge λ: always extend to K_max
    k, _ = state_actions(DeltaRule(1e30, u, running_lambda=False).bind(inputs, table))
    assert (k == 6).all()
    k, extra = state_actions(DeltaRule(1e30, u, running_lambda=False, stop="greedy").bind(inputs, table))
    assert (k == 6).all() and (extra == 0).all()


def test_compare_policies(smoke):
    tr, inputs, model = smoke
    setup = prepare_oracle(tr, model).for_kind("greedy")
    pc = compare_policies(setup, k_max=6, seed=1, n_rollouts=24)
    t = pc.table.set_index("policy")
    oracle = t.loc["Oracle (bound)", "time_ms"]
    assert ((t["time_ms"] + 4 * t["time_se"]) >= oracle - 1e-9).all()
    assert t.loc["Oracle (bound)", "gain_captured"] == pytest.approx(1.0)
    assert t.loc[f"static K = {pc.best_static_k_test}", "gain_captured"] == pytest.approx(0.0, abs=1e-12)
    # the best static K in hindsight is the fastest static row: the solver and the policy evaluation agree
    static = t[t["kind"] == "static"]
    assert static["time_ms"].idxmin() == f"static K = {pc.best_static_k_test}"
    assert (t["speedup"] > 1).all()
    assert set(pc.fit.train_seq_ids).isdisjoint(pc.fit.test_seq_ids)
    assert pc.fit.k_max == 6
    curve = pd.DataFrame(pc.fit.curves["tau"])
    assert curve["train_time_ms"].min() == pytest.approx(curve.set_index("tau").loc[pc.fit.tau, "train_time_ms"])
    # the rollout harness agrees with the exact evaluation of the same state-only rule
    exact, mc = t.loc["confidence threshold"], t.loc["confidence threshold (rollouts)"]
    assert abs(exact["time_ms"] - mc["time_ms"]) < 4 * mc["time_se"] + 1e-9
    # every row is a PolicyFit.make name with its own label
    assert t.index.is_unique and (t["name"][t["kind"] != "oracle"] != "").all()
    # no m = 1: policies are still compared, speedups unavailable
    data = model.to_dict()
    del data["target"]["by_m"]["1"]
    setup2 = prepare_oracle(tr, CostModel.from_dict(data)).for_kind("greedy")
    pc2 = compare_policies(setup2, k_max=4, n_rollouts=4)
    assert pc2.table["speedup"].isna().all() and "unavailable" in pc2.notes[0]


def test_compare_policies_needs_one_kind_and_honours_the_exact_surrogate(smoke):
    """A setup of several kinds is refused; under the exact surrogate every rule is evaluated on the
    observed outcomes (static K as the deterministic policy evaluation, the running rules by replay)."""
    tr, inputs, model = smoke
    full = prepare_oracle(tr, model, "exact")
    if len(full.kind_counts()) > 1:
        with pytest.raises(SpeclimitsError, match="several reference kinds"):
            compare_policies(full, k_max=3)
    setup = full.for_kind("greedy")
    assert setup.deterministic
    pc = compare_policies(setup, k_max=3, names=["static:2", "delta", "ema"], n_rollouts=4)
    t = pc.table.set_index("name")
    assert t.loc["delta", "evaluation"] == "replay" and t.loc["delta", "time_se"] == 0.0
    test = setup.inputs.subset([list(map(str, setup.inputs.seq_ids)).index(s) for s in pc.fit.test_seq_ids])
    det = evaluate_policy(test, model, actions=np.full(test.n_states, 2), k_max=3, deterministic=True)
    assert t.loc["static:2", "time_ms"] == pytest.approx(det["time_ms"].sum())
    prob = evaluate_policy(test, model, actions=np.full(test.n_states, 2), k_max=3, deterministic=False)
    assert det["time_ms"].sum() != pytest.approx(prob["time_ms"].sum())  # the flag matters on this trace


# -- recovery: the fitted cost model gives the planted Oracle --------------------


def test_fitted_cost_model_recovers_the_planted_bound(smoke):
    tr, inputs, truth = smoke
    setup = prepare_oracle(tr)
    fitted, note = setup.model, setup.notes[0]
    assert "fitted" in note
    a, b = solve(inputs, truth).bounds, solve(inputs, fitted).bounds
    assert b.speedup == pytest.approx(a.speedup, rel=0.03)
    assert b.best_static_k == a.best_static_k


# -- command line -----------------------------------------------------------------


def _write_model(tmp_path, model, drop=()):
    data = model.to_dict()
    for m in drop:
        del data["target"]["by_m"][str(m)]
    path = tmp_path / f"cm_{'_'.join(map(str, drop)) or 'full'}.json"
    path.write_text(json.dumps(data))
    return path


def test_cli_json(smoke, smoke_trace, tmp_path, capsys):
    _, inputs, model = smoke
    cm = _write_model(tmp_path, model)
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(cm), "--k-max", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = solve(inputs, model, k_max=6).bounds
    assert out["oracle_ms"] == pytest.approx(ref.oracle_ms)
    assert out["speedup"] == pytest.approx(out["autoregressive_ms"] / out["oracle_ms"])
    assert sorted(out["static_ms"], key=int) == [str(k) for k in range(1, 7)]
    assert sum(r["value_ms"] for r in out["per_sequence"]) == pytest.approx(out["oracle_ms"])
    assert {r["seq_id"] for r in out["per_sequence"]} == set(inputs.seq_ids)
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(cm), "--alpha-scale", "0", "--json"]) == 0
    zero = json.loads(capsys.readouterr().out)
    assert zero["oracle_ms"] < out["oracle_ms"]
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(cm), "--deterministic"]) == 0
    assert "deterministic transitions" in capsys.readouterr().out


def test_cli_without_m1_and_with_missing_m(smoke, smoke_trace, tmp_path, capsys):
    _, _, model = smoke
    no_m1 = _write_model(tmp_path, model, drop=(1,))
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(no_m1), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speedup"] is None and out["autoregressive_ms"] is None and "m = 1" in out["autoregressive_note"]
    assert out["static_ms"] and out["oracle_ms"] > 0
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(no_m1), "--allow-k0"]) == 2
    assert "m = 1" in capsys.readouterr().err
    no_m5 = _write_model(tmp_path, model, drop=(5,))
    # without --k-max the Oracle stops at the longest draft the model can price, and says so
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(no_m5), "--json"]) == 0
    assert "so K_max is 3 here" in capsys.readouterr().err
    # a --k-max beyond it is refused, naming the missing m
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(no_m5), "--k-max", "6"]) == 2
    assert "m = [5]" in capsys.readouterr().err
    assert main(["oracle", str(smoke_trace), "--n-boot", "0", "--cost-model", str(no_m5), "--k-max", "3", "--json"]) == 0
    capsys.readouterr()
    assert main(["oracle", str(tmp_path / "nope")]) == 2


# -- book -------------------------------------------------------------------------


@pytest.mark.book
def test_oracle_notebook_executes_with_smoke_parameters(simulated_pages, default_book):
    text = executed_notebook_text(simulated_pages, "06_oracle")
    assert "SIMULATED" in text and "Traceback" not in text
    text = executed_notebook_text(default_book, "06_oracle")
    assert "SIMULATED" not in text and "Traceback" not in text
    assert "Oracle speedup over autoregressive" in text and "Share of surrogate Oracle's gain (%)" in text
    assert "tbl-oracle-shares" in text and "tbl-oracle-gap" in text and "share of the exact Oracle's gain" in text


# -- figures ----------------------------------------------------------------------


def test_figures_encode_the_results(smoke, solved):
    from chartspec import dataset_with, encodings

    from speclimits import figures

    _, inputs, model = smoke
    states = solved.to_frame()
    sweep = sweep_k_max(inputs, model, range(1, 4))
    spec = figures.oracle_speedup_by_k_max(sweep).to_dict()
    assert {("x", "k_max"), ("y", "x"), ("color", "bound")} <= encodings(spec)
    plotted = dataset_with(spec, "k_max", "bound", "x").pivot(index="k_max", columns="bound", values="x")
    np.testing.assert_allclose(plotted["Oracle"], sweep["speedup"])
    np.testing.assert_allclose(plotted["best static K"], sweep["best_static_speedup"])
    data = model.to_dict()
    del data["target"]["by_m"]["1"]
    no_ar = sweep_k_max(inputs, CostModel.from_dict(data), range(1, 4))
    spec = figures.oracle_speedup_by_k_max(no_ar).to_dict()
    assert spec["encoding"]["y"]["title"] == "ms per token (no autoregressive baseline)"
    oracle_rows = dataset_with(spec, "bound", "x").query("bound == 'Oracle'")
    np.testing.assert_allclose(oracle_rows["x"], no_ar["ms_per_token"])
    seq = states["seq_id"].iloc[0]
    spec = figures.oracle_value_along_sequence(states, seq).to_dict()
    assert {("x", "pos"), ("y", "value_ms"), ("y", "k_star")} <= encodings(spec)
    one = dataset_with(spec, "pos", "value_ms", "k_star")
    np.testing.assert_allclose(one["value_ms"], states.loc[states["seq_id"] == seq, "value_ms"])
    spec = figures.oracle_k_star_distribution(states).to_dict()
    shares = dataset_with(spec, "k_star")
    share_col = [c for c in shares.columns if c != "k_star"][0]
    expected = states["k_star"].value_counts(normalize=True).sort_index()
    np.testing.assert_allclose(shares.set_index("k_star")[share_col].sort_index(), expected)
    ds = delta_space(solved, n_boot=5)
    spec = figures.oracle_delta_space(ds.points, ds.line.slope, ds.line.lambda_, n=500).to_dict()
    assert {("x", "delta_accept"), ("y", "delta_cost")} <= encodings(spec)
    assert len(dataset_with(spec, "delta_accept", "delta_cost")) == min(500, len(ds.points))
    moves = alpha_ablation(solved).transitions
    spec = figures.oracle_ablation_moves(moves).to_dict()
    assert ("color", "n_states") in encodings(spec)
    assert dataset_with(spec, "n_states")["n_states"].sum() == moves["n_states"].sum()
