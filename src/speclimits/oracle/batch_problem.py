"""Closed batches at batch > 1 (issue 20, item 4): the problem the batch Oracle's modules share.

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

Unique-expert counts are clipped at E = ``n_experts`` throughout (``union_unique`` clips them), so at
n = 1 the step is the batch-1 round cost with ``min(u, E)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from speclimits.costmodel import BatchCostModel
from speclimits.errors import CostModelError, SpeclimitsError
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.solver import Layout, OracleResult, evaluate_arrays, require_k0, solve, survival


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


def group_matrix(grps: list[np.ndarray]) -> np.ndarray:
    """(G, b) sequence indices, -1 where a (last) group is smaller."""
    width = max(len(g) for g in grps)
    out = np.full((len(grps), width), -1, dtype=np.int64)
    for i, g in enumerate(grps):
        out[i, : len(g)] = g
    return out


@dataclass(frozen=True, eq=False)
class BatchProblem:
    """One problem: inputs (Ū clipped at E), the batch model, k_max, surrogate, action range, and
    ``table``, the batch-1 round costs (n = 1) under the base model."""

    inputs: OracleInputs
    model: BatchCostModel
    k_max: int
    deterministic: bool
    k_lo: int
    table: CostTable

    @classmethod
    def build(cls, inputs: OracleInputs, model: BatchCostModel, k_max: int | None = None,
              deterministic: bool = False, allow_k0: bool | None = None) -> "BatchProblem":
        """``k_max`` None: the largest K both the references and the cost model cover; ``allow_k0`` None:
        k = 0 allowed when the model has m = 1."""
        if not isinstance(model, BatchCostModel):
            raise CostModelError("the batch Oracle needs a BatchCostModel (a batch-1 CostModel has no per-request "
                                 "terms; BatchCostModel.from_batch1 makes one for a what-if)")
        k_max = min(inputs.k_list, max(model.ms) - 1) if k_max is None else int(k_max)
        e = float(model.n_experts)
        if (inputs.u_bar_window > e).any():
            inputs = replace(inputs, u_bar_window=np.minimum(inputs.u_bar_window, e), _cache={})
        table = CostTable.build(inputs, model.base, k_max, origin="batch cost model")
        allow_k0 = table.has_k0 if allow_k0 is None else allow_k0
        require_k0(table, allow_k0)
        return cls(inputs, model, k_max, bool(deterministic), 0 if allow_k0 else 1, table)

    @property
    def kk(self) -> int:
        return self.k_max + 1

    @property
    def actions(self) -> np.ndarray:
        return np.arange(self.k_lo, self.k_max + 1)

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

    @cached_property
    def single_optimal(self) -> OracleResult:
        """The batch-1 Oracle (n = 1) under the base model: the tail after the other request of a pair left."""
        return solve(self.inputs, self.model.base, k_max=self.k_max, allow_k0=self.k_lo == 0,
                     deterministic=self.deterministic)

    @cached_property
    def single_static(self) -> np.ndarray:
        """(n, k_max + 1) value of static k from every state when alone (column 0 NaN without m = 1)."""
        cost = np.nan_to_num(self.table.total(), nan=0.0)
        out = evaluate_arrays(self.surv, np.arange(self.kk)[None, :], cost, Layout.build(self.inputs))
        if not self.table.has_k0:
            out[:, 0] = np.nan
        return out

    def tables(self, b: int, tables: Any) -> np.ndarray:
        """Tables (``{n: k}``, a sequence indexed by n with entry 0 unused, or an int: a static K; or a list
        of them) as a (P, b + 1) int array: column n = the k with n active (column 0 = column 1)."""
        out = []
        for t in [int(tables)] if np.isscalar(tables) else tables:
            if isinstance(t, Mapping):
                missing = [n for n in range(1, b + 1) if n not in t]
                if missing:
                    raise SpeclimitsError(f"batch-size table {dict(t)} lacks entries for n = {missing}")
                row = [int(t[n]) for n in range(1, b + 1)]
            elif np.isscalar(t):
                row = [int(t)] * b
            else:
                row = [int(v) for v in t][1:]
                if len(row) != b:
                    raise SpeclimitsError(f"a table as a sequence needs b + 1 = {b + 1} entries (index = n), got "
                                          f"{[int(v) for v in t]}")
            bad = [v for v in row if not self.k_lo <= v <= self.k_max]
            if bad:
                raise SpeclimitsError(f"table entries must be in {self.k_lo}..{self.k_max}, got {bad}")
            out.append([row[0], *row])
        return np.asarray(out, dtype=np.int64).reshape(-1, b + 1)
