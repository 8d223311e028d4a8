"""Decision panels: the target's continuation above the draft's, with k*, the first mismatch and a_mode.

A panel shows one decision (Oracle state ``pos``) over steps i = 1..K_max: the reference token
draft step i predicts (``tokens`` row ``pos + i``) on top, the draft's token below. A step is a
``match`` (i <= a, the observed greedy match length), the ``first mismatch`` (i = a + 1) or ``after
mismatch``, and ``past_kstar`` past k*. The draft's tokens come from ``oracle.parquet``'s
``draft_tokens`` when the trace has them; otherwise the draft row shows the
reference up to the match, :data:`MISMATCH_GLYPH` at the mismatch and :data:`UNKNOWN_GLYPH` after.
The panels show :func:`select_ablation_cases` (the α = 0 cases) and :func:`select_gallery`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.linguistic.contexts import K_LONG, modal_advancement
from speclimits.vocabulary import BOUNDARY_LABELS, COMMENT, CONTROL_FLOW, FUNCTION_START, SCRIPT_CHANGE
from speclimits.oracle.solver import OracleResult

MISMATCH_GLYPH = "✗"
UNKNOWN_GLYPH = "·"
GROUPS = ("regular continuation", "structural boundary", "counterexample")
STRUCTURE_FINE = (FUNCTION_START, CONTROL_FLOW, COMMENT)


def show_token(text: str, width: int = 10) -> str:
    """A token made visible: newline ↵, tab ⇥, spaces ␣ (leading ones only in words), cut to ``width``."""
    t = str(text)
    if not any(c.isalnum() for c in t):  # layout and punctuation: show every space
        t = t.replace(" ", "␣")
    else:
        stripped = t.lstrip(" ")
        t = "␣" * min(len(t) - len(stripped), 3) + stripped
    t = t.replace("\n", "↵").replace("\t", "⇥")
    return t if len(t) <= width else t[: width - 1] + "…"


def _pick(cands: pd.DataFrame, subtypes: list[str], n: int, used: set[str], taken: set[tuple[str, int]],
          group: str) -> list[dict]:
    """Round-robin over ``subtypes``: the first candidate of each subtype from an unused response."""
    out: list[dict] = []
    queues = [cands[cands["subtype"] == s].iterrows() for s in subtypes]
    while len(out) < n and queues:
        for queue in list(queues):
            row = next((r for _, r in queue if r["seq_id"] not in used
                        and (str(r["seq_id"]), int(r["pos"])) not in taken), None)
            if row is None:  # this subtype has no candidate left
                queues.remove(queue)
                continue
            out.append({**row.to_dict(), "group": group})
            used.add(row["seq_id"])
            taken.add((str(row["seq_id"]), int(row["pos"])))
            if len(out) >= n:
                break
    return out


def select_gallery(decisions: pd.DataFrame, n_per_group: int = 4, exclude: Iterable[tuple[str, int]] = (),
                   seed: int = 0, full_match: int = 8, k_long: int = K_LONG) -> pd.DataFrame:
    """The stratified gallery: ``n_per_group`` decisions in each of three groups, all from different responses.

    Rule (fixed before looking at outcomes; the appendix's three groups):

    * **counterexample** to "a boundary or a mismatch means a short draft": subtypes
      ``boundary, long draft`` (context in :data:`BOUNDARY_LABELS` and k* >= ``k_long``),
      ``early mismatch, long draft`` (observed match length a <= 1 and k* >= ``k_long``) and
      ``script change, long draft`` (a script change with k* >= ``k_long``);
    * **structural boundary**: a linguistically interpretable transition, subtype = its context
      (``prose_boundary``, ``mode_change``, ``script_change``) or fine label (``function_start``,
      ``control_flow``, ``comment``);
    * **regular continuation**: an exact match of ``min(full_match, K_max)`` tokens or more with
      k* >= ``k_long``, subtype = the context (different types).

    Only decisions whose whole panel lies inside the response (``remaining > K_max``) and that are
    not in ``exclude`` (e.g. the α = 0 cases) qualify. Groups are filled rarest first
    (counterexample, boundary, regular). Within a group the candidates are put in a seeded random
    order and taken round-robin over the subtypes, each time the first candidate from a response
    no earlier pick used. A group with too few candidates comes back short (``attrs["short"]``).

    Returns ``group``, ``subtype`` and the decision's columns, in the order regular, boundary,
    counterexample.
    """
    need = ("seq_id", "pos", "k_star", "accept_len", "label", "remaining")
    missing = [c for c in need if c not in decisions.columns]
    if missing:
        raise SpeclimitsError(f"select_gallery: the decision table lacks columns {missing}")
    k_max = int(decisions.attrs.get("k_max", decisions["accept_len"].max()))
    df = decisions[decisions["remaining"] > k_max].astype({"seq_id": str, "label": str})
    fine = df["label_fine"].astype(str) if "label_fine" in df.columns else pd.Series("", index=df.index)
    df = df.iloc[np.random.default_rng(seed).permutation(len(df))]
    fine = fine.loc[df.index]
    used: set[str] = set()
    taken = {(str(s), int(p)) for s, p in exclude}
    picked: dict[str, list[dict]] = {}
    for group, cands, subtypes in _candidates(df, fine, k_max, full_match, k_long):
        present = [s for s in subtypes if (cands["subtype"] == s).any()]
        picked[group] = _pick(cands, present, n_per_group, used, taken, group)
    rows = [r for g in GROUPS for r in picked[g]]
    cols = ["group", "subtype"] + [c for c in decisions.columns]
    out = pd.DataFrame(rows).reindex(columns=cols) if rows else pd.DataFrame(columns=cols)
    out.attrs["short"] = {g: n_per_group - len(picked[g]) for g in GROUPS if len(picked[g]) < n_per_group}
    return out.reset_index(drop=True)


#: The counterexample group's subtypes, in the order the round robin visits them.
COUNTER_SUBTYPES = ("boundary, long draft", "early mismatch, long draft", "script change, long draft")


def _candidates(df: pd.DataFrame, fine: pd.Series, k_max: int, full_match: int, k_long: int
                ) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """``(group, candidates with a subtype column, subtypes in round-robin order)`` for the three
    groups, rarest first (see :func:`select_gallery`'s rule)."""
    long_ = df["k_star"] >= k_long
    boundary = df["label"].isin(BOUNDARY_LABELS)
    masks = (boundary & long_ & (df["label"] != SCRIPT_CHANGE), (df["accept_len"] <= 1) & long_,
             (df["label"] == SCRIPT_CHANGE) & long_)
    counter_df = pd.concat([df[mask].assign(subtype=name) for name, mask in zip(COUNTER_SUBTYPES, masks)])
    struct_sub = np.where(boundary, df["label"], np.where(fine.isin(STRUCTURE_FINE), fine, ""))
    struct_df = df.assign(subtype=struct_sub)
    struct_df = struct_df[struct_df["subtype"] != ""]
    regular_df = df[(df["accept_len"] >= min(full_match, k_max)) & long_].assign(subtype=lambda d: d["label"])
    return [("counterexample", counter_df, list(COUNTER_SUBTYPES)),
            ("structural boundary", struct_df, list(BOUNDARY_LABELS) + list(STRUCTURE_FINE)),
            ("regular continuation", regular_df, list(regular_df["subtype"].value_counts().index))]


def select_ablation_cases(cases: pd.DataFrame, n: int = 4) -> pd.DataFrame:
    """Up to ``n`` α = 0 cases (:attr:`AlphaAblation.cases`) whose k* moves without the expert term.

    Rule: keep cases with ``k_star_alpha0 != k_star``, order by the added token's match probability
    (highest first), then take one case per response, first preferring boundaries (k* → k*+1) not
    yet shown, then any boundary.
    """
    if cases.empty:
        return cases.copy()
    c = cases[cases["k_star_alpha0"] != cases["k_star"]].copy()
    c["seq_id"] = c["seq_id"].astype(str)
    c = c.sort_values(["match_prob_added", "seq_id", "pos"], ascending=[False, True, True], kind="stable")
    chosen, used, bounds = [], set(), set()
    for prefer_new in (True, False):
        for idx, row in c.iterrows():
            if len(chosen) >= n:
                break
            if row["seq_id"] in used or (prefer_new and row["boundary"] in bounds):
                continue
            chosen.append(idx)
            used.add(row["seq_id"])
            bounds.add(row["boundary"])
    return c.loc[chosen].reset_index(drop=True)


def _draft_texts(oracle: pd.DataFrame | None, tokens: pd.DataFrame) -> dict[tuple[str, int], list[str]] | None:
    """Per (seq_id, pos): the draft's tokens (``draft_tokens``) as text, by their ids in the tokens table,
    when ``oracle`` carries them."""
    if oracle is None or "draft_tokens" not in oracle.columns:
        return None
    vocab = dict(zip(tokens["token_id"].astype(int), tokens["text"].astype(str))) if "token_id" in tokens else {}
    return {(s, p): [vocab.get(int(x), f"#{int(x)}") for x in v]
            for s, p, v in zip(oracle["seq_id"].astype(str), oracle["pos"].astype(int), oracle["draft_tokens"])
            if v is not None}


def panel_data(result: OracleResult, labelled: pd.DataFrame, selection: pd.DataFrame,
               oracle: pd.DataFrame | None = None, n_steps: int | None = None) -> pd.DataFrame:
    """Long table for :func:`speclimits.figures.decision_panels`: one row per (panel, row, step).

    Parameters
    ----------
    result : the solved Oracle (k*, survival, ``accept_len``).
    labelled : the labelled tokens table (``seq_id``, ``pos``, ``text``, ``label``).
    selection : decisions to show (``seq_id``, ``pos``; optional ``group``, ``subtype``,
        ``k_star_alpha0``).
    oracle : the trace's ``oracle.parquet`` table, read for ``draft_tokens``.
    n_steps : steps per panel (default K_max of the result).

    ``panel`` is the panel's (unique) title, ``row`` ``target`` or ``draft``, ``text`` the token made visible
    (:func:`show_token`; ``raw_text`` as it is), ``p_reach`` P(a >= step) and ``label`` the context of the
    token the first draft predicts (row ``pos + 1``).
    """
    inp = result.inputs
    n_steps = result.k_max if n_steps is None else int(n_steps)
    seq = inp.seq_ids[inp.seq_index].astype(str)
    row_of = {(s, int(p)): i for i, (s, p) in enumerate(zip(seq, inp.pos))}
    tok = labelled.assign(seq_id=labelled["seq_id"].astype(str))
    keys = list(zip(tok["seq_id"], tok["pos"].astype(int)))
    text_of = dict(zip(keys, tok["text"].astype(str)))
    label_of = dict(zip(keys, tok["label"].astype(str))) if "label" in tok.columns else {}
    drafts = _draft_texts(oracle, tok)
    a_mode = modal_advancement(result.survival, result.k_star, inp.remaining)
    records = []
    for order, sel in enumerate(selection.itertuples(index=False)):
        s, p = str(sel.seq_id), int(sel.pos)
        if (s, p) not in row_of:
            raise SpeclimitsError(f"panel_data: state (seq_id={s!r}, pos={p}) is not in the Oracle's inputs")
        r = row_of[(s, p)]
        k, a = int(result.k_star[r]), int(inp.accept_len[r])
        k0 = getattr(sel, "k_star_alpha0", np.nan)
        group = getattr(sel, "group", "")
        sub = getattr(sel, "subtype", "")
        title = f"{s} @ {p}: k*={k}, a_mode={int(a_mode[r])}, match={a}" + (
            f", k*(α=0)={int(k0)}" if pd.notna(k0) else "") + (f" [{sub}]" if sub else "")
        steps = min(n_steps, int(inp.remaining[r]))
        draft = None if drafts is None else drafts.get((s, p))
        for i in range(1, steps + 1):
            status = "match" if i <= a else "first mismatch" if i == a + 1 else "after mismatch"
            target_text = text_of.get((s, p + i), "")
            if draft is not None and i - 1 < len(draft):
                draft_text, source = draft[i - 1], "trace"
            else:
                draft_text = target_text if i <= a else MISMATCH_GLYPH if i == a + 1 else UNKNOWN_GLYPH
                source = "reference up to the match length"
            common = {"panel": title, "order": order, "group": group, "subtype": sub, "seq_id": s, "pos": p,
                      "step": i, "status": status, "past_kstar": i > k, "match_prob": float(inp.match_prob[r, i - 1]),
                      "p_reach": float(result.survival[r, i - 1]) if i <= result.k_max else np.nan, "k_star": k,
                      "a_mode": int(a_mode[r]), "accept_len": a, "k_star_alpha0": k0,
                      "label": label_of.get((s, p + 1), ""), "draft_source": source}
            records.append({**common, "row": "target", "text": show_token(target_text), "raw_text": target_text})
            records.append({**common, "row": "draft", "text": show_token(draft_text), "raw_text": draft_text})
    return pd.DataFrame(records)
