"""The one cost-model fit: the joint categorical target model (Eq. 4) and the draft line, on cell moments.

:func:`fit_costs` fits a trace's decode rounds (:class:`CostMoments`) with each generation weighted:
unweighted, the full sample with SEs clustered by generation (:func:`fit_cost_model`); with (B, G)
draw counts, B cluster-bootstrap replicates (the Oracle's), each under the same design rules decided
on the replicate's own sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from speclimits import vocabulary
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.stats._ols import CellMoments, Design, OLSResults, Term, cross_products, fit_ols, solve_normal
from speclimits.stats.draft import DRAFT_DESIGN
from speclimits.stats.requirements import REQUIREMENTS
from speclimits.trace import FilterReport, Trace, decode_rounds, read_trace

TARGET_BASE = ("u_bar", "context_len")


def _m_key(members: Sequence[int]) -> str:
    """The coefficient label of a group of m values: ``"5"`` alone, ``"3,4,5"`` when pooled."""
    return ",".join(str(int(m)) for m in members)


@dataclass(frozen=True)
class MPooling:
    """Which m values the joint model fits together (:func:`pool_sparse_m`): ``groups`` of m, ascending (a
    longer tuple shares one ``beta0`` and one ``alpha``); ``notes``: one line per pooled or too-thin group."""

    groups: tuple[tuple[int, ...], ...]
    notes: tuple[str, ...] = ()
    min_rounds: int = vocabulary.MIN_CELL_ROUNDS
    min_generations: int = vocabulary.MIN_CELL_GENERATIONS

    @property
    def pooled(self) -> dict[str, list[int]]:
        return {_m_key(g): list(g) for g in self.groups if len(g) > 1}

    def to_dict(self) -> dict[str, Any]:
        return {"min_rounds": self.min_rounds, "min_generations": self.min_generations, "pooled": self.pooled,
                "notes": list(self.notes)}


def pool_sparse_m(mom: CellMoments, min_rounds: int = vocabulary.MIN_CELL_ROUNDS,
                  min_generations: int = vocabulary.MIN_CELL_GENERATIONS) -> MPooling:
    """The sparse-cell rule: an m with fewer than ``min_rounds`` decode rounds or ``min_generations``
    generations (an n-gram trace: a handful of rounds at m > 1) is pooled, going up from m = 2, with the
    next larger m until the group meets both; a sparse group left at the top joins the one below.
    m = 1 is never pooled (Ū is constant there: :func:`fit_joint`'s convention)."""
    cells = mom.cells
    ms = sorted(int(v) for v in cells["m"].unique())
    n_rounds = {m: int(mom.n[cells["m"].to_numpy() == m].sum()) for m in ms}
    gens = {m: set(cells.loc[cells["m"] == m, "generation_id"].tolist()) for m in ms}

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
    return MPooling(tuple(tuple(g) for g in groups), tuple(notes), min_rounds, min_generations)


def _in_group(cells: pd.DataFrame, members: Sequence[int]) -> np.ndarray:
    return np.isin(cells["m"].to_numpy(), list(members))


def _u_sums(mom: CellMoments, members: Sequence[int]) -> tuple[float, float, float]:
    """Rows, ΣŪ and ΣŪ² of the cells of a group of m."""
    sel, iu = _in_group(mom.cells, members), mom.names.index("u_bar")
    return mom.n[sel].sum(), mom.zz[sel, iu, 0].sum(), mom.zz[sel, iu, iu].sum()


def _identified(n, s1, s2):
    """Whether α is identified from rows ``n``, ΣŪ ``s1``, ΣŪ² ``s2`` (arrays or scalars): Ū's variance
    above 1e-10 of max(1, mean²). Where not (Ū constant, as at m = 1), :func:`alpha_donor` supplies α."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n
        return s2 / n - mean ** 2 > 1e-10 * np.maximum(1.0, mean ** 2)


def alpha_donor(group: tuple[int, ...], ident: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The identified group whose α an unidentified one takes: the nearest in m (the smaller on a tie)."""
    return min(ident, key=lambda v: (abs(v[0] - group[0]), v[0]))


def joint_design(groups: Sequence[Sequence[int]], unidentified: Sequence[Sequence[int]] = ()) -> Design:
    """Eq. 4 on groups of m: ``beta0[g]`` per group, ``alpha[g]`` where identified, shared ``c``; a term is
    active on the cells whose m is in its group (``g``: :func:`_m_key`)."""
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


@dataclass(frozen=True)
class JointResults:
    """The joint categorical fit: ``by_m`` one row per m (``K``, ``n``, ``beta0``/``alpha`` with ``_se``,
    ``_lower``, ``_upper``; ``identified`` False where the m = 1 convention supplied α; a pooled group's
    m repeat its coefficients); ``top_k`` and ``notes`` record the conventions."""

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

    def to_dict(self) -> dict[str, Any]:
        return {"fit": self.ols.to_dict(), "by_m": self.by_m, "c": self.c, "c_se": float(self.ols.bse["c"]),
                "top_k": self.top_k, "notes": list(self.notes),
                "pooling": None if self.pooling is None else self.pooling.to_dict()}

    def summary(self) -> str:
        return (f"Joint categorical model (Eq. 4), {self.ols.nobs:,} rounds, {self.ols.n_clusters:,} generations\n"
                f"c = {self.c:.4e} ms/token (SE {self.ols.bse['c']:.2e})\n"
                + self.by_m.to_string(float_format=lambda v: f"{v:.5g}") + "".join(f"\nnote: {n}" for n in self.notes))


def m1_convention(p: pd.Series, cov: pd.DataFrame, b_name: str, a_name: str, tk: float
                  ) -> tuple[float, float, float, float]:
    """The m = 1 convention where α is not identified (Ū constant = top_k): α := the nearest identified
    m's (``a_name``), β0 := intercept ``b_name`` - α·tk. Returns α, var α, β0, var β0."""
    alpha, alpha_var = p[a_name], cov.loc[a_name, a_name]
    return (alpha, alpha_var, p[b_name] - alpha * tk,
            cov.loc[b_name, b_name] + tk ** 2 * alpha_var - 2 * tk * cov.loc[b_name, a_name])


def fit_joint(mom: CellMoments, top_k: float | None = None, pooling: MPooling | None = None) -> JointResults:
    """Fit Eq. 4 jointly on every cell of ``mom``, the m = 1 convention where α is unidentified.

    ``top_k``: the constant Ū of an m = 1 pass (None: the constant Ū observed). ``pooling``: a sparse-m
    rule already decided (default :func:`pool_sparse_m` on ``mom``).
    """
    pooling = pooling or pool_sparse_m(mom)
    unident = [g for g in pooling.groups if not _identified(*_u_sums(mom, g))]
    design = joint_design(pooling.groups, unident)
    ols = fit_ols(mom, design)
    q = sps.t.ppf(0.975, ols.df_t)
    groups = [g for g in pooling.groups if _in_group(mom.cells, g).any()]
    ident = [g for g in groups if g not in unident]
    if not ident:
        raise SpeclimitsError("alpha is not identified at any m (u_bar is constant within every m: the trace "
                              "needs rounds with drafts, K > 0, whose experts vary)")
    notes: list[str] = list(pooling.notes)
    rows = []
    for g in groups:
        key = _m_key(g)
        a_name, b_name = f"alpha[{key}]", f"beta0[{key}]"
        if g in ident:
            alpha, alpha_var = ols.params[a_name], ols.cov.loc[a_name, a_name]
            beta0, beta0_var = ols.params[b_name], ols.cov.loc[b_name, b_name]
        else:  # the m = 1 convention (m1_convention)
            d, (n, s1, _) = _m_key(alpha_donor(g, ident)), _u_sums(mom, g)
            u_obs = float(s1 / n)
            tk = float(top_k) if top_k is not None else u_obs
            if top_k is not None and abs(tk - u_obs) > 1e-6:
                notes.append(f"m = {key}: top_k = {tk:g} differs from the observed constant u_bar = {u_obs:g}")
            alpha, alpha_var, beta0, beta0_var = m1_convention(ols.params, ols.cov, b_name, f"alpha[{d}]", tk)
            notes.append(f"m = {key}: alpha({key}) := alpha({d}) = {alpha:.4g}, beta0({key}) = intercept({key}) - "
                         f"alpha({key}) * {tk:g} (top_k from "
                         f"{'the trace meta' if top_k is not None else 'the observed constant u_bar'}); "
                         f"u_bar is constant at this m so alpha({key}) is not identified from the data")
        b_se, a_se = math.sqrt(max(beta0_var, 0)), math.sqrt(max(alpha_var, 0))
        for m in g:
            sel = mom.cells["m"].to_numpy() == m
            rows.append({"m": m, "K": int(mom.cells.loc[sel, "K"].iloc[0]), "n": int(mom.n[sel].sum()),
                         "beta0": beta0, "beta0_se": b_se, "beta0_lower": beta0 - q * b_se,
                         "beta0_upper": beta0 + q * b_se, "alpha": alpha, "alpha_se": a_se,
                         "alpha_lower": alpha - q * a_se, "alpha_upper": alpha + q * a_se, "identified": g in ident})
    return JointResults(ols, pd.DataFrame(rows), float(top_k) if top_k is not None else None, tuple(notes), design,
                        pooling)


@dataclass(frozen=True, eq=False)
class CostMoments:
    """A trace's rounds as the cost-model fit reads them: ``target`` (decode rounds with a target time;
    base Ū, L) and ``draft`` (K >= 1 with a draft time; None when none) moments, the target filter's
    ``report``, the sparse-m ``pooling``, ``top_k`` (None: observed), and ``target_gen``/``draft_gen``:
    each cell's column in :func:`fit_costs`' (B, G) weights (G = ``n_generations``, sorted)."""

    target: CellMoments
    draft: CellMoments | None
    report: FilterReport
    pooling: MPooling
    top_k: float | None
    target_gen: np.ndarray
    draft_gen: np.ndarray | None
    n_generations: int

    @classmethod
    def of(cls, rounds: pd.DataFrame, top_k: float | None = None) -> "CostMoments":
        gens = pd.Index(pd.factorize(rounds["generation_id"], sort=True)[1])
        dec, report = decode_rounds(rounds, timing="target")
        target = CellMoments.from_rounds(dec, base=TARGET_BASE)
        dec_d, _ = decode_rounds(rounds, timing="draft")
        draft = CellMoments.from_rounds(dec_d, response="t_draft_ms", base=()) if len(dec_d) else None
        return cls(target, draft, report, pool_sparse_m(target), None if top_k is None else float(top_k),
                   gens.get_indexer(target.cells["generation_id"]),
                   None if draft is None else gens.get_indexer(draft.cells["generation_id"]), len(gens))


def _draft_line(xtx: np.ndarray, xty: np.ndarray, one_k: bool) -> tuple[float, float]:
    """``(a, b)`` of ``T_D = a·K + b`` from ``X'X``, ``X'y``; with a single K > 0 the line through the
    origin, ``a = ΣT_D / ΣK``, ``b = 0``."""
    if one_k:
        return float(xty[0] / xtx[0, 1]), 0.0
    b, a = solve_normal(xtx, xty, DRAFT_DESIGN.columns)
    return float(a), float(b)


def fit_costs(mom: CostMoments, weights: np.ndarray | None = None, source: str = "") -> list[CostModel | None]:
    """The cost models of ``mom`` with each generation weighted.

    ``weights`` None: one model on the full sample, SEs, row counts and conventions in ``extra["fit"]``;
    raises where a part cannot be fitted. ``weights`` (B, G) draw counts: B replicates without ``extra``,
    None where the design cannot be solved; the groups of m are the full sample's, which are present
    and identified each replicate's own.
    """
    if mom.draft is None:
        raise SpeclimitsError(f"the draft line T_D = a·K + b cannot be fitted: {REQUIREMENTS['draft']} (no decode "
                              "rounds with K >= 1 and a non-zero draft time)")
    if weights is None:
        return [_fit_full(mom, source)]
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    if w.shape[1] != mom.n_generations:
        raise ValueError(f"weights have {w.shape[1]} columns for {mom.n_generations} generations")
    t, d, groups = mom.target, mom.draft, mom.pooling.groups

    def weighted(values, gen, rows=slice(None)):  # (B, ...) sums of per-cell values, weighted by generation
        per = np.zeros((mom.n_generations,) + values.shape[1:])
        np.add.at(per, gen, values)
        return np.einsum("bg,gij->bij", w[rows], per) if per.ndim == 3 else w[rows] @ per

    # the design each replicate's rows give: which groups of m are present, where α is identified
    iu = t.names.index("u_bar")
    code = {m: i for i, g in enumerate(groups) for m in g}
    onehot = np.eye(len(groups))[[code[int(m)] for m in t.cells["m"]]]
    n, s1, s2 = (weighted(v[:, None] * onehot, mom.target_gen) for v in (t.n, t.zz[:, iu, 0], t.zz[:, iu, iu]))
    ident_b = _identified(n, s1, s2)
    d_xtx, d_xty = (weighted(v, mom.draft_gen) for v in cross_products(d, DRAFT_DESIGN.matrices(d)))
    one_k = d.cells["K"].nunique() == 1
    keys = [(tuple(g for g, p in zip(groups, n[b] > 0) if p),
             tuple(g for g, p, ok in zip(groups, n[b] > 0, ident_b[b]) if p and not ok)) for b in range(len(w))]
    out: list[CostModel | None] = [None] * len(w)
    for key in dict.fromkeys(keys):
        present, unident = key
        ident = [g for g in present if g not in unident]
        if not ident:
            continue
        design = joint_design(*key)
        members = [b for b, k in enumerate(keys) if k == key]
        xtx, xty = (weighted(v, mom.target_gen, members) for v in cross_products(t, design.matrices(t)))
        for i, b in enumerate(members):
            try:
                p = dict(zip(design.columns, solve_normal(xtx[i], xty[i], design.columns)))
                a, b_draft = _draft_line(d_xtx[b], d_xty[b], one_k)
            except SpeclimitsError:
                continue
            beta0, alpha = {}, {}
            for g in present:
                key_g = _m_key(g)
                if g in unident:  # the m = 1 convention (m1_convention), as fit_joint
                    j = groups.index(g)
                    tk = mom.top_k if mom.top_k is not None else float(s1[b, j] / n[b, j])
                    a_g = float(p[f"alpha[{_m_key(alpha_donor(g, ident))}]"])
                    b_g = float(p[f"beta0[{key_g}]"] - a_g * tk)
                else:
                    a_g, b_g = float(p[f"alpha[{key_g}]"]), float(p[f"beta0[{key_g}]"])
                for m in g:
                    alpha[m], beta0[m] = a_g, b_g
            beta0, alpha, _ = fill_missing_m(beta0, alpha)
            out[b] = CostModel(c=float(p["c"]), beta0=beta0, alpha=alpha, a=a, b=b_draft,
                               source=source or "bootstrap replicate")
    return out


def _fit_full(mom: CostMoments, source: str) -> CostModel:
    """:func:`fit_costs` on the full sample: :func:`fit_joint` and the draft line, with clustered SEs."""
    joint = fit_joint(mom.target, top_k=mom.top_k, pooling=mom.pooling)
    d = mom.draft
    if d.cells["K"].nunique() == 1:
        k = int(d.cells["K"].iloc[0])
        a, b = _draft_line(*(v.sum(0) for v in cross_products(d, DRAFT_DESIGN.matrices(d))), one_k=True)
        draft_fit = {"n_rounds": d.n_rows, "n_generations": d.n_clusters, "convention": "through the origin (single K)"}
        draft_note = (f"draft line: one value of K > 0 (K = {k}), so a and b are not both identified; convention "
                      f"b := 0, a := mean T_D / K = {a * k:.4g} / {k} (a sweep with >= 2 values of K > 0 fits both)")
    else:
        draft = fit_ols(d, DRAFT_DESIGN)
        a, b, draft_note = float(draft.params["K"]), float(draft.params["const"]), None
        draft_fit = {"n_rounds": draft.nobs, "n_generations": draft.n_clusters, "r2": draft.rsquared,
                     "a_se": float(draft.bse["K"]), "b_se": float(draft.bse["const"])}
    by_m = joint.by_m.set_index("m")
    beta0 = {int(m): float(r.beta0) for m, r in by_m.iterrows()}
    alpha = {int(m): float(r.alpha) for m, r in by_m.iterrows()}
    beta0, alpha, filled = fill_missing_m(beta0, alpha)
    fit = {
        "target": {"n_rounds": joint.ols.nobs, "n_generations": joint.ols.n_clusters, "r2": joint.ols.rsquared,
                   "c_se": float(joint.ols.bse["c"]), "filter": mom.report.to_dict(),
                   "se_by_m": {str(m): {"beta0": float(r.beta0_se), "alpha": float(r.alpha_se)}
                               for m, r in by_m.iterrows()},
                   "alpha_identified": {str(m): bool(r.identified) for m, r in by_m.iterrows()},
                   "top_k": joint.top_k},
        "draft": draft_fit,
        "notes": list(joint.notes) + ["standard errors clustered by generation (statsmodels' correction)"],
    }
    if draft_note is not None:
        fit["notes"].append(draft_note)
    if joint.pooling.pooled:
        fit["target"]["pooled_m"] = joint.pooling.pooled
    if filled:
        fit["target"]["interpolated_m"] = filled
        fit["notes"].append(
            f"m = {', '.join(map(str, filled))} not in the trace: beta0 and alpha interpolated linearly in m between "
            "the nearest m present on either side (no standard errors)")
    return CostModel(c=joint.c, beta0=beta0, alpha=alpha, a=a, b=b,
                     source=source or "speclimits fit: joint categorical target model + draft line", extra={"fit": fit})


def fit_cost_model(rounds: pd.DataFrame, top_k: int | None = None, source: str = "") -> CostModel:
    """The cost model of a trace's ``rounds``: Eq. 4 on every decode round with a target time (K = 0
    gives m = 1: :func:`m1_convention`, ``top_k`` from meta, else observed) and ``T_D = a·K + b`` on K >= 1
    with a draft time; SEs, row counts and conventions in ``extra["fit"]``."""
    return fit_costs(CostMoments.of(rounds, top_k), source=source)[0]


def fill_missing_m(beta0: dict[int, float], alpha: dict[int, float]
                   ) -> tuple[dict[int, float], dict[int, float], list[int]]:
    """Every m between the smallest and largest present, the missing ones (a K grid with gaps) interpolated
    linearly from the nearest present m on either side, so the Oracle prices every draft length. Returns
    the completed ``beta0``, ``alpha`` and the interpolated m (ascending)."""
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
    """The one route from a trace to a cost-model JSON (``speclimits fit --out``, section 3, the Oracle's
    default): :func:`fit_cost_model` with meta's ``top_k``; ``source`` names the trace by its folder name,
    so the bytes do not depend on the path or machine."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    return fit_cost_model(tr.rounds, top_k=tr.top_k,
                          source=f"speclimits fit on trace {tr.path.resolve().name} ({tr.source_label})")
