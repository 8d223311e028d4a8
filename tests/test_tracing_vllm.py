"""The tracing harness on the real vLLM engine (CPU build) with a tiny config-only MoE (marked ``vllm``)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits.paths import DATA_DIR
from speclimits.trace import read_trace
from speclimits.trace import find_problems, validate_trace

pytestmark = pytest.mark.vllm

PROMPTS = DATA_DIR / "prompts" / "smoke.jsonl"


def _cfg(tiny, out, **kw):
    from speclimits.tracing.sweep import SweepConfig

    base = dict(target=str(tiny), draft=str(tiny), method="draft_model", prompts=str(PROMPTS), out=str(out),
                k_values=[0, 3], max_tokens=20, load_format="dummy", tokens="all", progress=False, limit=3)
    base.update(kw)
    return SweepConfig(**base)


@pytest.fixture(scope="module")
def selfdraft(tiny_moe, tmp_path_factory):
    """K = 0 and K = 3 with the target as its own draft, plus the Oracle pass (K_max = 3)."""
    from speclimits.tracing.oracle_mode import trace_oracle
    from speclimits.tracing.sweep import run_sweep

    out = tmp_path_factory.mktemp("selfdraft") / "trace"
    cfg = _cfg(tiny_moe, out)
    run_sweep(cfg)
    trace_oracle(cfg, k_max=3, batch=16)
    return out


@pytest.fixture(scope="module")
def ngram(tiny_moe, tmp_path_factory):
    from speclimits.tracing.sweep import run_sweep

    out = tmp_path_factory.mktemp("ngram") / "trace"
    # two K: the second engine is built after numba/llvmlite were imported (see engine._guard_llvmlite)
    # counters checked after every generation here (the selfdraft sweep checks them per part)
    run_sweep(_cfg(tiny_moe, out, method="ngram", draft=None, k_values=[2, 3], max_tokens=40, limit=2,
                   check_counters="generation"))
    return out


def test_selfdraft_trace_is_valid_and_accepts_every_draft(selfdraft):
    validate_trace(selfdraft)
    tr = read_trace(selfdraft)
    meta = tr.meta
    assert meta["source"] == "vllm" and meta["simulated"] is False and meta["complete"] is True
    assert {k: meta["models"]["target"][k] for k in ("n_layers", "n_experts", "top_k")} == \
        {"n_layers": 2, "n_experts": 16, "top_k": 4}
    assert meta["engine"]["version"] == "0.32.0" and meta["method"] == "draft_model"
    # the machine in the record: CPU model, caches and kernel flags, as this machine reads them, and the
    # attention path the engine ran (vLLM's CPU attention, float32: the vec path on either CPU)
    from speclimits.machine import cache_kib, cpu_info

    assert meta["cpu"]["model"] == cpu_info()["model"] and meta["cpu"]["cache_kib"] == cache_kib()
    assert meta["cpu"]["flags"] == cpu_info()["flags"] and meta["dtype"] == "float32"
    assert meta["engine"]["attention"] == ["CPU_ATTN (isa vec)"]
    r = tr.rounds
    dec = r[(r["phase"] == "decode") & (r["K"] == 3)]
    assert len(dec) > 0
    # the target drafting for itself: every draft accepted, every round verifies K
    assert (dec["n_draft"] == 3).all() and (dec["n_accepted"] == 3).all() and (dec["m"] == 4).all()
    assert (dec["t_target_ms"] > 0).all() and (dec["t_draft_ms"] > 0).all()
    k0 = r[(r["phase"] == "decode") & (r["K"] == 0)]
    assert (k0["m"] == 1).all() and (k0["n_draft"] == 0).all() and (k0["t_draft_ms"] == 0).all()
    assert (k0["u_bar"] == 4).all()  # one row routes to exactly top_k experts per layer
    assert (r.loc[r["phase"] == "decode", "graph_bucket"] >= r.loc[r["phase"] == "decode", "m"]).all()
    # context grows by exactly what the previous round emitted
    for _, g in r.groupby("generation_id"):
        g = g.sort_values("round")
        np.testing.assert_array_equal(np.diff(g["context_len"].to_numpy())[1:], g["n_emitted"].to_numpy()[1:-1])


def test_counters_and_lengths_match_vllm(selfdraft, ngram):
    from speclimits.trace import read_generations, read_parts_log

    for root in (selfdraft, ngram):
        tr = read_trace(root)
        checks = tr.meta["checks"]
        assert checks["counters_match"] and checks["emitted_match"] and not checks["token_mismatch_generations"]
        assert not checks["counters_mismatch_parts"] and not checks["counters_unchecked_generations"]
        gens = read_generations(root)
        r = tr.rounds
        n_tokens = 20 if root == selfdraft else 40
        for gid, g in r.groupby("generation_id"):
            entry = gens[int(gid)]
            # emitted counts of a generation sum to its output length
            assert int(g["n_emitted"].sum()) == len(entry["output_token_ids"]) == n_tokens
            if root == ngram:  # check_counters="generation": vLLM's counter deltas of this generation alone
                assert int(g["n_draft"].sum()) == entry["vllm"]["drafted"]
                assert int(g["n_accepted"].sum()) == entry["vllm"]["accepted"]
            else:
                assert "vllm" not in entry
        # drafted / accepted totals of each part equal vLLM's own spec-decode counters over the same generations
        parts = read_parts_log(root)
        assert sorted(p.name[:-len(".parquet")] for p in (root / "rounds.parquet").glob("part-*")) == sorted(parts)
        for name, part in parts.items():
            rows = r[r["generation_id"].isin(part["generation_ids"])]
            assert set(rows["K"]) == {part["K"]}
            assert int(rows["n_draft"].sum()) == part["vllm"]["drafted"]
            assert int(rows["n_accepted"].sum()) == part["vllm"]["accepted"]
        for K, s in checks["by_K"].items():
            rows = r[r["K"] == int(K)]
            assert (int(rows["n_draft"].sum()), int(rows["n_accepted"].sum())) == (s["vllm_drafted"],
                                                                                  s["vllm_accepted"])
    assert read_trace(selfdraft).meta["checks"]["by_K"]["3"]["vllm_drafted"] > 0
    assert read_trace(ngram).meta["checks"]["by_K"]["3"]["vllm_drafted"] > 0
    # ngram accepts some; it proposes nothing when it finds no match: such rounds verify 1 + n_draft rows
    r = read_trace(ngram).rounds
    dec = r[r["phase"] == "decode"]
    assert dec.loc[dec["prompt_id"] == "rep", "n_accepted"].sum() > 0 and (dec["n_draft"] <= dec["K"]).all()
    assert set(r["K"]) == {2, 3} and (dec["m"] == dec["n_draft"] + 1).all()
    assert (dec["n_draft"] < dec["K"]).any() and find_problems(ngram) == []  # and the contract accepts them


def test_u_bar_recomputed_from_token_experts(selfdraft):
    tr = read_trace(selfdraft)
    r, t = tr.rounds, tr.tokens
    top_k, n_layers = 4, 2
    full = r[(r["phase"] == "decode") & (r["n_emitted"] == r["m"])]
    assert len(full) > 10
    reading = t.set_index(["generation_id", "pos"])["experts"]
    for _, row in full.iterrows():
        # the round's rows read the token before its first one and all but its last (reading rows)
        toks = t[(t["generation_id"] == row["generation_id"]) & (t["round"] == row["round"])]
        ex = np.stack([reading.loc[(row["generation_id"], p - 1)] for p in toks["pos"]]).reshape(len(toks), n_layers,
                                                                                                top_k)
        per_layer = [len(set(ex[:, layer].ravel().tolist())) for layer in range(n_layers)]
        assert row["u_bar"] == pytest.approx(np.mean(per_layer))
        assert row["e_max"] == max(per_layer)
    # tokens agree with vLLM's output and do not depend on K (greedy)
    by_k = {k: g.sort_values(["seq_id", "pos"])["token_id"].to_numpy() for k, g in t.groupby("K")}
    np.testing.assert_array_equal(by_k[0], by_k[3])


def test_oracle_on_selfdraft(selfdraft):
    tr = read_trace(selfdraft)
    o, t = tr.oracle, tr.tokens
    assert tr.meta["oracle"]["k_max"] == 3 and tr.meta["oracle"]["forced_flips"] == 0
    assert set(o["reference_kind"]) == {"greedy"}  # the harness records what it walked
    n_states = 19  # 20 tokens, y_1 from the prefill
    assert len(o) == 3 * n_states
    left = n_states - o["pos"].to_numpy()
    # the self-draft's chain is the reference: full matches wherever three tokens remain
    np.testing.assert_array_equal(o["accept_len"].to_numpy(), np.minimum(3, left))
    np.testing.assert_array_equal(o.loc[left >= 3, "accept_len_engine"], 3)
    ubw = np.stack(o["u_bar_window"])
    assert (ubw[:, 0] == 4).all() and (np.diff(ubw, axis=1) >= 0).all()
    # match_prob (teacher-forced) equals the chain's own probability while the chain matches
    mp, mpc = np.stack(o["match_prob"]), np.stack(o["match_prob_chain"])
    ok = left >= 3
    np.testing.assert_allclose(mp[ok], mpc[ok], rtol=1e-5)
    # window routing equals the sweep's routing of the same tokens: window [y_{p+1}, d_1..d_k] reads
    # tokens pos p..p+k of the K=0 generation (reading rows; the last token has none)
    t0 = t[t["K"] == 0]
    for seq, g in o.groupby("seq_id"):
        ex = t0[t0["seq_id"] == seq].sort_values("pos")["experts"].to_list()
        assert ex[-1] is None
        ex = np.stack(ex[:-1]).reshape(-1, 2, 4)
        for _, row in g.iterrows():
            p = int(row["pos"])
            for k in range(4):
                if p + k < len(ex):
                    win = ex[p: p + 1 + k]
                    u = np.mean([len(set(win[:, layer].ravel().tolist())) for layer in range(2)])
                    assert row["u_bar_window"][k] == pytest.approx(u), (seq, p, k)


def test_harness_writes_the_documented_tokens_layout(tiny_moe, selfdraft, tmp_path):
    """``speclimits trace --oracle`` on a greedy and a teacher-forced prompt writes tokens.parquet in the
    layout the book documents, checked by the same rules as the bundled trace (tests/tokens_layout.py)."""
    from tokens_layout import layout_failures

    from speclimits.cli import main
    from speclimits.trace import read_generations
    from speclimits.tracing.oracle_mode import write_reference_tokens

    # a held-out reference for rand0: the target's own greedy output with row 8 changed, so that the
    # Oracle walks text the target agrees with up to row 7 and is forced from row 8 on
    ref = next(g["output_token_ids"] for g in read_generations(selfdraft).values()
               if g["prompt_id"] == "rand0" and g["K"] == 0)
    ref = [int(t) for t in ref]
    ref[8] = (ref[8] + 1) % 512
    lines = [json.loads(x) for x in PROMPTS.read_text().splitlines() if x.strip() and not x.startswith("#")][:3]
    for obj in lines:
        if obj["id"] == "rand0":
            obj["reference_token_ids"] = ref
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "trace"
    rc = main(["trace", "--target", str(tiny_moe), "--draft", str(tiny_moe), "--method", "draft_model", "--k", "2",
               "--prompts", str(prompts), "--max-tokens", "20", "--load-format", "dummy", "--out", str(out),
               "--quiet", "--oracle"])
    assert rc == 0 and main(["validate", str(out)]) == 0
    tr = read_trace(out)
    o, t = tr.oracle, tr.tokens
    assert sorted(set(o["reference_kind"])) == ["greedy", "teacher-forced"]
    assert layout_failures(o, t, {"rand0": ref}, min_states=5) == []
    # the target's choice on the held-out text: its own until row 7, overridden at row 8
    forced = o[o["seq_id"] == "rand0"].set_index("pos")["forced"]
    assert not forced.loc[:7].any() and forced.loc[8]
    rows = t[t["seq_id"] == "rand0"].set_index("pos")
    assert rows.loc[:7, "target_agrees"].all() and not rows.loc[8, "target_agrees"]
    assert rows.loc[0, "target_token_id"] == ref[0]
    # the rewrite is idempotent: running it again leaves the same table
    write_reference_tokens(out, {"rand0": ref}, 2, None)
    again = read_trace(out).tokens
    pd.testing.assert_frame_equal(again.drop(columns=["experts", "text"]), t.drop(columns=["experts", "text"]))
    assert [None if e is None else e.tolist() for e in again["experts"]] == \
        [None if e is None else e.tolist() for e in t["experts"]]


def test_killed_sweep_resumes_without_duplicates(tiny_moe, tmp_path, monkeypatch, vllm_mod):
    from speclimits.errors import SpeclimitsError
    from speclimits.trace import done_generations
    from speclimits.tracing import sweep

    out = tmp_path / "trace"
    # parts of two generations: K=0 writes gids 0-1; K=2 buffers gid 2, then dies inside gid 3's generate
    cfg = _cfg(tiny_moe, out, k_values=[0, 2], limit=2, max_tokens=12, tokens="ref", flush_every=2, flush_seconds=60)
    real = vllm_mod.LLM.generate
    calls = {"n": 0}

    def dying(self, prompts, params=None, *args, **kwargs):
        if params is not None and params.max_tokens == 12:  # not the warm-up
            if calls["n"] == 3:
                raise KeyboardInterrupt  # killed while generating the 4th of 4
            calls["n"] += 1
        return real(self, prompts, params, *args, **kwargs)

    monkeypatch.setattr(vllm_mod.LLM, "generate", dying)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(cfg)
    monkeypatch.setattr(vllm_mod.LLM, "generate", real)
    validate_trace(out)  # a killed sweep is a valid partial trace
    partial = read_trace(out).rounds
    # gid 2 was finished but buffered with the interrupted one: dropped, since vLLM's counters then
    # include the interrupted generation's drafts; a resume runs it again
    assert sorted(partial["generation_id"].unique()) == [0, 1]
    assert done_generations(out) == {0, 1}
    assert json.loads((out / "meta.json").read_text())["complete"] is False
    with pytest.raises(SpeclimitsError, match="--resume"):
        sweep.run_sweep(cfg)
    cfg.resume = True
    cfg_other = _cfg(tiny_moe, out, k_values=[0, 2], limit=2, max_tokens=13, resume=True, tokens="ref")
    with pytest.raises(SpeclimitsError, match="max_tokens"):
        sweep.run_sweep(cfg_other)
    meta = sweep.run_sweep(cfg)
    assert meta["complete"] is True and meta["checks"]["counters_match"]
    assert not meta["checks"]["counters_mismatch_parts"]
    validate_trace(out)
    done = read_trace(out).rounds
    assert sorted(done["generation_id"].unique()) == [0, 1, 2, 3]
    assert not done.duplicated(["generation_id", "round"]).any()
    keep = ["generation_id", "round", "m", "n_draft", "n_accepted", "n_emitted", "context_len"]
    before = partial[keep].sort_values(["generation_id", "round"]).reset_index(drop=True)
    after = done.loc[done["generation_id"] < 2, keep].sort_values(["generation_id", "round"]).reset_index(drop=True)
    assert before.equals(after)
    # tokens kept for the reference K (the smallest, 0) only
    assert set(read_trace(out).tokens["K"]) == {0}


def test_eagle3_sweep_through_the_cli(tiny_moe, tmp_path, capsys):
    """A config-only EAGLE-3 head (dummy weights) on the tiny target, K=2, via ``speclimits trace``."""
    from speclimits.cli import main
    from speclimits.tracing.tinymodel import eagle3_aux_layers, write_tiny_eagle3

    head = write_tiny_eagle3(tmp_path / "eagle3", target=tiny_moe)
    conf = json.loads((head / "config.json").read_text())
    assert conf["eagle_aux_hidden_state_layer_ids"] == eagle3_aux_layers(2) == [0, 1, 2]
    assert conf["draft_vocab_size"] == 256 and conf["target_hidden_size"] == 64
    out = tmp_path / "trace"
    rc = main(["trace", "--target", str(tiny_moe), "--draft", str(head), "--method", "eagle3", "--k", "2",
               "--prompts", str(PROMPTS), "--limit", "2", "--max-tokens", "24", "--load-format", "dummy",
               "--out", str(out), "--quiet", "--flush-every", "1", "--oracle"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "counters match vLLM: True" in printed and "forced flips 0" in printed
    assert main(["validate", str(out)]) == 0
    tr = read_trace(out)
    assert tr.meta["method"] == "eagle3" and tr.meta["models"]["draft"]["architecture"] == "LlamaForCausalLMEagle3"
    assert tr.meta["complete"] and tr.meta["checks"]["counters_match"] and tr.meta["checks"]["emitted_match"]
    r = tr.rounds
    dec = r[r["phase"] == "decode"]
    assert len(dec) > 0 and (dec["n_draft"] == 2).all() and (dec["m"] == 3).all() and (dec["t_draft_ms"] > 0).all()
    # drafted / accepted totals equal vLLM's own counters
    s = tr.meta["checks"]["by_K"]["2"]
    assert s["vllm_drafted"] == int(r["n_draft"].sum()) == 2 * len(dec) > 0
    assert s["vllm_accepted"] == int(r["n_accepted"].sum())
    # Ū of every round lies in [top_k, n_experts]
    assert r["u_bar"].between(4, 16).all() and (r["e_max"] >= r["u_bar"]).all()
    # tokens: emitted = vLLM's output, 24 per generation; one part per generation here
    assert (r.groupby("generation_id")["n_emitted"].sum() == 24).all()
    assert len(list((out / "rounds.parquet").glob("part-*.parquet"))) == 2
    # Oracle mode reads the head's logits over its reduced vocabulary (-inf outside it)
    o = tr.oracle
    assert len(o) == 2 * 23 and tr.meta["oracle"]["k_max"] == 2
    conf = np.stack(o["draft_conf"])
    assert ((conf > 0) & (conf <= 1)).all() and (np.stack(o["draft_tokens"]) < 256).all()
    np.testing.assert_array_equal(o["accept_len"], o["accept_len_engine"])
    ubw = np.stack(o["u_bar_window"])
    assert (ubw[:, 0] == 4).all() and (np.diff(ubw, axis=1) >= 0).all() and (ubw <= 16).all()
    # with dummy weights the head's drafts are random: vLLM accepted none, and the trace agrees
    assert s["vllm_accepted"] == 0 and (o["accept_len"] == 0).all()
    # the acceptance study's features: the second probability under the top one, an entropy at least what
    # the top-1 mass forces (H >= -log p_max), the target's top-1 probability
    conf2, ent = np.stack(o["draft_conf2"]), np.stack(o["draft_entropy"])
    assert ((conf2 >= 0) & (conf2 <= conf) & (conf + conf2 <= 1 + 1e-6)).all()
    assert (np.isfinite(ent) & (ent >= -np.log(conf) - 1e-4)).all()
    assert ((o["target_conf"] > 0) & (o["target_conf"] <= 1)).all()


class _FakeLLM:
    """Stands in for ``vllm.LLM`` in the writer test: synthetic step records, cumulative counters."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.counters = {"drafted": 0, "accepted": 0}
        self.records, self.n, self.fail_at = [], 0, None

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace as NS

        self.n += 1
        rid, rng, K = str(self.n), self.rng, 2
        rows = lambda m: rng.integers(0, 8, size=(m, 2, 2)).astype(np.int16)  # noqa: E731
        reqs = [dict(req_id=f"{rid}-abcdefgh", n_sched=5, n_spec=0, context_len=0, n_prompt=5, n_out_before=0,
                     row_offset=0, n_sampled=1, sampled=[1], n_drafted=K, u_layers=np.array([4, 4]),
                     routing=rows(2), routing_from=3)]
        out = [1]
        while len(out) < params.max_tokens:
            n_s = int(rng.integers(1, K + 2))
            sampled = [int(t) for t in rng.integers(2, 500, size=n_s)]
            reqs.append(dict(req_id=f"{rid}-abcdefgh", n_sched=K + 1, n_spec=K, context_len=4 + len(out), n_prompt=5,
                             n_out_before=len(out), row_offset=0, n_sampled=n_s, sampled=sampled, n_drafted=K,
                             routing=rows(K + 1), routing_from=0))
            out += sampled
            self.counters["drafted"] += K
            self.counters["accepted"] += n_s - 1
        if self.n == self.fail_at:
            raise KeyboardInterrupt  # interrupted inside generate, after some drafts were counted
        self.records += [dict(step=i, t_target_ms=1.0, t_draft_ms=0.5, graph_bucket=r["n_sched"],
                              num_tokens=r["n_sched"], kv_usage=0.1, reqs=[r]) for i, r in enumerate(reqs)]
        return [NS(request_id=rid, outputs=[NS(token_ids=out[:params.max_tokens], finish_reason="length")])]

    def collective_rpc(self, name, args=()):
        assert name == "speclimits_drain"
        recs, self.records = self.records, []
        return [recs]

    def get_metrics(self):
        from types import SimpleNamespace as NS

        return [NS(name="vllm:spec_decode_num_draft_tokens", value=self.counters["drafted"]),
                NS(name="vllm:spec_decode_num_accepted_tokens", value=self.counters["accepted"])]


def test_writer_flush_policy_and_interrupted_generations(vllm_mod, tmp_path):
    from speclimits.tracing.prompts import Prompt
    from speclimits.trace import done_generations, read_generations, read_parts_log
    from speclimits.tracing.sweep import GenerationWriter, SweepConfig

    root = tmp_path / "tr"
    root.mkdir()
    cfg = SweepConfig(target="t", prompts="-", out=str(root), max_tokens=10, flush_every=2, flush_seconds=60)
    llm = _FakeLLM()
    prompt = Prompt("p", token_ids=(1, 2, 3, 4, 5))
    w = GenerationWriter(llm, root, cfg, 2, top_k=2)
    for gid in (0, 1, 2):
        w.run_batch([prompt], [[1, 2, 3, 4, 5]], [gid], keep_tokens=gid == 0)
    assert done_generations(root) == {0, 1} and w.pending == 1  # flushed after two
    w.close()  # an exception between generations: what is buffered is complete, so it is written
    assert done_generations(root) == {0, 1, 2}
    w = GenerationWriter(llm, root, cfg, 2, top_k=2)
    w.run_batch([prompt], [[1, 2, 3, 4, 5]], [3], keep_tokens=False)
    llm.fail_at = llm.n + 1
    with pytest.raises(KeyboardInterrupt):
        w.run_batch([prompt], [[1, 2, 3, 4, 5]], [4], keep_tokens=False)
    w.close()  # the interrupted generation's drafts are in vLLM's counters: gid 3 is dropped, not mis-checked
    assert done_generations(root) == {0, 1, 2} and not (root / "rounds.parquet" / "part-g000003.parquet").exists()
    parts = read_parts_log(root)
    assert sorted(parts) == ["part-g000000", "part-g000002"]
    assert all(p["trace"] == p["vllm"] and p["vllm"]["drafted"] > 0 for p in parts.values())
    # per-generation checks, and a time-based flush after every generation (flush_seconds=0)
    cfg.check_counters, cfg.flush_every, cfg.flush_seconds = "generation", 100, 0.0
    w = GenerationWriter(llm, root, cfg, 2, top_k=2)
    for gid in (5, 6):
        w.run_batch([prompt], [[1, 2, 3, 4, 5]], [gid], keep_tokens=False)
        assert w.pending == 0
    gens = read_generations(root)
    assert all(gens[g]["vllm"] == {k: gens[g]["trace"][k] for k in ("drafted", "accepted")} for g in (5, 6))
    assert "vllm" not in gens[0] and done_generations(root) == {0, 1, 2, 5, 6}
