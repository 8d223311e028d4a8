"""The exact Oracle of closed batches of two (:func:`pair_oracle`) and the exact evaluation of a
batch-size table at b <= 2 (:func:`evaluate_pairs`): backward induction over the joint state of a pair,
in the setting of :mod:`~speclimits.oracle.batch_problem`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from speclimits.costmodel import BatchCostModel
from speclimits.oracle.batch_problem import BatchProblem, groups
from speclimits.oracle.inputs import OracleInputs

#: Memory (bytes) one chunk of :func:`pair_oracle`'s stacked pairs may take.
_PAIR_MAX_BYTES = 192e6


def _pmf(s: np.ndarray) -> np.ndarray:
    """(..., K + 1, K + 1) ``pmf[..., k, a] = P(a accepted | action k)`` from survival s (..., K):
    ``S_a - S_{a+1}`` for a < k, ``S_k`` for a = k (S_0 = 1), 0 for a > k."""
    kk = s.shape[-1] + 1
    full = np.concatenate([np.ones(s.shape[:-1] + (1,)), s, np.zeros(s.shape[:-1] + (1,))], axis=-1)
    d = full[..., :-1] - full[..., 1:]
    k = np.arange(kk)[:, None]
    a = np.arange(kk)[None, :]
    return np.where(a < k, d[..., None, :], 0.0) + np.where(a == k, full[..., None, :kk], 0.0)


def split_pairs(grps: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(pairs (G, 2), singles (L,))``: the groups of two and the sequences left alone in a group of one."""
    pairs = np.asarray([g for g in grps if len(g) == 2], dtype=np.int64).reshape(-1, 2)
    return pairs, np.asarray([g[0] for g in grps if len(g) == 1], dtype=np.int64)


def _pair_sweep(ctx: BatchProblem, pairs: np.ndarray, tail_a: np.ndarray, tail_b: np.ndarray,
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


def _pair_chunks(ctx: BatchProblem, pairs: np.ndarray, n_c: int) -> list[np.ndarray]:
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

    def pair(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """``(V (N1 + 1, N2 + 1), k* (N1, N2))`` of pair g, trimmed to its grid."""
        n1, n2 = (int(self.inputs.n_tokens[s]) for s in self.pairs[g])
        return self.value[g, : n1 + 1, : n2 + 1], self.policy[g, :n1, :n2]


def pair_oracle(inputs: OracleInputs, model: BatchCostModel, **problem: Any) -> PairOracle:
    """The exact Oracle for b = 2 (the Bellman equation in :class:`PairOracle`) on the pairs of :func:`groups`
    of 2 (a last group of one is solved alone by the batch-1 Oracle), numpy-vectorised over p2, k and the
    pairs (stacked), row by row in decreasing p1. ``problem``: ``k_max``, ``deterministic``, ``allow_k0`` of
    :meth:`BatchProblem.build`; with ``deterministic`` V is the minimum over every joint action sequence.
    """
    return solve_pairs(BatchProblem.build(inputs, model, **problem), *split_pairs(groups(inputs, 2)))


def solve_pairs(ctx: BatchProblem, pairs: np.ndarray, singles: Sequence[int]) -> PairOracle:
    inp = ctx.inputs
    alone = ctx.single_optimal.value
    n_g = len(pairs)
    n = inp.n_tokens
    p1_max = int(n[pairs[:, 0]].max()) if n_g else 0
    p2_max = int(n[pairs[:, 1]].max()) if n_g else 0
    value = np.full((n_g, p1_max + 1, p2_max + 1), np.nan)
    policy = np.full((n_g, p1_max, p2_max), -1, dtype=np.int64)
    v00 = np.zeros(n_g)
    for idx in (_pair_chunks(ctx, pairs, 1) if n_g else []):
        sub = pairs[idx]
        v0, v, pol = _pair_sweep(ctx, sub, *(_tails(inp, sub[:, i], alone[:, None]) for i in (0, 1)), None, keep=True)
        v00[idx] = v0[0]
        value[idx, : v.shape[2], : v.shape[3]] = v[0]
        policy[idx, : pol.shape[1], : pol.shape[2]] = pol
    return PairOracle(pairs, value, policy, v00, n[pairs].sum(axis=1),
                      {int(s): float(alone[inp.offsets[s]]) for s in singles}, inp)


def _tails(inp: OracleInputs, seqs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(C, G, P + 1) per-state values (n, C) of the sequences ``seqs`` by position, 0 from N on."""
    n = inp.n_tokens[seqs]
    p = np.arange(int(n.max()) + 1)
    rows = inp.offsets[seqs][:, None] + np.minimum(p[None, :], n[:, None] - 1)
    out = np.moveaxis(values[rows], 2, 0)  # (C, G, P + 1)
    return np.where(p[None, None, :] < n[None, :, None], out, 0.0)


def evaluate_pairs(ctx: BatchProblem, grps: list[np.ndarray], tables: np.ndarray) -> np.ndarray:
    """(P,) exact expected totals of tables at b <= 2: the pair Bellman evaluation (joint k = table[2],
    k = table[1] alone), batch-1 evaluation for groups of one."""
    inp = ctx.inputs
    alone = ctx.single_static  # (n, kk)
    pairs, singles = split_pairs(grps)
    out = np.array([alone[inp.offsets[singles], t[1]].sum() if len(singles) else 0.0 for t in tables])
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
