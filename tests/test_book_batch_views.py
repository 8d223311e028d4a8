"""The "Beyond batch 1" section's views: they select and phrase what the analysis returns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits.book.views import batch as view
from speclimits.costmodel import BatchCostModel, CostModel


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "b": [1, 2], "plain_ms_per_token": [10.0, 6.0], "best_static_ms_per_token": [5.0, 4.0],
        "table_ms_per_token": [5.0, 3.8], "bound_ms_per_token": [4.0, 3.0], "exact_ms_per_token": [4.0, 3.3],
        "static_0_ms_per_token": [10.0, 6.0], "static_2_ms_per_token": [5.5, 4.4],
        "best_static_k": [2, 2], "table": ["2", "2,1"], "gain_static": [1.25, 4 / 3], "gain_table": [1.25, 3.8 / 3],
        "slack": [0.0, 0.1], "evaluation": ["exact", "exact"]})


def test_bounds_long_gives_speedups_over_plain_and_the_exact_pair_only_at_b2():
    long = view.bounds_long(_frame())
    got = {(r.b, r.what): r.speedup for r in long.itertuples()}
    assert got[(1, "bound (relaxation)")] == 10.0 / 4.0
    assert got[(2, "best batch→K table")] == 6.0 / 3.8
    assert (2, "exact Oracle (b = 2)") in got and (1, "exact Oracle (b = 2)") not in got


def test_oracle_world_compares_each_static_k_with_the_measured_cell():
    val = pd.DataFrame({"b": [1, 2, 2], "K": [0, 2, 5], "ms_per_token": [8.0, 4.0, 3.0]})
    world = view.oracle_world(_frame(), val)
    assert list(zip(world["b"], world["K"])) == [(1, 0), (2, 2)]  # K = 5 was not evaluated: left out
    assert np.allclose(world["difference, %"], [100 * (10 / 8 - 1), 100 * (4.4 / 4 - 1)])


def test_frontier_phrase_names_where_each_k_stops():
    front = pd.DataFrame({"K": [1, 2, 3], "b_stop": [np.nan, 8.0, 4.0]})
    text = view.frontier_phrase(front)
    assert "K = 2 at b = 8" in text and "K = 3 at b = 4" in text and "K = 1 pay at every b" in text
    assert view.frontier_phrase(front.assign(b_stop=np.nan)).startswith("every K")


def test_coverage_counts_planted_values_inside_the_intervals():
    base = CostModel(c=0.001, beta0={1: 8.0}, alpha={1: 0.1}, a=0.5, b=0.2)
    truth = BatchCostModel.from_batch1(base, 32, 4, gamma=0.3, a_req=0.05, b_req=0.1)
    table = pd.DataFrame({"part": ["target"] * 3, "name": ["beta0", "gamma", "c"], "m": [1.0, 1.0, np.nan],
                          "estimate": [8.1, 0.5, 0.001], "lower": [7.9, 0.4, 0.0009], "upper": [8.2, 0.6, 0.0011]})
    assert view.coverage(table, truth) == (2, 3)  # gamma's interval misses 0.3
    shown = view.coefficients(table, truth=truth)
    assert list(shown["covered"]) == ["yes", "no", "yes"]
