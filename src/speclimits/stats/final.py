"""The final target-time model (Eq. 4) and everything the appendix compares it with.

* per-K OLS ``T_T ~ Ū + L`` (SEs clustered by generation; GroupKFold(5) out-of-sample metrics);
* the joint categorical model: free ``β0(m)``, ``α(m)`` per m, shared ``c`` (:func:`fit_joint`);
* the pooled linear model with ``γ·K``, MAPE by K, leave-one-K-out, other smooth forms in m
  (:mod:`speclimits.stats.comparisons`);
* whether and where the regime changes, by a parsimonious rule (:mod:`speclimits.stats.boundary`),
  and every regime-dependent row both at the rule's split and at the paper's m <= 4 | m >= 5
  (:mod:`speclimits.stats.regimes`);
* 95% cluster-bootstrap intervals on the headline cells (:mod:`speclimits.stats.uncertainty`) and
  the headline SEs clustered by generation and by prompt side by side.

:func:`fit_cost_model` is the public entry point used by the Oracle: it fits the joint model on
every decode round (including K = 0, which gives m = 1) and the draft line, and returns a
:class:`speclimits.costmodel.CostModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from speclimits import paper, vocabulary
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.stats import comparisons as cmp
from speclimits.stats import uncertainty as unc
from speclimits.stats._ols import (CellMoments, CVResult, Design, OLSResults, ResultsMixin, Term, cross_validate,
                                   failed_replicates, fit_ols, group_folds)
from speclimits.stats.boundary import BoundaryResults, detect_boundary
from speclimits.stats.draft import fit_draft_line
from speclimits.stats.factors import select_k
from speclimits.stats.regimes import as_headline, regime_rows
from speclimits.stats.requirements import REQUIREMENTS
from speclimits.trace import FilterReport, Trace, decode_rounds, read_trace

M1_NOTE = ("m = 1 (K = 0, plain decoding): u_bar is constant (= top_k) so alpha(1) is not identified; "
           "convention alpha(1) := alpha(2), beta0(1) := intercept(1) - alpha(1) * top_k")
PER_K_DESIGN = cmp.PER_K_DESIGN

#: The minimum sweep, in words, for ``speclimits fit --help`` and the docs.
MINIMUM_SWEEP = vocabulary.MINIMUM_SWEEP


# ---------------------------------------------------------------------------
# joint categorical model (Eq. 4)
# ---------------------------------------------------------------------------


#: The sparse-cell rule (see :func:`pool_sparse_m`): an m whose decode rounds number fewer than
#: ``MIN_CELL_ROUNDS`` or come from fewer than ``MIN_CELL_GENERATIONS`` generations is pooled.
MIN_CELL_ROUNDS = vocabulary.MIN_CELL_ROUNDS
MIN_CELL_GENERATIONS = vocabulary.MIN_CELL_GENERATIONS


def _m_key(members: Sequence[int]) -> str:
    """The coefficient label of a group of m values: ``"5"`` alone, ``"3,4,5"`` when pooled."""
    return ",".join(str(int(m)) for m in members)


@dataclass(frozen=True)
class MPooling:
    """Which m values the joint model fits together (the sparse-cell rule of :func:`pool_sparse_m`).

    ``groups``: tuples of m values, ascending; a singleton is an m fitted on its own, a longer tuple
    shares one ``beta0`` and one ``alpha``. ``counts``: per m present, ``n_rounds`` and
    ``n_generations``. ``notes``: one line per pooled group (or per m kept below the minimum).
    """

    groups: tuple[tuple[int, ...], ...]
    counts: pd.DataFrame
    notes: tuple[str, ...] = ()
    min_rounds: int = MIN_CELL_ROUNDS
    min_generations: int = MIN_CELL_GENERATIONS

    @property
    def pooled(self) -> dict[str, list[int]]:
        """``{label: members}`` of the groups with more than one m."""
        return {_m_key(g): list(g) for g in self.groups if len(g) > 1}

    def to_dict(self) -> dict[str, Any]:
        return {"min_rounds": self.min_rounds, "min_generations": self.min_generations, "pooled": self.pooled,
                "notes": list(self.notes)}


def pool_sparse_m(mom: CellMoments, min_rounds: int = MIN_CELL_ROUNDS,
                  min_generations: int = MIN_CELL_GENERATIONS) -> MPooling:
    """The sparse-cell rule: which m values the joint model (Eq. 4) fits together.

    An m is *sparse* when it has fewer than ``min_rounds`` decode rounds or rounds from fewer than
    ``min_generations`` generations (the normal shape of an n-gram or draft-model trace: most
    rounds at m = 1, a handful at larger m). Going up from the smallest m >= 2, a sparse m is
    pooled with the next larger m until the group meets both minimums; a sparse group left at the
    top joins the group below it. A pooled group shares one ``beta0`` and one ``alpha`` (written
    for each of its m in the cost model) and is named in the notes. m = 1 is never pooled: Ū is
    constant there (α(1) comes from the convention of :data:`M1_NOTE`). A full sweep (every m with
    enough rounds) is left as it is.
    """
    cells = mom.cells
    ms = sorted(int(v) for v in cells["m"].unique())
    n_rounds = {m: int(mom.n[cells["m"].to_numpy() == m].sum()) for m in ms}
    gens = {m: set(cells.loc[cells["m"] == m, "generation_id"].tolist()) for m in ms}
    counts = pd.DataFrame({"m": ms, "n_rounds": [n_rounds[m] for m in ms],
                           "n_generations": [len(gens[m]) for m in ms]})

    def enough(group: list[int]) -> bool:
        return (sum(n_rounds[m] for m in group) >= min_rounds
                and len(set().union(*(gens[m] for m in group))) >= min_generations)

    groups: list[list[int]] = [[1]] if 1 in ms else []
    first_free = len(groups)
    current: list[int] = []
    for m in (v for v in ms if v >= 2):
        current.append(m)
        if enough(current):
            groups.append(current)
            current = []
    if current:
        if len(groups) > first_free:
            groups[-1] = groups[-1] + current
        else:
            groups.append(current)
    notes = []
    for g in groups:
        n = sum(n_rounds[m] for m in g)
        n_gen = len(set().union(*(gens[m] for m in g)))
        each = ", ".join(f"m = {m}: {n_rounds[m]} rounds / {len(gens[m])} generations" for m in g)
        if len(g) > 1:
            notes.append(f"sparse cells pooled: m = {_m_key(g)} share one beta0 and one alpha ({each}; the minimum "
                         f"per m is {min_rounds} rounds from {min_generations} generations)")
        elif not enough(g):
            notes.append(f"m = {g[0]} has {n} rounds from {n_gen} generations, below the minimum of {min_rounds} "
                         f"rounds from {min_generations} generations, and nothing to pool it with: its "
                         "coefficients rest on these rounds alone")
    return MPooling(tuple(tuple(g) for g in groups), counts, tuple(notes), min_rounds, min_generations)


def _in_group(cells: pd.DataFrame, members: Sequence[int]) -> np.ndarray:
    return np.isin(cells["m"].to_numpy(), list(members))


def _u_identified(mom: CellMoments, members: Sequence[int]) -> bool:
    sel = _in_group(mom.cells, members)
    n = mom.n[sel].sum()
    iu = mom.names.index("u_bar")
    s1, s2 = mom.zz[sel, iu, 0].sum(), mom.zz[sel, iu, iu].sum()
    var = s2 / n - (s1 / n) ** 2
    return bool(var > 1e-10 * max(1.0, (s1 / n) ** 2))


def joint_design(groups: Sequence[Sequence[int]], unidentified: Sequence[Sequence[int]] = ()) -> Design:
    """Eq. 4 on groups of m values: ``beta0[g]`` per group, ``alpha[g]`` where identified, shared ``c``.

    ``g`` is the group's label (:func:`_m_key`: ``"5"`` for an m on its own). A term is active on the
    cells whose m is in its group, so the design applies to any moments (e.g. every K's rounds)."""
    unident = {tuple(int(m) for m in g) for g in unidentified}
    terms = []
    for g in groups:
        members = tuple(int(m) for m in g)
        active = (lambda cells, mm=members: _in_group(cells, mm))
        terms.append(Term(f"beta0[{_m_key(members)}]", "const", None, active))
        if members not in unident:
            terms.append(Term(f"alpha[{_m_key(members)}]", "u_bar", None, active))
    terms.append(Term("c", "context_len"))
    return Design(tuple(terms), "categorical: beta0(m) + alpha(m)·Ū + c·L")


def categorical_design(mom: CellMoments, pooling: MPooling | None = None) -> tuple[Design, list[int]]:
    """Eq. 4 on the m values present: ``beta0[m]`` and ``alpha[m]`` per m (per pooled group of
    :func:`pool_sparse_m` where cells are sparse), shared ``c``.

    Returns the design and the m values whose α is not identified (Ū constant within m).
    """
    groups = (pooling or pool_sparse_m(mom)).groups
    unident = [g for g in groups if not _u_identified(mom, g)]
    return joint_design(groups, unident), [m for g in unident for m in g]


@dataclass(frozen=True)
class JointResults(ResultsMixin):
    """The joint categorical fit: the regression and its per-m coefficient table.

    ``by_m`` has one row per m: ``K``, ``n``, ``beta0``, ``beta0_se``, ``beta0_lower``/``upper``,
    ``alpha`` (...), ``identified`` (False where the m = 1 convention supplied α); the m of a
    pooled group (``pooling``, :func:`pool_sparse_m`) repeat the group's coefficients.
    ``c``/``c_se`` the shared context coefficient; ``top_k`` and ``notes`` record conventions.
    """

    ols: OLSResults
    by_m: pd.DataFrame
    top_k: float | None
    notes: tuple[str, ...] = ()
    design: Design | None = field(default=None, repr=False)
    pooling: MPooling | None = field(default=None, repr=False)

    @property
    def params(self) -> pd.Series:
        return self.ols.params

    @property
    def bse(self) -> pd.Series:
        return self.ols.bse

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        return self.ols.conf_int(alpha)

    @property
    def c(self) -> float:
        return float(self.ols.params["c"])

    def to_frame(self) -> pd.DataFrame:
        return self.by_m

    def to_dict(self) -> dict[str, Any]:
        return {"fit": self.ols.to_dict(), "by_m": self.by_m, "c": self.c, "c_se": float(self.ols.bse["c"]),
                "top_k": self.top_k, "notes": list(self.notes),
                "pooling": None if self.pooling is None else self.pooling.to_dict()}

    def summary(self) -> str:
        return (f"Joint categorical model (Eq. 4), {self.ols.nobs:,} rounds, {self.ols.n_clusters:,} generations\n"
                f"c = {self.c:.4e} ms/token (SE {self.ols.bse['c']:.2e})\n"
                + self.by_m.to_string(float_format=lambda v: f"{v:.5g}") + "".join(f"\nnote: {n}" for n in self.notes))


def _convention(mom: CellMoments, ols: OLSResults, group: tuple[int, ...], donor: tuple[int, ...],
                top_k: float | None, notes: list[str]) -> tuple[float, float, float, float]:
    """α, var α, β0, var β0 at a group of m whose α is unidentified: α := α(donor), β0 = intercept - α·top_k."""
    p, cov = ols.params, ols.cov
    sel = _in_group(mom.cells, group)
    iu = mom.names.index("u_bar")
    u_obs = float(mom.zz[sel, iu, 0].sum() / mom.n[sel].sum())
    tk = float(top_k) if top_k is not None else u_obs
    m, d = _m_key(group), _m_key(donor)
    if top_k is not None and abs(tk - u_obs) > 1e-6:
        notes.append(f"m = {m}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
    a_name, b_name = f"alpha[{d}]", f"beta0[{m}]"
    alpha, alpha_var = p[a_name], cov.loc[a_name, a_name]
    beta0 = p[b_name] - alpha * tk
    beta0_var = cov.loc[b_name, b_name] + tk ** 2 * alpha_var - 2 * tk * cov.loc[b_name, a_name]
    notes.append(f"m = {m}: alpha({m}) := alpha({d}) = {alpha:.4g}, beta0({m}) = intercept({m}) - "
                 f"alpha({m}) * {tk:g} (top_k from {'the trace meta' if top_k is not None else 'the observed constant u_bar'}); "
                 f"u_bar is constant at this m so alpha({m}) is not identified from the data")
    return alpha, alpha_var, beta0, beta0_var


def fit_joint(mom: CellMoments, top_k: float | None = None, pooling: MPooling | None = None) -> JointResults:
    """Fit Eq. 4 jointly on every cell of ``mom``; apply the m = 1 convention where α is unidentified.

    ``top_k`` is the constant Ū of an m = 1 pass (the target's experts per token); when None it is
    taken from the data (the constant Ū observed at that m). Sparse m are pooled by
    :func:`pool_sparse_m` (``pooling``: a rule already decided, e.g. on the full sample).
    """
    pooling = pooling or pool_sparse_m(mom)
    design, unident = categorical_design(mom, pooling)
    ols = fit_ols(mom, design)
    q = sps.t.ppf(0.975, ols.df_t)
    groups = [g for g in pooling.groups if _in_group(mom.cells, g).any()]
    ident = [g for g in groups if g[0] not in unident]
    if not ident:
        raise SpeclimitsError("alpha is not identified at any m (u_bar is constant within every m: the trace "
                              "needs rounds with drafts, K > 0, whose experts vary)")
    notes: list[str] = list(pooling.notes)
    rows = []
    for g in groups:
        key = _m_key(g)
        if g in ident:
            alpha, alpha_var = ols.params[f"alpha[{key}]"], ols.cov.loc[f"alpha[{key}]", f"alpha[{key}]"]
            beta0, beta0_var = ols.params[f"beta0[{key}]"], ols.cov.loc[f"beta0[{key}]", f"beta0[{key}]"]
        else:
            donor = min(ident, key=lambda v: (abs(v[0] - g[0]), v[0]))
            alpha, alpha_var, beta0, beta0_var = _convention(mom, ols, g, donor, top_k, notes)
        b_se, a_se = math.sqrt(max(beta0_var, 0)), math.sqrt(max(alpha_var, 0))
        for m in g:
            sel = mom.cells["m"].to_numpy() == m
            rows.append({"m": m, "K": int(mom.cells.loc[sel, "K"].iloc[0]), "n": int(mom.n[sel].sum()),
                         "beta0": beta0, "beta0_se": b_se, "beta0_lower": beta0 - q * b_se,
                         "beta0_upper": beta0 + q * b_se, "alpha": alpha, "alpha_se": a_se,
                         "alpha_lower": alpha - q * a_se, "alpha_upper": alpha + q * a_se, "identified": g in ident})
    return JointResults(ols, pd.DataFrame(rows), float(top_k) if top_k is not None else None, tuple(notes), design,
                        pooling)


# ---------------------------------------------------------------------------
# per-K fits
# ---------------------------------------------------------------------------


def fit_per_k(mom: CellMoments, n_splits: int = 5, skipped: dict[str, str] | None = None
              ) -> tuple[pd.DataFrame, dict[int, OLSResults], dict[int, CVResult]]:
    """Per-K OLS ``T_T ~ Ū + L`` with clustered SEs and GroupKFold metrics within each K.

    Returns (table with one row per K, fits by K, CV results by K). With ``skipped`` (a dict), a K
    whose fit is not identified is left out and a K with too few generations for the folds gets
    NaN CV columns, each recorded there with the reason, instead of raising.
    """
    rows, fits, cvs = [], {}, {}
    for k in sorted(int(v) for v in mom.cells["K"].unique()):
        sub = mom.where(K=k)
        try:
            fit = fit_ols(sub, PER_K_DESIGN)
        except SpeclimitsError as exc:
            if skipped is None:
                raise
            skipped[f"per-K fit at K = {k}"] = f"{REQUIREMENTS['per_k']} ({exc})"
            continue
        try:
            cv = cross_validate(sub, PER_K_DESIGN, group_folds(sub, n_splits))
        except SpeclimitsError as exc:
            if skipped is None:
                raise
            cv = None
            skipped[f"per-K cross-validation at K = {k}"] = f"{REQUIREMENTS['per_k_cv']} ({exc})"
        fits[k] = fit
        if cv is not None:
            cvs[k] = cv
        ci = fit.conf_int()
        # an EAGLE-style K verifies m = K + 1 rows every round; a K whose drafter sometimes proposes
        # fewer (n-gram) spans several m, and its row stands for the full budget, the largest m
        row = {"K": k, "m": int(sub.cells["m"].max()), "n": fit.nobs, "n_generations": fit.n_clusters}
        for col, name in (("const", "beta0"), ("u_bar", "alpha"), ("context_len", "c")):
            row[name] = fit.params[col]
            row[f"{name}_se"] = fit.bse[col]
            row[f"{name}_lower"] = ci.loc[col, "lower"]
            row[f"{name}_upper"] = ci.loc[col, "upper"]
        for met in ("r2", "rmse", "mape"):
            row[f"cv_{met}"], row[f"cv_{met}_ci"] = cv.mean_ci(met) if cv is not None else (np.nan, np.nan)
        rows.append(row)
    return pd.DataFrame(rows, columns=PER_K_COLUMNS), fits, cvs


#: Columns of the per-K table (:func:`fit_per_k`).
PER_K_COLUMNS = ["K", "m", "n", "n_generations"] + [f"{name}{suffix}" for name in ("beta0", "alpha", "c")
                                                     for suffix in ("", "_se", "_lower", "_upper")] + [
    f"cv_{met}{suffix}" for met in ("r2", "rmse", "mape") for suffix in ("", "_ci")]


# ---------------------------------------------------------------------------
# the whole section
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalModelResults(ResultsMixin):
    """Everything of the final-model section (see the module docstring); tables are DataFrames.

    ``regimes``: the regime-dependent rows at the rule's split (``basis`` "rule") and at the paper's
    m <= 4 | m >= 5 (``basis`` "paper split"), see :func:`speclimits.stats.regimes.regime_rows`.
    ``interpolation`` / ``interpolation_paper``: interpolation vs transfer at those two splits.
    ``smooth``: leave-one-K-out MAPE of the smooth forms in m. ``cluster_se``: the headline SEs
    clustered by generation and by prompt. Columns ending ``_lo``/``_hi`` are 95% cluster-bootstrap
    intervals (``n_boot`` resamples of generations within K); ``intervals`` holds the scalar ones.

    A table the trace cannot give (too few values of K, generations or rounds at some m; see
    :data:`REQUIREMENTS`) is None (``pooled``, ``boundary``, the DataFrames) and named in ``skipped``
    (``{table: why, and what sweep would allow it}``). ``notes``: the sparse-cell pooling and the
    bootstrap replicates that missed a cell (left out of the intervals, counted).
    """

    per_k: pd.DataFrame
    joint: JointResults
    pooled: OLSResults | None
    comparison: pd.DataFrame | None
    pooled_std: pd.DataFrame | None
    mape_by_k: pd.DataFrame | None
    loko: pd.DataFrame | None
    boundary: BoundaryResults | None
    interpolation: pd.DataFrame | None
    interpolation_paper: pd.DataFrame | None
    regimes: pd.DataFrame | None
    ladder: pd.DataFrame | None
    smooth: pd.DataFrame | None
    cluster_se: pd.DataFrame
    intervals: dict[str, tuple[float, float]]
    report: FilterReport
    n_rows: int
    n_generations: int
    n_boot: int
    per_k_fits: dict[int, OLSResults] = field(default_factory=dict, repr=False)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def params(self) -> pd.Series:
        return self.joint.params

    @property
    def bse(self) -> pd.Series:
        return self.joint.bse

    def to_frame(self) -> pd.DataFrame:
        return self.per_k

    def to_dict(self) -> dict[str, Any]:
        comp = self.comparison.attrs if self.comparison is not None else {}
        nan2 = (np.nan, np.nan)
        opt = (lambda v, f=(lambda x: x): None if v is None else f(v))
        return {"filter": self.report.to_dict(), "n_rows": self.n_rows, "n_generations": self.n_generations,
                "n_boot": self.n_boot, "per_k": self.per_k, "joint": self.joint.to_dict(),
                "pooled": opt(self.pooled, lambda v: v.to_dict()), "comparison": self.comparison,
                "pooled_vs_base": {"cv_rmse_reduction": comp.get("pooled_drmse", nan2)[0],
                                   "cv_rmse_reduction_ci": comp.get("pooled_drmse", nan2)[1],
                                   "cv_rmse_reduction_pct": comp.get("pooled_drmse_pct", np.nan),
                                   "mape_ratio_base_over_categorical": comp.get("mape_ratio", np.nan)},
                "pooled_standardized": self.pooled_std, "mape_by_k": self.mape_by_k,
                "leave_one_k_out": self.loko, "boundary": opt(self.boundary, lambda v: v.to_dict()),
                "interpolation": self.interpolation, "interpolation_paper_split": self.interpolation_paper,
                "regimes": self.regimes, "ladder": self.ladder,
                "smooth_forms": opt(self.smooth, lambda v: v.reset_index()),
                "cluster_se": self.cluster_se, "intervals": {k: list(v) for k, v in self.intervals.items()},
                "paper_comparison": self.headline().reset_index(), "skipped": dict(self.skipped),
                "notes": list(self.notes)}

    def headline(self) -> pd.DataFrame:
        """The section's numbers beside the paper's, one row per quantity (numbers; see :func:`headline_table`);
        ``basis`` says which split a regime-dependent row uses."""
        return headline_table(self)

    def skipped_lines(self) -> list[str]:
        """One line per table this trace cannot give: ``"skipped <table>: <why>"``."""
        return [f"skipped {name}: {why}" for name, why in self.skipped.items()]

    def why_missing(self, *tables: str) -> str | None:
        """Why the trace cannot give the tables named (attributes such as ``"loko"``, ``"boundary"``;
        see :data:`MISSING_BECAUSE`), or None when every one of them is there.

        The text is the ``skipped`` entries behind each missing table, ``"<table>: <why, what this
        trace has>"`` joined by ``"; "`` (the book shows it as the page's "cannot show" sentence). A
        partial table (e.g. a smooth form or a per-K fit left out) counts as there; :meth:`skipped_within`
        names what it lacks."""
        reasons: list[str] = []
        for name in tables:
            if name not in MISSING_BECAUSE:
                raise KeyError(f"why_missing: unknown table {name!r} (known: {', '.join(MISSING_BECAUSE)})")
            value = getattr(self, name)
            if value is not None and not (isinstance(value, pd.DataFrame) and value.empty):
                continue
            found: list[str] = []
            for prefix in MISSING_BECAUSE[name]:  # the first prerequisite skipped explains the table
                found = [f"{key}: {why}" for key, why in self.skipped.items() if key.startswith(prefix)]
                if found:
                    break
            if not found:  # not reached: every table left None or empty is recorded in skipped
                found = [f"{name}: not identified on this trace"]
            reasons += [r for r in found if r not in reasons]
        if len(reasons) == 1:  # one reason: its text alone (the name is the table the page names)
            return reasons[0].split(": ", 1)[1]
        return "; ".join(reasons) if reasons else None

    def skipped_within(self, prefix: str) -> str | None:
        """The ``skipped`` entries whose name starts with ``prefix`` (e.g. ``"smooth form"``, ``"ladder
        row"``, ``"per-K fit"``: parts left out of a table that is shown), joined by ``"; "``, or None."""
        found = [f"{key}: {why}" for key, why in self.skipped.items() if key.startswith(prefix)]
        return "; ".join(found) if found else None

    def summary(self) -> str:
        cols = ["K", "m", "alpha", "alpha_se", "beta0", "c", "cv_r2", "cv_mape"]
        fmt4 = (lambda v: f"{v:.4g}")
        parts = [
            f"Final model (Eq. 4): {self.n_rows:,} rounds, {self.n_generations:,} generations",
            "Per-K OLS T_T ~ Ū + L (SE clustered by generation):\n"
            + self.per_k[cols].to_string(index=False, float_format=lambda v: f"{v:.5g}"),
        ]
        if self.boundary is not None:
            parts.append(self.boundary.summary())
        if self.comparison is not None:
            parts.append("Comparison:\n" + self.comparison.to_string(float_format=fmt4))
        if self.ladder is not None:
            parts.append("Specification ladder:\n" + self.ladder.to_string(float_format=fmt4))
        parts.append("Headline (95% intervals):\n"
                     + self.headline()[["basis", "est", "lo", "hi", "est2", "se", "paper", "paper_est"]].to_string(
                         float_format=fmt4, na_rep=""))
        if self.notes:
            parts.append("\n".join(f"note: {n}" for n in self.notes))
        if self.skipped:
            parts.append("\n".join(self.skipped_lines()))
        return "\n\n".join(parts)


#: The ``skipped`` entries (names, or name prefixes) that leave each table of
#: :class:`FinalModelResults` None or empty (:meth:`FinalModelResults.why_missing`), in the order
#: they explain it (a table whose prerequisite was skipped names that prerequisite).
MISSING_BECAUSE: dict[str, tuple[str, ...]] = {
    "per_k": ("per-K fit at K = ",),
    "pooled": ("pooled model (γ·K)",),
    "pooled_std": ("pooled model (γ·K)",),
    "comparison": ("comparison (Ū + L, pooled, categorical)",),
    "mape_by_k": ("MAPE by K",),
    "loko": ("leave-one-K-out",),
    "smooth": ("leave-one-K-out", "smooth form "),
    "boundary": ("regime boundary",),
    "regimes": ("regime rows",),
    "interpolation": ("regime boundary", "regime rows", "interpolation within a regime"),
    "interpolation_paper": ("regime rows", "interpolation within a regime"),
    "ladder": ("cross-validation",),
}


#: Columns of :func:`headline_table` (index: ``quantity``).
HEADLINE_COLUMNS = ["basis", "key", "shape", "est", "lo", "hi", "est2", "lo2", "hi2", "se", "se_prompt", "half",
                    "note", "paper", "paper_est", "paper_se", "paper_est2"]


def _se_prompt(res: FinalModelResults, model: str, term: str, scale: float = 1.0) -> float:
    cs = res.cluster_se
    row = cs[(cs["model"] == model) & (cs["term"] == term)]
    return np.nan if row.empty else float(row["se_prompt"].iloc[0]) * scale


def _pooled_row(res: FinalModelResults, key: str, quantity: str, term: str, scale: float = 1.0) -> dict[str, Any]:
    est, se = paper.POOLED[term]
    row = dict(key=key, quantity=quantity, shape="se", paper_est=est * scale, paper_se=se * scale)
    if res.pooled is not None:
        row.update(est=res.pooled.params[term] * scale, se=res.pooled.bse[term] * scale,
                   se_prompt=_se_prompt(res, "pooled", term, scale))
    return row


def headline_table(res: FinalModelResults) -> pd.DataFrame:
    """See :meth:`FinalModelResults.headline`: numbers only (the book's view writes the cells).

    Index ``quantity`` (in the quantity's unit, e.g. 1e-3 ms/token for c); columns
    :data:`HEADLINE_COLUMNS`: ``basis`` (the split a regime-dependent row uses, else "—"), ``key`` (a
    stable id), ``shape`` (how the numbers read):

    * ``split``: ``est`` the rule's last small m (NaN: no split), ``note`` its reason, ``paper_est`` the paper's;
    * ``range``: ``est``–``est2`` (min–max), ``lo``/``hi`` the interval of the minimum, ``lo2``/``hi2``
      of the maximum;
    * ``value``: ``est`` with ``lo``/``hi``;
    * ``se``: ``est`` (``se``), and ``se_prompt`` the SE clustered by prompt; the paper's ``paper_est`` (``paper_se``);
    * ``pair``: two numbers ``est`` and ``est2``, each with its interval (``lo``/``hi``, ``lo2``/``hi2``);
    * ``reduction``: ``est`` ms (``est2`` %), ``half`` the t half-width over folds.

    ``note``: text that stands in for an interval; ``paper``: the paper's text (from :mod:`speclimits.paper`),
    else its numbers ``paper_est``, ``paper_se``, ``paper_est2``. Intervals are 95% (cluster bootstrap unless
    the note says otherwise).
    """
    pk, b, iv = res.per_k, res.boundary, res.intervals
    mk, comp, lad = res.mape_by_k, res.comparison, res.ladder
    attrs = comp.attrs if comp is not None else {}
    d, dh = attrs.get("pooled_drmse", (np.nan, np.nan))
    big = mk[mk["K"] >= 5] if mk is not None else pd.DataFrame({"pooled": []})
    nan2 = (np.nan, np.nan)

    def at_k(k: int) -> tuple[float, float, float]:
        row = mk.loc[mk["K"] == k] if mk is not None else pd.DataFrame()
        cols = ("pooled", "pooled_lo", "pooled_hi")
        return (np.nan,) * 3 if row.empty else tuple(float(row[c].iloc[0]) for c in cols)

    def ladder(spec: str, col: str) -> tuple[float, float, float]:
        if lad is None or spec not in lad.index or f"{col}_lo" not in lad.columns:
            return (np.nan,) * 3
        return lad.loc[spec, col], lad.loc[spec, f"{col}_lo"], lad.loc[spec, f"{col}_hi"]

    def pair(key: str, quantity: str, first: tuple, second: tuple, **kw) -> dict[str, Any]:
        return dict(key=key, quantity=quantity, shape="pair", est=first[0], lo=first[1], hi=first[2],
                    est2=second[0], lo2=second[1], hi2=second[2], **kw)

    def rng(key: str, quantity: str, values: pd.Series, lo_hi=None, lo_hi2=None, scale: float = 1.0,
            **kw) -> dict[str, Any]:
        row = dict(key=key, quantity=quantity, shape="range", **kw)
        if len(values):
            row.update(est=float(values.min()) * scale, est2=float(values.max()) * scale)
        if lo_hi is not None:
            row.update(lo=lo_hi[0], hi=lo_hi[1], lo2=lo_hi2[0], hi2=lo_hi2[1])
        return row

    rows: list[dict[str, Any]] = [
        dict(key="boundary", quantity="regime boundary (last m of the small regime)", basis="rule", shape="split",
             est=np.nan if b is None or b.split is None else float(b.split),
             note=b.reason if b is not None else f"skipped: {res.skipped.get('regime boundary', '')}",
             paper_est=float(paper.BOUNDARY_M)),
    ]
    if res.regimes is not None:
        rows += as_headline(res.regimes).to_dict("records")
    rows += [
        rng("c_per_k", "c across per-K fits (1e-3 ms/token)", pk["c"], iv["c_min"], iv["c_max"], scale=1e3,
            paper=paper.fmt_range(paper.C_RANGE, 1e3)),
        dict(key="c_joint", quantity="c, joint categorical (1e-3 ms/token)", shape="se", est=res.joint.c * 1e3,
             se=res.joint.bse["c"] * 1e3, se_prompt=_se_prompt(res, "categorical (Eq. 4)", "c", 1e3), paper="—"),
        _pooled_row(res, "pooled_u_bar", "pooled α (SE)", "u_bar"),
        _pooled_row(res, "pooled_context_len", "pooled c (SE), 1e-3", "context_len", 1e3),
        _pooled_row(res, "pooled_K", "pooled γ per K (SE)", "K"),
        _pooled_row(res, "pooled_const", "pooled β0 (SE)", "const"),
        pair("r2_ladder", "R²: Ū + L → + γK", ladder("Ū + L", "r2"), ladder("+ linear m", "r2"),
             paper_est=paper.POOLED_R2[0], paper_est2=paper.POOLED_R2[1]),
        dict(key="cv_rmse_reduction", quantity="CV RMSE reduction by γK (ms)", shape="reduction", est=d,
             est2=attrs.get("pooled_drmse_pct", np.nan), half=dh, note="t over folds", paper=paper.POOLED_DRMSE),
        dict(key="mape_ratio", quantity="CV MAPE ratio, Ū + L over categorical", shape="value",
             est=attrs.get("mape_ratio", np.nan), lo=iv.get("mape_ratio", nan2)[0], hi=iv.get("mape_ratio", nan2)[1],
             paper_est=paper.CATEGORICAL_MAPE_RATIO),
        rng("pooled_mape_k5", "pooled CV MAPE at K ≥ 5 (%)", big["pooled"], iv["pooled_mape_k5_min"],
            iv["pooled_mape_k5_max"], paper=paper.fmt_range(paper.POOLED_MAPE_LARGE, digits=1)),
        pair("pooled_mape_k1_k3", "pooled CV MAPE at K = 1 / K = 3 (%)", at_k(1), at_k(3),
             paper_est=paper.POOLED_MAPE_BY_K[1], paper_est2=paper.POOLED_MAPE_BY_K[3]),
        dict(key="loko_mean", quantity="leave-one-K-out MAPE, mean (%)", shape="value",
             est=res.loko["loko_mape"].mean() if res.loko is not None else np.nan,
             lo=iv.get("loko_mean", nan2)[0], hi=iv.get("loko_mean", nan2)[1], paper_est=paper.LOKO_MEAN),
        rng("loko_smooth", "leave-one-K-out MAPE, other smooth forms in m (%)",
            pd.Series(dtype=float) if res.smooth is None else
            res.smooth.loc[res.smooth.index != cmp.POOLED_LOKO_FORM, "loko_mape_mean"],
            note="per form in the smooth-forms table",
            paper=paper.fmt_range(paper.SMOOTH_PARAMETERIZATIONS_MAPE, digits=1)),
        rng("within_k_mape", "within-K CV MAPE (%)", pk["cv_mape"], note="t over folds per K",
            paper=paper.fmt_range(paper.WITHIN_K_MAPE, digits=2)),
        pair("categorical", "categorical CV MAPE (%) / R²", ladder("categorical (Eq. 4)", "cv_mape"),
             ladder("categorical (Eq. 4)", "r2"), paper=" / ".join(paper.LADDER["categorical (Eq. 4)"])),
    ]
    out = pd.DataFrame(rows, columns=["quantity", *HEADLINE_COLUMNS])
    out["basis"] = out["basis"].fillna("—")
    return out.set_index("quantity")


# -- steps of fit_final_model ------------------------------------------------


def _per_k_replicates(mom: CellMoments, per_k: pd.DataFrame, weights: np.ndarray,
                      failed: dict[str, int] | None = None) -> dict[str, pd.DataFrame]:
    """(B, nK) bootstrap replicates of the per-K α, β0 and c (columns: m, in per_k's order); the
    replicates of a K that could not be solved are NaN and counted in ``failed``."""
    reps = unc.coefficient_replicates(mom, PER_K_DESIGN, weights, [("K", int(k)) for k in per_k["K"]])
    if failed is not None:
        for k, rep in reps.items():
            n_bad = failed_replicates(rep.to_numpy())
            if n_bad:
                failed[f"per-K fit at K = {k}"] = n_bad
    out = {}
    for name, col in (("alpha", "u_bar"), ("beta0", "const"), ("c", "context_len")):
        out[name] = pd.DataFrame({int(m): reps[int(k)][col].to_numpy() for k, m in zip(per_k["K"], per_k["m"])})
    return out


def _metric_intervals(mom: CellMoments, folds: np.ndarray, weights: np.ndarray, ladder: pd.DataFrame,
                      fitted: dict[str, tuple[Design, CVResult]], failed: dict[str, int] | None = None) -> pd.DataFrame:
    """The ladder with 95% bootstrap intervals: ``r2_lo/hi`` (refitted), ``cv_mape_lo/hi`` (held-out
    errors resampled, fold fits fixed). Replicates whose refit cannot be solved (a resample that
    missed every generation of a cell) are left out of the R² interval and counted in ``failed``."""
    out = ladder.copy()
    for spec, (design, cv) in fitted.items():
        r2 = unc.r2_replicates(mom, design, weights)
        if failed is not None and (~np.isfinite(r2)).any():
            failed[f"ladder: {spec}"] = int((~np.isfinite(r2)).sum())
        out.loc[spec, ["r2_lo", "r2_hi"]] = unc.interval(r2)
        out.loc[spec, ["cv_mape_lo", "cv_mape_hi"]] = unc.interval(
            unc.fold_mape_replicates(mom, cv.oof, folds, weights))
    return out


def _by_k_intervals(mom: CellMoments, preds: dict[str, np.ndarray], weights: np.ndarray,
                    ks: Sequence[int]) -> dict[str, np.ndarray]:
    """(B, nK) replicates of the MAPE by K of each prediction array (held-out rows resampled)."""
    row_k = mom.row_attr("K")
    out = {}
    for name, pred in preds.items():
        cols = [unc.mape_replicates(weights, *unc.ape_sums(mom, pred, row_k == k)) for k in ks]
        out[name] = np.column_stack(cols)
    return out


def _regimes(mom: CellMoments, per_k: pd.DataFrame, fits: dict[int, OLSResults], reps: dict[str, pd.DataFrame],
             split: int | None, rule: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """Regime rows and interpolation tables at the rule's split (``rule`` False: the rule was
    skipped, no rows and no table for it) and at the paper's."""
    interp = cmp.interpolation_table(mom, fits, split) if rule else None
    interp_paper = cmp.interpolation_table(mom, fits, paper.BOUNDARY_M)
    rule_label = "rule: no regime" if split is None else f"rule: m ≤ {split} | m > {split}"
    parts = [regime_rows(per_k, reps["alpha"], reps["beta0"], interp, split, rule_label)] if rule else []
    parts.append(regime_rows(per_k, reps["alpha"], reps["beta0"], interp_paper, paper.BOUNDARY_M,
                             f"paper split m ≤ {paper.BOUNDARY_M} | m ≥ {paper.BOUNDARY_M + 1}"))
    return pd.concat(parts, ignore_index=True), interp, interp_paper


def _missing(requirement: str, folds, pooled, cvs: dict[str, Any]) -> str:
    """``requirement``, and which of its inputs this trace lacks (each named above in ``skipped``)."""
    lacking = [name for name, ok in (("the folds", folds is not None), ("the pooled model", pooled is not None),
                                     ("the cross-validation of Ū + L", cvs.get("base") is not None),
                                     ("the categorical model's cross-validation", cvs.get("categorical") is not None))
               if not ok]
    return f"{requirement}; here it lacks {', '.join(lacking)} (skipped above)" if lacking else requirement


class _Skips:
    """Collects the tables a trace cannot give: ``skipped[name] = why (what would allow it)``."""

    def __init__(self, have: str):
        self.have = have
        self.skipped: dict[str, str] = {}

    def need(self, name: str, ok: bool, requirement: str) -> bool:
        if not ok:
            self.skipped[name] = f"{requirement} (this trace: {self.have})"
        return ok

    def run(self, name: str, fn, requirement: str):
        """``fn()``, or None with ``name`` skipped when it raises a :class:`SpeclimitsError`."""
        try:
            return fn()
        except SpeclimitsError as exc:
            self.skipped[name] = f"{requirement} (this trace: {self.have}; {exc})"
            return None


def fit_final_model(rounds: pd.DataFrame, k_values: Sequence[int] | None = None, n_splits: int = 5,
                    n_boot: int = 999, seed: int = 0) -> FinalModelResults:
    """Fit the final model and its comparisons on the decode rounds with K in ``k_values`` (default K >= 1).

    ``n_boot`` cluster-bootstrap resamples (generations within K, ``seed``) give the 95% intervals.
    Each comparison table is computed only where the trace identifies it (:data:`REQUIREMENTS`);
    the others are None and named in ``skipped``. Raises :class:`SpeclimitsError` only when there
    is no section at all: no decode rounds with K >= 1, or no m at which α is identified.
    """
    dec, report = decode_rounds(rounds, timing="target")
    mom = CellMoments.from_rounds(select_k(dec, k_values))
    ks = [int(k) for k in sorted(mom.cells["K"].unique())]
    sk = _Skips(f"K = {', '.join(map(str, ks))}; {mom.n_clusters} generations")
    per_k, fits, _ = fit_per_k(mom, n_splits, sk.skipped)
    joint = fit_joint(mom)
    notes: list[str] = []  # the pooling of sparse m is in joint.notes
    nk = len(ks)
    folds = sk.run("cross-validation", lambda: group_folds(mom, n_splits), REQUIREMENTS["cross_validation"])
    cvs: dict[str, CVResult | None] = {"base": None, "pooled": None, "categorical": None}
    pooled = None
    if sk.need("pooled model (γ·K)", nk >= 2, REQUIREMENTS["pooled"]):
        pooled = sk.run("pooled model (γ·K)", lambda: fit_ols(mom, cmp.POOLED_DESIGN), REQUIREMENTS["pooled"])
    if folds is not None:
        cvs["base"] = sk.run("cross-validation of Ū + L", lambda: cross_validate(mom, cmp.BASE_DESIGN, folds),
                             REQUIREMENTS["cross_validation"])
        if pooled is not None:
            cvs["pooled"] = sk.run("cross-validation of the pooled model",
                                   lambda: cross_validate(mom, cmp.POOLED_DESIGN, folds), REQUIREMENTS["pooled"])
        cvs["categorical"] = sk.run("cross-validation of the categorical model",
                                    lambda: cross_validate(mom, joint.design, folds), REQUIREMENTS["categorical_cv"])
    weights = unc.stratified_counts(mom, n_boot, seed)
    failed: dict[str, int] = {}

    ladder = None
    fitted: dict[str, tuple[Design, CVResult]] = {}
    if folds is not None:
        ladder, fitted = cmp.ladder_table(mom, folds, joint.ols, cvs["categorical"], sk.skipped)
        if cvs["categorical"] is not None:
            fitted["categorical (Eq. 4)"] = (joint.design, cvs["categorical"])
        ladder = _metric_intervals(mom, folds, weights, ladder, fitted, failed)
    comparison = None
    if (sk.need("comparison (Ū + L, pooled, categorical)", None not in cvs.values() and pooled is not None,
                _missing(REQUIREMENTS["comparison"], folds, pooled, cvs))):
        comparison = cmp.comparison_table(mom, joint.ols, cvs)

    loko_pred = None
    if sk.need("leave-one-K-out", nk >= 3, REQUIREMENTS["leave_one_k_out"]):
        loko_pred = sk.run("leave-one-K-out", lambda: cmp.loko_predictions(mom, cmp.POOLED_DESIGN),
                           REQUIREMENTS["leave_one_k_out"])
    smooth, smooth_preds = cmp.smooth_table(mom, loko_pred, sk.skipped, sk.have)
    preds = {**({"pooled": cvs["pooled"].oof} if cvs["pooled"] is not None else {}),
             **({"categorical": cvs["categorical"].oof} if cvs["categorical"] is not None else {}),
             **({"loko": loko_pred} if loko_pred is not None else {}),
             **{f"smooth:{n}": p for n, p in smooth_preds.items()}}
    by_k = _by_k_intervals(mom, preds, weights, ks)
    mape_by_k = None
    if sk.need("MAPE by K", cvs["pooled"] is not None and cvs["categorical"] is not None,
               _missing(REQUIREMENTS["mape_by_k"], folds, pooled, cvs)):
        mape_by_k = cmp.mape_by_k(mom, {"pooled": cvs["pooled"].oof, "categorical": cvs["categorical"].oof}, per_k)
        for name in ("pooled", "categorical"):
            mape_by_k[f"{name}_lo"], mape_by_k[f"{name}_hi"] = np.array([unc.interval(c) for c in by_k[name].T]).T
    loko = None
    if loko_pred is not None:
        loko = cmp.loko_table(mom, loko_pred, per_k)
        loko["loko_lo"], loko["loko_hi"] = np.array([unc.interval(c) for c in by_k["loko"].T]).T
    if smooth is not None:
        smooth[["loko_mape_mean_lo", "loko_mape_mean_hi"]] = [unc.interval(by_k[f"smooth:{n}"].mean(1))
                                                              for n in smooth.index]

    boundary = None
    if sk.need("regime boundary", mom.cells["m"].nunique() >= 2 and folds is not None, REQUIREMENTS["boundary"]):
        boundary = sk.run("regime boundary", lambda: detect_boundary(mom, n_splits), REQUIREMENTS["boundary"])
    regimes = interp = interp_paper = None
    reps = {name: pd.DataFrame(index=range(n_boot)) for name in ("alpha", "beta0", "c")}
    if sk.need("regime rows", len(per_k) > 0, REQUIREMENTS["regimes"]):
        reps = _per_k_replicates(mom, per_k, weights, failed)
        regimes, interp, interp_paper = _regimes(mom, per_k, fits, reps, None if boundary is None else boundary.split,
                                                 rule=boundary is not None)
        if not (interp_paper["scheme"] == "interpolate").any():
            sk.need("interpolation within a regime", False, REQUIREMENTS["interpolation"])
    big = np.array(ks) >= 5
    nan2 = (np.nan, np.nan)
    c_reps = reps["c"].to_numpy() * 1e3
    intervals = {
        "c_min": unc.interval(c_reps.min(axis=1)) if c_reps.shape[1] else nan2,
        "c_max": unc.interval(c_reps.max(axis=1)) if c_reps.shape[1] else nan2,
        "loko_mean": unc.interval(by_k["loko"].mean(1)) if "loko" in by_k else nan2,
        "mape_ratio": _mape_ratio_interval(mom, folds, weights, fitted)
        if folds is not None and {"Ū + L", "categorical (Eq. 4)"} <= set(fitted) else nan2,
        "pooled_mape_k5_min": unc.interval(by_k["pooled"][:, big].min(1)) if big.any() and "pooled" in by_k else nan2,
        "pooled_mape_k5_max": unc.interval(by_k["pooled"][:, big].max(1)) if big.any() and "pooled" in by_k else nan2}
    cluster_se = cmp.cluster_sensitivity(mom, [("categorical (Eq. 4)", joint.design, joint.ols)]
                                         + ([("pooled", cmp.POOLED_DESIGN, pooled)] if pooled is not None else []))
    for what, n_bad in failed.items():
        notes.append(f"cluster bootstrap ({what}): {n_bad} of {n_boot} resamples missed every generation of a cell "
                     "the fit needs; they are left out of its intervals")
    return FinalModelResults(per_k, joint, pooled, comparison,
                             cmp.pooled_standardized(pooled) if pooled is not None else None, mape_by_k, loko,
                             boundary, interp, interp_paper, regimes, ladder, smooth, cluster_se, intervals, report,
                             mom.n_rows, mom.n_clusters, n_boot, fits, sk.skipped, tuple(notes))


def _mape_ratio_interval(mom: CellMoments, folds: np.ndarray, weights: np.ndarray,
                         fitted: dict[str, tuple[Design, CVResult]]) -> tuple[float, float]:
    """95% interval of CV MAPE(Ū + L) / CV MAPE(categorical), both from the same resamples."""
    base = unc.fold_mape_replicates(mom, fitted["Ū + L"][1].oof, folds, weights)
    cat = unc.fold_mape_replicates(mom, fitted["categorical (Eq. 4)"][1].oof, folds, weights)
    return unc.interval(base / cat)




def fit_cost_model(rounds: pd.DataFrame, top_k: int | None = None, source: str = "") -> CostModel:
    """Fit the cost model (the JSON of :mod:`speclimits.costmodel`) on a trace's ``rounds`` table.

    Target: the joint categorical model (free ``beta0(m)``, ``alpha(m)``, shared ``c``) on every
    decode round with a non-zero target time, K = 0 included (it gives m = 1; see :data:`M1_NOTE`
    for the convention; pass ``top_k`` from ``meta["models"]["target"]["top_k"]``, else the constant
    Ū observed at m = 1 is used). Draft: ``T_D = a·K + b`` on decode rounds with K >= 1 and a
    non-zero draft time. Standard errors, row counts and conventions are recorded in ``extra``
    (written to the JSON under ``"fit"``).
    """
    dec, report = decode_rounds(rounds, timing="target")
    joint = fit_joint(CellMoments.from_rounds(dec, base=("u_bar", "context_len")), top_k=top_k)
    draft_note = None
    try:
        draft = fit_draft_line(rounds)
        a, b = float(draft.params["K"]), float(draft.params["const"])
        draft_fit = {"n_rounds": draft.nobs, "n_generations": draft.n_clusters, "r2": draft.rsquared,
                     "a_se": float(draft.bse["K"]), "b_se": float(draft.bse["const"])}
    except SpeclimitsError as exc:
        a, b, draft_fit, draft_note = _draft_through_origin(rounds, exc)
    by_m = joint.by_m.set_index("m")
    beta0 = {int(m): float(r.beta0) for m, r in by_m.iterrows()}
    alpha = {int(m): float(r.alpha) for m, r in by_m.iterrows()}
    beta0, alpha, filled = fill_missing_m(beta0, alpha)
    extra = {"fit": {
        "target": {"n_rounds": joint.ols.nobs, "n_generations": joint.ols.n_clusters, "r2": joint.ols.rsquared,
                   "c_se": float(joint.ols.bse["c"]), "filter": report.to_dict(),
                   "se_by_m": {str(m): {"beta0": float(r.beta0_se), "alpha": float(r.alpha_se)}
                               for m, r in by_m.iterrows()},
                   "alpha_identified": {str(m): bool(r.identified) for m, r in by_m.iterrows()},
                   "top_k": joint.top_k},
        "draft": draft_fit,
        "notes": list(joint.notes) + ["standard errors clustered by generation (statsmodels' correction)"],
    }}
    if draft_note is not None:
        extra["fit"]["notes"].append(draft_note)
    if joint.pooling is not None and joint.pooling.pooled:
        extra["fit"]["target"]["pooled_m"] = joint.pooling.pooled
    if filled:
        extra["fit"]["target"]["interpolated_m"] = filled
        extra["fit"]["notes"].append(
            f"m = {', '.join(map(str, filled))} not in the trace: beta0 and alpha interpolated linearly in m between "
            "the nearest m present on either side (no standard errors)")
    return CostModel(c=joint.c, beta0=beta0, alpha=alpha, a=a, b=b,
                     source=source or "speclimits fit: joint categorical target model + draft line", extra=extra)


def _draft_through_origin(rounds: pd.DataFrame, exc: Exception) -> tuple[float, float, dict[str, Any], str]:
    """The draft line when it is not identified because the trace has a single K > 0 (its slope and
    intercept are collinear): the line through the origin, ``a = mean T_D / K``, ``b = 0``. Raises
    when there are no draft timings at all."""
    dec, _ = decode_rounds(rounds, timing="draft")
    ks = sorted(int(k) for k in dec["K"].unique())
    if len(ks) != 1:
        raise SpeclimitsError(f"the draft line T_D = a·K + b cannot be fitted: {REQUIREMENTS['draft']} ({exc})")
    k = ks[0]
    mean = float(dec["t_draft_ms"].mean())
    note = (f"draft line: one value of K > 0 (K = {k}), so a and b are not both identified; convention b := 0, "
            f"a := mean T_D / K = {mean:.4g} / {k} (a sweep with >= 2 values of K > 0 fits both)")
    return mean / k, 0.0, {"n_rounds": int(len(dec)), "n_generations": int(dec["generation_id"].nunique()),
                           "convention": "through the origin (single K)"}, note


def fill_missing_m(beta0: dict[int, float], alpha: dict[int, float]
                   ) -> tuple[dict[int, float], dict[int, float], list[int]]:
    """Every m between the smallest and the largest present, the missing ones (a K grid with gaps,
    e.g. K = 0, 2, 4: m = 2 and 4 absent) interpolated linearly in m from the nearest present m on
    either side, so that the Oracle can price every draft length up to the largest. Returns the
    completed ``beta0``, ``alpha`` and the interpolated m values (ascending)."""
    ms = sorted(beta0)
    filled = [m for m in range(ms[0], ms[-1] + 1) if m not in beta0]
    if not filled:
        return beta0, alpha, []
    b, a = dict(beta0), dict(alpha)
    for m in filled:
        lo, hi = max(v for v in ms if v < m), min(v for v in ms if v > m)
        w = (m - lo) / (hi - lo)
        b[m] = (1 - w) * beta0[lo] + w * beta0[hi]
        a[m] = (1 - w) * alpha[lo] + w * alpha[hi]
    return dict(sorted(b.items())), dict(sorted(a.items())), filled


def fit_trace_cost_model(trace: Trace | str | Path) -> CostModel:
    """The cost model of a trace: the one route from a trace to a cost-model JSON.

    :func:`fit_cost_model` on the trace's ``rounds`` with the target's ``top_k`` from
    ``meta.json``. ``speclimits fit --out``, the book's section 3 and the Oracle's default (no
    cost model given) all call this, so they write and solve with the same bytes. The recorded
    ``source`` names the trace by its directory name and its source label, not by the path it
    was opened with, so the JSON does not depend on the working directory or the machine.
    """
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    return fit_cost_model(tr.rounds, top_k=tr.top_k,
                          source=f"speclimits fit on trace {tr.path.resolve().name} ({tr.source_label})")
