"""The Oracle's validation against the measured sweep, its interval, and what online policies may see."""

from __future__ import annotations

import argparse
import inspect
import json
from dataclasses import replace

import jupytext
import numpy as np
import pandas as pd
import pytest

from speclimits.bootstrap import HEADLINE_N_BOOT
from speclimits.cli import main
from speclimits.control.fit import fit_calibration, mean_u_bar, split_sequences
from speclimits.control.offline import state_actions
from speclimits.control.rules import CalibrationMap, ConfidenceThreshold, DeltaRule, StaticK
from speclimits.costmodel import CostModel
from speclimits.errors import TraceFormatError
from speclimits.oracle import prepare_oracle
from speclimits.oracle.calibration import gap_interval
from speclimits.oracle.cli import register
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.prepare import resolve_surrogate
from speclimits.oracle.report import oracle_report
from speclimits.oracle.validation import validate_against_sweep
from speclimits.paths import BOOK_DIR, TRACES_DIR, default_trace
from speclimits.trace import new_meta, read_table, validate_trace, write_table, write_trace

MODEL = CostModel(c=0.0, beta0={1: 1.0, 2: 1.5}, alpha={1: 0.0, 2: 0.0}, a=0.25, b=0.0)


def _round(gen, prompt, k, r, phase, tt, td, emitted):
    return {"generation_id": gen, "prompt_id": prompt, "K": k, "m": k + 1 if phase == "decode" else 10,
            "round": r, "phase": phase, "t_target_ms": tt, "t_draft_ms": td, "u_bar": 2.0, "e_max": 2.0,
            "context_len": 10 + r, "kv_usage": 0.1, "graph_bucket": 2, "n_draft": k if phase == "decode" else 0,
            "n_accepted": emitted - 1 if phase == "decode" else 0, "n_emitted": emitted}


@pytest.fixture()
def tiny_trace(tmp_path):
    """One prompt 'a' with a two-token reference; a K = 0 and a K = 1 generation of it, and a
    prompt 'b' that the Oracle does not walk (its rounds must not count)."""
    rounds = pd.DataFrame([
        _round(0, "a", 0, 0, "prefill", 50.0, 0.0, 1),  # prefill: outside both views
        _round(0, "a", 0, 1, "decode", 1.1, 0.0, 1),
        _round(0, "a", 0, 2, "decode", 1.1, 0.0, 1),
        _round(1, "a", 1, 0, "prefill", 50.0, 0.3, 1),
        _round(1, "a", 1, 1, "decode", 1.6, 0.3, 2),
        _round(2, "b", 1, 0, "decode", 99.0, 9.0, 1),
    ])
    oracle = pd.DataFrame({"seq_id": ["a", "a"], "pos": [0, 1], "context_len": [10, 11],
                           "match_prob": [[0.9], [0.9]], "draft_conf": [[0.9], [0.9]], "accept_len": [1, 0],
                           "u_bar_window": [[2.0, 3.0], [2.0, 3.0]]})
    meta = new_meta(source="vllm", models={}, method="eagle3", hardware="test", dtype="float32", k_values=[0, 1],
                    seed=0)
    return write_trace(tmp_path / "tiny", meta, rounds=rounds, oracle=oracle)


def test_validation_against_a_hand_computation(tiny_trace):
    setup = prepare_oracle(tiny_trace, MODEL, "exact")
    v = validate_against_sweep(setup, kind="greedy")
    row = v.table.set_index("K").loc[1]
    # measured: K = 0 decodes 2 tokens in 2.2 ms, K = 1 emits 2 tokens in one 1.9 ms round
    assert row["measured_ms_per_token"] == pytest.approx(1.9 / 2)
    assert row["measured_speedup"] == pytest.approx((2.2 / 2) / (1.9 / 2))
    # predicted (exact transitions): plain decoding 2 x beta0(1) = 2.0 ms; static K = 1 drafts one
    # token (0.25 ms) and verifies m = 2 (1.5 ms), the draft matches: both tokens in 1.75 ms
    assert row["predicted_ms_per_token"] == pytest.approx(1.75 / 2)
    assert row["predicted_speedup"] == pytest.approx(2.0 / 1.75)
    assert row["rel_error"] == pytest.approx((2.0 / 1.75) / (2.2 / 1.9) - 1)
    assert v.warning is None  # 1.3% off
    assert v.to_dict()["rows"][0]["K"] == 1
    # a slow draft misses the sweep beyond the tolerance: warned
    slow_draft = CostModel(c=0.0, beta0={1: 1.0, 2: 1.5}, alpha={1: 0.0, 2: 0.0}, a=2.0, b=0.0)
    v = validate_against_sweep(prepare_oracle(tiny_trace, slow_draft, "exact"), kind="greedy")
    assert v.max_abs_rel_error > 0.05 and "K = 1" in v.warning


@pytest.mark.parametrize("name, greedy, tolerance", [("measured-eagle3", 32, 0.05), ("twin-eagle3", 44, 0.06)])
def test_headline_interval_and_validation_on_the_measured_trace(capsys, name, greedy, tolerance):
    """Both measured targets (32 prompts, + 12 long-context on the twin, greedy; 12 held-out passages teacher-forced):
    the surrogate reproduces the static-K sweep within 5% on the trained target; on the twin it under-predicts the
    long drafts by up to 5.6% (K = 8), beyond the Oracle's 5% warning, asserted as measured."""
    assert main(["oracle", str(TRACES_DIR / name), "--n-boot", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    head = out["headline"]
    assert head["kind"] == "greedy" and out["reference_kinds"] == {"greedy": greedy, "teacher-forced": 12}
    lo, hi = head["interval"]["interval"]["speedup"]
    assert lo <= head["speedup"] * 1.02 and hi >= head["speedup"] * 0.98
    # the book's surrogate reproduces every measured static K within 5% on the greedy references
    rows = out["validation"]["rows"]
    assert [r["K"] for r in rows] == list(range(1, 11))
    assert max(abs(r["rel_error"]) for r in rows) == pytest.approx(out["validation"]["max_abs_rel_error"])
    assert out["validation"]["max_abs_rel_error"] < tolerance
    assert all("misses the measured static-K sweep" in w for w in out["warnings"])
    assert bool(out["warnings"]) == (out["validation"]["max_abs_rel_error"] > 0.05)
    # teacher-forced references are a different process: the Oracle gains far less there
    assert out["by_kind"]["teacher-forced"]["speedup"] < out["by_kind"]["greedy"]["speedup"] - 0.5


def test_raw_surrogate_fails_validation_on_the_measured_trace():
    v = validate_against_sweep(prepare_oracle(default_trace(), surrogate="raw"), kind="greedy")
    assert v.max_abs_rel_error > 0.3 and v.warning  # raw q understates greedy acceptance by far


def test_auto_rule_follows_the_calibration_gap(smoke_trace):
    assert resolve_surrogate("auto", (0.35, 0.29, 0.39))[0] == "calibrated"
    assert resolve_surrogate("auto", (0.01, 0.005, 0.015))[0] == "raw"  # significant but negligible
    assert resolve_surrogate("auto", (0.05, -0.01, 0.11))[0] == "raw"  # large but not distinguishable from 0
    setup = prepare_oracle(smoke_trace)
    assert setup.surrogate == "raw"  # the simulator's draft is calibrated
    shy = replace(setup.raw_inputs, match_prob=setup.raw_inputs.match_prob ** 3, _cache={})
    assert resolve_surrogate("auto", gap_interval(shy))[0] == "calibrated"


def test_online_policies_do_not_see_the_oracles_information(smoke_trace):
    """Scrambling what only the Oracle may know (match_prob, the counterfactual window Ū) on the
    held-out sequences must not change any action of the online policies."""
    setup = prepare_oracle(smoke_trace)
    inputs, model, k_max = setup.raw_inputs, setup.model, 6
    train_idx, test_idx = split_sequences(inputs, 0.5, seed=0)
    train, test = inputs.subset(train_idx), inputs.subset(test_idx)
    rng = np.random.default_rng(1)
    scrambled = replace(test, match_prob=rng.permutation(test.match_prob.ravel()).reshape(test.match_prob.shape),
                        u_bar_window=rng.permutation(test.u_bar_window.ravel()).reshape(test.u_bar_window.shape),
                        _cache={})
    u_mean, calib = mean_u_bar(train, k_max), CalibrationMap.from_isotonic(fit_calibration(train, k_max))
    rules = [StaticK(3), ConfidenceThreshold(0.4),
             DeltaRule(2.0, u_mean, calib, "mean", running_lambda=False, name="Delta fixed"),
             DeltaRule(2.0, u_mean, calib, "mean", running_lambda=False, stop="greedy", name="Delta greedy")]
    for rule in rules:
        a = state_actions(rule.bind(test, CostTable.build(test, model, k_max)))[0]
        b = state_actions(rule.bind(scrambled, CostTable.build(scrambled, model, k_max)))[0]
        np.testing.assert_array_equal(a, b, err_msg=rule.name)
    assert not np.array_equal(test.match_prob, scrambled.match_prob)


def test_reference_kind_column_is_read_and_checked(tiny_trace):
    oracle = read_table(tiny_trace, "oracle")
    oracle["reference_kind"] = "teacher-forced"
    write_table(tiny_trace, "oracle", oracle)
    setup = prepare_oracle(tiny_trace, MODEL, "exact")
    assert list(setup.kinds) == ["teacher-forced"] and "oracle.parquet column" in setup.notes[2]
    oracle["reference_kind"] = "guessed"
    write_table(tiny_trace, "oracle", oracle)
    with pytest.raises(TraceFormatError, match="reference_kind"):
        validate_trace(tiny_trace)


def test_cli_report_and_book_use_one_headline_bootstrap_size():
    """`speclimits oracle` and section 6 print the same headline interval only with the same B."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["oracle", "t"]).n_boot == HEADLINE_N_BOOT
    assert inspect.signature(oracle_report).parameters["n_boot"].default == HEADLINE_N_BOOT
    nb = jupytext.read(BOOK_DIR / "06_oracle.py")
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "n_boot = HEADLINE_N_BOOT" in params
