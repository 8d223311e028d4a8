"""The surrogate calibration check: finds a planted miscalibration and undoes it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from speclimits.cli import main
from speclimits.costmodel import CostModel
from speclimits.oracle import compare_surrogates, load_inputs, prepare_oracle, solve
from speclimits.oracle.calibration import calibration_gap, calibration_table, cross_fitted_match_prob
from speclimits.trace import read_trace

from reference_oracle import solve_python


def test_planted_underconfidence_is_found_and_undone(smoke_trace):
    tr = read_trace(smoke_trace)
    inputs = load_inputs(tr)
    # the simulated surrogate is calibrated ...
    table = calibration_table(inputs)
    assert abs(calibration_gap(inputs)) < 0.03
    big = table[table["states"] > 300]
    np.testing.assert_allclose(big["mean_match_prob"], big["observed_match_rate"], atol=0.05)
    # ... a planted underconfidence is found and undone
    shy = replace(inputs, match_prob=inputs.match_prob ** 3, _cache={})  # same ranking, far less confident
    assert calibration_gap(shy) > 0.2
    fixed = cross_fitted_match_prob(shy)
    assert abs(calibration_gap(fixed)) < 0.02  # cross-fitted: close to calibrated, not exactly (out of fold)
    # each position's map keeps the draft's ranking at that position
    for i in range(shy.k_list):
        order = np.argsort(shy.match_prob[:, i], kind="stable")
        same_fold = fixed.match_prob[order, i]
        assert np.corrcoef(shy.match_prob[order, i], same_fold)[0, 1] > 0.8
    # and the bound computed on the recalibrated surrogate comes back near the truthful one
    model = CostModel.from_dict(tr.meta["truth"])
    truthful = solve(inputs, model, k_max=6).bounds.speedup
    shy_bound = solve(shy, model, k_max=6).bounds.speedup
    fixed_bound = solve(fixed, model, k_max=6).bounds.speedup
    assert shy_bound < truthful - 0.1
    assert abs(fixed_bound - truthful) < abs(shy_bound - truthful) / 3


def test_cross_fitting_by_hand(smoke_trace):
    """Position 0 of the cross-fitted map, rebuilt by hand: folds by a seeded permutation of the
    sequences, sklearn's isotonic regression on the other folds' tested steps."""
    inputs = load_inputs(read_trace(smoke_trace))
    got = cross_fitted_match_prob(inputs, n_folds=3, seed=5)
    order = np.random.default_rng(5).permutation(inputs.n_sequences)
    fold_of = {int(s): j % 3 for j, s in enumerate(order)}
    fold = np.array([fold_of[int(s)] for s in inputs.seq_index])
    remaining = inputs.remaining
    for f in range(3):
        train = [r for r in range(inputs.n_states) if fold[r] != f and remaining[r] > 1]  # step 0 tested
        x = inputs.match_prob[train, 0]
        y = (inputs.accept_len[train] >= 1).astype(float)
        iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(x, y)
        test = fold == f
        np.testing.assert_allclose(got.match_prob[test, 0], iso.predict(inputs.match_prob[test, 0]))


def test_compare_surrogates_against_the_reference_solver(smoke_trace):
    """Each row of the comparison equals the pure-Python reference solver on the same surrogate."""
    tr = read_trace(smoke_trace)
    model = CostModel.from_dict(tr.meta["truth"])
    setup = prepare_oracle(tr, model, "raw")
    table = compare_surrogates(setup, k_max=3)
    assert list(table.index) == ["raw q", "calibrated q", "exact greedy (accept_len)"]
    calibrated = cross_fitted_match_prob(setup.raw_inputs)
    for label, inp, det in (("raw q", setup.raw_inputs, False), ("calibrated q", calibrated, False),
                            ("exact greedy (accept_len)", setup.raw_inputs, True)):
        v_ref, _ = solve_python(inp, model, k_max=3, deterministic=det)
        total = sum(v_ref[i] for i in inp.offsets[:-1])
        ar = float(np.sum(model.target_ms(1, inp.u_bar_window[:, 0], inp.context_len)))
        assert table.loc[label, "oracle_speedup"] == pytest.approx(ar / total, rel=1e-9)
    assert table.loc["raw q", "oracle_speedup"] != table.loc["exact greedy (accept_len)", "oracle_speedup"]


def test_cli_surrogate_option(smoke_trace, capsys):
    assert main(["oracle", str(smoke_trace), "--surrogate", "calibrated", "--k-max", "4", "--n-boot", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["surrogate"] == "calibrated q" and out["speedup"] > 1.0
    assert main(["oracle", str(smoke_trace), "--k-max", "4", "--n-boot", "0", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["surrogate"] == "raw q" and "no calibration gap" in auto["notes"][1]  # the simulated draft is calibrated
