"""The controller inside the real vLLM engine (CPU build): lossless at batch 1 and 4 with ragged k,
early exits, refusals, and a traced controlled run. Marked ``vllm``; kept short (a few prompts, few tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from speclimits.control import top1op
from speclimits.control.rules import CalibrationMap, PolicyFit
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.paths import DATA_DIR

pytestmark = pytest.mark.vllm

TOKENS = 24


def policy_dict(k_max: int) -> dict:
    cm = CostModel(c=1e-3, beta0={m: 8.0 + 0.2 * m for m in range(1, k_max + 2)},
                   alpha={m: 0.1 for m in range(1, k_max + 2)}, a=0.7, b=0.8)
    return PolicyFit(k_max=k_max, tau=0.05, lambda_=4.0, lambda_oracle=4.0, u_bar_mean=tuple([4.0] * (k_max + 2)),
                     calibration=CalibrationMap((0.0, 1.0), (0.0, 1.0)), cost_model=cm, train_seq_ids=(),
                     test_seq_ids=(), tokens_per_round=tuple(1.0 + 0.6 * k for k in range(1, k_max + 1))).to_dict()


@pytest.fixture(scope="module")
def ce():
    from speclimits.tracing.engine import apply_env_defaults

    apply_env_defaults()
    pytest.importorskip("vllm")
    from speclimits.bench import engines as engine

    return engine


@pytest.fixture(scope="module")
def tiny(ce, tmp_path_factory):
    from speclimits.tracing.tinymodel import write_tiny_eagle3, write_tiny_moe

    root = tmp_path_factory.mktemp("tiny")
    target = write_tiny_moe(root / "target")
    return target, write_tiny_eagle3(root / "eagle3", target=target)


PROMPTS = [[int(x) for x in np.random.default_rng(i).integers(1, 500, size=n)] for i, n in enumerate((7, 12, 20, 9))]


def plain_outputs(ce, target, batch, *samplings):
    """Plain decoding's outputs of :data:`PROMPTS` on the tiny target, one list per sampling keyword dict."""
    llm = ce.build_llm(str(target), None, "eagle3", 0, batch=batch, load_format="dummy", max_model_len=256)
    try:
        return [ce.generate(llm, PROMPTS, TOKENS, **kw) for kw in samplings or ({},)]
    finally:
        ce.close(llm)


def run_arms(ce, llm, prompts, names, k_max, tokens=TOKENS):
    out = {}
    for name in names:
        llm.collective_rpc("speclimits_control_set", args=(policy_dict(k_max), name))
        out[name] = (ce.generate(llm, prompts, tokens), llm.collective_rpc("speclimits_control_drain")[0])
    return out


@pytest.mark.parametrize("batch", [1, 4])
def test_lossless_on_the_tiny_models(ce, tiny, batch):
    target, head = tiny
    (plain,) = plain_outputs(ce, target, batch)
    for method, draft in (("draft_model", target), ("eagle3", head)):
        llm = ce.build_llm(str(target), str(draft), method, 4, batch=batch, load_format="dummy", max_model_len=256)
        try:
            arms = run_arms(ce, llm, PROMPTS, ["random:1", "static:2", "threshold", "delta", "delta-fixed:alone",
                                               "delta-fixed:zero-k", "cascade", "throughput"], 4)
        finally:
            ce.close(llm)
        for name, (outputs, drained) in arms.items():
            assert outputs == plain, f"{method} {name} batch {batch}"
            assert drained["n_rounds"] > 0 and drained["decide_us"] > 0
        ks = [k for r in arms["random:1"][1]["rounds"] for k in r["k"]]  # one record per drafting call
        assert set(ks) == {1, 2, 3, 4}, ks  # random k covers 1..K_max
        # a static K asks vLLM's drafter for K tokens (its per-step draft length): no early exit needed
        assert arms["static:2"][1]["early_exits"] == 0
        assert {k for r in arms["static:2"][1]["rounds"] for k in r["k"]} == {2}
        assert all(r["drafted"] == 2 for r in arms["static:2"][1]["rounds"])
        if batch == 4:
            rounds = arms["random:1"][1]["rounds"]
            assert any(len(set(r["k"])) > 1 for r in rounds if r["n_batch"] == 4), \
                "batch 4 should have rounds with different k per request"
            # the throughput-aware rule drafts one k for the batch
            assert all(len(set(r["k"])) == 1 for r in arms["throughput"][1]["rounds"]), "one k per batch"


def test_profile_then_policy_lossless(ce, tiny):
    """Armed with profiling, the controller cycles k = 0..K_max for the first rounds (every request the
    same k; at k = 0 none keeps a draft), fits the costs, then applies the policy: outputs identical to
    plain decoding throughout, and the profile covers every width, one row per request included."""
    target, head = tiny
    (plain,) = plain_outputs(ce, target, 2)
    llm = ce.build_llm(str(target), str(head), "eagle3", 4, batch=2, load_format="dummy", max_model_len=256)
    try:
        info = llm.collective_rpc("speclimits_control_set", args=(policy_dict(4), "delta", 16))[0]
        assert info["profiling_rounds"] == 16 and info["profile"] is None
        outs = ce.generate(llm, PROMPTS, TOKENS)
        drained = llm.collective_rpc("speclimits_control_drain")[0]
    finally:
        ce.close(llm)
    assert outs == plain
    prof = drained["profile"]
    assert prof is not None and set(prof["verify_ms"]) == {"1", "2", "3", "4", "5"} and prof["batch"] == 2
    first = drained["rounds"][:10]
    assert [r["cap"][0] for r in first] == [0, 1, 2, 3, 4] * 2 and all(len(set(r["k"])) == 1 for r in first)
    assert [r["k"][0] for r in first[:5]] == [0, 1, 2, 3, 4] and first[0]["drafted"] == 1
    assert drained["price_scale"] > 0 and set(drained["hook_us"]) >= {"observe", "plan", "draft_step"}


def test_a_policy_set_decides_greedy_and_sampled_requests_apart(ce, tiny):
    """A policy set on two greedy and two sampled requests: each decided by its temperature's fit (every draft
    matches at T = 0, none at T = 0.8); the greedy texts equal plain decoding's in the same mixed batch."""
    from dataclasses import replace

    from speclimits.control.policyset import PolicySet

    target, head = tiny
    sure = replace(PolicyFit.from_dict(policy_dict(4)), calibration=CalibrationMap((0.0, 1.0), (1.0, 1.0)))
    doubt = replace(sure, calibration=CalibrationMap((0.0, 1.0), (0.0, 0.0)))
    greedy = [True, False, True, False]
    kw = dict(temperature=0.8, seeds=[11, 12, 13, 14], greedy=greedy)
    (plain,) = plain_outputs(ce, target, 4, kw)
    llm = ce.build_llm(str(target), str(head), "eagle3", 4, batch=4, load_format="dummy", max_model_len=256)
    try:
        info = llm.collective_rpc("speclimits_control_set", args=(PolicySet((sure, doubt), (0.0, 0.8)).to_dict(),
                                                                  "delta-fixed:alone"))[0]
        outs = ce.generate(llm, PROMPTS, TOKENS, **kw)
        drained = llm.collective_rpc("speclimits_control_drain")[0]
    finally:
        ce.close(llm)
    assert info["parts"] == "T = 0: fit 0, T = 0.8: fit 1"
    assert [o for o, g in zip(outs, greedy) if g] == [o for o, g in zip(plain, greedy) if g]
    assert drained["parts"] == {"0": 2, "0.8": 2}
    most = sorted(max(ks) for ks in drained["requests"].values())
    assert len(most) == 4 and most[:2] <= [1, 1] and most[2:] == [4, 4], drained["requests"]


def test_a_round_that_plans_no_draft_skips_the_drafter(ce, tiny):
    """``throughput:zero-k`` with a prior that says no draft pays: after the prefill (drafted, so the head's cache
    holds it) no round drafts, steps sample through vLLM's plain sampler (counted), and greedy and seeded
    sampled outputs equal plain decoding's token for token."""
    from dataclasses import replace

    target, head = tiny
    fit = replace(PolicyFit.from_dict(policy_dict(4)), tokens_per_round=(1.01, 1.0101, 1.0102, 1.0103))
    sampled = dict(temperature=0.9, seeds=[11, 12, 13, 14])
    plain, plain_sampled = plain_outputs(ce, target, 2, {}, sampled)
    llm = ce.build_llm(str(target), str(head), "eagle3", 4, batch=2, load_format="dummy", max_model_len=256)
    try:
        llm.collective_rpc("speclimits_control_set", args=(fit.to_dict(), "throughput:zero-k"))
        outs = ce.generate(llm, PROMPTS, TOKENS)
        drained = llm.collective_rpc("speclimits_control_drain")[0]
        outs_sampled = ce.generate(llm, PROMPTS, TOKENS, **sampled)
        drained_sampled = llm.collective_rpc("speclimits_control_drain")[0]
    finally:
        ce.close(llm)
    assert outs == plain
    assert outs_sampled == plain_sampled and len(set(map(tuple, plain_sampled))) == len(PROMPTS)
    assert plain_sampled != plain  # (the sampled draws are not the greedy path)
    # every step sampled plainly: one per output token of each request, batched by 2
    assert drained["plain_samples"] >= len(PROMPTS) * TOKENS // 2 and drained_sampled["plain_samples"] > 0
    rounds = drained["rounds"]
    assert all(k == 0 for r in rounds for k in r["k"])
    skipped = sum(r["drafted"] == 0 for r in rounds)
    # one drafted round per prefill (4 prompts), every decode round skipped
    assert sum(r["drafted"] > 0 for r in rounds) <= len(PROMPTS) and skipped >= len(PROMPTS) * (TOKENS - 4) // 2


@pytest.mark.parametrize("batch", [1, 4])
def test_offline_driver_replays_the_engine_decisions_exactly(ce, tiny, batch):
    """The engine's driver records its inputs (price scale, rounds, top-1 as read, outcomes one round late); a
    fresh offline driver fed that record keeps the same k every round, for a rule of each kind, after a profile."""
    from speclimits.control.driver import replay
    from speclimits.control.profile import EnginePricing, EngineProfile

    target, head = tiny
    fit = PolicyFit.from_dict(policy_dict(4))
    llm = ce.build_llm(str(target), str(head), "eagle3", 4, batch=batch, load_format="dummy", max_model_len=256)
    try:
        llm.collective_rpc("speclimits_control_set", args=(policy_dict(4), "static:2", 15))
        ce.generate(llm, PROMPTS, TOKENS)  # profiles k = 0..4 three times, then static K = 2
        prof = llm.collective_rpc("speclimits_control_drain")[0]["profile"]
        assert prof is not None
        got = {}
        for name in ("threshold", "delta", "delta-fixed", "ema", "throughput"):
            llm.collective_rpc("speclimits_control_set", args=(policy_dict(4), name, 0, True))
            ce.generate(llm, PROMPTS, TOKENS)
            got[name] = llm.collective_rpc("speclimits_control_drain")[0]
    finally:
        ce.close(llm)
    pricing = EnginePricing()
    pricing.profile = EngineProfile.from_dict(prof)
    for name, drained in got.items():
        log = drained["inputs"]
        assert log and drained["n_rounds"] > 0, name
        again = replay(pricing.policy(fit, name, 4), log)
        engine = [(r["k"], r["drafted"]) for r in drained["rounds"]]
        assert [(r["k"], r["steps"]) for r in again] == engine, name  # the record is the engine's rounds, all
        assert [(r["k_now"], r["steps_now"]) for r in again] == engine, name  # decided again: the same
        if name in ("delta", "ema", "throughput"):
            assert any(ev[0] == "observe" for ev in log), name  # the rules with memory were given outcomes
        if batch > 1:
            assert any(len(r["k"]) > 1 for r in drained["rounds"]), name
            if name.startswith("delta"):  # the rules that read prices: the refresh moved the scale
                assert any(ev[0] == "scale" for ev in log[1:]), name


def test_lossless_on_the_bundled_pair(ce):
    """The bundled target + EAGLE-3 head, two prompts, batch 1 and batch 2: identical greedy outputs."""
    from speclimits.tracing.prompts import read_prompts

    target, head = DATA_DIR / "models" / "target", DATA_DIR / "models" / "eagle3"
    prompts = read_prompts(DATA_DIR / "traces" / "measured-eagle3" / "prompts.jsonl", limit=2)
    for batch in (1, 2):
        llm = ce.build_llm(str(target), None, "eagle3", 0, batch=batch, max_model_len=512)
        tok = llm.get_tokenizer()
        ids = [tok.encode(p.text) for p in prompts]
        plain = ce.generate(llm, ids, 20)
        ce.close(llm)
        llm = ce.build_llm(str(target), str(head), "eagle3", 4, batch=batch, max_model_len=512)
        try:
            arms = run_arms(ce, llm, ids, ["random:3", "delta", "threshold"], 4, tokens=20)
            # a confidence reader run without a drain, then a static K: the static arm's drain carries
            # none of the other's times (nor its token choice's saving)
            llm.collective_rpc("speclimits_control_set", args=(policy_dict(4), "threshold"))
            ce.generate(llm, ids, 20)
            static = run_arms(ce, llm, ids, ["static:2"], 4, tokens=20)["static:2"][1]
            # the Delta rule again with the compiled top-1 taken away: torch's softmax-max makes the choice
            llm.collective_rpc("speclimits_control_set", args=(policy_dict(4), "delta"))
            llm.collective_rpc(_drop_top1op)
            torch_outs = ce.generate(llm, ids, 20)
            torch_drained = llm.collective_rpc("speclimits_control_drain")[0]
        finally:
            ce.close(llm)
        assert static["token_choice_saved_us"] == 0.0 and "token_choice" not in static["hook_us"]
        for name, (outputs, _) in arms.items():
            assert outputs == plain, f"bundled pair, {name}, batch {batch}"
        # the confidence readers take the top-1 from the head's own 4,096 logits (checked against the
        # 8,192 target-vocabulary ones on the first step) and time vLLM's argmax where they take over
        for name in ("delta", "threshold"):
            drained = arms[name][1]
            assert drained["draft_vocab_top1"] is True, name
            assert drained["token_choice"] and all(v["argmax_us"] > 0 for v in drained["token_choice"].values())
        assert not arms["random:3"][1]["token_choice"] or arms["random:3"][1]["token_choice_saved_us"] == 0.0
        # the compiled top-1 made every read step's choice where it loads here (setup.sh builds it); the
        # choice is taken over once vLLM's argmax was timed 8 times per row count (at batch 1 here: at
        # batch 2 these few rounds may end first)
        compiled = top1op.load() is not None
        for name in ("delta", "threshold"):
            op = arms[name][1]["top1_op"]
            assert op["compiled"] is compiled, (name, op)
            assert op["torch_steps"] == 0 if compiled else op["steps"] == 0, (name, op)
            assert batch > 1 or op["steps" if compiled else "torch_steps"] > 0, (name, op)
        assert torch_outs == plain
        assert torch_drained["top1_op"]["steps"] == 0
        assert batch > 1 or torch_drained["top1_op"]["torch_steps"] > 0


def _drop_top1op(wrapper):
    # vLLM calls a function given to collective_rpc with its worker wrapper, which holds the worker
    getattr(wrapper, "worker", wrapper).speclimits_tokens.op = None


def test_refusals():
    from speclimits.control.extension import check_control_runner

    class Other:
        pass

    with pytest.raises(SpeclimitsError, match="unsupported model runner"):
        check_control_runner(Other())


def test_refuses_async_scheduling_and_ngram(ce, tiny, monkeypatch):
    from speclimits.control import extension

    target, _ = tiny
    monkeypatch.setattr(extension, "runner_kind", lambda runner: "v1")

    class AsyncRunner:
        use_async_scheduling = True

    with pytest.raises(SpeclimitsError, match="async_scheduling=True is not supported"):
        extension.check_control_runner(AsyncRunner())
    llm = ce.build_llm(str(target), None, "ngram", 3, batch=1, load_format="dummy", max_model_len=256)
    try:
        with pytest.raises(Exception, match="not ngram|lacks"):
            llm.collective_rpc("speclimits_control_set", args=(policy_dict(3), "delta"))
    finally:
        ce.close(llm)


def test_a_controlled_run_can_be_traced(ce, tiny, tmp_path, monkeypatch):
    """The tracer's sweep with the control extension armed by environment: the trace validates and its
    rounds record the k the policy chose (ragged under the random arm)."""
    from speclimits.control.extension import ENV_NAME, ENV_POLICY, ENV_PROFILE
    from speclimits.trace import read_trace
    from speclimits.tracing.sweep import SweepConfig, run_sweep
    from speclimits.trace import validate_trace

    target, _ = tiny
    pfile = tmp_path / "policy.json"
    PolicyFit.from_dict(policy_dict(4)).write(pfile)
    monkeypatch.setenv(ENV_POLICY, str(pfile))
    monkeypatch.setenv(ENV_NAME, "random:2")
    monkeypatch.setenv(ENV_PROFILE, "0")  # the random arm from the first round (no profiling)
    out = tmp_path / "trace"
    cfg = SweepConfig(target=str(target), draft=str(target), method="draft_model",
                      prompts=str(DATA_DIR / "prompts" / "smoke.jsonl"), out=str(out), k_values=[4], max_tokens=16,
                      load_format="dummy", tokens="none", progress=False, limit=2,
                      engine_extra={"worker_extension_cls": "speclimits.control.extension.ControlWorkerExtension"})
    run_sweep(cfg)
    validate_trace(out)
    rounds = read_trace(out).rounds
    dec = rounds[rounds["phase"].astype(str) == "decode"]
    assert set(dec["n_draft"].unique()) >= {1, 2, 3, 4}
