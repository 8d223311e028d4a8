"""The Oracle solver against brute force, shortest paths, and its own invariants; input validation."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra

from speclimits.costmodel import CostModel
from speclimits.errors import CostModelError, SpeclimitsError, TraceFormatError
from speclimits.oracle import OracleInputs, evaluate_policy, solve

from reference_oracle import random_inputs, random_model, solve_python


def policy_value(inputs: OracleInputs, model: CostModel, seq: int, actions, k_max: int, deterministic: bool) -> float:
    """V(0) of one sequence under a fixed per-state policy, by the definition (P(a = j) sums)."""
    lo, n_tok = int(inputs.offsets[seq]), int(inputs.n_tokens[seq])
    v = [0.0] * (n_tok + 1)
    for n in range(n_tok - 1, -1, -1):
        row, k = lo + n, actions[n]
        cost = float(model.draft_ms(k)) + float(model.target_ms(k + 1, inputs.u_bar_window[row, k],
                                                                  inputs.context_len[row]))
        if deterministic:
            probs = [1.0 if j == min(k, inputs.accept_len[row]) else 0.0 for j in range(k + 1)]
        else:
            at_least = [float(np.prod(inputs.match_prob[row, :j])) for j in range(k + 2)]
            probs = [at_least[j] - (at_least[j + 1] if j < k else 0.0) for j in range(k + 1)]
        v[n] = cost + sum(p * v[min(n_tok, n + j + 1)] for j, p in enumerate(probs))
    return v[0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("deterministic", [False, True])
def test_oracle_equals_brute_force_minimum(seed, deterministic):
    rng = np.random.default_rng(seed)
    k_max = int(rng.integers(1, 4))
    n_tokens = [int(rng.integers(1, 8)), int(rng.integers(1, 8))]
    inputs = random_inputs(rng, n_tokens, k_list=3)
    model = random_model(rng, 4)
    allow_k0 = bool(seed % 2)
    res = solve(inputs, model, k_max=k_max, allow_k0=allow_k0, deterministic=deterministic)
    actions = range(0 if allow_k0 else 1, k_max + 1)
    for s, n_tok in enumerate(n_tokens):
        values = {pol: policy_value(inputs, model, s, pol, k_max, deterministic)
                  for pol in itertools.product(actions, repeat=n_tok)}
        best, lo = min(values.values()), int(inputs.offsets[s])
        assert res.per_sequence["value_ms"].iloc[s] == pytest.approx(best, abs=1e-9, rel=0)
        assert res.value[lo] == pytest.approx(best, abs=1e-9, rel=0)
        # Q(0, k) is the cost of k now and the optimal policy afterwards; static K by its definition
        rest = tuple(int(k) for k in res.k_star[lo + 1: lo + n_tok])
        for k in actions:
            assert res.q[lo, k] == pytest.approx(values[(k,) + rest], abs=1e-9)
            if k:
                assert res.per_sequence[f"static_{k}_ms"].iloc[s] == pytest.approx(values[(k,) * n_tok], abs=1e-9)
        assert res.k_star[lo] == min(actions, key=lambda k: res.q[lo, k])


@pytest.mark.parametrize("seed", range(4))
def test_deterministic_variant_is_a_shortest_path(seed):
    rng = np.random.default_rng(100 + seed)
    n_tok, k_max = int(rng.integers(20, 60)), int(rng.integers(2, 8))
    inputs = random_inputs(rng, [n_tok], k_list=8)
    model = random_model(rng, 9)
    res = solve(inputs, model, k_max=k_max, deterministic=True)
    cost = res.cost
    best = {}
    for n in range(n_tok):
        for k in range(1, k_max + 1):
            nxt = min(n_tok, n + min(k, int(inputs.accept_len[n])) + 1)
            best[(n, nxt)] = min(best.get((n, nxt), np.inf), cost[n, k])
    (src, dst), w = zip(*best.keys()), list(best.values())
    graph = coo_matrix((w, (src, dst)), shape=(n_tok + 1, n_tok + 1)).tocsr()
    dist = dijkstra(graph, directed=True, indices=0)
    assert res.value[0] == pytest.approx(dist[n_tok], abs=1e-9)


def test_vectorized_matches_python_loop_on_many_sequences():
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, list(rng.integers(1, 40, 25)), k_list=6)
    model = random_model(rng, 7)
    for det, k0 in itertools.product([False, True], repeat=2):
        res = solve(inputs, model, k_max=5, allow_k0=k0, deterministic=det)
        v, k = solve_python(inputs, model, 5, allow_k0=k0, deterministic=det)
        np.testing.assert_allclose(res.value, v, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(res.k_star, k)


def test_bounds_invariants():
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, list(rng.integers(5, 60, 12)), k_list=6)
    model = random_model(rng, 7)
    res = solve(inputs, model)
    bd = res.bounds
    for k, total in bd.static_ms.items():
        assert bd.oracle_ms <= total + 1e-9
        # static K evaluation agrees with evaluate_policy
        ev = evaluate_policy(res, actions=np.full(inputs.n_states, k))
        assert ev["time_ms"].sum() == pytest.approx(total, rel=1e-12)
    assert bd.best_static_ms == min(bd.static_ms.values())
    # the autoregressive baseline: one token per round, cost C(n, 0) summed
    assert bd.autoregressive_ms == pytest.approx(float(np.sum(res.cost[:, 0])), rel=1e-12)
    # breakdown sums to the Oracle's time; rounds * tokens per round = tokens
    assert sum(bd.breakdown_ms.values()) == pytest.approx(bd.oracle_ms, rel=1e-10)
    rounds = res.per_sequence["rounds"].to_numpy()
    n_tok = res.per_sequence["n_tokens"].to_numpy()
    assert (rounds >= n_tok / (res.k_max + 1) - 1e-9).all() and (rounds <= n_tok + 1e-9).all()
    # each round emits accepted + 1 tokens except a last round that accepts every remaining token
    assert (res.per_sequence["accepted"].to_numpy() <= n_tok - rounds + 1 + 1e-9).all()
    assert 0 <= bd.mean_accepted <= res.k_max
    # the Oracle's own policy evaluated again gives V(0)
    ev = evaluate_policy(res, actions=res.k_star)
    np.testing.assert_allclose(ev["time_ms"], res.per_sequence["value_ms"], rtol=1e-12)
    json.dumps(res.to_json())
    # alpha scale: V is monotone in it, and the α = 0 policy re-priced at full cost is never faster
    full = res
    zero = solve(inputs, model, alpha_scale=0.0)
    half = solve(inputs, model, alpha_scale=0.5)
    assert (zero.value <= half.value + 1e-9).all() and (half.value <= full.value + 1e-9).all()
    assert zero.bounds.oracle_ms < full.bounds.oracle_ms
    repriced = evaluate_policy(full, actions=zero.k_star)["time_ms"].sum()
    assert repriced >= full.bounds.oracle_ms - 1e-9


def test_certain_match_takes_the_longest_draft():
    n = 30
    match = np.ones((n, 4))
    u = np.tile(8.0 + np.arange(5), (n, 1))
    inputs = OracleInputs.from_arrays([n], match, u)
    model = CostModel.from_dict({"target": {"c": 0.0, "by_m": {str(m): {"beta0": 5.0, "alpha": 0.0}
                                                                for m in range(1, 6)}},
                                 "draft": {"a": 0.1, "b": 0.0}})
    res = solve(inputs, model)
    # each round emits k + 1 tokens for 5 + 0.1 k ms: 30 tokens need 6 rounds of k = 4
    assert res.value[0] == pytest.approx(6 * 5.4) and res.k_star[0] == 4
    assert res.bounds.mean_accepted == pytest.approx(4.0)
    # with 3 tokens left, k = 2 finishes in one round and a longer draft only costs more
    assert res.k_star[n - 3] == 2 and res.value[n - 3] == pytest.approx(5.2)


def test_missing_m1_reports_autoregressive_unavailable():
    rng = np.random.default_rng(5)
    inputs = random_inputs(rng, [10, 12], k_list=3)
    model = random_model(rng, 4, with_m1=False)
    res = solve(inputs, model)
    assert res.bounds.autoregressive_ms is None and res.bounds.speedup is None
    assert "m = 1" in res.bounds.autoregressive_note
    assert res.to_json()["speedup"] is None and res.to_json()["static_ms"]
    with pytest.raises(CostModelError, match="m = 1"):
        solve(inputs, model, allow_k0=True)


def test_cost_model_missing_an_m_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(6)
    inputs = random_inputs(rng, [10], k_list=5)
    data = random_model(rng, 6).to_dict()
    del data["target"]["by_m"]["4"]
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(data))
    model = CostModel.read(path)
    with pytest.raises(CostModelError, match=r"m = \[4\]"):
        solve(inputs, model, k_max=5)
    solve(inputs, model, k_max=2)  # m = 2, 3 suffice for K_max = 2
    with pytest.raises(SpeclimitsError, match="k_max must be in 1..5"):
        solve(inputs, model, k_max=6)


def _frame(n=6, k=3):
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "seq_id": ["a"] * n, "pos": np.arange(n), "context_len": np.arange(n) + 10,
        "match_prob": list(rng.uniform(0, 1, (n, k))), "draft_conf": list(rng.uniform(0, 1, (n, k))),
        "accept_len": np.zeros(n, int), "u_bar_window": list(np.tile(8.0 + np.arange(k + 1), (n, 1))),
    })


def test_bad_inputs_name_file_column_and_rows():
    OracleInputs.from_frame(_frame())
    df = _frame()
    df.at[2, "match_prob"] = np.array([0.5, 0.5])
    with pytest.raises(TraceFormatError, match=r"column 'match_prob': lists must have length 3.*row 2"):
        OracleInputs.from_frame(df)
    df = _frame()
    df.at[4, "u_bar_window"] = np.array([8.0, 9.0, 10.0])
    with pytest.raises(TraceFormatError, match=r"'u_bar_window': lists must have length 4.*row 4"):
        OracleInputs.from_frame(df)
    df = _frame()
    df.at[1, "match_prob"] = np.array([0.5, 1.2, 0.1])
    df.at[3, "draft_conf"] = np.array([-0.1, 0.2, 0.1])
    with pytest.raises(TraceFormatError) as err:
        OracleInputs.from_frame(df)
    text = str(err.value)
    assert "'match_prob': probabilities must be finite and in [0, 1]" in text and "row 1" in text
    assert "'draft_conf'" in text and "row 3" in text
    df = _frame()
    df.loc[3, "pos"] = 4  # pos 3 missing, 4 twice
    with pytest.raises(TraceFormatError, match=r"pos = 0..N-1 exactly once"):
        OracleInputs.from_frame(df)
    df = _frame()
    df.loc[5, "accept_len"] = 7
    with pytest.raises(TraceFormatError, match=r"'accept_len': must be an integer in 0..3.*row 5"):
        OracleInputs.from_frame(df)
    with pytest.raises(TraceFormatError, match="'u_bar_window': required column is missing"):
        OracleInputs.from_frame(_frame().drop(columns="u_bar_window"))
