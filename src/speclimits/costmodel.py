"""The cost-model JSON: written by the fit, read by the Oracle, editable by hand for a what-if.

Format (ms units)::

    {"target": {"c": 0.0011,
                "by_m": {"2": {"beta0": 7.3, "alpha": 0.078}, "3": {...}, ...}},
     "draft":  {"a": 0.459, "b": 0.073}}

Target time of a pass with ``m`` rows, ``u_bar`` unique experts per layer and context ``L``:
``beta0(m) + alpha(m) * u_bar + c * L``. Draft time of ``k`` steps: ``a * k + b`` (0 for k = 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speclimits.errors import CostModelError
from speclimits.jsonutil import dumps, read_json


def _finite(value: Any, where: str, origin: str) -> float:
    """``value`` as a finite float, or a :class:`CostModelError` naming the file (``origin``) and field."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise CostModelError(f"{origin}: '{where}' must be a number, got {value!r}") from None
    if not np.isfinite(out):
        raise CostModelError(f"{origin}: '{where}' must be finite, got {value!r}")
    return out


def _need(obj: Any, key: str, where: str, origin: str) -> Any:
    """``obj[key]``, or a :class:`CostModelError` naming the missing field ``where + key`` of ``origin``."""
    if not isinstance(obj, Mapping) or key not in obj:
        raise CostModelError(f"{origin}: missing '{where}{key}'")
    return obj[key]


def _by_m(values: Mapping[int, float], m: np.ndarray) -> np.ndarray:
    """``values[m]`` for an int array ``m``, as floats of its shape."""
    return np.vectorize(values.__getitem__, otypes=[float])(m) if m.size else m * 0.0


def _write(path: str | Path, data: dict[str, Any], *checks: tuple[str, Mapping[str, float]]) -> Path:
    """Write ``data`` as strict JSON; a non-finite coefficient of ``checks`` ``(what, {name: value})``
    raises :class:`CostModelError` instead of writing a file that ``read`` would refuse."""
    for what, values in checks:
        bad = [name for name, v in values.items() if not np.isfinite(v)]
        if bad:
            raise CostModelError(f"{what} {path}: not written, non-finite coefficients {', '.join(bad)}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(dumps(data, indent=2) + "\n")
    return p


@dataclass(frozen=True)
class CostModel:
    """Round-cost model: ``c`` ms per context token (shared across m), ``beta0`` ``{m: ms}``, ``alpha``
    ``{m: ms per unique expert}``, draft time ``a * k + b`` ms; ``source``: where the numbers came from."""

    c: float
    beta0: Mapping[int, float]
    alpha: Mapping[int, float]
    a: float
    b: float
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "cost model") -> "CostModel":
        """Build from the JSON structure; errors name the missing or bad field."""
        need, num = partial(_need, origin=origin), partial(_finite, origin=origin)

        target = need(data, "target", "")
        draft = need(data, "draft", "")
        by_m = need(target, "by_m", "target.")
        if not isinstance(by_m, Mapping) or not by_m:
            raise CostModelError(f"{origin}: 'target.by_m' must be a non-empty object keyed by m")
        beta0, alpha = {}, {}
        for key, entry in by_m.items():
            try:
                m = int(key)
            except (TypeError, ValueError):
                raise CostModelError(f"{origin}: 'target.by_m' key {key!r} is not an integer m") from None
            if m < 1:
                raise CostModelError(f"{origin}: 'target.by_m' key {key!r}: m must be >= 1")
            beta0[m] = num(need(entry, "beta0", f"target.by_m.{key}."), f"target.by_m.{key}.beta0")
            alpha[m] = num(need(entry, "alpha", f"target.by_m.{key}."), f"target.by_m.{key}.alpha")
        return cls(
            c=num(need(target, "c", "target."), "target.c"),
            beta0=dict(sorted(beta0.items())),
            alpha=dict(sorted(alpha.items())),
            a=num(need(draft, "a", "draft."), "draft.a"),
            b=num(need(draft, "b", "draft."), "draft.b"),
            source=str(data.get("source", "")),
            extra={k: v for k, v in data.items() if k not in ("target", "draft", "source")},
        )

    @classmethod
    def read(cls, path: str | Path) -> "CostModel":
        """Read a cost-model JSON file."""
        return cls.from_dict(read_json(path, "cost model", CostModelError), origin=f"cost model {Path(path)}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": {
                "c": self.c,
                "by_m": {str(m): {"beta0": self.beta0[m], "alpha": self.alpha[m]} for m in self.ms},
            },
            "draft": {"a": self.a, "b": self.b},
        }
        if self.source:
            out["source"] = self.source
        out.update(self.extra)
        return out

    def _coefficients(self) -> dict[str, float]:
        return {"target.c": self.c, "draft.a": self.a, "draft.b": self.b,
                **{f"target.by_m.{m}.beta0": v for m, v in self.beta0.items()},
                **{f"target.by_m.{m}.alpha": v for m, v in self.alpha.items()}}

    def write(self, path: str | Path) -> Path:
        """Write the JSON (strict; non-finite coefficients raise :class:`CostModelError`)."""
        return _write(path, self.to_dict(), ("cost model", self._coefficients()))

    def with_alpha_scale(self, scale: float) -> "CostModel":
        """The same model with every ``alpha(m)`` multiplied by ``scale`` (0 = the α = 0 ablation)."""
        return replace(self, alpha={m: v * scale for m, v in self.alpha.items()})

    @property
    def ms(self) -> list[int]:
        """The m values the model covers, sorted."""
        return sorted(self.beta0)

    def require_ms(self, ms: range | list[int], origin: str = "cost model") -> None:
        """Raise :class:`CostModelError` naming every needed m the model lacks."""
        missing = [m for m in ms if m not in self.beta0]
        if missing:
            raise CostModelError(
                f"{origin} has no target coefficients for m = {missing} "
                f"(it covers m = {self.ms}); fit on a trace with those K = m - 1, or add them to 'target.by_m'"
            )

    def target_ms(self, m: Any, u_bar: Any, context_len: Any) -> np.ndarray:
        """Target time (ms) for arrays of ``m``, ``u_bar``, ``context_len`` (broadcast)."""
        m_arr = np.asarray(m, dtype=np.int64)
        self.require_ms(sorted(set(np.unique(m_arr).tolist())))
        return (_by_m(self.beta0, m_arr) + _by_m(self.alpha, m_arr) * np.asarray(u_bar, dtype=float)
                + self.c * np.asarray(context_len, dtype=float))

    def draft_ms(self, k: Any) -> np.ndarray:
        """Draft time (ms) of ``k`` draft steps; 0 when k = 0 (plain autoregressive step)."""
        k_arr = np.asarray(k, dtype=float)
        return np.where(k_arr > 0, self.a * k_arr + self.b, 0.0)

    def round_ms(self, k: Any, u_bar: Any, context_len: Any) -> np.ndarray:
        """Cost (ms) of a round drafting ``k`` tokens and verifying ``m = k + 1`` rows (k = 0: a plain step)."""
        k_arr = np.asarray(k, dtype=np.int64)
        return self.draft_ms(k_arr) + self.target_ms(k_arr + 1, u_bar, context_len)

    def coefficients_by_m(self, m_max: int) -> tuple[np.ndarray, np.ndarray]:
        """``(beta0, alpha)`` indexed by m = 0..m_max; NaN where the model has no such m (always at 0)."""
        ms = [m for m in range(1, m_max + 1) if m in self.beta0]
        beta0, alpha = np.full(m_max + 1, np.nan), np.full(m_max + 1, np.nan)
        beta0[ms], alpha[ms] = [self.beta0[m] for m in ms], [self.alpha[m] for m in ms]
        return beta0, alpha

    def action_terms(self, k_max: int) -> tuple[np.ndarray, np.ndarray]:
        """The round cost of k = 0..k_max as a line, ``round_ms(k, u, L) = fixed[k] + slope[k] * u + c * L``
        (``fixed[k] = draft_ms(k) + beta0(k + 1)``, ``slope[k] = alpha(k + 1)``; NaN where m = k + 1 is absent)."""
        beta0, alpha = self.coefficients_by_m(k_max + 1)
        ks = np.arange(k_max + 1)
        return self.draft_ms(ks) + beta0[ks + 1], alpha[ks + 1]

    def round_prices(self, k_max: int, u_bar: Any, context_len: Any = None,
                     terms: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """:meth:`round_ms` of k = 0..k_max in its line form, ``fixed[k] + slope[k] · u_bar[..., k]`` (+ ``c ·
        context_len[...]`` when given): the one formula every solver and policy prices a round with.
        ``terms``: :meth:`action_terms`, computed once."""
        fixed, slope = self.action_terms(k_max) if terms is None else terms
        out = np.array(u_bar, dtype=float)
        out *= slope
        out += fixed
        if context_len is not None:
            out += (self.c * np.asarray(context_len, dtype=float))[..., None]
        return out

    def mean_round_prices(self, k_max: int, u_bar_by_m: Any) -> np.ndarray:
        """(k_max + 1,) round prices without the context term at a Ū per m (``u_bar_by_m[m]``): what the
        controller prices a request's round at."""
        u = np.asarray(u_bar_by_m, dtype=float)
        return self.round_prices(k_max, u[np.arange(1, k_max + 2)])


def union_unique(u: Any, n_experts: int, axis: int = -1) -> np.ndarray:
    """Unique experts per layer of a pass whose requests (their own counts ``u`` along ``axis``) route
    independently: ``E * (1 - prod_i (1 - u_i / E))``."""
    frac = np.clip(np.asarray(u, dtype=float) / float(n_experts), 0.0, 1.0)
    return float(n_experts) * (1.0 - np.prod(1.0 - frac, axis=axis))


def saturation_curve(n_tokens: Any, n_experts: int, top_k: int) -> np.ndarray:
    """Expected unique experts per layer when ``n_tokens`` tokens each route uniformly to ``top_k`` of
    ``n_experts``: ``E * (1 - (1 - k/E) ** n)`` (real routing is skewed, so a measured pass touches fewer)."""
    n = np.asarray(n_tokens, dtype=float)
    return float(n_experts) * (1.0 - (1.0 - float(top_k) / float(n_experts)) ** n)


@dataclass(frozen=True)
class BatchCostModel:
    """Step cost when ``n`` requests share one engine step, each verifying ``m = k + 1`` rows, with Ū the
    unique experts per layer of the *whole step* and ``L_total`` the summed context::

        target(n, m, Ū, L_total) = beta0(m) + gamma(m) * (n - 1) + alpha(m) * Ū + c * L_total
        draft(n, k)              = a * k + b + (n - 1) * (a_req * k + b_req)     (0 when k = 0)

    At n = 1 this is the batch-1 model ``base``. JSON: the batch-1 format plus a ``"batch"`` section
    (``n_experts``, ``top_k``, ``by_m.<m>.gamma``, ``draft.a_req``/``b_req``; other keys kept in ``extra``),
    so a batch cost model is also a valid batch-1 one.
    """

    base: CostModel
    gamma: Mapping[int, float]
    a_req: float
    b_req: float
    n_experts: int
    top_k: int
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "batch cost model") -> "BatchCostModel":
        batch = data.get("batch") if isinstance(data, Mapping) else None
        if not isinstance(batch, Mapping):
            raise CostModelError(f"{origin}: missing 'batch' (a batch-1 cost model has no per-request terms; "
                                 "fit one on a batch trace: speclimits fit --batch TRACE)")
        base = CostModel.from_dict({k: v for k, v in data.items() if k != "batch"}, origin=origin)
        need, num = partial(_need, origin=origin), partial(_finite, origin=origin)
        n_experts, top_k = (int(num(need(batch, key, "batch."), f"batch.{key}")) for key in ("n_experts", "top_k"))
        by_m, draft = need(batch, "by_m", "batch."), need(batch, "draft", "batch.")
        if not isinstance(by_m, Mapping):
            raise CostModelError(f"{origin}: 'batch.by_m' must be an object keyed by m")
        gamma = {int(m): num(need(entry, "gamma", f"batch.by_m.{m}."), f"batch.by_m.{m}.gamma")
                 for m, entry in by_m.items()}
        missing = [m for m in base.ms if m not in gamma]
        if missing:
            raise CostModelError(f"{origin}: 'batch.by_m' lacks m = {missing} that 'target.by_m' has")
        if not 1 <= top_k <= n_experts:
            raise CostModelError(f"{origin}: need 1 <= batch.top_k <= batch.n_experts, got {top_k}, {n_experts}")
        a_req, b_req = (num(need(draft, key, "batch.draft."), f"batch.draft.{key}") for key in ("a_req", "b_req"))
        return cls(base=base, gamma=dict(sorted(gamma.items())), a_req=a_req, b_req=b_req, n_experts=n_experts,
                   top_k=top_k, extra={k: v for k, v in batch.items()
                                       if k not in ("n_experts", "top_k", "by_m", "draft")})

    @classmethod
    def read(cls, path: str | Path) -> "BatchCostModel":
        return cls.from_dict(read_json(path, "batch cost model", CostModelError),
                             origin=f"batch cost model {Path(path)}")

    def to_dict(self) -> dict[str, Any]:
        out = self.base.to_dict()
        out["batch"] = {"n_experts": self.n_experts, "top_k": self.top_k,
                        "by_m": {str(m): {"gamma": self.gamma[m]} for m in sorted(self.gamma)},
                        "draft": {"a_req": self.a_req, "b_req": self.b_req}, **dict(self.extra)}
        return out

    def write(self, path: str | Path) -> Path:
        """Write the JSON (strict; non-finite coefficients raise :class:`CostModelError`)."""
        values = {"batch.draft.a_req": self.a_req, "batch.draft.b_req": self.b_req,
                  **{f"batch.by_m.{m}.gamma": v for m, v in self.gamma.items()}}
        return _write(path, self.to_dict(), ("batch cost model", values), ("cost model", self.base._coefficients()))

    @property
    def ms(self) -> list[int]:
        return self.base.ms

    def target_ms(self, n: Any, m: Any, u_step: Any, context_total: Any) -> np.ndarray:
        """Target time (ms) of a step with ``n`` requests of ``m`` rows each (arrays broadcast)."""
        m_arr = np.asarray(m, dtype=np.int64)
        base = self.base.target_ms(m_arr, u_step, context_total)  # checks every m is priced (gamma has them all)
        return base + _by_m(self.gamma, m_arr) * (np.asarray(n, dtype=float) - 1.0)

    def draft_ms(self, n: Any, k: Any) -> np.ndarray:
        """Drafter time (ms) of ``k`` steps for ``n`` requests; 0 when k = 0."""
        k_arr = np.asarray(k, dtype=float)
        extra = (np.asarray(n, dtype=float) - 1.0) * (self.a_req * k_arr + self.b_req)
        return np.where(k_arr > 0, self.base.a * k_arr + self.base.b + extra, 0.0)

    def step_terms(self, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """:meth:`step_ms` as a line (the batch :meth:`CostModel.action_terms`): ``(fixed, per_req, alpha, c)``
        by k = 0..k_max, ``step_ms = fixed[k] + (n - 1) per_req[k] + alpha[k] Ū + c L`` (NaN: no m = k + 1)."""
        ks = np.arange(k_max + 1)
        fixed, alpha = self.base.action_terms(k_max)
        gamma = np.array([self.gamma.get(int(k) + 1, np.nan) for k in ks])
        per_req = gamma + np.where(ks > 0, self.a_req * ks + self.b_req, 0.0)
        return fixed, per_req, alpha, float(self.base.c)

    def step_prices(self, n: Any, k: Any, u_step: Any, context_total: Any,
                    terms: tuple[np.ndarray, np.ndarray, np.ndarray, float]) -> np.ndarray:
        """:meth:`step_ms` from :meth:`step_terms` for arrays of integer ``k`` (the Oracle's batch solvers)."""
        fixed, per_req, alpha, c = terms
        return fixed[k] + (n - 1.0) * per_req[k] + alpha[k] * u_step + c * context_total

    def step_ms(self, n: Any, k: Any, u_step: Any, context_total: Any) -> np.ndarray:
        """Cost of one shared round: ``draft_ms(n, k) + target_ms(n, k + 1, Ū, L_total)``."""
        k_arr = np.asarray(k, dtype=np.int64)
        return self.draft_ms(n, k_arr) + self.target_ms(n, k_arr + 1, u_step, context_total)

    @classmethod
    def from_batch1(cls, base: CostModel, n_experts: int, top_k: int, gamma: Mapping[int, float] | float = 0.0,
                    a_req: float = 0.0, b_req: float = 0.0) -> "BatchCostModel":
        """A batch model from a batch-1 one plus per-request terms (a what-if, or a planted truth)."""
        g = {m: float(gamma) for m in base.ms} if np.isscalar(gamma) else {int(m): float(v) for m, v in gamma.items()}
        return cls(base=base, gamma=g, a_req=float(a_req), b_req=float(b_req), n_experts=int(n_experts),
                   top_k=int(top_k))
