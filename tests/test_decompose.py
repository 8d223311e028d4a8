"""The gap decomposition (:func:`speclimits.control.decompose.gap_decomposition`) on a simulated trace: the rungs
in order of what they know, the exact Oracle's share 1, the rule fed the true probabilities blind to the
draft's confidence, and the calibrated rung the same number as section 8's offline table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from speclimits.control.decompose import RUNGS, gap_decomposition
from speclimits.control.offline import offline_table

K_MAX = 4  # the K_max of conftest's smoke_policy


@pytest.fixture(scope="module")
def table(smoke_policy):
    fit, setup = smoke_policy
    return gap_decomposition(fit, setup, n_rollouts=32, n_boot=199)


def test_rows_and_columns_as_documented(table):
    assert table["rung"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert table["name"].tolist() == [r[0] for r in RUNGS]
    assert table["loss"].tolist() == ["", "information", "planning horizon", "tuning of λ",
                                      "prediction (acceptance model)", "features (confidence only)", "engine overhead"]
    for w in ("replay", "surrogate"):
        for col in ("ms_per_token", "speed", "speed_{}_lo", "speed_{}_hi", "share", "share_{}_lo", "share_{}_hi",
                    "share_lost", "best_static_k", "lambda"):
            name = col.format(w) if "{}" in col else (f"share_lost_{w}" if col == "share_lost" else f"{col}_{w}")
            assert name in table.columns, name
    assert table.attrs["shown"] == "replay"
    # no benchmark given: the engine's row is empty and says so
    engine = table.iloc[6]
    assert np.isnan(engine["speed_replay"]) and engine["references"] == "no benchmark result given"
    # the rule's rows carry λ: the smoke_policy one at rungs 4 to 6, a grid value at rung 3
    assert table.loc[3:5, "lambda_replay"].tolist() == [table.attrs["lambda_fitted"]] * 3
    assert table.loc[2, "lambda_replay"] in table.attrs["lambda_grid"]


def test_the_exact_oracles_share_is_one_and_the_rungs_are_ordered(table):
    for w in ("replay", "surrogate"):
        assert table.loc[0, f"share_{w}"] == 1.0
        assert table.loc[0, f"share_{w}_lo"] == 1.0 == table.loc[0, f"share_{w}_hi"]
        t = table[f"ms_per_token_{w}"].to_numpy()[:6]
        # the exact Oracle is the least time of every world (in the surrogate one up to its Monte Carlo s.e.)
        assert (t[0] <= t[1:] + 3 * table.loc[0, "ms_per_token_surrogate_se"]).all()
        # within the rule's class, the best λ in hindsight is at most the smoke_policy λ's time
        assert t[2] <= t[3] + 1e-12
    s = table["ms_per_token_surrogate"].to_numpy()
    # in the surrogate's world the surrogate Oracle is optimal over every policy (exact evaluations: no noise)
    assert s[1] <= s[2] + 1e-9 and s[1] <= s[4] + 1e-9 and s[1] <= s[5] + 1e-9
    # the speeds and shares follow the times, rung by rung
    assert (np.diff(table["speed_surrogate"].to_numpy()[:4]) <= 1e-12).all()
    assert (np.diff(table["share_surrogate"].to_numpy()[:4]) <= 1e-12).all()
    assert (table["share_lost_surrogate"].to_numpy()[1:4] >= -1e-12).all()


def test_the_true_probability_rungs_do_not_read_the_drafts_confidence(smoke_policy, table):
    """Rungs 3 and 4 read the true match probabilities: scrambling the recorded confidences leaves them as
    they are and moves rungs 5 and 6 (the rule reading the acceptance model, the calibrated confidence)."""
    fit, setup = smoke_policy
    rng = np.random.default_rng(3)
    scrambled = replace(setup.raw_inputs, draft_conf=rng.permutation(setup.raw_inputs.draft_conf.ravel()).reshape(
        setup.raw_inputs.draft_conf.shape))
    other = gap_decomposition(fit, replace(setup, raw_inputs=scrambled,
                                           inputs=replace(setup.inputs, draft_conf=scrambled.draft_conf)),
                              n_rollouts=32, n_boot=199)
    for w in ("replay", "surrogate"):
        np.testing.assert_allclose(other[f"ms_per_token_{w}"].to_numpy()[:4], table[f"ms_per_token_{w}"].to_numpy()[:4],
                                   rtol=1e-12)
        for i in (4, 5):
            assert abs(other.loc[i, f"ms_per_token_{w}"] - table.loc[i, f"ms_per_token_{w}"]) > 1e-6


def test_the_calibrated_rung_is_section_8s_offline_row(smoke_policy, table):
    fit, setup = smoke_policy
    names = [f"static:{k}" for k in range(1, K_MAX + 1)] + ["delta-fixed"]
    off, bounds = offline_table(fit, setup, list(fit.test_seq_ids), names, n_rollouts=32, n_boot=199)
    row = off.set_index("policy").loc["delta-fixed"]
    np.testing.assert_allclose(table.loc[5, "ms_per_token_replay"], row["replay_ms_per_token"], rtol=1e-12)
    np.testing.assert_allclose(table.loc[5, "ms_per_token_surrogate"], row["surrogate_ms_per_token"], rtol=1e-12)
    np.testing.assert_allclose(table.loc[5, "share_replay"], row["share_exact"], rtol=1e-12)
    np.testing.assert_allclose(table.loc[[5], ["share_replay_lo", "share_replay_hi"]].to_numpy()[0],
                               row[["share_exact_lo", "share_exact_hi"]].to_numpy(dtype=float), rtol=1e-12)
    np.testing.assert_allclose(table.loc[0, "ms_per_token_replay"], bounds["oracle_exact_ms_per_token"], rtol=1e-12)
    np.testing.assert_allclose(table.loc[1, "ms_per_token_surrogate"], bounds["oracle_surrogate_ms_per_token"],
                               rtol=1e-12)
    assert table.loc[0, "best_static_k_replay"] == bounds["best_static_k_replay"]


def test_a_grid_of_the_fitted_lambda_alone_makes_the_best_causal_rung_the_rule(smoke_policy, table):
    fit, setup = smoke_policy
    one = gap_decomposition(fit, setup, lambda_grid=[fit.lambda_], n_rollouts=32, n_boot=199)
    for w in ("replay", "surrogate"):
        assert one.loc[2, f"ms_per_token_{w}"] == one.loc[3, f"ms_per_token_{w}"] == table.loc[3, f"ms_per_token_{w}"]


def test_cli_names_the_data_and_prints_every_rung(smoke_trace, tmp_path, capsys):
    from speclimits.cli import main

    assert main(["control", "fit", str(smoke_trace), "--out", str(tmp_path / "p.json"), "--k-max", "4"]) == 0
    capsys.readouterr()
    assert main(["control", "decompose", str(tmp_path / "p.json"), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATED data") and all(name in out for name, _, _ in RUNGS)
    assert (tmp_path / "d-batch1.csv").exists()


def _bench(ids: list[str], max_tokens: int, rule: str = "delta-fixed") -> dict:
    """A batch-1 benchmark result as the decomposition reads it: its prompts, token budget and the rule's row."""
    return {"config": {"batch": 1, "max_tokens": max_tokens, "blocks": len(ids)}, "prompt_ids": ids,
            "choice": {"best_stock": "stock:2"},
            "summary": [{"arm": rule, "ms_per_token": 5.0, "vs_best_stock": 1.04, "vs_best_stock_lo": 0.99,
                         "vs_best_stock_hi": 1.09}]}


def test_a_benchmark_on_other_prompts_is_decomposed_on_its_own_references(smoke_policy, table):
    """A benchmark on prompts outside the policy's held-out split (prompts it never saw, traced apart) replays
    its rungs on the prompts the engine ran; one on the held-out split keeps the split's order and figures."""
    fit, setup = smoke_policy
    n = int(setup.raw_inputs.n_tokens.max()) + 1
    other = [str(s) for s in fit.train_seq_ids][:4]
    got = gap_decomposition(fit, setup, bench=_bench(other, n), n_rollouts=32, n_boot=199)
    assert got.attrs["references"] == other
    want = gap_decomposition(fit, setup, seq_ids=other, n_rollouts=32, n_boot=199)
    for w in ("replay", "surrogate"):
        np.testing.assert_allclose(got[f"ms_per_token_{w}"].to_numpy()[:6], want[f"ms_per_token_{w}"].to_numpy()[:6],
                                   rtol=1e-12)
    assert got.loc[6, "speed_replay"] == 1.04  # the engine's row: the benchmark's measured ratio
    test = [str(s) for s in fit.test_seq_ids]
    same = gap_decomposition(fit, setup, bench=_bench(test[::-1], n), n_rollouts=32, n_boot=199)
    assert same.attrs["references"] == test
    np.testing.assert_allclose(same["share_replay"].to_numpy()[:6], table["share_replay"].to_numpy()[:6], rtol=1e-12)


def test_cli_decomposes_the_rule_asked_for_and_refuses_two_files_of_one_batch(smoke_trace, smoke_policy, tmp_path,
                                                                                capsys):
    import json

    from speclimits.cli import main

    fit, setup = smoke_policy
    fit.write(tmp_path / "p.json")
    b = tmp_path / "b1.json"
    b.write_text(json.dumps(_bench([str(s) for s in fit.test_seq_ids], int(setup.raw_inputs.n_tokens.max()) + 1,
                                   rule="delta")))
    args = ["control", "decompose", str(tmp_path / "p.json"), "--trace", str(smoke_trace), "--bench", str(b)]
    assert main(args + ["--out", str(tmp_path / "d")]) == 2  # the bench ran `delta`, not the default delta-fixed
    assert "no arm 'delta-fixed'" in capsys.readouterr().err
    assert main(args + ["--rule", "delta", "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d-batch1.csv").exists()
    capsys.readouterr()
    assert main(args[:-1] + [str(b), str(b), "--rule", "delta", "--out", str(tmp_path / "e")]) == 2
    assert "share one" in capsys.readouterr().err and not (tmp_path / "e-batch1.csv").exists()


def test_acceptance_scores_weigh_each_steps_bias_by_its_steps(smoke_trace, smoke_policy):
    """Section 8's prediction table: per draft step the bias is the mean prediction less the observed match rate
    over the steps reached (the reliability bins pooled by their counts), and the scores are the held-out ones."""
    from speclimits.book.views.control import acceptance_scores
    from speclimits.control.acceptance import acceptance_frame, compare_acceptance, fit_acceptance, predict
    from speclimits.control.offline import select

    fit, setup = smoke_policy
    scores, bias = acceptance_scores(setup.trace, {"policy_fit": fit.to_dict()}, unseen=None)
    assert scores["Steps of"].tolist() == ["held-out references"] * 2 and set(bias["set"]) == {"held-out references"}
    train = select(setup, [str(x) for x in fit.train_seq_ids])[0]
    test = select(setup, [str(x) for x in fit.test_seq_ids])[0]
    want, _ = compare_acceptance(fit, train, test)
    np.testing.assert_allclose(scores["AUC"].to_numpy(), want["auc"].round(3).to_numpy())
    frame = acceptance_frame(test, fit.k_max)
    model = fit.acceptance or fit_acceptance(acceptance_frame(train, fit.k_max), fit.k_max)
    p = predict(model, frame)
    direct = (frame.assign(d=p - frame["matched"].astype(float)).groupby("position")["d"].mean())
    got = bias[bias["model"] == "acceptance model"].set_index("position")["bias"]
    np.testing.assert_allclose(got.sort_index().to_numpy(), direct.sort_index().to_numpy(), rtol=1e-9, atol=1e-12)
