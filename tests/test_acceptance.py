"""The acceptance model (:mod:`speclimits.control.acceptance`) on the simulated smoke trace: folds by generation,
a planted feature found and used, a feature without signal dropped, the metrics as scikit-learn computes them,
and a policy written before the model falling back to the confidence-only calibration."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from speclimits.control.acceptance import (FEATURES, _fit_lr, acceptance_frame, compare_acceptance, fit_acceptance,
                                           grouped_folds, metrics, predict)
from speclimits.control.fit import fit_calibration
from speclimits.control.offline import select, walk
from speclimits.control.driver import RoundDriver
from speclimits.control.rules import ENGINE_FEATURES, CalibrationMap, DeltaRule, PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import CostTable

K_MAX = 4  # the K_max of conftest's smoke_policy


@pytest.fixture(scope="module")
def train_frame(smoke_policy):
    fit, setup = smoke_policy
    return acceptance_frame(select(setup, list(fit.train_seq_ids))[0], K_MAX)


def test_grouped_folds_never_split_a_generation(train_frame):
    folds = grouped_folds(train_frame, n_splits=3)
    seen = np.zeros(len(train_frame), dtype=int)
    ids = train_frame["seq_id"].astype(str).to_numpy()
    for tr, te in folds:
        assert not set(ids[tr]) & set(ids[te])
        seen[te] += 1
    assert (seen == 1).all()  # every row held out exactly once


def test_labels_are_the_reached_steps_and_history_is_what_was_seen(smoke_policy):
    fit, setup = smoke_policy
    raw = select(setup, list(fit.train_seq_ids))[0]
    f = acceptance_frame(raw, K_MAX)
    acc = raw.accept_len[f["state"]]
    assert (acc >= f["position"] - 1).all()  # a step is a row only when the chain reached it
    assert (f["matched"] == (acc >= f["position"])).all()
    first = raw.offsets[:-1]
    assert f.loc[f["state"].isin(first), "history"].isna().all()  # no round seen yet at a request's start
    # the second walk round has seen nothing yet either (one round late), the third has seen the first
    s0 = int(first[0])
    a0 = min(int(raw.accept_len[s0]), K_MAX)
    s1 = s0 + a0 + 1
    s2 = s1 + min(int(raw.accept_len[s1]), K_MAX) + 1
    assert f.loc[f["state"] == s1, "history"].isna().all()
    # the share of the first round's reached steps that matched
    assert np.allclose(f.loc[f["state"] == s2, "history"], a0 / min(a0 + 1, K_MAX))


def planted(setup, seed: int = 0):
    """Greedy inputs where a long context makes the first draft fail in 70% of the states: log_context drives it."""
    raw = setup.raw_inputs
    long = raw.context_len > np.median(raw.context_len)
    fail = long & (np.random.default_rng(seed).random(raw.n_states) < 0.7)
    return replace(raw, accept_len=np.where(fail, 0, raw.accept_len).astype(raw.accept_len.dtype))


def test_a_planted_feature_is_kept_and_beats_the_confidence_alone(smoke_policy):
    fit, setup = smoke_policy
    raw = planted(setup)
    index = {str(s): i for i, s in enumerate(raw.seq_ids)}
    train = raw.subset([index[s] for s in fit.train_seq_ids])
    test = raw.subset([index[s] for s in fit.test_seq_ids])
    model = fit_acceptance(acceptance_frame(train, K_MAX), K_MAX, candidates=FEATURES)  # the study's candidates
    fit_p = replace(fit, calibration=CalibrationMap.from_isotonic(fit_calibration(train, K_MAX)), acceptance=model)
    scores, rel = compare_acceptance(fit_p, train, test)
    s = scores.set_index("model")
    assert "log_context" in s.loc["acceptance model", "features"].split(" + ")
    assert s.loc["acceptance model", "log_loss"] < s.loc["confidence only (isotonic)", "log_loss"]
    assert s.loc["acceptance model", "auc"] > s.loc["confidence only (isotonic)", "auc"]
    # reliability: every held-out row in one bin per model, observed shares in [0, 1]
    assert (rel.groupby("model")["n"].sum().loc[s.index] == s["n"]).all()
    assert rel["observed"].between(0, 1).all()


def test_a_feature_without_signal_is_dropped(train_frame):
    frame = train_frame.assign(noise=np.random.default_rng(5).normal(size=len(train_frame)))
    model = fit_acceptance(frame, K_MAX, candidates=FEATURES + ("noise",))
    assert "noise" not in model.features
    assert model.features  # the confidence carries signal in the simulation
    losses = [loss for _, loss in model.selection]
    assert (np.diff(losses) < 0).all()  # each kept feature lowered the held-out log loss


def test_metrics_are_scikit_learns_on_a_hand_example():
    y, p = np.array([0, 1, 1, 0, 1]), np.array([0.1, 0.8, 0.6, 0.7, 0.3])
    m = metrics(y, p)
    assert m["auc"] == pytest.approx(roc_auc_score(y, p)) == pytest.approx(4 / 6)  # 4 of 6 pairs ranked right
    want_ll = -np.mean(np.log([0.9, 0.8, 0.6, 0.3, 0.3]))
    assert m["log_loss"] == pytest.approx(log_loss(y, p)) == pytest.approx(want_ll)
    assert m["brier"] == pytest.approx(brier_score_loss(y, p)) == pytest.approx((0.01 + 0.04 + 0.16 + 0.49 + 0.49) / 5)
    assert m["n"] == 5


def test_one_float_at_a_time_is_the_vectorized_model_and_survives_json(smoke_policy, train_frame):
    fit, _ = smoke_policy
    model = fit.acceptance
    assert model is not None and model.features
    rows = train_frame.head(50)
    want = predict(model, rows)
    got = [model.predict_one(r) for r in rows[list(model.features)].itertuples(index=False)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    engine = [model.step_prob(r.conf, int(r.position), r.log_prod_before, r.history)
              for r in rows.itertuples(index=False)]
    np.testing.assert_allclose(engine, want, rtol=1e-9)  # the engine's form, from the raw features
    again = PolicyFit.from_dict(fit.to_dict())
    assert again.acceptance == model


def test_the_engine_reads_the_model_as_it_was_fitted(smoke_policy):
    """The rule's own features (its history from its own rounds) give the fitted model's probabilities: a rule
    that always drafts K_max walks the K_max walk the model was fitted on, so every step it reads is the frame's."""
    fit, setup = smoke_policy
    raw = select(setup, list(fit.test_seq_ids))[0]
    train = select(setup, list(fit.train_seq_ids))[0]
    model = _fit_lr(acceptance_frame(train, K_MAX), list(ENGINE_FEATURES), K_MAX)  # every engine feature
    assert set(model.features) == set(ENGINE_FEATURES)
    fit = replace(fit, acceptance=model, lambda_=1e9)  # λ so large that the rule always drafts K_max
    pol = fit.make("delta-fixed:acceptance:alone").bind(raw, CostTable.build(
        raw, fit.cost_model, K_MAX))
    seen = {}
    read = pol.engine_match
    pol.engine_match = lambda j, p, lb, h: seen.setdefault((len(seen),), (j, read(j, p, lb, h)))[1]
    frame = acceptance_frame(raw, K_MAX, reached_only=False)
    want = dict(zip(zip(frame["state"], frame["position"].astype(int)), predict(fit.acceptance, frame)))
    driver, got = RoundDriver(pol), []
    for s in range(raw.n_sequences):
        before = len(seen)
        states = []
        walk(driver, s, s, raw.accept_len, raw.draft_conf[:, :K_MAX].tolist(), pol.table.total(),
             visit=lambda row, k: states.append((row, k)))
        steps = [seen[(i,)] for i in range(before, len(seen))]
        assert all(k == K_MAX for _, k in states)
        rows = [(row, j) for row, _ in states for j in range(1, K_MAX)]  # the steps it decided after
        got += [(want[r], p) for r, (j, p) in zip(rows, steps) if r[1] == j]
        assert len(steps) == len(rows)
    np.testing.assert_allclose([g[1] for g in got], [g[0] for g in got], rtol=1e-9)
    assert len(got) > 100


def test_a_policy_without_the_model_falls_back_to_the_calibration_and_says_so(smoke_policy):
    fit, _ = smoke_policy
    old = PolicyFit.from_dict({k: v for k, v in fit.to_dict().items() if k != "acceptance"})
    pol = old.make("delta-fixed:acceptance")
    assert pol.acceptance is None and pol.calibration == fit.calibration
    assert pol.name.endswith("(policy has no acceptance model (written before it): confidence-only calibration used)")
    assert fit.make("delta-fixed:acceptance").acceptance == fit.acceptance
    assert "acceptance model" in fit.make("delta:acceptance").describe()


def test_a_model_the_engine_cannot_compute_is_refused(smoke_policy):
    fit, _ = smoke_policy
    model = replace(fit.acceptance, features=("u_bar_prev",), coef=(0.1,), fill=(10.0,))
    with pytest.raises(SpeclimitsError, match="u_bar_prev, which the engine does not know"):
        replace(fit, acceptance=model).make("delta:acceptance")
    assert set(fit.acceptance.features) <= set(ENGINE_FEATURES)


def _features_study():
    from conftest import benchmark_module

    return benchmark_module("acceptance_features")


def test_trace_features_join_their_own_states_and_refuse_others(smoke_policy, tmp_path):
    """``benchmarks/acceptance_features.py``: each row gets its state's margin, entropy and target confidence at
    its draft step; a features file of other states (another accepted length) or with states missing is refused,
    naming the state."""
    import pandas as pd

    mod = _features_study()
    fit, setup = smoke_policy
    raw = select(setup, list(fit.train_seq_ids))[0]
    frame = acceptance_frame(raw, K_MAX)
    rng = np.random.default_rng(0)
    n, k = raw.n_states, raw.draft_conf.shape[1]
    conf2 = raw.draft_conf * rng.uniform(0, 1, size=(n, k)) * (1 - raw.draft_conf)
    ent, tc = rng.uniform(0, 3, size=(n, k)), rng.uniform(0.05, 0.95, size=n)
    df = pd.DataFrame({"seq_id": raw.seq_ids[raw.seq_index].astype(str), "pos": raw.pos, "accept_len": raw.accept_len,
                       "draft_conf": list(raw.draft_conf), "draft_conf2": list(conf2), "draft_entropy": list(ent),
                       "target_conf": tc}).sample(frac=1.0, random_state=1)  # any row order
    df.to_parquet(tmp_path / "f.parquet")
    feats = mod.read_features(tmp_path / "f.parquet")
    out = mod.with_trace_features(frame, raw, feats, "f.parquet")
    s, j = frame["state"].to_numpy(), frame["position"].to_numpy().astype(int) - 1
    np.testing.assert_allclose(out["margin"], raw.draft_conf[s, j] - conf2[s, j], atol=1e-6)
    np.testing.assert_allclose(out["entropy"], ent[s, j])
    np.testing.assert_allclose(out["logit_target_conf"], np.log(tc[s] / (1 - tc[s])))
    bad = df.copy()
    first = bad.index[0]
    bad.loc[first, "accept_len"] = int(bad.loc[first, "accept_len"]) + 1
    bad.to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(SpeclimitsError, match="bad.parquet: state .* traced on other text"):
        mod.with_trace_features(frame, raw, mod.read_features(tmp_path / "bad.parquet"), "bad.parquet")
    df.iloc[1:].to_parquet(tmp_path / "short.parquet")
    with pytest.raises(SpeclimitsError, match="short.parquet: no features for 1 states"):
        mod.with_trace_features(frame, raw, mod.read_features(tmp_path / "short.parquet"), "short.parquet")
    df.drop(columns="target_conf").to_parquet(tmp_path / "old.parquet")
    with pytest.raises(SpeclimitsError, match="old.parquet: missing columns \\['target_conf'\\]"):
        mod.read_features(tmp_path / "old.parquet")


def test_the_committed_feature_study_is_what_the_script_computes():
    """On the twin's committed features (held-out references only, no unseen trace): the forward selection keeps
    the top-1/top-2 margin (a lower held-out log loss and a higher AUC than the engine's features), and the
    study's committed figures are these."""
    import json

    from speclimits.paths import DATA_DIR

    mod = _features_study()
    out = mod.study(mod.ROOT / "data/control/twin/fresh/policy.json", DATA_DIR / "control/twin/features/twin-eagle3.parquet")
    assert "margin" in out["selected"] and "entropy" not in out["selected"]
    scores = list(out["held_out_scores"].values())
    assert scores[1]["log_loss"] < scores[0]["log_loss"] - 0.01 and scores[1]["auc"] > scores[0]["auc"] + 0.01
    committed = json.loads((DATA_DIR / "control/twin/features/study.json").read_text())
    assert committed["held_out_scores"].keys() == out["held_out_scores"].keys()
    for name, m in out["held_out_scores"].items():
        assert committed["held_out_scores"][name] == pytest.approx(m)
    assert committed["lambda_scales"] == out["lambda_scales"]
    got, want = out["batch1_held_out"], committed["batch1_held_out"]
    assert {k: v.get("speed", v.get("ratio")) for k, v in got.items() if isinstance(v, dict)} == pytest.approx(
        {k: v.get("speed", v.get("ratio")) for k, v in want.items() if isinstance(v, dict)})


def test_the_book_shows_the_feature_study_as_stored(tmp_path):
    """Section 8's two tables read ``study.json``: one row per scored model with its held-out and unseen scores,
    one row per replay with each rule's paired ratio and interval; without an unseen trace, only the held-out
    replay."""
    import json

    from speclimits.book.views.control import FEATURE_STUDY, feature_study

    scores, speed = feature_study()
    d = json.loads(FEATURE_STUDY.read_text())
    assert scores["Model"].tolist() == list(d["held_out_scores"])
    assert scores["Log loss, held-out"].tolist() == [round(m["log_loss"], 4) for m in d["held_out_scores"].values()]
    assert len(speed) == 2 + len(d["unseen"]["runs"])
    x = d["batch1_held_out"]["delta: selected over engine's model"]
    assert speed.iloc[0, 1] == f"{x['ratio']:.3f} [{x['lo']:.3f}; {x['hi']:.3f}]"
    del d["unseen"]
    (tmp_path / "s.json").write_text(json.dumps(d))
    scores, speed = feature_study(tmp_path / "s.json")
    assert len(speed) == 1 and scores["AUC, unseen"].isna().all()
