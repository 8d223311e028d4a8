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
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speclimits.errors import CostModelError
from speclimits.jsonutil import dumps, read_json


@dataclass(frozen=True)
class CostModel:
    """Round-cost model.

    Attributes
    ----------
    c : ms per context token (shared across m).
    beta0 : ``{m: intercept in ms}``.
    alpha : ``{m: ms per unique expert}``.
    a, b : draft time ``a * k + b`` in ms.
    source : free text: where the numbers came from (fit on which trace, planted truth, hand edit).
    """

    c: float
    beta0: Mapping[int, float]
    alpha: Mapping[int, float]
    a: float
    b: float
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "cost model") -> "CostModel":
        """Build from the JSON structure; errors name the missing or bad field."""

        def need(obj: Any, key: str, where: str) -> Any:
            if not isinstance(obj, Mapping) or key not in obj:
                raise CostModelError(f"{origin}: missing '{where}{key}'")
            return obj[key]

        def num(value: Any, where: str) -> float:
            try:
                out = float(value)
            except (TypeError, ValueError):
                raise CostModelError(f"{origin}: '{where}' must be a number, got {value!r}") from None
            if not np.isfinite(out):
                raise CostModelError(f"{origin}: '{where}' must be finite, got {value!r}")
            return out

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

    def write(self, path: str | Path) -> Path:
        """Write the JSON (strict, as every writer of the package: :func:`speclimits.jsonutil.dumps`);
        a non-finite coefficient raises :class:`CostModelError` instead of writing a file that
        :meth:`read` would refuse."""
        coefficients = {"target.c": self.c, "draft.a": self.a, "draft.b": self.b,
                        **{f"target.by_m.{m}.beta0": v for m, v in self.beta0.items()},
                        **{f"target.by_m.{m}.alpha": v for m, v in self.alpha.items()}}
        bad = [name for name, v in coefficients.items() if not np.isfinite(v)]
        if bad:
            raise CostModelError(f"cost model {path}: not written, non-finite coefficients {', '.join(bad)}")
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dumps(self.to_dict(), indent=2) + "\n")
        return p

    def with_alpha_scale(self, scale: float) -> "CostModel":
        """The same model with every ``alpha(m)`` multiplied by ``scale`` (0 = the α = 0 ablation)."""
        return replace(self, alpha={m: v * scale for m, v in self.alpha.items()})

    # -- evaluation -------------------------------------------------------
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
        b0 = np.vectorize(self.beta0.__getitem__, otypes=[float])(m_arr) if m_arr.size else m_arr * 0.0
        al = np.vectorize(self.alpha.__getitem__, otypes=[float])(m_arr) if m_arr.size else m_arr * 0.0
        return b0 + al * np.asarray(u_bar, dtype=float) + self.c * np.asarray(context_len, dtype=float)

    def draft_ms(self, k: Any) -> np.ndarray:
        """Draft time (ms) of ``k`` draft steps; 0 when k = 0 (plain autoregressive step)."""
        k_arr = np.asarray(k, dtype=float)
        return np.where(k_arr > 0, self.a * k_arr + self.b, 0.0)

    def round_ms(self, k: Any, u_bar: Any, context_len: Any) -> np.ndarray:
        """Cost of a speculative round (ms) that drafts ``k`` tokens and verifies ``m = k + 1`` rows:
        ``draft_ms(k) + target_ms(k + 1, u_bar, context_len)`` (arrays broadcast). ``k = 0`` is a
        plain autoregressive step (no draft cost, m = 1)."""
        k_arr = np.asarray(k, dtype=np.int64)
        return self.draft_ms(k_arr) + self.target_ms(k_arr + 1, u_bar, context_len)

    def coefficients_by_m(self, m_max: int) -> tuple[np.ndarray, np.ndarray]:
        """``(beta0, alpha)`` as arrays indexed by m = 0..m_max; NaN where the model has no such m
        (index 0 is always NaN)."""
        beta0 = np.full(m_max + 1, np.nan)
        alpha = np.full(m_max + 1, np.nan)
        for m in range(1, m_max + 1):
            if m in self.beta0:
                beta0[m], alpha[m] = self.beta0[m], self.alpha[m]
        return beta0, alpha

    def action_terms(self, k_max: int) -> tuple[np.ndarray, np.ndarray]:
        """The round cost of action k = 0..k_max as a line in Ū and L, for vectorised solvers:
        ``round_ms(k, u, L) = fixed[k] + slope[k] * u + c * L`` with ``fixed[k] = draft_ms(k) +
        beta0(k + 1)`` and ``slope[k] = alpha(k + 1)`` (NaN where the model has no m = k + 1)."""
        beta0, alpha = self.coefficients_by_m(k_max + 1)
        ks = np.arange(k_max + 1)
        return self.draft_ms(ks) + beta0[ks + 1], alpha[ks + 1]
