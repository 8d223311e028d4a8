"""What each table of the final-model section needs of a sweep, as data: :data:`REQUIREMENTS` (the text
a skip quotes), :data:`TABLES` (the steps each table rests on) and :class:`Skips` (what a trace cannot
give, recorded by step, never by the text of its name).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from speclimits.errors import SpeclimitsError

#: Step -> what it needs of a sweep's K > 0 rounds (the cost model itself needs only an m whose Ū varies).
REQUIREMENTS = {
    "per_k": "a per-K fit needs rounds at that K whose Ū and L vary",
    "per_k_cv": "per-K cross-validation needs >= 5 generations at that K (GroupKFold(5) by generation)",
    "cross_validation": "the cross-validated tables need >= 5 generations with K > 0 (GroupKFold(5) by generation)",
    "categorical_cv": ("the categorical model's cross-validation needs every m (or pooled group of m) in the "
                       "training rounds of each GroupKFold fold: >= 2 generations per m spread over the folds"),
    "pooled": "the pooled model with γ·K needs >= 2 values of K > 0",
    "comparison": ("the comparison of Ū + L, the pooled model and the categorical model needs >= 2 values of "
                   "K > 0 and >= 5 generations"),
    "mape_by_k": "MAPE by K needs the pooled model and the categorical cross-validation (>= 2 values of K > 0)",
    "leave_one_k_out": "leave-one-K-out needs >= 3 values of K > 0",
    "smooth_linear": "leave-one-K-out of the linear form in m needs >= 3 values of K > 0",
    "smooth_quadratic": "leave-one-K-out of the quadratic form in m needs >= 4 values of K > 0",
    "smooth_log": "leave-one-K-out of the log-m form needs >= 3 values of K > 0",
    "smooth_hinge": ("leave-one-K-out of the hinge after m = 4 needs rounds on both sides of the hinge in every "
                     "training set: >= 2 values of K <= 2 and >= 2 values of K >= 4 (e.g. K = 1..5)"),
    "boundary": ("the regime boundary needs >= 2 values of m among the K > 0 rounds and every m in the "
                 "training rounds of each fold (nested GroupKFold(5))"),
    "regimes": "the regime rows need per-K fits (and two regimes: values of K on both sides of the split)",
    "interpolation": "interpolation within a regime needs three consecutive values of K > 0 (m - 1, m, m + 1)",
    "ladder": "a specification-ladder row needs its columns to vary and >= 5 generations",
    "draft": "the draft line needs >= 2 values of K > 0 with non-zero draft times and >= 5 generations for its CV",
}

#: The steps a skip is recorded at: a requirement's key, or ``smooth`` (any smooth form in m).
STEPS = (*REQUIREMENTS, "smooth")

#: Table -> the steps whose skip leaves it None or empty (the first step skipped is the reason given).
TABLES: dict[str, tuple[str, ...]] = {
    "per_k": ("per_k",), "pooled": ("pooled",), "pooled_std": ("pooled",), "comparison": ("comparison",),
    "mape_by_k": ("mape_by_k",), "loko": ("leave_one_k_out",), "smooth": ("leave_one_k_out",),
    "boundary": ("boundary",), "regimes": ("regimes",), "interpolation": ("boundary", "regimes", "interpolation"),
    "interpolation_paper": ("regimes", "interpolation"), "ladder": ("cross_validation",),
}


class Skip(NamedTuple):
    """One thing a trace cannot give: its ``step``, ``name`` as printed, and ``why``."""

    step: str
    name: str
    why: str


class Skips:
    """Collects the :class:`Skip` records of one fit; ``have`` describes the trace."""

    def __init__(self, have: str):
        self.have, self.records = have, []

    def add(self, step: str, name: str, needs: str | None = None, exc: Exception | None = None) -> None:
        """Record ``name`` as skipped at ``step``; ``needs`` defaults to the step's requirement."""
        if step not in STEPS:
            raise KeyError(f"unknown step {step!r}")
        detail = self.have if exc is None else f"{self.have}; {exc}"
        self.records.append(Skip(step, name, f"{needs or REQUIREMENTS[step]} (this trace: {detail})"))

    def need(self, step: str, name: str, ok: bool, needs: str | None = None) -> bool:
        """``ok``; when False, ``name`` is recorded as skipped."""
        if not ok:
            self.add(step, name, needs)
        return ok

    def run(self, step: str, name: str, fn: Callable[[], Any], needs: str | None = None) -> Any:
        """``fn()``, or None with ``name`` recorded when it raises a :class:`SpeclimitsError`."""
        try:
            return fn()
        except SpeclimitsError as exc:
            self.add(step, name, needs, exc)
            return None
