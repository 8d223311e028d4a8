"""OLS from per-cell sufficient statistics, with standard errors clustered by generation.

Every design column is a *base variable* (``const``, ``u_bar``, ``context_len``, ...) times a quantity
constant within a **cell** (one generation at one m), so ``X_c = Z_c A_c``, ``X_c'X_c = A_c' (Z_c'Z_c) A_c``
and ``X_c'y_c = A_c' Z_c'y_c`` follow from the cell moments (:class:`CellMoments`): one pass over the
rows serves every fit, fold and bootstrap resample. Cluster scores are linear in the moments too, so
clustered covariances are exact (statsmodels' ``cov_type="cluster"``, t with ``G - 1`` df). Row-level
quantities (MAPE, residuals) use the kept rows: a row's prediction is ``Z_row · (A_cell β)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps
from sklearn.model_selection import GroupKFold

from speclimits.errors import SpeclimitsError

#: Base variables a design may use (``const`` is added first).
BASE_VARS = ("u_bar", "context_len", "kv_usage", "graph_bucket", "e_max")
#: Cell-level attributes a term may multiply by (constant within a cell).
CELL_ATTRS = ("K", "m")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided ``level`` t-interval (``len(values) - 1`` df)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return (float(v.mean()) if v.size else math.nan, math.nan)
    return float(v.mean()), float(sps.t.interval(level, v.size - 1)[1] * v.std(ddof=1) / math.sqrt(v.size))


@dataclass
class CellMoments:
    """Per-cell moments of the base variables ``names`` = ``("const", *base)`` (q) and the response:
    ``zz`` (C, q, q), ``zy`` (C, q), ``yy`` and ``n`` (C,); ``cells``: ``generation_id``, ``m``, ``K``,
    ``cluster`` (0..G-1) and ``category``/``prompt_id`` where the rounds have them; the rows they came
    from: ``z`` (N, q), ``y`` (N,), ``cell_of_row`` (N,)."""

    names: tuple[str, ...]
    zz: np.ndarray
    zy: np.ndarray
    yy: np.ndarray
    n: np.ndarray
    cells: pd.DataFrame
    z: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    cell_of_row: np.ndarray = field(repr=False)
    response: str = "t_target_ms"

    @classmethod
    def from_rounds(cls, rounds: pd.DataFrame, response: str = "t_target_ms",
                    base: Sequence[str] = BASE_VARS) -> "CellMoments":
        """Moments of the (filtered) ``rounds``, cells by (generation_id, m); raises naming a missing
        column or the first row with a non-finite value."""
        need = ["generation_id", "K", "m", response, *base]
        missing = [c for c in need if c not in rounds.columns]
        if missing:
            raise SpeclimitsError(f"rounds table lacks column(s) {missing} needed for the fit")
        if len(rounds) == 0:
            raise SpeclimitsError("no rounds left to fit (after filtering)")
        z = np.column_stack([np.ones(len(rounds))] + [rounds[c].to_numpy(dtype=float) for c in base])
        y = rounds[response].to_numpy(dtype=float)
        bad = ~(np.isfinite(z).all(axis=1) & np.isfinite(y))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            cols = [c for c in [*base, response] if not np.isfinite(float(rounds[c].iloc[first]))]
            raise SpeclimitsError(
                f"rounds: {int(bad.sum())} row(s) with a non-finite value (first at row {first}, column(s) {cols})")
        gen = rounds["generation_id"].to_numpy()
        mm = rounds["m"].to_numpy()
        keys = pd.MultiIndex.from_arrays([gen, mm])
        cell_of_row, uniq = pd.factorize(keys, sort=True)
        n_cells = len(uniq)
        q = z.shape[1]
        zz = np.empty((n_cells, q, q))
        for i in range(q):
            for j in range(i, q):
                s = np.bincount(cell_of_row, weights=z[:, i] * z[:, j], minlength=n_cells)
                zz[:, i, j] = s
                zz[:, j, i] = s
        zy = np.column_stack([np.bincount(cell_of_row, weights=z[:, i] * y, minlength=n_cells) for i in range(q)])
        yy = np.bincount(cell_of_row, weights=y * y, minlength=n_cells)
        n = np.bincount(cell_of_row, minlength=n_cells).astype(float)
        first = np.zeros(n_cells, dtype=np.int64)
        first[cell_of_row[::-1]] = np.arange(len(rounds))[::-1]
        cells = pd.DataFrame({
            "generation_id": uniq.get_level_values(0).to_numpy(),
            "m": uniq.get_level_values(1).to_numpy().astype(np.int64),
            "K": rounds["K"].to_numpy()[first].astype(np.int64),
        })
        for col in ("category", "prompt_id"):
            if col in rounds.columns:
                cells[col] = rounds[col].astype(str).to_numpy()[first]
        cells["cluster"] = pd.factorize(cells["generation_id"], sort=True)[0]
        return cls(("const", *base), zz, zy, yy, n, cells, z, y, cell_of_row, response)

    @property
    def n_rows(self) -> int:
        return int(self.n.sum())

    def subset(self, cell_mask: np.ndarray) -> "CellMoments":
        """The cells where ``cell_mask`` is True (rows follow their cells)."""
        cell_mask = np.asarray(cell_mask, dtype=bool)
        idx = np.flatnonzero(cell_mask)
        new_index = np.full(len(cell_mask), -1)
        new_index[idx] = np.arange(idx.size)
        rows = cell_mask[self.cell_of_row]
        cells = self.cells.iloc[idx].reset_index(drop=True)
        cells["cluster"] = pd.factorize(cells["generation_id"], sort=True)[0]
        return CellMoments(self.names, self.zz[idx], self.zy[idx], self.yy[idx], self.n[idx], cells,
                           self.z[rows], self.y[rows], new_index[self.cell_of_row[rows]], self.response)

    def where(self, **eq: Any) -> "CellMoments":
        """Cells whose attributes equal the given values, e.g. ``mom.where(K=8)``."""
        mask = np.ones(len(self.cells), bool)
        for k, v in eq.items():
            mask &= self.cells[k].to_numpy() == v
        return self.subset(mask)

    def column(self, name: str) -> np.ndarray:
        """Row-level values of a base variable (the response is ``y``)."""
        return self.z[:, self.names.index(name)]

    def row_attr(self, attr: str) -> np.ndarray:
        """A cell attribute broadcast to the rows."""
        return self.cells[attr].to_numpy()[self.cell_of_row]

    @property
    def n_clusters(self) -> int:
        return int(self.cells["cluster"].max()) + 1 if len(self.cells) else 0

    def recluster(self, column: str) -> "CellMoments":
        """The same moments clustered by a cell column (e.g. ``prompt_id``), for standard errors only."""
        return replace(self, cells=self.cells.assign(cluster=pd.factorize(self.cells[column], sort=True)[0]))


@dataclass(frozen=True)
class Term:
    """One design column ``name``: ``base`` variable times the cell attribute ``mult`` (None: 1), on the
    cells where ``active(cells)`` (None: all), times ``scale(cells)`` (e.g. ``log m``; None: 1)."""

    name: str
    base: str
    mult: str | None = None
    active: Callable[[pd.DataFrame], np.ndarray] | None = field(default=None, compare=False)
    scale: Callable[[pd.DataFrame], np.ndarray] | None = field(default=None, compare=False)


def parse_term(spec: str) -> Term:
    """``"u_bar"`` -> u_bar; ``"m"`` / ``"K"`` -> const x m; ``"m:context_len"`` -> context_len x m."""
    if ":" in spec:
        mult, base = spec.split(":", 1)
        return Term(spec, base, mult)
    if spec in CELL_ATTRS:
        return Term(spec, "const", spec)
    return Term(spec, spec)


@dataclass(frozen=True)
class Design:
    """A list of terms; ``matrices(moments)`` gives the per-cell maps ``A_c`` (C, q, p)."""

    terms: tuple[Term, ...]
    label: str = ""

    @classmethod
    def linear(cls, *specs: str, const: bool = True, label: str = "") -> "Design":
        terms = ([Term("const", "const")] if const else []) + [parse_term(s) for s in specs]
        return cls(tuple(terms), label or " + ".join(specs))

    @property
    def columns(self) -> list[str]:
        return [t.name for t in self.terms]

    def matrices(self, mom: CellMoments) -> np.ndarray:
        cells = mom.cells
        a = np.zeros((len(cells), len(mom.names), len(self.terms)))
        for j, t in enumerate(self.terms):
            if t.base not in mom.names:
                raise SpeclimitsError(f"design term {t.name!r} uses {t.base!r}, not among {mom.names}")
            v = np.ones(len(cells)) if t.mult is None else cells[t.mult].to_numpy(dtype=float)
            if t.active is not None:
                v = v * np.asarray(t.active(cells), dtype=float)
            if t.scale is not None:
                v = v * np.asarray(t.scale(cells), dtype=float)
            a[:, mom.names.index(t.base), j] = v
        return a

    def rows(self, mom: CellMoments) -> np.ndarray:
        """The row-level design matrix (N, p) (e.g. for Breusch–Pagan)."""
        a = self.matrices(mom)
        return np.einsum("nq,nqp->np", mom.z, a[mom.cell_of_row])


def cross_products(mom: CellMoments, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell ``X'X`` (C, p, p) and ``X'y`` (C, p) of the design with maps ``a``."""
    at = a.transpose(0, 2, 1)
    return at @ mom.zz @ a, np.einsum("cqp,cq->cp", a, mom.zy)


def solve_normal(xtx: np.ndarray, xty: np.ndarray, columns: Sequence[str]) -> np.ndarray:
    """Solve the normal equations with column equilibration; raise naming unidentified columns."""
    d = np.sqrt(np.diag(xtx))
    if (d <= 0).any():
        bad = [columns[i] for i in np.flatnonzero(d <= 0)]
        raise SpeclimitsError(f"design columns {bad} are identically zero on the fitted rows (no data)")
    s = xtx / np.outer(d, d)
    try:
        cho = np.linalg.cholesky(s)
    except np.linalg.LinAlgError:
        raise SpeclimitsError(f"design is singular (collinear columns among {list(columns)})") from None
    if np.linalg.cond(s) > 1e13:
        raise SpeclimitsError(f"design is numerically singular (collinear columns among {list(columns)})")
    w = np.linalg.solve(cho.T, np.linalg.solve(cho, xty / d))
    return w / d


def solve_batch(xtx: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """Batched, equilibrated solve for (B, p, p) and (B, p): a system :func:`solve_normal` would refuse (a
    zero column: a resample that missed its cells; condition above 1e13) gives a row of NaN."""
    d = np.sqrt(np.einsum("bii->bi", xtx))
    bad = ~(d > 0).all(axis=1)
    d = np.where(bad[:, None], 1.0, d)
    s = xtx / (d[:, :, None] * d[:, None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        bad |= ~(np.linalg.cond(s) <= 1e13)  # collinear in this resample (as solve_normal refuses)
    if bad.any():  # keep the well-posed systems exactly as they are; park the others on the identity
        xty = xty.copy()
        s[bad], xty[bad], d[bad] = np.eye(s.shape[1]), 0.0, 1.0
    out = np.linalg.solve(s, (xty / d)[..., None])[..., 0] / d  # every system left has condition <= 1e13
    out[bad] = np.nan
    return out


def failed_replicates(beta: np.ndarray) -> int:
    """How many rows of a (B, p) replicate matrix are non-finite (unsolvable resamples)."""
    return int((~np.isfinite(np.asarray(beta, dtype=float)).all(axis=1)).sum())


@dataclass(frozen=True)
class OLSResults:
    """A fitted linear model (statsmodels-like): ``params``/``bse`` by column, ``cov`` cluster-robust with
    statsmodels' correction, t with ``df_t = n_clusters - 1``; in-sample ``rsquared``, ``rmse``; design
    column and response means/sds (for β*)."""

    params: pd.Series
    cov: pd.DataFrame
    nobs: int
    n_clusters: int
    rsquared: float
    rmse: float
    col_mean: pd.Series
    col_sd: pd.Series
    y_mean: float
    y_sd: float
    label: str = ""
    response: str = "t_target_ms"

    @property
    def bse(self) -> pd.Series:
        return pd.Series(np.sqrt(np.clip(np.diag(self.cov.to_numpy()), 0, None)), index=self.params.index)

    @property
    def df_t(self) -> int:
        return max(self.n_clusters - 1, 1)

    @property
    def tvalues(self) -> pd.Series:
        return self.params / self.bse

    @property
    def pvalues(self) -> pd.Series:
        return pd.Series(2 * sps.t.sf(np.abs(self.tvalues.to_numpy()), self.df_t), index=self.params.index)

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        """Two-sided ``1 - alpha`` t-intervals; columns ``lower``, ``upper``."""
        q = sps.t.ppf(1 - alpha / 2, self.df_t)
        return pd.DataFrame({"lower": self.params - q * self.bse, "upper": self.params + q * self.bse})

    def standardized(self) -> pd.DataFrame:
        """β* = β · sd(x) / sd(y) with its CI scaled the same way (sds treated as fixed)."""
        scale = self.col_sd / self.y_sd
        ci = self.conf_int()
        out = pd.DataFrame({"beta_std": self.params * scale, "lower": ci["lower"] * scale,
                            "upper": ci["upper"] * scale})
        return out.drop(index=[c for c in out.index if self.col_sd[c] == 0])

    def to_frame(self) -> pd.DataFrame:
        ci = self.conf_int()
        return pd.DataFrame({"coef": self.params, "se": self.bse, "t": self.tvalues, "p": self.pvalues,
                             "ci_lower": ci["lower"], "ci_upper": ci["upper"]})

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "response": self.response, "nobs": self.nobs, "n_clusters": self.n_clusters,
                "rsquared": self.rsquared, "rmse": self.rmse,
                "params": self.to_frame().rename_axis("term").reset_index()}


def cluster_cov(xtx: np.ndarray, scores: np.ndarray, clusters: np.ndarray, nobs: int) -> np.ndarray:
    """``(X'X)⁻¹ (Σ_g s_g s_g') (X'X)⁻¹`` times ``G/(G-1) · (N-1)/(N-p)`` (NaN for one cluster; statsmodels'
    ``cov_type="cluster"``): ``scores`` (rows or cells, p) summed within ``clusters`` (0..G-1)."""
    g, p = int(clusters.max()) + 1, scores.shape[1]
    s = np.zeros((g, p))
    np.add.at(s, clusters, scores)
    bread = np.linalg.inv(xtx)
    corr = (g / (g - 1.0)) * ((nobs - 1.0) / (nobs - p)) if g > 1 and nobs > p else math.nan
    return corr * bread @ (s.T @ s) @ bread


def fit_ols(mom: CellMoments, design: Design) -> OLSResults:
    """OLS of the response on ``design`` over all cells of ``mom``, SEs clustered by generation."""
    a = design.matrices(mom)
    xtx_c, xty_c = cross_products(mom, a)
    cols = design.columns
    xtx, xty = xtx_c.sum(0), xty_c.sum(0)
    beta = solve_normal(xtx, xty, cols)
    nobs, g = mom.n_rows, mom.n_clusters
    cov = cluster_cov(xtx, xty_c - xtx_c @ beta, mom.cells["cluster"].to_numpy(), nobs)  # per-cell scores
    yy, ysum = mom.yy.sum(), mom.zy[:, 0].sum()
    ssr = yy - 2 * beta @ xty + beta @ xtx @ beta
    sst = yy - ysum ** 2 / nobs
    # design column moments from X'X (const column: n)
    sum_x = np.einsum("cqp,cq->p", a, mom.zz[:, :, 0])
    col_mean = sum_x / nobs
    col_var = np.diag(xtx) / nobs - col_mean ** 2
    return OLSResults(
        params=pd.Series(beta, index=cols), cov=pd.DataFrame(cov, index=cols, columns=cols),
        nobs=nobs, n_clusters=g, rsquared=float(1 - ssr / sst), rmse=float(math.sqrt(max(ssr, 0) / nobs)),
        col_mean=pd.Series(col_mean, index=cols), col_sd=pd.Series(np.sqrt(np.clip(col_var, 0, None)), index=cols),
        y_mean=float(ysum / nobs), y_sd=float(math.sqrt(max(sst, 0) / nobs)), label=design.label,
        response=mom.response)


def predict(mom: CellMoments, design: Design, params: np.ndarray | pd.Series,
            a: np.ndarray | None = None, rows: np.ndarray | None = None) -> np.ndarray:
    """Fitted values of ``design`` with coefficients ``params`` on every row (N,), or on the ``rows`` (mask)."""
    a = design.matrices(mom) if a is None else a
    b = a @ np.asarray(params, dtype=float)  # (C, q): coefficients on the base variables per cell
    if rows is None:
        return np.einsum("nq,nq->n", mom.z, b[mom.cell_of_row])
    return np.einsum("nq,nq->n", mom.z[rows], b[mom.cell_of_row[rows]])


def held_out_fits(mom: CellMoments, design: Design, cell_group: np.ndarray,
                  xp: tuple[np.ndarray, np.ndarray] | None = None):
    """``(g, β)`` for each value ``g`` of ``cell_group`` (C,), ascending: ``design`` fitted on every other
    group's cells (a fold, a K left out). ``xp``: the per-cell cross-products, when already made."""
    xtx_c, xty_c = xp if xp is not None else cross_products(mom, design.matrices(mom))
    for g in np.unique(cell_group):
        tr = cell_group != g
        yield g, solve_normal(xtx_c[tr].sum(0), xty_c[tr].sum(0), design.columns)


def held_out_predictions(mom: CellMoments, design: Design, cell_group: np.ndarray) -> np.ndarray:
    """(N,) prediction of every row by ``design`` fitted on the cells of every other group (:func:`held_out_fits`)."""
    a = design.matrices(mom)
    row_group = cell_group[mom.cell_of_row]
    out = np.full(mom.n_rows, np.nan)
    for g, beta in held_out_fits(mom, design, cell_group, cross_products(mom, a)):
        rows = row_group == g
        out[rows] = predict(mom, design, beta, a, rows)
    return out


def group_folds(mom: CellMoments, n_splits: int = 5) -> np.ndarray:
    """(G,) fold of every cluster by scikit-learn's ``GroupKFold`` on the rows (a generation is never split)."""
    g = mom.n_clusters
    if g < n_splits:
        raise SpeclimitsError(f"GroupKFold({n_splits}) needs at least {n_splits} generations; got {g}")
    cl = mom.cells["cluster"].to_numpy()
    sizes = np.bincount(cl, weights=mom.n, minlength=g).astype(np.int64)
    groups = np.repeat(np.arange(g), sizes)
    fold = np.empty(g, dtype=np.int64)
    for f, (_, test) in enumerate(GroupKFold(n_splits=n_splits).split(groups, groups=groups)):
        fold[np.unique(groups[test])] = f
    return fold


@dataclass(frozen=True)
class CVResult:
    """Out-of-sample metrics of one design: ``folds`` one row per fold (``r2``, ``rmse``, ``mape`` and
    ``medape`` in %, ``n_test``); ``oof`` the (N,) out-of-fold prediction of every row."""

    label: str
    folds: pd.DataFrame
    oof: np.ndarray = field(repr=False)

    def mean_ci(self, metric: str) -> tuple[float, float]:
        return t_interval(self.folds[metric].to_numpy())

    def to_frame(self) -> pd.DataFrame:
        rows = {}
        for met in ("r2", "rmse", "mape", "medape"):
            mean, half = self.mean_ci(met)
            rows[met] = {"mean": mean, "ci_halfwidth": half}
        return pd.DataFrame(rows).T

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "folds": self.folds, "summary": self.to_frame().rename_axis("metric")}


def ape(y: np.ndarray, yhat: np.ndarray) -> np.ndarray:
    """Absolute percentage error, in percent."""
    return 100.0 * np.abs(y - yhat) / np.abs(y)


def cross_validate(mom: CellMoments, design: Design, folds: np.ndarray) -> CVResult:
    """Fit on all folds but one, score the held-out one; R² around the held-out fold's mean (``r2_score``)."""
    cell_fold = folds[mom.cells["cluster"].to_numpy()]
    row_fold = cell_fold[mom.cell_of_row]
    oof = held_out_predictions(mom, design, cell_fold)
    recs = []
    for f in np.unique(cell_fold):
        rows = row_fold == f
        y, yhat = mom.y[rows], oof[rows]
        sse = float(((y - yhat) ** 2).sum())
        sst = float(((y - y.mean()) ** 2).sum())
        e = ape(y, yhat)
        recs.append({"fold": int(f), "n_test": int(rows.sum()), "r2": 1 - sse / sst,
                     "rmse": math.sqrt(sse / rows.sum()), "mape": float(e.mean()), "medape": float(np.median(e))})
    return CVResult(design.label, pd.DataFrame(recs), oof)


def cv_fold_sse(mom: CellMoments, design: Design, folds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Held-out SSE and rows of every fold (two (F,) arrays, folds in sorted order), from moments only."""
    xtx_c, xty_c = cross_products(mom, design.matrices(mom))
    cell_fold = folds[mom.cells["cluster"].to_numpy()]
    sse, n = [], []
    for f, beta in held_out_fits(mom, design, cell_fold, (xtx_c, xty_c)):
        te = cell_fold == f
        sse.append(mom.yy[te].sum() - 2 * beta @ xty_c[te].sum(0) + beta @ xtx_c[te].sum(0) @ beta)
        n.append(mom.n[te].sum())
    return np.array(sse, dtype=float), np.array(n, dtype=float)


@dataclass(frozen=True)
class ClusterSums:
    """Per-cluster sums of one design: ``xtx`` (G, p, p), ``xty`` (G, p), ``yy``, ``ysum``, ``n`` (G,)."""

    columns: tuple[str, ...]
    xtx: np.ndarray
    xty: np.ndarray
    yy: np.ndarray
    ysum: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, mom: CellMoments, design: Design) -> "ClusterSums":
        a = design.matrices(mom)
        xtx_c, xty_c = cross_products(mom, a)
        g, p = mom.n_clusters, len(design.columns)
        cl = mom.cells["cluster"].to_numpy()
        xtx_g, xty_g = np.zeros((g, p, p)), np.zeros((g, p))
        np.add.at(xtx_g, cl, xtx_c)
        np.add.at(xty_g, cl, xty_c)
        per = (lambda v: np.bincount(cl, weights=v, minlength=g))
        return cls(tuple(design.columns), xtx_g, xty_g, per(mom.yy), per(mom.zy[:, 0]), per(mom.n))

    def replicates(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Estimates (B, p) and in-sample R² (B,) of each resample (``weights`` (B, G) draw counts; NaN where
        unsolvable)."""
        xtx_b = np.einsum("bg,gij->bij", weights, self.xtx)
        xty_b = weights @ self.xty
        beta = solve_batch(xtx_b, xty_b)
        yy, ysum, n = weights @ self.yy, weights @ self.ysum, weights @ self.n
        ssr = yy - 2 * np.einsum("bp,bp->b", beta, xty_b) + np.einsum("bp,bpq,bq->b", beta, xtx_b, beta)
        return beta, 1 - ssr / (yy - ysum ** 2 / n)


def cluster_bootstrap(mom: CellMoments, design: Design, weights: np.ndarray) -> pd.DataFrame:
    """(n_boot, p) OLS estimates of each resample of generations (``weights``: draw counts): a generation
    drawn ``w`` times adds ``w`` copies of its ``X'X`` and ``X'y``."""
    beta, _ = ClusterSums.of(mom, design).replicates(weights)
    return pd.DataFrame(beta, columns=design.columns)
