"""Other MoE families on the real vLLM engine (CPU build), traced with n-gram and a draft model, validated and
fitted (issue 41): a Mixtral-style target (top-2 of 8, no shared expert) and a DeepSeek-V2-style one (grouped
routing, a shared expert, a dense first layer, MLA). Config-only folders (``load_format="dummy"``); head sizes the
CPU attention supports (32 for Mixtral; 512 + 64 for MLA's cache)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits.cli import main
from speclimits.costmodel import CostModel
from speclimits.paths import DATA_DIR

pytestmark = pytest.mark.vllm

PROMPTS = DATA_DIR / "prompts" / "smoke.jsonl"
COMMON = {"vocab_size": 512, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 4096,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
          "eos_token_id": 511, "torch_dtype": "float32"}
FAMILIES = {
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "intermediate_size": 32,
                 "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "sliding_window": None,
                 "router_aux_loss_coef": 0.0, "output_router_logits": False}, 2, 8),
    "deepseek_v2": ({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                     "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 3,
                     "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 16,
                     "num_experts_per_tok": 4, "routed_scaling_factor": 1.0, "topk_method": "group_limited_greedy",
                     "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                     "norm_topk_prob": False, "scoring_func": "softmax", "q_lora_rank": None, "kv_lora_rank": 512,
                     "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "rms_norm_eps": 1e-6,
                     "attention_bias": False, "rope_scaling": None, "aux_loss_alpha": 0.0, "seq_aux": False}, 4, 16),
}
METHODS = {"ngram": ["--spec-arg", "prompt_lookup_min=1", "--spec-arg", "prompt_lookup_max=3"],
           "draft_model": []}


@pytest.fixture(scope="module")
def family_traces(vllm_mod, tmp_path_factory):
    """``{(family, method): trace dir}``: K = 0 and 2 on three smoke prompts, 32 tokens each (m = 1..3: the fit
    prices m = 1 and 3)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family, (config, _, _) in FAMILIES.items():
        model = root / family
        model.mkdir()
        (model / "config.json").write_text(json.dumps({**COMMON, **config}))
        for method, extra in METHODS.items():
            trace = root / f"{family}-{method}"
            argv = ["trace", "--target", str(model), "--method", method, "--k", "0,2", "--prompts", str(PROMPTS),
                    "--limit", "3", "--max-tokens", "32", "--out", str(trace), "--load-format", "dummy", "--quiet",
                    *extra]
            if method == "draft_model":
                argv += ["--draft", str(model)]  # its own draft: the same dummy weights
            out[(family, method)] = (trace, main(argv))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", list(METHODS))
def test_family_traces_validate_and_fit(family, method, family_traces, tmp_path, capsys):
    trace, code = family_traces[(family, method)]
    assert code == 0
    _, top_k, n_experts = FAMILIES[family]
    assert main(["validate", str(trace)]) == 0
    rounds = pd.read_parquet(trace / "rounds.parquet")
    dec = rounds[rounds["phase"].astype(str) == "decode"]
    assert np.allclose(dec.loc[dec["m"] == 1, "u_bar"], top_k)  # one token routes to exactly top_k experts
    assert dec["u_bar"].between(top_k, n_experts).all()
    assert (dec.loc[dec["K"] > 0, "n_draft"] > 0).any()  # both drafters proposed something
    # the dtype this CPU's engine can run (an MLA target on an AMX CPU: bfloat16), recorded as what ran
    from speclimits.machine import cpu_info, engine_dtype
    from speclimits.trace import read_meta
    from speclimits.vocabulary import DEFAULT_DTYPE

    meta = read_meta(trace)
    expected = engine_dtype(None, {**COMMON, **FAMILIES[family][0]}, cpu_info()["flags"], DEFAULT_DTYPE)
    assert meta["dtype_choice"] == expected.record() and meta["dtype"] == expected.dtype
    assert meta["cpu"]["flags"] == cpu_info()["flags"] and meta["engine"]["attention"]
    capsys.readouterr()
    assert main(["fit", str(trace), "--n-boot", "19", "--out", str(tmp_path / "cm.json")]) == 0
    out = capsys.readouterr().out
    cm = CostModel.read(tmp_path / "cm.json")
    assert 1 in cm.ms and max(cm.ms) >= 3
    assert "wrote cost model" in out
