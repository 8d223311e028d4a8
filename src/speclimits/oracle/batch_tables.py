"""Static K and batch-size→K tables at batch > 1: their expected times (exact by the pair Bellman
evaluation or one closed-batch simulation, else Monte Carlo over seeded closed-batch runs) and the best
table in hindsight by coordinate descent, in the setting of :mod:`~speclimits.oracle.batch_problem`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from speclimits.costmodel import BatchCostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.batch_pair import evaluate_pairs
from speclimits.oracle.batch_problem import BatchProblem, group_matrix, groups
from speclimits.oracle.inputs import OracleInputs

#: Monte Carlo samples (closed-batch runs of every group) for the probabilistic surrogate at b > 2.
DEFAULT_SAMPLES = 256
#: Methods of :func:`evaluate_tables`.
EXACT_SIMULATION = "exact (closed-batch simulation)"
EXACT_DP = "exact (Bellman evaluation)"
MONTE_CARLO = "Monte Carlo"


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


def _draws(ctx: BatchProblem, n_samples: int, seed: int) -> np.ndarray:
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


def simulate(ctx: BatchProblem, grp: np.ndarray, tables: np.ndarray, n_samples: int, seed: int,
              start: tuple[np.ndarray, np.ndarray] | None = None,
              snapshots: Sequence[int] = ()) -> Any:
    """(P, S, G) total ms of closed-batch runs of every group under every table.

    Each round: n = active requests, k = table[n], cost ``step_ms(n, k, union(u_i), sum L_i)``; request i
    at state s_i accepts ``a_i = min(k, A(s_i))`` (:func:`_draws`) and moves ``min(a_i + 1, remaining)``.
    A request visits each state at most once, so the draws along a run are independent with the right
    law; all tables see the same draws (common random numbers).

    With ``snapshots`` the totals come back with, for each m listed, every run's ``(pos, total)`` just
    before its first round with at most m active requests; ``start`` runs from such a state (broadcast
    over the tables), giving the same totals to the bit as one simulation from the start.
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
        total += np.where(go, ctx.model.step_prices(n, k, u_step, ctx_tot, ctx.prices), 0.0)
        acc = np.minimum(kb, draws[sidx, rows])
        pos += np.where(active, np.minimum(acc + 1, n_tok - pos), 0)
    if snaps:
        return total, {m: (v[0], v[1]) for m, v in snaps.items()}
    return total


def table_values(ctx: BatchProblem, grps: list[np.ndarray], b: int, tables: np.ndarray, n_samples: int, seed: int,
              method: str = "auto", start: tuple[np.ndarray, np.ndarray] | None = None) -> TableValues:
    """Values of ``tables`` (see :func:`evaluate_tables`). ``start``: the simulated runs continue from
    this state (:func:`simulate`'s snapshots of a table the given ones agree with up to that point)."""
    n_tokens = int(ctx.inputs.n_tokens.sum())
    if method == "auto":
        method = EXACT_SIMULATION if ctx.deterministic else (EXACT_DP if b <= 2 else MONTE_CARLO)
    if method == EXACT_DP:
        if b > 2:
            raise SpeclimitsError("exact policy evaluation of the probabilistic surrogate is available for b <= 2")
        tot = evaluate_pairs(ctx, grps, tables)
        return TableValues(tables, tot, tot, tot, n_tokens, EXACT_DP)
    if method == EXACT_SIMULATION and not ctx.deterministic:
        raise SpeclimitsError("a single closed-batch simulation is exact only with deterministic transitions")
    if method not in (EXACT_SIMULATION, MONTE_CARLO):
        raise SpeclimitsError(f"unknown evaluation method {method!r}")
    grp = group_matrix(grps)
    runs = simulate(ctx, grp, tables, n_samples, seed, start=start).sum(axis=2)  # (P, S)
    mean = runs.mean(axis=1)
    if ctx.deterministic:
        return TableValues(tables, mean, mean, mean, n_tokens, EXACT_SIMULATION)
    half = 1.96 * runs.std(axis=1, ddof=1) / math.sqrt(runs.shape[1]) if runs.shape[1] > 1 else np.full(len(mean), np.inf)
    return TableValues(tables, mean, mean - half, mean + half, n_tokens, MONTE_CARLO, int(n_samples), int(seed))


def evaluate_tables(inputs: OracleInputs, model: BatchCostModel, b: int, tables: Any, n_samples: int = DEFAULT_SAMPLES,
                    seed: int = 0, method: str = "auto", **problem: Any) -> TableValues:
    """Expected total time of batch-size tables (:meth:`BatchProblem.tables`; an int is a static K) in
    closed batches of ``b`` (:func:`groups`). ``method`` ``auto``: deterministic → one closed-batch
    simulation (exact); probabilistic at b <= 2 → the pair Bellman evaluation (exact); else Monte Carlo over
    ``n_samples`` seeded runs of every group with a 95% normal interval (common random numbers).
    ``problem``: ``k_max``, ``deterministic``, ``allow_k0`` of :meth:`BatchProblem.build`.
    """
    ctx = BatchProblem.build(inputs, model, **problem)
    return table_values(ctx, groups(inputs, b), b, ctx.tables(b, tables), n_samples, seed, method)


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
    method: str
    sweeps: int
    n_tokens: int
    search_ms: float | None = None

    @property
    def ms_per_token(self) -> float:
        return self.total_ms / self.n_tokens

    def __str__(self) -> str:
        """The entries for n = 1..b, ``k1,k2,...``."""
        return ",".join(str(self.table[n]) for n in range(1, self.b + 1))


def search_table(ctx: BatchProblem, grps: list[np.ndarray], b: int, n_samples: int, seed: int,
                 static: TableValues | None = None, max_sweeps: int = 20) -> BestTable:
    """The best batch-size→K table in hindsight (:class:`BestTable`): coordinate descent from the best
    static K (``static``: :func:`table_values` of every static K): for n = b, ..., 1 try every k for entry
    n with the others fixed and keep strict improvements, until a sweep changes nothing. Monte Carlo:
    searched on the draws of ``seed``, reported on those of ``seed + 1``. ``max_sweeps`` 0: the best static K.
    """
    if static is None:
        static = table_values(ctx, grps, b, ctx.tables(b, list(ctx.actions)), n_samples, seed)
    i0 = int(np.argmin(static.total_ms))
    start_k = int(ctx.actions[i0])
    cur = static.tables[i0].copy()
    cur_val, cur_lo, cur_hi = float(static.total_ms[i0]), float(static.lo[i0]), float(static.hi[i0])
    top = min(b, max(len(g) for g in grps))  # entries n > the largest group never act
    # candidates for entry n agree with the current table until n requests are left: the simulated
    # methods run the current table once per change, keep each run's state at every n (snapshots), and
    # simulate the candidates from there only (the same numbers as from the start)
    simulated = static.method != EXACT_DP
    grp = group_matrix(grps)
    sweeps = 0
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
                    snaps = simulate(ctx, grp, cur[None], n_samples, seed, snapshots=range(1, top))[1]
                start = (snaps[n][0][0], snaps[n][1][0])
            res = table_values(ctx, grps, b, cand, n_samples, seed, start=start)
            j = int(np.argmin(res.total_ms))
            if res.total_ms[j] < cur_val * (1.0 - 1e-12):
                cur, cur_val, cur_lo, cur_hi = cand[j].copy(), float(res.total_ms[j]), float(res.lo[j]), float(res.hi[j])
                changed = True
                snaps = None  # the snapshots below n depended on the entry just changed
        if not changed:
            break
    search = cur_val if max_sweeps else None
    if static.method == MONTE_CARLO and max_sweeps:  # the search chose on these draws: report fresh ones
        fresh = table_values(ctx, grps, b, cur[None], n_samples, seed + 1)
        cur_val, cur_lo, cur_hi = float(fresh.total_ms[0]), float(fresh.lo[0]), float(fresh.hi[0])
    return BestTable(b, {n: int(cur[n]) for n in range(1, b + 1)}, cur_val, cur_lo, cur_hi, start_k, static.method,
                     sweeps, static.n_tokens, search)
