"""The memory-bound twin keeps the target's function: unit checks on one expert, a tiny checkpoint
through Hugging Face, and (marked vllm) greedy outputs and routing in the real engine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from speclimits.errors import SpeclimitsError
from speclimits.models.twin import build_twin, compare_logits, read_recipe, widen_tensors


def _expert(gate, up, down, x):
    return down @ (torch.nn.functional.silu(gate @ x) * (up @ x))


def test_a_widened_expert_computes_the_same_output():
    g = torch.Generator().manual_seed(1)
    hidden, inter = 16, 8
    tensors = {
        "model.layers.0.mlp.experts.0.gate_proj.weight": torch.randn(inter, hidden, generator=g, dtype=torch.float64),
        "model.layers.0.mlp.experts.0.up_proj.weight": torch.randn(inter, hidden, generator=g, dtype=torch.float64),
        "model.layers.0.mlp.experts.0.down_proj.weight": torch.randn(hidden, inter, generator=g, dtype=torch.float64),
        "model.norm.weight": torch.ones(hidden, dtype=torch.float64),
    }
    wide, old = widen_tensors(tensors, 40, seed=3)
    assert old == inter
    p = "model.layers.0.mlp.experts.0."
    assert wide[p + "gate_proj.weight"].shape == (40, hidden) and wide[p + "down_proj.weight"].shape == (hidden, 40)
    assert torch.equal(wide[p + "gate_proj.weight"][:inter], tensors[p + "gate_proj.weight"])
    assert torch.count_nonzero(wide[p + "up_proj.weight"][inter:]) > 0  # the extra units do compute something ...
    assert torch.count_nonzero(wide[p + "down_proj.weight"][:, inter:]) == 0  # ... that never reaches the output
    assert wide["model.norm.weight"] is tensors["model.norm.weight"]
    x = torch.randn(hidden, generator=g, dtype=torch.float64)
    narrow_y = _expert(tensors[p + "gate_proj.weight"], tensors[p + "up_proj.weight"], tensors[p + "down_proj.weight"], x)
    wide_y = _expert(wide[p + "gate_proj.weight"], wide[p + "up_proj.weight"], wide[p + "down_proj.weight"], x)
    assert torch.allclose(narrow_y, wide_y, rtol=0, atol=1e-12)
    with pytest.raises(SpeclimitsError, match="narrower"):
        widen_tensors(tensors, 4)
    with pytest.raises(SpeclimitsError, match="no expert weights"):
        widen_tensors({"model.norm.weight": tensors["model.norm.weight"]}, 40)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny Qwen3-MoE with random weights saved by transformers (per-expert safetensors names)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from speclimits.tracing.tinymodel import tiny_moe_config

    folder = tmp_path_factory.mktemp("tiny-ckpt")
    cfg = tiny_moe_config()
    (folder / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=torch.float32)
    model.save_pretrained(str(folder))
    return folder


def test_the_twin_of_a_checkpoint_has_the_same_logits_and_a_recipe(tiny_checkpoint, tmp_path):
    twin = tmp_path / "twin"
    recipe = build_twin(tiny_checkpoint, twin, expert_width=96, seed=0)
    cfg = json.loads((twin / "config.json").read_text())
    assert cfg["moe_intermediate_size"] == 96 and recipe["expert_width_source"] == 32
    assert read_recipe(twin) == recipe and read_recipe(tiny_checkpoint) is None
    # deterministic: the same command writes the same weights
    again = build_twin(tiny_checkpoint, tmp_path / "again", expert_width=96, seed=0)
    assert again["weights_sha256"] == recipe["weights_sha256"]
    assert build_twin(tiny_checkpoint, tmp_path / "other", expert_width=96, seed=1)["weights_sha256"] != \
        recipe["weights_sha256"]
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 512, size=40).tolist() for _ in range(3)]
    check = compare_logits(tiny_checkpoint, twin, seqs)
    assert check["positions"] == 120
    assert check["argmax_agree"] == 1.0
    assert check["max_rel_diff"] < 1e-5


def test_twin_command_refuses_a_folder_without_a_config(tmp_path):
    from speclimits.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["models", "twin", "--source", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2


@pytest.mark.vllm
def test_the_twin_serves_the_same_greedy_tokens_and_routing_in_vllm(vllm_mod, tiny_checkpoint, tmp_path):
    """Traced in the real engine (K = 0 and ngram K = 2): the twin emits the source's tokens and
    touches the same experts in every round."""
    import pandas as pd

    from speclimits.cli import main

    twin = tmp_path / "twin"
    build_twin(tiny_checkpoint, twin, expert_width=128, seed=0)
    prompts = tmp_path / "prompts.jsonl"
    rng = np.random.default_rng(1)
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt_token_ids": rng.integers(1, 512, 24).tolist()})
                               + "\n" for i in range(2)))
    out = {}
    for name, folder in (("source", tiny_checkpoint), ("twin", twin)):
        assert main(["trace", "--target", str(folder), "--method", "ngram", "--k", "0,2", "--prompts", str(prompts),
                     "--max-tokens", "16", "--ignore-eos", "--dtype", "float32", "--out", str(tmp_path / f"trace-{name}"),
                     "--quiet", "--spec-arg", "prompt_lookup_min=1", "--spec-arg", "prompt_lookup_max=2"]) == 0
        gens = [json.loads(line) for line in (tmp_path / f"trace-{name}" / "generations.jsonl").read_text().splitlines()]
        rounds = pd.read_parquet(tmp_path / f"trace-{name}" / "rounds.parquet")
        out[name] = ({(g["prompt_id"], g["K"]): g["output_token_ids"] for g in gens},
                     rounds.sort_values(["generation_id", "round"])["u_bar"].to_numpy())
    assert out["source"][0] == out["twin"][0]
    assert np.array_equal(out["source"][1], out["twin"][1])
    meta = json.loads((tmp_path / "trace-twin" / "meta.json").read_text())
    assert meta["dtype"] == "float32"


@pytest.mark.vllm
def test_planted_routing_sets_the_unique_experts_of_every_pass(vllm_mod, tiny_moe, tmp_path):
    """The designed experiment in the real engine: every decode pass routes to exactly the planted number
    of unique experts in every layer (u_bar = e_max, an integer in range), and it varies pass by pass."""
    import pandas as pd

    from speclimits.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt_token_ids": list(range(1, 25))}) + "\n")
    out = tmp_path / "planted"
    assert main(["trace", "--target", str(tiny_moe), "--draft", str(tiny_moe), "--method", "draft_model",
                 "--k", "0,3", "--prompts", str(prompts), "--max-tokens", "24", "--ignore-eos", "--load-format",
                 "dummy", "--dtype", "float32", "--tokens", "none", "--plant-routing", "0", "--out", str(out),
                 "--quiet"]) == 0
    rounds = pd.read_parquet(out / "rounds.parquet")
    d = rounds[rounds["phase"] == "decode"]
    assert set(d["m"]) == {1, 4}
    assert (d["u_bar"] == d["e_max"]).all() and (d["u_bar"] == d["u_bar"].round()).all()
    assert (d.loc[d["m"] == 1, "u_bar"] == 4).all()
    big = d.loc[d["m"] == 4, "u_bar"]
    assert big.between(4, 16).all() and big.nunique() >= 4
    assert json.loads((out / "meta.json").read_text())["planted_routing"]["seed"] == 0


@pytest.mark.parametrize("family", ["deepseek_v2", "qwen2_moe"])
def test_the_twin_of_other_families_keeps_the_logits(family, tmp_path):
    """DeepSeek-V2: a dense first layer and a shared expert of n_shared_experts × moe_intermediate_size (widened with
    the routed experts); Qwen2-MoE: a shared expert of its own width (left as it is)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    common = {"vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
              "max_position_embeddings": 512, "tie_word_embeddings": False, "hidden_act": "silu",
              "torch_dtype": "float32", "rms_norm_eps": 1e-6, "num_hidden_layers": 3}
    configs = {
        "deepseek_v2": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                        "intermediate_size": 128, "moe_intermediate_size": 32, "n_shared_experts": 2,
                        "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                        "topk_method": "greedy", "n_group": 1, "topk_group": 1, "q_lora_rank": None,
                        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
                        "routed_scaling_factor": 1.0, "norm_topk_prob": False, "scoring_func": "softmax"},
        "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "intermediate_size": 128,
                      "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 8,
                      "num_experts_per_tok": 2, "decoder_sparse_step": 1, "norm_topk_prob": False},
    }
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**common, **configs[family]}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(src)), dtype=torch.float32).save_pretrained(str(src))
    recipe = build_twin(src, tmp_path / "twin", expert_width=80, seed=0)
    assert recipe["expert_width_source"] == 32 and recipe["expert_bytes_stored"] == 3 * 80 * 64 * 4
    from safetensors import safe_open

    with safe_open(str(tmp_path / "twin" / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    if family == "deepseek_v2":
        assert shapes["model.layers.1.mlp.shared_experts.up_proj.weight"] == (2 * 80, 64)
        assert shapes["model.layers.0.mlp.up_proj.weight"] == (128, 64)  # the dense layer is left alone
    else:
        assert shapes["model.layers.1.mlp.shared_expert.up_proj.weight"] == (48, 64)
    rng = np.random.default_rng(0)
    check = compare_logits(src, tmp_path / "twin", [rng.integers(1, 256, size=24).tolist() for _ in range(2)])
    assert check["argmax_agree"] == 1.0 and check["max_rel_diff"] < 1e-5
