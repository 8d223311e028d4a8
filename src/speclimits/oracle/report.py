"""What ``speclimits oracle`` reports and section 6 of the book shows: the bound on all references, by
reference kind, the headline with its interval and with k = 0 allowed, and the validation against the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.bootstrap import HEADLINE_N_BOOT
from speclimits.arms import label_kind
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle.prepare import OracleSetup, prepare_oracle
from speclimits.oracle.solver import OracleResult
from speclimits.oracle.uncertainty import BoundInterval, bootstrap_bound
from speclimits.oracle.validation import SweepValidation, validate_against_sweep
from speclimits.trace import Trace
from speclimits.vocabulary import REFERENCE_KINDS


#: The label :func:`speclimits.control.compare.compare_policies` gives the bound's row of its table.
ORACLE_POLICY = "Oracle (bound)"


def policy_kind(label: str) -> str:
    """``static``, ``oracle`` or ``online`` for a row label of ``PolicyComparison.table`` (tables written
    before :func:`~speclimits.control.compare.compare_policies` added its ``kind`` column)."""
    label = str(label)
    if label == ORACLE_POLICY:
        return "oracle"
    return label_kind(label)


def best_online(table: pd.DataFrame) -> tuple[str, float]:
    """``(policy label, gain_captured)`` of the online rule of ``PolicyComparison.table`` that captures
    the largest share of the Oracle's gain over the best static K (the first such row on a tie)."""
    kind = table["kind"] if "kind" in table.columns else table["policy"].map(policy_kind)
    online = table[kind == "online"]
    if online.empty:
        raise SpeclimitsError("the policy comparison has no online rule (only static K and the Oracle)")
    row = online.loc[online["gain_captured"].idxmax()]
    return str(row["policy"]), float(row["gain_captured"])


@dataclass(frozen=True, eq=False)
class OracleReport:
    """The Oracle on one trace, as reported.

    Attributes
    ----------
    setup : the :class:`OracleSetup` (all sequences).
    result : the Oracle over all sequences (its V(0) total is what every consumer shares).
    by_kind : ``{kind: OracleResult}`` for each reference kind present.
    headline_kind : ``greedy`` when present, ``sampled`` in a sampled trace, else ``teacher-forced``.
    interval : the headline's cost-model bootstrap (None with ``n_boot = 0``).
    with_k0 : the headline's Oracle with plain autoregressive steps allowed (None when the cost
        model has no m = 1 or k = 0 was already allowed).
    validation : the headline kind's static-K speedups against the measured sweep (None when
        the sweep does not cover the references' prompts).
    warnings : lines for the user (validation beyond tolerance, ...).
    """

    setup: OracleSetup
    result: OracleResult
    by_kind: dict[str, OracleResult]
    headline_kind: str
    interval: BoundInterval | None
    with_k0: OracleResult | None
    validation: SweepValidation | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def headline(self) -> OracleResult:
        return self.by_kind[self.headline_kind]

    def kind_table(self) -> pd.DataFrame:
        """One row per reference kind (and ``all``): sequences, Oracle speedup, best static K and its
        speedup, the Oracle's gain over it, mean accepted drafts per round."""
        rows = []
        for kind, res in [*self.by_kind.items(), ("all", self.result)]:
            bd = res.bounds
            rows.append({"references": kind, "sequences": bd.n_sequences, "oracle_speedup": bd.speedup,
                         "best_static_k": bd.best_static_k, "best_static_speedup": bd.best_static_speedup,
                         "gain_over_best_static": bd.gain_over_best_static, "mean_accepted": bd.mean_accepted})
        return pd.DataFrame(rows)

    def to_json(self) -> dict[str, Any]:
        """Top level: the headline (greedy references, as in the book); ``all_references``: the
        Oracle over every sequence (its V(0) total is the one every consumer shares)."""
        out = self.headline.to_json()
        out["headline_kind"] = self.headline_kind
        out["all_references"] = self.result.bounds.to_dict()
        out.update({"trace": str(self.setup.trace.path), "simulated": self.setup.trace.simulated,
                    "cost_model_note": self.setup.notes[0], "surrogate": self.setup.surrogate_label,
                    "calibration_gap": self.setup.to_dict()["calibration_gap"], "notes": list(self.setup.notes),
                    "reference_kinds": self.setup.kind_counts()})
        out["by_kind"] = {k: r.bounds.to_dict() for k, r in self.by_kind.items()}
        head = {"kind": self.headline_kind, **self.headline.bounds.to_dict()}
        head["interval"] = None if self.interval is None else self.interval.to_dict()
        head["with_k0"] = None if self.with_k0 is None else {
            "speedup": self.with_k0.bounds.speedup, "gain_over_best_static": self.with_k0.bounds.gain_over_best_static,
            "share_of_states_k0": float((self.with_k0.k_star == 0).mean())}
        out["headline"] = head
        out["validation"] = None if self.validation is None else self.validation.to_dict()
        out["warnings"] = list(self.warnings)
        return out

    def summary(self) -> str:
        lines = [self.setup.trace.source_label, *self.setup.notes,
                 f"headline: {self.headline_kind} references (as in the book)", self.headline.summary(), ""]
        lines.append(self.kind_table().round(3).to_string(index=False))
        if self.interval is not None:
            lines.append(f"\nheadline ({self.headline_kind} references): Oracle speedup "
                         f"{self.interval.cell('speedup')}, gain over best static K = {self.interval.best_static_k} "
                         f"{self.interval.cell('gain_over_best_static')} (95% intervals, {self.interval.n_boot} "
                         "cost-model bootstrap replicates)")
        if self.with_k0 is not None:
            b = self.with_k0.bounds
            lines.append(f"with k = 0 allowed: Oracle speedup {b.speedup:.3f}, gain {b.gain_over_best_static:.3f}, "
                         f"k* = 0 in {(self.with_k0.k_star == 0).mean():.1%} of states")
        if self.validation is not None:
            v = self.validation
            lines.append(f"\nvalidation on the {v.kind} references ({v.n_sequences} prompts): static-K speedups, "
                         f"measured vs the Oracle's model ({v.surrogate}); largest error "
                         f"{100 * v.max_abs_rel_error:.1f}% at K = {v.worst_k}")
            lines.append(v.table.round(3).to_string(index=False))
        return "\n".join(lines)


def oracle_report(trace: Trace | str | Path, cost_model: CostModel | str | Path | None = None,
                  surrogate: str = "auto", k_max: int | None = None, allow_k0: bool = False,
                  alpha_scale: float = 1.0, n_boot: int = HEADLINE_N_BOOT, seed: int = 0,
                  setup: OracleSetup | None = None, progress: bool = False) -> OracleReport:
    """Solve and report the Oracle on a trace (see :class:`OracleReport`); ``setup`` skips the
    preparation when the caller has one; ``progress`` shows the interval's progress bars."""
    setup = prepare_oracle(trace, cost_model, surrogate) if setup is None else setup
    result = setup.solve(k_max=k_max, allow_k0=allow_k0, alpha_scale=alpha_scale)
    kinds = [k for k in REFERENCE_KINDS if k in setup.kind_counts()]
    by_kind = {k: setup.for_kind(k).solve(k_max=k_max, allow_k0=allow_k0, alpha_scale=alpha_scale) for k in kinds}
    head_kind = setup.headline_kind
    head_setup = setup.for_kind(head_kind)
    interval = bootstrap_bound(head_setup, k_max=k_max, n_boot=n_boot, seed=seed, allow_k0=allow_k0,
                               result=by_kind[head_kind], progress=progress) \
        if n_boot > 0 and alpha_scale == 1.0 else None
    with_k0 = head_setup.solve(k_max=k_max, allow_k0=True, alpha_scale=alpha_scale) \
        if not allow_k0 and by_kind[head_kind].costs.has_k0 else None
    validation, warnings = None, []
    if alpha_scale == 1.0:  # the α = 0 world is not the one the sweep measured
        try:
            # static-K and autoregressive times do not depend on allow_k0: the solved result serves
            validation = validate_against_sweep(setup, kind=head_kind, k_max=k_max, result=by_kind[head_kind])
        except SpeclimitsError as exc:
            warnings.append(f"no validation against the sweep: {exc}")
    if validation is not None and validation.warning:
        warnings.append(validation.warning)
    return OracleReport(setup=setup, result=result, by_kind=by_kind, headline_kind=head_kind, interval=interval,
                        with_k0=with_k0, validation=validation, warnings=tuple(warnings))
