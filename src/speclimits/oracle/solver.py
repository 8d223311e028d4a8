"""Backward induction for the Oracle (the book's methods page, "The Oracle"), vectorized across sequences and actions.

Bellman equation over state n (tokens already emitted) of a sequence of N tokens::

    V(N) = 0
    Q(n, k) = C(n, k) + sum_{a=0..k} P(a | n, k) · V(min(N, n + a + 1))
    V(n) = min_k Q(n, k),   k*(n) = argmin_k Q(n, k)   (smallest k on ties)

With ``S_j = P(a >= j)`` and ``W_j = V(min(N, n + j))`` the expectation telescopes to
``W_1 + sum_{j=1..k} S_j · (W_{j+1} - W_j)``. Sequences are solved in lockstep by tokens remaining
t = N - n (:class:`Layout`): one numpy step per t handles every sequence and every k, reading the
last k_max + 1 blocks' values from a ring buffer.
"""

from __future__ import annotations

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


def survival(inputs: OracleInputs, k_max: int, deterministic: bool = False) -> np.ndarray:
    """(n, k_max) ``S[:, j-1] = P(a >= j)`` for j = 1..k_max: :func:`survival_rows` of every state."""
    return survival_rows(inputs, k_max, deterministic)(np.arange(inputs.n_states))


def survival_rows(inputs: OracleInputs, k_max: int, deterministic: bool):
    """``rows -> (len(rows), k_max)`` P(a >= j) of those states. Probabilistic: ``prod_{i<j} match_prob[i]``;
    deterministic: ``1[j <= accept_len]``."""
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


def accepted_at(surv: np.ndarray, remaining: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(n,) E[min(a, remaining) | n, k(n)] at one action per state."""
    j = np.arange(1, surv.shape[1] + 1)[None, :]
    return (surv * (j <= np.minimum(k, remaining)[:, None])).sum(axis=1)


@dataclass(frozen=True, eq=False)
class Layout:
    """Lockstep schedule. Sorting sequences longest first, the states with t tokens remaining are rows
    ``ends[:n_active[t]] - t`` (one per sequence with N >= t), so one numpy step per t serves them all."""

    ends: np.ndarray  # (S,) one past the last row of each sequence, longest sequence first
    n_active: np.ndarray  # (t_max + 2,) sequences with N >= t (0 at t_max + 1)
    rank: np.ndarray  # (S,) position of each sequence (inputs' order) in the longest-first order

    @classmethod
    def build(cls, inputs: OracleInputs) -> "Layout":
        n_tok = inputs.n_tokens
        order = np.argsort(-n_tok, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        n_active = np.searchsorted(-n_tok[order], -np.arange(int(n_tok.max()) + 2), side="right").astype(np.int64)
        return cls(inputs.offsets[order + 1], n_active, rank)

    @property
    def t_max(self) -> int:
        return len(self.n_active) - 2


#: Reward channels of the Oracle's own policy evaluation in :func:`backward_induction`.
ORACLE_CHANNELS = (*PART_NAMES, "rounds", "accepted")
#: Blocks of at most this many states take the evaluation's few-calls path (every term formed) rather
#: than its ragged running sums (fewer terms, more numpy calls); same numbers either way.
_RECTANGULAR_BLOCK = 200


def backward_induction(inputs: OracleInputs, surv_rows, fixed: np.ndarray, slope: np.ndarray, c: np.ndarray,
                       k_lo: int = 1, table: CostTable | None = None):
    """The Oracle's one solver: lockstep backward induction under B cost models at once.

    Model b prices action k at ``fixed[b, k] + slope[b, k] * u_bar_window[n, k] + c[b] * context_len[n]``
    (``fixed``, ``slope`` (B, k_max + 1), ``c`` (B,): :meth:`CostModel.action_terms`); ``surv_rows(rows)``
    gives those states' (len(rows), k_max) P(a >= j); actions k_lo..k_max. Returns (S, B) V(0).

    With ``table`` (B = 1) it returns ``(V (n,), k_star (n,), Q (n, k_max + 1), oracle_first (S, 6),
    static_first (S, k_max))``: in the same sweep it evaluates the Oracle's policy on :data:`ORACLE_CHANNELS`
    and every static K from each sequence's first state, bit for bit as :func:`evaluate_arrays` would (same
    operations in the same order; a test checks it) but with each block's survival, costs and differences
    built once.
    """
    layout = Layout.build(inputs)
    n_models, kk = fixed.shape
    k_max = kk - 1
    n_seq, n_active = len(layout.rank), layout.n_active
    ring = kk + 1  # the block at t reads r = t - 1 .. t - k_max - 1 and writes r = t
    vring = np.zeros((ring, n_seq, n_models))  # [r % ring, seq, model]: V with r tokens remaining (r <= 0: 0)
    v_first = np.empty((n_seq, n_models))
    upper = np.triu(np.ones((k_max, kk)), 1)  # upper[j - 1, k] = 1[j <= k]: the running sum over j as a product
    slot_j = (np.arange(ring)[:, None] - np.arange(1, kk + 1)[None, :]) % ring  # [t % ring, j - 1]: slot of t - j
    u_win, lens = inputs.u_bar_window, inputs.context_len
    evaluate = table is not None
    if evaluate:
        n, n_orc = inputs.n_states, len(ORACLE_CHANNELS)
        ch = k_max + n_orc  # channels: static K = 1..k_max, then the Oracle's
        # channel values and their differences with r tokens remaining, channel-major [slot, channel, seq]
        # so that every operation runs along the sequences; slots not yet written hold the zeros of r <= 0
        ebuf = np.zeros((ring, ch, n_seq))
        dif = np.zeros((ring, ch, n_seq))  # value at r - 1 minus value at r: W_{j+1} - W_j for r = t - j
        out_first = np.empty((n_seq, ch))
        q_state, k_state, v_state = np.empty((n, kk)), np.empty(n, dtype=np.int64), np.empty(n)
        steps = np.arange(1, kk)[None, :]
        tmp = np.empty((ch, n_seq))
        static_mask = (steps.T <= steps).astype(float)[:, :, None]
        # the parts of a round at action k, looked up: the values CostTable.parts computes
        draft_k = np.asarray(table.model.draft_ms(np.arange(kk)), dtype=float)
        beta0_k, alpha_k = table.beta0[1: kk + 1].astype(float), table.alpha[1: kk + 1]
        c_ctx = table.model.c * lens
    for t in range(1, layout.t_max + 1):
        n_t = int(n_active[t])
        rows = layout.ends[:n_t] - t
        s = surv_rows(rows)
        cost = np.take(u_win, rows, axis=0)[:, None, :kk] * slope  # (block, B, kk)
        cost += fixed
        cost += (c * np.take(lens, rows)[:, None])[..., None]
        w = np.moveaxis(vring[slot_j[t % ring], :n_t], 0, -1)  # (block, B, kk): W_j = V(min(N, n + j))
        # the Bellman step: Q = cost + W_1 + sum_{j <= k} S_j (W_{j+1} - W_j)
        d = w[..., 1:] - w[..., :-1]
        d *= s[:, None, :]
        q = np.matmul(d.reshape(-1, k_max), upper).reshape(n_t, n_models, kk)
        q += w[..., :1]
        q += cost
        k = np.argmin(q[..., k_lo:], axis=-1)
        k += k_lo
        v = np.take_along_axis(q, k[..., None], axis=-1)[..., 0]
        vring[t % ring, :n_t] = v
        done = slice(int(n_active[t + 1]), n_t)  # sequences with N = t: this block holds their first state
        v_first[done] = v[done]
        if not evaluate:
            continue
        q, k, v, cost = q[:, 0], k[:, 0], v[:, 0], cost[:, 0]
        q_state[rows], k_state[rows], v_state[rows] = q, k, v
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
            terms = dif[slot_j[t % ring, :k_max], :, :n_t]  # (k_max, ch, block): W_{j+1} - W_j, j = 1..k_max
            terms[:, :k_max] *= s_t[:, None, :]
            terms[:, :k_max] *= static_mask
            terms[:, k_max:] *= s_orc[:, None, :]
            np.sum(terms, axis=0, out=acc)
        else:
            # ragged running sums: static K = k stops at j = k, the Oracle at the block's largest k*
            dj = dif[(t - 1) % ring, :, :n_t]
            np.multiply(dj[:k_max], s_t[0], out=acc[:k_max])
            np.multiply(dj[k_max:], s_orc[0], out=acc[k_max:])
            for j in range(2, k_max + 1):
                dj = dif[(t - j) % ring, :, :n_t]
                part = tmp[: k_max - j + 1, :n_t]
                np.multiply(dj[j - 1: k_max], s_t[j - 1], out=part)
                acc[j - 1: k_max] += part
                if j <= k_top:
                    part = tmp[:n_orc, :n_t]
                    np.multiply(dj[k_max:], s_orc[j - 1], out=part)
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
        out_first[done] = acc[:, done].T
    if not evaluate:
        return v_first[layout.rank]
    at_first = out_first[layout.rank]  # (S, ch) in the inputs' sequence order
    return (v_state, k_state, q_state, np.ascontiguousarray(at_first[:, k_max:]),
            np.ascontiguousarray(at_first[:, :k_max]))


def first_values(inputs: OracleInputs, surv: np.ndarray, fixed: np.ndarray, slope: np.ndarray, c: np.ndarray,
                 allow_k0: bool = False, max_bytes: float = 64e6, progress: bool = False) -> np.ndarray:
    """(B, S) the optimal V(0) of every sequence under B cost models at once (the bootstrap's re-solves):
    :func:`backward_induction` with ``surv`` the (n, k_max) :func:`survival` table, the same numbers as
    :func:`solve` one model at a time. Models run in chunks whose buffers fit in ``max_bytes``;
    ``progress`` shows a bar over the chunks."""
    fixed = np.atleast_2d(np.asarray(fixed, dtype=float))
    slope = np.atleast_2d(np.asarray(slope, dtype=float))
    c = np.atleast_1d(np.asarray(c, dtype=float))
    n_models, kk = fixed.shape
    if surv.shape != (inputs.n_states, kk - 1) or slope.shape != fixed.shape or c.shape != (n_models,):
        raise ValueError(f"shapes: surv {surv.shape}, fixed {fixed.shape}, slope {slope.shape}, c {c.shape} "
                         f"for {inputs.n_states} states and k_max = {kk - 1}")
    surv = np.ascontiguousarray(surv, dtype=float)
    n_seq = inputs.n_sequences
    chunk = int(max(1, min(n_models, max_bytes // (8 * (kk + 1 + 4 * kk) * max(n_seq, 1)))))
    out = np.empty((n_models, n_seq))
    starts = range(0, n_models, chunk)
    for b0 in tqdm(starts, desc="Oracle re-solves", unit="chunk", disable=not progress or len(starts) < 2):
        b1 = min(n_models, b0 + chunk)
        out[b0:b1] = backward_induction(inputs, lambda rows: np.take(surv, rows, axis=0), fixed[b0:b1],
                                        slope[b0:b1], c[b0:b1], 0 if allow_k0 else 1).T
    return out


def evaluate_arrays(surv: np.ndarray, actions: np.ndarray, rewards: np.ndarray, layout: Layout) -> np.ndarray:
    """Policy evaluation: (n, ch) expected sum of per-round ``rewards`` (n, ch) from each state.

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
    out = np.empty_like(rewards)
    steps = np.arange(1, k_max + 1)[None, :, None]
    static = len(actions) == 1 and len(rewards) != 1
    if static:
        const_mask = (steps <= actions[0][None, None, :]).astype(float)
    pad = k_max + 1
    buf = np.zeros((pad + layout.t_max + 1, len(layout.rank), rewards.shape[1]))  # [pad + r, seq]: r <= 0 -> 0
    for t in range(1, layout.t_max + 1):
        n_t = int(layout.n_active[t])
        rows = layout.ends[:n_t] - t
        w = np.moveaxis(buf[t: pad + t][::-1, :n_t], 0, 1)  # (block, k_max + 1, ch)
        d = w[:, 1:] - w[:, :-1]
        d *= np.take(surv, rows, axis=0)[:, :, None]
        d *= const_mask if static else steps <= np.take(actions, rows, axis=0)[:, None, :]
        v = buf[pad + t, :n_t]
        np.sum(d, axis=1, out=v)
        v += w[:, 0]
        v += np.take(rewards, rows, axis=0)
        out[rows] = v
    return out


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
        """(n, k_max + 1) E[min(a, remaining) | n, k] for k = 0..k_max (accepted drafts that count)."""
        j = np.arange(1, self.k_max + 1)
        capped = np.where(j[None, :] <= self.inputs.remaining[:, None], self.survival, 0.0)
        return np.concatenate([np.zeros((len(capped), 1)), np.cumsum(capped, axis=1)], axis=1)

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
    value, k_star, q, ev, static_ev = backward_induction(
        inputs, survival_rows(inputs, k_max, deterministic), table.fixed[None], table.slope[None],
        np.array([model.c], dtype=float), 0 if allow_k0 else 1, table=table)
    first = inputs.offsets[:-1]
    static = {}
    per_seq = pd.DataFrame({"seq_id": inputs.seq_ids, "n_tokens": inputs.n_tokens, "value_ms": value[first]})
    for k in range(1, k_max + 1):
        per_seq[f"static_{k}_ms"] = static_ev[:, k - 1]
        static[k] = float(static_ev[:, k - 1].sum())
    best_k = min(static, key=static.get)
    per_seq["best_static_ms"] = per_seq[f"static_{best_k}_ms"]
    if table.has_k0:
        ar_seq = np.add.reduceat(table.total()[:, 0], first)
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
    ev = evaluate_arrays(surv, actions, rewards, Layout.build(inputs))[inputs.offsets[:-1]]
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
    names = ("oracle_ms", "speedup", "best_static_k", "best_static_speedup", "gain_over_best_static", "mean_accepted",
             "tokens_per_round", "ms_per_token")
    rows = []
    for k in range(1, inputs.k_list + 1) if k_values is None else k_values:
        bd = solve(inputs, cost_model, k_max=int(k), **options).bounds
        rows.append({"k_max": int(k), **{n: np.nan if getattr(bd, n) is None else getattr(bd, n) for n in names}})
    return pd.DataFrame(rows)
