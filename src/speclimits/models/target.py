"""The Qwen3-MoE target: configuration, seeded training on CPU, per-layer routing load, validation loss.

The balance loss is computed per layer (Switch-Transformer form ``E * sum_e f_e * P_e`` for each
layer, averaged over layers) because transformers' ``load_balancing_loss_func`` balances the
aggregate over layers, which lets one layer collapse while the sum looks even.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speclimits.jsonutil import dumps


@dataclass
class TargetConfig:
    """Sizes and training settings of the target (defaults: the committed model)."""

    layers: int = 16
    hidden: int = 128
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    experts: int = 32
    top_k: int = 4
    moe_intermediate: int = 64
    seq_len: int = 256
    batch: int = 8
    steps: int = 1000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.1
    balance_coef: float = 0.01
    eval_windows: int = 24
    seed: int = 0


def hf_config(cfg: TargetConfig, vocab_size: int, eos_id: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden, intermediate_size=4 * cfg.hidden,
        moe_intermediate_size=cfg.moe_intermediate, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
        num_experts=cfg.experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        output_router_logits=False, router_aux_loss_coef=0.0, experts_implementation="grouped_mm",
    )


class WindowSampler:
    """Random fixed-length windows from per-domain token streams, domains drawn with equal probability."""

    def __init__(self, streams: dict[str, np.ndarray], seq_len: int, seed: int):
        short = [d for d, s in streams.items() if s.size <= seq_len + 1]
        if short:
            raise ValueError(f"token streams {short} are shorter than one window of {seq_len + 1} tokens")
        self.streams, self.seq_len = streams, seq_len
        self.domains = sorted(streams)
        self.rng = np.random.default_rng(seed)

    def batch(self, n: int, domain: str | None = None) -> tuple[torch.Tensor, list[str]]:
        rows, doms = [], []
        for _ in range(n):
            d = domain or self.domains[self.rng.integers(len(self.domains))]
            s = self.streams[d]
            start = self.rng.integers(0, s.size - self.seq_len - 1)
            rows.append(s[start: start + self.seq_len + 1])
            doms.append(d)
        return torch.from_numpy(np.stack(rows)), doms


def fixed_windows(streams: dict[str, np.ndarray], seq_len: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` evenly spaced windows of ``seq_len + 1`` tokens per domain (deterministic; for validation)."""
    out = {}
    for d, s in streams.items():
        starts = np.linspace(0, s.size - seq_len - 2, n).astype(int)
        out[d] = torch.from_numpy(np.stack([s[a: a + seq_len + 1] for a in starts]))
    return out


def routing_balance(router_logits: tuple[torch.Tensor, ...], top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer Switch balance loss (mean over layers) and the per-layer load ``[layers, experts]``.

    ``router_logits``: one ``[tokens, experts]`` tensor per layer. Load = share of the top-k
    assignments each expert gets in that layer (rows sum to 1).
    """
    losses, loads = [], []
    for logits in router_logits:
        probs = logits.float().softmax(-1)
        n_exp = probs.shape[-1]
        idx = probs.topk(top_k, dim=-1).indices
        load = F.one_hot(idx, n_exp).sum(1).float().mean(0) / top_k
        losses.append(n_exp * (load * probs.mean(0)).sum())
        loads.append(load.detach())
    return torch.stack(losses).mean(), torch.stack(loads)


def load_summary(load: np.ndarray) -> dict:
    """Per-layer normalized entropy of the expert load and count of nearly dead experts (< 10% of uniform)."""
    load = load / load.sum(-1, keepdims=True)
    n_exp = load.shape[-1]
    ent = -(load * np.log(np.clip(load, 1e-12, None))).sum(-1) / math.log(n_exp)
    return {"normalized_entropy": [round(float(x), 3) for x in ent],
            "nearly_dead_experts": [int(x) for x in (load < 0.1 / n_exp).sum(-1)],
            "max_load_share": [round(float(x), 4) for x in load.max(-1)]}


@torch.no_grad()
def evaluate(model, windows: dict[str, torch.Tensor], top_k: int, batch: int = 8) -> tuple[dict, dict]:
    """Validation loss (nats/token) per domain and the per-layer routing load summary on those windows."""
    model.eval()
    losses, load_sum = {}, None
    for d, w in windows.items():
        tot, n = 0.0, 0
        for i in range(0, len(w), batch):
            x = w[i: i + batch]
            out = model(input_ids=x[:, :-1], output_router_logits=True)
            tot += F.cross_entropy(out.logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum").item()
            n += x[:, 1:].numel()
            _, load = routing_balance(out.router_logits, top_k)
            load_sum = load if load_sum is None else load_sum + load
        losses[d] = round(tot / n, 4)
    model.train()
    return losses, load_summary(load_sum.numpy())


def lr_at(step: int, cfg: TargetConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def train_target(cfg: TargetConfig, train: dict[str, np.ndarray], valid: dict[str, np.ndarray], vocab_size: int,
                 eos_id: int, out: str | Path, log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Train the target from scratch (seeded), save it to ``out`` (bf16 safetensors) and return its metrics."""
    from tqdm.auto import tqdm
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(cfg.seed)
    model = Qwen3MoeForCausalLM(hf_config(cfg, vocab_size, eos_id))
    n_params = sum(p.numel() for p in model.parameters())
    per_expert = 3 * cfg.hidden * cfg.moe_intermediate
    active = n_params - cfg.layers * (cfg.experts - cfg.top_k) * per_expert
    log(f"target: {n_params / 1e6:.2f}M parameters ({active / 1e6:.2f}M active per token), "
        f"{cfg.layers} layers, {cfg.experts} experts top-{cfg.top_k}")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    sampler = WindowSampler(train, cfg.seq_len, cfg.seed)
    windows = fixed_windows(valid, cfg.seq_len, cfg.eval_windows, cfg.seed)
    history, t0, tokens = [], time.perf_counter(), 0
    bar = tqdm(range(cfg.steps), desc="target", unit="step", disable=not progress)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, _ = sampler.batch(cfg.batch)
        res = model(input_ids=x[:, :-1], output_router_logits=True)
        ce = F.cross_entropy(res.logits.flatten(0, 1), x[:, 1:].flatten())
        bal, load = routing_balance(res.router_logits, cfg.top_k)
        (ce + cfg.balance_coef * bal).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += x[:, 1:].numel()
        if step % 10 == 0 or step == cfg.steps - 1:
            ent = load_summary(load.numpy())["normalized_entropy"]
            rec = {"step": step, "loss": round(ce.item(), 4), "balance": round(bal.item(), 4),
                   "min_layer_entropy": min(ent), "tokens": tokens, "seconds": round(time.perf_counter() - t0, 1)}
            history.append(rec)
            bar.set_postfix(loss=rec["loss"], bal=rec["balance"], ent=rec["min_layer_entropy"])
            if step % 50 == 0:
                log(f"target step {step}: loss {rec['loss']} balance {rec['balance']} "
                    f"min layer entropy {rec['min_layer_entropy']} ({rec['seconds']} s, {tokens} tokens)")
    train_s = time.perf_counter() - t0
    model = model.to(torch.bfloat16).to(torch.float32)  # evaluate exactly what is saved
    val_loss, routing = evaluate(model, windows, cfg.top_k)
    log(f"target validation loss (nats/token): {val_loss}; routing entropy per layer {routing['normalized_entropy']}")
    save_target(model, out)
    metrics = {"config": asdict(cfg), "parameters": n_params, "active_parameters": active,
               "train_tokens": tokens, "train_seconds": round(train_s, 1),
               "tokens_per_second": round(tokens / train_s, 1), "valid_loss_nats": val_loss,
               "routing_valid": routing, "history": history}
    (Path(out) / "train_metrics.json").write_text(dumps(metrics, indent=2) + "\n")
    return metrics


def save_target(model, out: str | Path) -> None:
    """Save bf16 weights; the config says float32, the dtype the project runs the model in (CPU)."""
    out = Path(out)
    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (out / "config.json").write_text(dumps(cfg, indent=2) + "\n")
    model.to(torch.float32)


def load_target(path: str | Path):
    """The saved target in float32, eval mode, gradients off."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                 experts_implementation="grouped_mm")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
