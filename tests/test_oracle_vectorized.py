"""The Oracle's one solver and the bootstrap against the reference copies in ``reference_oracle.py``, bit for
bit where the arithmetic is the same: :func:`backward_induction` with its policy evaluations; many cost models at
once (:func:`first_values`) against :func:`solve`; the weighted refit against :func:`fit_cost_model` on the
resampled rounds and statsmodels; :func:`bootstrap_bound` against :func:`direct_replicates`."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from speclimits.bootstrap import draw_counts
from speclimits.costmodel import CostModel
from speclimits.errors import CostModelError
from speclimits.oracle import prepare_oracle, solve
from speclimits.oracle import solver as solver_module
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.solver import (PART_NAMES, Layout, accepted_at, backward_induction, evaluate_arrays,
                                      first_values, survival)
from speclimits.oracle.uncertainty import bootstrap_bound, replicate_quantities
from speclimits.stats import fit_cost_model
from speclimits.stats.costfit import CostMoments, fit_costs
from speclimits.trace import decode_rounds, read_trace

import reference_oracle
from reference_oracle import random_inputs, random_model


CASES = [(seed, k_max, allow_k0, det) for seed, k_max in [(0, 1), (1, 3), (2, 6), (3, 6)]
         for allow_k0 in (False, True) for det in (False, True)]


@pytest.mark.parametrize("path", ["few calls", "ragged"])
@pytest.mark.parametrize("seed,k_max,allow_k0,deterministic", CASES)
def test_one_sweep_equals_separate_evaluations_bit_for_bit(seed, k_max, allow_k0, deterministic, path, monkeypatch):
    # small blocks take the few-calls path, large ones the ragged sums: force each in turn
    monkeypatch.setattr(solver_module, "_RECTANGULAR_BLOCK", 10 ** 9 if path == "few calls" else 0)
    rng = np.random.default_rng(seed)
    # lengths 1, shorter than k_max, and long; unsorted, so the lockstep order differs from the inputs'
    n_tokens = [1, 2, 40, 3, 17, 1, 60, 9][: 5 + seed]
    inputs = random_inputs(rng, n_tokens, k_list=6)
    table = CostTable.build(inputs, random_model(rng, 7), k_max)
    surv = survival(inputs, k_max, deterministic)
    value, k_star, q, oracle_first, static_first = backward_induction(
        inputs, lambda rows: surv[rows], table.fixed[None], table.slope[None], np.array([table.model.c]),
        0 if allow_k0 else 1, table=table)
    # the procedure it replaces: solve, then evaluate the Oracle's policy and every static K separately
    v_ref, k_ref, q_ref = reference_oracle.backward_induction(inputs, table, allow_k0, deterministic)
    layout = Layout.build(inputs)
    first = inputs.offsets[:-1]
    parts = table.parts(k_ref)
    rewards = np.column_stack([parts[p] for p in PART_NAMES]
                              + [np.ones(inputs.n_states), accepted_at(surv, inputs.remaining, k_ref)])
    oracle_ref = evaluate_arrays(surv, k_ref, rewards, layout)[first]
    static_ref = evaluate_arrays(surv, np.arange(1, k_max + 1)[None, :], table.total()[:, 1:], layout)[first]
    assert np.array_equal(value, v_ref) and np.array_equal(k_star, k_ref)
    assert np.array_equal(q, q_ref, equal_nan=True)
    assert np.array_equal(oracle_first, oracle_ref)
    assert np.array_equal(static_first, static_ref)
    # and the totals are what they mean: the Oracle's parts add up to V(0), static K >= the Oracle
    np.testing.assert_allclose(oracle_first[:, :4].sum(axis=1), value[first], rtol=1e-12)
    assert (static_first >= value[first][:, None] - 1e-9).all()


@pytest.mark.parametrize("allow_k0,deterministic", [(False, False), (True, False), (False, True)])
def test_first_values_under_many_models_equal_one_solve_each(allow_k0, deterministic):
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, [1, 30, 4, 55, 12, 2], k_list=5)
    k_max = 5
    models = [random_model(rng, 6, with_m1=allow_k0 or b % 2 == 0) for b in range(6)]
    tables = [CostTable.build(inputs, m, k_max) for m in models]
    fixed = np.array([t.fixed for t in tables])
    slope = np.array([t.slope for t in tables])
    c = np.array([m.c for m in models])
    surv = survival(inputs, k_max, deterministic)
    got = first_values(inputs, surv, fixed, slope, c, allow_k0=allow_k0)
    first = inputs.offsets[:-1]
    want = np.array([solve(inputs, m, k_max=k_max, allow_k0=allow_k0, deterministic=deterministic).value[first]
                     for m in models])
    assert np.array_equal(got, want)
    # chunking the models (here one per chunk) changes nothing
    assert np.array_equal(first_values(inputs, surv, fixed, slope, c, allow_k0=allow_k0, max_bytes=1), got)


# -- the bootstrap --


def resample(rounds: pd.DataFrame, counts_row: np.ndarray) -> pd.DataFrame:
    """The rounds of one replicate, each drawn copy of a generation its own generation (as the bootstrap)."""
    codes, _ = pd.factorize(rounds["generation_id"], sort=True)
    picks = np.repeat(np.arange(len(counts_row)), counts_row.astype(int))
    return pd.concat([rounds.loc[codes == g].assign(generation_id=i) for i, g in enumerate(picks)], ignore_index=True)


def assert_same_model(got: CostModel, want: CostModel, rtol: float = 1e-9) -> None:
    assert got.ms == want.ms
    np.testing.assert_allclose([got.c, got.a, got.b], [want.c, want.a, want.b], rtol=rtol)
    for m in want.ms:
        np.testing.assert_allclose([got.beta0[m], got.alpha[m]], [want.beta0[m], want.alpha[m]], rtol=rtol)


@pytest.mark.parametrize("from_meta", [True, False])
def test_refit_from_sums_equals_fit_on_the_resampled_rounds(smoke_trace, from_meta):
    trace = read_trace(smoke_trace)
    rounds = trace.rounds
    top_k = trace.top_k if from_meta else None  # None: the m = 1 convention uses the observed constant Ū
    mom = CostMoments.of(rounds, top_k=top_k)
    counts = draw_counts(mom.n_generations, 3, seed=5)
    models = fit_costs(mom, counts)
    for row, model in zip(counts, models):
        sample = resample(rounds, row)
        assert_same_model(model, fit_cost_model(sample, top_k=top_k))
        if not from_meta:
            continue
        # independently of the package's OLS: statsmodels on the same rows
        dec, _ = decode_rounds(sample, timing="draft")
        draft = sm.OLS(dec["t_draft_ms"].to_numpy(float), sm.add_constant(dec["K"].to_numpy(float))).fit()
        np.testing.assert_allclose([model.b, model.a], draft.params, rtol=1e-9)
        dec, _ = decode_rounds(sample, timing="target")
        m = dec["m"].to_numpy()
        cols, names = [], []
        for level in sorted(set(m.tolist()) - {1}):  # m = 1: Ū is constant (α by the convention)
            cols += [(m == level).astype(float), (m == level) * dec["u_bar"].to_numpy(float)]
            names += [f"beta0[{level}]", f"alpha[{level}]"]
        if (m == 1).any():
            cols.append((m == 1).astype(float))
            names.append("intercept[1]")
        cols.append(dec["context_len"].to_numpy(float))
        names.append("c")
        target = pd.Series(sm.OLS(dec["t_target_ms"].to_numpy(float), np.column_stack(cols)).fit().params, names)
        np.testing.assert_allclose(model.c, target["c"], rtol=1e-8)
        for level in model.ms:
            if level == 1:  # alpha(1) := alpha(2), beta0(1) = intercept(1) - alpha(1) * top_k
                np.testing.assert_allclose(model.alpha[1], target["alpha[2]"], rtol=1e-8)
                np.testing.assert_allclose(model.beta0[1], target["intercept[1]"] - target["alpha[2]"] * trace.top_k,
                                           rtol=1e-8)
            else:
                np.testing.assert_allclose([model.beta0[level], model.alpha[level]],
                                           [target[f"beta0[{level}]"], target[f"alpha[{level}]"]], rtol=1e-8)


def test_refit_when_a_replicate_lacks_an_m(smoke_trace):
    """Replicates that draw no K = 0 generation have no m = 1 (no autoregressive baseline); one that
    draws no K = 10 generation cannot price k = 10: both exactly as the refit on the rows says."""
    trace = read_trace(smoke_trace)
    rounds = trace.rounds
    mom = CostMoments.of(rounds, top_k=trace.top_k)
    k_of_gen = rounds.groupby("generation_id")["K"].first().sort_index().to_numpy()
    no_k0 = np.where(k_of_gen == 0, 0.0, 1.0)
    no_k0[np.flatnonzero(k_of_gen == 3)[:7]] += 1.0  # still one draw per generation on average
    (model,) = fit_costs(mom, no_k0[None, :])
    want = fit_cost_model(resample(rounds, no_k0), top_k=trace.top_k)
    assert 1 not in model.ms
    assert_same_model(model, want)
    setup = prepare_oracle(smoke_trace)
    reps = replicate_quantities(setup, [model])
    direct = reference_oracle.direct_replicates(setup, no_k0[None, :])
    assert np.isnan(reps["speedup"].iloc[0]) and np.isnan(direct["speedup"].iloc[0])
    np.testing.assert_allclose(reps["gain_over_best_static"], direct["gain_over_best_static"], rtol=1e-12)

    no_k10 = np.where(k_of_gen == 10, 0.0, 1.0)
    (model,) = fit_costs(mom, no_k10[None, :])
    assert 11 not in model.ms
    with pytest.raises(CostModelError):
        replicate_quantities(setup, [model])
    with pytest.raises(CostModelError):
        reference_oracle.direct_replicates(setup, no_k10[None, :])


@pytest.mark.parametrize("allow_k0", [False, True])
def test_bootstrap_bound_equals_the_direct_procedure(smoke_trace, allow_k0):
    setup = prepare_oracle(smoke_trace)
    n_boot, seed = 6, 3
    fast = bootstrap_bound(setup, n_boot=n_boot, seed=seed, allow_k0=allow_k0)
    n_gen = setup.trace.rounds["generation_id"].nunique()
    direct = reference_oracle.direct_replicates(setup, draw_counts(n_gen, n_boot, seed), allow_k0=allow_k0)
    assert fast.n_boot == n_boot
    for q in ("speedup", "gain_over_best_static", "ms_per_token"):
        np.testing.assert_allclose(fast.replicates[q], direct[q], rtol=1e-12)
    assert (fast.replicates["best_static_k"].to_numpy() == direct["best_static_k"].to_numpy()).all()
    # the replicates differ from each other and from the estimate: the resampling is real
    assert fast.replicates["speedup"].nunique() == n_boot
    full = setup.solve(allow_k0=allow_k0).bounds
    assert fast.estimate["speedup"] == pytest.approx(full.speedup, rel=1e-15)
    # passing the solved result gives the same interval
    again = bootstrap_bound(setup, n_boot=n_boot, seed=seed, allow_k0=allow_k0, result=setup.solve(allow_k0=allow_k0))
    assert again.interval == fast.interval


def test_a_replicate_missing_the_top_m_is_a_failed_replicate_not_an_error(smoke_trace, tmp_path):
    """A sweep whose largest K has few generations (a user's short sweep): a resample that misses all
    of them refits a cost model without the top m. It is counted as failed and left out, not raised."""
    trace = tmp_path / "thin-top"
    shutil.copytree(smoke_trace, trace)
    rounds = pd.read_parquet(trace / "rounds.parquet")
    top = int(rounds["K"].max())
    keep = rounds.loc[rounds["K"] == top, "generation_id"].unique()[:3]  # just enough not to be pooled
    rounds = rounds[(rounds["K"] != top) | rounds["generation_id"].isin(keep)]
    rounds.to_parquet(trace / "rounds.parquet", index=False)
    setup = prepare_oracle(read_trace(trace))
    assert top + 1 in setup.model.ms
    n_boot = 200
    res = bootstrap_bound(setup, n_boot=n_boot, seed=0)
    assert 0 < res.n_failed < n_boot
    assert len(res.replicates) == n_boot - res.n_failed
    assert np.isfinite(res.replicates["speedup"]).all()
