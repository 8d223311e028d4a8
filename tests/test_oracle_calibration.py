"""The surrogate calibration check: finds a planted miscalibration and undoes it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from speclimits.costmodel import CostModel
from speclimits.oracle import load_inputs, solve
from speclimits.oracle.calibration import (calibrate_match_prob, calibration_gap, calibration_table,
                                           compare_transitions)
from speclimits.trace import read_trace


def test_simulated_surrogate_is_calibrated(smoke_trace):
    inputs = load_inputs(read_trace(smoke_trace))
    table = calibration_table(inputs)
    assert abs(calibration_gap(inputs)) < 0.03
    big = table[table["states"] > 300]
    np.testing.assert_allclose(big["mean_match_prob"], big["observed_match_rate"], atol=0.05)


def test_planted_underconfidence_is_found_and_undone(smoke_trace):
    tr = read_trace(smoke_trace)
    inputs = load_inputs(tr)
    shy = replace(inputs, match_prob=inputs.match_prob ** 3, _cache={})  # same ranking, far less confident
    assert calibration_gap(shy) > 0.2
    fixed, iso = calibrate_match_prob(shy)
    assert abs(calibration_gap(fixed)) < 0.01
    # isotonic keeps the draft's ranking
    flat_old, flat_new = shy.match_prob.ravel(), fixed.match_prob.ravel()
    order = np.argsort(flat_old, kind="stable")
    assert np.all(np.diff(flat_new[order]) >= -1e-12)
    # and the bound computed on the recalibrated surrogate comes back near the truthful one
    model = CostModel.from_dict(tr.meta["truth"])
    truthful = solve(inputs, model, k_max=6).bounds.speedup
    shy_bound = solve(shy, model, k_max=6).bounds.speedup
    fixed_bound = solve(fixed, model, k_max=6).bounds.speedup
    assert shy_bound < truthful - 0.1
    assert abs(fixed_bound - truthful) < abs(shy_bound - truthful) / 3


def test_compare_transitions_exact_greedy_is_deterministic(smoke_trace):
    tr = read_trace(smoke_trace)
    inputs = load_inputs(tr)
    model = CostModel.from_dict(tr.meta["truth"])
    table = compare_transitions(inputs, model, k_max=6)
    assert list(table.index) == ["raw q", "calibrated q", "exact greedy (accept_len)"]
    exact = solve(inputs, model, k_max=6, deterministic=True).bounds.speedup
    assert table.loc["exact greedy (accept_len)", "oracle_speedup"] == exact


def test_cli_surrogate_option(smoke_trace, capsys):
    import json

    from speclimits.cli import main

    assert main(["oracle", str(smoke_trace), "--surrogate", "calibrated", "--k-max", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["surrogate"] == "calibrated" and out["speedup"] > 1.0
