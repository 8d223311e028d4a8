"""Costs measured where the policy runs: the profile fit, the price refresh, the machine record, and the
worker's numpy-only policy reader."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from speclimits.control.driver import RoundDriver
from speclimits.control.profile import EnginePricing, EngineProfile, ProfileCycle, StepSample, fit_profile
from speclimits.control.rules import DeltaRule, PolicyFit, StaticK
from speclimits.costmodel import CostModel
from speclimits.machine import KERNEL_FLAGS, cpu_info, describe


def flat_costs(m_max: int, beta0: float = 1.0, alpha: float = 0.0, a: float = 0.1, b: float = 0.1, c: float = 0.0
               ) -> CostModel:
    """A cost model with the same beta0 and alpha at every m = 1..m_max."""
    return CostModel(c=c, beta0={m: beta0 for m in range(1, m_max + 1)}, alpha={m: alpha for m in range(1, m_max + 1)},
                     a=a, b=b)


def running_delta() -> DeltaRule:
    """A running-λ Delta rule (λ0 = 4 ms, w = 32), K_max 6."""
    return DeltaRule(4.0, np.full(8, 5.0)).setup(6, flat_costs(7, 5.0, 0.1, a=0.5, b=0.2))


def planted_steps(batch: int = 1, k_max: int = 6, n: int = 240, seed: int = 0) -> list[StepSample]:
    """Steps of the profile cycle timed on a machine with a known cost: verify 8 + 0.4·m (+0.9 from m = 5),
    drafter 1.5 + 0.7·j, outside 2.0 ms, each with noise and a few stalls."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        k = 1 + r % k_max
        m = k + 1
        verify = 8 + 0.4 * m + (0.9 if m >= 5 else 0.0)
        stall = 25.0 if rng.random() < 0.03 else 0.0
        out.append(StepSample(m=m, verify_ms=verify + rng.normal(0, 0.2) + stall, drafted=k,
                              draft_ms=1.5 + 0.7 * k + rng.normal(0, 0.1), other_ms=2.0 + abs(rng.normal(0, 0.1)),
                              n_batch=batch))
    return out


def test_profile_recovers_planted_costs():
    prof = fit_profile(planted_steps(), k_max=6, batch=1)
    for m in range(2, 8):
        assert prof.verify_ms[m] == pytest.approx(8 + 0.4 * m + (0.9 if m >= 5 else 0), abs=0.15)
    assert prof.draft_ms1 == pytest.approx(0.7, abs=0.05) and prof.draft_ms0 == pytest.approx(1.5, abs=0.15)
    assert prof.other_ms == pytest.approx(2.07, abs=0.1)
    assert whole_step(prof, 3) == pytest.approx(8 + 1.6 + 1.5 + 2.1 + 2.07, abs=0.3)
    assert prof.step_ms(4, 3) == pytest.approx(whole_step(prof, 3), abs=0.3)  # the pass as measured


def whole_step(prof, k: int) -> float:
    """Wall ms of a profiled step in which every request drafted ``k``: the (non-decreasing) pass at m = k + 1,
    the drafter's line and the time outside both."""
    return prof.verify_ms[k + 1] + prof.draft_ms0 + prof.draft_ms1 * k + prof.other_ms


def test_profile_cost_model_prices_the_measured_round():
    """At batch 1 the profiled cost model's round price (mean Ū, the profile's context) is the measured
    wall time of the step; at batch b it is the per-request share, without the expert term."""
    base = flat_costs(7, 5.0, 0.1, a=0.5, b=0.2, c=0.002)
    u = np.array([4.0, 4.0, 6.0, 7.0, 8.0, 9.0, 9.5, 10.0])
    prof = fit_profile(planted_steps(), k_max=6, batch=1, context_len=150.0)
    model = prof.cost_model(base, u, 6)
    for k in range(1, 7):
        assert float(model.round_ms(k, u[k + 1], 150.0)) == pytest.approx(whole_step(prof, k), rel=1e-9)
    prof4 = fit_profile(planted_steps(batch=4), k_max=6, batch=4, context_len=150.0)
    m4 = prof4.cost_model(base, u, 6)
    assert m4.alpha[3] == 0.0
    assert float(m4.round_ms(2, 0.0, 150.0)) == pytest.approx(whole_step(prof4, 2) / 4, rel=1e-9)


def test_profile_keeps_the_measured_passes_and_the_batch_rule_prices_with_them():
    """Passes of 8 requests whose 3-row width is slower than the 4-row one (tiles of 16 rows): the
    per-request price is made non-decreasing, the measured medians are kept beside it, and the Delta
    rule's batch decision, priced with them, never runs the slow width when the fast one is drafted."""
    tile = {2: 16.0, 3: 21.0, 4: 19.0, 5: 24.0}
    steps = [StepSample(m=m, verify_ms=v + 0.01 * (i % 3), drafted=m - 1, draft_ms=1.0 + 1.2 * (m - 1), other_ms=1.0,
                        n_batch=8) for i in range(5) for m, v in tile.items()]
    prof = fit_profile(steps, k_max=4, batch=8)
    assert prof.pass_ms[3] == pytest.approx(21.01) and prof.pass_ms[4] == pytest.approx(19.01)
    assert prof.verify_ms[3] == prof.verify_ms[4] == pytest.approx(20.01)  # pooled: never decreasing
    assert EngineProfile.from_dict(prof.to_dict()) == prof
    assert prof.pass_prices(4) == pytest.approx([v / 8 for v in (16.01, 16.01, 21.01, 19.01, 24.01)])
    model = prof.cost_model(flat_costs(5), np.full(6, 4.0), 4)
    pol = DeltaRule(2.0, np.full(6, 4.0), None, running_lambda=False, shared=True).setup(4, model)
    pol.pass_ms = prof.pass_prices(4)
    rng = np.random.default_rng(0)
    kept_means = set()
    for _ in range(200):
        prods = np.cumprod(rng.uniform(0.2, 1.0, size=(8, 4)), axis=1)
        j_stop, keep = pol.batch_select([r.tolist() for r in prods], [2.0] * 8, 4, 4)
        kept_means.add(sum(keep) / 8)
    # mean k kept 3 (32 rows: the fast width) is chosen; 1 < k <= 2 (17-24 rows: the slow width) never
    assert 3.0 in kept_means and not any(1.0 < k <= 2.0 for k in kept_means), kept_means


def test_profile_cycle_times_a_pass_of_one_row_per_request_and_prices_k0_with_it():
    """The profile cycle runs k = 0..K_max: at k = 0 the drafter runs one step and every request keeps none
    (the pass verifies one row each). The m = 1 pass is then the price of k = 0; without such steps k = 0 is
    priced as k = 1 (an older profile)."""
    cyc = ProfileCycle().setup(3, flat_costs(4))
    driver, seen = RoundDriver(cyc), []
    for _ in range(8):
        keep, drafted = driver.run_round(["a", "b"], [[0.9] * 3, [0.1] * 3], 3)
        seen.append((keep, drafted))
    assert seen[:5] == [([0, 0], 1), ([1, 1], 1), ([2, 2], 2), ([3, 3], 3), ([0, 0], 1)]
    passes = {1: 10.0, 2: 16.0, 3: 19.0, 4: 23.0}
    steps = [StepSample(m=m, verify_ms=v, drafted=max(m - 1, 1), draft_ms=1.0, other_ms=1.0, n_batch=4)
             for _ in range(3) for m, v in passes.items()]
    prof = fit_profile(steps, k_max=3, batch=4)
    assert prof.pass_prices(3) == pytest.approx([v / 4 for v in passes.values()])
    assert prof.pass_at(4) == pytest.approx(10.0) and prof.pass_at(6) == pytest.approx(16.0)
    model = prof.cost_model(flat_costs(4), np.full(5, 4.0), 3)
    assert model.beta0[1] == pytest.approx(10.0 / 4)  # measured, not filled in from the narrowest drafted width
    old = fit_profile([s for s in steps if s.m != 1], k_max=3, batch=4)
    assert old.pass_prices(3)[0] == old.pass_prices(3)[1] == pytest.approx(16.0 / 4)


def test_profiled_passes_are_the_best_monotone_fit_to_their_medians():
    """The profile's pass per m is the weighted (by steps) non-decreasing fit to the medians: checked
    against brute force over monotone candidates built from the data."""
    rng = np.random.default_rng(3)
    for _ in range(30):
        v, w = rng.normal(size=5) + 10.0, rng.integers(1, 4, size=5).astype(float)
        steps = [StepSample(m + 1, float(v[m]), 1, 1.0) for m in range(5) for _ in range(int(w[m]))]
        fit = np.array([fit_profile(steps, k_max=4, batch=1).verify_ms[m] for m in range(1, 6)])
        assert np.all(np.diff(fit) >= -1e-12)
        assert fit_profile(steps, k_max=4, batch=1).pass_ms == {m + 1: pytest.approx(v[m]) for m in range(5)}
        best = np.inf
        # the optimum is piecewise constant on blocks with weighted means: enumerate the partitions
        for cuts in itertools.product([0, 1], repeat=4):
            edges = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [5]
            cand = np.concatenate([np.full(b - a, np.average(v[a:b], weights=w[a:b])) for a, b in zip(edges, edges[1:])])
            if np.all(np.diff(cand) >= -1e-12):
                best = min(best, float(np.sum(w * (cand - v) ** 2)))
        assert np.sum(w * (fit - v) ** 2) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_price_refresh_follows_a_slowdown_and_ignores_a_stall():
    clock = EnginePricing()
    for _ in range(200):
        clock.update(10.0, 10.0)
    assert clock.scale == pytest.approx(1.0)
    clock.update(500.0, 10.0)  # one stall: clipped at 3x, moves the scale by at most 0.1
    assert clock.scale < 1.11
    for _ in range(200):
        clock.update(15.0, 10.0)  # the machine is 1.5x slower from now on
    assert clock.scale == pytest.approx(1.5, abs=0.01)


def test_cpu_info_reads_model_and_kernel_flags(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: Test CPU 9000\n"
                 "flags\t\t: fpu sse2 avx2 fma avx512f amx_tile\n"
                 "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: Test CPU 9000\nflags\t\t: fpu\n")
    info = cpu_info(f)
    assert info["model"] == "Test CPU 9000" and info["flags"] == ["avx2", "fma", "avx512f", "amx_tile"]
    assert (info["family"], info["model_id"]) == (26, 2)  # the first processor's, as its name and flags
    assert "avx512f" in describe(info) and describe(info).startswith("Test CPU 9000 (family 26 model 2; ")
    assert set(cpu_info()["flags"]) <= set(KERNEL_FLAGS)


def test_the_worker_reads_a_policy_without_the_statistics_stack(tmp_path):
    """The modules the vLLM worker imports to run a policy load neither pandas nor scikit-learn,
    statsmodels or scipy."""
    code = ("import sys, speclimits.control.rules, speclimits.control.profile, speclimits.control.extension;"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'sklearn', 'statsmodels', 'scipy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_round_driver_keeps_memory_per_request_and_forgets_released_ones():
    pol = running_delta()
    driver = RoundDriver(pol)
    driver.observe_one("a", 2, 6.0, 3.0)
    driver.observe_one("b", 3, 6.0, 1.0)
    driver.observe_one("b", 1, 2.0, 2.0)
    assert driver.state["a"] == [6.0, 3.0] and driver.state["b"] == [8.0, 3.0]
    rnd = driver.begin(["a", "b", "c"], 6)
    lam = [(32 * 4.0 + e) / (32 + n) for e, n in ([6.0, 3.0], [8.0, 3.0], [0.0, 0.0])]
    assert rnd.ctx == pytest.approx(lam) and rnd.cap == [6, 6, 6]
    driver.release(["a"])
    assert "a" not in driver.state
    assert driver.begin(["a"], 6).ctx == [pytest.approx(4.0)]  # a request id seen again starts clean
    assert StaticK(3).setup(6, pol.model).plan_only and not pol.plan_only
    static = RoundDriver(StaticK(3).setup(6, pol.model))
    rnd = static.begin(["x", "y"], 6)
    assert not static.wants_confidence(rnd)
    assert [static.step(rnd, None) for _ in range(3)] == [False, False, True] and static.finish(rnd) == [3, 3]
    assert RoundDriver(StaticK(5).setup(6, pol.model)).begin(["x"], 2).cap == [2]  # capped by the drafter's K


def test_engine_lambda_is_the_fit_lambda_under_the_fit_cost_model(tmp_path):
    from speclimits.control.fit import fit_policy
    from speclimits.paths import DATA_DIR

    fit = fit_policy(DATA_DIR / "traces" / "measured-eagle3", k_max=4)
    assert fit.engine_lambda(fit.cost_model) == pytest.approx(fit.lambda_, rel=1e-12)
    slower = CostModel(c=fit.cost_model.c, beta0={m: 2 * v for m, v in fit.cost_model.beta0.items()},
                       alpha={m: 2 * v for m, v in fit.cost_model.alpha.items()}, a=2 * fit.cost_model.a,
                       b=2 * fit.cost_model.b)
    assert fit.engine_lambda(slower) == pytest.approx(2 * fit.lambda_, rel=1e-9)  # λ follows the units
    back = PolicyFit.from_dict(fit.to_dict())
    assert back.tokens_per_round == fit.tokens_per_round and back.lambda_ratio == fit.lambda_ratio


def test_token_choice_gives_the_argmax_ids_and_books_what_it_saves():
    """The token choice gives exactly vLLM's ``argmax(-1)`` ids (ties, -inf rows, a head's logits mapped to target
    ids), times vLLM's argmax for ``trials`` calls per row count and books that median per read step after."""
    import torch

    from speclimits.control.top1op import TokenChoice

    tc = TokenChoice(trials=4)
    special = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("-inf")] * 4, [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(tc.top1(special[[0, 2]])[0], torch.tensor([1, 0]))
    assert tc.saved_s == 0.0 and tc.torch_steps == 1  # no argmax timed yet: nothing booked
    for _ in range(3):
        assert torch.equal(tc.argmax(special), special.argmax(dim=-1))
    assert 3 not in tc.argmax_s  # three of four calls
    tc.argmax(special)
    assert tc.argmax_s[3] == pytest.approx(float(np.median(tc.times[3])))
    rng = np.random.default_rng(0)
    targets = torch.from_numpy(np.sort(rng.choice(1024, size=256, replace=False)))
    for _ in range(30):
        n = 3
        head = torch.from_numpy(rng.normal(size=(n, 256)).round(1).astype(np.float32))  # rounded: many ties
        full = torch.full((n, 1024), float("-inf"))
        full[:, targets] = head
        ids, top1 = tc.top1(head, targets)
        assert torch.equal(ids, full.argmax(dim=-1))
        np.testing.assert_allclose(top1, full.softmax(-1).amax(-1).numpy(), rtol=1e-6)
    assert tc.saved_s == pytest.approx(30 * tc.argmax_s[3])
    assert tc.to_dict() == {"3": {"argmax_us": pytest.approx(1e6 * tc.argmax_s[3]), "timed": 4}}


def test_memory_rules_read_each_round_outcome_one_round_late_from_the_outputs():
    """Outcomes read from the growth of ``output_token_ids`` at the next step: the running-λ memory holds every
    round but the last, per request, when requests verify drafts in different steps; a finished one is forgotten."""
    from types import SimpleNamespace

    pol = running_delta()
    reqs = {"a": SimpleNamespace(output_token_ids=[7]), "b": SimpleNamespace(output_token_ids=[7])}
    driver = RoundDriver(pol)
    # (drafts verified per request, the step's round time in ms, tokens each request emits in the step)
    steps = [({"a": 3, "b": 2}, 10.0, {"a": 2, "b": 3}),
             ({"a": 1}, 6.0, {"a": 2, "b": 1}),  # b verifies no drafts in this step
             ({"a": 2, "b": 4}, 8.0, {"a": 1, "b": 5}),
             ({"a": 4, "b": 1}, 12.0, {"a": 5, "b": 2})]
    for spec, ms, emitted in steps:
        n_before = [len(reqs[r].output_token_ids) for r in spec]
        driver.verified(list(spec), list(spec.values()), [ms / 2] * len(spec), n_before)  # time shared by 2
        for r, e in emitted.items():  # vLLM's bookkeeping, after drafting
            reqs[r].output_token_ids.extend([1] * e)
    # a: rounds 1-3 observed (round 4's tokens arrive after the last step)
    assert driver.state["a"] == pytest.approx([5.0 + 3.0 + 4.0, 2 + 2 + 1])
    # b: its round of step 1 emitted the tokens of steps 1 and 2 (no drafts in step 2), then step 3's round
    assert driver.state["b"] == pytest.approx([5.0 + 4.0, 3 + 1 + 5])
    assert driver.pending["a"][0] == 4 and driver.pending["b"][0] == 1
    driver.release(["a"])
    assert set(driver.pending) == {"b"} and set(driver.state) == {"b"}


def test_the_cost_model_owns_the_round_and_step_prices():
    """One formula per price: :meth:`CostModel.round_prices` is :meth:`CostModel.round_ms` (the Oracle's cost
    table, the policies' rows and the controller's refresh all read it), :meth:`CostModel.mean_round_prices`
    the same at a Ū per m, and :meth:`BatchCostModel.step_prices` is :meth:`BatchCostModel.step_ms`."""
    from speclimits.costmodel import BatchCostModel

    base = CostModel(c=0.002, beta0={m: 5.0 + 0.3 * m for m in range(1, 8)},
                     alpha={m: 0.1 + 0.01 * m for m in range(1, 8)}, a=0.5, b=0.2)
    rng = np.random.default_rng(0)
    u, ctx = rng.uniform(2, 30, size=(9, 7)), rng.uniform(10, 900, size=9)
    ks = np.arange(7)
    want = base.round_ms(ks[None, :], u, ctx[:, None])
    np.testing.assert_allclose(base.round_prices(6, u, ctx), want, rtol=1e-12)
    by_m = np.concatenate([[u[0, 0]], u[0]])
    np.testing.assert_allclose(base.mean_round_prices(6, by_m), base.round_ms(ks, u[0], 0.0), rtol=1e-12)
    batch = BatchCostModel.from_batch1(base, n_experts=32, top_k=4, gamma=0.7, a_req=0.05, b_req=0.1)
    terms = batch.step_terms(6)
    n = rng.integers(1, 9, size=9)
    k = rng.integers(0, 7, size=9)
    np.testing.assert_allclose(batch.step_prices(n, k, u[:, 0], ctx, terms), batch.step_ms(n, k, u[:, 0], ctx),
                               rtol=1e-12)
    passes = {m: 6.0 + 0.4 * m for m in range(2, 8)}
    prof = EngineProfile(batch=2, verify_ms=passes, pass_ms=passes, draft_ms0=0.5, draft_ms1=0.9, other_ms=0.7,
                         n_steps=10, context_len=0.0)
    assert prof.step_ms(8, 3) == prof.pass_at(8) + (0.5 + 0.9 * 3) + 0.7
    assert prof.step_ms(8, 3) == pytest.approx(6.0 + 1.6 + 0.5 + 2.7 + 0.7)
    assert prof.step_ms(8, 0) == prof.pass_at(8) + 0.7


def _fit(k_max: int = 6, lam: float = 4.0) -> PolicyFit:
    base = CostModel(c=0.002, beta0={m: 5.0 + 0.3 * m for m in range(1, k_max + 2)},
                     alpha={m: 0.1 for m in range(1, k_max + 2)}, a=0.5, b=0.2)
    return PolicyFit(k_max=k_max, tau=0.3, lambda_=lam, lambda_oracle=lam,
                     u_bar_mean=tuple(4.0 + m for m in range(k_max + 2)), calibration=None, cost_model=base,
                     train_seq_ids=("a",), test_seq_ids=("b",))


def test_engine_pricing_profiles_then_prices_and_refreshes_the_policy():
    """Profiling runs the profile cycle until the last round says so; the fit prices the policy in profiled ms (λ0
    too); the refresh follows measured/priced time at the profiled batch size only; a switch keeps both."""
    from speclimits.control.profile import EnginePricing, ProfileCycle

    fit = _fit()
    pricing = EnginePricing()
    pricing.arm(12)
    cycle = pricing.policy(fit, "delta-fixed", 6)
    assert isinstance(cycle, ProfileCycle) and pricing.prices == pytest.approx(
        fit.cost_model.mean_round_prices(6, fit.u_bar_mean).tolist())
    steps = planted_steps(n=12)
    done = []
    for s in steps:
        pricing.context(np.array([100.0, 200.0, 999.0]), [0, 1])
        pricing.step_started(s.other_ms)  # the previous profiled step's time outside
        other, s.other_ms = s.other_ms, float("nan")
        done.append(pricing.timed(s))
        pricing.step_started(other)
    assert done == [False] * 11 + [True] and pricing.left == 0
    prof = pricing.fit(max_batch=4)  # the engine's batch; no step of 4 was timed
    assert prof.batch == 1 and prof.context_len == 150.0
    assert prof.to_dict() == fit_profile(steps, 6, 1, context_len=150.0).to_dict()
    pol = pricing.policy(fit, "delta-fixed", 6)
    model = prof.cost_model(fit.cost_model, fit.u_bar_mean, 6)
    assert isinstance(pol, DeltaRule) and pol.lambda0 == pytest.approx(fit.engine_lambda(model))
    assert pricing.prices == pytest.approx(np.nan_to_num(model.mean_round_prices(6, fit.u_bar_mean)).tolist())
    assert pricing.refreshes(pol, 1) and not pricing.refreshes(pol, 2)
    assert not pricing.refreshes(pricing.policy(fit, "static:2", 6), 1)  # a static K reads no price
    pol = pricing.policy(fit, "delta-fixed", 6)
    for _ in range(200):  # the machine runs twice as slow as priced
        pricing.refresh(pol, [3], 1, 2 * pricing.prices[3])
    assert pol.price_scale == pytest.approx(2.0, rel=1e-3)
    batch_of_two = [2, 4]  # a step of 2 prices the mean of its requests' rounds, times 2
    before = pricing.scale
    pricing.refresh(pol, batch_of_two, 2, pricing.prices[2] + pricing.prices[4])
    assert pol.price_scale == pytest.approx(before + 0.05 * (1.0 - before))
    pricing.arm(12)  # a switch: the profile and the scale are kept, no profiling again
    again = pricing.policy(fit, "delta", 6)
    assert pricing.left == 0 and pricing.profile is prof and again.price_scale == pol.price_scale


def test_round_records_book_the_rounds_and_the_hooks_time_until_drained():
    """What a drain returns: the kept k, caps, steps drafted and early exits of each round, the time in
    the controller per hook and in all, the token choice's added; a drain forgets them."""
    import time

    from speclimits.control.driver import EngineRound, RoundRecords

    rec = RoundRecords()
    rnd = EngineRound(["a", "b"], [3, 4], [0.0, 0.0], 4, False)
    rnd.j, rnd.early = 2, True
    rec.round([2, 1], rnd)
    one = EngineRound(["a"], [4], [0.0], 4, False)
    one.j = 4
    rec.round([4], one)
    t0 = time.perf_counter()
    now = rec.spent("plan", t0)
    rec.spent("plan", now)
    rec.spent("take", now)
    rec.choice_s = 1e-6
    rec.plain_samples += 3  # steps without a draft, sampled plainly (the extension's _sample hook)
    out = rec.drain()
    assert out["rounds"] == [{"k": [2, 1], "cap": [3, 4], "drafted": 2, "early": True, "n_batch": 2},
                             {"k": [4], "cap": [4], "drafted": 4, "early": False, "n_batch": 1}]
    assert out["n_rounds"] == 2 and out["early_exits"] == 1
    assert out["requests"] == {"a": [2, 4], "b": [1]}  # per request, the k of each of its rounds
    assert set(out["hook_us"]) == {"plan", "take", "token_choice"} and out["hook_us"]["token_choice"] == pytest.approx(1.0)
    assert out["decide_us"] == pytest.approx(sum(out["hook_us"].values())) and out["plain_samples"] == 3
    empty = rec.drain()
    assert empty == {"rounds": [], "requests": {}, "decide_us": 0.0, "n_rounds": 0, "early_exits": 0, "hook_us": {},
                     "plain_samples": 0}
