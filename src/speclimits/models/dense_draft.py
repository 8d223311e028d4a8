"""A small dense Qwen3 draft distilled from the target (baseline for the EAGLE-3 head).

Served by vLLM as ``method="draft_model"``; shares the target's tokenizer and vocabulary. Its
embeddings start from the target's (tied input/output), then everything is trained on the
target's top-k next-token distributions (soft labels) over target-greedy sequences and corpus
windows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from speclimits.jsonutil import dumps
from speclimits.models.eagle3 import FeatureCache, build_cache, train_draft


@dataclass
class DenseConfig:
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 384
    seq_len: int = 192
    batch: int = 8
    steps: int = 500
    lr: float = 2e-3
    warmup: int = 20
    seed: int = 0


def dense_config(cfg: DenseConfig, target_config):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=target_config.vocab_size, hidden_size=target_config.hidden_size,
        intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=2048,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id, eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.eos_token_id,
    )


def distill_loss(model, batch: FeatureCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft-label cross-entropy against the target's top-k probabilities, and top-1 agreement."""
    logits = model(input_ids=batch.ids).logits
    logp = logits.log_softmax(-1)
    loss = -(batch.top_probs * logp.gather(-1, batch.top_ids)).sum(-1).mean()
    agree = (logits.argmax(-1) == batch.argmax).float().mean()
    return loss, agree


def train_dense(cfg: DenseConfig, target, train_seqs: np.ndarray, valid_seqs: np.ndarray, out: str | Path,
                log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Distil the dense draft (seeded); save it (float32 safetensors) into ``out``; return metrics."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = Qwen3ForCausalLM(dense_config(cfg, target.config))
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"dense draft: {n_params / 1e6:.2f}M parameters, {cfg.layers} layers")
    t0 = time.perf_counter()
    cache = build_cache(target, train_seqs, None, progress=progress, desc="target distributions")
    valid = build_cache(target, valid_seqs, None)
    log(f"dense draft: target distributions of {len(cache)}+{len(valid)} sequences in {time.perf_counter() - t0:.0f} s")
    history, train_s = train_draft(list(model.parameters()), cfg, cache, rng, lambda batch: distill_loss(model, batch),
                                   "dense draft", log, progress)
    model.eval()
    with torch.no_grad():
        parts = [distill_loss(model, valid.take(slice(i, i + 8))) for i in range(0, len(valid), 8)]
    v_loss = float(np.mean([p[0].item() for p in parts]))
    v_agree = float(np.mean([p[1].item() for p in parts]))
    log(f"dense draft held-out: soft CE {v_loss:.3f}, teacher-forced top-1 agreement {v_agree:.3f}")
    out = Path(out)
    model.save_pretrained(str(out), safe_serialization=True)
    metrics = {"config": asdict(cfg), "parameters": n_params, "train_seconds": round(train_s, 1),
               "train_sequences": len(cache), "valid_soft_ce": round(v_loss, 4),
               "valid_top1_agreement": round(v_agree, 4), "history": history}
    (out / "train_metrics.json").write_text(dumps(metrics, indent=2) + "\n")
    return metrics
