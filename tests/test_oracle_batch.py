"""The Oracle at batch > 1 (speclimits.oracle.batch and its modules) against brute force and naive recursions on
small random instances; the relaxation bound below every static K, table and the exact b = 2 Oracle; the command line."""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from speclimits.cli import main
from speclimits.costmodel import BatchCostModel, union_unique
from speclimits.errors import SpeclimitsError
from speclimits.oracle import batch_pair, prepare_oracle, solve
from speclimits.oracle.batch import batch_bounds
from speclimits.oracle.batch_pair import pair_oracle
from speclimits.oracle.batch_problem import BatchProblem, group_matrix, groups, headline_references, trace_order
from speclimits.oracle.batch_relaxation import _rho, relaxation_bound, relaxed_cost_model
from speclimits.oracle.batch_tables import (DEFAULT_SAMPLES, EXACT_DP, EXACT_SIMULATION, MONTE_CARLO, evaluate_tables,
                                            search_table, simulate)

from reference_oracle import random_inputs, random_model


def random_batch_model(rng, m_max, n_experts=32, with_m1=True, negative_alpha=False):
    base = random_model(rng, m_max, with_m1=with_m1)
    if negative_alpha:  # some alpha(m) < 0: the relaxation then prices the share alpha * u_i
        base = replace(base, alpha={m: (-v if m % 2 else v) for m, v in base.alpha.items()})
    gamma = {m: float(rng.uniform(-0.5, 3.0)) for m in base.ms}
    return BatchCostModel.from_batch1(base, n_experts, 4, gamma=gamma, a_req=float(rng.uniform(0, 0.5)),
                                      b_req=float(rng.uniform(0, 0.5)))


def instance(seed, n_seq, n_max, k_list=3, n_experts=32, **kw):
    rng = np.random.default_rng(seed)
    n_tokens = [int(v) for v in rng.integers(1, n_max + 1, n_seq)]
    return random_inputs(rng, n_tokens, k_list=k_list), random_batch_model(rng, k_list + 1, n_experts, **kw), rng


# -- Naive references, written from the definitions (BatchCostModel.step_ms, union_unique) --


def step_cost(inputs, model, seqs, states, k):
    rows = [int(inputs.offsets[s]) + p for s, p in zip(seqs, states)]
    u = [inputs.u_bar_window[r, k] for r in rows]
    return float(model.step_ms(len(rows), k, union_unique(u, model.n_experts), sum(inputs.context_len[r] for r in rows)))


def outcome_probs(inputs, row, k, deterministic):
    """[(a, P(a))] for action k at a state, from match_prob products (or accept_len)."""
    if deterministic:
        return [(min(k, int(inputs.accept_len[row])), 1.0)]
    at_least = [float(np.prod(inputs.match_prob[row, :j])) for j in range(k + 1)]
    return [(a, at_least[a] - (at_least[a + 1] if a < k else 0.0)) for a in range(k + 1)]


def naive_value(inputs, model, seqs, k_max, deterministic, allow_k0, policy=None):
    """Expected time of a closed batch of ``seqs``: the minimum over joint k (policy None) or the joint k
    ``policy[n]`` with n active, by a plain recursive Bellman equation over the joint state."""
    n_tok = [int(inputs.n_tokens[s]) for s in seqs]
    actions = range(0 if allow_k0 else 1, k_max + 1)

    @functools.lru_cache(maxsize=None)
    def v(state):
        active = [i for i, p in enumerate(state) if p < n_tok[i]]
        if not active:
            return 0.0
        ks = actions if policy is None else [policy[len(active)]]
        best = np.inf
        for k in ks:
            total = step_cost(inputs, model, [seqs[i] for i in active], [state[i] for i in active], k)
            outs = [outcome_probs(inputs, int(inputs.offsets[seqs[i]]) + state[i], k, deterministic) for i in active]
            for combo in itertools.product(*outs):
                prob = float(np.prod([p for _, p in combo]))
                if prob == 0.0:
                    continue
                nxt = list(state)
                for i, (a, _) in zip(active, combo):
                    nxt[i] = min(n_tok[i], state[i] + a + 1)
                total += prob * v(tuple(nxt))
            best = min(best, total)
        return best

    return v(tuple(0 for _ in seqs))


# -- The exact b = 2 Oracle --


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("deterministic", [False, True])
def test_pair_oracle_equals_naive_bellman(seed, deterministic):
    # E = 16 at seeds 1 and 6 (k = 0 allowed at 1, not at 6): windows' u reach ~26 > E and the union clips
    inputs, model, rng = instance(100 + seed, 5, 6, n_experts=int(np.random.default_rng(seed).choice([16, 32])),
                                  negative_alpha=seed % 3 == 0)
    k_max, allow_k0 = int(rng.integers(1, 4)), bool(seed % 2)
    po = pair_oracle(inputs, model, k_max=k_max, deterministic=deterministic, allow_k0=allow_k0)
    assert [tuple(p) for p in po.pairs] == [(0, 1), (2, 3)] and list(po.singles_ms) == [4]
    for g, pair in enumerate(po.pairs):
        ref = naive_value(inputs, model, tuple(int(s) for s in pair), k_max, deterministic, allow_k0)
        assert po.value_ms[g] == pytest.approx(ref, abs=1e-9)
        assert po.ms_per_token[g] == pytest.approx(ref / inputs.n_tokens[pair].sum())
    alone = naive_value(inputs, model, (4,), k_max, deterministic, allow_k0)
    assert po.singles_ms[4] == pytest.approx(alone, abs=1e-9)
    assert po.total_ms == pytest.approx(po.value_ms.sum() + alone)
    # every state's value and the policy: V(p1, p2) = Q(p1, p2, k*) recomputed naively at an interior state
    v, pol = po.pair(0)
    n1, n2 = (int(inputs.n_tokens[s]) for s in po.pairs[0])
    assert v.shape == (n1 + 1, n2 + 1) and pol.shape == (n1, n2) and v[n1, n2] == 0.0
    assert ((pol >= (0 if allow_k0 else 1)) & (pol <= k_max)).all()
    k = int(pol[0, 0])
    q = step_cost(inputs, model, [0, 1], [0, 0], k)
    for (a1, p1), (a2, p2) in itertools.product(outcome_probs(inputs, 0, k, deterministic),
                                                outcome_probs(inputs, int(inputs.offsets[1]), k, deterministic)):
        q += p1 * p2 * v[min(n1, a1 + 1), min(n2, a2 + 1)]
    assert q == pytest.approx(v[0, 0], abs=1e-9)


def test_pair_oracle_chunks_and_unequal_lengths_agree(monkeypatch):
    inputs, model, _ = instance(7, 9, 12)
    whole = pair_oracle(inputs, model, k_max=3)
    monkeypatch.setattr(batch_pair, "_PAIR_MAX_BYTES", 1.0)  # one pair per chunk
    chunked = pair_oracle(inputs, model, k_max=3)
    np.testing.assert_allclose(chunked.value_ms, whole.value_ms, rtol=1e-13)
    assert (chunked.policy == whole.policy).all()


# -- Static K and tables --


@pytest.mark.parametrize("seed", range(5))
def test_b2_evaluation_equals_naive_recursion_and_simulation(seed):
    inputs, model, rng = instance(200 + seed, 5, 6)
    k_max = 3
    tables = [0, 1, 2, 3, {1: 2, 2: 0}, {1: 0, 2: 3}, {1: 3, 2: 1}]
    for det in (False, True):
        dp = evaluate_tables(inputs, model, 2, tables, k_max=k_max, deterministic=det, method=EXACT_DP)
        assert (dp.lo == dp.total_ms).all() and (dp.hi == dp.total_ms).all()
        for t, total in zip(dp.tables, dp.total_ms):
            ref = sum(naive_value(inputs, model, tuple(int(s) for s in g), k_max, det, True, policy=t)
                      for g in groups(inputs, 2))
            assert total == pytest.approx(ref, abs=1e-9)
        if det:  # one closed-batch simulation is exact
            sim = evaluate_tables(inputs, model, 2, tables, k_max=k_max, deterministic=True)
            assert sim.method == EXACT_SIMULATION
            np.testing.assert_allclose(sim.total_ms, dp.total_ms, rtol=1e-12)
        else:  # Monte Carlo agrees within its interval (the default at b = 2 is the exact evaluation)
            mc = evaluate_tables(inputs, model, 2, tables, k_max=k_max, method=MONTE_CARLO, n_samples=4000,
                                   seed=seed)
            assert mc.method == MONTE_CARLO and mc.n_samples == 4000
            half = (mc.hi - mc.lo) / 2
            assert (np.abs(mc.total_ms - dp.total_ms) <= 1.5 * half + 1e-9).all()
            assert evaluate_tables(inputs, model, 2, tables, k_max=k_max).method == EXACT_DP


@pytest.mark.parametrize("seed", range(3))
def test_b3_monte_carlo_and_simulation_against_naive_recursion(seed):
    inputs, model, _ = instance(300 + seed, 4, 3, k_list=2)
    tables = [0, 1, 2, {1: 1, 2: 2, 3: 0}]
    for det in (False, True):
        res = evaluate_tables(inputs, model, 3, tables, k_max=2, deterministic=det, n_samples=4000, seed=seed)
        refs = np.array([sum(naive_value(inputs, model, tuple(int(s) for s in g), 2, det, True, policy=t)
                             for g in groups(inputs, 3)) for t in res.tables])
        if det:
            np.testing.assert_allclose(res.total_ms, refs, rtol=1e-12)
        else:
            assert res.method == MONTE_CARLO
            assert (np.abs(res.total_ms - refs) <= 1.5 * (res.hi - res.lo) / 2 + 1e-9).all()


def test_plain_decoding_is_static_k0_whatever_the_surrogate():
    inputs, model, _ = instance(5, 6, 8)
    exact = evaluate_tables(inputs, model, 3, [0, 1], k_max=3, deterministic=True).total_ms
    # plain decoding: one token per round, every request, whatever the surrogate
    plain = evaluate_tables(inputs, model, 3, 0, k_max=3, n_samples=16).total_ms[0]
    assert plain == pytest.approx(exact[0], rel=1e-12) and exact[0] != exact[1]


def best_table(inputs, model, b, n_samples=DEFAULT_SAMPLES, seed=0, **problem):
    return search_table(BatchProblem.build(inputs, model, **problem), groups(inputs, b), b, n_samples, seed)


@pytest.mark.parametrize("seed", range(3))
def test_best_table_is_a_coordinate_wise_optimum(seed):
    inputs, model, _ = instance(400 + seed, 7, 8)
    b = 3
    best = best_table(inputs, model, b, k_max=3, deterministic=True)
    static = evaluate_tables(inputs, model, b, [0, 1, 2, 3], k_max=3, deterministic=True)
    assert best.total_ms <= static.total_ms.min() + 1e-9
    assert best.start_k == int(np.argmin(static.total_ms))
    for n in range(1, b + 1):
        cand = [{**best.table, n: k} for k in range(4)]
        vals = evaluate_tables(inputs, model, b, cand, k_max=3, deterministic=True).total_ms
        assert vals.min() >= best.total_ms * (1 - 1e-12)


@pytest.mark.parametrize("deterministic", [False, True])
def test_runs_continued_from_a_snapshot_equal_runs_from_the_start(deterministic):
    # the best-table search simulates candidates that differ in entry n from the current table's state
    # once n requests are left; their totals must be those of a whole simulation, to the bit
    inputs, model, _ = instance(21, 9, 9)
    b = 4
    ctx = BatchProblem.build(inputs, model, 3, deterministic, None)
    grps = groups(inputs, b)
    grp = group_matrix(grps)
    cur = ctx.tables(b, [{1: 2, 2: 1, 3: 3, 4: 2}])[0]
    whole, snaps = simulate(ctx, grp, cur[None], 32, 5, snapshots=range(1, b))
    np.testing.assert_array_equal(whole, simulate(ctx, grp, cur[None], 32, 5))
    for n in range(1, b):
        cand = np.repeat(cur[None], len(ctx.actions), axis=0)
        cand[:, n] = ctx.actions
        cand[:, 0] = cand[:, 1]
        start = (snaps[n][0][0], snaps[n][1][0])
        np.testing.assert_array_equal(simulate(ctx, grp, cand, 32, 5, start=start),
                                      simulate(ctx, grp, cand, 32, 5))
        # and a snapshot taken at the wrong n does not give them (the test can fail)
        if n > 1:
            wrong = (snaps[n - 1][0][0], snaps[n - 1][1][0])
            assert not np.array_equal(simulate(ctx, grp, cand, 32, 5, start=wrong),
                                      simulate(ctx, grp, cand, 32, 5))


def test_best_table_monte_carlo_reports_fresh_draws():
    inputs, model, _ = instance(9, 6, 6)
    best = best_table(inputs, model, 3, k_max=2, n_samples=64, seed=3)
    assert best.method == MONTE_CARLO and best.search_ms is not None
    fresh = evaluate_tables(inputs, model, 3, [best.table], k_max=2, n_samples=64, seed=4)
    assert best.total_ms == pytest.approx(fresh.total_ms[0]) and best.lo < best.total_ms < best.hi


# -- The relaxation bound --


def test_union_share_lemma():
    """U / sum(u) >= rho_b(x) when every u_j / E <= x and n <= b (the proof's inequality)."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        e, b = int(rng.integers(4, 129)), int(rng.integers(1, 17))
        n = int(rng.integers(1, b + 1))
        x = float(rng.uniform(0.01, 1.0))
        u = rng.uniform(0, 1, n) ** rng.uniform(0.2, 3) * x * e
        assert union_unique(u, e) / u.sum() >= _rho(x, b) * (1 - 1e-9)  # union_unique's own rounding


@pytest.mark.parametrize("negative_alpha", [False, True])
def test_relaxed_shares_never_exceed_the_shared_round(negative_alpha):
    """sum_i relaxed cost(k, u_i, L_i) <= step_ms(n, k, union(u), sum L) for every round with n <= b."""
    rng = np.random.default_rng(1)
    for trial in range(300):
        model = random_batch_model(rng, 5, int(rng.choice([16, 32, 128])), negative_alpha=negative_alpha)
        b, e = int(rng.integers(1, 9)), model.n_experts
        x = {m: float(rng.uniform(0.05, 1.0)) for m in range(1, 6)}
        relaxed = relaxed_cost_model(model, b, x)
        for n in range(1, b + 1):
            k = int(rng.integers(0, 5))
            u = rng.uniform(0, 1, n) * x[k + 1] * e
            lens = rng.integers(0, 3000, n)
            shares = float(np.sum(relaxed.round_ms(np.full(n, k), u, lens)))
            assert shares <= float(model.step_ms(n, k, union_unique(u, e), lens.sum())) + 1e-9


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("deterministic", [False, True])
def test_bound_never_above_static_k_tables_or_the_exact_pair_oracle(seed, deterministic):
    inputs, model, rng = instance(600 + seed, 6, 5, k_list=2, negative_alpha=seed == 4)  # u <= E: no clipping
    k_max = 2
    exact2 = pair_oracle(inputs, model, k_max=k_max, deterministic=deterministic).total_ms
    previous = np.inf
    for b in (1, 2, 3, 4):
        bound = relaxation_bound(inputs, model, b, k_max=k_max, deterministic=deterministic)
        if b == 1:  # the relaxation at b = 1 is the batch-1 Oracle
            ref = solve(inputs, model.base, k_max=k_max, allow_k0=True, deterministic=deterministic).bounds
            assert bound.total_ms == ref.oracle_ms and bound.model.to_dict()["target"] == model.base.to_dict()["target"]
            assert bound.plain_ms == pytest.approx(ref.autoregressive_ms, rel=1e-12)
            assert bound.speedup == pytest.approx(ref.speedup, rel=1e-12)
        assert bound.total_ms <= previous + 1e-9  # a larger b relaxes more
        previous = bound.total_ms
        if b >= 2:
            assert bound.total_ms <= exact2 + 1e-9
        # every static K and a few tables, evaluated exactly (naive recursion over the joint state)
        tables = [[k] * (b + 1) for k in range(k_max + 1)]
        tables += [[0] + [int(v) for v in rng.integers(0, k_max + 1, b)] for _ in range(3)]
        for t in tables:
            exact = sum(naive_value(inputs, model, tuple(int(s) for s in g), k_max, deterministic, True, policy=t)
                        for g in groups(inputs, b))
            assert bound.total_ms <= exact + 1e-9
        best = best_table(inputs, model, b, k_max=k_max, deterministic=deterministic, n_samples=200)
        assert bound.total_ms <= (best.total_ms if best.method != MONTE_CARLO else best.hi) + 1e-9
        assert bound.speedup is None or bound.speedup >= bound.plain_ms / best.hi - 1e-12


@pytest.mark.parametrize("deterministic", [False, True])
def test_batch_bounds_per_b(deterministic):
    inputs, model, _ = instance(700, 9, 8)
    res = batch_bounds(inputs, model, [4, 1, 2], k_max=3, deterministic=deterministic, n_samples=64)
    assert list(res.by_b) == [1, 2, 4]
    frame = res.frame()
    assert list(frame.b) == [1, 2, 4] and {"static_0_ms_per_token", "static_3_ms_per_token", "slack"} <= set(frame)
    one, two, four = res.by_b[1], res.by_b[2], res.by_b[4]
    assert one.exact_ms == pytest.approx(one.bound.total_ms) and one.slack == pytest.approx(0.0, abs=1e-12)
    assert two.exact_ms == pytest.approx(pair_oracle(inputs, model, k_max=3, deterministic=deterministic).total_ms)
    assert two.slack >= -1e-12 and four.exact_ms is None and four.slack is None
    for bb in res.by_b.values():
        assert bb.best_static_ms == min(bb.static_ms.values()) and bb.plain_ms == bb.static_ms[0]
        assert bb.gain_static == pytest.approx(bb.best_static_ms / bb.bound.total_ms)
        assert bb.gain_table <= bb.gain_static * (1 + 1e-12) or bb.table.method == MONTE_CARLO
        assert bb.gain_static >= 1 - 1e-12
    assert res.by_b[4].method.startswith(EXACT_SIMULATION if deterministic else MONTE_CARLO)
    json.dumps(res.to_json())
    assert "slack" in res.summary()


def test_groups_follow_the_given_order():
    inputs, _, _ = instance(1, 5, 3)
    assert [g.tolist() for g in groups(inputs, 2)] == [[0, 1], [2, 3], [4]]
    order = ["4", "extra", "2", "0", "1", "3"]
    assert [g.tolist() for g in groups(inputs, 3, order)] == [[4, 2, 0], [1, 3]]
    with pytest.raises(SpeclimitsError, match="every sequence"):
        groups(inputs, 2, ["0", "1"])
    with pytest.raises(SpeclimitsError, match=">= 1"):
        groups(inputs, 0)
    _, model, _ = instance(2, 2, 3)  # a batch-1 cost model is refused
    with pytest.raises(Exception, match="BatchCostModel"):
        pair_oracle(inputs, model.base)


# -- Command line --

MEASURED = "data/traces/measured-eagle3"


@pytest.fixture(scope="module")
def measured_batch_model(tmp_path_factory):
    from speclimits.stats import fit_trace_cost_model

    base = fit_trace_cost_model(MEASURED)
    model = BatchCostModel.from_batch1(base, 32, 4, gamma={m: 0.3 + 0.14 * m for m in base.ms}, a_req=0.1, b_req=0.1)
    return model, model.write(tmp_path_factory.mktemp("bcm") / "batch_cost_model.json")


def test_cli_batch_json_matches_the_library(measured_batch_model, capsys):
    model, path = measured_batch_model
    assert main(["oracle", MEASURED, "--batch", "1,2,3", "--batch-cost-model", str(path), "--k-max", "2",
                 "--deterministic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["b"] for r in out["batch"]] == [1, 2, 3] and out["deterministic"] and out["allow_k0"]
    setup = prepare_oracle(MEASURED, cost_model=model.base, surrogate="exact")
    refs, order = headline_references(setup)  # the greedy references, as the batch-1 headline
    assert refs.inputs.n_sequences < setup.inputs.n_sequences
    ref = batch_bounds(refs.inputs, model, [1, 2, 3], k_max=2, deterministic=True, order=order)
    for row, (b, bb) in zip(out["batch"], ref.by_b.items()):
        assert row["bound_ms"] == pytest.approx(bb.bound.total_ms) and row["best_static_k"] == bb.best_static_k
        assert row["static_ms"] == {str(k): pytest.approx(v) for k, v in bb.static_ms.items()}
    assert out["batch"][1]["exact_ms"] >= out["batch"][1]["bound_ms"]
    # the traced batches follow the prompt file, not the sorted ids
    order = trace_order(setup.trace)
    assert [setup.inputs.seq_ids[i] for i in groups(setup.inputs, 2, order)[4]] == order[8:10]


def test_cli_batch_table_and_errors(measured_batch_model, capsys):
    _, path = measured_batch_model
    assert main(["oracle", MEASURED, "--batch", "2", "--batch-cost-model", str(path), "--k-max", "1",
                 "--deterministic"]) == 0
    text = capsys.readouterr().out
    assert "Oracle at batch > 1" in text and "slack" in text and "E = 32 experts" in text
    assert main(["oracle", MEASURED, "--batch", "2"]) == 2
    assert "needs --batch-cost-model" in capsys.readouterr().err
    assert main(["oracle", MEASURED, "--batch-cost-model", str(path)]) == 2
    assert "need --batch" in capsys.readouterr().err
    assert main(["oracle", MEASURED, "--batch", "2", "--batch-cost-model", str(path), "--cost-model", str(path)]) == 2
    assert "does not combine" in capsys.readouterr().err
    assert main(["oracle", MEASURED, "--batch", "1,x"]) == 2
    err = capsys.readouterr().err
    assert "--batch expects e.g. '1,2,4,8' or '1-4'" in err and len(err.strip().splitlines()) == 1


def test_cli_help_names_the_default_sample_count(capsys):
    with pytest.raises(SystemExit):
        main(["oracle", "--help"])
    assert f"default {DEFAULT_SAMPLES}" in capsys.readouterr().out
