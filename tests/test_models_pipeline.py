"""Fast tests of the model pipeline pieces: corpus builder, EAGLE-3 unrolling, checkpoint layout, balance loss."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from speclimits.models.corpus import CorpusConfig, build_corpus, clean_rendered, cyrillic_share, read_corpus
from speclimits.models.eagle3 import Eagle3Head, HeadConfig, draft_vocab_from_counts, save_head, soft_labels
from speclimits.models.target import load_summary, routing_balance

MAN_EN = """.TH FROB 1
.SH NAME
frob \\- frobnicate files
.SH DESCRIPTION
The frob utility reads every file named on the command line and frobnicates it in place.
It writes a short report to standard output and exits with status zero when all went well.
"""
MAN_RU = """.TH FROB 2
.SH ИМЯ
frob \\- обрабатывает файлы
.SH ОПИСАНИЕ
Вызов frob() читает каждый файл и обрабатывает его на месте. Возвращает 0 при успехе.
При ошибке возвращается \\-1, а errno устанавливается в EINVAL.
"""


def _tree(tmp: Path) -> CorpusConfig:
    std = tmp / "stdlib"
    (std / "pkg").mkdir(parents=True)
    (std / "test").mkdir()
    for i in range(6):
        (std / "pkg" / f"mod{i}.py").write_text(f"def f{i}(x):\n    '''Return x plus {i}.'''\n" + "    return x\n" * 40)
    (std / "test" / "test_skip.py").write_text("assert True\n" * 100)
    lic = tmp / "licenses"
    lic.mkdir()
    for name in ("MIT", "BSD", "Apache", "Artistic", "GPL", "LGPL"):
        (lic / name).write_text(f"{name}: permission is hereby granted, free of charge, to any person. " * 10)
    doc = tmp / "doc" / "frob"
    doc.mkdir(parents=True)
    (doc / "README").write_text("Frob is a small tool that frobnicates files in place. " * 10)
    (doc / "copyright").write_text("Frob is a small tool that frobnicates files in place. " * 10)  # duplicate
    man = tmp / "man" / "man1"
    man.mkdir(parents=True)
    (man / "frob.1.gz").write_bytes(gzip.compress(MAN_EN.encode()))
    (man / "alias.1.gz").write_bytes(gzip.compress(b".so man1/frob.1\n"))
    ru = tmp / "ru" / "man2"
    ru.mkdir(parents=True)
    for i in range(6):
        (ru / f"frob{i}.2.gz").write_bytes(gzip.compress(MAN_RU.replace("frob", f"frob{i}").encode()))
    return CorpusConfig(stdlib_dir=std, doc_dir=tmp / "doc", licenses_dir=lic, man_dir=tmp / "man",
                        ru_root=tmp / "ru", heldout_share=0.5, workers=1)


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_corpus_builder_on_a_tiny_tree(tmp_path):
    cfg = _tree(tmp_path)
    meta = build_corpus(tmp_path / "out", tmp_path / "scratch", cfg, log=lambda m: None, progress=False)
    docs = read_corpus(tmp_path / "out", "train") + read_corpus(tmp_path / "out", "valid")
    sources = {d.source for d in docs}
    assert not any("test_skip" in s for s in sources)  # tests excluded
    assert not any("alias" in s for s in sources)  # .so links skipped
    assert sum(s.startswith("doc/") for s in sources) == 1  # duplicate README/copyright deduplicated
    ru = [d for d in docs if d.domain == "ru"]
    assert len(ru) == 6 and all("обрабатывает" in d.text and "EINVAL" in d.text for d in ru)
    assert all("  " not in d.text for d in ru)  # justification spaces squeezed
    en_man = [d for d in docs if d.source.startswith("man/")]
    assert len(en_man) == 1 and "frobnicates" in en_man[0].text
    total = sum(meta["splits"][s][dom]["documents"] for s in ("train", "valid") for dom in ("code", "en", "ru"))
    assert total == len(docs)
    assert meta["splits"]["train"]["ru"]["cyrillic_letter_share"] > 0.5
    assert meta["splits"]["train"]["code"]["cyrillic_letter_share"] == 0
    # the split depends on the source path only: a second build gives the same split
    build_corpus(tmp_path / "out2", tmp_path / "scratch", cfg, log=lambda m: None, progress=False)
    assert [d.source for d in read_corpus(tmp_path / "out2", "valid")] == \
        [d.source for d in read_corpus(tmp_path / "out", "valid")]


def test_cyrillic_share_and_cleaning():
    assert cyrillic_share("abcд") == pytest.approx(0.25)
    assert cyrillic_share("123 !!") == 0.0
    assert clean_rendered("   a    b\n\n\n\n   c  ") == "a b\n\nc\n"


def _reference_unroll(head: Eagle3Head, emb: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Step-by-step draft decoding as vLLM runs it: a KV cache of step-1 keys for the context, one new key per step."""
    from speclimits.models.eagle3 import rope

    attn = head.midlayer.self_attn
    s = aux.shape[1]
    fc = head.fc(aux[0])
    outs = [torch.zeros(s - j, head.cfg.draft_vocab) for j in range(1, steps + 1)]

    def kv_and_q(e, h, pos):
        x, residual = head._layer_in(e[None, None], h[None, None])
        q = attn.q_proj(x).view(1, 1, attn.heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, 1, attn.kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, 1, attn.kv_heads, attn.head_dim).transpose(1, 2)
        rep = attn.heads // attn.kv_heads
        p = torch.tensor([pos])
        return rope(q, p), rope(k.repeat_interleave(rep, 1), p), v.repeat_interleave(rep, 1), residual

    ctx = [kv_and_q(emb[0, q + 1], fc[q], q) for q in range(s - 1)]  # step-1 entries at every origin
    for p in range(s - 1):
        keys = [c[1] for c in ctx[: p + 1]]
        vals = [c[2] for c in ctx[: p + 1]]
        h = fc[p]
        for j in range(1, steps + 1):
            if p + j > s - 1:
                break
            q, k, v, residual = ctx[p] if j == 1 else kv_and_q(emb[0, p + j], h, p + j - 1)
            if j > 1:
                keys, vals = keys + [k], vals + [v]
            kk, vv = torch.cat(keys, 2), torch.cat(vals, 2)
            w = ((q @ kk.transpose(-1, -2)) / attn.head_dim ** 0.5).softmax(-1)
            o = (w @ vv).transpose(1, 2).reshape(1, 1, -1)
            logits, prenorm = head._layer_out(attn.o_proj(o), residual)
            outs[j - 1][p] = logits[0, 0]
            h = prenorm[0, 0]
    return outs


def test_eagle3_unroll_matches_step_by_step_decoding():
    torch.manual_seed(0)
    cfg = HeadConfig(draft_vocab=11, intermediate=24, heads=2, kv_heads=1, head_dim=8)
    head = Eagle3Head(16, 3, cfg)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    emb, aux = torch.randn(1, 9, 16), torch.randn(1, 9, 48)
    with torch.no_grad():
        fast = head.unroll(emb, aux, 3)
        slow = _reference_unroll(head, emb, aux, 3)
    for j, (a, b) in enumerate(zip(fast, slow), 1):
        assert a.shape[1] == 9 - j
        torch.testing.assert_close(a[0], b, atol=1e-4, rtol=1e-4)


def test_eagle3_checkpoint_layout_is_what_vllm_loads(tmp_path):
    from types import SimpleNamespace

    from safetensors.torch import load_file

    cfg = HeadConfig(draft_vocab=6, intermediate=24, heads=2, kv_heads=1, head_dim=8)
    head = Eagle3Head(16, 3, cfg)
    counts = np.array([5, 0, 9, 1, 7, 7, 3, 0, 2, 8])
    draft_ids = draft_vocab_from_counts(counts, 6)
    assert draft_ids.tolist() == [0, 2, 4, 5, 6, 9]  # top-6 by count: 9, 8, 7, 7, 5, 3 -> ids 2, 9, 4, 5, 0, 6
    tconf = SimpleNamespace(vocab_size=10, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    save_head(head, tmp_path, 16, (2, 4, 5), tconf, draft_ids, cfg)
    state = load_file(str(tmp_path / "model.safetensors"))
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    assert conf["draft_vocab_size"] == 6 and conf["vocab_size"] == 10
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                "midlayer.post_attention_layernorm.weight"} | \
        {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"} | \
        {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(state) == expected
    assert state["fc.weight"].shape == (16, 48)
    assert state["midlayer.self_attn.q_proj.weight"].shape == (16, 32)  # q/k/v take 2H inputs
    assert state["lm_head.weight"].shape == (6, 16)
    # vLLM maps draft id i to target id i + d2t[i]
    assert (torch.arange(6) + state["d2t"]).tolist() == draft_ids.tolist()
    assert state["t2d"].nonzero().flatten().tolist() == draft_ids.tolist()


def test_soft_labels_drop_ids_outside_the_draft_vocab():
    t2d = torch.tensor([0, -1, 1, -1])
    lab = soft_labels(torch.tensor([[2, 1, 0]]), torch.tensor([[0.5, 0.3, 0.2]]), t2d, 2)
    torch.testing.assert_close(lab, torch.tensor([[0.2, 0.5]]))


def test_routing_balance_is_per_layer():
    """A collapsed layer must show up even when the aggregate over layers is uniform."""
    n_tok, n_exp = 64, 4
    even = torch.zeros(n_tok, n_exp)
    even[torch.arange(n_tok), torch.arange(n_tok) % n_exp] = 5.0
    collapsed_a = torch.zeros(n_tok, n_exp)
    collapsed_a[:, 0] = 5.0
    collapsed_b = torch.zeros(n_tok, n_exp)
    collapsed_b[:, 1] = 5.0
    loss_even, load_even = routing_balance((even, even), top_k=1)
    loss_coll, load_coll = routing_balance((collapsed_a, collapsed_b), top_k=1)
    assert loss_coll > 2 * loss_even
    summ = load_summary(load_coll.numpy())
    assert summ["normalized_entropy"] == [0.0, 0.0] and summ["nearly_dead_experts"] == [3, 3]
    assert load_summary(load_even.numpy())["normalized_entropy"] == [1.0, 1.0]
