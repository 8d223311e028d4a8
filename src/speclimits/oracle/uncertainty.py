"""How sure is the bound? A cluster bootstrap of the cost model, re-solved each time.

The Oracle's speedup and its gain over the best static K depend on the fitted cost model. Each
replicate resamples the sweep's generations with replacement (:mod:`speclimits.bootstrap`),
refits the cost model on the resampled rounds (:func:`~speclimits.oracle.prepare.fit_trace_cost_model`'s
fit), and solves the same references again. The percentile intervals therefore describe the
cost model's sampling uncertainty for these references; the references themselves are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits.bootstrap import draw_counts, percentile_interval, resample_indices
from speclimits.oracle.prepare import OracleSetup
from speclimits.stats import fit_cost_model

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
    """

    estimate: dict[str, float | None]
    interval: dict[str, tuple[float, float]]
    best_static_k: int
    best_static_k_share: float
    replicates: pd.DataFrame
    allow_k0: bool

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
                "n_boot": self.n_boot, "allow_k0": self.allow_k0,
                "what": "percentile intervals over cost-model refits on generations resampled with replacement"}


def _quantities(bounds) -> dict[str, float]:
    return {"speedup": np.nan if bounds.speedup is None else bounds.speedup,
            "gain_over_best_static": bounds.gain_over_best_static, "ms_per_token": bounds.ms_per_token,
            "best_static_k": bounds.best_static_k}


def bootstrap_bound(setup: OracleSetup, k_max: int | None = None, n_boot: int = 199, seed: int = 0,
                    allow_k0: bool = False, progress: bool = False) -> BoundInterval:
    """Bootstrap the cost model by generation and re-solve ``setup``'s references.

    Parameters
    ----------
    setup : the Oracle setup (restrict it first with :meth:`OracleSetup.for_kind` for one kind).
    k_max, allow_k0 : as for :meth:`OracleSetup.solve`.
    n_boot, seed : replicates and their seed.
    """
    full = _quantities(setup.solve(k_max=k_max, allow_k0=allow_k0).bounds)
    rounds = setup.trace.rounds
    top_k = setup.trace.top_k
    codes, _ = pd.factorize(rounds["generation_id"], sort=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rows_of = [order[s:s + n] for s, n in zip(starts, sizes)]
    reps = []
    picks = resample_indices(draw_counts(len(sizes), n_boot, seed))
    for pick in tqdm(picks, desc="bound bootstrap", disable=not progress):
        idx = np.concatenate([rows_of[g] for g in pick])
        sample = rounds.iloc[idx].copy()
        # each drawn copy of a generation is its own generation in the refit
        sample["generation_id"] = np.repeat(np.arange(len(pick)), sizes[pick])
        model = fit_cost_model(sample.reset_index(drop=True), top_k=top_k, source="bootstrap replicate")
        reps.append(_quantities(setup.solve(k_max=k_max, allow_k0=allow_k0, model=model).bounds))
    table = pd.DataFrame(reps, columns=[*QUANTITIES, "best_static_k"])
    return BoundInterval(
        estimate={q: (None if q == "speedup" and not np.isfinite(full[q]) else float(full[q])) for q in QUANTITIES},
        interval={q: percentile_interval(table[q].to_numpy()) for q in QUANTITIES},
        best_static_k=int(full["best_static_k"]),
        best_static_k_share=float((table["best_static_k"] == full["best_static_k"]).mean()) if len(table) else np.nan,
        replicates=table, allow_k0=allow_k0)
