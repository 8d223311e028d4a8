"""The one route from a trace to what the Oracle solves: inputs, cost model, surrogate, notes.

Every consumer (``speclimits oracle``, ``speclimits linguistic``, the book, the online policies, the
benchmarks) calls :func:`prepare_oracle`, so all solve the same problem with the same defaults:

* **cost model**: the JSON given (a path or a :class:`CostModel`), else
  :func:`speclimits.stats.fit_trace_cost_model` on the trace (the fit ``speclimits fit --out`` writes);
* **surrogate** for the transition probabilities: ``raw`` (the draft's recorded probability of the
  reference token), ``calibrated`` (mapped through per-position isotonic fits to the observed greedy
  matches, cross-fitted by sequence), ``exact`` (the observed greedy match length: deterministic
  transitions), or ``auto`` (default): ``calibrated`` when the observed greedy match rate differs from
  the mean recorded probability by at least :data:`GAP_MIN` with a 95% interval over sequences that
  excludes 0, else ``raw``.

>>> setup = prepare_oracle("data/traces/measured-eagle3")        # doctest: +SKIP
>>> print("\\n".join(setup.notes)); print(setup.solve().summary())  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.costmodel import CostModel
from speclimits.errors import Problem, SpeclimitsError, TraceFormatError
from speclimits.oracle.calibration import cross_fitted_match_prob, gap_interval
from speclimits.oracle.inputs import FILE, OracleInputs
from speclimits.oracle.solver import OracleResult, solve
from speclimits.stats import fit_trace_cost_model
from speclimits.trace import Trace, read_trace
from speclimits.trace.prompts import PROMPTS_FILE, read_prompts
from speclimits.vocabulary import (AUTO, CALIBRATED, EXACT, GREEDY, RAW, REFERENCE_KINDS, SURROGATES,
                                   TEACHER_FORCED, headline_kind)
#: Smallest calibration gap (observed match rate - mean q) for which ``auto`` calibrates.
GAP_MIN = 0.02
#: How each resolved surrogate is named in tables and JSON.
SURROGATE_LABELS = {RAW: "raw q", CALIBRATED: "calibrated q", EXACT: "exact greedy (accept_len)"}


@dataclass(frozen=True, eq=False)
class OracleSetup:
    """Everything the Oracle solves on one trace, and how it was chosen.

    Attributes
    ----------
    trace : the trace.
    inputs : the Oracle inputs with ``match_prob`` as the surrogate uses it (calibrated or raw).
    raw_inputs : the inputs as recorded in ``oracle.parquet``.
    model : the cost model.
    surrogate : the resolved surrogate, ``raw`` | ``calibrated`` | ``exact``.
    calibration_gap : ``(gap, lo, hi)``: observed greedy match rate minus mean recorded
        ``match_prob``, with its 95% interval over sequences (the evidence for ``auto``).
    notes : one line each: where the cost model came from, which surrogate and why.
    kinds : (S,) reference kind of each sequence of ``inputs`` (:data:`REFERENCE_KINDS`), in
        the order of ``inputs.seq_ids``.
    """

    trace: Trace
    inputs: OracleInputs
    raw_inputs: OracleInputs
    model: CostModel
    surrogate: str
    calibration_gap: tuple[float, float, float]
    notes: tuple[str, ...]
    kinds: np.ndarray

    @property
    def deterministic(self) -> bool:
        """True when transitions follow the observed greedy match lengths (``exact``)."""
        return self.surrogate == EXACT

    @property
    def surrogate_label(self) -> str:
        return SURROGATE_LABELS[self.surrogate]

    def solve(self, k_max: int | None = None, allow_k0: bool = False, alpha_scale: float = 1.0,
              model: CostModel | None = None) -> OracleResult:
        """:func:`~speclimits.oracle.solver.solve` on these inputs, cost model and surrogate."""
        return solve(self.inputs, self.model if model is None else model, k_max=k_max, allow_k0=allow_k0,
                     deterministic=self.deterministic, alpha_scale=alpha_scale)

    def priced_k_max(self, k_max: int | None = None) -> tuple[int, str | None]:
        """:func:`priced_k_max` of this setup's cost model, ``k_max`` (default: the length of the
        trace's ``match_prob`` lists) capped at that length first."""
        asked = self.inputs.k_list if k_max is None else min(int(k_max), self.inputs.k_list)
        return priced_k_max(self.model, asked)

    def kind_counts(self) -> dict[str, int]:
        """Sequences of each reference kind present."""
        return {k: int((self.kinds == k).sum()) for k in REFERENCE_KINDS if (self.kinds == k).any()}

    @property
    def headline_kind(self) -> str:
        """The reference kind the headline is on (:func:`~speclimits.vocabulary.headline_kind`): greedy
        (the paper's setting) when the trace has it, sampled in a sampled trace, else teacher-forced."""
        return headline_kind(self.kind_counts())

    def for_kind(self, kind: str) -> "OracleSetup":
        """The same setup restricted to the sequences of one reference kind (calibrated
        probabilities stay those cross-fitted over all sequences)."""
        if kind not in REFERENCE_KINDS:
            raise SpeclimitsError(f"reference kind must be one of {REFERENCE_KINDS}, got {kind!r}")
        seqs = np.flatnonzero(self.kinds == kind)
        if not seqs.size:
            raise SpeclimitsError(f"{self.trace.path}: no {kind} reference sequences (kinds present: "
                                  f"{self.kind_counts()})")
        return replace(self, inputs=self.inputs.subset(seqs), raw_inputs=self.raw_inputs.subset(seqs),
                       kinds=self.kinds[seqs])

    def for_sequences(self, ids: Sequence[str]) -> "OracleSetup":
        """The same setup restricted to the sequences whose id is in ``ids`` (in this setup's order;
        ids it does not hold are ignored). Raises when none is left."""
        wanted = {str(i) for i in ids}
        seqs = np.flatnonzero([str(s) in wanted for s in self.inputs.seq_ids])
        if not seqs.size:
            raise SpeclimitsError(f"{self.trace.path}: none of the {len(wanted)} requested sequences is a reference "
                                  f"of this setup")
        return replace(self, inputs=self.inputs.subset(seqs), raw_inputs=self.raw_inputs.subset(seqs),
                       kinds=self.kinds[seqs])

    def to_dict(self) -> dict[str, Any]:
        return {"trace": str(self.trace.path), "simulated": self.trace.simulated, "surrogate": self.surrogate,
                "surrogate_label": self.surrogate_label,
                "calibration_gap": dict(zip(("gap", "lo", "hi"), self.calibration_gap)),
                "reference_kinds": self.kind_counts(), "notes": list(self.notes),
                "cost_model": self.model.to_dict()}


def load_inputs(trace: Trace | str | Path) -> OracleInputs:
    """The Oracle inputs of a trace (a :class:`~speclimits.trace.Trace` or a path), as recorded.

    A sampled trace (``oracle.parquet`` has ``accept_prob``: ``speclimits trace --temperature``) gives
    ``accept_prob`` as the match probability: vLLM's rejection sampler accepts a greedy draft with the
    target's probability of it, which along a sampled reference is the probability that the draft
    equals the reference's next token (:mod:`speclimits.tracing.oracle_mode`)."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    if tr.oracle is None:
        raise TraceFormatError(str(tr.path), [Problem(FILE, None, "is missing: this trace has no Oracle data")])
    frame = tr.oracle
    if "accept_prob" in frame.columns:
        frame = frame.assign(match_prob=frame["accept_prob"])
    return OracleInputs.from_frame(frame, origin=str(tr.path / FILE))


def reference_kinds(trace: Trace, seq_ids: np.ndarray) -> tuple[np.ndarray, str]:
    """``(kinds, how)``: the reference kind of each sequence id, and how it was found.

    From ``oracle.parquet``'s ``reference_kind`` column where the trace has one; a simulated
    trace's references are the simulated target's greedy output; a measured trace without the
    column is read against the prompt file the harness copied into it (``prompts.jsonl``, read by
    :func:`~speclimits.trace.prompts.read_prompts`, ids as the harness gave them): a prompt with
    ``reference``/``reference_token_ids`` was teacher-forced.
    """
    ids = np.asarray(seq_ids).astype(str)
    oracle = trace.oracle
    if oracle is not None and "reference_kind" in oracle.columns:
        by_seq = oracle.groupby(oracle["seq_id"].astype(str))["reference_kind"].first().astype(str)
        kinds = by_seq.reindex(ids).to_numpy(dtype=object)
        bad = [str(k) for k in set(kinds) if k not in REFERENCE_KINDS]
        if bad:
            raise TraceFormatError(str(trace.path), [Problem(FILE, "reference_kind",
                                                             f"unknown kinds {bad}; expected {REFERENCE_KINDS}")])
        return kinds, "oracle.parquet column reference_kind"
    if trace.simulated:
        return np.full(len(ids), GREEDY, dtype=object), "simulated: the simulated target's greedy output"
    prompts = trace.path / PROMPTS_FILE
    if prompts.exists():
        forced = [p.id for p in read_prompts(prompts) if p.teacher_forced]
        kinds = np.where(np.isin(ids, forced), TEACHER_FORCED, GREEDY).astype(object)
        return kinds, f"{prompts.name}: prompts with a held-out reference were teacher-forced"
    return np.full(len(ids), GREEDY, dtype=object), "no record of the reference kind: assumed greedy"


def resolve_cost_model(trace: Trace, cost_model: CostModel | str | Path | None) -> tuple[CostModel, str]:
    """``(model, note)`` for a cost model given as an object, a JSON path, or None (fit on the trace)."""
    if isinstance(cost_model, CostModel):
        return cost_model, f"cost model given ({cost_model.source or 'no source recorded'})"
    if cost_model is not None:
        return CostModel.read(cost_model), f"cost model {cost_model}"
    return fit_trace_cost_model(trace), f"cost model fitted on {trace.path}/rounds.parquet (joint categorical fit)"


def resolve_surrogate(surrogate: str, gap: tuple[float, float, float]) -> tuple[str, str]:
    """``(resolved, reason)`` for a surrogate choice; ``auto`` decides on the calibration gap
    ``(gap, lo, hi)`` (see the module docstring)."""
    if surrogate not in SURROGATES:
        raise SpeclimitsError(f"surrogate must be one of {', '.join(SURROGATES)}, got {surrogate!r}")
    if surrogate != AUTO:
        return surrogate, "as requested"
    est, lo, hi = gap
    evidence = f"observed greedy match rate - mean q = {est:+.3f} [{lo:+.3f}; {hi:+.3f}]"
    if abs(est) >= GAP_MIN and not lo <= 0 <= hi:
        return CALIBRATED, f"auto: the draft's probabilities are miscalibrated, {evidence}"
    return RAW, f"auto: no calibration gap, {evidence}"


def surrogate_inputs(raw: OracleInputs, surrogate: str) -> OracleInputs:
    """The inputs a resolved surrogate solves: cross-fitted calibrated ``match_prob`` for
    ``calibrated``, the recorded ones otherwise (``exact`` ignores them)."""
    return cross_fitted_match_prob(raw) if surrogate == CALIBRATED else raw


#: Why a trace without ``oracle.parquet`` gives no Oracle (``speclimits oracle`` and the book's pages say it).
NO_ORACLE_DATA = ("this trace has no Oracle data (traced without --oracle): no oracle.parquet; `speclimits fit` still "
                  "fits its cost model, and `speclimits trace --oracle` on the same models adds the Oracle data")


def oracle_data_missing(trace: Trace | str | Path) -> str | None:
    """:data:`NO_ORACLE_DATA` when the trace directory has no ``oracle.parquet`` (``speclimits trace``
    without ``--oracle``: rounds and tokens only, which ``validate`` passes), else None."""
    path = Path(trace.path if isinstance(trace, Trace) else trace)
    return None if (path / "oracle.parquet").exists() else NO_ORACLE_DATA


def priced_k_max(model: CostModel, k_max: int) -> tuple[int, str | None]:
    """The longest draft the Oracle can solve with under ``model``, and why it is shorter than ``k_max``.

    ``k_max`` capped at the longest draft the cost model prices together with every shorter one
    (m = 2..top present: a sweep K = 0, 2, 4 prices drafts of up to 4 tokens, though the Oracle data may
    hold 10 positions). Returns ``(k_max, None)`` when nothing is capped, else the capped value and one
    sentence saying why and what sweep would price the longer drafts. Raises where the cost model prices
    no draft (no m = 2)."""
    ms = set(model.ms)
    top = 1
    while top + 1 in ms:
        top += 1
    if top < 2:
        raise SpeclimitsError(f"the cost model prices no draft (no m = 2; it covers m = {sorted(ms)}): the "
                              "Oracle needs a sweep with K >= 1")
    if top - 1 >= k_max:
        return int(k_max), None
    return top - 1, (f"the cost model prices drafts of up to {top - 1} tokens (m = 2..{top}, from the sweep's K up "
                     f"to {top - 1}), so K_max is {top - 1} here, not {k_max}; a sweep up to K = {k_max} would price "
                     "the longer drafts")


def prepare_oracle(trace: Trace | str | Path, cost_model: CostModel | str | Path | None = None,
                   surrogate: str = AUTO) -> OracleSetup:
    """Load a trace's Oracle inputs, choose the cost model and the surrogate; see the module docstring.

    Parameters
    ----------
    trace : a trace directory or an open :class:`~speclimits.trace.Trace`.
    cost_model : a :class:`CostModel`, a cost-model JSON path, or None (fit on the trace's rounds).
    surrogate : one of :data:`SURROGATES`.
    """
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    raw = load_inputs(tr)
    model, model_note = resolve_cost_model(tr, cost_model)
    gap = gap_interval(raw)
    resolved, reason = resolve_surrogate(surrogate, gap)
    inputs = surrogate_inputs(raw, resolved)
    kinds, how = reference_kinds(tr, raw.seq_ids)
    counts = ", ".join(f"{int((kinds == k).sum())} {k}" for k in REFERENCE_KINDS if (kinds == k).any())
    notes = (model_note, f"surrogate: {SURROGATE_LABELS[resolved]} ({reason})",
             f"reference sequences: {counts} ({how})")
    return OracleSetup(trace=tr, inputs=inputs, raw_inputs=raw, model=model, surrogate=resolved,
                       calibration_gap=gap, notes=notes, kinds=kinds)


def surrogate_variants(setup: OracleSetup) -> dict[str, OracleSetup]:
    """The same setup under each of the three surrogates, keyed ``raw``, ``calibrated``, ``exact``."""
    out = {}
    for name in (RAW, CALIBRATED, EXACT):
        if name == setup.surrogate:
            out[name] = setup
            continue
        out[name] = replace(setup, inputs=surrogate_inputs(setup.raw_inputs, name), surrogate=name,
                            notes=(setup.notes[0], f"surrogate: {SURROGATE_LABELS[name]} (variant)", *setup.notes[2:]))
    return out


def compare_surrogates(setup: OracleSetup, k_max: int | None = None) -> pd.DataFrame:
    """The Oracle's bounds under the three surrogates (rows ``raw q``, ``calibrated q``,
    ``exact greedy (accept_len)``): speedup, best static K and its speedup, gain, mean accepted."""
    rows = {}
    for name, variant in surrogate_variants(setup).items():
        b = variant.solve(k_max=k_max).bounds
        rows[SURROGATE_LABELS[name]] = {
            "oracle_speedup": b.speedup, "best_static_k": b.best_static_k, "best_static_speedup": b.best_static_speedup,
            "gain_over_best_static": b.gain_over_best_static, "mean_accepted": b.mean_accepted}
    return pd.DataFrame(rows).T
