"""Section 8's served-load views (speclimits.book.views.control) on a summary with a known answer and the
batch-pieces table on the committed batch replay; the "Beyond batch 1" section's views
(speclimits.book.views.batch), which select and phrase what the analysis returns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits.book.views import batch as bview
from speclimits.book.views import control as view
from speclimits.costmodel import BatchCostModel, CostModel


def ratio(r, lo, hi):
    return {"ratio": r, "lo": lo, "hi": hi, "n": 3}


def summary():
    """Two rates; the controller's E2E latency 0.8x the best stock K's at 1 req/s (faster) and 1.1x at 4 req/s
    (slower), 0.9x and 1.2x plain decoding's."""
    rows = []
    for rate, e2e, e2e_plain in ((1.0, (0.8, 0.7, 0.9), (0.9, 0.85, 0.95)), (4.0, (1.1, 1.05, 1.2), (1.2, 1.1, 1.3))):
        rows.append({"rate": rate, "arm": "delta-fixed", "mean_concurrency": 2.0 * rate,
                     "vs_best_stock": {"mean_e2el_ms": ratio(*e2e), "mean_tpot_ms": ratio(0.9, 0.8, 1.0),
                                       "output_throughput": ratio(1.02, 1.0, 1.04)},
                     "vs_plain": {"mean_e2el_ms": ratio(*e2e_plain), "mean_tpot_ms": ratio(0.9, 0.8, 1.0),
                                  "output_throughput": ratio(1.0, 0.99, 1.01)}})
        rows.append({"rate": rate, "arm": "stock:2", "mean_concurrency": 2.5 * rate,
                     "vs_best_stock": {}, "vs_plain": {}})
    best = {m: "stock:2" for m in ("mean_e2el_ms", "mean_tpot_ms", "output_throughput")}
    return {"rows": rows, "best_stock": {"1.0": best, "4.0": best},
            "config": {"policy_name": "delta-fixed", "repeats": 3, "requests": 24}}


def test_served_speeds_invert_times_and_judge_each_rate():
    summ = summary()
    long = view.serve_long(summ).set_index(["rate", "metric", "against"])
    e2e = long.loc[(1.0, "E2E latency", "best stock K")]
    assert e2e["speed"] == pytest.approx(1.25) and e2e["lo"] == pytest.approx(1 / 0.9)
    assert e2e["hi"] == pytest.approx(1 / 0.7) and e2e["reference"] == view.arm_name("stock:2")
    assert long.loc[(1.0, "throughput", "best stock K"), "speed"] == pytest.approx(1.02)  # not inverted
    ver = view.serve_verdicts(summ).set_index("rate")
    assert ver.loc[1.0, "stock_met"] and ver.loc[1.0, "plain_met"]
    assert not ver.loc[4.0, "stock_met"] and ver.loc[4.0, "vs_plain"] == pytest.approx(1 / 1.2)
    assert not ver.loc[4.0, "plain_met"]  # 0.833x plain decoding is below 0.95x
    text = view.serve_verdict(summ)
    assert "Both aims met (point estimates) at 1 of 2 request rates" in text
    assert "interval above 1 at 1." in text and "interval below 1" in text
    table = view.serve_table(summ)
    assert len(table) == 2 and len(table.columns) <= 6
    assert list(table.iloc[:, -1]) == ["met, met", "missed, missed"]
    assert [r.quantity.split(":")[0] for r in view.serve_key_rows(summ)] == ["served, 1 req/s (concurrency 2.0)",
                                                                            "served, 4 req/s (concurrency 8.0)"]


def test_batch_pieces_read_the_committed_replay():
    """On the twin's trace: one row per piece, a column per batch size and confidence; the hindsight column is
    never below the confidences' for the same piece (knowing the truth cannot hurt the same rule)."""
    from speclimits.paths import TWIN_TRACE
    from speclimits.trace import Trace, read_meta

    table, src = view.batch_pieces(Trace(TWIN_TRACE, read_meta(TWIN_TRACE)))
    assert src.endswith("twin/batch-rule-offline.json")
    assert list(table["piece"]) == [label for _, label in view.BATCH_PIECES]
    assert set(table.columns) >= {"batch 4, confidences", "batch 4, hindsight", "batch 8, confidences",
                                  "batch 8, hindsight"}
    for b in (4, 8):
        conf = table[f"batch {b}, confidences"].str.split().str[0].astype(float)
        truth = table[f"batch {b}, hindsight"].str.split().str[0].astype(float)
        assert (truth >= conf - 1e-9).all(), b


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "b": [1, 2], "plain_ms_per_token": [10.0, 6.0], "best_static_ms_per_token": [5.0, 4.0],
        "table_ms_per_token": [5.0, 3.8], "bound_ms_per_token": [4.0, 3.0], "exact_ms_per_token": [4.0, 3.3],
        "static_0_ms_per_token": [10.0, 6.0], "static_2_ms_per_token": [5.5, 4.4],
        "best_static_k": [2, 2], "table": ["2", "2,1"], "gain_static": [1.25, 4 / 3], "gain_table": [1.25, 3.8 / 3],
        "slack": [0.0, 0.1], "evaluation": ["exact", "exact"]})


def test_bounds_long_and_the_oracles_world_against_the_measured_cells():
    long = bview.bounds_long(_frame())  # speedups over plain, the exact pair only at b = 2
    got = {(r.b, r.what): r.speedup for r in long.itertuples()}
    assert got[(1, "bound (relaxation)")] == 10.0 / 4.0
    assert got[(2, "best batch→K table")] == 6.0 / 3.8
    assert (2, "exact Oracle (b = 2)") in got and (1, "exact Oracle (b = 2)") not in got
    val = pd.DataFrame({"b": [1, 2, 2], "K": [0, 2, 5], "ms_per_token": [8.0, 4.0, 3.0]})
    world = bview.oracle_world(_frame(), val)
    assert list(zip(world["b"], world["K"])) == [(1, 0), (2, 2)]  # K = 5 was not evaluated: left out
    assert np.allclose(world["difference, %"], [100 * (10 / 8 - 1), 100 * (4.4 / 4 - 1)])


def test_frontier_phrase_names_where_each_k_stops():
    front = pd.DataFrame({"K": [1, 2, 3], "b_stop": [np.nan, 8.0, 4.0]})
    text = bview.frontier_phrase(front)
    assert "K = 2 at b = 8" in text and "K = 3 at b = 4" in text and "K = 1 pay at every b" in text
    assert bview.frontier_phrase(front.assign(b_stop=np.nan)).startswith("every K")


def test_coverage_counts_planted_values_inside_the_intervals():
    base = CostModel(c=0.001, beta0={1: 8.0}, alpha={1: 0.1}, a=0.5, b=0.2)
    truth = BatchCostModel.from_batch1(base, 32, 4, gamma=0.3, a_req=0.05, b_req=0.1)
    table = pd.DataFrame({"part": ["target"] * 3, "name": ["beta0", "gamma", "c"], "m": [1.0, 1.0, np.nan],
                          "estimate": [8.1, 0.5, 0.001], "lower": [7.9, 0.4, 0.0009], "upper": [8.2, 0.6, 0.0011]})
    assert bview.coverage(table, truth) == (2, 3)  # gamma's interval misses 0.3
    shown = bview.coefficients(table, truth=truth)
    assert list(shown["covered"]) == ["yes", "no", "yes"]
