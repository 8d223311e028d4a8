"""A tiny Qwen3-MoE model folder holding only ``config.json``, for tests and smoke runs.

vLLM loads such a folder with ``load_format="dummy"`` (random weights, deterministic for a
given seed) and ``skip_tokenizer_init=True`` (prompts are token ids, outputs are not
detokenized). The routing is random but real: every MoE layer picks ``top_k`` of
``n_experts`` experts per token through vLLM's own router, so the tracing harness is
exercised end to end. The target folder used as its own draft (``draft_model``) accepts
every draft, because both copies get the same dummy weights.

>>> from speclimits.tracing.tinymodel import write_tiny_moe
>>> path = write_tiny_moe("/tmp/tiny-moe")      # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Defaults: ~0.5M parameters, fast on one CPU thread.
TINY_DEFAULTS: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=16,
    num_experts_per_tok=4,
    max_position_embeddings=4096,
)


def tiny_moe_config(**overrides: Any) -> dict[str, Any]:
    """The ``config.json`` dict of a tiny ``Qwen3MoeForCausalLM`` (overrides win)."""
    unknown = set(overrides) - set(TINY_DEFAULTS) - {"torch_dtype", "eos_token_id", "bos_token_id"}
    if unknown:
        raise ValueError(f"unknown tiny-model settings {sorted(unknown)}; known: {sorted(TINY_DEFAULTS)}")
    p = {**TINY_DEFAULTS, **overrides}
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "intermediate_size": p["intermediate_size"],
        "moe_intermediate_size": p["moe_intermediate_size"],
        "num_hidden_layers": p["num_hidden_layers"],
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "head_dim": p["head_dim"],
        "num_experts": p["num_experts"],
        "num_experts_per_tok": p["num_experts_per_tok"],
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": p["max_position_embeddings"],
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.0,
        "bos_token_id": p.get("bos_token_id", 1),
        # an id greedy decoding of random weights practically never produces, so generations
        # run to max_tokens; set eos_token_id to test early stops
        "eos_token_id": p.get("eos_token_id", p["vocab_size"] - 1),
        "torch_dtype": p.get("torch_dtype", "float32"),
    }


def write_tiny_moe(path: str | Path, **overrides: Any) -> Path:
    """Write ``config.json`` of a tiny Qwen3-MoE into ``path`` (created) and return the path.

    Load it in vLLM with ``load_format="dummy"`` and ``skip_tokenizer_init=True``.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(tiny_moe_config(**overrides), indent=2) + "\n")
    return root
