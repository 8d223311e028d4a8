"""Section 8's served-load views (speclimits.book.views.control) on a summary with a known answer, and the
batch-pieces table on the committed batch replay."""

from __future__ import annotations

import pytest

from speclimits.book.views import control as view


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
