"""The reader-facing tables of sections 1, 2, 4 and 5 (speclimits.book.views.trace / .stats)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from speclimits import describe, paper
from speclimits.book.views import stats as vs
from speclimits.book.views import trace as vt


def _rounds(seed: int = 0) -> pd.DataFrame:
    """A small rounds table: 3 budgets x 6 generations, a prefill row per generation, one zero timing."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in (0, 1, 3):
        for g in range(6):
            gid = f"k{k}-g{g}"
            rows.append(dict(generation_id=gid, prompt_id=f"p{g}", K=k, phase="prefill", t_target_ms=20.0,
                             t_draft_ms=0.0, n_draft=0, n_accepted=0, n_emitted=1, u_bar=4.0, context_len=10))
            for r in range(5):
                acc = int(rng.integers(0, k + 1))
                rows.append(dict(generation_id=gid, prompt_id=f"p{g}", K=k, phase="decode",
                                 t_target_ms=0.0 if (k, g, r) == (1, 0, 0) else 9.0 + k,
                                 t_draft_ms=0.5 * k, n_draft=k, n_accepted=acc, n_emitted=acc + 1,
                                 u_bar=4.0 + k, context_len=11 + r))
    return pd.DataFrame(rows)


def test_per_k_rates_match_the_summary_and_bracket_it_and_feed_the_key_results():
    rounds = _rounds()
    summary = describe.per_k_summary(rounds)
    rates = describe.per_k_rates(rounds, n_boot=200, seed=3).set_index("K")
    for name in ("accepted_per_round", "emitted_per_round", "acceptance"):
        pd.testing.assert_series_equal(rates[name], summary[name], check_names=False)
    drafted = rates.loc[[1, 3]]
    assert (drafted["acceptance_lo"] <= drafted["acceptance"]).all()
    assert (drafted["acceptance"] <= drafted["acceptance_hi"]).all()
    assert (drafted["acceptance_hi"] > drafted["acceptance_lo"]).all()  # generations differ, so the CI has width
    assert np.isnan(rates.loc[0, "acceptance"])  # nothing drafted at K = 0
    table = vt.per_k_table(summary, rates.reset_index())
    row = table.set_index("K").loc[3]
    r = rates.loc[3]
    assert row["Accepted / round"] == vs.fmt_ci(r["accepted_per_round"], r["accepted_per_round_lo"],
                                                r["accepted_per_round_hi"])
    assert table.set_index("K").loc[0, "Acceptance rate"] == "–"
    assert row["Decode rounds"] == 30  # prefill rows never count
    assert table.set_index("K").loc[1, "Decode rounds"] == 29  # the zero-timing round is dropped
    rows = {r.quantity: r for r in vt.key_results(rounds, summary, describe.per_k_rates(rounds, n_boot=50))}
    assert rows["draft budgets K"].ours == "0–3"
    assert rows["generations"].ours == "18 (6 prompts)"
    assert "mean accepted tokens per round at K = 3" in rows
    assert "acceptance rate at K = 1" in rows


def _factor_res():
    table = pd.DataFrame({
        "label": ["Ū (unique experts)", "m (budget)", "L (context)"],
        "r2": [0.60, 0.80, 0.01], "r2_ci": [0.10, 0.05, 0.01],
        "rmse": [0.58, 0.4, 0.9], "rmse_ci": [0.1, 0.1, 0.1],
        "drmse": [np.nan, 0.04, 0.146], "drmse_ci": [np.nan, 0.01, 0.008],
    }, index=pd.Index(["u_bar", "m", "context_len"], name="factor"))
    by_k = pd.DataFrame({"K": [1, 1, 10, 10], "term": ["u_bar", "context_len"] * 2,
                         "beta_std": [0.2, 0.9, 0.95, 0.3], "lower": [0.19, 0.88, 0.94, 0.29],
                         "upper": [0.21, 0.92, 0.96, 0.31]})
    corr = pd.DataFrame([[1.0, 0.05], [0.05, 1.0]], index=["u_bar", "context_len"], columns=["u_bar", "context_len"])
    return SimpleNamespace(table=table, by_k=by_k, corr=corr, k_values=(1, 10))


def test_factor_tables_put_estimate_and_t_bounds_in_one_cell_beside_the_paper():
    t = vs.factor_table(_factor_res())
    m = t.set_index("Factor").loc["m (budget)"]
    assert m["CV $R^2$ [95% CI]"] == "0.800 [0.750; 0.850]"
    assert m["Paper $R^2$"] == "≈0.52"
    assert m["Paper ΔRMSE (ms)"] == "0.014 ± 0.003"
    assert t.set_index("Factor").loc["Ū (unique experts)", "ΔRMSE over $\\bar U_r$ (ms)"] == "–"
    st = vs.standardized_table(_factor_res()).set_index("K")
    assert st.loc[10, "$\\beta^*$ of $L$ [95% CI]"] == "0.300 [0.290; 0.310]"  # L, not Ū
    assert st.loc[1, "Paper ($L$)"] == "0.96"
    # the key results follow the data, not the paper
    rows = {r.quantity: r for r in vs.key_results_factors(_factor_res())}
    h1 = rows["strongest single factor (H1)"]
    assert h1.ours == "m (budget)"  # here m has the largest CV R², whatever the paper says
    assert h1.paper == "Ū (unique experts)"
    assert rows["CV $R^2$ of m (budget)"].ours == "0.800 [0.750; 0.850]"
    assert rows["corr($\\bar U_r$, $L$)"].paper == f"{paper.CORR_U_L:g}"


def test_robustness_key_results_pick_the_bootstrap_and_clustered_huber_rows():
    e = pd.DataFrame({
        "method": ["OLS (clustered SE)", "cluster bootstrap", "Huber (statsmodels RLM)", "Huber (statsmodels RLM)"],
        "variant": ["all rounds", "99 resamples", "RLM covariance, not clustered", "sandwich clustered by generation"],
        "n": [100] * 4, "alpha": [0.2, 0.2, 0.19, 0.19], "alpha_lower": [0.18, 0.17, 0.185, 0.16],
        "alpha_upper": [0.22, 0.23, 0.195, 0.22], "c": [1e-3] * 4, "c_lower": [0.9e-3] * 4, "c_upper": [1.1e-3] * 4,
        "interval": ["t", "bootstrap percentile", "RLM covariance, not clustered", "sandwich clustered by generation"],
    })
    ranges = pd.DataFrame({"ours_min": [0.19, 0.9, 0.8], "ours_max": [0.2, 1.1, 1.2]},
                          index=["alpha, ms/expert (K=8, all checks)", "c, 1e-3 ms/token (K=8, all checks)",
                                 "c, 1e-3 ms/token, across per-K fits"])
    res = SimpleNamespace(estimates=e, ranges=ranges, k=8)
    rows = vs.key_results_robustness(res)
    assert rows[0].ours == "0.200 [0.170; 0.230] ms/expert"  # the bootstrap interval, not the t one
    assert rows[1].ours == "0.190 [0.160; 0.220] ms/expert"  # the clustered sandwich, not RLM's own
    assert rows[2].ours == "5.00 %"  # spread of α over the checks, % of the OLS α
    assert rows[3].ours == "0.800–1.200" and rows[3].paper == "1.098–1.107"
    table = vs.robustness_table(res)
    assert table.loc[1, "c (10⁻³ ms/token) [95% CI]"] == "1.00 [0.90; 1.10]"  # c scaled to 1e-3 ms/token
