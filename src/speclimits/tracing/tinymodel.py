"""Tiny config-only model folders for tests and smoke runs: a Qwen3-MoE target and an EAGLE-3 head.

vLLM loads them with ``load_format="dummy"`` (random weights, deterministic for a seed) and
``skip_tokenizer_init=True``. The routing is random but real (vLLM's own router), so the harness is
exercised end to end. The target used as its own draft (``draft_model``) accepts every draft (same dummy
weights); the EAGLE-3 head's drafts are random, so few are accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Defaults: ~0.5M parameters, fast on one CPU thread.
TINY_DEFAULTS: dict[str, Any] = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     num_experts=16, num_experts_per_tok=4, max_position_embeddings=4096)


def tiny_moe_config(**overrides: Any) -> dict[str, Any]:
    """The ``config.json`` dict of a tiny ``Qwen3MoeForCausalLM`` (overrides win)."""
    unknown = set(overrides) - set(TINY_DEFAULTS) - {"torch_dtype", "eos_token_id", "bos_token_id"}
    if unknown:
        raise ValueError(f"unknown tiny-model settings {sorted(unknown)}; known: {sorted(TINY_DEFAULTS)}")
    p = {**TINY_DEFAULTS, **overrides}
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **{k: p[k] for k in TINY_DEFAULTS},
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu",
            "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "output_router_logits": False, "router_aux_loss_coef": 0.0,
            "bos_token_id": p.get("bos_token_id", 1),
            # an id greedy decoding of random weights practically never produces: generations run to max_tokens
            "eos_token_id": p.get("eos_token_id", p["vocab_size"] - 1), "torch_dtype": p.get("torch_dtype", "float32")}


def _write_config(path: str | Path, config: dict[str, Any]) -> Path:
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return root


def write_tiny_moe(path: str | Path, **overrides: Any) -> Path:
    """Write ``config.json`` of a tiny Qwen3-MoE into ``path`` (created) and return the path."""
    return _write_config(path, tiny_moe_config(**overrides))


def eagle3_aux_layers(n_layers: int) -> list[int]:
    """Target layer ids whose hidden states feed an EAGLE-3 head: three distinct ids (low, middle, last), or
    every id of a shallow target. In vLLM 0.32 id ``i`` is the hidden state entering layer ``i`` (``n_layers``:
    the last layer's output). vLLM's default ``(2, L // 2, L - 3)`` repeats or leaves the range on a shallow
    target and crashes in ``combine_hidden_states``, so the ids are always written into the head's config."""
    if n_layers < 1:
        raise ValueError(f"the target needs at least one layer, got {n_layers}")
    if n_layers <= 2:
        return list(range(n_layers + 1))
    return [1, (n_layers + 1) // 2, n_layers]


def tiny_eagle3_config(target: dict[str, Any], *, draft_vocab_size: int | None = None,
                       intermediate_size: int | None = None) -> dict[str, Any]:
    """The ``config.json`` dict of a one-layer ``LlamaForCausalLMEagle3`` head for the target config ``target``,
    at its hidden size; its ``lm_head`` scores a reduced vocabulary of ``draft_vocab_size`` tokens (default:
    half the target's; mapped back by ``d2t``, zeros under dummy weights, i.e. the first ids)."""
    hidden = int(target["hidden_size"])
    vocab = int(target["vocab_size"])
    draft_vocab = int(draft_vocab_size or max(vocab // 2, 1))
    if not 1 <= draft_vocab <= vocab:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {draft_vocab}")
    heads = int(target["num_attention_heads"])
    aux = eagle3_aux_layers(int(target["num_hidden_layers"]))
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
            "target_hidden_size": hidden, "intermediate_size": int(intermediate_size or 2 * hidden),
            "num_hidden_layers": 1, "num_attention_heads": heads,
            "num_key_value_heads": int(target.get("num_key_value_heads", heads)),
            "head_dim": int(target.get("head_dim", hidden // heads)), "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_theta": float(target.get("rope_theta", 10000.0)),
            "max_position_embeddings": int(target["max_position_embeddings"]), "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
            # read by the target runner (which layers to collect) and by the head (fc input width)
            "eagle_aux_hidden_state_layer_ids": aux,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
            "bos_token_id": target.get("bos_token_id", 1), "eos_token_id": target.get("eos_token_id", vocab - 1),
            "torch_dtype": target.get("torch_dtype", "float32")}


def write_tiny_eagle3(path: str | Path, *, target: str | Path, draft_vocab_size: int | None = None) -> Path:
    """Write ``config.json`` of a tiny EAGLE-3 head for the model folder ``target`` into ``path``."""
    target_cfg = json.loads((Path(target) / "config.json").read_text())
    return _write_config(path, tiny_eagle3_config(target_cfg, draft_vocab_size=draft_vocab_size))
