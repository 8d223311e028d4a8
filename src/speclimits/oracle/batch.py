"""The bound at batch > 1, per batch size: :func:`batch_bounds`, the numbers ``speclimits oracle --batch``
prints. The setting is :mod:`~speclimits.oracle.batch_problem`'s; :mod:`~speclimits.oracle.batch_pair`
has the exact Oracle for b = 2, :mod:`~speclimits.oracle.batch_tables` static K and the best batch-size→K
table, :mod:`~speclimits.oracle.batch_relaxation` the bound no policy can beat at any b.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from speclimits.costmodel import BatchCostModel
from speclimits.oracle.batch_pair import solve_pairs, split_pairs
from speclimits.oracle.batch_problem import BatchProblem, groups
from speclimits.oracle.batch_relaxation import RelaxationBound, relax
from speclimits.oracle.batch_tables import DEFAULT_SAMPLES, MONTE_CARLO, BestTable, search_table, table_values
from speclimits.oracle.inputs import OracleInputs


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
            "table": str(self.table),
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
            lines.append(f"{bb.b:>3} {f(bb.per_token(bb.plain_ms)):>8} {bb.best_static_k:>8} "
                         f"{f(bb.per_token(bb.best_static_ms)):>8} {str(bb.table):>18} {f(bb.table.ms_per_token):>8} "
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
    (:func:`~speclimits.oracle.batch_tables.search_table`; ``tables`` False skips the descent and reports
    the best static K as the table), the relaxation bound, and at b <= 2 the exact Oracle with the
    relaxation's slack against it. Gains: best static / bound and table / bound."""
    ctx = BatchProblem.build(inputs, model, k_max, deterministic, allow_k0)
    ks = [int(k) for k in ctx.actions]
    out = {}
    for b in sorted({int(v) for v in batch_sizes}):
        grps = groups(inputs, b, order)
        secs: dict[str, float] = {}
        t0 = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal t0
            secs[name], t0 = time.perf_counter() - t0, time.perf_counter()

        static = table_values(ctx, grps, b, ctx.tables(b, ks), n_samples, seed)
        lap("static")
        table = search_table(ctx, grps, b, n_samples, seed, static=static, max_sweeps=20 if tables else 0)
        lap("table")
        bound = relax(ctx, grps, b)
        lap("bound")
        exact = float(ctx.single_optimal.bounds.oracle_ms) if b == 1 else \
            solve_pairs(ctx, *split_pairs(grps)).total_ms if b == 2 else None
        lap("exact")
        method = static.method + (f" ({static.n_samples} samples, seed {static.seed}, 95% intervals)"
                                  if static.method == MONTE_CARLO else "")
        out[b] = BatchBound(
            b=b, n_groups=len(grps), n_tokens=static.n_tokens, method=method,
            static_ms={k: float(v) for k, v in zip(ks, static.total_ms)},
            static_lo={k: float(v) for k, v in zip(ks, static.lo)},
            static_hi={k: float(v) for k, v in zip(ks, static.hi)},
            best_static_k=ks[int(np.argmin(static.total_ms))], table=table, bound=bound, exact_ms=exact,
            seconds=secs)
    return BatchBounds(out, ctx.k_max, ctx.deterministic, ctx.k_lo == 0, int(n_samples), int(seed),
                       model.base.source)
