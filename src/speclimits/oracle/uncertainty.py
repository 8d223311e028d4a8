"""How sure is the bound? A cluster bootstrap of the cost model, re-solved each time.

The Oracle's speedup and its gain over the best static K depend on the fitted cost model. Each
replicate resamples the sweep's generations with replacement (:mod:`speclimits.bootstrap`),
refits the cost model on the resampled rounds (:func:`~speclimits.stats.fit_cost_model`'s
fit), and solves the same references again. The percentile intervals therefore describe the
cost model's sampling uncertainty for these references; the references themselves are fixed.

Nothing is refitted or re-solved from scratch (:func:`bootstrap_bound`; the literal procedure,
:func:`direct_replicates`, is kept as the reference the tests and the benchmark compare with):

* **refit** (:class:`RefitSums`): both regressions of the fit are OLS, so a resample's estimates
  depend on the data only through the per-generation cross-products ``X'X`` and ``X'y``
  (:mod:`speclimits.stats._ols`). A generation drawn w times adds w copies of its sums, so a
  replicate's normal equations are one (B, G) @ (G, p, p) product and a p x p solve, with the
  design (which m are present, at which m α is identified, the m = 1 convention) decided from
  the replicate's own sums exactly as :func:`~speclimits.stats.fit_joint` decides it on the rows;
* **static K and autoregressive** times are linear in the cost model (``fixed[k] · rounds +
  slope[k] · ΣŪ + c · ΣL`` along a fixed policy), so one policy evaluation on the references
  prices every replicate;
* **the Oracle** itself is re-solved for all replicates at once
  (:func:`~speclimits.oracle.solver.first_values`: the backward induction with the cost models
  as a trailing axis).

Same replicates, same seed: the numbers agree with the direct procedure to rounding (summation
order only; the tests bound the difference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits.bootstrap import draw_counts, percentile_interval, resample_indices
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.prepare import OracleSetup
from speclimits.oracle.solver import OracleResult, evaluate_arrays, first_values, require_k0, survival, _Layout
from speclimits.stats import fit_cost_model
from speclimits.stats._ols import CellMoments, Design, cross_products, solve_normal
from speclimits.stats.final import fill_missing_m, pool_sparse_m
from speclimits.stats.final import joint_design as final_joint_design
from speclimits.stats.draft import DRAFT_DESIGN
from speclimits.trace import decode_rounds

#: Quantities the bootstrap reports.
QUANTITIES = ("speedup", "gain_over_best_static", "ms_per_token")
#: Base variables of the target fit (:func:`~speclimits.stats.fit_cost_model`).
TARGET_BASE = ("u_bar", "context_len")


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


# ---------------------------------------------------------------------------
# the refit from per-generation sufficient statistics
# ---------------------------------------------------------------------------


def joint_design(groups: tuple[tuple[int, ...], ...], unidentified: tuple[tuple[int, ...], ...]) -> Design:
    """:func:`~speclimits.stats.final.categorical_design` for given groups of m (an m alone, or the
    m values the sparse-cell rule pooled): ``beta0[g]`` for each group, ``alpha[g]`` where
    identified, shared ``c`` (the same terms in the same order)."""
    return final_joint_design(groups, unidentified)


def _per_generation(values: np.ndarray, gen: np.ndarray, n_gen: int) -> np.ndarray:
    """Sum the leading axis of ``values`` (C, ...) into (n_gen, ...) by generation code ``gen`` (C,)."""
    out = np.zeros((n_gen,) + values.shape[1:])
    np.add.at(out, gen, values)
    return out


@dataclass(frozen=True, eq=False)
class RefitSums:
    """What a refit of :func:`~speclimits.stats.fit_cost_model` needs, summed per generation.

    ``generation_ids`` (G,) are the resampling units in the order of :func:`pd.factorize`
    (sorted), the columns of a :func:`~speclimits.bootstrap.draw_counts` matrix. The target fit's
    cell moments (one generation at one m, decode rounds with a non-zero target time) and the draft
    fit's (decode rounds with K >= 1 and a non-zero draft time) are kept with each cell's
    generation code; per-group row counts and Ū sums (G, M) decide each replicate's design. The
    groups of m are the full sample's (:func:`~speclimits.stats.final.pool_sparse_m`: an m alone,
    or sparse m pooled); a replicate whose design cannot be solved (α identified at no group, a
    singular design) gives None, a failed replicate that :func:`bootstrap_bound` counts.

    :meth:`models` gives, for a (B, G) matrix of draw counts, the B cost models that
    ``fit_cost_model`` returns on the resampled rounds (each drawn copy its own generation).
    """

    generation_ids: np.ndarray
    top_k: float | None
    target: CellMoments
    target_gen: np.ndarray  # (C,) generation code of each target cell
    draft_xtx: np.ndarray  # (G, 2, 2) draft design [const, K]
    draft_xty: np.ndarray  # (G, 2)
    groups: tuple[tuple[int, ...], ...]  # (M,) groups of m of the target cells, ascending (pooled sparse m)
    m_rows: np.ndarray  # (G, M) target rows per generation and group
    m_u1: np.ndarray  # (G, M) sum of u_bar
    m_u2: np.ndarray  # (G, M) sum of u_bar ** 2
    draft_origin: bool = False  # one K > 0 only: the draft line through the origin, as fit_cost_model
    _designs: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, rounds: pd.DataFrame, top_k: float | None = None) -> "RefitSums":
        _, gen_ids = pd.factorize(rounds["generation_id"], sort=True)
        gen_index = pd.Index(gen_ids)
        n_gen = len(gen_index)
        dec, _ = decode_rounds(rounds, timing="target")
        mom = CellMoments.from_rounds(dec, base=TARGET_BASE)
        tgen = gen_index.get_indexer(mom.cells["generation_id"])
        dec_d, _ = decode_rounds(rounds, timing="draft")  # as stats.draft.fit_draft_line
        dmom = CellMoments.from_rounds(dec_d, response="t_draft_ms", base=())
        dxtx, dxty = cross_products(dmom, DRAFT_DESIGN.matrices(dmom))
        dgen = gen_index.get_indexer(dmom.cells["generation_id"])
        groups = pool_sparse_m(mom).groups
        code_of = {m: i for i, g in enumerate(groups) for m in g}
        m_code = np.array([code_of[int(m)] for m in mom.cells["m"].to_numpy()], dtype=np.int64)
        iu = mom.names.index("u_bar")

        def by_gen_m(v):
            out = np.zeros((n_gen, len(groups)))
            np.add.at(out, (tgen, m_code), v)
            return out

        return cls(np.asarray(gen_ids), None if top_k is None else float(top_k), mom, tgen,
                   _per_generation(dxtx, dgen, n_gen), _per_generation(dxty, dgen, n_gen), groups,
                   by_gen_m(mom.n), by_gen_m(mom.zz[:, iu, 0]), by_gen_m(mom.zz[:, iu, iu]),
                   draft_origin=bool(dmom.cells["K"].nunique() == 1))

    @property
    def n_generations(self) -> int:
        return len(self.generation_ids)

    def _design_sums(self, key: tuple[tuple[int, ...], tuple[int, ...]]):
        """(design, X'X (G, p, p), X'y (G, p)) of the joint design for ``key = (ms, unidentified)``."""
        if key not in self._designs:
            design = joint_design(*key)
            xtx_c, xty_c = cross_products(self.target, design.matrices(self.target))
            n_gen = self.n_generations
            self._designs[key] = (design, _per_generation(xtx_c, self.target_gen, n_gen),
                                  _per_generation(xty_c, self.target_gen, n_gen))
        return self._designs[key]

    def models(self, counts: np.ndarray, source: str = "bootstrap replicate") -> list[CostModel | None]:
        """The refitted cost model of each replicate (``counts`` (B, G) draw counts); None for a
        replicate whose design cannot be solved (a failed replicate)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=float))
        if counts.shape[1] != self.n_generations:
            raise ValueError(f"counts have {counts.shape[1]} columns for {self.n_generations} generations")
        # the design each replicate's rows give (fit_joint): which m are present, where α is identified
        n = counts @ self.m_rows
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_u = (counts @ self.m_u1) / n
            var_u = (counts @ self.m_u2) / n - mean_u ** 2
        identified = var_u > 1e-10 * np.maximum(1.0, mean_u ** 2)  # as stats.final._u_identified
        d_xtx = np.einsum("bg,gij->bij", counts, self.draft_xtx)
        d_xty = counts @ self.draft_xty
        keys = []
        for b in range(len(counts)):
            present = n[b] > 0
            keys.append((tuple(g for g, p in zip(self.groups, present) if p),
                         tuple(g for g, p, ok in zip(self.groups, present, identified[b]) if p and not ok)))
        out: list[CostModel | None] = [None] * len(counts)
        for key in dict.fromkeys(keys):
            groups, unident = key
            ident = [g for g in groups if g not in unident]
            if not ident:  # α identified at no group of this resample: a failed replicate
                continue
            design, xtx_g, xty_g = self._design_sums(key)
            cols = design.columns
            members = [b for b, k in enumerate(keys) if k == key]
            xtx = np.einsum("bg,gij->bij", counts[members], xtx_g)
            xty = counts[members] @ xty_g
            for i, b in enumerate(members):
                try:
                    beta = dict(zip(cols, solve_normal(xtx[i], xty[i], cols)))
                    draft = (np.array([0.0, d_xty[b][0] / d_xtx[b][0, 1]]) if self.draft_origin else
                             solve_normal(d_xtx[b], d_xty[b], DRAFT_DESIGN.columns))
                except SpeclimitsError:  # singular in this resample: a failed replicate
                    continue
                beta0, alpha = {}, {}
                for g in groups:
                    label = ",".join(map(str, g))
                    if g in unident:  # fit_joint's m = 1 convention: alpha := alpha(nearest identified group)
                        donor = ",".join(map(str, min(ident, key=lambda v: (abs(v[0] - g[0]), v[0]))))
                        j = self.groups.index(g)
                        tk = self.top_k if self.top_k is not None else \
                            float(counts[b] @ self.m_u1[:, j] / (counts[b] @ self.m_rows[:, j]))
                        a_g = float(beta[f"alpha[{donor}]"])
                        b_g = float(beta[f"beta0[{label}]"] - beta[f"alpha[{donor}]"] * tk)
                    else:
                        a_g, b_g = float(beta[f"alpha[{label}]"]), float(beta[f"beta0[{label}]"])
                    for m in g:
                        alpha[m], beta0[m] = a_g, b_g
                beta0, alpha, _ = fill_missing_m(beta0, alpha)
                out[b] = CostModel(c=float(beta["c"]), beta0=beta0, alpha=alpha, a=float(draft[1]), b=float(draft[0]),
                                   source=source)
        return out


# ---------------------------------------------------------------------------
# the re-solve, all replicates at once
# ---------------------------------------------------------------------------


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
    totals = evaluate_arrays(surv, np.tile(ks, 3)[None, :], rewards, _Layout.build(inputs))[inputs.offsets[:-1]]
    rounds, u_sum, ctx_sum = np.split(totals.sum(axis=0), 3)
    static = fixed[:, 1:] * rounds + slope[:, 1:] * u_sum + c[:, None] * ctx_sum  # (B, k_max)
    with np.errstate(invalid="ignore"):  # NaN where a model has no m = 1: no autoregressive baseline
        autoregressive = (fixed[:, 0] * inputs.n_states + slope[:, 0] * inputs.u_bar_window[:, 0].sum()
                          + c * inputs.context_len.sum())
    best = np.argmin(static, axis=1)
    best_ms = static[np.arange(len(static)), best]
    return pd.DataFrame({"speedup": autoregressive / oracle_ms, "gain_over_best_static": best_ms / oracle_ms,
                         "ms_per_token": oracle_ms / int(inputs.n_tokens.sum()), "best_static_k": best + 1})


def direct_replicates(setup: OracleSetup, counts: np.ndarray, k_max: int | None = None, allow_k0: bool = False,
                      progress: bool = False) -> pd.DataFrame:
    """The literal procedure, one replicate at a time: resample the rounds, :func:`fit_cost_model`,
    :meth:`OracleSetup.solve`. Same columns as :func:`replicate_quantities`; the reference that
    :func:`bootstrap_bound` is tested and benchmarked against (slow: a full fit and solve each)."""
    rounds = setup.trace.rounds
    codes, _ = pd.factorize(rounds["generation_id"], sort=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rows_of = [order[s:s + n] for s, n in zip(starts, sizes)]
    reps = []
    for pick in tqdm(resample_indices(counts), desc="bound bootstrap (direct)", disable=not progress):
        idx = np.concatenate([rows_of[g] for g in pick])
        sample = rounds.iloc[idx].copy()
        # each drawn copy of a generation is its own generation in the refit
        sample["generation_id"] = np.repeat(np.arange(len(pick)), sizes[pick])
        model = fit_cost_model(sample.reset_index(drop=True), top_k=setup.trace.top_k, source="bootstrap replicate")
        reps.append(_quantities(setup.solve(k_max=k_max, allow_k0=allow_k0, model=model).bounds))
    return pd.DataFrame(reps, columns=[*QUANTITIES, "best_static_k"])


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
    sums = RefitSums.of(setup.trace.rounds, top_k=setup.trace.top_k)
    counts = draw_counts(sums.n_generations, n_boot, seed)
    n_failed = 0
    if n_boot:
        models = sums.models(counts)
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
