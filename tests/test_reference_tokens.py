"""``tokens.parquet`` in the documented layout, as the harness's Oracle pass rewrites it
(:func:`speclimits.tracing.oracle_mode.write_reference_tokens`, built on
:mod:`speclimits.trace.reference_tokens`), on a small handmade trace: no vLLM needed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits.errors import SpeclimitsError
from speclimits.trace import append_lines, read_table, write_part
from speclimits.trace.reference_tokens import reference_tokens, to_reading_rows
from speclimits.tracing.oracle_mode import write_reference_tokens

PROMPT_LEN = 4


def _gen_rows(seq: str, gid: int, K: int, ids: list[int], seed: int) -> pd.DataFrame:
    """Token rows of one generation as the sweep writes them (reading rows; the last has no routing)."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    experts = [rng.integers(0, 8, size=4).astype(np.int16) for _ in range(n - 1)] + [None]
    return pd.DataFrame({
        "seq_id": seq, "pos": np.arange(n), "token_id": np.asarray(ids, dtype=np.int64), "text": "",
        "new_experts": np.r_[rng.uniform(0, 2, n - 1), np.nan], "experts": experts,
        "generation_id": gid, "K": K, "round": np.arange(n), "row": 0, "context_len": PROMPT_LEN + np.arange(n),
        "reference_kind": "greedy"})


@pytest.fixture()
def trace(tmp_path):
    root = tmp_path / "tr"
    greedy_g, greedy_f = [5, 6, 7, 8, 9], [20, 21, 22, 23, 24]
    write_part(root, "tokens", "part-g000000", _gen_rows("g", 0, 0, greedy_g, 0))
    write_part(root, "tokens", "part-g000001", _gen_rows("f", 1, 0, greedy_f, 1))  # this part: f only
    write_part(root, "tokens", "part-g000002", _gen_rows("g", 2, 2, greedy_g, 2))  # tokens="all": K = 2 too
    append_lines(root / "generations.jsonl", [
        {"generation_id": 0, "prompt_id": "g", "K": 0, "output_token_ids": greedy_g},
        {"generation_id": 1, "prompt_id": "f", "K": 0, "output_token_ids": greedy_f},
        {"generation_id": 2, "prompt_id": "g", "K": 2, "output_token_ids": greedy_g}])
    ref_f = [20, 21, 30, 31, 24, 33]  # held-out text: the target agrees with rows 0, 1, 3 (forced at 2, 4)
    oracle = pd.DataFrame({"seq_id": ["g"] * 4 + ["f"] * 5, "pos": [0, 1, 2, 3, 0, 1, 2, 3, 4],
                           "forced": [False] * 4 + [False, False, True, False, True]})
    write_part(root, "oracle", "part-s00000", oracle)
    return {"root": root, "ref_f": ref_f, "greedy_g": greedy_g}


def test_rewrite_gives_the_documented_layout(trace):
    root, ref_f = trace["root"], trace["ref_f"]
    before = read_table(root, "tokens")
    assert write_reference_tokens(root, {"f": ref_f}, k_ref=0, decode=lambda t: f"<{t}>") == 3
    t = read_table(root, "tokens")
    f = t[t["seq_id"] == "f"].sort_values("pos")
    # the teacher-forced sequence holds the held-out text, decoded, without routing or generation
    assert f["token_id"].tolist() == ref_f and f["text"].tolist() == [f"<{x}>" for x in ref_f]
    assert (f["reference_kind"] == "teacher-forced").all() and f["generation_id"].isna().all()
    assert f["new_experts"].isna().all() and f["experts"].isna().all()
    assert f["context_len"].tolist() == [PROMPT_LEN + p for p in range(6)]
    # the target's choice: agrees where the Oracle pass did not force; row 0 is its own first token;
    # the last row is forced by no state: unknown
    assert f["target_agrees"].tolist()[:5] == [True, True, False, True, False] and pd.isna(f["target_agrees"].iloc[5])
    assert f["target_token_id"].tolist()[:2] == [20, 21] and pd.isna(f["target_token_id"].iloc[2])
    # the greedy reference keeps its rows and routing; the target's choice is the token itself, to the last row
    g = t[(t["seq_id"] == "g") & (t["K"] == 0)].sort_values("pos")
    g0 = before[(before["seq_id"] == "g") & (before["K"] == 0)].sort_values("pos")
    np.testing.assert_array_equal(g["new_experts"], g0["new_experts"])
    assert g["target_agrees"].all() and g["target_token_id"].tolist() == trace["greedy_g"]
    # a generation that is not the reference (tokens="all") is kept as it was, without the target's choice
    other = t[t["generation_id"] == 2]
    assert len(other) == 5 and other["target_agrees"].isna().all() and (other["reference_kind"] == "greedy").all()
    # idempotent: a second rewrite reads its own output back to the same table
    write_reference_tokens(root, {"f": ref_f}, k_ref=0, decode=lambda t: f"<{t}>")
    again = read_table(root, "tokens")
    pd.testing.assert_frame_equal(again.drop(columns="experts"), t.drop(columns="experts"))


def test_a_greedy_prompt_made_teacher_forced_later_and_bad_input(trace):
    root = trace["root"]
    write_reference_tokens(root, {}, k_ref=0, decode=None)
    assert set(read_table(root, "tokens")["reference_kind"]) == {"greedy"}
    # the same trace with f's held-out text given afterwards: its greedy rows are replaced
    write_reference_tokens(root, {"f": trace["ref_f"]}, k_ref=0, decode=None)
    t = read_table(root, "tokens")
    assert t.loc[t["seq_id"] == "f", "token_id"].tolist() == trace["ref_f"]
    # two generations of one sequence cannot both be the reference
    rows = pd.concat([_gen_rows("g", 0, 0, [1, 2, 3], 0), _gen_rows("g", 2, 2, [1, 2, 3], 1)])
    with pytest.raises(SpeclimitsError, match="duplicate"):
        reference_tokens(rows, pd.DataFrame({"seq_id": ["g"], "pos": [0], "forced": [False]}), {}, {"g": 1})


def test_to_reading_rows_moves_routing_one_row_back():
    prod = pd.DataFrame({"seq_id": ["a"] * 3 + ["b"] * 2, "pos": [0, 1, 2, 0, 1], "new_experts": [1.0, 2, 3, 4, 5],
                         "experts": [np.array([i], np.int16) for i in range(5)]})
    out = to_reading_rows(prod)
    np.testing.assert_array_equal(out["new_experts"], [2.0, 3, np.nan, 5, np.nan])
    assert [None if e is None else int(e[0]) for e in out["experts"]] == [1, 2, None, 4, None]
