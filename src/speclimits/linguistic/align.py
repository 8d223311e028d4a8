"""The one join between Oracle states (``oracle.parquet``) and reference tokens (``tokens.parquet``).

The convention (the book's methods page, "Reference kinds and positions"), shared by the vLLM
harness and the simulator: row ``pos`` of a sequence holds the token the context **already ends
with** at Oracle state ``pos`` (it opens the verification window); draft step ``i`` (1-based) of
state ``pos`` predicts row ``pos + i``, so a decision is labelled with row ``pos + 1`` and the first
mismatch after ``a`` matched drafts is row ``pos + a + 1``. S states have S + 1 token rows.
:func:`alignment_check` tests it on a measured trace (the first draft token equals row ``pos + 1``).

Routing of row r is that of the pass that **reads** row r's token (:mod:`speclimits.trace.reference_tokens`),
so where ``accept_len >= 1`` ``u_bar_window[1] − u_bar_window[0]`` equals row ``pos + 1``'s ``new_experts``
(:func:`window_routing_check`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits.errors import Problem, SpeclimitsError, TraceFormatError


def require_columns(df: pd.DataFrame, cols, origin: str, why: str = "") -> None:
    """Raise :class:`TraceFormatError` naming every column of ``cols`` that ``df`` lacks (``why``: what needs it)."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        what = "required column is missing" + (f" ({why})" if why else "")
        raise TraceFormatError(origin, [Problem(origin, c, what) for c in missing])


def token_table(tokens: pd.DataFrame, need, origin: str = "tokens.parquet", why: str = "",
                sort: bool = False) -> pd.DataFrame:
    """A copy of ``tokens`` with ``seq_id`` as str (sorted by ``seq_id``, ``pos`` when ``sort``); raises
    when a column of ``need`` is missing or a ``(seq_id, pos)`` pair repeats."""
    require_columns(tokens, need, origin, why)
    tok = tokens.copy()
    tok["seq_id"] = tok["seq_id"].astype(str)
    if sort:
        tok = tok.sort_values(["seq_id", "pos"], kind="stable").reset_index(drop=True)
    dup = tok.duplicated(["seq_id", "pos"]).to_numpy()
    if dup.any():
        rows = np.flatnonzero(dup)
        raise TraceFormatError(origin, [Problem(origin, "pos", "duplicate (seq_id, pos) rows",
                                                tuple(rows[:5].tolist()), int(rows.size))])
    return tok


def state_tokens(states: pd.DataFrame, tokens: pd.DataFrame, step: np.ndarray | int = 1,
                 columns: list[str] | None = None, origin: str = "tokens.parquet") -> pd.DataFrame:
    """The token rows that draft step ``step`` of each state predicts, aligned row by row with ``states``.

    Parameters
    ----------
    states : one row per state: ``seq_id``, ``pos`` (any other columns are ignored).
    tokens : ``tokens.parquet`` rows: ``seq_id``, ``pos`` and the columns to fetch.
    step : 1-based draft step (scalar or one per state); 0 = the window's opening token.
    columns : token columns to fetch (default: all but ``seq_id`` / ``pos``).

    Returns a frame with the index of ``states``: ``token_pos`` (the row joined) and the token
    columns; states whose row is not in ``tokens`` get missing values and ``has_token`` False.
    """
    tok = token_table(tokens, ("seq_id", "pos"), origin, "joining states to tokens")
    cols = [c for c in (columns if columns is not None else tok.columns) if c not in ("seq_id", "pos")]
    require_columns(tok, cols, origin)
    target = np.asarray(states["pos"], dtype=np.int64) + np.asarray(step, dtype=np.int64)
    target = np.broadcast_to(target, (len(states),))
    keys = pd.MultiIndex.from_arrays([states["seq_id"].astype(str).to_numpy(), target])
    indexed = tok.set_index(["seq_id", "pos"])
    out = indexed[cols].reindex(keys).reset_index(drop=True)
    out.index = states.index
    out.insert(0, "token_pos", target.astype(np.int64))
    out["has_token"] = keys.isin(indexed.index)
    return out


def alignment_check(oracle: pd.DataFrame, tokens: pd.DataFrame, kinds: dict[str, str] | None = None) -> pd.DataFrame:
    """Share of states whose first draft token equals the token the join assigns to their decision.

    Parameters
    ----------
    oracle : ``oracle.parquet`` rows with ``seq_id``, ``pos``, ``accept_len``, ``draft_tokens``.
    tokens : ``tokens.parquet`` rows with ``seq_id``, ``pos``, ``token_id``.
    kinds : reference kind per sequence id (default: all ``"all"``).

    Returns one row per reference kind: ``reference_kind``, ``n_states`` (states with
    ``accept_len >= 1`` and a token row), ``share_row_pos_plus_1`` (the convention: must be 1),
    ``share_row_pos`` (the other rule, for contrast).
    """
    require_columns(oracle, ("draft_tokens",), "oracle.parquet", "the alignment check needs the draft's own tokens")
    o = oracle[oracle["accept_len"].to_numpy() >= 1]
    first = np.fromiter((int(d[0]) if d is not None and len(d) else -1 for d in o["draft_tokens"]), np.int64, len(o))
    states = o[["seq_id", "pos"]].assign(seq_id=o["seq_id"].astype(str))
    at_next = state_tokens(states, tokens, step=1, columns=["token_id"])
    at_same = state_tokens(states, tokens, step=0, columns=["token_id"])
    kind = states["seq_id"].map(kinds) if kinds is not None else pd.Series("all", index=states.index)
    ok = at_next["has_token"].to_numpy()
    rows = []
    for k in pd.unique(kind[ok]):
        m = ok & (kind == k).to_numpy()
        rows.append({"reference_kind": str(k), "n_states": int(m.sum()),
                     "share_row_pos_plus_1": float((at_next["token_id"].to_numpy()[m] == first[m]).mean()),
                     "share_row_pos": float((at_same["token_id"].to_numpy()[m] == first[m]).mean())})
    return pd.DataFrame(rows, columns=["reference_kind", "n_states", "share_row_pos_plus_1", "share_row_pos"])


def window_routing_check(oracle: pd.DataFrame, tokens: pd.DataFrame, row_offset: int = 1) -> pd.DataFrame:
    """The Oracle's window routing (``window_new`` = ``u_bar_window[1] − u_bar_window[0]``) against the tokens'
    ``new_experts`` at row ``pos + row_offset`` (``token_new``; 1 under the convention, 2 finds the producing-row
    tables of older traces), one row per state with ``accept_len >= 1`` and a finite ``token_new``."""
    require_columns(oracle, ("u_bar_window",), "oracle.parquet")
    o = oracle[oracle["accept_len"].to_numpy() >= 1]
    u = np.stack([np.asarray(v, dtype=float)[:2] for v in o["u_bar_window"]]) if len(o) else np.zeros((0, 2))
    states = o[["seq_id", "pos"]].assign(seq_id=o["seq_id"].astype(str))
    tok = state_tokens(states, tokens, step=row_offset, columns=["new_experts"])
    ne = pd.to_numeric(tok["new_experts"], errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(ne)
    window_new = u[:, 1] - u[:, 0]
    return pd.DataFrame({"seq_id": states["seq_id"].to_numpy()[keep], "pos": states["pos"].to_numpy()[keep],
                         "window_new": window_new[keep], "token_new": ne[keep],
                         "abs_diff": np.abs(window_new[keep] - ne[keep])})


def require_convention(states: pd.DataFrame, tokens: pd.DataFrame, origin: str = "tokens.parquet") -> None:
    """Raise when a sequence's token rows do not cover its states' decisions (rows 0..S for S states, one
    state per row of ``states``), as under the old simulator convention, naming the sequences, rather than
    joining every decision one token off. Sequences without any token row are not checked."""
    n_states = states.groupby(states["seq_id"].astype(str)).size()
    n_tokens = tokens.groupby(tokens["seq_id"].astype(str)).size().reindex(n_states.index)
    short = n_states.index[(n_tokens < n_states + 1).fillna(False).to_numpy()]
    if len(short):
        raise SpeclimitsError(
            f"{origin}: sequences {list(short[:5])} have {int(n_tokens[short[0]])} token rows for "
            f"{int(n_states[short[0]])} Oracle states; the convention needs one more (row 0 = the token the "
            "context ends with at state 0, row pos + 1 = the token state pos drafts first). Regenerate the trace "
            "(a simulated one with `speclimits simulate`) or see the methods page, \"Reference kinds and positions\"")
