"""The validator catches each class of defect and names file, column and first rows."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from speclimits.cli import main
from speclimits.errors import TraceFormatError
from speclimits.trace import read_trace, write_table
from speclimits.trace import find_problems, validate_trace


@pytest.fixture()
def trace_copy(smoke_trace, tmp_path):
    dst = tmp_path / "t"
    shutil.copytree(smoke_trace, dst)
    return dst


def _first_decode(df: pd.DataFrame) -> int:
    return int(np.flatnonzero((df["phase"] == "decode").to_numpy())[3])


def _set(col, value):
    def mutate(df):
        row = _first_decode(df)
        df[col] = df[col].astype(type(value)) if isinstance(value, float) else df[col]
        df.loc[row, col] = value
        return df, row
    return mutate


def _shrink_context(df):
    row = _first_decode(df) + 1
    df.loc[row, "context_len"] = df.loc[row - 1, "context_len"]
    return df, row


ROUND_DEFECTS = [
    (lambda df: (df.drop(columns=["t_target_ms"]), None), "t_target_ms", "required column is missing"),
    (_set("t_target_ms", -1.0), "t_target_ms", "timings must not be negative"),
    (_set("t_draft_ms", float("nan")), "t_draft_ms", "must not be NaN"),
    (_set("m", 99), "m", "must equal n_draft + 1 on decode rounds"),
    (_set("n_accepted", 50), "n_accepted", "accepted must lie in [0, n_draft]"),
    (_set("n_emitted", 40), "n_emitted", "emitted must lie in [0, n_accepted + 1]"),
    (_set("u_bar", 3.0), "u_bar", "must be >= top_k = 8"),
    (_set("u_bar", 500.0), "u_bar", "must be <= n_experts = 128"),
    (_set("kv_usage", 1.5), "kv_usage", "must lie in [0, 1]"),
    (_shrink_context, "context_len", "must grow from round to round"),
    (_set("phase", "warmup"), "phase", "must be 'prefill' or 'decode'"),
]


def _at(col, change, row=5):
    """Replace the list or value ``df.at[row, col]`` by ``change(it)``."""
    def mutate(df):
        df.at[row, col] = change(df.at[row, col])
        return df, row
    return mutate


ORACLE_DEFECTS = [
    (_at("match_prob", lambda v: v[:-1]), "match_prob", "lists must have length 10"),
    (_at("draft_conf", lambda v: np.r_[1.2, v[1:]].astype(np.float32)), "draft_conf",
     "probabilities must be finite and in [0, 1]"),
    (_at("u_bar_window", lambda v: np.r_[v[:3], v[2] - 1.0, v[4:]].astype(float)), "u_bar_window",
     "must not decrease as the window grows"),
    (_at("pos", lambda v: 77), "pos", "each seq_id must have pos = 0..N-1 exactly once"),
    (_at("accept_len", lambda v: 11), "accept_len", "must be an integer in 0..10"),
]
DEFECTS = [("rounds", *d) for d in ROUND_DEFECTS] + [("oracle", *d) for d in ORACLE_DEFECTS]


def assert_defect_named(root, table, mutate, column, message):
    """``table`` rewritten as ``mutate`` leaves it fails validation naming the file, column and (when
    ``mutate`` returns one) the first row; also used by test_trace_batch."""
    df, row = mutate(getattr(read_trace(root), table).copy())
    write_table(root, table, df)
    with pytest.raises(TraceFormatError) as err:
        validate_trace(root)
    text = str(err.value)
    assert f"{table}.parquet, column '{column}': {message}" in text, text
    if row is not None:
        assert f"first at row {row}" in text, text


@pytest.mark.parametrize("table, mutate, column, message", DEFECTS, ids=[f"{d[0]}-{d[3][:30]}" for d in DEFECTS])
def test_defects_are_named(trace_copy, table, mutate, column, message):
    assert_defect_named(trace_copy, table, mutate, column, message)


def test_meta_missing_broken_or_incomplete(trace_copy):
    meta_path = trace_copy / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["k_values"]
    meta["source"] = "guess"
    meta_path.write_text(json.dumps(meta))
    text = "\n".join(str(p) for p in find_problems(trace_copy))
    assert "meta.json: required key 'k_values' is missing" in text
    assert "'source' must be one of" in text
    meta_path.write_text("{not json")
    assert "meta.json: is not valid JSON" in str(find_problems(trace_copy)[0])
    meta_path.unlink()
    assert str(find_problems(trace_copy)[0]) == "meta.json: is missing"


def test_all_problems_reported_together(trace_copy):
    df = read_trace(trace_copy).rounds.copy()
    row = _first_decode(df)
    df.loc[row, "t_target_ms"] = -2.0
    df.loc[row + 1, "n_accepted"] = 99
    write_table(trace_copy, "rounds", df)
    problems = find_problems(trace_copy)
    assert {p.column for p in problems} >= {"t_target_ms", "n_accepted"}


def test_zero_timings_and_prefill_are_not_errors(smoke_trace):
    rounds = read_trace(smoke_trace).rounds
    assert (rounds["t_target_ms"] == 0).any() and (rounds["phase"] == "prefill").any()
    validate_trace(smoke_trace)  # no exception


def test_cli_exit_codes_and_message(trace_copy, capsys):
    assert main(["validate", str(trace_copy)]) == 0
    assert "valid" in capsys.readouterr().out
    df = read_trace(trace_copy).rounds.copy()
    df.loc[_first_decode(df), "t_target_ms"] = -1.0
    write_table(trace_copy, "rounds", df)
    assert main(["validate", str(trace_copy)]) == 2
    err = capsys.readouterr().err
    assert "rounds.parquet, column 't_target_ms': timings must not be negative" in err
    assert "Traceback" not in err
    assert main(["validate", str(trace_copy / "nowhere")]) == 2


def test_one_oracle_checker_for_validate_and_the_oracle_loader(trace_copy):
    """``speclimits validate`` and ``OracleInputs.from_frame`` apply the same rules to oracle.parquet."""
    from speclimits.oracle.inputs import OracleInputs

    good = read_trace(trace_copy).oracle.copy()
    # row order is free: a shuffled table is valid for both and loads to the same arrays
    shuffled = good.sample(frac=1.0, random_state=0).reset_index(drop=True)
    write_table(trace_copy, "oracle", shuffled)
    validate_trace(trace_copy)
    a, b = OracleInputs.from_frame(good), OracleInputs.from_frame(shuffled)
    np.testing.assert_array_equal(a.match_prob, b.match_prob)
    np.testing.assert_array_equal(a.u_bar_window, b.u_bar_window)
    # a window that shrinks (fewer unique experts over more tokens) was accepted by the loader before
    bad = good.copy()
    v = np.array(bad.at[7, "u_bar_window"], dtype=float)
    v[2] = v[1] - 0.5
    bad.at[7, "u_bar_window"] = v
    write_table(trace_copy, "oracle", bad)
    message = "oracle.parquet, column 'u_bar_window': must not decrease as the window grows"
    assert message in str(pytest.raises(TraceFormatError, validate_trace, trace_copy).value)
    with pytest.raises(TraceFormatError, match="must not decrease as the window grows.*first at row 7"):
        OracleInputs.from_frame(bad)
    # a duplicated state is named by its row in both
    dup = good.copy()
    dup.loc[3, "pos"] = dup.loc[2, "pos"]
    write_table(trace_copy, "oracle", dup)
    assert "first at row 3" in str(pytest.raises(TraceFormatError, validate_trace, trace_copy).value)
    with pytest.raises(TraceFormatError, match=r"pos = 0..N-1 exactly once.*first at row 3"):
        OracleInputs.from_frame(dup)
