"""Robustness checks on a thin trace (few generations at the K they run on): a refit a subset cannot
identify is a row that says so, and a test the clusters cannot support is NaN; the other checks stand."""

from __future__ import annotations

import numpy as np

from speclimits.stats.diagnostics import bin_means_wald
from speclimits.stats.robustness import robustness_checks
from speclimits.trace import read_trace


def test_a_half_without_varying_experts_is_a_not_identified_row(smoke_trace):
    rounds = read_trace(smoke_trace).rounds.copy()
    at8 = rounds["K"] == 8
    gens = np.sort(rounds.loc[at8, "generation_id"].unique())
    second = rounds["generation_id"].isin(gens[len(gens) // 2:]) & at8
    rounds.loc[second, "u_bar"] = 12.0  # no variation of Ū in the second half of the run
    res = robustness_checks(rounds, k=8, n_boot=19)
    est = res.estimates.set_index("variant")
    first = est.loc["first half of the run"]
    assert np.isfinite(first["alpha"]) and np.isfinite(first["c"])
    late = [v for v in est.index if v.startswith("second half of the run (not identified: design is singular")]
    assert len(late) == 1 and np.isnan(est.loc[late[0], "alpha"])
    assert 0 < est.loc[late[0], "n"] < est.loc["all rounds", "n"]  # the rounds it had, not zero
    assert np.isfinite(est.loc["all rounds", "alpha"])  # the full fit still uses the first half's variation


def test_wald_test_of_binned_means_is_nan_with_fewer_clusters_than_bins():
    rng = np.random.default_rng(0)
    resid = rng.normal(size=200)
    bins = np.repeat(np.arange(10), 20)
    few = bin_means_wald(resid, bins, np.tile(np.arange(4), 50))  # 4 generations, 10 bins
    assert np.isnan(few["wald_f"]) and np.isnan(few["wald_p"]) and few["wald_df"] == 10
    many = bin_means_wald(resid, bins, np.arange(200) % 40)
    assert np.isfinite(many["wald_f"]) and 0 < many["wald_p"] < 1
