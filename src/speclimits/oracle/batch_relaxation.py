"""A bound no policy beats at any batch size b: the decoupling relaxation (:func:`relaxed_cost_model`
has the argument), in the setting of :mod:`~speclimits.oracle.batch_problem`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from speclimits.costmodel import BatchCostModel, CostModel
from speclimits.oracle.batch_problem import BatchProblem, group_matrix, groups
from speclimits.oracle.batch_tables import simulate
from speclimits.oracle.inputs import OracleInputs
from speclimits.oracle.solver import solve


def _rho(x: float, b: int) -> float:
    """rho_b(x) = (1 - (1 - x)^b) / (b x) (1 at x = 0 and at b = 1), without cancellation at small x."""
    if x <= 0.0 or b == 1:
        return 1.0
    if x >= 1.0:
        return 1.0 / b
    return float(-np.expm1(b * np.log1p(-x)) / (b * x))


def relaxed_cost_model(model: BatchCostModel, b: int, x: Mapping[int, float]) -> CostModel:
    """The batch-1 cost model of the decoupling relaxation at batch size ``b``.

    ``x[m]`` is an upper bound on ``u_i / E`` of every request at window m (the largest
    ``u_bar_window[:, m - 1] / E`` of the inputs). With ``rho_b(x) = (1 - (1 - x)^b) / (b x)``::

        beta0'(m) = min_{n=1..b} (beta0(m) + gamma(m)(n - 1)) / n
        a'        = min_{n=1..b} (a + a_req (n - 1)) / n,      b' = min_{n=1..b} (b + b_req (n - 1)) / n
        alpha'(m) = alpha(m) rho_b(x[m])   if alpha(m) >= 0,   alpha(m) otherwise
        c'        = c

    **Why no policy beats it.** Split each shared round among its n <= b active requests: request i
    pays (draft + beta0 + gamma(n - 1)) / n, c L_i, and the expert term in proportion to its own
    experts, alpha Ū u_i / sum_j u_j; the shares add up to the round. Each share is at least the
    relaxed batch-1 cost c'_i = [k > 0](a' k + b') + beta0'(m) + alpha'(m) u_i + c L_i: the first two
    terms by the minima over n (k >= 0); the expert term because, ordering the requests by
    decreasing x_j = u_j / E <= x and writing the union as first hits,
    ``1 - prod_j (1 - x_j) = sum_j x_j prod_{i<j}(1 - x_i) >= sum_j x_j (1 - x)^(j - 1)
    >= (sum_j x_j) (1/n) sum_{j<=n} (1 - x)^(j - 1)`` (Chebyshev's sum inequality: both sequences
    decrease), i.e. ``Ū / sum_j u_j >= rho_n(x) >= rho_b(x)`` (rho_n decreases in n), so for
    alpha >= 0 the share alpha Ū u_i / sum_j u_j >= alpha u_i rho_b(x); for alpha < 0 the union is
    at most the sum, so the share >= alpha u_i. Hence any joint policy's total time is at least the
    sum over requests of their relaxed costs along their own trajectories. Each request is active in
    every round until it finishes, its transitions depend on its own k only, and the others'
    outcomes are independent of its own, so along its trajectory the joint policy is a (randomised,
    history-dependent) batch-1 policy whose expected relaxed cost is at least the batch-1 Oracle's
    optimum V'_i(0) under c' (which lets each request choose its own k). Summing over requests:
    ``E[T(pi)] >= sum_i V'_i(0)`` for every joint policy pi at batch size <= b (static K, tables,
    the exact b = 2 Oracle). At b = 1 the relaxed model is ``model.base``.
    """
    base = model.base
    ns = np.arange(1, int(b) + 1, dtype=float)
    beta0 = {m: float(np.min((base.beta0[m] + model.gamma[m] * (ns - 1)) / ns)) for m in base.ms}
    alpha = {m: base.alpha[m] * (_rho(float(x.get(m, 1.0)), int(b)) if base.alpha[m] >= 0 else 1.0) for m in base.ms}
    a = float(np.min((base.a + model.a_req * (ns - 1)) / ns))
    bb = float(np.min((base.b + model.b_req * (ns - 1)) / ns))
    return CostModel(c=base.c, beta0=beta0, alpha=alpha, a=a, b=bb,
                     source=f"decoupling relaxation at b = {b} of {base.source or 'a batch cost model'}")


@dataclass(frozen=True, eq=False)
class RelaxationBound:
    """The decoupling relaxation's bound at batch size ``b`` (:func:`relaxation_bound`).

    ``total_ms`` = sum over requests of the batch-1 Oracle under :attr:`model` (a lower bound on the
    expected total time of every joint policy); ``plain_ms`` static K = 0 at the same b (None
    without m = 1); ``rho`` {m: rho_b(x_m)}.
    """

    b: int
    total_ms: float
    n_tokens: int
    plain_ms: float | None
    model: CostModel
    rho: dict[int, float]

    @property
    def ms_per_token(self) -> float:
        return self.total_ms / self.n_tokens

    @property
    def speedup(self) -> float | None:
        """Plain decoding at the same b / the bound: no policy's speedup is larger."""
        return None if self.plain_ms is None else self.plain_ms / self.total_ms


def relax(ctx: BatchProblem, grps: list[np.ndarray], b: int) -> RelaxationBound:
    e = float(ctx.model.n_experts)
    x = {m: float(ctx.inputs.u_bar_window[:, m - 1].max()) / e for m in range(1, ctx.kk + 1)}
    relaxed = relaxed_cost_model(ctx.model, b, x)
    res = solve(ctx.inputs, relaxed, k_max=ctx.k_max, allow_k0=ctx.k_lo == 0, deterministic=ctx.deterministic)
    plain = None
    if ctx.table.has_k0:
        plain = float(simulate(replace(ctx, deterministic=True), group_matrix(grps),
                                np.zeros((1, b + 1), np.int64), 1, 0).sum())
    rho = {m: _rho(x[m], b) for m in x}
    return RelaxationBound(b, res.bounds.oracle_ms, int(ctx.inputs.n_tokens.sum()), plain, relaxed, rho)


def relaxation_bound(inputs: OracleInputs, model: BatchCostModel, b: int, **problem: Any) -> RelaxationBound:
    """A bound no policy can beat at batch size ``b``: the sum over requests of the batch-1 Oracle
    (:func:`speclimits.oracle.solver.solve`) under :func:`relaxed_cost_model` (its docstring has the
    argument). ``problem``: ``k_max``, ``deterministic``, ``allow_k0`` of :meth:`BatchProblem.build` (k = 0
    by default when the model has m = 1, so that the bound covers policies that take plain steps). The
    speedup is over plain decoding (static K = 0) at b."""
    return relax(BatchProblem.build(inputs, model, **problem), groups(inputs, b), b)
