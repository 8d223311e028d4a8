"""The online policies: one implementation driven by the offline harness and by the engine's per-step
driver, the published baselines on hand-made outcomes, the fit command and the offline prediction."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from speclimits.cli import main
from speclimits.control.driver import RoundDriver
from speclimits.control.top1op import top1_probability
from speclimits.control.fit import fit_policy, greedy_setup
from speclimits.arms import OFFLINE_POLICY_NAMES, POLICY_NAMES, is_policy_name, policy_label
from speclimits.control.rules import CalibrationMap, PolicyFit
from speclimits.control.offline import gain_share, k_chosen_along, offline_table
from speclimits.control.rules import ConfidenceThreshold, DeltaRule, EmaAcceptedLength, UtilityTestAndSet
from speclimits.control.fit import fit_calibration
from speclimits.control.offline import rollout, state_actions
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle import evaluate_policy, load_inputs
from speclimits.oracle.inputs import CostTable, OracleInputs

K = 5


def cost_model(k_max: int = K) -> CostModel:
    return CostModel(c=1e-3, beta0={m: 8.0 + 0.3 * m for m in range(1, k_max + 2)},
                     alpha={m: 0.12 for m in range(1, k_max + 2)}, a=0.7, b=0.8)


def hand_fit(k_max: int = K, tau: float = 0.3, lam: float = 4.0) -> PolicyFit:
    calib = CalibrationMap((0.0, 0.2, 1.0), (0.1, 0.6, 0.95))
    return PolicyFit(k_max=k_max, tau=tau, lambda_=lam, lambda_oracle=lam, u_bar_mean=tuple([4.0 + m for m in
                                                                                              range(k_max + 2)]),
                     calibration=calib, cost_model=cost_model(k_max), train_seq_ids=("a",), test_seq_ids=("b",),
                     tokens_per_round=tuple(1 + sum(0.8 ** t for t in range(1, k + 1)) for k in range(1, k_max + 1)))


@pytest.fixture(scope="module")
def random_inputs() -> OracleInputs:
    rng = np.random.default_rng(0)
    n_tok = np.array([40, 25, 33])
    n = n_tok.sum()
    conf = rng.uniform(0.02, 0.99, size=(n, K))
    mp = np.clip(conf + rng.normal(0, 0.1, size=conf.shape), 0.01, 0.99)
    acc = rng.integers(0, K + 1, size=n)
    u = np.cumsum(rng.uniform(0.5, 2.0, size=(n, K + 1)), axis=1) + 3
    return OracleInputs.from_arrays(n_tok, mp, u, draft_conf=conf, accept_len=acc)


def test_threshold_matches_the_closed_form(random_inputs):
    table = CostTable.build(random_inputs, cost_model(), K)
    for tau in (0.0, 0.05, 0.3, 0.9, 1.01):
        k, extra = state_actions(ConfidenceThreshold(tau).bind(random_inputs, table))
        cum = np.cumprod(random_inputs.draft_conf, axis=1)
        expected = np.minimum((cum >= tau).sum(axis=1) + 1, K)
        np.testing.assert_array_equal(k, expected)
        assert (extra == 0).all()


def logits_with_top1(conf: np.ndarray, vocab: int = 64):
    """Logits whose softmax has top-1 probability ``conf`` (rows) on token 0."""
    import torch

    rest = np.log((1 - conf) / (vocab - 1))
    x = np.repeat(rest[:, None], vocab, axis=1)
    x[:, 0] = np.log(conf)
    return torch.tensor(x, dtype=torch.float32)


def engine_walk(fit: PolicyFit, name: str, inputs: OracleInputs, batch_keep: bool = False,
                driver: RoundDriver | None = None) -> list[dict[int, int]]:
    """The engine's round driver on a batch of all sequences, replaying the recorded outcomes: each round's k.
    ``batch_keep=False``: without the batch-level decisions (the one-sequence walk has none). ``driver``: this
    one instead of a driver of ``fit.make(name)`` (a mixed batch's)."""
    driver = driver or RoundDriver(fit.make(name))
    if not batch_keep:  # nor the batch-level decisions (the Delta rules' batch_select, one k for the batch)
        driver.batch_keep = driver.shared = driver.batch_plan = False
    rids = [str(s) for s in inputs.seq_ids]
    pos = np.zeros(len(rids), dtype=np.int64)
    table = CostTable.build(inputs, fit.cost_model, fit.k_max).total()
    ks = []
    while (pos < inputs.n_tokens).any():
        live = [i for i in range(len(rids)) if pos[i] < inputs.n_tokens[i]]
        rows = inputs.offsets[live] + pos[live]
        lr = [rids[i] for i in live]
        keep, drafted = driver.run_round(lr, inputs.draft_conf[rows], fit.k_max)
        k = np.array(keep)
        acc = np.minimum(k, inputs.accept_len[rows])
        emitted = np.minimum(acc + 1, inputs.n_tokens[live] - pos[live])
        cost = table[rows, k] + (drafted - k) * fit.cost_model.a
        # the offline walk prices each request's own round; outcomes one round late, as in the engine
        driver.verified(lr, k.tolist(), cost.tolist(), pos[live].tolist())
        ks.append(dict(zip(live, k.tolist())))
        pos[live] += emitted
    return ks


@pytest.mark.parametrize("name", ["static:3", "threshold", "delta", "delta-fixed", "ema", "cascade", "throughput"])
def test_one_driver_keeps_each_request_its_own(random_inputs, name):
    """Requests that share the engine's round driver (the batch-level decisions off) take, round by round,
    the k each takes walked alone by the offline harness (:func:`speclimits.control.offline.walk_actions`)."""
    from speclimits.control.offline import walk_actions

    fit = hand_fit()
    ks_engine = engine_walk(fit, name, random_inputs)
    for s in range(random_inputs.n_sequences):
        sub = random_inputs.subset([s])
        ks = walk_actions(fit.make(name).bind(sub, CostTable.build(sub, fit.cost_model, fit.k_max)), sub)
        assert [r[s] for r in ks_engine if s in r] == ks[np.isfinite(ks)].astype(int).tolist(), name


def test_top1_probability_matches_softmax():
    import torch

    x = torch.randn(3, 50)
    x64 = x.double().numpy()
    expected = 1.0 / np.exp(x64 - x64.max(axis=1, keepdims=True)).sum(axis=1)
    got = top1_probability(x, 3)
    assert isinstance(got, list) and isinstance(got[0], float)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(top1_probability(logits_with_top1(np.array([0.3, 0.9])), 2), [0.3, 0.9], rtol=1e-5)
    with pytest.raises(SpeclimitsError, match="rows for 4 requests"):
        top1_probability(x, 4)


def test_calibration_map_one_value_at_a_time_is_np_interp():
    """The engine calibrates one top-1 probability (or one step of a batch) at a time: the same float as
    np.interp over the map, to the bit, as the isotonic fit predicts it."""
    rng = np.random.default_rng(3)
    fit = hand_fit()
    calib = fit.calibration
    xs = np.concatenate([rng.uniform(-0.1, 1.1, 200), np.asarray(calib.x)])
    ref = np.interp(xs, calib.x, calib.y).tolist()
    assert [calib.predict_one(float(v)) for v in xs] == ref
    assert [fit.make("delta-fixed").engine_calibrate(float(v)) for v in xs] == ref
    assert fit.make("threshold").engine_calibrate(0.25) == 0.25  # no map: the identity


def batch_objective(pol, prods, lams, j, big_j, keep):
    """The Delta rule's price of a batch round of ``big_j`` steps keeping ``keep``, written out: ``s·(b·a·J +
    b·v(⌈mean k⌉))`` (v the verification or the measured pass) less ``λ_i·P_i,t`` per kept token t >= 2 (>= 1
    with ``zero``; P extrapolated past step j with step j's confidence)."""
    b, s, a = len(prods), pol.price_scale, pol.model.a
    v = pol.pass_ms if pol.pass_ms is not None else [pol.row[k] - a * k for k in range(pol.k_max + 1)]
    gain = 0.0
    for i, prod in enumerate(prods):
        prev = prod[j - 2] if j >= 2 else 1.0
        c = prod[j - 1] / prev if prev > 0 else 0.0
        ext = list(prod[:j]) + [prod[j - 1] * c ** (t - j) for t in range(j + 1, big_j + 1)]
        gain += lams[i] * sum(ext[0 if pol.zero else 1:keep[i]])
    return s * (b * a * big_j + b * v[int(np.ceil(sum(keep) / b - 1e-12))]) - gain


def brute_force_batch(pol, prods, lams, j, last):
    """The best (objective, J, keep) of a batch round by enumerating every J in j..last and every keep
    vector k_i in 1..J (:func:`batch_objective`)."""
    import itertools

    best = (np.inf, None, None)
    for big_j in range(j, last + 1):
        for keep in itertools.product(range(0 if pol.zero else 1, big_j + 1), repeat=len(prods)):
            q = batch_objective(pol, prods, lams, j, big_j, keep)
            if q < best[0] - 1e-12:
                best = (q, big_j, list(keep))
    return best


@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_batch_decision_is_the_brute_force_optimum(seed, zero):
    """The Delta rule's one decision for a batch (how many draft steps, how many tokens each request
    keeps, with ``zero-k`` possibly none) attains the minimum of its objective over every J and keep
    vector, and the driver stops the drafter where the batch rule says and keeps what it says."""
    rng = np.random.default_rng(seed)
    b, k_max = 3, 4
    fit = hand_fit(k_max=k_max, lam=float(rng.uniform(1.0, 12.0)))
    pol = fit.make("delta-fixed:zero-k" if zero else "delta-fixed")
    assert pol.zero == zero
    assert pol.shared and not fit.make("delta-fixed:alone").shared
    pol.price_scale = float(rng.uniform(0.5, 2.0))
    conf = rng.uniform(0.0 if zero else 0.3, 1.0, size=(b, k_max))
    if seed == 0:
        conf[1, 1] = 0.0  # a calibrated confidence of 0: the products after it are 0
    prods = np.cumprod(conf, axis=1)
    lams = rng.uniform(2.0, 12.0, size=b).tolist()
    for j in range(1, k_max + 1):
        pj = [row[:j].tolist() for row in prods]
        _, j_best, _ = brute_force_batch(pol, pj, lams, j, k_max)
        got_j, got_keep = pol.batch_select(pj, lams, j, k_max)
        assert got_j == j_best, (seed, j)
        assert pol.engine_batch_more(j, pj, lams, k_max) == (j_best > j)
        # the keep when stopping now is the optimum over keep vectors with J = j
        _, _, keep_now = brute_force_batch(pol, pj, lams, j, j)
        assert pol.batch_select(pj, lams, j)[1] == keep_now, (seed, j)
    # the driver: every request drafts until the batch stops, then keeps the batch rule's choice
    driver = RoundDriver(pol)
    rnd = driver.begin(["x", "y", "z"], k_max)
    assert rnd.prods is not None
    for j in range(1, k_max + 1):
        assert driver.wants_confidence(rnd)
        if driver.step(rnd, conf[:, j - 1].tolist()):
            break
    pj = [np.cumprod([fit.calibration.predict_one(float(c)) for c in row[: rnd.j]]).tolist() for row in conf]
    lam = [pol.engine_context(None)] * b  # λ0 at the price scale, as the driver hands it
    for j in range(1, rnd.j):
        assert pol.engine_batch_more(j, [p[:j] for p in pj], lam, k_max)
    assert rnd.j == k_max or not pol.engine_batch_more(rnd.j, pj, lam, k_max)
    assert driver.finish(rnd) == pol.batch_select(pj, lam, len(pj[0]))[1]
    # batch 1: the request is priced alone (the per-request rule's stop)
    one = driver.begin(["x"], k_max)
    assert one.prods is None


@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("b", [2, 3, 4])
def test_batch_stop_step_by_step_is_the_brute_force_optimum(b, zero):
    """Step by step as the driver asks: the batch drafts on exactly when a longer round beats stopping, and keeps
    a least-objective keep vector at a stop (brute force; zero confidences, non-monotone passes, scales != 1)."""
    rng = np.random.default_rng(b)
    k_max = 5
    fit = hand_fit(k_max=k_max, lam=6.0)
    kept_none = 0
    for trial in range(16):
        pol = fit.make("delta-fixed:zero-k" if zero else "delta-fixed")
        if trial % 2:
            pol.pass_ms = (np.sort(rng.uniform(5.0, 9.0, size=k_max + 1)) + rng.normal(0, 0.3, k_max + 1)).tolist()
        pol.price_scale = float(rng.uniform(0.5, 2.0))
        conf = rng.beta(rng.uniform(0.5, 6.0), 1.0, size=(b, k_max))
        conf[rng.random((b, k_max)) < 0.1] = 0.0
        lams = rng.uniform(1.0, 30.0, size=b).tolist()
        last = int(rng.integers(2, k_max + 1))
        prods: list[list[float]] = [[] for _ in range(b)]
        prod = [1.0] * b
        for j in range(1, last + 1):
            for i in range(b):
                prod[i] *= float(conf[i, j - 1])
                prods[i].append(prod[i])
            _, j_best, _ = brute_force_batch(pol, prods, lams, j, last)
            more = pol.engine_batch_more(j, prods, lams, last)
            assert more == (j_best > j), (trial, j)
            if not more:
                q_best, _, _ = brute_force_batch(pol, prods, lams, j, j)
                keep = pol.batch_select(prods, lams, len(prods[0]))[1]
                assert batch_objective(pol, prods, lams, j, j, keep) == pytest.approx(q_best, abs=1e-9), (trial, j)
                kept_none += keep.count(0)
                break
    assert (kept_none > 0) == zero  # the k = 0 choices are exercised, and only where allowed


@pytest.mark.parametrize("scale", [0.5, 2.0, 4.0])
def test_delta_decisions_do_not_change_when_every_price_scales(scale):
    """When the refresh scales every price, λ0 scales with them and no decision of the fixed-λ rule changes (stop,
    keep, batch). Powers of two scale every float exactly, so the decisions must be equal, not close."""
    rng = np.random.default_rng(int(scale * 10))
    fit = hand_fit(k_max=6, lam=6.0)
    ref, pol = fit.make("delta-fixed"), fit.make("delta-fixed")
    pol.price_scale = scale
    assert pol.engine_context(None) == ref.engine_context(None) * scale
    changed = 0
    for _ in range(200):
        conf = rng.beta(rng.uniform(0.5, 6.0), 1.0, size=6)
        prod = 1.0
        for j in range(1, 6):
            c = fit.calibration.predict_one(float(conf[j - 1]))
            prod *= c
            want = ref.engine_more(j, c, prod, ref.engine_context(None))
            assert pol.engine_more(j, c, prod, pol.engine_context(None)) == want
            changed += pol.engine_more(j, c, prod, ref.engine_context(None)) != want  # λ0 left at the old prices
        confs = [fit.calibration.predict_one(float(v)) for v in conf]
        assert pol.engine_final_keep(confs, 2, pol.engine_context(None)) == ref.engine_final_keep(
            confs, 2, ref.engine_context(None))
        prods = np.cumprod(rng.uniform(0.2, 1.0, size=(4, 6)), axis=1)
        for j in range(1, 6):
            pj = [row[:j].tolist() for row in prods]
            lam_ref, lam = [ref.engine_context(None)] * 4, [pol.engine_context(None)] * 4
            assert pol.batch_select(pj, lam, j, 6) == ref.batch_select(pj, lam_ref, j, 6)
            assert pol.engine_batch_more(j, pj, lam, 6) == ref.engine_batch_more(j, pj, lam_ref, 6)
    assert changed > 0  # the test can tell: with λ0 at the old prices the stops move


def test_batch_decision_drafts_less_when_steps_are_dear():
    """A dearer draft step (shared by the batch) shortens the batch's rounds; a cheaper one lengthens them."""
    fit = hand_fit(k_max=5, lam=6.0)
    conf = np.full((4, 5), 0.8)
    prods = [np.cumprod(r).tolist() for r in conf]
    lams = [6.0] * 4
    steps = []
    for a in (0.05, 0.5, 1.0, 2.0, 4.0):
        cm = CostModel(c=1e-3, beta0={m: 8.0 + 0.3 * m for m in range(1, 7)}, alpha={m: 0.0 for m in range(1, 7)},
                       a=a, b=0.8)
        pol = DeltaRule(6.0, np.asarray(fit.u_bar_mean), None, running_lambda=False, shared=True).setup(5, cm)
        j = 1
        while pol.engine_batch_more(j, [p[:j] for p in prods], lams, 5):
            j += 1
        steps.append(j)
    assert all(x >= y for x, y in zip(steps, steps[1:])) and steps[0] == 5 and steps[-1] == 1, steps


def drive(pol, rounds, emitted_of_k, ms_of_k):
    """Run a memory policy for ``rounds`` rounds of one request with deterministic outcomes."""
    driver, ks = RoundDriver(pol), []
    for _ in range(rounds):
        (k,), _ = driver.run_round(["r"], [[0.5] * pol.k_max], pol.k_max)
        ks.append(k)
        driver.observe_one("r", k, ms_of_k(k), float(emitted_of_k(k)))
    return ks


def test_ema_rule_moves_between_tiers():
    pol = EmaAcceptedLength(steps=(1, 3, 5, 7), warmup=10, every=5).setup(7, cost_model(7))
    # everything accepted: the EMA climbs, k rises to the top tier and stays
    ks = drive(pol, 40, lambda k: k + 1, lambda k: 10.0)
    assert ks[0] == 5 and ks[-1] == 7 and ks[:10] == [5] * 10
    assert all(b >= a for a, b in zip(ks, ks[1:]))
    # nothing accepted: k falls to 1 at the first update after warm-up
    ks = drive(pol, 12, lambda k: 1, lambda k: 10.0)
    assert ks[:10] == [5] * 10 and ks[10] == 1


def test_utility_test_and_set_picks_the_best_measured_k():
    pol = UtilityTestAndSet(candidates=(1, 2, 4), test_rounds=2, set_rounds=5).setup(4, cost_model(4))
    tokens_per_ms = {1: 2 / 10, 2: 3 / 11, 4: 3 / 13}
    ks = drive(pol, 6 + 5 + 6, lambda k: {1: 2, 2: 3, 4: 3}[k], lambda k: {1: 10, 2: 11, 4: 13}[k])
    assert ks[:6] == [1, 1, 2, 2, 4, 4]
    assert ks[6:11] == [max(tokens_per_ms, key=tokens_per_ms.get)] * 5
    assert ks[11:17] == [1, 1, 2, 2, 4, 4]  # the next test phase


def test_calibration_map_is_the_isotonic_prediction(random_inputs):
    iso = fit_calibration(random_inputs, K)
    m = CalibrationMap.from_isotonic(iso)
    x = np.linspace(-0.2, 1.2, 301)
    np.testing.assert_allclose([m.predict_one(float(v)) for v in x], iso.predict(x), atol=1e-12)


def test_gain_share_anchors():
    assert gain_share(10.0, 10.0, 8.0) == 0.0
    assert gain_share(8.0, 10.0, 8.0) == 1.0
    assert gain_share(9.0, 10.0, 8.0) == pytest.approx(0.5)
    assert gain_share(11.0, 10.0, 8.0) < 0


def test_head_of_the_inputs(random_inputs):
    t = random_inputs.head(30)
    np.testing.assert_array_equal(t.n_tokens, [30, 25, 30])
    assert t.n_states == 85 and (t.pos < 30).all()
    np.testing.assert_array_equal(t.draft_conf[30:55], random_inputs.draft_conf[40:65])


@pytest.mark.parametrize("name", ["threshold", "delta", "delta-fixed:acceptance", "throughput"])
def test_a_mixed_batch_decides_each_request_by_its_own_fit(random_inputs, name):
    """A policy set in one batch (:mod:`speclimits.control.policyset`; the batch-level decisions off, as in the
    test above): each request takes, round by round, the k it takes in a batch decided by its own fit alone; and
    the two fits disagree somewhere, so a driver that decided every request by one fit would fail."""
    from speclimits.control.acceptance import acceptance_frame, fit_acceptance

    acc = fit_acceptance(acceptance_frame(random_inputs, K), K)
    sharp = replace(hand_fit(tau=0.3, lam=4.0), acceptance=acc)
    low = replace(hand_fit(tau=0.6, lam=9.0), calibration=CalibrationMap((0.0, 0.5, 1.0), (0.02, 0.2, 0.5)),
                  tokens_per_round=tuple(1.0 + 0.3 * k for k in range(1, K + 1)), acceptance=replace(
                      acc, intercept=acc.intercept - 2.0))
    alone = [engine_walk(f, name, random_inputs) for f in (sharp, low)]
    part = {str(s): i % 2 for i, s in enumerate(random_inputs.seq_ids)}
    asked = []
    parts = [sharp.make(name), low.make(name)]
    driver = RoundDriver(parts[0], parts, lambda rid: asked.append(rid) or part[rid])
    mixed = engine_walk(sharp, name, random_inputs, driver=driver)
    assert sorted(asked) == sorted(part)  # each request's part asked once
    differ = 0
    for s, sid in enumerate(random_inputs.seq_ids):
        own = [r[s] for r in alone[part[str(sid)]] if s in r]
        assert [r[s] for r in mixed if s in r] == own, (name, sid)
        differ += own != [r[s] for r in alone[1 - part[str(sid)]] if s in r]
    assert differ > 0, name
    assert driver.group == {str(s): part[str(s)] for s in random_inputs.seq_ids}
    driver.release(list(part))
    assert not driver.group and not driver.state


def test_throughput_zero_k_plans_no_draft_and_skips_the_drafter(random_inputs):
    """``throughput:zero-k`` plans k = 0 for every request and skips the drafter where no draft pays (hand prices:
    1/8.9 against 1.01/10.8 for k = 1), drafts where it pays; the stock rule never plans 0; labels and variants."""
    from speclimits.control.offline import walk_actions

    low = replace(hand_fit(), tokens_per_round=tuple(1.0 + 0.01 * k for k in range(1, K + 1)))
    high = replace(hand_fit(), tokens_per_round=tuple(1 + sum(0.9 ** t for t in range(1, k + 1)) for k in range(1, K + 1)))
    for fit, name, zero in ((low, "throughput:zero-k", True), (high, "throughput:zero-k", False),
                            (low, "throughput", False)):
        driver = RoundDriver(fit.make(name))
        keep, drafted = driver.run_round(["a", "b"], [[0.9] * K, [0.1] * K], K)
        assert (keep == [0, 0] and drafted == 0) if zero else (min(keep) >= 1 and drafted >= 1), (name, keep, drafted)
        sub = random_inputs.subset([0])
        ks = walk_actions(fit.make(name).bind(sub, CostTable.build(sub, fit.cost_model, fit.k_max)), sub)
        assert (ks[np.isfinite(ks)] == 0).all() == zero, name
    assert policy_label("throughput:zero-k") == "SGLang-style throughput-aware, k = 0 skips the drafter"
    assert not is_policy_name("throughput:alone") and not is_policy_name("ema:zero-k") and is_policy_name("delta:zero-k")


def test_policy_set_file_chooses_the_nearest_temperature(tmp_path, capsys):
    """``speclimits control combine``: fits by temperature (read from the fit, or PATH@T), the nearest one per
    request, a round trip through the file, and one-line refusals (no temperature, K_max that differ)."""
    from speclimits.control.policyset import PolicySet, combine, fit_for, fit_temperature, read_policy

    greedy = replace(hand_fit(), data={"reference_kind": "greedy"})
    hot = replace(hand_fit(lam=9.0), data={"reference_kind": "sampled", "sampling": {"temperature": 0.7, "top_p": 1}})
    old = replace(hand_fit(lam=6.0), data={"reference_kind": "sampled"})
    paths = {n: f.write(tmp_path / f"{n}.json") for n, f in (("greedy", greedy), ("hot", hot), ("old", old))}
    assert (fit_temperature(greedy), fit_temperature(hot), fit_temperature(old)) == (0.0, 0.7, None)
    out = tmp_path / "set.json"
    assert main(["control", "combine", str(paths["greedy"]), str(paths["hot"]), f"{paths['old']}@1.2",
                 "--out", str(out)]) == 0
    assert "3 fits, K_max 5" in capsys.readouterr().out
    s = read_policy(out)
    assert isinstance(s, PolicySet) and s.temperatures == (0.0, 0.7, 1.2)
    assert [s.part(t) for t in (0.0, 1e-7, 0.3, 0.35, 0.36, 0.7, 0.95, 1.0, 2.0)] == [0, 0, 0, 0, 1, 1, 1, 2, 2]
    assert fit_for(s, 0.8).lambda_ == 9.0 and fit_for(greedy, 0.8) is greedy
    assert PolicySet.from_dict(s.to_dict()).to_dict() == s.to_dict()
    assert main(["control", "combine", str(paths["old"]), "--out", str(out)]) == 2
    assert f"give it as {paths['old']}@T" in capsys.readouterr().err
    with pytest.raises(SpeclimitsError, match=r"K_max \[3, 5\]"):
        combine([str(paths["greedy"]), str(hand_fit(k_max=3).write(tmp_path / "k3.json")) + "@0.5"])
    with pytest.raises(SpeclimitsError, match="distinct"):
        combine([str(paths["greedy"]), f"{paths['hot']}@0"])


def test_policy_json_round_trip_and_errors(tmp_path):
    fit = hand_fit()
    p = fit.write(tmp_path / "p.json")
    back = PolicyFit.read(p)
    assert back.to_dict() == json.loads(p.read_text())
    assert back.calibration == fit.calibration and back.cost_model == fit.cost_model
    with pytest.raises(SpeclimitsError, match="unknown policy 'nope'"):
        fit.make("nope")
    bad = fit.to_dict()
    del bad["tau"]
    with pytest.raises(SpeclimitsError, match="missing field 'tau'"):
        PolicyFit.from_dict(bad)
    with pytest.raises(SpeclimitsError, match="not found"):
        PolicyFit.read(tmp_path / "absent.json")


def test_fit_on_a_trace_and_predict_offline(smoke_trace, tmp_path):
    out = tmp_path / "policy.json"
    assert main(["control", "fit", str(smoke_trace), "--out", str(out), "--k-max", "4", "--seed", "2"]) == 0
    fit = PolicyFit.read(out)
    assert set(fit.train_seq_ids).isdisjoint(fit.test_seq_ids) and fit.train_seq_ids and fit.test_seq_ids
    tau_curve = fit.curves["tau"]
    assert min(r["train_time_ms"] for r in tau_curve) == next(r["train_time_ms"] for r in tau_curve
                                                              if r["tau"] == fit.tau)
    assert fit.data["reference_kind"] == "greedy" and fit.data["simulated"] is True
    setup = greedy_setup(smoke_trace)
    names = [f"static:{k}" for k in range(1, 5)] + ["threshold", "delta", "ema"]
    tab, bounds = offline_table(fit, setup, list(fit.test_seq_ids), names, n_rollouts=8, n_boot=49)
    t = tab.set_index("policy")
    best = f"static:{bounds['best_static_k_replay']}"
    assert t.loc[best, "share_exact"] == 0.0
    assert (t["share_exact"] <= 1 + 1e-9).all()  # nothing beats the hindsight bound
    # the replayed static K is the deterministic policy evaluation of the solver
    raw = load_inputs(setup.trace).subset([list(setup.raw_inputs.seq_ids).index(s) for s in fit.test_seq_ids])
    ev = evaluate_policy(raw, fit.cost_model, actions=np.full(raw.n_states, 3), k_max=4, deterministic=True)
    assert t.loc["static:3", "replay_ms_per_token"] == pytest.approx(ev["time_ms"].sum() / raw.n_tokens.sum())
    along = k_chosen_along(fit, setup, fit.test_seq_ids[0], ["threshold", "static:2"])
    assert set(along["static:2"].dropna()) == {2.0} and along["k_star_exact"].between(1, 4).all()


def test_sections_6_and_8_give_a_policy_the_same_number(smoke_trace):
    """Section 6's comparison (fit, then evaluate) and section 8's offline table, given the same fit and
    seed, give every policy the same expected time under the surrogate; fitting inside compare_policies
    gives the same fit as fitting the trace."""
    from speclimits.control.compare import compare_policies

    fit = fit_policy(smoke_trace, k_max=4, seed=2)
    setup = greedy_setup(smoke_trace)
    names = [f"static:{k}" for k in range(1, 5)] + ["threshold", "delta", "delta-fixed", "delta:alone", "ema",
                                                   "cascade", "delta-fixed:greedy-stop", "delta:previous-u"]
    tab, _ = offline_table(fit, setup, list(fit.test_seq_ids), names, n_rollouts=8, n_boot=9, seed=3)
    pc = compare_policies(setup, fit=fit, names=names, n_rollouts=8, seed=3)
    n_tok = setup.inputs.subset([list(map(str, setup.inputs.seq_ids)).index(s) for s in fit.test_seq_ids]).n_tokens.sum()
    rows = pc.table[(pc.table["kind"] != "oracle") & ~pc.table["policy"].str.endswith("(rollouts)")]
    sec6 = rows.set_index("name")["time_ms"] / n_tok
    np.testing.assert_allclose(sec6.loc[names].to_numpy(), tab.set_index("policy").loc[names, "surrogate_ms_per_token"])
    again = compare_policies(setup, k_max=4, seed=2, names=names, n_rollouts=8)
    for field in ("tau", "lambda_", "calibration", "u_bar_mean", "train_seq_ids", "test_seq_ids", "tokens_per_round"):
        assert getattr(again.fit, field) == getattr(fit, field), field
    with pytest.raises(SpeclimitsError, match="disagrees"):
        compare_policies(setup, fit=fit, k_max=3)


def test_policy_names_and_labels():
    fit = hand_fit()
    labels = {}
    for name in ["static:2", *POLICY_NAMES, *OFFLINE_POLICY_NAMES, "delta:alone", "delta-fixed:alone",
                 "delta:previous-u:raw-confidence"]:
        pol = fit.make(name)
        assert pol.name == policy_label(name)
        labels.setdefault(policy_label(name), set()).add(name)
    assert all(len(v) == 1 for v in labels.values())  # one label, one configuration
    d = fit.make("delta-fixed:greedy-stop:raw-confidence")
    assert (d.stop, d.calibration, d.running_lambda, d.shared) == ("greedy", None, False, True)
    d = fit.make("delta:previous-u:alone")
    assert (d.u_pred, d.running_lambda, d.shared, d.markov) == ("previous", True, False, False)
    assert fit.make("delta-fixed").markov and fit.make("delta-fixed").calibration is fit.calibration
    assert policy_label("delta-fixed:greedy-stop") == "Delta rule, fixed λ, greedy stop"
    for bad in ("delta:nope", "delta:alone:alone", "ema:alone", "threshold:raw-confidence"):
        assert not is_policy_name(bad)
        with pytest.raises(SpeclimitsError, match="unknown policy|variants"):
            fit.make(bad)


def test_one_arm_vocabulary():
    """Every arm's key read once (:func:`speclimits.arms.arm`): kind, k and label, the offline policy
    that predicts it, and the kind read back off a table's label."""
    from speclimits.book.views.control import arm_name
    from speclimits.arms import arm, is_reference, label_kind, offline_key
    from speclimits.oracle.report import ORACLE_POLICY, policy_kind

    want = {"plain": ("plain", 0, "plain decoding", None), "stock:3": ("stock", 3, "stock vLLM, K = 3", "static:3"),
            "static:2": ("static", 2, "static K = 2", "static:2"),
            "delta-fixed:alone": ("policy", None, "Delta rule, fixed λ, each request alone", "delta-fixed:alone"),
            "nonsense": ("unknown", None, "nonsense", "nonsense")}
    for key, (kind, k, label, off) in want.items():
        a = arm(key)
        assert (a.kind, a.k, a.label, a.offline, offline_key(key)) == (kind, k, label, off, off)
        assert arm_name(key) == label == policy_label(key)
    assert [is_reference(x) for x in ("plain", "stock:1", "static:1", "delta")] == [True, True, False, False]
    assert [label_kind(arm(x).label) for x in ("static:4", "delta", "threshold")] == ["static", "online", "online"]
    assert [policy_kind(x) for x in ("static K = 4", "confidence threshold", ORACLE_POLICY)] == [
        "static", "online", "oracle"]
    assert hand_fit().make("static:3").name == arm("static:3").label


def flat_profile(batch: int, k_max: int = K):
    """A profile whose verification pass grows by 0.4 ms per width m (no Ū or context terms)."""
    from speclimits.control.profile import EngineProfile

    passes = {m: 6.0 + 0.4 * m for m in range(2, k_max + 2)}
    return EngineProfile(batch=batch, verify_ms=passes, pass_ms=passes, draft_ms0=0.5, draft_ms1=0.9, other_ms=0.7,
                         n_steps=10)


@pytest.mark.parametrize("name", ["static:2", "threshold", "delta-fixed", "delta", "ema", "cascade"])
def test_batch_replay_of_one_request_is_the_offline_replay(random_inputs, name):
    """Groups of one request: the batch replay (the engine's round driver, steps priced by the profile)
    gives the time of the offline replay (the array harness priced with the profile's cost model)."""
    from dataclasses import replace

    from speclimits.control.offline import batch_replay

    prof = flat_profile(1)
    base = replace(cost_model(), c=0.0, alpha={m: 0.0 for m in range(1, K + 2)})
    fit = replace(hand_fit(), cost_model=prof.cost_model(base, hand_fit().u_bar_mean, K))
    got = batch_replay(fit, random_inputs, [[s] for s in range(random_inputs.n_sequences)], [name], prof)[name]
    table = CostTable.build(random_inputs, fit.cost_model, fit.k_max)
    ev = rollout(fit.make(name).bind(random_inputs, table), random_inputs.accept_len[None, :].astype(np.int16))
    assert got["ms_per_token"] == pytest.approx(ev["time_ms"].sum() / random_inputs.n_tokens.sum(), rel=1e-9)


def test_batch_replay_of_static_k_counts_the_shared_steps(random_inputs):
    """One group of three requests at static K: each request's rounds are its own greedy walk, and a
    step costs the pass of all live requests' rows (K + 1 each), the drafter's K steps and the rest."""
    from speclimits.control.offline import batch_replay

    prof = flat_profile(3)
    for k in (1, 3, 5):
        rounds = []
        for s in range(3):
            pos, n, r = 0, int(random_inputs.n_tokens[s]), 0
            while pos < n:
                pos += min(min(k, int(random_inputs.accept_len[random_inputs.offsets[s] + pos])) + 1, n - pos)
                r += 1
            rounds.append(r)
        total = sum(prof.pass_at(sum(r > i for r in rounds) * (k + 1)) + 0.5 + 0.9 * k + 0.7
                    for i in range(max(rounds)))
        got = batch_replay(hand_fit(), random_inputs, [[0, 1, 2]], [f"static:{k}"], prof)[f"static:{k}"]
        assert got["ms_per_token"] == pytest.approx(total / random_inputs.n_tokens.sum())
        assert got["mean_k"] == k and got["wasted_draft_steps"] == 0
    # a pass between two profiled widths costs the wider one; below the narrowest, the line through two
    assert prof.pass_at(7) == prof.pass_at(9) == pytest.approx(6.0 + 0.4 * 3)
    assert prof.pass_at(3) == pytest.approx(6.8 - 0.4 / 3 * 3)
    # the shared Delta rule drafts once for the group: its requests waste fewer draft steps than alone
    shared = batch_replay(hand_fit(), random_inputs, [[0, 1, 2]], ["delta-fixed", "delta-fixed:alone"], prof)
    assert shared["delta-fixed"]["wasted_draft_steps"] < shared["delta-fixed:alone"]["wasted_draft_steps"]


def test_a_weighed_batch_replay_scales_each_requests_value_of_a_token(random_inputs):
    """``batch_replay(weigh=...)``: weights of 1 replay the rule unchanged; a request whose tokens are worth
    nothing keeps the fewest drafts the rule allows and one worth much more the most, so the kept k move apart;
    a rule with no value of a token (static K) cannot be weighed."""
    from speclimits.control.offline import batch_replay

    prof, fit, name = flat_profile(3), hand_fit(), "delta-fixed"
    plain = batch_replay(fit, random_inputs, [[0, 1, 2]], [name], prof)[name]
    ones = batch_replay(fit, random_inputs, [[0, 1, 2]], [name], prof, weigh=lambda left, done, r: np.ones(len(left)))
    assert ones[name] == plain
    seen = []

    def lopsided(left, done, rounds):
        seen.append((left.copy(), done.copy(), rounds.copy()))
        return np.where(np.arange(len(left)) == 0, 1e-6, 50.0)

    orig, keeps = RoundDriver.run_round, []

    def spy(self, rids, conf, k_call, weights=None):
        out = orig(self, rids, conf, k_call, weights)
        if len(rids) == 3:
            keeps.append(out[0])
        return out

    RoundDriver.run_round = spy
    try:
        batch_replay(fit, random_inputs, [[0, 1, 2]], [name], prof)
        before, keeps[:] = np.array(keeps), []
        batch_replay(fit, random_inputs, [[0, 1, 2]], [name], prof, weigh=lopsided)
        after = np.array(keeps)
    finally:
        RoundDriver.run_round = orig
    # the worthless request keeps fewer drafts than before and than the others; the others keep more
    assert after[:, 0].mean() < before[:, 0].mean() and (after[:, 0] <= after[:, 1:].min(axis=1)).all()
    assert after[:, 1:].mean() > before[:, 1:].mean()
    # what the weigh function is given: tokens left, emitted and rounds so far, per live request
    left, done, rounds = seen[0]
    assert (done == 0).all() and (rounds == 0).all() and (left == random_inputs.n_tokens[:3]).all()
    left, done, rounds = seen[1]
    assert (rounds == 1).all() and (left + done == random_inputs.n_tokens[:3]).all() and (done >= 1).all()
    with pytest.raises(SpeclimitsError, match="weighed"):
        batch_replay(fit, random_inputs, [[0, 1, 2]], ["static:2"], prof, weigh=lopsided)


def test_rollout_of_a_memory_policy_is_seeded(random_inputs):
    table = CostTable.build(random_inputs, cost_model(), K)
    pol = UtilityTestAndSet().bind(random_inputs, table)
    a = rollout(pol, random_inputs.accept_len[None, :].astype(np.int16))
    b = rollout(UtilityTestAndSet().bind(random_inputs, table), random_inputs.accept_len[None, :].astype(np.int16))
    np.testing.assert_array_equal(a["time_ms"], b["time_ms"])


def test_the_engine_refuses_offline_only_variants_before_it_runs():
    """The engine has no previous round's Ū (it does not count experts): such a variant, or an unknown
    name, fails when the policy is set, not silently inside a round."""
    from speclimits.control.extension import check_policy

    # speclimits_control_set checks the name first, before it reads the runner
    with pytest.raises(SpeclimitsError, match="offline only"):
        check_policy(hand_fit(), "delta:previous-u")
    with pytest.raises(SpeclimitsError, match="unknown policy"):
        check_policy(hand_fit(), "nope")
    assert check_policy(hand_fit(), "delta") and not check_policy(hand_fit(), "static:2")


def test_throughput_rule_learns_the_planted_acceptance_and_picks_the_best_rate():
    """Outcomes drawn with a planted per-position acceptance (falling with the position): after enough
    rounds the rule drafts the k that maximizes expected tokens over price, found by brute force, whatever
    its prior; at batch > 1 every request drafts the same k, the choice from the pooled counts."""
    fit = hand_fit()
    pol = fit.make("throughput")
    truth = np.array([0.9, 0.85, 0.6, 0.3, 0.2])
    prices = np.asarray(pol.prices())
    surv = np.cumprod(truth)
    best = int(np.argmax((1 + np.cumsum(surv)) / prices)) + 1
    rng = np.random.default_rng(4)
    st = pol.engine_state()
    for _ in range(400):
        k = pol.engine_plan(st)
        hit = rng.random(k) < truth[:k]
        a = k if hit.all() else int(np.argmin(hit))
        pol.engine_observe(st, k, 1.0, a + 1)
    # it keeps drafting the best k (positions past it keep the prior, which here says "stop earlier")
    ks = []
    for _ in range(50):
        k = pol.engine_plan(st)
        ks.append(k)
        hit = rng.random(k) < truth[:k]
        pol.engine_observe(st, k, 1.0, (k if hit.all() else int(np.argmin(hit))) + 1)
    assert np.mean(np.array(ks) == best) > 0.8, (best, ks)
    # pooled: one k for the batch, the choice from the summed counts
    sts = [pol.engine_state() for _ in range(3)]
    for i, s_ in enumerate(sts):
        pol.engine_observe(s_, 3, 1.0, 1 + i)
    batch = pol.engine_batch_plan(sts)
    summed = [[sum(c) for c in zip(*(s_[j] for s_ in sts))] for j in (0, 1)]
    assert batch == [pol.choose(*summed)] * 3
    driver = RoundDriver(pol)
    rnd = driver.begin(["x", "y"], fit.k_max)
    assert len(set(rnd.cap)) == 1
    assert fit.make("throughput").engine_batch_plan([pol.engine_state()]) is None  # batch 1: its own counts


def test_fixed_lambda_delta_rule_keeps_no_memory_in_the_engine():
    """A fixed-λ Delta rule reads nothing of past rounds: the driver keeps no per-request state and
    passes no outcome on (one Python loop less after every verification); a running λ does both."""
    fit = hand_fit(k_max=4, lam=5.0)
    fixed, running = RoundDriver(fit.make("delta-fixed")), RoundDriver(fit.make("delta"))
    assert not fixed.has_state and not fixed.observes
    assert running.has_state and running.observes
    running.observe_one("a", 3, 10.0, 2.0)
    assert running.state["a"] == [10.0, 2.0]
    fixed.observe_one("a", 3, 10.0, 2.0)
    assert fixed.state == {}
