"""How sure is the bound? A cluster bootstrap of the cost model, re-solved each time.

Each replicate resamples the sweep's generations with replacement (:mod:`speclimits.bootstrap`), refits
the cost model and solves the same references again: the percentile intervals describe the cost model's
sampling uncertainty for these (fixed) references. Nothing is refitted or re-solved from scratch
(:func:`bootstrap_bound`): the refit is :func:`~speclimits.stats.costfit.fit_costs` with the draw counts as
generation weights; static K and autoregressive times are linear in the cost model (``fixed[k] · rounds +
slope[k] · ΣŪ + c · ΣL`` along a fixed policy), so one policy evaluation prices every replicate; the
Oracle is re-solved for all replicates at once (:func:`~speclimits.oracle.solver.first_values`). The
numbers agree with resampling, refitting and re-solving one replicate at a time to rounding (the tests
bound the difference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.prepare import OracleSetup
from speclimits.oracle.solver import Layout, OracleResult, evaluate_arrays, first_values, require_k0, survival
from speclimits.stats.costfit import CostMoments, fit_costs

#: Quantities the bootstrap reports.
QUANTITIES = ("speedup", "gain_over_best_static", "ms_per_token")


@dataclass(frozen=True)
class BoundInterval:
    """Estimates on the full sample with 95% percentile intervals over cost-model replicates.

    Attributes
    ----------
    estimate : ``{quantity: value}`` from the full-sample cost model (``speedup`` is None
        without an autoregressive baseline).
    interval : ``{quantity: (lo, hi)}``.
    best_static_k : the best static K on the full sample; ``best_static_k_share``: share of
        replicates that agree.
    replicates : (n_boot, ...) DataFrame of every replicate's quantities and best static K.
    allow_k0 : whether the Oracle could take plain autoregressive steps.
    n_failed : replicates whose cost-model refit could not be solved (a resample that missed every
        generation of a cell the fit needs); left out of ``replicates`` and of the intervals.
    """

    estimate: dict[str, float | None]
    interval: dict[str, tuple[float, float]]
    best_static_k: int
    best_static_k_share: float
    replicates: pd.DataFrame
    allow_k0: bool
    n_failed: int = 0

    @property
    def n_boot(self) -> int:
        return len(self.replicates)

    def cell(self, quantity: str, digits: int = 3) -> str:
        """``"1.234 [1.200; 1.270]"`` for a table."""
        est = self.estimate[quantity]
        lo, hi = self.interval[quantity]
        if est is None:
            return "n/a"
        return f"{est:.{digits}f} [{lo:.{digits}f}; {hi:.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "interval": {k: list(v) for k, v in self.interval.items()},
                "best_static_k": self.best_static_k, "best_static_k_share": self.best_static_k_share,
                "n_boot": self.n_boot, "n_failed": self.n_failed, "allow_k0": self.allow_k0,
                "what": "percentile intervals over cost-model refits on generations resampled with replacement"}


def _quantities(bounds) -> dict[str, float]:
    return {"speedup": np.nan if bounds.speedup is None else bounds.speedup,
            "gain_over_best_static": bounds.gain_over_best_static, "ms_per_token": bounds.ms_per_token,
            "best_static_k": bounds.best_static_k}


def replicate_quantities(setup: OracleSetup, models: list[CostModel], k_max: int | None = None,
                         allow_k0: bool = False, progress: bool = False) -> pd.DataFrame:
    """:data:`QUANTITIES` and ``best_static_k`` of ``setup`` solved under each cost model (one row each).

    Static K and autoregressive totals come from one policy evaluation per K (they are linear in
    the cost model); the Oracle's V(0) from :func:`~speclimits.oracle.solver.first_values`.
    """
    inputs = setup.inputs
    k_max = inputs.k_list if k_max is None else int(k_max)
    tables = [CostTable.build(inputs, m, k_max) for m in models]  # the checks solve makes
    for table in tables:
        require_k0(table, allow_k0)
    fixed = np.array([t.fixed for t in tables]).reshape(len(tables), k_max + 1)
    slope = np.array([t.slope for t in tables]).reshape(len(tables), k_max + 1)
    c = np.array([m.c for m in models], dtype=float)
    surv = survival(inputs, k_max, setup.deterministic)
    oracle_ms = first_values(inputs, surv, fixed, slope, c, allow_k0=allow_k0, progress=progress).sum(axis=1)
    # static K = k: expected rounds, sum of Ū(k) and of L along the policy, from every sequence's first state
    ks = np.arange(1, k_max + 1)
    u = inputs.u_bar_window[:, 1: k_max + 1]
    ones = np.ones((inputs.n_states, k_max))
    rewards = np.concatenate([ones, u, ones * inputs.context_len[:, None]], axis=1)
    totals = evaluate_arrays(surv, np.tile(ks, 3)[None, :], rewards, Layout.build(inputs))[inputs.offsets[:-1]]
    rounds, u_sum, ctx_sum = np.split(totals.sum(axis=0), 3)
    static = fixed[:, 1:] * rounds + slope[:, 1:] * u_sum + c[:, None] * ctx_sum  # (B, k_max)
    with np.errstate(invalid="ignore"):  # NaN where a model has no m = 1: no autoregressive baseline
        autoregressive = (fixed[:, 0] * inputs.n_states + slope[:, 0] * inputs.u_bar_window[:, 0].sum()
                          + c * inputs.context_len.sum())
    best = np.argmin(static, axis=1)
    best_ms = static[np.arange(len(static)), best]
    return pd.DataFrame({"speedup": autoregressive / oracle_ms, "gain_over_best_static": best_ms / oracle_ms,
                         "ms_per_token": oracle_ms / int(inputs.n_tokens.sum()), "best_static_k": best + 1})


def bootstrap_bound(setup: OracleSetup, k_max: int | None = None, n_boot: int = 199, seed: int = 0,
                    allow_k0: bool = False, progress: bool = False, result: OracleResult | None = None
                    ) -> BoundInterval:
    """Bootstrap the cost model by generation and re-solve ``setup``'s references.

    Parameters
    ----------
    setup : the Oracle setup (restrict it first with :meth:`OracleSetup.for_kind` for one kind).
    k_max, allow_k0 : as for :meth:`OracleSetup.solve`.
    n_boot, seed : replicates and their seed.
    progress : show progress bars (the re-solves, when they run in more than one chunk).
    result : ``setup.solve(k_max=k_max, allow_k0=allow_k0)`` when the caller has it (not solved again).
    """
    full_result = setup.solve(k_max=k_max, allow_k0=allow_k0) if result is None else result
    full = _quantities(full_result.bounds)
    mom = CostMoments.of(setup.trace.rounds, top_k=setup.trace.top_k)
    counts = draw_counts(mom.n_generations, n_boot, seed)
    n_failed = 0
    if n_boot:
        models = fit_costs(mom, counts)
        # a replicate that missed every generation of an m the solve prices (e.g. the top m of a sweep
        # with few generations per K) is a failed replicate, counted like one that could not be fitted
        k_used = setup.inputs.k_list if k_max is None else int(k_max)
        need = {m for m in setup.model.ms if m <= k_used + 1}
        good = [m for m in models if m is not None and need <= set(m.ms)]
        n_failed = len(models) - len(good)
        if not good:
            raise SpeclimitsError(f"every one of the {n_boot} cost-model bootstrap replicates failed (each missed "
                                  "every generation of some m the fit needs); run with --n-boot 0")
        table = replicate_quantities(setup, good, k_max=k_max, allow_k0=allow_k0, progress=progress)
    else:
        table = pd.DataFrame(columns=[*QUANTITIES, "best_static_k"], dtype=float)
    return BoundInterval(
        estimate={q: (None if q == "speedup" and not np.isfinite(full[q]) else float(full[q])) for q in QUANTITIES},
        interval={q: percentile_interval(table[q].to_numpy()) for q in QUANTITIES},
        best_static_k=int(full["best_static_k"]),
        best_static_k_share=float((table["best_static_k"] == full["best_static_k"]).mean()) if len(table) else np.nan,
        replicates=table, allow_k0=allow_k0, n_failed=n_failed)
