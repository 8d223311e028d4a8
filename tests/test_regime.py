"""Regimes: the designed experiment's fit recovers a planted cost, the expert share is the stated formula,
the key-results contrast matches rows across builds, and the committed traces say what the README says."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits import paths, regime
from speclimits.book.present import Contrast, Result, _results_frame, gathered_results


def _synthetic_rounds(alpha: dict[int, float], beta0: dict[int, float], top_k=4, n_experts=32, n=400, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for m in alpha:
        u = rng.integers(top_k, min(m * top_k, n_experts) + 1, size=n)
        t = beta0[m] + alpha[m] * u + rng.normal(0, 0.2, size=n)
        rows.append(pd.DataFrame({"m": m, "K": m - 1, "u_bar": u.astype(float), "t_target_ms": t, "phase": "decode",
                                  "t_draft_ms": 0.1 * (m - 1), "generation_id": 0}))
    return pd.concat(rows, ignore_index=True)


def test_designed_alpha_recovers_the_planted_cost_per_m():
    alpha = {1: 0.0, 2: 0.3, 5: 0.8, 9: 0.9}
    beta0 = {1: 5.0, 2: 6.0, 5: 7.0, 9: 8.0}
    fit = regime.designed_alpha(_synthetic_rounds(alpha, beta0)).set_index("m")
    assert np.isnan(fit.loc[1, "alpha"]) and "not identified" in fit.loc[1, "note"]
    for m in (2, 5, 9):
        assert fit.loc[m, "alpha_lo"] <= alpha[m] <= fit.loc[m, "alpha_hi"]
        assert abs(fit.loc[m, "beta0"] - beta0[m]) < 0.3
    pooled = regime.pooled_alpha(fit.reset_index(), m_min=5)
    assert 0.8 <= pooled["alpha"] <= 0.9 and pooled["lo"] < pooled["alpha"] < pooled["hi"]


def test_share_is_the_expert_term_over_the_line_at_the_natural_u():
    fits = pd.DataFrame({"width": [64, 64], "m": [5, 9], "alpha": [0.5, 1.0], "alpha_lo": [0.4, 0.9],
                         "alpha_hi": [0.6, 1.1], "beta0": [10.0, 10.0]})
    share = regime.share_by_width(fits, pd.Series({5: 10.0, 9: 20.0})).set_index("m")
    assert share.loc[5, "expert_share"] == pytest.approx(5.0 / 15.0)
    assert share.loc[9, "expert_share"] == pytest.approx(20.0 / 30.0)
    assert share.loc[9, "t_pass_ms"] == pytest.approx(30.0)


def _context_rounds(c0: float, c1: float, ks=range(1, 9), gens=30, rounds=40, seed=0):
    """Rounds whose context slope is c0 + c1·m (m = K + 1), with noise and generations of varied length."""
    rng = np.random.default_rng(seed)
    frames = []
    for k in ks:
        m = k + 1
        for g in range(gens):
            start = rng.integers(20, 1500)
            ctx = start + np.arange(rounds) * 3
            u = rng.integers(4, min(4 * m, 32) + 1, size=rounds).astype(float)
            t = 5.0 + 0.5 * u + (c0 + c1 * m) * ctx + rng.normal(0, 0.3, size=rounds)
            frames.append(pd.DataFrame({"K": k, "m": m, "generation_id": f"k{k}-g{g}", "u_bar": u,
                                        "context_len": ctx, "t_target_ms": t, "phase": "decode"}))
    return pd.concat(frames, ignore_index=True)


def test_context_slope_recovers_a_slope_that_grows_with_m_and_accepts_a_flat_one():
    rising = regime.context_slope(_context_rounds(6e-4, 1e-4))
    ln = rising.line
    assert abs(ln["c0"] - 6e-4) < 3 * ln["c0_se"] and abs(ln["c1"] - 1e-4) < 3 * ln["c1_se"]
    assert rising.flat["p"] < 1e-6                       # one c for every K is rejected
    assert list(rising.by_k["m"]) == list(range(2, 10))
    assert rising.spread > 1.5 and rising.spread_line < rising.spread
    flat = regime.context_slope(_context_rounds(1.1e-3, 0.0, seed=1))
    assert flat.flat["p"] > 0.01 and abs(flat.line["c1"]) < 3 * flat.line["c1_se"]
    assert flat.spread < 1.5 and abs(flat.flat["c"] - 1.1e-3) < 3 * flat.flat["c_se"]


def test_context_slope_needs_three_k_with_varied_contexts():
    r = _context_rounds(1e-3, 0.0, ks=(1, 2))
    with pytest.raises(regime.SpeclimitsError, match=">= 3 values of K"):
        regime.context_slope(r)


def test_contrast_matches_rows_whatever_their_numbers_and_only_on_its_traces(tmp_path):
    folder = tmp_path / "contrast"
    folder.mkdir()
    (folder / "contrast.json").write_text(json.dumps({"trace": "data/traces/measured-eagle3", "column": "Other",
                                                      "applies_to": ["twin-eagle3"]}))
    (folder / "sec-x.json").write_text(json.dumps({"section": "sec-x", "title": "x", "rows": [
        {"quantity": "spread of α (% of OLS α = 0.138)", "ours": "25 %", "paper": "0.3", "ref": None},
        {"quantity": "c at K = 8", "ours": "1.0", "paper": "–", "ref": None},
        {"quantity": "batch 1: gain", "ours": "1.1", "paper": "–", "ref": None},
        {"quantity": "batch 4: gain", "ours": "0.9", "paper": "–", "ref": None}]}))
    assert Contrast.load(folder, "/x/measured-eagle3") is None  # not a trace it applies to
    assert Contrast.load(folder, None) is None
    c = Contrast.load(folder, "/anywhere/twin-eagle3")
    rows = [Result("spread of α (% of OLS α = 0.829)", "3 %", "0.3"), Result("a new row", "1", "–"),
            Result("c at K = 8", "1.1", "–"), Result("batch 1: gain", "1.2", "–"), Result("batch 4: gain", "1.0", "–"),
            Result("batch 8: gain", "1.0", "–")]
    frame = _results_frame(rows, c, "sec-x")
    assert list(frame.columns) == ["Quantity", "Ours", "Other", "Paper"]
    assert list(frame["Other"]) == ["25 %", "–", "1.0", "1.1", "0.9", "–"]
    results = tmp_path / "results"
    results.mkdir()
    (results / "sec-x.json").write_text(json.dumps({"section": "sec-x", "title": "x",
                                                    "rows": [r.__dict__ for r in rows]}))
    assert list(gathered_results(results, ["sec-x"], contrast=c)["Other"]) == ["25 %", "–", "1.0", "1.1", "0.9", "–"]
    assert "Other" not in gathered_results(results, ["sec-x"]).columns


def test_committed_designed_traces_planted_exactly_what_they_say():
    from speclimits.trace import read_meta, read_table

    traces = regime.designed_traces()
    assert {64, 1024} <= set(traces)
    for width, folder in traces.items():
        meta = read_meta(folder)
        assert meta["planted_routing"]["seed"] == 0 and meta["regime"]["expert_width"] == width
        d = regime.decode_rounds(read_table(folder, "rounds"))
        assert np.array_equal(d["u_bar"], d["e_max"])  # the same U in every layer
        assert np.all(d["u_bar"] == np.round(d["u_bar"]))
        assert np.all(d["u_bar"] >= 4) and np.all(d["u_bar"] <= np.minimum(4 * d["m"], 32))
        assert (d.groupby("m")["u_bar"].nunique().drop(1) > 3).all()  # U varies at every m > 1


def test_the_twin_trace_is_the_trained_target_with_wider_experts():
    from speclimits.trace import read_generations, read_meta, read_table

    meta = read_meta(paths.TWIN_TRACE)
    assert meta["regime"]["twin"]["expert_width"] == 1024 and meta["dtype"] == "float32"
    bundled = {(g["prompt_id"], g["K"]): g["output_token_ids"] for g in read_generations(paths.BUNDLED_TRACE).values()}
    twin = {(g["prompt_id"], g["K"]): g["output_token_ids"] for g in read_generations(paths.TWIN_TRACE).values()}
    shared = set(bundled) & set(twin)
    assert len(shared) == 484 and all(bundled[k] == twin[k] for k in shared)
    u_twin = regime.decode_rounds(read_table(paths.TWIN_TRACE, "rounds")).groupby("m")["u_bar"].mean()
    assert u_twin.index.tolist() == list(range(1, 12)) and u_twin.is_monotonic_increasing
    assert read_table(paths.TWIN_TRACE, "rounds")["context_len"].max() > 1400  # the long-context prompts
