"""The reader-facing tables of book sections 7 (linguistic) and 8 (online control)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits import paper
from speclimits.book.views import control as cview
from speclimits.book.views import linguistic as lview
from speclimits.book.views.control_runs import BENCH_DIR, engine_table, share_long

NB = "\u00a0"
BOUNDS = {"oracle_exact_gain_over_best_static": 1.266}


def _kctx() -> pd.DataFrame:
    return pd.DataFrame({
        "context": ["code_format", "script_change", "code_vocab"], "n_decisions": [1427, 30, 745],
        "n_responses": [24, 9, 23], "share_long": [0.669, 0.4, 0.53], "long_lo": [0.528, 0.268, 0.393],
        "long_hi": [0.789, 0.519, 0.677], "share_k1": [0.132, 0.4, 0.267], "k1_lo": [0.072, 0.26, 0.16],
        "k1_hi": [0.202, 0.554, 0.392], "mean_k_star": [5.8, 3.9, 4.6]})


def test_k_by_context_puts_interval_and_paper_in_one_cell_each():
    out = lview.k_by_context(_kctx())
    assert list(out.columns)[:2] == ["Context", "Decisions (responses)"]
    row = out.iloc[0]
    assert row["Context"] == "code: formatting" and row["Decisions (responses)"] == "1\u2009427 (24)"
    assert row["$k^\\star \\ge 4$ [95% CI]"] == "0.67 [0.53; 0.79]"
    # the paper's value as the appendix prints it (three decimals), from speclimits.paper
    q = paper.K_BY_CONTEXT["code_format"]
    assert row["Paper $k^\\star \\ge 4$"] == f"{q['share_long']:.3f} [{q['long_lo']:.3f}; {q['long_hi']:.3f}]"
    assert out.iloc[2]["Paper $k^\\star \\ge 4$"] == "–"  # the paper has no code-vocabulary share
    assert len(out.columns) <= 6
    # finer labels: the paper's column, empty, is dropped
    fine = _kctx().assign(context=["comment", "control_flow", "function_start"])
    out = lview.k_by_context(fine, first="Fine label")
    assert "Paper $k^\\star \\ge 4$" not in out.columns and out["Fine label"].tolist()[0] == "comment"


def _rtab() -> pd.DataFrame:
    return pd.DataFrame({
        "contrast": ["script_change", "first_mismatch_reference", "first_mismatch_window"],
        "n_events": [30, 3067, 2068], "n_responses": [9, 32, 32], "before": [2.265, 2.634, 1.537],
        "at": [3.077, 2.648, 1.207], "diff": [0.812, 0.014, -0.331], "diff_lo": [0.322, -0.07, -0.555],
        "diff_hi": [1.25, 0.094, -0.137], "adjusted": [np.nan, np.nan, 0.199], "adjusted_lo": [np.nan, np.nan, 0.025],
        "adjusted_hi": [np.nan, np.nan, 0.369], "paper_before": [2.66, 3.3, 3.3], "paper_at": [3.12, 3.31, 3.31],
        "paper_diff": [0.46, 0.01, 0.01], "paper_diff_lo": [0.26, -0.05, -0.05], "paper_diff_hi": [0.66, 0.07, 0.07]})


def test_routing_gives_the_step_adjusted_contrast_a_row_and_planted_values_a_column():
    out = lview.routing(_rtab(), planted=[0.216, 0.014])
    assert out["Contrast"].tolist() == ["script change", "first mismatch, reference", "first mismatch, window",
                                        "first mismatch, window (step-adjusted)"]
    assert out.iloc[0]["Difference [95% CI]"] == "0.81 [0.32; 1.25]"
    assert out.iloc[0]["Paper: before → at, difference [95% CI]"] == "2.66 → 3.12, 0.46 [0.26; 0.66]"
    assert out.iloc[3]["Difference [95% CI]"] == "0.20 [0.03; 0.37]"
    assert out["Planted"].tolist() == ["+0.22", "+0.01", "–", "–"]
    assert "Planted" not in lview.routing(_rtab()).columns
    # no events: dashes
    empty = _rtab().assign(n_events=0, n_responses=0, before=np.nan, at=np.nan, diff=np.nan, diff_lo=np.nan,
                           diff_hi=np.nan, adjusted=np.nan)
    out = lview.routing(empty)
    assert (out["Difference [95% CI]"] == "–").all() and (out["Before → at"] == "–").all()


def _cmp() -> pd.DataFrame:
    ours = [(0.669, 0.528, 0.789), (0.367, 0.25, 0.502), (0.4, 0.268, 0.519), (0.4, 0.26, 0.554),
            (0.326, 0.191, 0.47), (0.812, 0.322, 1.25), (0.014, -0.07, 0.094)]
    names = ["k* >= 4 at code formatting", "k* >= 4 at prose vocabulary", "k* >= 4 at a script change",
             "k* = 1 at a script change", "k* >= 4 at a mode change (code<->text)",
             "new experts: script change - step before", "new experts: first mismatch - step before"]
    theirs = [(0.718, 0.614, 0.818), (0.193, 0.119, 0.276), (0.045, 0.01, 0.1), (0.937, 0.867, 0.99),
              (0.697, np.nan, np.nan), (0.46, 0.26, 0.66), (0.01, -0.05, 0.07)]
    return pd.DataFrame({"quantity": names, "ours": [o[0] for o in ours], "lo": [o[1] for o in ours],
                         "hi": [o[2] for o in ours], "n_decisions": [1427, 1181, 30, 30, 43, 30, 3067],
                         "n_responses": [24, 24, 9, 9, 16, 9, 32], "paper": [t[0] for t in theirs],
                         "paper_lo": [t[1] for t in theirs], "paper_hi": [t[2] for t in theirs],
                         "verdict": ["consistent", "consistent", "differs", "differs", "differs", "consistent",
                                     "consistent"]})


def test_key_rows_and_the_comparison_set_ours_beside_the_papers():
    rows = lview.key_rows(_cmp(), refs={"k": "tbl-ling-k-by-context", "r": "tbl-ling-routing"})
    assert [r.quantity for r in rows][0].endswith("in code formatting")
    assert rows[0].ours == "0.67 [0.53; 0.79]" and rows[0].paper == "0.718 [0.614; 0.818]"
    assert rows[1].paper == "0.045 [0.010; 0.100]" and rows[2].paper == "0.937 [0.867; 0.990]"
    assert rows[3].ours == "0.81 [0.32; 1.25]" and rows[3].paper == "0.46 [0.26; 0.66]"
    assert [r.ref for r in rows] == ["tbl-ling-k-by-context"] * 3 + ["tbl-ling-routing"]
    with pytest.raises(ValueError):
        lview.key_rows(_cmp().iloc[:5])
    out = lview.comparison(_cmp())
    assert out["Quantity"][0] == "k* ≥ 4 at code formatting" and "↔" in out["Quantity"][4]
    assert out["Paper [95% CI]"][4] == "0.697"  # no interval in the paper
    assert lview.differing(_cmp()) == ["k* >= 4 at a script change", "k* = 1 at a script change",
                                       "k* >= 4 at a mode change (code<->text)"]


# -- section 8 -------------------------------------------------------------------------------------


def _bench(batch: int = 1, delta_ratio: tuple = (1.06, 1.02, 1.10)) -> dict:
    """A hand-made benchmark result: the Delta rule's paired ratio to the best stock K and its interval."""
    est, lo, hi = delta_ratio
    summary = [
        {"arm": "plain", "ms_per_token": 11.0, "ms_per_token_lo": 10.5, "ms_per_token_hi": 11.5, "vs_best_stock": 0.6,
         "vs_best_stock_lo": 0.58, "vs_best_stock_hi": 0.62},
        {"arm": "stock:3", "ms_per_token": 6.6, "ms_per_token_lo": 6.4, "ms_per_token_hi": 6.9, "vs_best_stock": 1.0,
         "vs_best_stock_lo": 1.0, "vs_best_stock_hi": 1.0, "predicted_ms_per_token": 6.5, "prediction_error": -0.015},
        {"arm": "static:3", "ms_per_token": 6.7, "ms_per_token_lo": 6.5, "ms_per_token_hi": 7.0,
         "vs_best_stock": 0.99, "vs_best_stock_lo": 0.98, "vs_best_stock_hi": 1.00, "vs_stock_3": 0.99,
         "vs_stock_3_lo": 0.98, "vs_stock_3_hi": 1.0, "decision_share": 0.004, "mean_k": 3.0},
        {"arm": "delta", "ms_per_token": 6.6 / est, "ms_per_token_pooled": 5.94, "ms_per_token_lo": 6.0, "ms_per_token_hi": 6.5, "vs_best_stock": est,
         "vs_best_stock_lo": lo, "vs_best_stock_hi": hi, "decision_share": 0.008, "mean_k": 3.4,
         "predicted_ms_per_token": 6.0, "prediction_error": 0.01},
        {"arm": "ema", "ms_per_token": 6.9, "ms_per_token_lo": 6.7, "ms_per_token_hi": 7.1, "vs_best_stock": 0.95,
         "vs_best_stock_lo": 0.93, "vs_best_stock_hi": 0.97, "decision_share": 0.003, "mean_k": 3.0},
    ]
    return {"config": {"batch": batch}, "summary": summary, "choice": {"best_stock": "stock:3",
                                                                       "best_stock_chosen_on": "even blocks"},
            "oracle": {"oracle_exact_gain_over_best_static": 1.25, "oracle_surrogate_gain_over_best_static": 1.12},
            "offline": [], "profile": {}}


def _tables(*runs):
    return {int(r["config"]["batch"]): engine_table(r) for r in runs}


def test_engine_best_is_the_policy_with_the_highest_paired_ratio():
    res = _bench()
    b = cview.engine_best(engine_table(res), res)
    assert (b.policy, b.best_static) == ("delta", "stock:3")
    assert (b.speed, b.speed_lo, b.speed_hi) == (1.06, 1.02, 1.10) and b.verdict == "faster than"
    # share of the Oracle's gain: (1 - 1/r) / (1 - 1/G), the interval mapped through the same formula
    assert b.share == pytest.approx((1 - 1 / 1.06) / (1 - 1 / 1.25))
    assert b.share_lo == pytest.approx((1 - 1 / 1.02) / (1 - 1 / 1.25))
    assert (b.n_faster, b.n_slower, b.n_policies) == (1, 1, 2) and b.oracle_gain == 1.25
    tie = _bench(delta_ratio=(1.01, 0.97, 1.05))
    assert cview.engine_best(engine_table(tie), tie).verdict == "not distinguishable from"
    same = _bench(1)  # the best stock K over all blocks is the split's: no second comparison
    same["choice"]["best_stock_all_blocks"] = "stock:3"
    assert cview.engine_best(engine_table(same), same).all_static is None


def _offline() -> pd.DataFrame:
    return pd.DataFrame({"policy": ["static:1", "static:2", "threshold", "delta"],
                         "replay_ms_per_token": [6.0, 5.0, 4.8, 5.2], "replay_tokens_per_round": [1.7, 2.2, 2.7, 2.7],
                         "surrogate_ms_per_token": [6.1, 5.1, 4.9, 5.3], "share_exact": [-1.0, 0.0, 0.25, -0.1],
                         "share_exact_lo": [-1.5, 0.0, 0.16, -0.2], "share_exact_hi": [-0.6, 0.0, 0.31, 0.0],
                         "share_surrogate": [-1.7, 0.0, 0.45, -0.2], "share_surrogate_lo": [-2.6, 0.0, 0.38, -0.3],
                         "share_surrogate_hi": [-1.1, 0.0, 0.53, -0.1]})


def test_verdict_names_the_outcome_per_batch():
    runs = {1: _bench(1), 4: _bench(4, (0.98, 0.95, 1.01))}
    text = cview.verdict(runs, _tables(*runs.values()), _offline(), BOUNDS)
    assert "1 of 2 policies beat the best static K (static K = 2)" in text  # offline: the threshold
    assert "**batch 1**: the best policy, Delta rule, running λ, was faster than stock vLLM, K = 3" in text
    assert "**batch 4**: the best policy, Delta rule, running λ, was not distinguishable from" in text
    assert "no measured benchmark" in cview.verdict({}, {}, _offline(), BOUNDS)
    slow = _offline().assign(share_exact=[-1.0, 0.0, -0.05, -0.1])
    assert "no policy beat the best static K (static K = 2)" in cview.verdict({}, {}, slow, BOUNDS)


def test_verdict_names_the_best_stock_k_over_all_blocks_where_the_split_chose_another():
    res = _bench(1)
    res["choice"]["best_stock_all_blocks"] = "stock:2"
    res["summary"][3].update(vs_stock_2=1.03, vs_stock_2_lo=1.01, vs_stock_2_hi=1.05)  # the Delta rule
    b = cview.engine_best(engine_table(res), res)
    assert (b.all_static, b.all_speed, b.all_speed_lo, b.all_speed_hi) == ("stock:2", 1.03, 1.01, 1.05)
    text = cview.verdict({1: res}, _tables(res), _offline(), BOUNDS)
    assert "against stock vLLM, K = 2, the best stock K over all blocks: 1.03" in text


def test_key_rows_with_and_without_a_benchmark():
    res = _bench(1)
    rows = cview.key_rows({1: res}, _tables(res), _offline(), BOUNDS, refs={1: "tbl-control-engine-batch1"})
    assert len(rows) == 3 and rows[0].ours.startswith("1.060 [")
    assert rows[0].quantity.endswith("(faster than it)")
    assert rows[2].ours == "1.250" and all(r.ref == "tbl-control-engine-batch1" for r in rows)
    off = cview.key_rows({}, {}, _offline(), BOUNDS, offline_ref="tbl-control-offline")
    assert "threshold" in off[0].quantity and off[0].ours == f"{5.0 / 4.8:.3f}" and off[2].ours == "1.266"


def test_engine_table_for_the_reader_is_narrow():
    out = cview.engine(engine_table(_bench()))
    assert len(out.columns) <= 6 and out["Arm"].tolist()[:3] == ["plain decoding", "stock vLLM, K = 3",
                                                                 "static K = 3"]
    assert out["ms/token [IQR]"].str.replace(NB, " ").str.contains(r"^\d+\.\d+ \[\d+\.\d+; \d+\.\d+\]$").all()
    assert out.loc[3, "Pooled / predicted ms/token (error)"] == "5.94 / 6.00 (+1%)" and out.loc[0, "Mean k; deciding (% of round)"] == "–"


def test_share_long_is_one_batch_with_policy_labels():
    long = share_long(engine_table(_bench(4)), 4)
    assert set(long["batch"]) == {4} and set(long["policy"]) == {"Delta rule, running λ", "SGLang-style EMA"}
    assert set(long["where"]) == {"engine (measured)"}


def test_replication_sets_each_policy_of_two_runs_side_by_side():
    main, again = _bench(1), _bench(1, (0.99, 0.95, 1.03))
    again["choice"]["best_stock"] = "stock:4"
    out = cview.replication(_tables(main), {1: main}, _tables(again), {1: again})
    rows = out.set_index("Policy")
    assert list(rows.index) == ["Delta rule, running λ", "SGLang-style EMA"]  # policies only, no stock/static arm
    delta = rows.loc["Delta rule, running λ"]
    assert delta["Main run [95% CI] (best stock K)"].replace(NB, " ").endswith("(K = 3)")
    assert delta["Second run [95% CI] (best stock K)"].replace(NB, " ").startswith("0.990 [0.950; 1.030]")
    assert delta["Second run [95% CI] (best stock K)"].endswith("(K = 4)")
    assert (delta["Interval vs 1 (main / second)"], delta["Replicated"]) == ("above / holds 1", "no")
    assert tuple(rows.loc["SGLang-style EMA", ["Interval vs 1 (main / second)", "Replicated"]]) == ("below / below", "yes")
    # only the batch sizes both runs measured
    assert cview.replication(_tables(main), {1: main}, {}, {}).empty
    assert set(cview.replication(_tables(main, _bench(4)), {1: main, 4: _bench(4)}, _tables(again), {1: again})["Batch"]) == {1}


@pytest.mark.skipif(not list(BENCH_DIR.glob("bench-*.json")), reason="no committed benchmark results")
def test_committed_benchmarks_are_measured_and_lossless():
    for f in sorted(BENCH_DIR.glob("bench-*.json")) + sorted((BENCH_DIR / "replication").glob("bench-*.json")):
        res = json.loads(f.read_text())
        assert res["label"].startswith("measured") and res["lossless"] is True, f.name
        assert res["engine"]["cpu"]["flags"] and "choice" in res, f.name
        out = cview.engine(engine_table(res))
        assert {"plain decoding", "stock vLLM, K = 1"} <= set(out["Arm"]), f.name


def test_bench_runs_are_those_fitted_on_the_trace_in_either_regime():
    """Section 8 shows the runs fitted on its trace (the twin's: data/control/twin/, never the bundled pair's;
    the bundled trace's: data/control/), each run's regime read from its target."""
    from speclimits.paths import BUNDLED_TRACE, TWIN_TRACE
    from speclimits.trace import Trace, read_meta

    twin, bundled = (Trace(p, read_meta(p)) for p in (TWIN_TRACE, BUNDLED_TRACE))
    runs, note = cview.bench_runs(twin)
    assert sorted(runs) == [1, 4, 8] and "has not been measured" not in note
    assert {cview.regime_of(r) for r in runs.values()} == {"memory-bound twin"}
    assert all(r["config"]["trace"].endswith("twin-eagle3") for r in runs.values())
    again, _ = cview.bench_runs(twin, "replication")  # the twin's own second run, never the bundled pair's
    assert sorted(again) == [1] and cview.regime_of(again[1]) == "memory-bound twin"
    ref, _ = cview.bench_runs(bundled)
    assert sorted(ref) == [1, 4, 8] and {cview.regime_of(r) for r in ref.values()} == {
        "cache-resident pair"}
    assert sorted(cview.bench_runs(bundled, "replication")[0]) == [1, 4, 8]
    fresh, _ = cview.bench_runs(twin, "fresh")  # the runs on unseen prompts: the twin's only
    assert sorted(fresh) == [1, 4, 8] and not cview.bench_runs(bundled, "fresh")[0]
    unseen = cview.unseen(fresh)
    for batch, res in fresh.items():
        t = engine_table(res).set_index("arm")
        pol = [a for a in t.index if cview.is_policy(a)]
        rows = unseen[unseen["Batch"] == batch].set_index("Policy")
        assert len(rows) == len(pol) >= 6 and {"delta:acceptance", "delta-fixed:acceptance"} <= set(pol)
        for a in pol:  # "Below 1" exactly where the workload interval lies under 1
            assert rows.loc[cview.arm_name(a), "Below 1"] == ("yes" if t.loc[a, "workload_ratio_hi"] < 1 else "no")
            assert rows.loc[cview.arm_name(a), "Cross-fitted [95% CI]"].startswith(f"{t.loc[a, 'crossfit_ratio']:.3f} [")
    table = cview.regime_contrast(runs, ref, "memory-bound twin", "cache-resident")
    assert len(table) == 6 and table["Regime"].tolist()[:3] == ["memory-bound twin"] * 3
