"""What ``tokens.parquet`` holds: the reference sequences the Oracle walks, one row per token.

The layout (the book's methods page, "Reference kinds and positions"; the join is
:mod:`speclimits.linguistic.align`):

* **Rows.** Per reference sequence (``seq_id`` = prompt id), row ``pos`` is the token the
  context ends with at Oracle state ``pos``; a sequence with S states has S + 1 rows.
* **Routing on the reading row.** ``experts`` / ``new_experts`` of row r are those of the target
  pass that *reads* row r's token (the forward row whose input it is), against the pass that
  reads row r − 1 (:mod:`speclimits.tracing.records`); a generation's last token is never read, so
  its routing is missing. ``round`` / ``row`` name the pass that *produced* the token.
* **Reference kind.** ``"greedy"`` for a sweep generation (the target's own output),
  ``"teacher-forced"`` for a held-out continuation (the prompt's ``reference_token_ids``), whose
  routing, ``generation_id``, ``K``, ``round`` and ``row`` are missing (no sweep generation made it).
  In a sampled trace (temperature > 0) a prompt's sweep generation is ``"sampled"``, and so are its
  further sampled references (``seq_id`` ``"<prompt id>#<j>"``), whose routing and generation columns
  are missing as a teacher-forced reference's are.
* **The target's own choice** where known: ``target_agrees`` (did the target's greedy choice,
  given the reference prefix, equal the token? from ``oracle.parquet``'s ``forced`` at state
  ``pos``; on a greedy reference also True at the last row, which no state forces) and
  ``target_token_id`` (the token itself where the target agrees, the K = 0 generation's first
  token at row 0, else null). In a sampled trace "the target's choice" is its argmax, and row 0's
  is unknown (null): no greedy generation was made.

:func:`reference_tokens` builds that table at the end of ``speclimits trace --oracle``;
:func:`to_reading_rows` serves ``scripts/migrate_tokens_reference.py`` (older traces).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.vocabulary import GREEDY, SAMPLED, TEACHER_FORCED

#: Columns :func:`reference_tokens` adds to a sweep's token rows (recomputed when present).
CHOICE_COLUMNS = ("target_agrees", "target_token_id")
#: Columns that name the sweep generation a token came from (null on teacher-forced rows).
GENERATION_COLUMNS = ("generation_id", "K", "round", "row")


def to_reading_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Producing-row routing moved onto the reading rows: row r takes row r + 1's ``new_experts``
    and ``experts`` within its sequence; each sequence's last row gets none (NaN / null).

    Only for traces written before the harness recorded the reading rows itself."""
    out = rows.sort_values(["seq_id", "pos"], kind="stable").copy()
    nxt = out.groupby("seq_id", sort=False)
    out["new_experts"] = nxt["new_experts"].shift(-1)
    out["experts"] = nxt["experts"].shift(-1)
    out["experts"] = [None if (not isinstance(v, np.ndarray) and pd.isna(v)) else v for v in out["experts"]]
    return out.loc[rows.index]


def forced_rows(seq_id: str, reference_ids: list[int], prompt_len: int, decode: Callable[[int], str] | None,
                category: str | None = None, kind: str = TEACHER_FORCED) -> pd.DataFrame:
    """The rows of one reference no sweep generation made (a teacher-forced one, or ``kind`` ``sampled``:
    a further sampled reference): its tokens, decoded one at a time (``""`` without a tokenizer, as the
    harness writes), no routing, no generation."""
    n = len(reference_ids)
    ids = np.asarray(reference_ids, dtype=np.int64)
    na = pd.array([pd.NA] * n, dtype="Int64")
    out = pd.DataFrame({
        "seq_id": seq_id, "pos": np.arange(n, dtype=np.int64), "token_id": ids,
        "text": [decode(int(t)) if decode is not None else "" for t in ids],
        "new_experts": np.full(n, np.nan), "experts": [None] * n,
        **{c: na.copy() for c in GENERATION_COLUMNS},
        "context_len": prompt_len + np.arange(n, dtype=np.int64)})
    if category is not None:
        out["category"] = category
    out["reference_kind"] = kind
    return out


def add_target_choice(tokens: pd.DataFrame, oracle: pd.DataFrame, first_greedy: Mapping[str, int],
                      require_first: bool = True) -> pd.DataFrame:
    """``tokens`` with ``target_agrees`` and ``target_token_id`` (see the module docstring).

    ``oracle``: ``seq_id``, ``pos``, ``forced``; ``first_greedy``: per seq_id, the first token of
    the target's own greedy generation (the prefill's choice, which no Oracle state records);
    ``require_first`` False (a sampled trace, which has none): row 0's choice stays null where
    ``first_greedy`` does not give it."""
    forced = oracle.set_index([oracle["seq_id"].astype(str), "pos"])["forced"]
    seq = tokens["seq_id"].astype(str)
    f = forced.reindex(pd.MultiIndex.from_arrays([seq, tokens["pos"]]))
    agrees = pd.array([pd.NA if pd.isna(x) else not bool(x) for x in f], dtype="boolean")
    target = pd.array([t if (not pd.isna(a) and bool(a)) else pd.NA for t, a in zip(tokens["token_id"], agrees)],
                      dtype="Int64")
    row0 = (tokens["pos"] == 0).to_numpy()
    missing = sorted(set(seq[row0]) - set(first_greedy))
    if missing and require_first:
        raise SpeclimitsError(f"tokens: no greedy generation gives the target's first token of {missing[:5]}")
    target[row0] = [int(first_greedy[s]) if s in first_greedy else pd.NA for s in seq[row0]]
    # a greedy reference is the target's own output: its choice given that prefix is the token itself,
    # also at the last row, which no Oracle state forces
    greedy = (tokens["reference_kind"] == GREEDY).to_numpy()
    last = greedy & np.asarray(pd.isna(agrees))
    agrees[last] = True
    target[last] = tokens["token_id"].to_numpy()[last]
    out = tokens.copy()
    out["target_agrees"] = agrees
    out["target_token_id"] = target
    return out


def reference_tokens(tokens: pd.DataFrame, oracle: pd.DataFrame, held_out: Mapping[str, list[int]],
                     first_greedy: Mapping[str, int], decode: Callable[[int], str] | None = None,
                     sampled: Mapping[str, tuple[str, list[int]]] | None = None, kind: str = GREEDY) -> pd.DataFrame:
    """The ``tokens.parquet`` table of a trace with Oracle data (the layout of the module docstring).

    ``tokens``: the sweep's token rows of each prompt's reference generation (routing already on
    the reading rows; one generation per ``seq_id``); ``oracle``: ``seq_id``, ``pos``, ``forced``;
    ``held_out``: per teacher-forced ``seq_id``, its reference token ids; ``first_greedy``: per
    ``seq_id``, the first token of its greedy generation; ``decode``: token id -> text;
    ``sampled`` (a sampled trace): per further sampled reference's ``seq_id``, its prompt's
    ``seq_id`` and its token ids (rows placed after the prompt's); ``kind``: the reference kind of
    the generations' rows (``sampled`` in a sampled trace, whose row 0 has no known target choice).

    Re-runnable: generation rows are kept, teacher-forced and further sampled ones rebuilt from
    ``held_out`` / ``sampled`` and the target's choice recomputed, so a second call on its own output
    returns the same table.
    """
    sampled = dict(sampled or {})
    tokens = tokens.drop(columns=[c for c in (*CHOICE_COLUMNS, "reference_kind") if c in tokens.columns])
    tokens = tokens.loc[~tokens["seq_id"].astype(str).isin(sampled)]  # rebuilt below
    seq = tokens["seq_id"].astype(str)
    dup = tokens.duplicated(["seq_id", "pos"])
    if dup.any():
        raise SpeclimitsError(f"tokens: {int(dup.sum())} duplicate (seq_id, pos) rows (first: "
                              f"{tokens.loc[dup].iloc[0][['seq_id', 'pos']].tolist()}); keep one generation per "
                              "reference")
    order: dict[str, int] = {}
    for s in pd.unique(seq):  # each prompt's sequence, then its further sampled references
        order[s] = len(order)
        for extra in sorted((x for x, (parent, _) in sampled.items() if parent == s), key=lambda x: (len(x), x)):
            order[extra] = len(order)
    greedy = tokens.loc[~seq.isin(held_out)].copy()
    greedy["reference_kind"] = kind
    parts = [greedy]
    has_cat = "category" in tokens.columns

    rebuilt = [(s, s, held_out[s], TEACHER_FORCED) for s in held_out]
    rebuilt += [(s, parent, ids, SAMPLED) for s, (parent, ids) in sampled.items()]
    for s, parent, ids, rows_kind in rebuilt:
        old = tokens.loc[seq == parent]
        if old.empty:
            continue  # a prompt without token rows (tokens="none" or not traced) stays without
        prompt_len = int(old["context_len"].iloc[0] - old["pos"].iloc[0])
        parts.append(forced_rows(s, [int(x) for x in ids], prompt_len, decode,
                                 old["category"].iloc[0] if has_cat else None, kind=rows_kind))
    out = pd.concat(parts, ignore_index=True)
    for col in GENERATION_COLUMNS:
        if col in out.columns:
            out[col] = out[col].astype("Int64")
    out = out.sort_values(["seq_id", "pos"], key=lambda c: c.astype(str).map(order) if c.name == "seq_id" else c,
                          kind="stable").reset_index(drop=True)
    return add_target_choice(out, oracle, first_greedy, require_first=kind == GREEDY)


def reference_generations(generations: Mapping[Any, Mapping[str, Any]], k_ref: int
                          ) -> dict[str, tuple[int, Mapping[str, Any]]]:
    """Per prompt id, its reference generation ``(generation id, entry)``: the one with K = ``k_ref``
    at the smallest generation id (in a batch sweep, the smallest batch size). ``generations``:
    ``generations.jsonl`` entries by generation id."""
    out: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for gid in sorted(generations, key=int, reverse=True):  # the smallest id is written last and wins
        g = generations[gid]
        if int(g["K"]) == k_ref:
            out[str(g["prompt_id"])] = (int(gid), g)
    return out


def first_greedy_tokens(generations: Mapping[Any, Mapping[str, Any]], k_ref: int) -> dict[str, int]:
    """Per prompt id, the first output token of its reference generation (:func:`reference_generations`)."""
    return {p: int(g["output_token_ids"][0]) for p, (_, g) in reference_generations(generations, k_ref).items()
            if g.get("output_token_ids")}
