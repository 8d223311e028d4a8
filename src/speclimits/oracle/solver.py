"""Backward induction for the Oracle (the book's methods page, "The Oracle"), vectorized across sequences and actions.

Bellman equation over state n (tokens already emitted) of a sequence of N tokens::

    V(N) = 0
    Q(n, k) = C(n, k) + sum_{a=0..k} P(a | n, k) · V(min(N, n + a + 1))
    V(n) = min_k Q(n, k),   k*(n) = argmin_k Q(n, k)   (smallest k on ties)

With ``S_j = P(a >= j)`` and ``W_j = V(min(N, n + j))`` the expectation telescopes to
``W_1 + sum_{j=1..k} S_j · (W_{j+1} - W_j)``, a cumulative sum over k. All sequences are
solved in lockstep by "tokens remaining" t = N - n: sorting sequences by N (longest first),
the states with t remaining form one contiguous block, and their successors' values are a
contiguous slice of a (t, sequence) value buffer. One numpy step per t handles every
sequence and every k at once.

:func:`solve` makes one such sweep (:func:`solve_and_evaluate`): each block's Bellman step is
followed by the policy evaluations the bounds need (the Oracle's cost breakdown, rounds and
accepted drafts, and every static K), sharing the block's survival and costs. The bootstrap's
re-solves under many cost models at once use :func:`first_values` (the cost models as a trailing
axis of the same sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits.costmodel import CostModel
from speclimits.errors import CostModelError
from speclimits.oracle.inputs import CostTable, OracleInputs

PART_NAMES = ("draft", "target_base", "target_expert", "target_context")



# ---------------------------------------------------------------------------
# Transition tables
# ---------------------------------------------------------------------------


def survival(inputs: OracleInputs, k_max: int, deterministic: bool = False) -> np.ndarray:
    """(n, k_max) ``S[:, j-1] = P(a >= j)`` for j = 1..k_max.

    Probabilistic: ``prod_{i<j} match_prob[i]``; deterministic: ``1[j <= accept_len]``.
    """
    if deterministic:
        return (np.arange(1, k_max + 1)[None, :] <= inputs.accept_len[:, None]).astype(float)
    mp = inputs.match_prob
    out = np.empty((len(mp), k_max))
    out[:, 0] = mp[:, 0]
    for j in range(1, k_max):  # column loop: faster than np.cumprod along a short axis
        np.multiply(out[:, j - 1], mp[:, j], out=out[:, j])
    return out


def accepted_at(surv: np.ndarray, remaining: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(n,) E[min(a, remaining) | n, k(n)] at one action per state."""
    j = np.arange(1, surv.shape[1] + 1)[None, :]
    return (surv * (j <= np.minimum(k, remaining)[:, None])).sum(axis=1)


def expected_accepted(surv: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """(n, k_max + 1) E[min(a, remaining) | n, k] for k = 0..k_max (accepted drafts that count)."""
    j = np.arange(1, surv.shape[1] + 1)
    capped = np.where(j[None, :] <= remaining[:, None], surv, 0.0)
    return np.concatenate([np.zeros((len(surv), 1)), np.cumsum(capped, axis=1)], axis=1)


@dataclass(frozen=True, eq=False)
class _Layout:
    """Lockstep schedule. At t tokens remaining the active sequences (N >= t) are the first
    ``n_active[t]`` of the longest-first order; their states are rows ``ends[:n_active[t]] - t``,
    and their results are stored contiguously at lockstep positions ``bounds[t-1]:bounds[t]``.
    ``state_lock[row]`` is the lockstep position of each state (to put results back in order)."""

    ends: np.ndarray  # (S,) one past the last row of each sequence, longest sequence first
    n_active: np.ndarray  # (t_max + 1,) sequences with N >= t
    bounds: np.ndarray  # (t_max + 1,) lockstep positions of block t: bounds[t-1]:bounds[t]
    state_lock: np.ndarray  # (n,) lockstep position of each state row
    n_seq: int

    @classmethod
    def build(cls, inputs: OracleInputs) -> "_Layout":
        n_tok = inputs.n_tokens
        order = np.argsort(-n_tok, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        t_max = int(n_tok.max())
        n_active = np.searchsorted(-n_tok[order], -np.arange(t_max + 1), side="right").astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(n_active[1:])]).astype(np.int64)
        state_lock = bounds[inputs.remaining - 1] + rank[inputs.seq_index]
        return cls(inputs.offsets[order + 1], n_active, bounds, state_lock, len(n_tok))

    @property
    def t_max(self) -> int:
        return len(self.n_active) - 1

    def restore(self, lock: np.ndarray) -> np.ndarray:
        """Results stored in lockstep order -> state order."""
        return np.take(lock, self.state_lock, axis=0)


def _lockstep(layout: _Layout, k_max: int, step, channels: int | None = None) -> None:
    """Drive ``step(rows, lo, hi, W)`` for t = 1..t_max: ``rows`` are the states with t tokens
    remaining (one per active sequence, longest-first), ``lo:hi`` their lockstep positions, and W
    is (block, k_max + 1[, channels]) with column j-1 holding W_j = V(min(N, n + j)). ``step``
    returns the block's values, kept for the blocks that follow.
    """
    pad = k_max + 1
    shape = (pad + layout.t_max + 1, layout.n_seq) + (() if channels is None else (channels,))
    buf = np.zeros(shape)  # [pad + r, seq]: V with r tokens remaining (r <= 0 -> 0)
    for t in range(1, layout.t_max + 1):
        n_t = int(layout.n_active[t])
        w = np.moveaxis(buf[t: pad + t][::-1, :n_t], 0, 1)
        buf[pad + t, :n_t] = step(layout.ends[:n_t] - t, int(layout.bounds[t - 1]), int(layout.bounds[t]), w)


def _expected_next(w: np.ndarray, s: np.ndarray, upper: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(block, k_max + 1): E[V(next) | k] = W_1 + sum_{j<=k} S_j (W_{j+1} - W_j), for k = 0..k_max.

    ``w`` is (block, k_max + 1), ``s`` (block, k_max); ``upper`` is the (k_max, k_max + 1) 0/1
    matrix with ``upper[j-1, k] = 1[j <= k]``, so the running sum over j is one matrix product
    (much faster than ``np.cumsum`` along a short axis).
    """
    d = w[:, 1:] - w[:, :-1]
    d *= s
    out = np.matmul(d, upper, out=out)
    out += w[:, :1]
    return out


def _upper(k_max: int) -> np.ndarray:
    return np.triu(np.ones((k_max, k_max + 1)), 1)


def solve_arrays(surv, cost, allowed: np.ndarray, layout: _Layout, n_states: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Optimal values by lockstep backward induction.

    ``surv`` (n, k_max) and ``cost`` (n, k_max + 1) are arrays, or callables mapping an array of
    state rows to those rows' blocks (then ``n_states`` is required); ``allowed`` (k_max + 1,) bool,
    a contiguous range k_lo..k_max. Returns ``(V (n,), k_star (n,), Q (n, k_max + 1))``.
    """
    if isinstance(surv, np.ndarray):
        surv_arr = np.ascontiguousarray(surv, dtype=float)  # np.take on a view would copy it every call
        surv_rows = lambda rows: np.take(surv_arr, rows, axis=0)  # noqa: E731
    else:
        surv_rows = surv
    if isinstance(cost, np.ndarray):
        cost_arr = np.ascontiguousarray(cost, dtype=float)
        cost_rows = lambda rows: np.take(cost_arr, rows, axis=0)  # noqa: E731
    else:
        cost_rows = cost
    n = len(cost) if isinstance(cost, np.ndarray) else int(n_states)
    k_max = len(allowed) - 1
    k_lo = int(np.argmax(allowed))
    if not allowed[k_lo:].all():
        raise ValueError("allowed actions must be a contiguous range k_lo..k_max")
    q_lock = np.empty((n, k_max + 1))
    k_lock = np.empty(n, dtype=np.int64)
    v_lock = np.empty(n)
    idx = np.arange(layout.n_seq)
    upper = _upper(k_max)

    def step(rows, lo, hi, w):
        q = _expected_next(w, surv_rows(rows), upper, out=q_lock[lo:hi])
        q += cost_rows(rows)
        k = np.argmin(q[:, k_lo:], axis=1)
        k += k_lo
        k_lock[lo:hi] = k
        v = v_lock[lo:hi]
        np.take(q.ravel(), idx[: hi - lo] * (k_max + 1) + k, out=v)
        return v

    _lockstep(layout, k_max, step)
    return layout.restore(v_lock), layout.restore(k_lock), layout.restore(q_lock)


def _survival_rows(inputs: OracleInputs, k_max: int, deterministic: bool):
    """``rows -> (len(rows), k_max)`` P(a >= j) of those states (the values of :func:`survival`)."""
    steps = np.arange(1, k_max + 1)[None, :]
    mp, acc = inputs.match_prob, inputs.accept_len

    def surv_rows(rows):
        if deterministic:
            return (steps <= np.take(acc, rows)[:, None]).astype(float)
        block = np.take(mp, rows, axis=0)[:, :k_max]
        for j in range(1, k_max):  # running product along a short axis: faster than np.cumprod
            np.multiply(block[:, j - 1], block[:, j], out=block[:, j])
        return block

    return surv_rows


def backward_induction(inputs: OracleInputs, table: CostTable, allow_k0: bool = False,
                       deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(V, k_star, Q)`` for every state; survival and round costs are built block by block
    inside the sweep (small, cache-resident arrays) rather than as full (n, k_max) tables."""
    allowed = np.arange(table.k_max + 1) >= (0 if allow_k0 else 1)
    return solve_arrays(_survival_rows(inputs, table.k_max, deterministic), table.rows, allowed,
                        _Layout.build(inputs), n_states=inputs.n_states)


#: Reward channels of the Oracle's own policy evaluation in :func:`solve_and_evaluate`.
ORACLE_CHANNELS = (*PART_NAMES, "rounds", "accepted")
#: Blocks of at most this many states take :func:`solve_and_evaluate`'s few-calls path (every term
#: formed) rather than its ragged running sums (fewer terms, more numpy calls); same numbers either way.
_RECTANGULAR_BLOCK = 200


def _sequence_rank(inputs: OracleInputs) -> np.ndarray:
    """(S,) position of each sequence in the lockstep's longest-first order."""
    order = np.argsort(-inputs.n_tokens, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank


def solve_and_evaluate(inputs: OracleInputs, table: CostTable, allow_k0: bool = False, deterministic: bool = False
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Backward induction and, in the same sweep, the policy evaluations behind the bounds.

    Returns ``(V (n,), k_star (n,), Q (n, k_max + 1), oracle_first (S, 6), static_first (S, k_max))``:
    V, k* and Q as :func:`backward_induction`; ``oracle_first[s]`` the expected totals of
    :data:`ORACLE_CHANNELS` along the Oracle's policy from the first state of sequence s, and
    ``static_first[s, k - 1]`` the expected time of static K = k from there.

    The numbers are bit for bit those of :func:`evaluate_arrays` run after the solve (the same
    floating-point operations in the same order; a test checks it), but the work is shared: each
    block's survival and round costs are built once, the differences ``W_{j+1} - W_j`` are stored
    once per state (``dif``) rather than recomputed by each of the k_max + 1 states that read them,
    and the running sums over j are ragged (static K = k needs j <= k, the Oracle j <= the block's
    largest k*), so the terms the separate evaluation multiplied by 0 are never formed.
    """
    k_max = table.k_max
    layout = _Layout.build(inputs)
    n, n_seq, t_max = inputs.n_states, layout.n_seq, layout.t_max
    surv_rows = _survival_rows(inputs, k_max, deterministic)
    k_lo = 0 if allow_k0 else 1
    n_orc = len(ORACLE_CHANNELS)
    ch = k_max + n_orc  # channels: static K = 1..k_max, then the Oracle's
    pad = k_max + 1
    vbuf = np.zeros((pad + t_max + 1, n_seq))  # [pad + r, seq]: V with r tokens remaining (r <= 0 -> 0)
    # channel values and their differences with r tokens remaining live in ring slot r % ring (the block
    # at t reads r = t - k_max - 1 .. t - 1); slots not yet written hold the zeros of r <= 0.
    # Channel-major [slot, channel, seq], so that every operation runs along the sequences.
    ring = pad + 1
    ebuf = np.zeros((ring, ch, n_seq))  # channel c's value
    dif = np.zeros((ring, ch, n_seq))  # value at r - 1 minus value at r: W_{j+1} - W_j for r = t - j
    out_first = np.empty((n_seq, ch))  # each sequence's values at its first state (t = N)
    # results go straight to their state rows (no lockstep-ordered copy to put back in order)
    q_state = np.empty((n, k_max + 1))
    k_state = np.empty(n, dtype=np.int64)
    v_state = np.empty(n)
    q_block = np.empty((n_seq, k_max + 1))
    upper = _upper(k_max)
    steps = np.arange(1, k_max + 1)[None, :]
    idx = np.arange(n_seq)
    tmp = np.empty((ch, n_seq))
    static_mask = (np.arange(1, k_max + 1)[:, None] <= np.arange(1, k_max + 1)[None, :]).astype(float)[:, :, None]
    slot_j = (np.arange(ring)[:, None] - np.arange(1, k_max + 1)[None, :]) % ring  # [t % ring, j - 1]: slot of t - j
    n_active = np.append(layout.n_active, 0)
    # the parts of a round at action k, looked up: the values CostTable.parts computes
    kk = np.arange(k_max + 1)
    draft_k = np.asarray(table.model.draft_ms(kk), dtype=float)
    beta0_k = table.beta0[kk + 1].astype(float)
    alpha_k = table.alpha[kk + 1]
    c_ctx = table.model.c * inputs.context_len
    u_win = inputs.u_bar_window
    for t in range(1, t_max + 1):
        n_t = int(n_active[t])
        rows = layout.ends[:n_t] - t
        s = surv_rows(rows)
        cost = table.rows(rows)
        # the Bellman step, as in solve_arrays
        q = _expected_next(vbuf[t: pad + t][::-1, :n_t].T, s, upper, out=q_block[:n_t])
        q += cost
        k = np.argmin(q[:, k_lo:], axis=1)
        k += k_lo
        v = vbuf[pad + t, :n_t]
        np.take(q.ravel(), idx[:n_t] * (k_max + 1) + k, out=v)
        q_state[rows] = q
        k_state[rows] = k
        v_state[rows] = v
        # the evaluations: E = sum_j S_j 1[j <= k] (W_{j+1} - W_j) + W_1 + reward, summed over j in order
        s_t = np.ascontiguousarray(s.T)  # (k_max, block)
        s_orc_rows = s * (steps <= k[:, None])
        s_orc = np.ascontiguousarray(s_orc_rows.T)
        k_top = int(k.max())
        acc = ebuf[t % ring, :, :n_t]  # accumulated in place: this slot is the block's result
        prev = ebuf[(t - 1) % ring, :, :n_t]  # W_1
        if n_t <= _RECTANGULAR_BLOCK:
            # a small block: numpy's per-call cost dominates, so form every term (zeros included, as
            # evaluate_arrays does) in a few calls; the sum over j (the leading axis) runs in order
            terms = dif[slot_j[t % ring], :, :n_t]  # (k_max, ch, block): W_{j+1} - W_j, j = 1..k_max
            terms[:, :k_max] *= s_t[:, None, :]
            terms[:, :k_max] *= static_mask
            terms[:, k_max:] *= s_orc[:, None, :]
            np.sum(terms, axis=0, out=acc)
        else:
            # ragged running sums: static K = k stops at j = k, the Oracle at the block's largest k*
            d = dif[(t - 1) % ring, :, :n_t]
            np.multiply(d[:k_max], s_t[0], out=acc[:k_max])
            np.multiply(d[k_max:], s_orc[0], out=acc[k_max:])
            for j in range(2, k_max + 1):
                d = dif[(t - j) % ring, :, :n_t]
                part = tmp[: k_max - j + 1, :n_t]
                np.multiply(d[j - 1: k_max], s_t[j - 1], out=part)
                acc[j - 1: k_max] += part
                if j <= k_top:
                    part = tmp[:n_orc, :n_t]
                    np.multiply(d[k_max:], s_orc[j - 1], out=part)
                    acc[k_max:] += part
        acc += prev
        acc[:k_max] += cost[:, 1:].T
        reward = acc[k_max:]  # += the Oracle's round at k*, each part as CostTable.parts computes it
        reward[0] += draft_k[k]
        reward[1] += beta0_k[k]
        reward[2] += alpha_k[k] * u_win[rows, k]
        reward[3] += c_ctx[rows]
        reward[4] += 1.0
        # accepted drafts that count, E[min(a, t)] at k* (as accepted_at: every state here has t remaining)
        reward[5] += (s_orc_rows if t >= k_max else s * (steps <= np.minimum(k, t)[:, None])).sum(axis=1)
        np.subtract(prev, acc, out=dif[t % ring, :, :n_t])
        done = slice(int(n_active[t + 1]), n_t)  # sequences with N = t: this block holds their first state
        out_first[done] = acc[:, done].T
    at_first = out_first[_sequence_rank(inputs)]  # (S, ch) in the inputs' sequence order
    return v_state, k_state, q_state, np.ascontiguousarray(at_first[:, k_max:]), np.ascontiguousarray(at_first[:, :k_max])


def first_values(inputs: OracleInputs, surv: np.ndarray, fixed: np.ndarray, slope: np.ndarray, c: np.ndarray,
                 allow_k0: bool = False, max_bytes: float = 64e6, progress: bool = False) -> np.ndarray:
    """(B, S) the optimal V(0) of every sequence under B cost models at once.

    Cost model b prices action k at ``fixed[b, k] + slope[b, k] * u_bar_window[n, k] + c[b] * context_len[n]``
    (``fixed``, ``slope`` (B, k_max + 1) from :meth:`CostModel.action_terms`, ``c`` (B,)); ``surv`` is
    the (n, k_max) survival table (:func:`survival`). The same lockstep backward induction as
    :func:`solve_arrays` with the cost models as a trailing axis, so every numpy step serves all of
    them; only the values are kept (a ring of the last k_max + 1 blocks), not k* or Q. The running
    sum over j is a cumulative sum rather than :func:`solve_arrays`' matrix product, so values agree
    with :func:`solve` to rounding (about 1e-15 relative), not bit for bit. Replicates are processed
    in chunks whose ring fits in ``max_bytes``; ``progress`` shows a bar over the chunks.
    """
    fixed = np.atleast_2d(np.asarray(fixed, dtype=float))
    slope = np.atleast_2d(np.asarray(slope, dtype=float))
    c = np.atleast_1d(np.asarray(c, dtype=float))
    n_models, kk = fixed.shape
    k_max = kk - 1
    if surv.shape != (inputs.n_states, k_max) or slope.shape != fixed.shape or c.shape != (n_models,):
        raise ValueError(f"shapes: surv {surv.shape}, fixed {fixed.shape}, slope {slope.shape}, c {c.shape} "
                         f"for {inputs.n_states} states and k_max = {k_max}")
    layout = _Layout.build(inputs)
    n_seq, t_max = layout.n_seq, layout.t_max
    k_lo = 0 if allow_k0 else 1
    ring = k_max + 2  # the block at t reads t - 1 .. t - k_max - 1 and writes t
    n_active = np.append(layout.n_active, 0)
    surv_t = np.ascontiguousarray(np.asarray(surv, dtype=float).T)  # (k_max, n)
    u_t = np.ascontiguousarray(inputs.u_bar_window[:, :kk].T)  # (k_max + 1, n)
    ctx = inputs.context_len
    rank = _sequence_rank(inputs)
    chunk = int(max(1, min(n_models, max_bytes // (8 * (ring + 4 * kk) * max(n_seq, 1)))))
    out = np.empty((n_models, n_seq))
    starts = range(0, n_models, chunk)
    for b0 in tqdm(starts, desc="Oracle re-solves", unit="chunk", disable=not progress or len(starts) < 2):
        b1 = min(n_models, b0 + chunk)
        f = fixed[b0:b1].T[:, None, :]  # (k_max + 1, 1, chunk)
        sl = slope[b0:b1].T[:, None, :]
        cc = c[None, b0:b1]  # (1, chunk)
        vring = np.zeros((ring, n_seq, b1 - b0))  # [r % ring, seq, model]: V with r tokens remaining
        v_first = np.empty((n_seq, b1 - b0))
        for t in range(1, t_max + 1):
            n_t = int(n_active[t])
            rows = layout.ends[:n_t] - t
            w = vring[(t - np.arange(1, kk + 1)) % ring, :n_t]  # (k_max + 1, block, chunk): W_1 .. W_{k_max+1}
            q = np.empty_like(w)
            q[0] = w[0]
            np.subtract(w[1:], w[:-1], out=q[1:])
            q[1:] *= surv_t[:, rows, None]
            np.cumsum(q[1:], axis=0, out=q[1:])
            q[1:] += w[0]
            cost = u_t[:, rows, None] * sl  # the round cost, in CostTable.rows' order
            cost += f
            cost += (ctx[rows][:, None] * cc)[None]
            q += cost
            v = vring[t % ring, :n_t]
            np.min(q[k_lo:], axis=0, out=v)
            done = slice(int(n_active[t + 1]), n_t)  # sequences whose first state is in this block
            v_first[done] = v[done]
        out[b0:b1] = v_first[rank].T
    return out


def evaluate_arrays(surv: np.ndarray, actions: np.ndarray, rewards: np.ndarray, layout: _Layout) -> np.ndarray:
    """Policy evaluation: expected sum of per-round ``rewards`` (n, ch) from each state.

    ``actions`` is (n,) (one policy, ch reward channels), (n, ch) (one policy per channel) or
    (1, ch) (channel c always takes ``actions[0, c]``: every static K at once). Only the chosen
    action's transition is used: ``E = W_1 + sum_j S_j 1[j <= k] (W_{j+1} - W_j)``.
    """
    k_max = surv.shape[1]
    # np.take on a non-contiguous view copies the whole array each call: make everything contiguous once
    surv = np.ascontiguousarray(surv, dtype=float)
    rewards = np.ascontiguousarray(rewards, dtype=float)
    actions = np.ascontiguousarray(actions, dtype=np.int64)
    if actions.ndim == 1:
        actions = actions[:, None]
    out_lock = np.empty_like(rewards)
    steps = np.arange(1, k_max + 1)[None, :, None]
    static = len(actions) == 1 and len(rewards) != 1
    if static:
        const_mask = (steps <= actions[0][None, None, :]).astype(float)

    def step(rows, lo, hi, w):  # w (block, k_max + 1, ch)
        d = w[:, 1:] - w[:, :-1]
        d *= np.take(surv, rows, axis=0)[:, :, None]
        d *= const_mask if static else steps <= np.take(actions, rows, axis=0)[:, None, :]
        v = out_lock[lo:hi]
        np.sum(d, axis=1, out=v)
        v += w[:, 0]
        v += np.take(rewards, rows, axis=0)
        return v

    _lockstep(layout, k_max, step, channels=rewards.shape[1])
    return layout.restore(out_lock)


# ---------------------------------------------------------------------------
# Pure-Python reference (benchmark baseline and test cross-check)
# ---------------------------------------------------------------------------


def solve_python(inputs: OracleInputs, model: CostModel, k_max: int, allow_k0: bool = False,
                 deterministic: bool = False) -> tuple[list[float], list[int]]:
    """A straightforward loop over sequences, states (backwards) and k; same values as :func:`solve`.

    Returns ``(V, k_star)`` as lists in the inputs' state order. Slow by design: it is the
    baseline the benchmark compares against.
    """
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


# ---------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleBounds:
    """Totals over all sequences (ms) and the bounds derived from them.

    ``autoregressive_ms`` and the speedups against it are None when the cost model has no
    m = 1; ``autoregressive_note`` then says why.
    """

    oracle_ms: float
    autoregressive_ms: float | None
    static_ms: dict[int, float]
    best_static_k: int
    n_sequences: int
    n_tokens: int
    oracle_rounds: float
    oracle_accepted: float
    breakdown_ms: dict[str, float]
    autoregressive_note: str = ""

    @property
    def speedup(self) -> float | None:
        """Autoregressive time / Oracle time."""
        return None if self.autoregressive_ms is None else self.autoregressive_ms / self.oracle_ms

    @property
    def best_static_ms(self) -> float:
        return self.static_ms[self.best_static_k]

    @property
    def best_static_speedup(self) -> float | None:
        return None if self.autoregressive_ms is None else self.autoregressive_ms / self.best_static_ms

    @property
    def gain_over_best_static(self) -> float:
        """Best static K time / Oracle time (>= 1)."""
        return self.best_static_ms / self.oracle_ms

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per round along the Oracle's own trajectories (ratio of expectations)."""
        return self.oracle_accepted / self.oracle_rounds

    @property
    def tokens_per_round(self) -> float:
        return self.n_tokens / self.oracle_rounds

    @property
    def ms_per_token(self) -> float:
        """λ: the Oracle's time per emitted token."""
        return self.oracle_ms / self.n_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "oracle_ms": self.oracle_ms, "autoregressive_ms": self.autoregressive_ms, "speedup": self.speedup,
            "autoregressive_note": self.autoregressive_note or None,
            "static_ms": {str(k): v for k, v in self.static_ms.items()}, "best_static_k": self.best_static_k,
            "best_static_ms": self.best_static_ms, "best_static_speedup": self.best_static_speedup,
            "oracle_gain_over_best_static": self.gain_over_best_static, "mean_accepted": self.mean_accepted,
            "tokens_per_round": self.tokens_per_round, "ms_per_token": self.ms_per_token,
            "breakdown_ms": self.breakdown_ms, "n_sequences": self.n_sequences, "n_tokens": self.n_tokens,
        }


@dataclass(frozen=True, eq=False)
class OracleResult:
    """The solved Oracle.

    Attributes
    ----------
    inputs : the :class:`OracleInputs` (states in sequence / pos order; all arrays below follow it).
    cost_model : the cost model as given (before ``alpha_scale``).
    k_max, allow_k0, deterministic, alpha_scale : the options solved with.
    value : (n,) V(n) in ms, expected time to finish the sequence from each state.
    k_star : (n,) optimal action.
    q : (n, k_max + 1) Q(n, k) for k = 0..k_max (column 0 NaN without m = 1; it is computed but
        only chosen when ``allow_k0``).
    bounds : :class:`OracleBounds`.
    per_sequence : DataFrame, one row per sequence: ``seq_id``, ``n_tokens``, ``value_ms`` (V(0)),
        ``autoregressive_ms``, ``best_static_ms``, ``static_<K>_ms`` ..., ``rounds``, ``accepted``.
    """

    inputs: OracleInputs
    cost_model: CostModel
    k_max: int
    allow_k0: bool
    deterministic: bool
    alpha_scale: float
    value: np.ndarray
    k_star: np.ndarray
    q: np.ndarray
    bounds: OracleBounds
    per_sequence: pd.DataFrame = field(repr=False)

    @cached_property
    def costs(self) -> CostTable:
        return CostTable.build(self.inputs, self.cost_model.with_alpha_scale(self.alpha_scale), self.k_max)

    @cached_property
    def survival(self) -> np.ndarray:
        """(n, k_max) P(a >= j), j = 1..k_max."""
        return survival(self.inputs, self.k_max, self.deterministic)

    @cached_property
    def expected_accept(self) -> np.ndarray:
        """(n, k_max + 1) E[a | n, k] (accepted drafts, capped at the tokens remaining)."""
        return expected_accepted(self.survival, self.inputs.remaining)

    @property
    def cost(self) -> np.ndarray:
        """(n, k_max + 1) round cost C(n, k) in ms."""
        return self.costs.total()

    @property
    def ms_per_token(self) -> float:
        return self.bounds.ms_per_token

    def to_frame(self) -> pd.DataFrame:
        """One row per state: ``seq_id``, ``pos``, ``remaining``, ``context_len``, ``value_ms``, ``k_star``,
        ``expected_accept`` (at k*), ``cost_ms`` (at k*) and the cost parts at k*."""
        df = self.inputs.to_frame()
        df["value_ms"] = self.value
        df["k_star"] = self.k_star
        rows = np.arange(self.inputs.n_states)
        df["expected_accept"] = self.expected_accept[rows, self.k_star]
        parts = self.costs.parts(self.k_star)
        df["cost_ms"] = sum(parts.values())
        for name in PART_NAMES:
            df[f"{name}_ms"] = parts[name]
        if self.inputs.category is not None:
            df["category"] = self.inputs.category[self.inputs.seq_index]
        return df

    def q_frame(self) -> pd.DataFrame:
        """Long table of the full Q: ``seq_id``, ``pos``, ``k``, ``q_ms``, ``cost_ms``, ``expected_accept``."""
        n, kk = self.q.shape
        base = self.inputs.to_frame()[["seq_id", "pos"]]
        out = base.loc[base.index.repeat(kk)].reset_index(drop=True)
        out["k"] = np.tile(np.arange(kk), n)
        out["q_ms"] = self.q.ravel()
        out["cost_ms"] = self.cost.ravel()
        out["expected_accept"] = self.expected_accept.ravel()
        return out

    def summary(self) -> str:
        bd = self.bounds
        lines = [
            f"Oracle over {bd.n_sequences} sequences, {bd.n_tokens:,} tokens; K_max = {self.k_max}, "
            f"{'deterministic' if self.deterministic else 'probabilistic'} transitions, "
            f"k = 0 {'allowed' if self.allow_k0 else 'not allowed'}, alpha scale {self.alpha_scale:g}",
            f"  Oracle time           {bd.oracle_ms:12.1f} ms  ({bd.ms_per_token:.3f} ms/token)",
        ]
        if bd.autoregressive_ms is None:
            lines.append(f"  autoregressive time   unavailable: {bd.autoregressive_note}")
        else:
            lines.append(f"  autoregressive time   {bd.autoregressive_ms:12.1f} ms  -> Oracle speedup {bd.speedup:.3f}x")
        lines.append(f"  best static K = {bd.best_static_k}    {bd.best_static_ms:12.1f} ms  -> Oracle is "
                     f"{bd.gain_over_best_static:.3f}x faster"
                     + ("" if bd.best_static_speedup is None else f" (static speedup {bd.best_static_speedup:.3f}x)"))
        lines.append(f"  mean accepted length {bd.mean_accepted:.3f} drafts/round, {bd.tokens_per_round:.3f} tokens/round")
        lines.append("  cost breakdown (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in bd.breakdown_ms.items()))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The command line's JSON: totals, ``static_ms`` by K and ``per_sequence`` V(0)."""
        out = {
            "k_max": self.k_max, "allow_k0": self.allow_k0, "deterministic": self.deterministic,
            "alpha_scale": self.alpha_scale, "cost_model_source": self.cost_model.source or None,
        }
        out.update(self.bounds.to_dict())
        out["per_sequence"] = [{"seq_id": str(s), "value_ms": float(v)}
                               for s, v in zip(self.per_sequence["seq_id"], self.per_sequence["value_ms"])]
        return out


def require_k0(table: CostTable, allow_k0: bool) -> None:
    """Raise :class:`CostModelError` when k = 0 actions are allowed but the cost model has no m = 1."""
    if allow_k0 and not table.has_k0:
        raise CostModelError(
            f"k = 0 actions need m = 1 in the cost model, which covers m = {table.model.ms}; the cost-model fit has "
            "m = 1 only when the trace has K = 0 rounds. Drop --allow-k0 or add 'target.by_m.1'.")


def _first_state(inputs: OracleInputs) -> np.ndarray:
    return inputs.offsets[:-1]


def _autoregressive_costs(table: CostTable) -> np.ndarray:
    """(n,) C(n, 0), the same values as ``table.total()[:, 0]`` without the other columns."""
    inp = table.inputs
    col = inp.u_bar_window[:, 0] * table.slope[0]
    col += table.fixed[0]
    col += table.model.c * inp.context_len
    return col


def solve(inputs: OracleInputs, cost_model: CostModel, k_max: int | None = None, allow_k0: bool = False,
          deterministic: bool = False, alpha_scale: float = 1.0) -> OracleResult:
    """Solve the Oracle on every sequence of ``inputs``.

    Parameters
    ----------
    inputs : from :func:`~speclimits.oracle.inputs.load_inputs` or :meth:`OracleInputs.from_arrays`.
    cost_model : must cover m = 2..k_max + 1; m = 1 as well when ``allow_k0`` (else a
        :class:`CostModelError`). Without m = 1 the autoregressive baseline is reported unavailable.
    k_max : largest draft length (default: the length of the ``match_prob`` lists).
    allow_k0 : let the Oracle take plain autoregressive steps.
    deterministic : transitions from the observed ``accept_len`` (a = min(k, accept_len)) instead
        of ``match_prob``.
    alpha_scale : multiply every alpha(m) (0 gives the α = 0 ablation).
    """
    k_max = inputs.k_list if k_max is None else int(k_max)
    model = cost_model.with_alpha_scale(alpha_scale) if alpha_scale != 1.0 else cost_model
    table = CostTable.build(inputs, model, k_max)
    require_k0(table, allow_k0)
    # one sweep: V, k*, Q and the policy evaluations (the Oracle's breakdown / rounds / accepted, every static K)
    value, k_star, q, ev, static_ev = solve_and_evaluate(inputs, table, allow_k0, deterministic)
    first = _first_state(inputs)
    static = {}
    per_seq = pd.DataFrame({"seq_id": inputs.seq_ids, "n_tokens": inputs.n_tokens, "value_ms": value[first]})
    for k in range(1, k_max + 1):
        per_seq[f"static_{k}_ms"] = static_ev[:, k - 1]
        static[k] = float(static_ev[:, k - 1].sum())
    best_k = min(static, key=static.get)
    per_seq["best_static_ms"] = per_seq[f"static_{best_k}_ms"]
    if table.has_k0:
        ar_seq = np.add.reduceat(_autoregressive_costs(table), first)
        ar_total, note = float(ar_seq.sum()), ""
    else:
        ar_seq, ar_total = np.full(inputs.n_sequences, np.nan), None
        note = (f"the cost model has no m = 1 (it covers m = {model.ms}); the fit has m = 1 only when the trace "
                "has K = 0 rounds, so plain decoding cannot be priced")
    per_seq.insert(3, "autoregressive_ms", ar_seq)
    per_seq["rounds"] = ev[:, 4]
    per_seq["accepted"] = ev[:, 5]
    bounds = OracleBounds(
        oracle_ms=float(value[first].sum()), autoregressive_ms=ar_total, static_ms=static, best_static_k=best_k,
        n_sequences=inputs.n_sequences, n_tokens=int(inputs.n_tokens.sum()), oracle_rounds=float(ev[:, 4].sum()),
        oracle_accepted=float(ev[:, 5].sum()),
        breakdown_ms={p: float(ev[:, i].sum()) for i, p in enumerate(PART_NAMES)}, autoregressive_note=note)
    return OracleResult(inputs, cost_model, k_max, allow_k0, deterministic, float(alpha_scale), value, k_star, q,
                        bounds, per_seq)


def evaluate_policy(result_or_inputs: OracleResult | OracleInputs, cost_model: CostModel | None = None,
                    actions: np.ndarray | None = None, k_max: int | None = None, deterministic: bool = False,
                    alpha_scale: float = 1.0, extra_cost: np.ndarray | None = None) -> pd.DataFrame:
    """Expected time of a Markov policy (one action per state), per sequence.

    Either pass an :class:`OracleResult` (its inputs, cost model and options are used) or
    inputs plus ``cost_model``. ``extra_cost`` (n,) ms is added to each state's round cost (e.g.
    one draft step a rule ran to look at a confidence it then discarded).
    Returns a DataFrame with ``seq_id``, ``time_ms``, ``rounds``, ``accepted`` and the cost parts.
    """
    if isinstance(result_or_inputs, OracleResult):
        res = result_or_inputs
        inputs, model, k_max = res.inputs, res.cost_model, res.k_max
        deterministic, alpha_scale = res.deterministic, res.alpha_scale
    else:
        inputs, model = result_or_inputs, cost_model
        k_max = inputs.k_list if k_max is None else k_max
    if actions is None:
        raise ValueError("actions (n,) are required")
    actions = np.asarray(actions, dtype=np.int64)
    table = CostTable.build(inputs, model.with_alpha_scale(alpha_scale), k_max)
    if (actions == 0).any() and not table.has_k0:
        raise CostModelError(f"the policy takes k = 0 actions but the cost model has no m = 1 (m = {model.ms})")
    surv = survival(inputs, k_max, deterministic)
    parts = table.parts(actions)
    extra = np.zeros(inputs.n_states) if extra_cost is None else np.asarray(extra_cost, dtype=float)
    parts["draft"] = parts["draft"] + extra
    e_acc = accepted_at(surv, inputs.remaining, actions)
    rewards = np.column_stack([parts[p] for p in PART_NAMES] + [np.ones(inputs.n_states), e_acc])
    ev = evaluate_arrays(surv, actions, rewards, _Layout.build(inputs))[_first_state(inputs)]
    out = pd.DataFrame({"seq_id": inputs.seq_ids, "time_ms": ev[:, :4].sum(axis=1), "rounds": ev[:, 4],
                        "accepted": ev[:, 5]})
    for i, p in enumerate(PART_NAMES):
        out[f"{p}_ms"] = ev[:, i]
    return out


def sweep_k_max(inputs: OracleInputs, cost_model: CostModel, k_values: list[int] | range | None = None,
                **options: Any) -> pd.DataFrame:
    """Solve for each K_max in ``k_values`` (default 1..list length): the plateau of the bound.

    Columns: ``k_max``, ``oracle_ms``, ``speedup`` (NaN without m = 1), ``best_static_k``,
    ``best_static_speedup``, ``gain_over_best_static``, ``mean_accepted``, ``tokens_per_round``,
    ``ms_per_token``.
    """
    k_values = range(1, inputs.k_list + 1) if k_values is None else k_values
    rows = []
    for k in k_values:
        bd = solve(inputs, cost_model, k_max=int(k), **options).bounds
        rows.append({"k_max": int(k), "oracle_ms": bd.oracle_ms,
                     "speedup": np.nan if bd.speedup is None else bd.speedup, "best_static_k": bd.best_static_k,
                     "best_static_speedup": np.nan if bd.best_static_speedup is None else bd.best_static_speedup,
                     "gain_over_best_static": bd.gain_over_best_static, "mean_accepted": bd.mean_accepted,
                     "tokens_per_round": bd.tokens_per_round, "ms_per_token": bd.ms_per_token})
    return pd.DataFrame(rows)
