"""Trace directory round trip, the explicit fit filters, and the cost-model JSON."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits.costmodel import CostModel
from speclimits.errors import CostModelError, TraceFormatError
from speclimits.trace import decode_rounds, list_column, new_meta, read_table, read_trace, write_trace


def _rounds() -> pd.DataFrame:
    return pd.DataFrame({
        "generation_id": [0, 0, 0, 1, 1],
        "prompt_id": ["a", "a", "a", "b", "b"],
        "K": [2, 2, 2, 0, 0],
        "m": [40, 3, 3, 20, 1],
        "round": [0, 1, 2, 0, 1],
        "phase": ["prefill", "decode", "decode", "prefill", "decode"],
        "t_target_ms": [20.0, 9.5, 0.0, 15.0, 8.0],
        "t_draft_ms": [1.0, 1.0, 1.1, 0.5, 0.0],
        "u_bar": [100.0, 12.5, 13.0, 90.0, 8.0],
        "e_max": [110.0, 15.0, 16.0, 100.0, 8.0],
        "context_len": [0, 40, 43, 0, 20],
        "kv_usage": [0.01, 0.01, 0.01, 0.01, 0.01],
        "graph_bucket": [40, 4, 4, 20, 1],
        "n_draft": [0, 2, 2, 0, 0],
        "n_accepted": [0, 2, 1, 0, 0],
        "n_emitted": [1, 3, 2, 1, 1],
    })


def test_round_trip_keeps_values_types_and_lists(tmp_path):
    rounds = _rounds()
    oracle = pd.DataFrame({"seq_id": ["s"] * 2, "pos": [0, 1], "context_len": [5, 6],
                           "match_prob": [np.array([0.9, 0.5]), np.array([0.7, 0.1])],
                           "draft_conf": [np.array([0.8, 0.4]), np.array([0.6, 0.2])],
                           "accept_len": [1, 0],
                           "u_bar_window": [np.array([8.0, 10.0, 12.0]), np.array([8.0, 9.0, 11.0])]})
    meta = new_meta(source="simulator", simulated=True, seed=3)
    write_trace(tmp_path, meta, rounds=rounds, oracle=oracle)
    tr = read_trace(tmp_path)
    pd.testing.assert_frame_equal(tr.rounds, rounds, check_dtype=False)
    assert tr.rounds["K"].dtype.kind == "i"
    np.testing.assert_allclose(list_column(tr.oracle, "u_bar_window", 3), [[8, 10, 12], [8, 9, 11]])
    assert tr.meta["seed"] == 3 and tr.meta["tables"] == {"rounds": 5, "oracle": 2}
    assert tr.simulated and "SIMULATED" in tr.source_label
    assert tr.tokens is None


def test_table_may_be_a_directory_of_parts_and_hidden_files_are_ignored(tmp_path):
    rounds = _rounds()
    part_dir = tmp_path / "rounds.parquet"
    part_dir.mkdir()
    rounds.iloc[:3].to_parquet(part_dir / "part-000.parquet")
    rounds.iloc[3:].to_parquet(part_dir / "part-001.parquet")
    (part_dir / ".part-002.parquet.tmp").write_bytes(b"half written")
    got = read_table(tmp_path, "rounds").sort_values(["generation_id", "round"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, rounds, check_dtype=False)


def test_list_column_names_ragged_rows():
    df = pd.DataFrame({"x": [np.zeros(3), np.zeros(2), np.zeros(3)]})
    with pytest.raises(TraceFormatError, match=r"column 'x': lists must have length 3 \[1 row\(s\); first at row 1\]"):
        list_column(df, "x", 3)


def test_decode_filter_counts_prefill_zero_timings_and_k0():
    rounds = _rounds()
    kept, rep = decode_rounds(rounds, timing="target")
    assert (rep.n_total, rep.n_prefill, rep.n_zero_timing, rep.n_kept) == (5, 2, 1, 2)
    assert set(kept["t_target_ms"]) == {9.5, 8.0}
    kept_d, rep_d = decode_rounds(rounds, timing="draft")
    # the K = 0 round has no draft: excluded as such, not counted as a zero timing
    assert (rep_d.n_no_draft, rep_d.n_zero_timing, rep_d.n_kept) == (1, 0, 2)
    assert "excluded" in str(rep_d)
    with pytest.raises(ValueError):
        decode_rounds(rounds, timing="nope")


def test_cost_model_json_round_trip_and_evaluation(tmp_path):
    data = {"target": {"c": 0.001, "by_m": {"1": {"beta0": 5.0, "alpha": 0.1}, "2": {"beta0": 6.0, "alpha": 0.2}}},
            "draft": {"a": 0.5, "b": 0.1}}
    cm = CostModel.from_dict(data)
    path = cm.write(tmp_path / "cm.json")
    cm2 = CostModel.read(path)
    assert cm2 == cm
    np.testing.assert_allclose(cm.target_ms([1, 2], [8.0, 10.0], [1000, 2000]), [5 + 0.8 + 1, 6 + 2 + 2])
    np.testing.assert_allclose(cm.draft_ms([0, 1, 3]), [0.0, 0.6, 1.6])
    assert cm.with_alpha_scale(0.0).alpha == {1: 0.0, 2: 0.0}
    # a round that drafts k tokens verifies k + 1 rows: k = 1 -> 0.6 + 6 + 0.2*10 + 2; k = 0 -> no draft, m = 1
    np.testing.assert_allclose(cm.round_ms([1, 0], [10.0, 8.0], [2000, 1000]), [0.6 + 6 + 2 + 2, 5 + 0.8 + 1])
    fixed, slope = cm.action_terms(1)
    np.testing.assert_allclose(fixed, [5.0, 6.6])
    np.testing.assert_allclose(slope, [0.1, 0.2])
    fixed2, slope2 = cm.action_terms(2)  # m = 3 is not in the model: NaN, not a guess
    assert np.isnan(fixed2[2]) and np.isnan(slope2[2])


def test_cost_model_write_is_strict(tmp_path):
    """No NaN token in the file: a NaN in the fit's extras is written as null (valid JSON, read
    back), a non-finite coefficient is refused before anything is written."""
    from dataclasses import replace

    data = {"target": {"c": 0.001, "by_m": {"2": {"beta0": 6.0, "alpha": 0.2}}}, "draft": {"a": 0.5, "b": 0.1},
            "fit": {"draft": {"r2": float("nan")}}}
    cm = CostModel.from_dict(data)
    path = cm.write(tmp_path / "cm.json")
    text = path.read_text()
    assert "NaN" not in text and json.loads(text)["fit"]["draft"]["r2"] is None
    assert CostModel.read(path).alpha == {2: 0.2}
    for bad in (replace(cm, c=float("nan")), replace(cm, alpha={2: float("inf")})):
        with pytest.raises(CostModelError, match="non-finite"):
            bad.write(tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["target"].pop("c"), "missing 'target.c'"),
    (lambda d: d["target"]["by_m"]["2"].pop("alpha"), "missing 'target.by_m.2.alpha'"),
    (lambda d: d["draft"].update(a="fast"), "'draft.a' must be a number"),
    (lambda d: d["target"]["by_m"].update({"x": {"beta0": 1, "alpha": 1}}), "key 'x' is not an integer m"),
    (lambda d: d.pop("draft"), "missing 'draft'"),
])
def test_cost_model_errors_name_the_field(mutate, message):
    data = {"target": {"c": 0.001, "by_m": {"2": {"beta0": 6.0, "alpha": 0.2}}}, "draft": {"a": 0.5, "b": 0.1}}
    mutate(data)
    with pytest.raises(CostModelError, match=message.replace(".", r"\.").replace("'", "'")):
        CostModel.from_dict(data)


def test_cost_model_missing_m_is_named(tmp_path):
    path = tmp_path / "cm.json"
    path.write_text(json.dumps({"target": {"c": 0.0, "by_m": {"2": {"beta0": 6.0, "alpha": 0.2}}},
                                "draft": {"a": 0.5, "b": 0.1}}))
    cm = CostModel.read(path)
    with pytest.raises(CostModelError, match=r"no target coefficients for m = \[1, 3\]"):
        cm.require_ms([1, 2, 3])
    with pytest.raises(CostModelError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        CostModel.read(tmp_path / "bad.json")


def test_trace_package_stands_alone():
    """The trace format's owner imports none of its users (no circle with the Oracle or the harness)."""
    import subprocess
    import sys

    code = ("import sys, speclimits.trace, speclimits.trace.cli\n"
            "users = sorted(m for m in sys.modules if m.startswith(('speclimits.oracle', 'speclimits.tracing', "
            "'speclimits.stats', 'speclimits.simulate')))\n"
            "assert not users, users\n"
            "import speclimits.trace as t\n"
            "assert {'read_trace', 'decode_rounds', 'Trace', 'validate_trace', 'write_part', 'check_oracle_frame'} "
            "<= set(t.__all__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_prompt_ids_and_reference_kind_have_one_reader(tmp_path):
    """read_prompts is the one reader: ids fall back to question_id, prompt_id, the line number; the Oracle's
    reference kinds of a trace without reference_kind follow those ids (a prompt with a reference is teacher-forced)."""
    from speclimits.oracle.prepare import reference_kinds
    from speclimits.trace import Trace
    from speclimits.trace.prompts import PROMPTS_FILE, read_prompts

    rows = [{"question_id": 81, "turns": ["hello"]},
            {"prompt_id": "p2", "prompt": "text", "reference": "held-out text"},
            {"prompt": "third", "reference_token_ids": [5, 6]},
            {"id": "x", "prompt": "fourth"}]
    (tmp_path / PROMPTS_FILE).write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    prompts = read_prompts(tmp_path / PROMPTS_FILE)
    assert [p.id for p in prompts] == ["81", "p2", "3", "x"]
    assert [p.teacher_forced for p in prompts] == [False, True, True, False]
    tr = Trace(tmp_path, {"source": "vllm"})
    tr.__dict__["oracle"] = pd.DataFrame({"seq_id": ["81", "p2", "3", "x"], "pos": 0})
    kinds, how = reference_kinds(tr, np.array(["81", "p2", "3", "x"]))
    assert kinds.tolist() == ["greedy", "teacher-forced", "teacher-forced", "greedy"]
    assert PROMPTS_FILE in how
