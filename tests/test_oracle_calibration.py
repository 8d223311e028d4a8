"""The surrogate calibration check: finds a planted miscalibration and undoes it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from speclimits.costmodel import CostModel
from speclimits.oracle import load_inputs, solve
from speclimits.oracle.calibration import calibrate_match_prob, calibration_gap, calibration_table
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


def test_compare_surrogates_against_the_reference_solver(smoke_trace):
    """Each row of the comparison equals the pure-Python reference solver on inputs built
    independently: raw match_prob, sklearn's isotonic map fitted by hand, exact greedy outcomes."""
    from sklearn.isotonic import IsotonicRegression

    from speclimits.oracle import compare_surrogates, prepare_oracle, solve_python

    tr = read_trace(smoke_trace)
    model = CostModel.from_dict(tr.meta["truth"])
    setup = prepare_oracle(tr, model, "raw")
    inputs = setup.raw_inputs
    small = inputs.subset(np.arange(3))
    table = compare_surrogates(prepare_oracle(tr, model, "raw"), k_max=3)
    assert list(table.index) == ["raw q", "calibrated q", "exact greedy (accept_len)"]
    # reached draft steps, by loops: step i of a state is tested when accept_len >= i and a
    # reference token exists for it
    xs, ys = [], []
    for row in range(inputs.n_states):
        rem = int(inputs.remaining[row])
        for i in range(inputs.k_list):
            if inputs.accept_len[row] >= i and i < rem - 1:
                xs.append(inputs.match_prob[row, i])
                ys.append(float(inputs.accept_len[row] >= i + 1))
    iso = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(xs, ys)
    calibrated = replace(small, match_prob=iso.predict(small.match_prob.ravel()).reshape(small.match_prob.shape),
                         _cache={})
    for label, inp, det in (("raw q", small, False), ("calibrated q", calibrated, False),
                            ("exact greedy (accept_len)", small, True)):
        v_ref, _ = solve_python(inp, model, k_max=3, deterministic=det)
        variant = {"raw q": "raw", "calibrated q": "calibrated", "exact greedy (accept_len)": "exact"}[label]
        sub = prepare_oracle(tr, model, variant)
        got = solve(sub.inputs.subset(np.arange(3)), model, k_max=3, deterministic=sub.deterministic)
        np.testing.assert_allclose(got.value[got.inputs.offsets[:-1]], [v_ref[i] for i in small.offsets[:-1]],
                                   rtol=1e-9)
    # the table's rows differ where the surrogates differ (the smoke draft is calibrated, but not exactly)
    assert table.loc["raw q", "oracle_speedup"] != table.loc["exact greedy (accept_len)", "oracle_speedup"]


def test_cli_surrogate_option(smoke_trace, capsys):
    import json

    from speclimits.cli import main

    assert main(["oracle", str(smoke_trace), "--surrogate", "calibrated", "--k-max", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["surrogate"] == "calibrated q" and out["speedup"] > 1.0
    assert main(["oracle", str(smoke_trace), "--k-max", "4", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["surrogate"] == "raw q" and "simulated" in auto["notes"][1]  # auto on a simulated trace
