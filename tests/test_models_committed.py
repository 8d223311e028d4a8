"""The committed models under data/models load and behave: tokenizer, target, EAGLE-3 head, dense draft."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from speclimits.paths import MODELS_DIR, REPO_ROOT

MODELS = MODELS_DIR
pytestmark = pytest.mark.skipif(not (MODELS / "eagle3" / "model.safetensors").exists(),
                                reason="data/models not built (scripts/make_models.sh)")


@pytest.fixture(scope="module")
def target():
    from speclimits.models.target import load_target

    torch.set_num_threads(1)
    return load_target(MODELS / "target")


@pytest.fixture(scope="module")
def tokenizer():
    from speclimits.models.tokenizer import load_tokenizer

    return load_tokenizer(MODELS / "target")


def test_tokenizer_round_trips_mixed_scripts(tokenizer):
    text = "int fd = open(path, O_RDONLY); /* открывает файл */\n    return x  # done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == json.loads((MODELS / "target" / "config.json").read_text())["vocab_size"]


def test_target_is_a_qwen3_moe_with_finite_logits_and_learned_something(target, tokenizer):
    conf = target.config
    assert conf.architectures == ["Qwen3MoeForCausalLM"]
    assert conf.num_experts >= 32 and conf.num_experts_per_tok >= 4
    text = ("import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n"
            "    for name in argv:\n        if not os.path.exists(name):\n            print(name)\n    return 0\n")
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        logits = target(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    # a trained model is far better than uniform (log 8192 = 9.0 nats) on ordinary Python
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    assert nll < 0.7 * np.log(conf.vocab_size)


def test_eagle3_head_matches_the_target_and_the_recorded_metrics(target, tokenizer):
    from speclimits.models.eagle3 import build_cache, load_head

    head, d2t_ids, aux_ids = load_head(MODELS / "eagle3")
    conf = json.loads((MODELS / "eagle3" / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    assert conf["target_hidden_size"] == target.config.hidden_size
    assert conf["draft_vocab_size"] < conf["vocab_size"] == target.config.vocab_size
    assert all(1 <= k < target.config.num_hidden_layers for k in aux_ids) and len(set(aux_ids)) == len(aux_ids)
    assert d2t_ids.min() >= 0 and d2t_ids.max() < target.config.vocab_size
    assert len(set(d2t_ids.tolist())) == d2t_ids.numel()
    # the head drafts far better than chance on the target's own greedy continuation
    prompt = json.loads((REPO_ROOT / "data" / "prompts" / "speclimits.jsonl").read_text().splitlines()[0])["prompt"]
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)[-40:]])
    with torch.no_grad():
        for _ in range(48):
            nxt = target(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    cache = build_cache(target, ids.numpy(), aux_ids, batch=1)
    with torch.no_grad():
        logits = head.unroll(target.get_input_embeddings()(cache.ids), cache.aux, 1)[0][0]
    pred = d2t_ids[logits.argmax(-1)]
    agree = (pred[38: ids.shape[1] - 2] == ids[0, 40:]).float().mean().item()
    assert agree > 0.3


def test_dense_draft_loads_with_the_same_vocabulary(target):
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(str(MODELS / "dense-draft"), dtype=torch.float32)
    assert dense.config.vocab_size == target.config.vocab_size
    with torch.no_grad():
        logits = dense(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.isfinite(logits).all()


def test_meta_records_how_the_models_were_made():
    meta = json.loads((MODELS / "meta.json").read_text())
    for stage in ("corpus", "tokenizer", "target", "eagle3", "dense", "serve"):
        assert stage in meta["stages"], stage
    assert set(meta["stages"]["target"]["valid_loss_nats"]) == {"code", "en", "ru"}
    acc = meta["stages"]["serve"]["acceptance"]
    assert all(0 <= a <= 1 for a in acc["eagle3_k6"])
    agreement = meta["stages"]["serve"]["agreement"]
    assert abs(agreement["difference"]) < 0.03
