"""The linguistic study with the two reference kinds apart (the methods page, "Reference kinds and positions").

Greedy references (the target's own output, as in the paper) give the headline; teacher-forced
ones (held-out text the target may disagree with) are a different process and are reported
beside it, never pooled. The Oracle's value is computed per sequence, so one solve on all
sequences gives each kind's k* exactly; the decision table and the contrasts are built once and
split by the sequences' kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits import vocabulary as v
from speclimits.linguistic.contexts import decision_table, k_by_context
from speclimits.linguistic.routing import Contrast, first_mismatch_contrast, routing_table, script_change_contrast
from speclimits.oracle.solver import OracleResult
from speclimits.vocabulary import HEADLINE_KIND


@dataclass(frozen=True)
class KindStudy:
    """The study on the sequences of one reference kind.

    Attributes
    ----------
    kind : ``greedy`` or ``teacher-forced``.
    decisions : :func:`~speclimits.linguistic.decision_table` rows of this kind.
    k_by_context, k_by_fine_label : :func:`~speclimits.linguistic.k_by_context` tables (by ``label``
        and by ``label_fine``), response-cluster intervals.
    contrasts : the three contrasts (script change, first mismatch on the reference, on the window).
    routing : :func:`~speclimits.linguistic.routing_table` of the contrasts.
    note : why a contrast has no events, when it has none (e.g. routing not recorded).
    """

    kind: str
    decisions: pd.DataFrame
    k_by_context: pd.DataFrame
    k_by_fine_label: pd.DataFrame
    contrasts: tuple[Contrast, ...]
    routing: pd.DataFrame
    note: str

    @property
    def n_responses(self) -> int:
        return int(self.decisions["seq_id"].nunique())


def _routing_note(labelled: pd.DataFrame, seqs: set[str]) -> str:
    if "new_experts" not in labelled.columns:
        return "the tokens table has no new_experts: the reference-token contrasts have no events"
    ne = pd.to_numeric(labelled.loc[labelled["seq_id"].astype(str).isin(seqs), "new_experts"], errors="coerce")
    if len(ne) and ne.isna().all():
        return ("the target's per-token routing was not recorded on these reference tokens (new_experts missing): "
                "the reference-token contrasts have no events; the window contrast uses the Oracle's own windows")
    return ""


def study_by_kind(result: OracleResult, labelled: pd.DataFrame, kinds: np.ndarray | None = None,
                  n_boot: int = 999, seed: int = 0) -> dict[str, KindStudy]:
    """The study per reference kind, the headline kind first.

    Parameters
    ----------
    result : the Oracle solved on all sequences.
    labelled : :func:`~speclimits.linguistic.label_trace_tokens` output.
    kinds : (S,) kind per sequence of ``result.inputs.seq_ids`` (``OracleSetup.kinds``); None: all greedy.
    n_boot, seed : bootstrap replicates and seed (the same for every kind).
    """
    dec = decision_table(result, labelled, kinds)
    contrasts = [script_change_contrast(labelled), first_mismatch_contrast(result, labelled, source="reference"),
                 first_mismatch_contrast(result, source="window")]
    present = list(pd.unique(dec["reference_kind"]))
    order = sorted(present, key=lambda k: (k != HEADLINE_KIND, k))
    out = {}
    for kind in order:
        sub = dec[dec["reference_kind"] == kind].reset_index(drop=True)
        sub.attrs.update(dec.attrs)
        seqs = set(sub["seq_id"].astype(str))
        cons = tuple(c.subset(seqs) for c in contrasts)
        out[kind] = KindStudy(
            kind=kind, decisions=sub,
            k_by_context=k_by_context(sub, by="label", n_boot=n_boot, seed=seed),
            k_by_fine_label=k_by_context(sub, by="label_fine", n_boot=n_boot, seed=seed),
            contrasts=cons, routing=routing_table(list(cons), n_boot=n_boot, seed=seed),
            note=_routing_note(labelled, seqs))
    return out


def headline(studies: dict[str, KindStudy]) -> KindStudy:
    """The headline study: greedy references when there are any, else the first kind present."""
    return studies.get(HEADLINE_KIND) or next(iter(studies.values()))


#: The appendix's headline quantities: (name, table, row, our estimate / lo / hi columns, paper key).
_COMPARED = (
    ("k* >= 4 at code formatting", "k", v.CODE_FORMAT, ("share_long", "long_lo", "long_hi")),
    ("k* >= 4 at prose vocabulary", "k", v.PROSE_VOCAB, ("share_long", "long_lo", "long_hi")),
    ("k* >= 4 at a script change", "k", v.SCRIPT_CHANGE, ("share_long", "long_lo", "long_hi")),
    ("k* = 1 at a script change", "k", v.SCRIPT_CHANGE, ("share_k1", "k1_lo", "k1_hi")),
    ("k* >= 4 at a mode change (code<->text)", "k", v.MODE_CHANGE, ("share_long", "long_lo", "long_hi")),
    ("new experts: script change - step before", "r", v.SCRIPT_CHANGE, ("diff", "diff_lo", "diff_hi")),
    ("new experts: first mismatch - step before", "r", "first_mismatch_reference", ("diff", "diff_lo", "diff_hi")),
)


def paper_comparison(study: KindStudy) -> pd.DataFrame:
    """The appendix's linguistic headline beside ours, one row per quantity.

    Columns: ``quantity``, ``ours``, ``lo``, ``hi`` (95% response-cluster interval), ``n_decisions``
    (events for the routing rows), ``n_responses``, ``paper``, ``paper_lo``, ``paper_hi``, and
    ``verdict``: ``consistent`` (the intervals overlap), ``differs`` (they do not), or ``no data``.
    """
    k = study.k_by_context.set_index("context")
    r = study.routing.set_index("contrast")
    rows = []
    for name, table, key, (est, lo, hi) in _COMPARED:
        tab = k if table == "k" else r
        quoted = (paper.K_BY_CONTEXT.get(key, {}) if table == "k"
                  else paper.ROUTING[v.SCRIPT_CHANGE if key == v.SCRIPT_CHANGE else "first_mismatch"])
        have = key in tab.index and np.isfinite(float(tab.loc[key].get(est, np.nan)))
        ours = [float(tab.loc[key, c]) if have else np.nan for c in (est, lo, hi)]
        theirs = [quoted.get(c, np.nan) for c in (est, lo, hi)]
        n = (int(tab.loc[key, "n_decisions" if table == "k" else "n_events"]) if have else 0,
             int(tab.loc[key, "n_responses"]) if have else 0)
        p_lo, p_hi = (theirs[1], theirs[2]) if np.isfinite(theirs[1]) else (theirs[0], theirs[0])
        verdict = ("no data" if not have else
                   "consistent" if ours[1] <= p_hi and p_lo <= ours[2] else "differs")
        rows.append({"quantity": name, "ours": ours[0], "lo": ours[1], "hi": ours[2], "n_decisions": n[0],
                     "n_responses": n[1], "paper": theirs[0], "paper_lo": theirs[1], "paper_hi": theirs[2],
                     "verdict": verdict})
    return pd.DataFrame(rows)
