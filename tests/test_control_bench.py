"""The benchmark command: paired ratios and the summary on hand-made blocks, and a tiny end-to-end run in vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclimits.bench.control import (block_prompts, paired_ratio, parse_static, per_block, summarize, trace_generations,
                                      with_prediction)
from conftest import benchmark_module
from speclimits.errors import SpeclimitsError
from speclimits.paths import DATA_DIR, REPO_ROOT

#: ms/token of each arm before the block's own drift; the policy is 8% faster than the best stock K.
TRUE_MS = {"plain": 10.0, "stock:1": 7.0, "stock:2": 6.0, "stock:3": 6.3, "static:2": 6.06, "delta": 6.0 / 1.08}


def hand_blocks(n_blocks: int = 40, seed: int = 0) -> pd.DataFrame:
    """Blocks with a shared drift per block (the machine) and a small independent noise per arm."""
    rng = np.random.default_rng(seed)
    rows = []
    for block in range(n_blocks):
        drift = np.exp(rng.normal(0, 0.25))  # the machine speeds up and slows down by ±25% between blocks
        for arm, ms in TRUE_MS.items():
            t = ms * drift * np.exp(rng.normal(0, 0.01))
            controlled = not (arm == "plain" or arm.startswith("stock:"))
            rows.append(dict(block=block, arm=arm, duration_s=t * 0.128, total_output_tokens=128, cpu_s=t * 0.12,
                             ms_per_token=t, load1=0.9, lossless=True,
                             spec_decode_num_drafts=10 if controlled else None,
                             spec_decode_draft_tokens=20 if controlled else None,
                             spec_decode_accepted_tokens=12 if controlled else None,
                             decide_us=100.0 if controlled else np.nan, drafting_calls=10 if controlled else np.nan,
                             wasted_draft_steps=0.0, mean_k=2.0 if controlled else np.nan,
                             price_scale=1.0 if controlled else np.nan))
    return pd.DataFrame(rows)


def test_paired_ratio_recovers_a_known_ratio_through_block_drift():
    """The drift shared by a block's arms cancels: a narrow interval around the true 1.08 despite ±25% drift."""
    pb = per_block(hand_blocks())
    est, lo, hi = paired_ratio(pb["stock:2"].to_numpy(), pb["delta"].to_numpy(), n_boot=2000, seed=1)
    assert lo < 1.08 < hi and hi - lo < 0.02
    assert est == pytest.approx(1.08, abs=0.01)
    # unpaired medians are far noisier than that
    assert pb["stock:2"].std() / pb["stock:2"].mean() > 0.1
    assert paired_ratio(pb["delta"].to_numpy(), pb["delta"].to_numpy())[:1] == (1.0,)


def test_summary_chooses_the_best_stock_k_on_half_the_blocks():
    s, choice = summarize(hand_blocks(), n_boot=500)
    s = s.set_index("arm")
    assert choice["best_stock"] == "stock:2" and choice["best_stock_chosen_on"] == "even blocks"
    assert choice["compared_on_blocks"] == list(range(1, 40, 2))
    assert s.loc["delta", "vs_best_stock_lo"] < 1.08 < s.loc["delta", "vs_best_stock_hi"]
    assert s.loc["stock:2", "vs_best_stock"] == pytest.approx(1.0)
    assert s.loc["delta", "vs_plain"] == pytest.approx(10.0 / (6.0 / 1.08), rel=0.01)
    assert s.loc["static:2", "vs_stock_2"] == pytest.approx(6.0 / 6.06, abs=0.005)  # the extension's own cost
    assert s.loc["delta", "spec_decode_acceptance_length"] == pytest.approx(1 + 12 / 10)
    assert np.isnan(s.loc["stock:2", "spec_decode_acceptance_length"])
    assert s.loc["delta", "decision_us_per_round"] == pytest.approx(10.0)
    assert s.loc["delta", "decision_share"] == pytest.approx(10.0 / (s.loc["delta", "round_ms"] * 1e3))
    assert s["lossless"].all()


def test_prediction_beside_the_measurement():
    s, _ = summarize(hand_blocks(6), n_boot=0)
    table = pd.DataFrame({"policy": ["static:2", "delta"], "replay_ms_per_token": [6.6, 5.0]})
    out = with_prediction(s, table).set_index("arm")
    pooled = out.loc["stock:2", "ms_per_token_pooled"]
    assert out.loc["stock:2", "predicted_ms_per_token"] == 6.6  # stock K and static K share a prediction
    assert out.loc["static:2", "predicted_ms_per_token"] == 6.6
    assert out.loc["stock:2", "prediction_error"] == pytest.approx(6.6 / pooled - 1)
    assert np.isnan(out.loc["plain", "predicted_ms_per_token"])


def test_prediction_rescaled_by_the_price_level_the_run_measured():
    """The machine drifts and the controller's price scale measures it: the prediction at the start's prices is
    off by the mean drift, at the measured price level it matches every arm's pooled time, stock arms included."""
    blocks = hand_blocks(30, seed=4)
    trend = 1.0 + 0.02 * blocks["block"]  # and the machine slows down through the run
    for col in ("duration_s", "cpu_s", "ms_per_token"):
        blocks[col] = blocks[col] * trend
    drift = blocks["ms_per_token"] / blocks["arm"].map(TRUE_MS)  # the block's drift (and the arm's 1% noise)
    by_block = drift.groupby(blocks["block"]).median()
    blocks["price_scale"] = np.where(blocks["price_scale"].notna(), blocks["block"].map(by_block) * 1.0, np.nan)
    s, _ = summarize(blocks, n_boot=0)
    table = pd.DataFrame({"policy": ["static:2", "static:1", "delta"],
                          "replay_ms_per_token": [TRUE_MS["stock:2"], TRUE_MS["stock:1"], TRUE_MS["delta"]]})
    out = with_prediction(s, table).set_index("arm")
    level = float(by_block.mean())
    assert level > 1.2  # the drift does not average out: the prediction at the start's prices is off
    for arm in ("stock:2", "stock:1", "delta"):
        assert out.loc[arm, "price_level"] == pytest.approx(level, rel=1e-9)
        assert out.loc[arm, "prediction_error"] < -0.15
        assert abs(out.loc[arm, "prediction_error_rescaled"]) < 0.01
    assert np.isnan(out.loc["plain", "predicted_ms_per_token_rescaled"])


def test_prediction_is_compared_with_the_pooled_time_per_token():
    """Blocks of different lengths: the error is taken against the pooled time per token, not the median."""
    rows = []
    for block, (dur, tok) in enumerate([(1.0, 100), (1.0, 100), (4.0, 200)]):  # 10, 10, 20 ms/token
        rows.append(dict(block=block, arm="static:2", duration_s=dur, total_output_tokens=tok, cpu_s=dur,
                         ms_per_token=dur * 1e3 / tok, load1=0.5, lossless=True, spec_decode_num_drafts=None,
                         spec_decode_draft_tokens=None, spec_decode_accepted_tokens=None))
    s, _ = summarize(pd.DataFrame(rows), n_boot=0)
    r = s.set_index("arm").loc["static:2"]
    assert r["ms_per_token"] == pytest.approx(10.0) and r["ms_per_token_pooled"] == pytest.approx(6e3 / 400)
    out = with_prediction(s, pd.DataFrame({"policy": ["static:2"], "replay_ms_per_token": [15.0]})).set_index("arm")
    assert out.loc["static:2", "prediction_error"] == pytest.approx(0.0)


COMMITTED_RUNS = sorted(str(p.relative_to(DATA_DIR / "control")) for p in (DATA_DIR / "control").glob("**/bench-batch*.json")
                        if "discarded" not in p.parts)


@pytest.mark.parametrize("name", COMMITTED_RUNS)
def test_committed_summaries_are_what_summarize_computes_from_their_blocks(name, tmp_path):
    """`speclimits control summarize` reproduces every stored number of the committed runs from their blocks."""
    from speclimits.cli import main

    assert len(COMMITTED_RUNS) >= 10
    src = DATA_DIR / "control" / name
    out = tmp_path / "again.json"
    assert main(["control", "summarize", str(src), "--out", str(out)]) == 0
    old, new = json.loads(src.read_text()), json.loads(out.read_text())
    assert new["choice"] == old["choice"] and new["blocks"] == old["blocks"]
    a, b = pd.DataFrame(old["summary"]).set_index("arm"), pd.DataFrame(new["summary"]).set_index("arm")
    assert list(a.columns) == list(b.columns)
    num = [c for c in a.columns if c != "lossless"]
    np.testing.assert_allclose(b.loc[a.index, num].astype(float), a[num].astype(float), rtol=1e-12, equal_nan=True)


def test_summarize_refuses_what_it_cannot_recompute(tmp_path, capsys):
    from speclimits.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"config": {}}')
    for args, msg in ((["x.json", "y.json", "--out", str(tmp_path / "o.json")], "one input file"),
                      ([str(bad)], "not a `speclimits control bench` result (no 'blocks')")):
        assert main(["control", "summarize", *args]) == 2
        assert msg in capsys.readouterr().err


def test_blocks_cycle_through_the_prompts():
    assert block_prompts(list(range(5)), 2, 0) == [0, 1]
    assert block_prompts(list(range(5)), 2, 2) == [4, 0]
    assert [block_prompts(list(range(3)), 1, b) for b in range(4)] == [[0], [1], [2], [0]]


def test_parse_static():
    assert parse_static("1-3,6") == [1, 2, 3, 6]
    with pytest.raises(SpeclimitsError, match="--static"):
        parse_static("a")
    with pytest.raises(SpeclimitsError, match=">= 1"):
        parse_static("0-2")


def tiny_bench_args(smoke_trace, tmp_path, policy_args=()):
    """A fitted policy (K_max 3; ``policy_args``: ``control combine`` arguments after it, for a set) and the
    tiny setting's ``control bench`` arguments: config-only target as its own draft, two prompts, two blocks,
    batch 2, written to ``tmp_path / "bench.json"``."""
    from speclimits.cli import main
    from speclimits.tracing.engine import apply_env_defaults
    from speclimits.tracing.tinymodel import write_tiny_moe

    apply_env_defaults()
    pytest.importorskip("vllm")
    target = write_tiny_moe(tmp_path / "tiny")
    policy = tmp_path / "policy.json"
    assert main(["control", "fit", str(smoke_trace), "--out", str(policy), "--k-max", "3"]) == 0
    if policy_args:
        assert main(["control", "combine", str(policy), *[a.format(policy=policy) for a in policy_args], "--out",
                     str(tmp_path / "set.json")]) == 0
        policy = tmp_path / "set.json"
    return ["control", "bench", "--policy", str(policy), "--trace", str(smoke_trace), "--target", str(target),
            "--draft", str(target), "--method", "draft_model", "--load-format", "dummy",
            "--prompts", str(DATA_DIR / "prompts" / "smoke.jsonl"), "--ids", "all", "--limit", "2",
            "--max-tokens", "12", "--blocks", "2", "--profile-rounds", "12", "--batch", "2",
            "--out", str(tmp_path / "bench.json")]


@pytest.mark.vllm
def test_tiny_benchmark_end_to_end(smoke_trace, tmp_path):
    from speclimits.cli import main

    args = tiny_bench_args(smoke_trace, tmp_path)
    assert main([*args, "--static", "1-3", "--policies", "threshold,ema,delta"]) == 0
    out = tmp_path / "bench.json"
    res = json.loads(out.read_text())
    assert res["lossless"] is True and res["label"].startswith("measured")
    s = pd.DataFrame(res["summary"]).set_index("arm")
    assert set(s.index) == {"plain", "stock:1", "stock:2", "stock:3", "static:2", "static:3", "threshold", "ema",
                            "delta"}
    assert (s["blocks"] == 2).all()
    # self-draft with dummy weights accepts every draft: acceptance length is 1 + K for static K
    for k in (2, 3):
        assert s.loc[f"static:{k}", "spec_decode_acceptance_length"] == pytest.approx(1 + k, abs=0.35)
    prof = res["profile"]
    assert prof["batch"] == 2 and set(prof["verify_ms"]) == {"1", "2", "3", "4"}  # m = 1: the k = 0 profiling rounds
    assert np.all(np.diff([prof["verify_ms"][m] for m in ("2", "3", "4")]) >= 0)
    assert res["engine"]["cpu"]["model"] and isinstance(res["engine"]["cpu"]["flags"], list)
    assert "L3" in res["engine"]["cpu"]["cache_kib"] or not Path("/sys/devices/system/cpu/cpu0/cache").exists()
    assert all(b["load1"] >= 0 for b in res["blocks"])
    assert "does not apply" in res["note"]  # the smoke prompts have no greedy reference in the trace


@pytest.mark.vllm
def test_tiny_benchmark_sampled(smoke_trace, tmp_path, capsys):
    """A mixed workload (T 0.8, top-p 0.95, one greedy and one sampled request per block; a token budget holding a
    block's prompts) with a policy set: every engine repaired on CPU, each request decided by its temperature's
    fit, greedy texts equal plain decoding's, sampled drafts rejected sometimes; bad options refused first."""
    from speclimits.cli import main
    from speclimits.tracing.engine import cuda_available

    args = [*tiny_bench_args(smoke_trace, tmp_path, ["{policy}@0.8"]), "--static", "2", "--ext-static", "2",
            "--policies", "delta"]
    assert main([*args, "--temperature", "-1"]) == 2
    assert "--temperature must be a finite number >= 0" in capsys.readouterr().err
    assert main([*args, "--greedy-share", "0.5"]) == 2
    assert "--greedy-share must be in [0, 1) and needs --temperature > 0" in capsys.readouterr().err
    assert main([*args, "--temperature", "0.8", "--top-p", "0.95", "--greedy-share", "0.5"]) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["config"]["temperature"] == 0.8 and res["config"]["top_p"] == 0.95
    assert res["lossless"] is True and all(b["greedy_requests"] == 1 and b["lossless"] for b in res["blocks"])
    assert "0.5 of the requests greedy, the rest at temperature 0.8, top-p 0.95" in res["summary_text"]
    assert res["policy_set"]["temperatures"] == [0.0, 0.8] and res["offline"] is None
    assert all(b["parts"] == {"0": 1, "0.8": 1} for b in res["blocks"] if b["arm"] == "delta")
    assert res["engine"]["max_num_batched_tokens"] == 2 * res["config"]["max_model_len"]
    if not cuda_available():
        assert any("vllm#55005" in f for f in res["engine"]["fixes"])
    s = pd.DataFrame(res["summary"]).set_index("arm")
    assert set(s.index) == {"plain", "stock:2", "static:2", "delta"}
    # the greedy request accepts all of each round's 2 drafts (the test above), the sampled one fewer
    assert s.loc["static:2", "spec_decode_acceptance_length"] < 1 + 2 - 0.2


def sweep_module():
    """``benchmarks/batch_replay_sweep.py``, imported from its file."""
    return benchmark_module("batch_replay_sweep")


def test_batch_replay_sweep_reproduces_the_committed_prediction():
    """The λ sweep replays the committed batch-4 run as its prediction did: every static K and, at λ as fitted,
    the fixed-λ Delta rules exactly (the running-λ rule within 1%: outcomes now arrive one round late)."""
    path = DATA_DIR / "control" / "bench-batch4.json"
    res = json.loads(path.read_text())
    table = sweep_module().sweep(path, [1.0, 0.5])
    pred = {r["arm"]: r["predicted_ms_per_token"] for r in res["summary"]}
    got = table[table["lambda_scale"].isna() | (table["lambda_scale"] == 1.0)].set_index("arm")["ms_per_token"]
    for k in range(1, 7):
        assert got[f"static:{k}"] == pytest.approx(pred[f"stock:{k}"], rel=1e-9)
    for name in ("delta-fixed", "delta-fixed:alone"):
        assert got[name] == pytest.approx(pred[name], rel=1e-9)
    # the running-λ rule has memory: the committed prediction was made when the offline replay observed each
    # round at once; it now observes one round late, as the engine does, which moves it a little (0.17%)
    assert got["delta"] != pytest.approx(pred["delta"], rel=1e-9)
    assert got["delta"] == pytest.approx(pred["delta"], rel=0.01)
    at = table[table["lambda_scale"] == 1.0].set_index("arm")
    assert at.loc["delta-fixed", "wasted_draft_steps"] < at.loc["delta-fixed:alone", "wasted_draft_steps"]


def test_batch_replay_sweep_with_hindsight_keeps_only_matching_drafts():
    """The sweep's hindsight replay on the twin's batch-4 run: knowing which drafts match (k = 0 allowed) it keeps
    none that fails and is at least as fast as reading confidences; the unprofiled m = 1 pass is estimated."""
    table = sweep_module().sweep(DATA_DIR / "control" / "twin" / "bench-batch4.json", [1.0], with_hindsight=True,
                                 estimate_m1=True)
    assert table.attrs["m1_pass"].startswith("estimated") and 0 < table.attrs["m1_pass_ms"] < 25.2  # below m = 2
    at = table[table["lambda_scale"] == 1.0].set_index(["arm", "confidence"])
    for arm in ("delta-fixed", "delta-fixed:zero-k"):
        assert at.loc[(arm, "hindsight"), "ms_per_token"] <= at.loc[(arm, "draft"), "ms_per_token"], arm
    truth, draft = at.loc[("delta-fixed:zero-k", "hindsight")], at.loc[("delta-fixed:zero-k", "draft")]
    # (a batch's last request, alone, is decided per request: it keeps the draft at which it stops)
    assert truth["tokens_per_round"] == pytest.approx(truth["mean_k"] + 1, rel=0.05)
    assert draft["tokens_per_round"] < 0.9 * (draft["mean_k"] + 1)
    # without k = 0 every request keeps its first draft, matching or not; only the drafts after it must match
    truth = at.loc[("delta-fixed", "hindsight")]
    assert truth["mean_k"] < truth["tokens_per_round"] < truth["mean_k"] + 1
    zero = at.loc[("delta-fixed:zero-k", "hindsight")]
    assert zero["mean_k"] < at.loc[("delta-fixed", "hindsight"), "mean_k"]  # it drops the first drafts that fail


def test_batch_replay_sweep_replays_a_run_on_unseen_prompts_on_a_trace_of_them():
    """A run on prompts outside its policy's trace checked no reference (``reference_parts_at`` empty): with
    ``--trace`` a trace of those prompts, every prompt is replayed, and knowing the outcomes beats the confidences."""
    fresh = DATA_DIR / "control" / "twin" / "fresh"
    run = fresh / "amd-epyc-c" / "b8" / "bench-batch8.json"
    assert json.loads(run.read_text())["reference_parts_at"] == {}
    table = sweep_module().sweep(run, [1.0], with_hindsight=True, trace=fresh / "trace")
    static = table[table["arm"].str.startswith("static:")].set_index("arm")
    for k in range(1, 7):
        assert static.loc[f"static:{k}", "mean_k"] == k and 1 < static.loc[f"static:{k}", "tokens_per_round"] <= k + 1
    at = table[table["lambda_scale"] == 1.0].set_index(["arm", "confidence"])
    assert at.loc[("delta", "hindsight"), "ms_per_token"] < at.loc[("delta", "draft"), "ms_per_token"]


def test_replay_plus_the_prefill_prices_the_measured_batch4_run():
    """``benchmarks/replay_vs_measured.py`` on the committed batch-4 run on unseen prompts: the replay of each stock K
    alone is 13-14 % optimistic; with each block's prefill (the trace's round 0 of plain decoding) it is within 1 %."""
    mod = benchmark_module("replay_vs_measured")
    fresh = DATA_DIR / "control" / "twin" / "fresh"
    t = mod.compare(fresh / "amd-epyc-c" / "overhead" / "bench-batch4.json", fresh / "trace")
    assert t["arm"].tolist() == ["stock:2", "stock:3", "stock:4"]
    assert (t["replay_error"] < -0.12).all() and (t["with_prefill_error"].abs() < 0.01).all()
    pre = mod.prefill_ms(fresh / "trace")
    assert len(pre) == 24 and t.attrs["prefill_ms_per_prompt"] == pytest.approx(pre.mean())
    np.testing.assert_allclose(t["replay_plus_prefill"] - t["replay"], t.attrs["prefill_ms_per_token"])


def test_trace_generations_reads_the_shard_logs_of_a_distributed_trace(tmp_path):
    """Generations in shard logs are read too; a shard without its rounds part (a killed worker) is not."""
    from speclimits.trace.io import append_lines, write_part, write_shard_log

    def gen(gid, pid, k, out):
        return {"generation_id": gid, "prompt_id": pid, "K": k, "prompt_token_ids": [1, 2, gid],
                "output_token_ids": out}

    trace = tmp_path / "trace"
    trace.mkdir()
    append_lines(trace / "generations.jsonl", [gen(0, "a", 0, [5, 6]), gen(1, "a", 2, [5, 6])])
    rounds = pd.DataFrame({"generation_id": [2], "round": [0]})
    write_part(trace, "rounds", "part-g000002", rounds)
    write_shard_log(trace, "part-g000002", {"part": "part-g000002"}, [gen(2, "b", 0, [7]), gen(3, "b", 1, [7])])
    write_shard_log(trace, "part-g000009", {"part": "part-g000009"}, [gen(9, "c", 0, [8])])  # no rounds part
    assert trace_generations(trace) == {"a": ([1, 2, 0], [5, 6]), "b": ([1, 2, 2], [7])}
    assert trace_generations(tmp_path / "missing") == {}


def test_bench_batch_option_takes_the_shared_list_syntax(tmp_path):
    """``--batch`` takes the shared list syntax: one benchmark per batch size, each its own file."""
    import argparse

    from speclimits.cli import build_parser
    from speclimits.cliutil import parse_batch_sizes
    from speclimits.bench.control import BenchConfig

    out = tmp_path / "bench.json"
    args = build_parser().parse_args(["control", "bench", "--policy", "p.json", "--out", str(out), "--batch", "1-2,8",
                                      "--ext-static", "2"])
    cfgs = BenchConfig.per_batch(args, parse_batch_sizes(args.batch))
    assert [(c.batch, Path(c.out).name) for c in cfgs] == [(1, "bench-batch1.json"), (2, "bench-batch2.json"),
                                                            (8, "bench-batch8.json")]
    assert cfgs[0].ext_static == [2] and cfgs[0].static == [1, 2, 3, 4, 5, 6]
    one = BenchConfig.per_batch(args, [4])
    assert [(c.batch, c.out) for c in one] == [(4, str(out))]
    for spec, msg in (("1,x", "--batch expects e.g. '1,2,4,8' or '1-4', got '1,x'"),
                      ("0-2", "--batch needs at least one batch size >= 1")):
        with pytest.raises(SpeclimitsError, match=msg):
            parse_batch_sizes(spec)
    with pytest.raises(SpeclimitsError, match="--ext-static expects"):
        BenchConfig.from_args(argparse.Namespace(**{**vars(args), "batch": 1, "ext_static": "a"}))


def test_crossfit_ratio_runs_the_k_chosen_on_one_half_on_the_other():
    """Two stock Ks that swap places between the halves: in hindsight (all blocks) the reference is the better
    of the two everywhere's average; cross-fitted, each half runs the K the *other* half chose, its worse one.
    The planted times give both figures in closed form; with one clearly best K the two ratios agree."""
    from speclimits.bench.control import crossfit_ratios, workload_ratios

    rows = []
    for block in range(20):
        even = block % 2 == 0
        # stock:1 takes 10 ms/token on even blocks and 13 on odd; stock:2 the reverse but 12 / 10.5
        for name, ms in (("stock:1", 10.0 if even else 13.0), ("stock:2", 12.0 if even else 10.5),
                         ("delta", 10.0)):
            rows.append(dict(block=block, arm=name, duration_s=ms * 0.1, total_output_tokens=100))
    blocks = pd.DataFrame(rows)
    chosen, c = crossfit_ratios(blocks, n_boot=300)
    assert chosen == ["stock:1", "stock:2"]  # even blocks choose K = 1, odd blocks K = 2
    # run crossed: K = 1 on the odd blocks (13), K = 2 on the even ones (12): 12.5 ms/token
    assert c.loc["delta", "crossfit_ratio"] == pytest.approx(12.5 / 10.0)
    best, w = workload_ratios(blocks, n_boot=300)
    assert best == "stock:2"  # 11.25 ms/token over all blocks against 11.5
    assert w.loc["delta", "workload_ratio"] == pytest.approx(11.25 / 10.0)
    assert c.loc["stock:2", "crossfit_ratio"] == pytest.approx(12.5 / 11.25)
    # no noise, so every replicate chooses the same: the interval is the point
    assert c.loc["delta", "crossfit_ratio_lo"] == pytest.approx(1.25) == c.loc["delta", "crossfit_ratio_hi"]
    # one K best on every block: the cross-fitted reference is that K, as in hindsight
    _, c2 = crossfit_ratios(hand_blocks(), n_boot=300)
    _, w2 = workload_ratios(hand_blocks(), n_boot=300)
    assert c2.loc["delta", "crossfit_ratio"] == pytest.approx(w2.loc["delta", "workload_ratio"])
    s, choice = summarize(hand_blocks(), n_boot=100)
    assert choice["crossfit_stock"] == ["stock:2", "stock:2"] and "crossfit_ratio_lo" in s


def test_workload_ratio_recovers_a_known_ratio_and_the_committed_figures():
    """The workload ratio recovers the planted 1.08, and the figures quoted for the committed batch-1 runs."""
    from speclimits.book.views.control_runs import engine_table
    from speclimits.bench.control import workload_ratios

    best, w = workload_ratios(hand_blocks(), n_boot=500)
    assert best == "stock:2"
    assert w.loc["delta", "workload_ratio"] == pytest.approx(1.08, abs=0.005)
    assert w.loc["delta", "workload_ratio_lo"] < 1.08 < w.loc["delta", "workload_ratio_hi"]
    assert w.loc["stock:2", "workload_ratio"] == 1.0
    s, choice = summarize(hand_blocks(), n_boot=200)
    assert choice["best_stock_workload"] == "stock:2" and "workload_ratio_hi" in s
    for path, arm, ref, want in (("bench-batch1.json", "threshold", "stock:6", 1.067),
                                 ("replication/bench-batch1.json", "delta-fixed", "stock:5", 1.070)):
        res = json.loads((DATA_DIR / "control" / path).read_text())
        best, w = workload_ratios(pd.DataFrame(res["blocks"]))
        assert best == ref and round(w.loc[arm, "workload_ratio"], 3) == want
        assert w.loc[arm, "workload_ratio_lo"] > 1.0
        table = engine_table(res).set_index("arm")  # a result summarized before the ratio gets it on reading
        assert table.loc[arm, "workload_ratio"] == w.loc[arm, "workload_ratio"]


def test_the_tail_of_a_batch_is_priced_as_the_hand_count_says():
    """``benchmarks/batch_tails.py``: two requests of 6 tokens, one whose drafts always match and one whose
    never do, at static K = 2 with a step of 10 ms + 1 ms per row: the fast one is done after 2 rounds (3 tokens
    each), the slow one needs 6; rounds 1-2 are the full batch, 3-6 the tail."""
    from speclimits.control.profile import EngineProfile
    from speclimits.oracle.inputs import OracleInputs

    mod = benchmark_module("batch_tails")
    n, k = 6, 2
    acc = np.concatenate([np.full(n, 6), np.zeros(n, dtype=int)])
    inp = OracleInputs(seq_ids=np.array(["fast", "slow"]), offsets=np.array([0, n, 2 * n]),
                       pos=np.tile(np.arange(n), 2), context_len=np.tile(np.arange(n) + 10, 2), accept_len=acc,
                       match_prob=np.zeros((2 * n, 6)), draft_conf=np.full((2 * n, 6), 0.5),
                       u_bar_window=np.ones((2 * n, 7)))
    prof = EngineProfile(batch=2, verify_ms={m: 10.0 + 2 * m for m in range(1, 8)},
                         pass_ms={m: 10.0 + 2 * m for m in range(1, 8)}, draft_ms0=0.0, draft_ms1=0.0, other_ms=0.0,
                         n_steps=1)
    r = mod.replay_static(inp, [[0, 1]], prof, k)
    full = 2 * (10.0 + 2 * (k + 1))  # two full-batch rounds of 2·3 rows: tokens 3 + 1 each
    tail_rows = k + 1  # the slow request alone: 3 rows, the profile's line below its narrowest width (2 rows)
    tail_step = prof.pass_at(tail_rows)
    assert r["full_batch_ms_per_token"] == pytest.approx(full / 8)
    assert r["block_ms_per_token"] == pytest.approx((full + 4 * tail_step) / 12)
    assert r["tail_share"] == pytest.approx(4 * tail_step / (full + 4 * tail_step))


def test_the_measured_tail_grows_with_k_as_the_committed_split_says():
    """``benchmarks/batch_tails.py --measured`` on the committed batch-8 trace of the unseen prompts: the share of
    decoding time after a batch's first request finished grows with K, and the figures are the committed ones."""
    mod = benchmark_module("batch_tails")
    trace = DATA_DIR / "control/twin/fresh/amd-epyc-c/b8-trace"
    m = mod.measured_tails(trace)
    assert m["K"].tolist() == [1, 2, 4, 6] and (m["b"] == 8).all() and (m["batches"] == 3).all()
    assert m["tail_share"].is_monotonic_increasing and (m["block_ms_per_token"] > m["full_batch_ms_per_token"]).all()
    committed = json.loads((DATA_DIR / "control/twin/fresh/amd-epyc-c/decomposition/batch-tails.json").read_text())
    for want, got in zip(committed["measured"]["rows"], m.to_dict(orient="records"), strict=True):
        assert want == pytest.approx(got)


def test_the_book_sets_the_measured_tail_beside_the_replayed_one():
    """Section 8's tail table: per K of the batch trace its measured tail share, the replay's for the run of the
    same batch size, and times per token relative to K = 2 (1 at K = 2)."""
    from speclimits.book.views.control import BATCH_TAILS, batch_tails

    t = batch_tails()
    d = json.loads(BATCH_TAILS.read_text())
    assert t["K"].tolist() == [r["K"] for r in d["measured"]["rows"]] and t.attrs["batch"] == 8
    assert t["Tail % (measured)"].tolist() == [round(100 * r["tail_share"], 1) for r in d["measured"]["rows"]]
    two = t.set_index("K").loc[2]
    assert two["Time/token vs K = 2, full steps"] == 1 and two["Time/token vs K = 2, batches"] == 1
    replay = next(r for r in d["runs"].values() if r["batch"] == 8)
    assert t.set_index("K").loc[6, "Tail % (replay)"] == round(100 * replay["rows"][5]["tail_share"], 1)


def test_the_tail_planner_prices_the_request_that_ends_the_block():
    """``batch_tails.tail_weights``: rounds to go = tokens left over tokens per round so far (prior: 2 rounds at
    2 tokens); the request with the most rounds to go gets ``s``, the others ``s · (R / R_max)^γ``."""
    mod = benchmark_module("batch_tails")
    w = mod.tail_weights(2.0, 1.5)
    left, done, rounds = np.array([60.0, 60.0, 10.0]), np.array([40.0, 20.0, 90.0]), np.array([10.0, 10.0, 30.0])
    rate = (done + 4.0) / (rounds + 2.0)  # 44/12, 24/12, 94/32
    to_go = left / rate
    assert w(left, done, rounds) == pytest.approx(1.5 * (to_go / to_go.max()) ** 2)
    assert w(left, done, rounds)[1] == pytest.approx(1.5)  # the slower of the two with 60 tokens left
    assert (np.diff(w(np.array([5.0, 10.0, 20.0]), np.zeros(3), np.zeros(3))) > 0).all()
    assert mod.tail_weights(0.0, 1.0)(left, done, rounds) == pytest.approx(np.ones(3))


def test_the_tail_planner_replay_reproduces_the_committed_bound():
    """``batch_tails.plan_study`` on the committed batch-8 run (EPYC C, b8-all) for the rule fed the true match
    probabilities: the train references' choice and the hindsight bound are the committed ones."""
    mod = benchmark_module("batch_tails")
    run = "data/control/twin/fresh/amd-epyc-c/b8-all/bench-batch8.json"
    committed = json.loads((DATA_DIR / "control/twin/fresh/amd-epyc-c/decomposition/batch-tails.json").read_text())
    want = next(r for r in committed["plan"][run]["rows"] if r["rule"] == "true")
    got = mod.plan_study(REPO_ROOT / run, DATA_DIR / "control/twin/fresh/trace", rules=("true",))
    assert got.attrs["batch"] == 8 and got.attrs["blocks"] == committed["plan"][run]["blocks"]
    assert got.iloc[0].to_dict() == pytest.approx(want)


def test_the_tail_planner_names_a_missing_policy_trace(tmp_path, capsys):
    """``--plan`` needs the trace the run's policy was fitted on (its train references): a run whose trace is gone
    fails with the run and the trace named, not a traceback."""
    mod = benchmark_module("batch_tails")
    bench = json.loads((DATA_DIR / "control/twin/fresh/amd-epyc-c/b8-all/bench-batch8.json").read_text())
    bench["config"]["trace"] = str(tmp_path / "gone")
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert mod.main([str(tmp_path / "bench.json"), "--trace", str(DATA_DIR / "control/twin/fresh/trace"),
                     "--plan"]) == 2
    err = capsys.readouterr().err
    assert "bench.json" in err and "gone" in err


def test_the_book_shows_the_tail_planner_beside_todays_rules():
    """Section 8's planner table: one row per replayed run and rule, the committed speeds; the planner fed the
    true probabilities in hindsight is the class's bound, and every figure is of the same replay's best static K."""
    from speclimits.book.views.control import BATCH_TAILS, tail_plan

    d = json.loads(BATCH_TAILS.read_text())
    t = tail_plan()
    assert len(t) == sum(len(v["rows"]) for v in d["plan"].values()) and set(t["Batch"]) == {4, 8}
    first = d["plan"][next(iter(d["plan"]))]["rows"][0]
    row = t.iloc[0]
    assert row["Per round (today)"] == round(first["unweighted"], 3)
    assert row["Tail planner, (γ, s) from train"] == round(first["train_chosen"], 3)
    assert (t["Tail planner, best (γ, s) in hindsight"] > 0.9).all()
    assert t["Profile measured on"].str.startswith("AMD EPYC").all()
    assert t[t["Rule"].str.contains("true")]["Tail planner, best (γ, s) in hindsight"].max() < 1.05


def test_a_simulated_batch_trace_is_split_and_labelled_simulated(tmp_path, capsys):
    """``batch_tails.py --measured`` on a batch trace the repository does not hold (the simulator's, K = 0, 2, 4 at
    batch 1 and 4): batch 1 has no tail, batch 4 has one, and the output says SIMULATED."""
    from speclimits.cli import main

    out = tmp_path / "sim"
    assert main(["simulate", "--preset", "smoke", "--set", "k_values=[0,2,4]", "--batch", "1,4", "--out", str(out),
                 "--quiet"]) == 0
    mod = benchmark_module("batch_tails")
    m = mod.measured_tails(out)
    assert m.attrs["simulated"] and sorted(set(m["K"])) == [0, 2, 4]
    assert (m[m["b"] == 1]["tail_share"] == 0).all() and (m[m["b"] == 4]["tail_share"] > 0).all()
    assert mod.main(["--measured", str(out), "--json", str(tmp_path / "t.json")]) == 0
    assert "SIMULATED" in capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_text())["measured"]["simulated"] is True
