"""Does the Oracle's world reproduce the measured static-K sweep on the same prompts?

Evaluating each static K inside the Oracle's model (``OracleBounds.static_ms``) must give the speedups
the sweep (``rounds.parquet``) measured on the same prompts; when it does not, the bound is a bound on
a different world (the methods page, "The surrogate"). Measured time of a K run: target plus draft time
of its decode rounds per token they emitted (the prefill is outside both views); speedup: K = 0 time
per token over K's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.oracle.prepare import OracleSetup, surrogate_variants
from speclimits.oracle.solver import OracleResult
from speclimits.vocabulary import HEADLINE_KIND

#: A static K whose predicted speedup is off by more than this (relative) triggers a warning.
TOLERANCE = 0.05


@dataclass(frozen=True)
class SweepValidation:
    """Measured against predicted static-K speedups on one set of reference sequences.

    Attributes
    ----------
    table : one row per K >= 1 swept: ``K``, ``measured_ms_per_token``, ``predicted_ms_per_token``,
        ``measured_speedup``, ``predicted_speedup``, ``rel_error`` (predicted / measured speedup - 1;
        of ms per token when the sweep has no K = 0 or the cost model no m = 1).
    kind : the reference kind validated (``greedy``, ``teacher-forced``) or ``all``.
    surrogate : the surrogate's label.
    n_sequences : reference sequences (= prompts) compared.
    """

    table: pd.DataFrame
    kind: str
    surrogate: str
    n_sequences: int
    tolerance: float = TOLERANCE

    @property
    def max_abs_rel_error(self) -> float:
        return float(self.table["rel_error"].abs().max())

    @property
    def worst_k(self) -> int:
        return int(self.table.loc[self.table["rel_error"].abs().idxmax(), "K"])

    @property
    def warning(self) -> str | None:
        """A one-line warning when some static K is off by more than the tolerance, else None."""
        if self.max_abs_rel_error <= self.tolerance:
            return None
        return (f"the Oracle's model ({self.surrogate}) misses the measured static-K sweep by "
                f"{100 * self.max_abs_rel_error:.1f}% at K = {self.worst_k} (tolerance {100 * self.tolerance:.0f}%): "
                "its bound describes a different world than the measurement")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "surrogate": self.surrogate, "n_sequences": self.n_sequences,
                "rows": self.table.to_dict(orient="records"), "max_abs_rel_error": self.max_abs_rel_error,
                "worst_k": self.worst_k, "tolerance": self.tolerance, "warning": self.warning}


def measured_by_k(rounds: pd.DataFrame, prompt_ids: np.ndarray | list[str]) -> pd.DataFrame:
    """Per K, over the generations of ``prompt_ids``: ``generations``, ``tokens``, ``ms``, ``ms_per_token``
    (decode rounds only)."""
    sel = rounds["prompt_id"].astype(str).isin([str(p) for p in prompt_ids]).to_numpy()
    dec = rounds.loc[sel & (rounds["phase"].astype(str) == "decode").to_numpy()]
    if dec.empty:
        raise SpeclimitsError("no decode rounds of the reference prompts in rounds.parquet: the sweep and the "
                              "Oracle's references do not cover the same prompts")
    g = dec.groupby("K")
    out = pd.DataFrame({"generations": g["generation_id"].nunique(), "tokens": g["n_emitted"].sum(),
                        "ms": g["t_target_ms"].sum() + g["t_draft_ms"].sum()})
    out["ms_per_token"] = out["ms"] / out["tokens"]
    return out


def validate_against_sweep(setup: OracleSetup, kind: str | None = HEADLINE_KIND, k_max: int | None = None,
                           result: OracleResult | None = None) -> SweepValidation:
    """Compare the Oracle's static-K speedups with the measured sweep on the same prompts.

    Parameters
    ----------
    setup : from :func:`~speclimits.oracle.prepare.prepare_oracle`.
    kind : the reference kind to validate on (``greedy``: the paper's setting), or None for all.
    k_max : largest K compared (default: the Oracle's).
    result : the solved Oracle of ``setup`` restricted to ``kind`` (solved here when not given).
    """
    sub = setup if kind is None else setup.for_kind(kind)
    res = sub.solve(k_max=k_max) if result is None else result
    measured = measured_by_k(sub.trace.rounds, sub.inputs.seq_ids)["ms_per_token"]
    bd = res.bounds  # the Oracle's model's ms per token of each static K, and of K = 0 when it has m = 1
    predicted = {int(k): v / bd.n_tokens for k, v in bd.static_ms.items()}
    if bd.autoregressive_ms is not None:
        predicted[0] = bd.autoregressive_ms / bd.n_tokens
    ks = [k for k in measured.index if k >= 1 and k in predicted]
    if not ks:
        raise SpeclimitsError("the sweep and the Oracle have no static K >= 1 in common")
    table = pd.DataFrame({"K": ks, "measured_ms_per_token": measured.loc[ks].to_numpy(),
                          "predicted_ms_per_token": [predicted[k] for k in ks]})
    if 0 in measured.index and 0 in predicted:
        table["measured_speedup"] = measured.loc[0] / table["measured_ms_per_token"]
        table["predicted_speedup"] = predicted[0] / table["predicted_ms_per_token"]
        table["rel_error"] = table["predicted_speedup"] / table["measured_speedup"] - 1
    else:
        table["measured_speedup"] = table["predicted_speedup"] = np.nan
        table["rel_error"] = table["predicted_ms_per_token"] / table["measured_ms_per_token"] - 1
    return SweepValidation(table=table, kind=kind or "all", surrogate=sub.surrogate_label,
                           n_sequences=sub.inputs.n_sequences)


def validation_by_surrogate(setup: OracleSetup, kind: str | None = HEADLINE_KIND, k_max: int | None = None) -> pd.DataFrame:
    """:func:`validate_against_sweep` under each surrogate, stacked: ``surrogate``, ``K``,
    ``measured_speedup``, ``predicted_speedup``, ``rel_error`` (and the ms-per-token columns)."""
    parts = []
    for variant in surrogate_variants(setup).values():
        v = validate_against_sweep(variant, kind=kind, k_max=k_max)
        parts.append(v.table.assign(surrogate=v.surrogate))
    cols = ["surrogate", "K", "measured_speedup", "predicted_speedup", "rel_error", "measured_ms_per_token",
            "predicted_ms_per_token"]
    return pd.concat(parts, ignore_index=True)[cols]
