"""The layout rules of ``tokens.parquet`` (the methods page, "Reference kinds and positions";
:mod:`speclimits.trace.reference_tokens`), checked the same way on the bundled measured trace and
on a trace the harness writes itself (``tests/test_tracing_vllm.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits import linguistic as ling


def layout_failures(oracle: pd.DataFrame, tokens: pd.DataFrame, held_out: dict[str, list[int]],
                    min_states: int = 1) -> list[str]:
    """Every rule the table breaks (empty: it follows the layout). ``held_out``: per teacher-forced
    sequence, the reference token ids the Oracle walked."""
    bad: list[str] = []
    tok = tokens.assign(seq_id=tokens["seq_id"].astype(str))
    o = oracle.assign(seq_id=oracle["seq_id"].astype(str))
    kinds = dict(zip(tok["seq_id"], tok["reference_kind"]))
    # one row more than states per sequence; both kinds recorded as walked
    n_rows, n_states = tok.groupby("seq_id").size(), o.groupby("seq_id").size()
    if not n_rows.reindex(n_states.index).eq(n_states + 1).all():
        bad.append("a sequence does not have one token row more than Oracle states")
    if "reference_kind" in o.columns:  # traces the harness writes now record it in both tables
        o_kinds = dict(zip(o["seq_id"], o["reference_kind"]))
        if {s: kinds.get(s) for s in o_kinds} != o_kinds:
            bad.append("reference_kind differs between tokens.parquet and oracle.parquet")
    if {s for s, k in kinds.items() if k == "teacher-forced"} != set(held_out):
        bad.append("the teacher-forced sequences are not the prompts with a held-out reference")
    # state pos drafts row pos + 1 first, in every state with a matched draft
    align = ling.alignment_check(o, tok, kinds)
    for r in align.itertuples():
        if r.n_states < min_states or r.share_row_pos_plus_1 != 1.0:
            bad.append(f"{r.reference_kind}: first draft = row pos + 1 in {r.share_row_pos_plus_1:.1%} of "
                       f"{r.n_states} states")
    # routing on the reading rows: the window's first two rows read rows pos and pos + 1
    chk = ling.window_routing_check(o, tok)
    if len(chk) < min_states or chk["abs_diff"].max() > 1e-9:
        bad.append(f"window routing != new_experts of row pos + 1 in {(chk['abs_diff'] > 1e-9).sum()} of "
                   f"{len(chk)} states")
    # teacher-forced rows hold the held-out text, without routing or generation
    for s, ids in held_out.items():
        rows = tok[tok["seq_id"] == s].sort_values("pos")
        if rows["token_id"].tolist() != list(ids):
            bad.append(f"{s}: teacher-forced rows are not its reference tokens")
        if not ((rows["reference_kind"] == "teacher-forced").all() and rows["new_experts"].isna().all()
                and rows["experts"].isna().all() and rows["generation_id"].isna().all()):
            bad.append(f"{s}: teacher-forced rows carry a kind, routing or generation they should not")
    greedy = tok[~tok["seq_id"].isin(held_out)]
    if not (greedy["reference_kind"] == "greedy").all():
        bad.append("a greedy reference's rows are not labelled greedy")
    last = (greedy["pos"] == greedy.groupby("seq_id")["pos"].transform("max")).to_numpy()
    if not (greedy.loc[last, "new_experts"].isna().all() and np.isfinite(greedy.loc[~last, "new_experts"]).all()):
        bad.append("greedy routing is not missing exactly on each generation's last token")
    if not (greedy["target_agrees"].astype(bool).all()
            and (greedy["target_token_id"].astype("int64") == greedy["token_id"]).all()):
        bad.append("on a greedy reference the target's choice is not the token itself")
    # the target's own choice on held-out text: agrees exactly where the Oracle pass did not force
    forced = tok[tok["seq_id"].isin(held_out)]
    if len(forced):
        agree = forced["target_agrees"].dropna().astype(bool)
        share_forced = o.loc[o["seq_id"].isin(held_out), "forced"].mean()
        if not np.isclose(agree.mean(), 1.0 - share_forced):
            bad.append(f"teacher-forced target_agrees share {agree.mean():.3f} != 1 - forced {1 - share_forced:.3f}")
        known = forced.dropna(subset=["target_token_id"])
        mask = known["target_agrees"].fillna(False).astype(bool)
        if not (known["target_token_id"][mask].astype("int64") == known["token_id"][mask]).all():
            bad.append("where the target agrees, target_token_id is not the reference token")
    return bad
