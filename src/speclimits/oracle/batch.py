"""The bound at batch > 1: requests that share one verification pass (issue 20, item 4).

Setting (the batch-1 Oracle of :mod:`speclimits.oracle.solver`, extended). The reference
sequences of :class:`~speclimits.oracle.inputs.OracleInputs` are served in **closed batches** of b
consecutive sequences (:func:`groups`, the grouping of the traced batches). Every round all active
requests of a batch draft the same k (vLLM's joint K) and verify m = k + 1 rows in one shared step,
priced by :class:`~speclimits.costmodel.BatchCostModel`. With n active requests at states s_i::

    C(s, k) = step_ms(n, k, Ū, L)   with   Ū = union_unique([u_i(s_i, k)]) = E (1 - prod_i (1 - u_i/E)),
                                              L = sum_i L_i(s_i),
    step_ms(n, k, Ū, L) = [k > 0](a k + b + (n - 1)(a_req k + b_req)) + beta0(m) + gamma(m)(n - 1)
                          + alpha(m) Ū + c L,

where ``u_i(s, k) = u_bar_window[s, k]`` (window m = k + 1) of request i. Each request's accepted
drafts a_i are independent across requests, with its own survival ``P(a_i >= j) = S_i(s_i, j)``
(:func:`~speclimits.oracle.solver.survival`: the surrogate's running product of ``match_prob``, or
``1[j <= accept_len]`` when ``deterministic``); request i moves to ``min(N_i, s_i + a_i + 1)``. A
finished request leaves and the others continue (the batch shrinks). The objective is the expected
total time until the whole batch is done; **ms per token** = sum of ms / sum of tokens over all groups.

What is here:

* :func:`pair_oracle`: the exact Oracle for b = 2 (joint state (p1, p2), joint k, Bellman equation
  below); :func:`evaluate_tables` with b = 2 evaluates a batch-size table (static K included) exactly.
* :func:`relaxation_bound`: for any b, a bound no policy can beat (the decoupling relaxation; its
  argument is in :func:`relaxed_cost_model`).
* :func:`evaluate_tables`, :func:`static_k`, :func:`best_table`: what every static K and the best
  batch-size→K table (vLLM's ``num_speculative_tokens_per_batch_size`` chosen in hindsight) achieve.
* :func:`batch_bounds`: all of it per b, the numbers ``speclimits oracle --batch`` prints.

Unique-expert counts are clipped at E = ``n_experts`` throughout (``union_unique`` clips them), so at
n = 1 the step is the batch-1 round cost with ``min(u, E)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from speclimits.costmodel import BatchCostModel, CostModel
from speclimits.errors import CostModelError, SpeclimitsError
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.solver import OracleResult, _Layout, evaluate_arrays, solve, survival

#: Monte Carlo samples (closed-batch runs of every group) for the probabilistic surrogate at b > 2.
DEFAULT_SAMPLES = 256
#: Memory (bytes) one chunk of :func:`pair_oracle`'s stacked pairs may take.
_PAIR_MAX_BYTES = 192e6
#: Methods of :func:`evaluate_tables`.
EXACT_SIMULATION = "exact (closed-batch simulation)"
EXACT_DP = "exact (Bellman evaluation)"
MONTE_CARLO = "Monte Carlo"


# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------


def groups(inputs: OracleInputs, b: int, order: Sequence[str] | None = None) -> list[np.ndarray]:
    """Batches of ``b`` consecutive sequences (the last one may be smaller), as the traced batches.

    Returns a list of int arrays of sequence indices into ``inputs.seq_ids``. ``order`` lists the
    sequence ids in the order the trace grouped them (its prompt file order,
    :func:`trace_order`); default: the order of ``inputs.seq_ids``. Ids of ``order`` that are not
    in ``inputs`` are skipped; every sequence of ``inputs`` must appear in it.
    """
    b = int(b)
    if b < 1:
        raise SpeclimitsError(f"batch size must be >= 1, got {b}")
    if order is None:
        idx = np.arange(inputs.n_sequences)
    else:
        where = {str(s): i for i, s in enumerate(inputs.seq_ids)}
        idx = np.array([where[str(s)] for s in order if str(s) in where], dtype=np.int64)
        missing = sorted(set(range(inputs.n_sequences)) - set(idx.tolist()))
        if missing or len(idx) != inputs.n_sequences:
            names = [str(inputs.seq_ids[i]) for i in missing[:5]]
            raise SpeclimitsError(f"the sequence order does not list every sequence of {inputs.origin} exactly once "
                                  f"(missing e.g. {names})")
    return [idx[i: i + b] for i in range(0, len(idx), b)]


def trace_order(trace: Any) -> list[str] | None:
    """The sequence ids in the order a trace grouped them into batches: its ``prompts.jsonl``
    (the prompt file the harness copied, in file order), or None when the trace has none."""
    from speclimits.trace.prompts import PROMPTS_FILE, read_prompts

    path = Path(getattr(trace, "path", trace)) / PROMPTS_FILE
    return [p.id for p in read_prompts(path)] if path.exists() else None


def headline_references(setup: Any, batch_trace: Any = None) -> tuple[Any, list[str] | None]:
    """The references the bound at batch b is reported on, and their batch order: the headline kind
    (greedy references, as the batch-1 headline) of an :class:`~speclimits.oracle.prepare.OracleSetup`
    (all of them when the trace has no such kind), grouped in the order ``batch_trace`` ran its
    prompts (default: the setup's own trace's prompt order); references the batch trace did not run
    come last, in their own order. One function for ``speclimits oracle --batch`` and the book."""
    from speclimits.vocabulary import HEADLINE_KIND

    refs = setup.for_kind(HEADLINE_KIND) if HEADLINE_KIND in setup.kind_counts() else setup
    order = trace_order(batch_trace if batch_trace is not None else setup.trace)
    if order is None:
        return refs, None
    ids = [str(s) for s in refs.inputs.seq_ids]
    kept = set(ids)
    listed = [s for s in order if s in kept]
    return refs, listed + [s for s in ids if s not in set(listed)]


def _group_matrix(grps: list[np.ndarray]) -> np.ndarray:
    """(G, b) sequence indices, -1 where a (last) group is smaller."""
    width = max(len(g) for g in grps)
    out = np.full((len(grps), width), -1, dtype=np.int64)
    for i, g in enumerate(grps):
        out[i, : len(g)] = g
    return out


# ---------------------------------------------------------------------------
# Shared pieces: prices, clipped inputs, the batch-1 tails
# ---------------------------------------------------------------------------


def _rho(x: float, b: int) -> float:
    """rho_b(x) = (1 - (1 - x)^b) / (b x) (1 at x = 0 and at b = 1), without cancellation at small x."""
    if x <= 0.0 or b == 1:
        return 1.0
    if x >= 1.0:
        return 1.0 / b
    return float(-np.expm1(b * np.log1p(-x)) / (b * x))


@dataclass(frozen=True, eq=False)
class _Context:
    """One problem: inputs (Ū clipped at E), the batch model, k_max, surrogate, action range."""

    inputs: OracleInputs
    model: BatchCostModel
    k_max: int
    deterministic: bool
    k_lo: int

    @classmethod
    def build(cls, inputs: OracleInputs, model: BatchCostModel, k_max: int | None, deterministic: bool,
              allow_k0: bool | None) -> "_Context":
        if not isinstance(model, BatchCostModel):
            raise CostModelError("the batch Oracle needs a BatchCostModel (a batch-1 CostModel has no per-request "
                                 "terms; BatchCostModel.from_batch1 makes one for a what-if)")
        # default: the largest K both the references and the cost model cover
        k_max = min(inputs.k_list, max(model.ms) - 1) if k_max is None else int(k_max)
        if not 1 <= k_max <= inputs.k_list:
            raise SpeclimitsError(f"k_max must be in 1..{inputs.k_list} (the length of the match_prob lists in "
                                  f"{inputs.origin}), got {k_max}")
        has_m1 = 1 in model.base.beta0
        if allow_k0 is None:
            allow_k0 = has_m1
        if allow_k0 and not has_m1:
            raise CostModelError(f"k = 0 actions need m = 1 in the cost model, which covers m = {model.ms}")
        model.base.require_ms(range(2, k_max + 2), origin="batch cost model")
        e = float(model.n_experts)
        if (inputs.u_bar_window > e).any():
            inputs = replace(inputs, u_bar_window=np.minimum(inputs.u_bar_window, e), _cache={})
        return cls(inputs, model, k_max, bool(deterministic), 0 if allow_k0 else 1)

    @property
    def kk(self) -> int:
        return self.k_max + 1

    @property
    def actions(self) -> np.ndarray:
        return np.arange(self.k_lo, self.k_max + 1)

    @property
    def has_m1(self) -> bool:
        return 1 in self.model.base.beta0

    @cached_property
    def surv(self) -> np.ndarray:
        """(n, k_max) P(a >= j)."""
        return np.ascontiguousarray(survival(self.inputs, self.k_max, self.deterministic))

    @cached_property
    def u(self) -> np.ndarray:
        """(n, k_max + 1) Ū of the windows m = 1..k_max + 1 (clipped at E)."""
        return np.ascontiguousarray(self.inputs.u_bar_window[:, : self.kk])

    @cached_property
    def prices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """``(fixed, per_req, alpha, c)`` indexed by k (:meth:`BatchCostModel.step_terms`)."""
        return self.model.step_terms(self.k_max)

    def step(self, n: np.ndarray, k: np.ndarray, u_step: np.ndarray, context: np.ndarray) -> np.ndarray:
        """The step's price (:meth:`BatchCostModel.step_prices`)."""
        return self.model.step_prices(n, k, u_step, context, self.prices)

    @cached_property
    def single_table(self) -> np.ndarray:
        """(n, k_max + 1) batch-1 round cost (n = 1): the base model's, column 0 NaN without m = 1."""
        return CostTable.build(self.inputs, self.model.base, self.k_max).total()

    @cached_property
    def single_optimal(self) -> OracleResult:
        """The batch-1 Oracle (n = 1) under the base model: the tail after the other request of a pair left."""
        return solve(self.inputs, self.model.base, k_max=self.k_max, allow_k0=self.k_lo == 0,
                     deterministic=self.deterministic)

    @cached_property
    def single_static(self) -> np.ndarray:
        """(n, k_max + 1) value of static k from every state when alone (column 0 NaN without m = 1)."""
        cost = np.nan_to_num(self.single_table, nan=0.0)
        out = evaluate_arrays(self.surv, np.arange(self.kk)[None, :], cost, _Layout.build(self.inputs))
        if not self.has_m1:
            out[:, 0] = np.nan
        return out

    def tables(self, b: int, tables: Any) -> np.ndarray:
        """Normalise tables to a (P, b + 1) int array (column n = the k with n active; column 0 unused)."""
        if np.isscalar(tables):
            tables = [int(tables)]
        out = []
        for t in tables:
            if isinstance(t, Mapping):
                missing = [n for n in range(1, b + 1) if n not in t]
                if missing:
                    raise SpeclimitsError(f"batch-size table {dict(t)} lacks entries for n = {missing}")
                row = [0] + [int(t[n]) for n in range(1, b + 1)]
            elif np.isscalar(t):
                row = [int(t)] * (b + 1)
            else:
                row = [int(v) for v in t]
                if len(row) != b + 1:
                    raise SpeclimitsError(f"a table as a sequence needs b + 1 = {b + 1} entries (index = n), got {row}")
            bad = [v for v in row[1:] if not self.k_lo <= v <= self.k_max]
            if bad:
                raise SpeclimitsError(f"table entries must be in {self.k_lo}..{self.k_max}, got {bad}")
            row[0] = row[1]
            out.append(row)
        return np.asarray(out, dtype=np.int64).reshape(-1, b + 1)


def _pmf(s: np.ndarray) -> np.ndarray:
    """(..., K + 1, K + 1) ``pmf[..., k, a] = P(a accepted | action k)`` from survival s (..., K):
    ``S_a - S_{a+1}`` for a < k, ``S_k`` for a = k (S_0 = 1), 0 for a > k."""
    kk = s.shape[-1] + 1
    full = np.concatenate([np.ones(s.shape[:-1] + (1,)), s, np.zeros(s.shape[:-1] + (1,))], axis=-1)
    d = full[..., :-1] - full[..., 1:]
    k = np.arange(kk)[:, None]
    a = np.arange(kk)[None, :]
    return np.where(a < k, d[..., None, :], 0.0) + np.where(a == k, full[..., None, :kk], 0.0)


# ---------------------------------------------------------------------------
# b = 2: the exact Oracle and exact policy evaluation
# ---------------------------------------------------------------------------


def _pair_sweep(ctx: _Context, pairs: np.ndarray, tail_a: np.ndarray, tail_b: np.ndarray,
                actions: np.ndarray | None, keep: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Backward induction over the joint states of stacked pairs, row by row in decreasing p1.

    ``pairs`` (G, 2) sequence indices (A, B); ``tail_a`` (C, G, P1 + 1) the value of A alone from
    each position (0 at p >= N_A), ``tail_b`` (C, G, P2 + 1) likewise. ``actions`` None: minimise
    over k (C = 1); else (C,) a fixed joint action per channel (policy evaluation, C policies at
    once). Because both requests progress every round, V(p1, .) only reads rows p1' > p1, so one
    row (every p2 and every k) is one numpy step. The expectation over the two independent
    outcomes is taken in two stages: once a row r is done,
    ``Y(r, p2, k) = sum_{a2} P_B(a2 | p2, k) V(r, min(N_B, p2 + a2 + 1))`` is stored; then
    ``E[V(next) | p1, p2, k] = sum_{a1} P_A(a1 | p1, k) Y(min(N_A, p1 + a1 + 1), p2, k)``.

    Returns ``(V00 (C, G), V (C, G, P1 + 1, P2 + 1) or None, policy (G, P1, P2) or None)``
    (V and policy only with ``keep``; policy -1 outside a pair's states).
    """
    inp = ctx.inputs
    kk, k_lo = ctx.kk, ctx.k_lo
    n_e = float(ctx.model.n_experts)
    fixed, per_req, alpha, c = ctx.prices
    surv, u, lens = ctx.surv, ctx.u, inp.context_len.astype(float)
    ia, ib = pairs[:, 0], pairs[:, 1]
    n1, n2 = inp.n_tokens[ia], inp.n_tokens[ib]
    p1_max, p2_max = int(n1.max()), int(n2.max())
    off_a, off_b = inp.offsets[ia], inp.offsets[ib]
    n_g = len(pairs)
    optimise = actions is None
    n_c = 1 if optimise else len(actions)
    ar = np.arange(kk)
    gi = np.arange(n_g)
    # B's states, fixed for the whole sweep
    p2 = np.arange(p2_max)
    row_b = off_b[:, None] + np.minimum(p2[None, :], n2[:, None] - 1)  # (G, P2)
    valid_b = p2[None, :] < n2[:, None]
    pmf_b = _pmf(surv[row_b])  # (G, P2, kk[k], kk[a2])
    col_b = np.minimum(n2[:, None, None], p2[None, :, None] + 1 + ar[None, None, :])  # (G, P2, kk[a2])
    keep_b = 1.0 - u[row_b] / n_e  # (G, P2, kk): 1 - u_B / E
    ctx_b = lens[row_b]
    if not optimise:
        pmf_bc = np.moveaxis(pmf_b[:, :, actions, :], 2, 0)  # (C, G, P2, kk[a2])
    # the value grid with its boundaries: A finished (rows >= N_A) -> B alone; B finished -> A alone
    rows = np.arange(p1_max + 1)
    cols = np.arange(p2_max + 1)
    row_done = rows[None, :] >= n1[:, None]
    col_done = cols[None, :] >= n2[:, None]
    v = np.where(row_done[None, :, :, None], tail_b[:, :, None, :],
                 np.where(col_done[None, :, None, :], tail_a[:, :, :, None], np.nan))  # (C, G, P1+1, P2+1)
    policy = np.full((n_g, p1_max, p2_max), -1, dtype=np.int64) if (keep and optimise) else None
    # Y: optimise (G, P1 + 1, P2, kk[k]); channels (C, G, P1 + 1, P2)
    y = np.zeros((n_g, p1_max + 1, p2_max, kk)) if optimise else np.zeros((n_c, n_g, p1_max + 1, p2_max))

    def fill_y(sel: np.ndarray, r: np.ndarray) -> None:
        if optimise:
            nxt = v[0, sel[:, None, None], r[:, None, None], col_b[sel]]  # (g, P2, kk[a2])
            y[sel, r] = np.einsum("gpka,gpa->gpk", pmf_b[sel], nxt)
        else:
            nxt = v[:, sel[:, None, None], r[:, None, None], col_b[sel]]  # (C, g, P2, kk[a2])
            y[:, sel, r] = np.einsum("cgpa,cgpa->cgp", pmf_bc[:, sel], nxt)

    fill_y(gi, n1)  # the boundary row N_A: B alone after A finished
    for p1 in range(p1_max - 1, -1, -1):
        sel = np.flatnonzero(n1 > p1)
        row_a = off_a[sel] + p1
        pmf_a = _pmf(surv[row_a])  # (g, kk[k], kk[a1])
        nxt_rows = np.minimum(n1[sel, None], p1 + 1 + ar[None, :])  # (g, kk[a1])
        # the shared round: union of the two requests' experts, summed context
        u_step = n_e * (1.0 - (1.0 - u[row_a] / n_e)[:, None, :] * keep_b[sel])  # (g, P2, kk)
        cost = fixed + per_req + alpha * u_step + c * (lens[row_a][:, None, None] + ctx_b[sel][:, :, None])
        vb = valid_b[sel]
        if optimise:
            yg = y[sel[:, None], nxt_rows]  # (g, kk[a1], P2, kk[k])
            q = np.einsum("gka,gapk->gpk", pmf_a, yg)
            q += cost
            if k_lo:
                q[..., :k_lo] = np.inf
            k_star = np.argmin(q, axis=2)
            val = np.take_along_axis(q, k_star[..., None], axis=2)[..., 0]
            v[0, sel, p1, :p2_max] = np.where(vb, val, v[0, sel, p1, :p2_max])
            if policy is not None:
                policy[sel, p1] = np.where(vb, k_star, -1)
        else:
            yg = y[:, sel[:, None], nxt_rows]  # (C, g, kk[a1], P2)
            pa = np.moveaxis(pmf_a[:, actions, :], 1, 0)  # (C, g, kk[a1])
            val = np.einsum("cga,cgap->cgp", pa, yg)
            val += np.moveaxis(cost[:, :, actions], 2, 0)
            v[:, sel, p1, :p2_max] = np.where(vb[None], val, v[:, sel, p1, :p2_max])
        fill_y(sel, np.full(len(sel), p1))
    return v[:, :, 0, 0], (v if keep else None), policy


def _pair_chunks(ctx: _Context, pairs: np.ndarray, n_c: int) -> list[np.ndarray]:
    """Index chunks of ``pairs`` whose sweep arrays fit :data:`_PAIR_MAX_BYTES`."""
    n = ctx.inputs.n_tokens
    per = 8.0 * (n[pairs[:, 0]].max() + 1) * (n[pairs[:, 1]].max() + 1) * max(n_c, ctx.kk) * 3
    size = int(max(1, _PAIR_MAX_BYTES // per))
    return [np.arange(i, min(len(pairs), i + size)) for i in range(0, len(pairs), size)]


@dataclass(frozen=True, eq=False)
class PairOracle:
    """The exact Oracle of closed batches of two (:func:`pair_oracle`).

    Bellman equation over the joint state (p1, p2) of the pair's two reference sequences::

        V(p1, N2) = V_1(p1),  V(N1, p2) = V_2(p2),  V(N1, N2) = 0     (the batch-1 Oracle alone)
        Q(p1, p2, k) = step_ms(2, k, union(u_1(p1, k), u_2(p2, k)), L_1(p1) + L_2(p2))
                       + sum_{a1, a2} P_1(a1 | p1, k) P_2(a2 | p2, k) V(min(N1, p1 + a1 + 1), min(N2, p2 + a2 + 1))
        V(p1, p2) = min_k Q(p1, p2, k),   k*(p1, p2) = argmin (smallest k on ties)

    Attributes
    ----------
    pairs : (G, 2) sequence indices of each pair (into the inputs' ``seq_ids``).
    value : (G, P1 + 1, P2 + 1) V (padded: NaN outside a pair's grid; rows / columns at N are the
        batch-1 tails), P = the longest first / second sequence.
    policy : (G, P1, P2) k* (-1 outside a pair's states).
    value_ms : (G,) V(0, 0) of each pair.
    n_tokens : (G,) N1 + N2.
    singles_ms : V(0) of the sequences left alone in a last group of one (batch-1 Oracle), by index.
    """

    pairs: np.ndarray
    value: np.ndarray
    policy: np.ndarray
    value_ms: np.ndarray
    n_tokens: np.ndarray
    singles_ms: dict[int, float]
    inputs: OracleInputs = field(repr=False)

    @property
    def ms_per_token(self) -> np.ndarray:
        """(G,) each pair's ms per token, V(0, 0) / (N1 + N2)."""
        return self.value_ms / self.n_tokens

    @property
    def total_ms(self) -> float:
        """Expected total time of every group (pairs and the lone last sequence, if any)."""
        return float(self.value_ms.sum() + sum(self.singles_ms.values()))

    @property
    def total_tokens(self) -> int:
        return int(self.n_tokens.sum() + sum(int(self.inputs.n_tokens[s]) for s in self.singles_ms))

    @property
    def total_ms_per_token(self) -> float:
        return self.total_ms / self.total_tokens

    def pair(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """``(V (N1 + 1, N2 + 1), k* (N1, N2))`` of pair g, trimmed to its grid."""
        n1, n2 = (int(self.inputs.n_tokens[s]) for s in self.pairs[g])
        return self.value[g, : n1 + 1, : n2 + 1], self.policy[g, :n1, :n2]


def pair_oracle(inputs: OracleInputs, model: BatchCostModel, k_max: int | None = None, deterministic: bool = False,
                allow_k0: bool | None = None, pairs: Iterable[Sequence[int]] | None = None,
                order: Sequence[str] | None = None) -> PairOracle:
    """The exact Oracle for b = 2 (the Bellman equation in :class:`PairOracle`), numpy-vectorised over
    p2, k and the pairs (stacked), row by row in decreasing p1.

    ``pairs``: sequence-index pairs (default: :func:`groups` of 2 in ``order``; a last group of one
    is solved alone by the batch-1 Oracle). ``allow_k0`` None: k = 0 allowed when the model has m = 1.
    With ``deterministic`` the transitions are the exact references (``accept_len``) and V is the
    minimum over every joint action sequence.
    """
    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    if pairs is None:
        grps = groups(inputs, 2, order)
        pair_list = [g for g in grps if len(g) == 2]
        singles = [int(g[0]) for g in grps if len(g) == 1]
    else:
        pair_list, singles = [np.asarray(p, dtype=np.int64) for p in pairs], []
    return _pair_oracle(ctx, np.asarray(pair_list, dtype=np.int64).reshape(-1, 2), singles)


def _pair_oracle(ctx: _Context, pairs: np.ndarray, singles: list[int]) -> PairOracle:
    inp = ctx.inputs
    alone = ctx.single_optimal.value
    first = inp.offsets[:-1]
    n_g = len(pairs)
    n = inp.n_tokens
    p1_max = int(n[pairs[:, 0]].max()) if n_g else 0
    p2_max = int(n[pairs[:, 1]].max()) if n_g else 0
    value = np.full((n_g, p1_max + 1, p2_max + 1), np.nan)
    policy = np.full((n_g, p1_max, p2_max), -1, dtype=np.int64)
    v00 = np.zeros(n_g)
    for idx in (_pair_chunks(ctx, pairs, 1) if n_g else []):
        sub = pairs[idx]
        ta = _tails(inp, sub[:, 0], alone[:, None])
        tb = _tails(inp, sub[:, 1], alone[:, None])
        v0, v, pol = _pair_sweep(ctx, sub, ta, tb, None, keep=True)
        v00[idx] = v0[0]
        value[idx, : v.shape[2], : v.shape[3]] = v[0]
        policy[idx, : pol.shape[1], : pol.shape[2]] = pol
    tokens = n[pairs].sum(axis=1) if n_g else np.zeros(0, np.int64)
    return PairOracle(pairs, value, policy, v00, tokens, {s: float(alone[first[s]]) for s in singles}, inp)


def _tails(inp: OracleInputs, seqs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(C, G, P + 1) per-state values (n, C) of the sequences ``seqs`` by position, 0 from N on."""
    n = inp.n_tokens[seqs]
    p = np.arange(int(n.max()) + 1)
    rows = inp.offsets[seqs][:, None] + np.minimum(p[None, :], n[:, None] - 1)
    out = np.moveaxis(values[rows], 2, 0)  # (C, G, P + 1)
    return np.where(p[None, None, :] < n[None, :, None], out, 0.0)


# ---------------------------------------------------------------------------
# Static K and batch-size tables: exact or Monte Carlo
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TableValues:
    """Expected total time of P batch-size tables (a static K is a constant table).

    ``total_ms`` (P,) over all groups; ``lo``/``hi`` its 95% interval (equal to it when exact);
    ``method`` one of :data:`EXACT_SIMULATION`, :data:`EXACT_DP`, :data:`MONTE_CARLO`;
    ``n_samples`` and ``seed`` for Monte Carlo.
    """

    tables: np.ndarray
    total_ms: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n_tokens: int
    method: str
    n_samples: int = 0
    seed: int | None = None

    @property
    def ms_per_token(self) -> np.ndarray:
        return self.total_ms / self.n_tokens

    @property
    def exact(self) -> bool:
        return self.method != MONTE_CARLO


def _draws(ctx: _Context, n_samples: int, seed: int) -> np.ndarray:
    """(S, n) accepted length of every state in each sample when drafting up to k_max: ``A = #{j <= k_max :
    S(j) > r}`` with one uniform r per (sample, state), so that action k accepts ``min(k, A)`` (the
    inverse CDF of its accepted length; deterministic: S = 1: ``min(k_max, accept_len)``, S = 1 sample)."""
    key = ("draws", int(n_samples), int(seed))
    cache = ctx.__dict__.setdefault("_draw_cache", {})
    if key not in cache:
        if ctx.deterministic:
            cache[key] = np.minimum(ctx.inputs.accept_len, ctx.k_max)[None, :].astype(np.int64)
        else:
            r = np.random.default_rng(seed).random((int(n_samples), ctx.inputs.n_states))
            out = np.zeros(r.shape, dtype=np.int64)
            for j in range(ctx.k_max):  # S is non-increasing in j, so the count is the first failure
                out += ctx.surv[None, :, j] > r
            cache[key] = out
    return cache[key]


def _simulate(ctx: _Context, grp: np.ndarray, tables: np.ndarray, n_samples: int, seed: int,
              start: tuple[np.ndarray, np.ndarray] | None = None,
              snapshots: Sequence[int] = ()) -> Any:
    """(P, S, G) total ms of closed-batch runs of every group under every table.

    Each round: n = active requests, k = table[n], cost ``step_ms(n, k, union(u_i), sum L_i)``; request i
    at state s_i accepts ``a_i = min(k, A(s_i))`` (:func:`_draws`) and moves ``min(a_i + 1, remaining)``.
    A request visits each state at most once, so the draws along a run are independent with the right
    law; all tables see the same draws at the same states (common random numbers).

    Shared prefixes (the best-table search, whose candidates differ in one entry n, which acts only once
    n requests are left): with ``snapshots`` the totals come back with, for each m listed, every run's
    state ``(pos, total)`` just before its first round with at most m active requests; ``start`` runs
    from such a state (broadcast over the tables). A run's rounds are added to its total in the same
    order either way, so the totals are the same to the bit as one simulation from the start.
    """
    inp = ctx.inputs
    n_e = float(ctx.model.n_experts)
    present = grp >= 0
    seq = np.where(present, grp, 0)
    n_tok = np.where(present, inp.n_tokens[seq], 0)  # (G, b)
    off = inp.offsets[seq]
    draws = _draws(ctx, n_samples, seed)
    n_p, n_s = len(tables), len(draws)
    if start is None:
        pos = np.zeros((n_p, n_s) + grp.shape, dtype=np.int64)
        total = np.zeros((n_p, n_s, len(grp)))
    else:
        pos = np.broadcast_to(start[0], (n_p, n_s) + grp.shape).copy()
        total = np.broadcast_to(start[1], (n_p, n_s, len(grp))).copy()
    snaps = {int(m): (np.zeros_like(pos), np.zeros_like(total), np.zeros(total.shape, dtype=bool))
             for m in snapshots}
    pidx = np.arange(n_p)[:, None, None]
    sidx = np.arange(n_s)[None, :, None, None]
    lens = inp.context_len.astype(float)
    last = np.maximum(n_tok - 1, 0)
    while True:
        active = pos < n_tok
        n = active.sum(axis=-1)  # (P, S, G)
        for m, (s_pos, s_tot, seen) in snaps.items():
            new = (n <= m) & ~seen
            if new.any():
                s_pos[new], s_tot[new] = pos[new], total[new]
                seen |= new
        go = n > 0
        if not go.any():
            break
        k = tables[pidx, n]
        kb = k[..., None]
        rows = off + np.minimum(pos, last)
        u = np.where(active, ctx.u[rows, kb], 0.0)
        u_step = n_e * (1.0 - np.prod(1.0 - u / n_e, axis=-1))
        ctx_tot = np.where(active, lens[rows], 0.0).sum(axis=-1)
        total += np.where(go, ctx.step(n, k, u_step, ctx_tot), 0.0)
        acc = np.minimum(kb, draws[sidx, rows])
        pos += np.where(active, np.minimum(acc + 1, n_tok - pos), 0)
    if snaps:
        return total, {m: (v[0], v[1]) for m, v in snaps.items()}
    return total


def _evaluate_pairs_exact(ctx: _Context, grps: list[np.ndarray], tables: np.ndarray) -> np.ndarray:
    """(P,) exact expected totals of tables at b <= 2: the pair Bellman evaluation (joint k = table[2],
    k = table[1] alone), batch-1 evaluation for groups of one."""
    inp = ctx.inputs
    first = inp.offsets[:-1]
    alone = ctx.single_static  # (n, kk)
    pairs = np.asarray([g for g in grps if len(g) == 2], dtype=np.int64).reshape(-1, 2)
    singles = np.asarray([g[0] for g in grps if len(g) == 1], dtype=np.int64)
    out = np.zeros(len(tables))
    for p, t in enumerate(tables):
        out[p] = alone[first[singles], t[1]].sum() if len(singles) else 0.0
    if not len(pairs) or tables.shape[1] < 3:
        return out
    for k1 in np.unique(tables[:, 1]):  # one sweep per tail action, every joint action of those tables at once
        which = np.flatnonzero(tables[:, 1] == k1)
        joint = np.unique(tables[which, 2])
        vals = alone[:, [k1]]
        totals = np.zeros(len(joint))
        for idx in _pair_chunks(ctx, pairs, len(joint)):
            sub = pairs[idx]
            ta, tb = (_tails(inp, sub[:, i], vals) for i in (0, 1))  # (1, G, P + 1): the same tail for every channel
            ta, tb = (np.broadcast_to(t, (len(joint),) + t.shape[1:]) for t in (ta, tb))
            v0, _, _ = _pair_sweep(ctx, sub, ta, tb, joint)
            totals += v0.sum(axis=1)
        for p in which:
            out[p] += totals[np.searchsorted(joint, tables[p, 2])]
    return out


def _evaluate(ctx: _Context, grps: list[np.ndarray], b: int, tables: np.ndarray, n_samples: int, seed: int,
              method: str = "auto", start: tuple[np.ndarray, np.ndarray] | None = None) -> TableValues:
    """Values of ``tables`` (see :func:`evaluate_tables`). ``start``: the simulated runs continue from
    this state (:func:`_simulate`'s snapshots of a table the given ones agree with up to that point)."""
    n_tokens = int(ctx.inputs.n_tokens.sum())
    if method == "auto":
        method = EXACT_SIMULATION if ctx.deterministic else (EXACT_DP if b <= 2 else MONTE_CARLO)
    if method == EXACT_DP:
        if b > 2:
            raise SpeclimitsError("exact policy evaluation of the probabilistic surrogate is available for b <= 2")
        tot = _evaluate_pairs_exact(ctx, grps, tables)
        return TableValues(tables, tot, tot, tot, n_tokens, EXACT_DP)
    if method == EXACT_SIMULATION and not ctx.deterministic:
        raise SpeclimitsError("a single closed-batch simulation is exact only with deterministic transitions")
    if method not in (EXACT_SIMULATION, MONTE_CARLO):
        raise SpeclimitsError(f"unknown evaluation method {method!r}")
    grp = _group_matrix(grps)
    runs = _simulate(ctx, grp, tables, n_samples, seed, start=start).sum(axis=2)  # (P, S)
    mean = runs.mean(axis=1)
    if ctx.deterministic:
        return TableValues(tables, mean, mean, mean, n_tokens, EXACT_SIMULATION)
    half = 1.96 * runs.std(axis=1, ddof=1) / math.sqrt(runs.shape[1]) if runs.shape[1] > 1 else np.full(len(mean), np.inf)
    return TableValues(tables, mean, mean - half, mean + half, n_tokens, MONTE_CARLO, int(n_samples), int(seed))


def evaluate_tables(inputs: OracleInputs, model: BatchCostModel, b: int, tables: Any, k_max: int | None = None,
                    deterministic: bool = False, allow_k0: bool | None = None, n_samples: int = DEFAULT_SAMPLES,
                    seed: int = 0, order: Sequence[str] | None = None, method: str = "auto") -> TableValues:
    """Expected total time of batch-size tables in closed batches of ``b`` (:func:`groups`).

    A table gives the joint k for each number n of active requests (``{n: k}``, a sequence indexed
    by n with entry 0 unused, or an int: a static K). ``method`` ``auto``: deterministic
    transitions → one closed-batch simulation (exact); probabilistic at b <= 2 → the pair Bellman
    evaluation (exact: :class:`PairOracle`'s equation with the table's k instead of the minimum);
    probabilistic at b > 2 → Monte Carlo over ``n_samples`` seeded closed-batch runs of every group
    with a 95% normal interval (common random numbers across the tables).
    """
    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    return _evaluate(ctx, groups(inputs, b, order), b, ctx.tables(b, tables), n_samples, seed, method)


def static_k(inputs: OracleInputs, model: BatchCostModel, b: int, k_max: int | None = None,
             deterministic: bool = False, allow_k0: bool | None = None, n_samples: int = DEFAULT_SAMPLES,
             seed: int = 0, order: Sequence[str] | None = None) -> TableValues:
    """Every static joint K (k_lo..k_max; K = 0 is plain decoding) at batch ``b``: :func:`evaluate_tables`
    of the constant tables, row i = K = k_lo + i."""
    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    return _evaluate(ctx, groups(inputs, b, order), b, ctx.tables(b, list(ctx.actions)), n_samples, seed)


@dataclass(frozen=True)
class BestTable:
    """The best batch-size→K table found by coordinate descent (a coordinate-wise optimum: no single
    entry can be changed to lower the time; not necessarily the global optimum over all tables).

    ``table`` {n: k} for n = 1..b; ``total_ms`` and its 95% interval ``lo``/``hi``: exact, or with
    Monte Carlo the table re-evaluated on fresh draws (seed + 1), since ``search_ms``, its value on the
    draws the search chose it on, is optimistic; ``start_k`` the best static K it started from;
    ``sweeps`` passes over the entries.
    """

    b: int
    table: dict[int, int]
    total_ms: float
    lo: float
    hi: float
    start_k: int
    start_ms: float
    method: str
    sweeps: int
    evaluations: int
    n_tokens: int
    search_ms: float | None = None

    @property
    def ms_per_token(self) -> float:
        return self.total_ms / self.n_tokens


def _best_table(ctx: _Context, grps: list[np.ndarray], b: int, n_samples: int, seed: int,
                static: TableValues | None = None, max_sweeps: int = 20) -> BestTable:
    if static is None:
        static = _evaluate(ctx, grps, b, ctx.tables(b, list(ctx.actions)), n_samples, seed)
    i0 = int(np.argmin(static.total_ms))
    start_k = int(ctx.actions[i0])
    cur = static.tables[i0].copy()
    cur_val, cur_lo, cur_hi = float(static.total_ms[i0]), float(static.lo[i0]), float(static.hi[i0])
    width = max(len(g) for g in grps)  # entries n > the largest group never act
    top = min(b, width)
    # candidates for entry n agree with the current table until n requests are left: the simulated
    # methods run the current table once per change, keep each run's state at every n (snapshots), and
    # simulate the candidates from there only (the same numbers as from the start)
    simulated = static.method != EXACT_DP
    grp = _group_matrix(grps)
    evaluations, sweeps = len(ctx.actions), 0
    for sweeps in range(1, max_sweeps + 1):
        changed = False
        snaps = None
        for n in range(top, 0, -1):
            cand = np.repeat(cur[None], len(ctx.actions), axis=0)
            cand[:, n] = ctx.actions
            cand[:, 0] = cand[:, 1]
            start = None
            if simulated and n < top:
                if snaps is None:
                    snaps = _simulate(ctx, grp, cur[None], n_samples, seed, snapshots=range(1, top))[1]
                start = (snaps[n][0][0], snaps[n][1][0])
            res = _evaluate(ctx, grps, b, cand, n_samples, seed, start=start)
            evaluations += len(cand)
            j = int(np.argmin(res.total_ms))
            if res.total_ms[j] < cur_val * (1.0 - 1e-12):
                cur, cur_val, cur_lo, cur_hi = cand[j].copy(), float(res.total_ms[j]), float(res.lo[j]), float(res.hi[j])
                changed = True
                snaps = None  # the snapshots below n depended on the entry just changed
        if not changed:
            break
    search = cur_val
    if static.method == MONTE_CARLO:  # the search chose on these draws: report fresh ones
        fresh = _evaluate(ctx, grps, b, cur[None], n_samples, seed + 1)
        cur_val, cur_lo, cur_hi = float(fresh.total_ms[0]), float(fresh.lo[0]), float(fresh.hi[0])
    return BestTable(b, {n: int(cur[n]) for n in range(1, b + 1)}, cur_val, cur_lo, cur_hi, start_k,
                     float(static.total_ms[i0]), static.method, sweeps, evaluations, static.n_tokens, search)


def best_table(inputs: OracleInputs, model: BatchCostModel, b: int, k_max: int | None = None,
               deterministic: bool = False, allow_k0: bool | None = None, n_samples: int = DEFAULT_SAMPLES,
               seed: int = 0, order: Sequence[str] | None = None, max_sweeps: int = 20) -> BestTable:
    """The best batch-size→K table in hindsight: k depends on the number n of active requests of the batch.

    Coordinate descent from the best static K: for n = b, b - 1, ..., 1 try every k for entry n with the
    others fixed and keep the best (strict improvements only), until a whole sweep changes nothing.
    The result is a **coordinate-wise optimum** (no single entry can improve it), evaluated as
    :func:`evaluate_tables` does (exact, or Monte Carlo: searched on the draws of ``seed``, reported
    on those of ``seed + 1``).
    """
    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    return _best_table(ctx, groups(inputs, b, order), b, n_samples, seed, max_sweeps=max_sweeps)


# ---------------------------------------------------------------------------
# b > 2: the decoupling relaxation
# ---------------------------------------------------------------------------


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
    without m = 1); ``rho`` {m: rho_b(x_m)}; ``result`` the batch-1 Oracle solved.
    """

    b: int
    total_ms: float
    n_tokens: int
    plain_ms: float | None
    model: CostModel
    rho: dict[int, float]
    result: OracleResult = field(repr=False)

    @property
    def ms_per_token(self) -> float:
        return self.total_ms / self.n_tokens

    @property
    def speedup(self) -> float | None:
        """Plain decoding at the same b / the bound: no policy's speedup is larger."""
        return None if self.plain_ms is None else self.plain_ms / self.total_ms


def _relaxation(ctx: _Context, grps: list[np.ndarray], b: int) -> RelaxationBound:
    e = float(ctx.model.n_experts)
    x = {m: float(ctx.inputs.u_bar_window[:, m - 1].max()) / e for m in range(1, ctx.kk + 1)}
    relaxed = relaxed_cost_model(ctx.model, b, x)
    res = solve(ctx.inputs, relaxed, k_max=ctx.k_max, allow_k0=ctx.k_lo == 0, deterministic=ctx.deterministic)
    plain = None
    if ctx.has_m1:
        plain = float(_simulate(replace(ctx, deterministic=True), _group_matrix(grps),
                                np.zeros((1, b + 1), np.int64), 1, 0).sum())
    rho = {m: _rho(x[m], b) for m in x}
    return RelaxationBound(b, res.bounds.oracle_ms, int(ctx.inputs.n_tokens.sum()), plain, relaxed, rho, res)


def relaxation_bound(inputs: OracleInputs, model: BatchCostModel, b: int, k_max: int | None = None,
                     deterministic: bool = False, allow_k0: bool | None = None,
                     order: Sequence[str] | None = None) -> RelaxationBound:
    """A bound no policy can beat at batch size ``b``: the sum over requests of the batch-1 Oracle
    (:func:`speclimits.oracle.solver.solve`) under :func:`relaxed_cost_model` (its docstring has the
    argument). ``allow_k0`` None: k = 0 allowed when the model has m = 1 (needed for the bound to
    cover policies that take plain steps). The speedup is over plain decoding (static K = 0) at b."""
    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    return _relaxation(ctx, groups(inputs, b, order), b)


# ---------------------------------------------------------------------------
# Everything per b
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchBound:
    """One batch size: every static K, the best static K and table, the bound, the exact Oracle (b <= 2).

    Times are totals in ms over all groups; ``*_ms_per_token`` divide by ``n_tokens``.
    ``exact_ms``: the exact Oracle (b = 1: the batch-1 Oracle; b = 2: :func:`pair_oracle`), else None.
    """

    b: int
    n_groups: int
    n_tokens: int
    method: str
    static_ms: dict[int, float]
    static_lo: dict[int, float]
    static_hi: dict[int, float]
    best_static_k: int
    table: BestTable
    bound: RelaxationBound
    exact_ms: float | None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def plain_ms(self) -> float | None:
        return self.static_ms.get(0)

    @property
    def best_static_ms(self) -> float:
        return self.static_ms[self.best_static_k]

    @property
    def gain_static(self) -> float:
        """Best static K time / bound: the most any adaptive policy could gain over it."""
        return self.best_static_ms / self.bound.total_ms

    @property
    def gain_table(self) -> float:
        """Best table time / bound."""
        return self.table.total_ms / self.bound.total_ms

    @property
    def slack(self) -> float | None:
        """Exact Oracle / bound - 1 (b <= 2): how loose the relaxation is."""
        return None if self.exact_ms is None else self.exact_ms / self.bound.total_ms - 1.0

    def per_token(self, ms: float | None) -> float | None:
        return None if ms is None else ms / self.n_tokens

    def row(self) -> dict[str, Any]:
        plain = self.plain_ms
        out: dict[str, Any] = {
            "b": self.b, "groups": self.n_groups, "evaluation": self.method,
            "plain_ms_per_token": self.per_token(plain),
            "best_static_k": self.best_static_k, "best_static_ms_per_token": self.per_token(self.best_static_ms),
            "table": ",".join(str(self.table.table[n]) for n in range(1, self.b + 1)),
            "table_ms_per_token": self.table.ms_per_token,
            "bound_ms_per_token": self.bound.ms_per_token,
            "exact_ms_per_token": self.per_token(self.exact_ms),
            "bound_speedup": self.bound.speedup,
            "best_static_speedup": None if plain is None else plain / self.best_static_ms,
            "table_speedup": None if plain is None else plain / self.table.total_ms,
            "gain_static": self.gain_static, "gain_table": self.gain_table, "slack": self.slack,
        }
        for k, v in self.static_ms.items():
            out[f"static_{k}_ms_per_token"] = v / self.n_tokens
        return out

    def to_dict(self) -> dict[str, Any]:
        out = self.row()
        out.update({
            "n_tokens": self.n_tokens,
            "static_ms": {str(k): v for k, v in self.static_ms.items()},
            "static_ci_ms": {str(k): [self.static_lo[k], self.static_hi[k]] for k in self.static_ms},
            "best_static_ms": self.best_static_ms,
            "table": {str(n): k for n, k in self.table.table.items()},
            "table_ms": self.table.total_ms, "table_ci_ms": [self.table.lo, self.table.hi],
            "table_search_ms": self.table.search_ms, "table_sweeps": self.table.sweeps, "table_start_k": self.table.start_k,
            "bound_ms": self.bound.total_ms, "bound_rho": {str(m): r for m, r in self.bound.rho.items()},
            "bound_cost_model": self.bound.model.to_dict(), "exact_ms": self.exact_ms, "seconds": self.seconds,
        })
        return out


@dataclass(frozen=True)
class BatchBounds:
    """:func:`batch_bounds`' result: ``by_b`` {b: :class:`BatchBound`} and the options."""

    by_b: dict[int, BatchBound]
    k_max: int
    deterministic: bool
    allow_k0: bool
    n_samples: int
    seed: int
    cost_model_source: str = ""

    def frame(self) -> pd.DataFrame:
        """One row per b (:meth:`BatchBound.row`)."""
        return pd.DataFrame([bb.row() for bb in self.by_b.values()])

    def to_json(self) -> dict[str, Any]:
        return {"k_max": self.k_max, "deterministic": self.deterministic, "allow_k0": self.allow_k0,
                "n_samples": self.n_samples, "seed": self.seed, "cost_model_source": self.cost_model_source or None,
                "batch": [bb.to_dict() for bb in self.by_b.values()]}

    def summary(self) -> str:
        def f(v: float | None, fmt: str = "{:.3f}") -> str:
            return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else fmt.format(v)

        lines = [f"Oracle at batch > 1: K_max = {self.k_max}, "
                 f"{'deterministic (exact references)' if self.deterministic else 'probabilistic'} transitions, "
                 f"k = 0 {'allowed' if self.allow_k0 else 'not allowed'}; ms per token = total ms / total tokens "
                 "over closed batches of b consecutive sequences",
                 f"{'b':>3} {'plain':>8} {'static K':>8} {'ms/tok':>8} {'table (n=1..b)':>18} {'ms/tok':>8} "
                 f"{'bound':>8} {'exact':>8} {'gain/st':>8} {'gain/tb':>8} {'slack':>7}  evaluation"]
        for bb in self.by_b.values():
            tab = ",".join(str(bb.table.table[n]) for n in range(1, bb.b + 1))
            lines.append(f"{bb.b:>3} {f(bb.per_token(bb.plain_ms)):>8} {bb.best_static_k:>8} "
                         f"{f(bb.per_token(bb.best_static_ms)):>8} {tab:>18} {f(bb.table.ms_per_token):>8} "
                         f"{f(bb.bound.ms_per_token):>8} {f(bb.per_token(bb.exact_ms)):>8} "
                         f"{f(bb.gain_static):>8} {f(bb.gain_table):>8} {f(bb.slack, '{:+.1%}'):>7}  {bb.method}")
        lines.append("  plain = static K = 0; bound = decoupling relaxation (no policy is faster); exact = the exact "
                     "Oracle (b = 1, 2); gain = time / bound; slack = exact / bound - 1")
        per_k = "; ".join(f"b={bb.b}: " + " ".join(f"K{k} {v / bb.n_tokens:.3f}" for k, v in bb.static_ms.items())
                          for bb in self.by_b.values())
        lines.append("  static K ms/token: " + per_k)
        return "\n".join(lines)


def batch_bounds(inputs: OracleInputs, model: BatchCostModel, batch_sizes: Iterable[int] = (1, 2, 4, 8, 16),
                 k_max: int | None = None, deterministic: bool = False, allow_k0: bool | None = None,
                 n_samples: int = DEFAULT_SAMPLES, seed: int = 0, order: Sequence[str] | None = None,
                 tables: bool = True) -> BatchBounds:
    """Per batch size b: every static K (k_lo..k_max), the best static K, the best batch-size→K table
    (:func:`best_table`; ``tables`` False skips the descent and reports the best static K as the
    table), the relaxation bound (:func:`relaxation_bound`), and at b <= 2 the exact Oracle with the
    relaxation's slack against it. Gains: best static / bound and table / bound."""
    import time

    ctx = _Context.build(inputs, model, k_max, deterministic, allow_k0)
    out = {}
    for b in sorted({int(v) for v in batch_sizes}):
        grps = groups(inputs, b, order)
        secs: dict[str, float] = {}
        t0 = time.perf_counter()
        static = _evaluate(ctx, grps, b, ctx.tables(b, list(ctx.actions)), n_samples, seed)
        secs["static"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if tables:
            table = _best_table(ctx, grps, b, n_samples, seed, static=static)
        else:
            i0 = int(np.argmin(static.total_ms))
            k0 = int(ctx.actions[i0])
            table = BestTable(b, {n: k0 for n in range(1, b + 1)}, float(static.total_ms[i0]), float(static.lo[i0]),
                              float(static.hi[i0]), k0, float(static.total_ms[i0]), static.method, 0, 0,
                              static.n_tokens)
        secs["table"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bound = _relaxation(ctx, grps, b)
        secs["bound"] = time.perf_counter() - t0
        exact = None
        t0 = time.perf_counter()
        if b == 1:
            exact = float(ctx.single_optimal.bounds.oracle_ms)
        elif b == 2:
            pairs = np.asarray([g for g in grps if len(g) == 2], dtype=np.int64).reshape(-1, 2)
            exact = _pair_oracle(ctx, pairs, [int(g[0]) for g in grps if len(g) == 1]).total_ms
        secs["exact"] = time.perf_counter() - t0
        ks = list(ctx.actions)
        method = static.method + (f" ({static.n_samples} samples, seed {static.seed}, 95% intervals)"
                                  if static.method == MONTE_CARLO else "")
        out[b] = BatchBound(
            b=b, n_groups=len(grps), n_tokens=static.n_tokens, method=method,
            static_ms={k: float(v) for k, v in zip(ks, static.total_ms)},
            static_lo={k: float(v) for k, v in zip(ks, static.lo)},
            static_hi={k: float(v) for k, v in zip(ks, static.hi)},
            best_static_k=int(ks[int(np.argmin(static.total_ms))]), table=table, bound=bound, exact_ms=exact,
            seconds=secs)
    return BatchBounds(out, ctx.k_max, ctx.deterministic, ctx.k_lo == 0, int(n_samples), int(seed),
                       model.base.source)
