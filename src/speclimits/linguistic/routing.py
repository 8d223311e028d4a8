"""New experts at linguistic events: Latin↔Cyrillic script changes and the draft's first mismatch.

"New experts" at a step = experts per MoE layer (averaged over layers) used at this position and
not at the preceding one; ``tokens.parquet``'s ``new_experts`` of row r is that of the pass that
reads row r (:mod:`speclimits.linguistic.align`). It is measured only where the target ran on the
tokens (missing, NaN, on teacher-forced references). Each event step is compared with the step
right before it in the same continuation, with a bootstrap over responses for the interval of the
difference (appendix; paper: script change 2.66 → 3.12, +0.46 [+0.26; +0.66]; first mismatch
3.30 → 3.31, +0.01 [−0.05; +0.07]). The three contrasts:

``script_change`` (:func:`script_change_contrast`)
    A reference token with letters whose script (``label_script``) differs from that of the last
    token with letters, against the token before it; one event per token.
``first_mismatch_reference`` (:func:`first_mismatch_contrast`, ``source="reference"``)
    Per state with observed match length a < K_max: the reference token the draft missed (row
    ``pos + a + 1``) against the row before it: does the target's own routing jump where the draft fails?
``first_mismatch_window`` (``source="window"``)
    Per state with 1 <= a < K_max, on the draft chain (``u_bar_window``): ``Δ_j = Ū(window of j+1) −
    Ū(window of j)`` is what draft token d_j adds; the event is Δ at the first wrong draft (j = a + 1)
    against Δ at the last matched one (j = a). The window's unique count saturates, so Δ shrinks with
    j anyway; the **step-adjusted** difference subtracts the mean difference of matched pairs at the
    same step j, inside every bootstrap replicate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.vocabulary import SCRIPT_CHANGE
from speclimits.errors import Problem, SpeclimitsError, TraceFormatError
from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.linguistic.align import state_tokens, token_table
from speclimits.simulate import config_from_meta, expected_new_experts
from speclimits.oracle.inputs import OracleInputs
from speclimits.oracle.solver import OracleResult


@dataclass(frozen=True)
class Contrast:
    """Events (one row each) and, for the window contrast, the matched control pairs.

    Attributes
    ----------
    name : ``script_change``, ``first_mismatch_reference`` or ``first_mismatch_window``.
    events : ``seq_id``, ``pos`` (the token or the state), ``step`` (continuation step of the
        event), ``before``, ``at``, ``diff`` = at − before, plus descriptive columns.
    controls : window contrast only: ``seq_id``, ``step``, ``diff`` of matched pairs.
    note : how the events were formed.
    """

    name: str
    events: pd.DataFrame
    controls: pd.DataFrame | None = None
    note: str = ""

    @property
    def n_events(self) -> int:
        return int(len(self.events))

    @property
    def n_responses(self) -> int:
        return int(self.events["seq_id"].nunique())

    def subset(self, seq_ids: "list[str] | set[str] | np.ndarray") -> "Contrast":
        """The same contrast restricted to the events (and controls) of the given sequences."""
        keep = {str(x) for x in seq_ids}
        ev = self.events[self.events["seq_id"].astype(str).isin(keep)].reset_index(drop=True)
        ctrl = None if self.controls is None else self.controls[
            self.controls["seq_id"].astype(str).isin(keep)].reset_index(drop=True)
        return Contrast(self.name, ev, ctrl, self.note)

    def _step_sums(self, df: pd.DataFrame, idx: dict, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        s = np.zeros((len(idx), n_steps))
        c = np.zeros((len(idx), n_steps))
        rows = np.fromiter((idx[x] for x in df["seq_id"].astype(str)), np.int64, len(df))
        np.add.at(s, (rows, df["step"].to_numpy()), df["diff"].to_numpy())
        np.add.at(c, (rows, df["step"].to_numpy()), 1.0)
        return s, c

    def _adjusted(self, w: np.ndarray, idx: dict) -> np.ndarray:
        n_steps = int(max(self.events["step"].to_numpy().max(initial=0),
                          self.controls["step"].to_numpy().max(initial=0))) + 1
        e_s, e_c = self._step_sums(self.events, idx, n_steps)
        m_s, m_c = self._step_sums(self.controls, idx, n_steps)
        es, ec, ms, mc = w @ e_s, w @ e_c, w @ m_s, w @ m_c
        ok = mc > 0
        base = np.where(ok, ms / np.where(ok, mc, 1.0), 0.0)
        num = np.where(ok, es - ec * base, 0.0).sum(axis=1)
        den = np.where(ok, ec, 0.0).sum(axis=1)
        return num / den

    def summary(self, n_boot: int = 999, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
        """``name``, ``n_events``, ``n_responses``, ``before``, ``at``, ``diff`` (means over the events) with
        ``diff_lo`` / ``diff_hi`` and, with controls, ``adjusted`` with ``adjusted_lo`` / ``adjusted_hi``: percentile
        intervals over ``n_boot`` replicates that draw the responses (of events and controls) with replacement."""
        out: dict[str, Any] = {"contrast": self.name, "n_events": self.n_events, "n_responses": self.n_responses}
        if self.n_events == 0:
            return out
        ev = self.events
        out.update(before=float(ev["before"].mean()), at=float(ev["at"].mean()), diff=float(ev["diff"].mean()))
        ids = [ev["seq_id"]] + ([] if self.controls is None else [self.controls["seq_id"]])
        idx = {c: i for i, c in enumerate(np.unique(np.concatenate([x.astype(str).to_numpy() for x in ids])))}
        w = draw_counts(len(idx), n_boot, np.random.default_rng(seed))
        sums = np.zeros((len(idx), 2))
        np.add.at(sums, np.fromiter((idx[c] for c in ev["seq_id"].astype(str)), np.int64, len(ev)),
                  np.column_stack([ev["diff"], np.ones(len(ev))]))
        tot = w @ sums
        with np.errstate(invalid="ignore", divide="ignore"):
            out["diff_lo"], out["diff_hi"] = percentile_interval(tot[:, 0] / tot[:, 1], level)
            if self.controls is not None:
                out["adjusted"] = float(self._adjusted(np.ones((1, len(idx))), idx)[0])
                out["adjusted_lo"], out["adjusted_hi"] = percentile_interval(self._adjusted(w, idx), level)
        return out


def _sorted_tokens(tokens: pd.DataFrame, cols: tuple[str, ...], why: str) -> pd.DataFrame:
    """The tokens table sorted by ``seq_id``, ``pos``, with ``new_experts`` as float. NaN is allowed
    (those events are left out); a column with no number at all is an error."""
    df = token_table(tokens, cols, why=why, sort=True)
    ne = pd.to_numeric(df["new_experts"], errors="coerce").to_numpy(dtype=float)
    if len(df) and not np.isfinite(ne).any():
        raise TraceFormatError("tokens.parquet", [Problem("tokens.parquet", "new_experts",
                                                          "holds no finite number", (0,), len(df))])
    df["new_experts"] = ne
    return df


def script_change_contrast(labelled: pd.DataFrame, script_col: str = "label_script") -> Contrast:
    """Latin↔Cyrillic transitions in the reference against the preceding token (see the module docs).

    ``labelled`` is :func:`~speclimits.linguistic.labels.label_trace_tokens` output (any table with
    ``seq_id``, ``pos``, ``new_experts`` and a script column with ``latin`` / ``cyrillic`` / ``none``).
    Events carry ``direction`` and, when the trace has planted labels, ``context_before`` /
    ``context_at``.
    """
    df = _sorted_tokens(labelled, ("seq_id", "pos", "new_experts", script_col), "routing at script changes")
    script = df[script_col].astype(str).where(df[script_col].astype(str).isin(["latin", "cyrillic"]))
    last = script.groupby(df["seq_id"]).shift(1)
    last = last.groupby(df["seq_id"]).ffill()
    same_seq = df["seq_id"].eq(df["seq_id"].shift(1))
    contiguous = df["pos"].eq(df["pos"].shift(1) + 1)
    event = script.notna() & last.notna() & (script != last) & same_seq & contiguous
    ne = df["new_experts"].to_numpy(dtype=float)
    i = np.flatnonzero(event.to_numpy())
    i = i[np.isfinite(ne[i]) & np.isfinite(ne[i - 1])]
    events = pd.DataFrame({"seq_id": df["seq_id"].to_numpy()[i], "pos": df["pos"].to_numpy()[i],
                           "step": np.ones(len(i), np.int64), "before": ne[i - 1], "at": ne[i],
                           "diff": ne[i] - ne[i - 1],
                           "direction": (last.to_numpy()[i] + "->" + script.to_numpy()[i]).astype(str)})
    if "text" in df.columns:
        events["text_before"] = df["text"].to_numpy()[i - 1]
        events["text_at"] = df["text"].to_numpy()[i]
    if "context" in df.columns:
        events["context_before"] = df["context"].astype(str).to_numpy()[i - 1]
        events["context_at"] = df["context"].astype(str).to_numpy()[i]
    return Contrast(SCRIPT_CHANGE, events, note=f"script from column {script_col!r}; one event per token")


def first_mismatch_contrast(result: OracleResult | OracleInputs, tokens: pd.DataFrame | None = None,
                            source: str = "reference") -> Contrast:
    """New experts at the draft's first mismatch against the preceding step (see the module docs).

    Parameters
    ----------
    result : the solved Oracle or its inputs (``accept_len``, ``u_bar_window``).
    tokens : the tokens table with ``new_experts`` (needed for ``source="reference"``).
    source : ``"reference"`` (the target's routing on the reference tokens) or ``"window"`` (the
        target's routing on the draft chain, step-adjusted).
    """
    inp = result.inputs if isinstance(result, OracleResult) else result
    k_max = inp.k_list
    a = inp.accept_len.astype(np.int64)
    seq = inp.seq_ids[inp.seq_index].astype(str)
    if source == "reference":
        if tokens is None:
            raise SpeclimitsError("first_mismatch_contrast(source='reference') needs the tokens table")
        tok = _sorted_tokens(tokens, ("seq_id", "pos", "new_experts"), "routing at the first mismatch")
        ok = (a < k_max) & (a < inp.remaining)
        states = pd.DataFrame({"seq_id": seq[ok], "pos": inp.pos[ok]})
        cols = ["new_experts"] + (["context"] if "context" in tok.columns else [])
        at_tok = state_tokens(states, tok, step=a[ok] + 1, columns=cols)  # the row the draft missed
        before_tok = state_tokens(states, tok, step=a[ok], columns=cols)  # the row before it
        at = at_tok["new_experts"].to_numpy(dtype=float)
        before = before_tok["new_experts"].to_numpy(dtype=float)
        have = np.isfinite(at) & np.isfinite(before)
        rows = np.flatnonzero(ok)[have]
        events = pd.DataFrame({"seq_id": seq[rows], "pos": inp.pos[rows], "step": a[rows] + 1,
                               "before": before[have], "at": at[have], "diff": at[have] - before[have],
                               "token_pos": at_tok["token_pos"].to_numpy()[have]})
        if "context" in tok.columns:
            events["context_before"] = before_tok["context"].astype(str).to_numpy()[have]
            events["context_at"] = at_tok["context"].astype(str).to_numpy()[have]
        return Contrast("first_mismatch_reference", events,
                        note="reference token the draft missed vs the token before it; one event per decision")
    if source != "window":
        raise SpeclimitsError(f"source must be 'reference' or 'window', got {source!r}")
    u = inp.u_bar_window[:, : k_max + 1]
    delta = np.diff(u, axis=1)  # (n, k_max): Δ_j for j = 1..k_max in column j - 1
    ok = (a >= 1) & (a < k_max) & (a + 1 <= inp.remaining)
    rows = np.flatnonzero(ok)
    j = a[rows] + 1
    at, before = delta[rows, j - 1], delta[rows, j - 2]
    events = pd.DataFrame({"seq_id": seq[rows], "pos": inp.pos[rows], "step": j, "before": before, "at": at,
                           "diff": at - before, "u_before": u[rows, j - 1]})
    # matched control pairs: steps j with 2 <= j <= a (d_{j-1}, d_j both correct) inside the sequence
    steps = np.arange(1, k_max + 1)
    ctrl = (steps[None, :] >= 2) & (steps[None, :] <= a[:, None]) & (steps[None, :] <= inp.remaining[:, None])
    r, c = np.nonzero(ctrl)
    controls = pd.DataFrame({"seq_id": seq[r], "step": steps[c], "diff": delta[r, c] - delta[r, c - 1]})
    return Contrast("first_mismatch_window", events, controls,
                    note="draft chain: Δ at the first wrong draft vs the last matched one; adjusted by matched pairs "
                         "at the same step")


def routing_table(contrasts: list[Contrast], n_boot: int = 999, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """One row per contrast (:meth:`Contrast.summary`) with the paper's values beside ours."""
    rows = []
    for i, c in enumerate(contrasts):
        row = c.summary(n_boot=n_boot, seed=seed + i, level=level)
        quoted = paper.ROUTING[SCRIPT_CHANGE if c.name == SCRIPT_CHANGE else "first_mismatch"]
        row.update({f"paper_{k}": v for k, v in quoted.items()})
        rows.append(row)
    cols = ["contrast", "n_events", "n_responses", "before", "at", "diff", "diff_lo", "diff_hi", "adjusted",
            "adjusted_lo", "adjusted_hi", "paper_before", "paper_at", "paper_diff", "paper_diff_lo", "paper_diff_hi"]
    return pd.DataFrame(rows).reindex(columns=cols)


def planted_contrast(contrast: Contrast, meta: dict[str, Any]) -> float:
    """The planted difference for a contrast's own events: mean over events of E[new experts | context
    at] − E[new experts | context before] (:func:`speclimits.simulate.expected_new_experts`; simulated
    traces with planted ``context``, reference-token contrasts only; raises for a measured trace)."""
    ev = contrast.events
    if "context_at" not in ev.columns:
        raise SpeclimitsError(f"contrast {contrast.name!r} has no planted contexts (simulated reference tokens only)")
    truth = expected_new_experts(config_from_meta(meta), int(meta["seed"]))
    return float((ev["context_at"].map(truth) - ev["context_before"].map(truth)).mean())
