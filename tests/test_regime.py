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


# -- the context experiment and the comparison of machines -------------------------------------------

def test_designed_context_recovers_a_planted_slope_per_m_and_its_line():
    """Rounds with planted lengths and Ū drawn apart: c(m) inside each interval, the line c0 + c1·m
    recovered, and the same slope with Ū held constant (the experiment without planted routing)."""
    rng = np.random.default_rng(3)
    c0, c1 = 6e-4, 1e-4
    frames = []
    for m in range(1, 12):
        ctx = rng.choice(regime.CONTEXT_GRID, size=300) + rng.integers(0, 16, size=300)
        u = rng.integers(4, min(4 * m, 32) + 1, size=300).astype(float)
        t = 5.0 + 0.8 * u + (c0 + c1 * m) * ctx + rng.normal(0, 0.1, size=300)
        frames.append(pd.DataFrame({"m": m, "K": m - 1, "generation_id": rng.integers(0, 18, size=300), "u_bar": u,
                                    "context_len": ctx, "t_target_ms": t, "phase": "decode"}))
    rounds = pd.concat(frames, ignore_index=True)
    # blocks with their own drift (ids <source>-L<length>): removed by the block intercepts
    block = rounds["generation_id"] % 6
    rounds["prompt_id"] = "src" + block.astype(str) + "-L" + rounds["context_len"].astype(str)
    drifted = rounds.assign(t_target_ms=rounds["t_target_ms"] + 3.0 * block)
    by_m = regime.designed_context(drifted)
    assert list(by_m["m"]) == list(range(1, 12))
    truth = c0 + c1 * by_m["m"]
    assert ((by_m["c_lo"] <= truth) & (truth <= by_m["c_hi"])).mean() >= 0.8  # 95% intervals, 11 of them
    line = regime.slope_line(by_m)
    assert abs(line["c0"] - c0) < 3 * line["c0_se"] and abs(line["c1"] - c1) < 3 * line["c1_se"]
    assert line["c1_se"] < c1 / 5


def test_planted_context_prompts_cut_every_source_at_every_length_in_shuffled_blocks(tmp_path):
    src = tmp_path / "long.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt_token_ids": list(range(i, i + 300))}) + "\n"
                           for i in range(4)))
    rows = regime.planted_context_prompts(src, lengths=(10, 100, 200, 300), n_sources=2, seed=0)
    assert len(rows) == 8 and len({r["id"] for r in rows}) == 8
    ids = [r["id"] for r in rows]
    assert [i.split("-")[0] for i in ids] == ["p0"] * 4 + ["p2"] * 4  # a block per source, spread over the file
    for r in rows:  # the first L tokens of the source
        start, n = int(r["id"][1]), int(r["id"].split("-L")[1])
        assert r["prompt_token_ids"] == list(range(start, start + n))
    orders = [[int(i.split("-L")[1]) for i in ids[b:b + 4]] for b in (0, 4)]
    assert all(sorted(o) == [10, 100, 200, 300] for o in orders) and orders[0] != orders[1]  # shuffled per block
    with pytest.raises(regime.SpeclimitsError, match="fewer than the longest planted context 400"):
        regime.planted_context_prompts(src, lengths=(10, 400), n_sources=2)


def test_transfer_error_is_one_factor_when_a_machine_is_uniformly_slower():
    """A second machine exactly twice as slow: the first machine's model predicts half at every m, and
    nothing is left after one scale; a machine slower only at large m leaves a shape that moves with m."""
    from speclimits.costmodel import CostModel

    model = CostModel(c=1e-3, beta0={1: 5.0, 2: 6.0, 5: 7.0}, alpha={1: 0.0, 2: 0.3, 5: 0.8}, a=0.4, b=0.1)
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"m": np.repeat([1, 2, 5], 200), "u_bar": rng.integers(4, 12, 600).astype(float),
                         "context_len": rng.integers(50, 900, 600).astype(float), "phase": "decode",
                         "generation_id": np.tile(np.arange(20), 30)})
    base = model.target_ms(rows["m"].to_numpy(), rows["u_bar"].to_numpy(), rows["context_len"].to_numpy())
    slow = regime.transfer_error(model, rows.assign(t_target_ms=2.0 * base)).set_index("m")
    assert np.allclose(slow["ratio"], 0.5) and np.allclose(slow["ratio_rescaled"], 1.0)
    assert np.allclose(slow["scale"], 2.0) and (slow["mape"] - 0.5).abs().max() < 1e-12
    shaped = regime.transfer_error(model, rows.assign(t_target_ms=base * np.where(rows["m"] == 5, 1.5, 1.0)))
    r = shaped.set_index("m")["ratio_rescaled"]
    assert r[1] > 1.05 and r[5] < 0.95 and (shaped["ratio_lo"] <= shaped["ratio"]).all()


def test_decision_transfer_keeps_the_whole_gain_when_the_source_only_differs_by_speed(smoke_trace):
    """The Oracle's argmin does not move when every price is scaled by one factor: the transferred policy
    keeps all of the gain and the same best static K; a source that ignores the expert cost keeps less."""
    from dataclasses import replace

    from speclimits.oracle import prepare_oracle

    setup = prepare_oracle(smoke_trace)
    own = setup.model
    faster = replace(own, c=own.c / 2, beta0={m: v / 2 for m, v in own.beta0.items()},
                     alpha={m: v / 2 for m, v in own.alpha.items()}, a=own.a / 2, b=own.b / 2)
    same = regime.decision_transfer(faster, setup, n_boot=99)
    assert same["share_of_gain"] == pytest.approx(1.0) and same["static_loss"] == pytest.approx(0.0)
    assert same["transferred_static_k"] == same["best_static_k"]
    assert same["share_lo"] == pytest.approx(1.0) and same["share_hi"] == pytest.approx(1.0)
    blind = regime.decision_transfer(own.with_alpha_scale(0.0), setup, n_boot=99)
    assert blind["share_of_gain"] < 1.0 and blind["transferred_policy_ms"] >= blind["oracle_ms"]
    assert blind["share_lo"] <= blind["share_of_gain"] <= blind["share_hi"]


def test_the_twin_traces_of_three_cpus_are_one_sweep_and_the_comparison_runs_on_them():
    """The twin's traces by CPU: one command's settings and prompts; the CPUs differ in what the records say
    (AMX and a 300 MB L3 on the Xeon; AVX-VNNI on EPYC A, not B); the same greedy outputs everywhere; and the
    comparison prices the others with the first's model (all slower than EPYC A: under-priced at every m)."""
    from speclimits.trace import read_meta

    metas = {label: read_meta(path) for label, path in paths.TWIN_TRACES_BY_CPU.items()}
    ref = metas["AMD EPYC A"]
    for label, meta in metas.items():
        for key in ("k_values", "method", "dtype"):
            assert meta[key] == ref[key], (label, key)
        assert meta["sweep"]["prompts_sha256"] == ref["sweep"]["prompts_sha256"], label
        assert meta["source"] == "vllm" and not meta["simulated"] and meta["complete"], label
    xeon, epyc_b = metas["Intel Xeon (AMX)"]["cpu"], metas["AMD EPYC B"]["cpu"]
    assert "amx_tile" in xeon["flags"] and xeon["cache_kib"]["L3"] == 300 * 1024
    assert "avx_vnni" in ref["cpu"]["flags"] and "avx_vnni" not in epyc_b["flags"] and epyc_b["cache_kib"]["L3"] == 32768
    assert metas["AMD EPYC B"]["engine"]["attention"] == ["CPU_ATTN (isa vec)"]
    cmp = regime.compare_machines(paths.TWIN_TRACES_BY_CPU, n_boot=0)
    assert set(cmp.passes["machine"]) == set(metas) and set(cmp.transfer["machine"]) == set(metas) - {"AMD EPYC A"}
    assert all(equal == matched == 616 for equal, matched in cmp.outputs.values())
    assert (cmp.transfer["ratio_hi"] < 1).all()
    for d in cmp.decisions.values():
        assert 0 < d["share_lo"] <= d["share_of_gain"] <= d["share_hi"] <= 1.0


def test_compare_machines_on_simulated_traces_of_other_k_grids_recovers_one_physics(tmp_path):
    """Two SIMULATED traces of one planted cost physics on different K grids (0..6 and 0, 2, 4): the first's
    cost model prices the second's rounds at a ratio of 1 at every m; the grid with two K > 0 cannot give a
    context slope, which is left out with a note, not an error; the Oracle runs to the drafts each prices."""
    from speclimits.simulate import preset, simulate

    paths_ = {}
    for name, ks in (("wide", list(range(7))), ("thin", [0, 2, 4])):
        paths_[name] = tmp_path / name
        simulate(preset("smoke", k_values=ks), seed=3, out=paths_[name], progress=False)
    cmp = regime.compare_machines(paths_, n_boot=0)
    assert cmp.slopes["wide"] is not None and cmp.slopes["thin"] is None
    assert any(n.startswith("thin: no context slope") for n in cmp.notes)
    t = cmp.transfer.set_index("m")
    assert list(t.index) == [1, 3, 5] and np.allclose(t["ratio"], 1.0, atol=0.01)
    assert cmp.oracle["thin"].result.k_max == 4 and "thin" in cmp.decisions
    assert cmp.outputs["thin"] == (0, 0)  # simulated traces keep no generation log
