"""Reference copies of the Oracle, kept out of the package for the tests and ``benchmarks/bench_oracle.py``:
:func:`backward_induction` (the plain lockstep Bellman sweep: V, k*, Q), :func:`solve_python` (loops over
sequences, states and k) and :func:`direct_replicates` (the bootstrap's literal resample, refit, solve);
and the random instances the solver tests share (:func:`random_model`, :func:`random_inputs`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from speclimits.bootstrap import resample_indices
from speclimits.costmodel import CostModel
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.prepare import OracleSetup
from speclimits.oracle.solver import Layout, survival
from speclimits.oracle.uncertainty import QUANTITIES, _quantities
from speclimits.stats import fit_cost_model


def backward_induction(inputs: OracleInputs, table: CostTable, allow_k0: bool = False,
                       deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(V (n,), k_star (n,), Q (n, k_max + 1))`` by lockstep backward induction, one block of states
    with t tokens remaining at a time; the running sum over j is a product with a 0/1 upper matrix."""
    k_max = table.k_max
    k_lo = 0 if allow_k0 else 1
    layout = Layout.build(inputs)
    surv = np.ascontiguousarray(survival(inputs, k_max, deterministic))
    n = inputs.n_states
    q_all, k_all, v_all = np.empty((n, k_max + 1)), np.empty(n, dtype=np.int64), np.empty(n)
    upper = np.triu(np.ones((k_max, k_max + 1)), 1)
    pad = k_max + 1
    buf = np.zeros((pad + layout.t_max + 1, len(layout.rank)))  # [pad + r, seq]: V with r tokens remaining
    for t in range(1, layout.t_max + 1):
        n_t = int(layout.n_active[t])
        rows = layout.ends[:n_t] - t
        w = buf[t: pad + t][::-1, :n_t].T  # (block, k_max + 1): W_j = V(min(N, n + j))
        d = w[:, 1:] - w[:, :-1]
        d *= np.take(surv, rows, axis=0)
        q = d @ upper
        q += w[:, :1]
        q += table.rows(rows)
        k = np.argmin(q[:, k_lo:], axis=1) + k_lo
        v = q[np.arange(n_t), k]
        buf[pad + t, :n_t] = v
        q_all[rows], k_all[rows], v_all[rows] = q, k, v
    return v_all, k_all, q_all


def solve_python(inputs: OracleInputs, model: CostModel, k_max: int, allow_k0: bool = False,
                 deterministic: bool = False) -> tuple[list[float], list[int]]:
    """``(V, k_star)`` as lists in the inputs' state order, by a straightforward loop (slow by design)."""
    a, b, c = model.a, model.b, model.c
    beta0 = [model.beta0.get(m, math.nan) for m in range(k_max + 2)]
    alpha = [model.alpha.get(m, math.nan) for m in range(k_max + 2)]
    ks = list(range(0 if allow_k0 else 1, k_max + 1))
    values = [0.0] * inputs.n_states
    kstar = [0] * inputs.n_states
    mp = inputs.match_prob.tolist()
    ub = inputs.u_bar_window.tolist()
    ctx = inputs.context_len.tolist()
    acc = inputs.accept_len.tolist()
    for s in range(inputs.n_sequences):
        lo, hi = int(inputs.offsets[s]), int(inputs.offsets[s + 1])
        n_tok = hi - lo
        v_seq = [0.0] * (n_tok + 1)
        for n in range(n_tok - 1, -1, -1):
            row = lo + n
            best, best_k = math.inf, -1
            for k in ks:
                cost = (a * k + b if k > 0 else 0.0) + beta0[k + 1] + alpha[k + 1] * ub[row][k] + c * ctx[row]
                expect = v_seq[min(n_tok, n + 1)]
                surv = 1.0
                for j in range(1, k + 1):
                    surv = (1.0 if j <= acc[row] else 0.0) if deterministic else surv * mp[row][j - 1]
                    expect += surv * (v_seq[min(n_tok, n + j + 1)] - v_seq[min(n_tok, n + j)])
                q = cost + expect
                if q < best:
                    best, best_k = q, k
            v_seq[n] = best
            values[row], kstar[row] = best, best_k
    return values, kstar


def direct_replicates(setup: OracleSetup, counts: np.ndarray, k_max: int | None = None,
                      allow_k0: bool = False) -> pd.DataFrame:
    """Each replicate's quantities (the columns of :func:`~speclimits.oracle.uncertainty.replicate_quantities`)
    by resampling the rounds, :func:`fit_cost_model` and :meth:`OracleSetup.solve` (a full fit and solve each)."""
    rounds = setup.trace.rounds
    codes, _ = pd.factorize(rounds["generation_id"], sort=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rows_of = [order[s:s + n] for s, n in zip(starts, sizes)]
    reps = []
    for pick in resample_indices(counts):
        idx = np.concatenate([rows_of[g] for g in pick])
        sample = rounds.iloc[idx].copy()
        # each drawn copy of a generation is its own generation in the refit
        sample["generation_id"] = np.repeat(np.arange(len(pick)), sizes[pick])
        model = fit_cost_model(sample.reset_index(drop=True), top_k=setup.trace.top_k, source="bootstrap replicate")
        reps.append(_quantities(setup.solve(k_max=k_max, allow_k0=allow_k0, model=model).bounds))
    return pd.DataFrame(reps, columns=[*QUANTITIES, "best_static_k"])


def random_model(rng: np.random.Generator, m_max: int, with_m1: bool = True) -> CostModel:
    ms = range(1 if with_m1 else 2, m_max + 1)
    by_m = {str(m): {"beta0": float(rng.uniform(3, 10)), "alpha": float(rng.uniform(0.0, 0.4))} for m in ms}
    return CostModel.from_dict({"target": {"c": float(rng.uniform(0, 2e-3)), "by_m": by_m},
                                "draft": {"a": float(rng.uniform(0.1, 1.5)), "b": float(rng.uniform(0, 0.5))}})


def random_inputs(rng: np.random.Generator, n_tokens: list[int], k_list: int) -> OracleInputs:
    n = sum(n_tokens)
    match = rng.uniform(0, 1, (n, k_list)) ** rng.uniform(0.2, 2.0)
    match[rng.random((n, k_list)) < 0.1] = 1.0
    u = 8 + np.cumsum(np.concatenate([np.zeros((n, 1)), rng.uniform(0, 6, (n, k_list))], axis=1), axis=1)
    return OracleInputs.from_arrays(n_tokens, match, u, context_len=rng.integers(0, 3000, n),
                                    accept_len=rng.integers(0, k_list + 1, n),
                                    draft_conf=rng.uniform(0, 1, (n, k_list)))
