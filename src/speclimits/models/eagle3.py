"""An EAGLE-3 draft head in vLLM's ``LlamaForCausalLMEagle3`` format, trained on the frozen target.

The PyTorch module below computes what vLLM's ``vllm/model_executor/models/llama_eagle3.py``
computes for one draft step (the checkpoint names are the ones vLLM loads):

* ``fc`` maps the concatenated auxiliary hidden states of the target (the residual stream after
  ``aux_layer_ids[i]`` layers, at position ``p``) to ``H``;
* the single decoder layer ``midlayer`` concatenates ``input_layernorm(embed(token at p+1))`` with
  ``hidden_norm(fc_out)`` (q/k/v take ``2H`` inputs); ``fc_out`` is the residual;
* ``norm`` then ``lm_head`` give logits over a reduced draft vocabulary (``draft_vocab_size``);
  ``d2t[i] = target_id(i) - i`` maps draft ids to target ids;
* the pre-norm sum (``mlp_out + residual``) is the hidden state that the next draft step uses in
  place of ``fc_out``; step ``j`` runs at rope position ``p + j - 1``.

Training unrolls ``ttt_steps`` draft steps (test-time-training style): step ``j`` at origin ``p``
attends to the step-1 keys of positions ``0..p`` (built from the target's features, as vLLM's draft
KV cache holds them) and to its own earlier steps' keys at the same origin. Its input token is the
reference token at ``p + j`` and its label is the target's distribution at position ``p + j``
(soft labels over the draft vocabulary).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from speclimits.jsonutil import dumps


@dataclass
class HeadConfig:
    draft_vocab: int = 4096
    intermediate: int = 384
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    aux_layer_ids: tuple[int, ...] | None = None  # None: vLLM's default (2, L // 2, L - 3)
    ttt_steps: int = 6
    step_decay: float = 0.8
    seq_len: int = 192
    batch: int = 8
    steps: int = 600
    lr: float = 2e-3
    warmup: int = 20
    seed: int = 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Neox-style rotary embedding (as Llama in HF and vLLM). ``x``: [B, heads, S, D]; ``pos``: [S]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return rope(q, pos), rope(k, pos), v


class Eagle3Head(nn.Module):
    """The head; parameter names match the checkpoint vLLM loads (``midlayer.*``, ``fc``, ``norm``, ``lm_head``)."""

    def __init__(self, hidden: int, n_aux: int, cfg: HeadConfig, target_hidden: int | None = None):
        super().__init__()
        target_hidden = target_hidden or hidden
        self.cfg, self.hidden = cfg, hidden
        self.fc = nn.Linear(n_aux * target_hidden, hidden, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = RMSNorm(hidden)
        self.midlayer.hidden_norm = RMSNorm(hidden)
        self.midlayer.self_attn = Attention(hidden, cfg.heads, cfg.kv_heads, cfg.head_dim)
        self.midlayer.post_attention_layernorm = RMSNorm(hidden)
        self.midlayer.mlp = nn.Module()
        self.midlayer.mlp.gate_proj = nn.Linear(hidden, cfg.intermediate, bias=False)
        self.midlayer.mlp.up_proj = nn.Linear(hidden, cfg.intermediate, bias=False)
        self.midlayer.mlp.down_proj = nn.Linear(cfg.intermediate, hidden, bias=False)
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.draft_vocab, bias=False)

    def _layer_in(self, emb: torch.Tensor, h: torch.Tensor):
        m = self.midlayer
        return torch.cat([m.input_layernorm(emb), m.hidden_norm(h)], -1), h

    def _layer_out(self, attn: torch.Tensor, residual: torch.Tensor):
        m = self.midlayer
        residual = attn + residual
        x = m.post_attention_layernorm(residual)
        x = m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x))
        prenorm = x + residual
        return self.lm_head(self.norm(prenorm)), prenorm

    def unroll(self, emb: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Draft logits of ``steps`` unrolled steps for every origin ``p``.

        ``emb``: [B, S, H] target embeddings of the reference tokens; ``aux``: [B, S, n_aux*H].
        Step ``j`` (1-based) at origin ``p`` takes the token at ``p + j`` (so origins run to
        ``S - 1 - j``); returns one ``[B, S - j, draft_vocab]`` tensor per step.
        """
        b, s, _ = aux.shape
        attn_mod = self.midlayer.self_attn
        scale = 1.0 / math.sqrt(attn_mod.head_dim)
        h = self.fc(aux)
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        outs = []
        for j in range(1, steps + 1):
            n = s - j  # origins 0..n-1
            x, residual = self._layer_in(emb[:, j: j + n], h[:, :n])
            pos = torch.arange(j - 1, j - 1 + n)
            q, k, v = attn_mod.qkv(x, pos)
            if j == 1:
                k1, v1 = k, v
            mask = torch.ones(n, n, dtype=torch.bool).tril()
            scores = ((q @ k1[:, :, :n].transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
            # step j > 1 also attends to the keys of steps 2..j at its own origin
            own = [(kk[:, :, :n], vv[:, :, :n]) for kk, vv in keys] + ([(k, v)] if j > 1 else [])
            w = torch.cat([scores, *[(q * kk).sum(-1, keepdim=True) * scale for kk, _ in own]], -1).softmax(-1)
            out = w[..., :n] @ v1[:, :, :n]
            for i, (_, vv) in enumerate(own):
                out = out + w[..., n + i: n + i + 1] * vv
            if j > 1:
                keys.append((k, v))
            out = out.transpose(1, 2).reshape(b, n, -1)
            logits, prenorm = self._layer_out(attn_mod.o_proj(out), residual)
            outs.append(logits)
            h = prenorm
        return outs


class TargetFeatures:
    """Run the frozen target and collect the auxiliary hidden states (residual stream after layer k)."""

    def __init__(self, target, aux_ids: tuple[int, ...]):
        n_layers = target.config.num_hidden_layers
        bad = [k for k in aux_ids if not 1 <= k <= n_layers - 1]
        if bad or len(set(aux_ids)) != len(aux_ids):
            raise ValueError(f"aux layer ids {aux_ids} must be distinct and in 1..{n_layers - 1}")
        self.target, self.aux_ids = target, tuple(aux_ids)
        self._store: dict[int, torch.Tensor] = {}
        self._handles = [target.model.layers[k - 1].register_forward_hook(self._hook(k)) for k in aux_ids]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _hook(self, k: int):
        def fn(_module, _inp, out):
            self._store[k] = out[0] if isinstance(out, tuple) else out
        return fn

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings [B,S,H], aux [B,S,n*H], target logits [B,S,V]) for token ids [B,S]."""
        self._store.clear()
        out = self.target(input_ids=ids)
        aux = torch.cat([self._store[k] for k in self.aux_ids], -1)
        emb = self.target.get_input_embeddings()(ids)
        return emb, aux, out.logits.float()


def draft_vocab_from_counts(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent target ids (ties by id), sorted ascending: draft id i -> target id."""
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:size])


@dataclass
class FeatureCache:
    """The frozen target's outputs on a set of sequences, computed once.

    ``ids`` [N, S]; ``aux`` [N, S, n_aux*H] (None when not needed); ``top_ids`` / ``top_probs``
    [N, S, k]: the target's k most likely next tokens and their probabilities (soft labels);
    ``argmax`` [N, S]: its greedy next token.
    """

    ids: torch.Tensor
    aux: torch.Tensor | None
    top_ids: torch.Tensor
    top_probs: torch.Tensor

    @property
    def argmax(self) -> torch.Tensor:
        return self.top_ids[..., 0]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def take(self, idx) -> "FeatureCache":
        return FeatureCache(self.ids[idx], None if self.aux is None else self.aux[idx], self.top_ids[idx],
                            self.top_probs[idx])


@torch.no_grad()
def build_cache(target, seqs: np.ndarray, aux_ids: tuple[int, ...] | None, topk: int = 32, batch: int = 8,
                progress: bool = False, desc: str = "target features") -> FeatureCache:
    """Run the frozen target over ``seqs`` [N, S] and keep what head/draft training needs."""
    from tqdm.auto import tqdm

    feats = TargetFeatures(target, aux_ids) if aux_ids else None
    ids = torch.from_numpy(np.asarray(seqs)).long()
    aux, tids, tprobs = [], [], []
    for i in tqdm(range(0, len(ids), batch), desc=desc, disable=not progress):
        x = ids[i: i + batch]
        if feats is not None:
            _, a, logits = feats(x)
            aux.append(a)
        else:
            logits = target(input_ids=x).logits.float()
        pr, ti = logits.softmax(-1).topk(topk, dim=-1)
        tids.append(ti)
        tprobs.append(pr)
    if feats is not None:
        feats.remove()
    return FeatureCache(ids, torch.cat(aux) if aux else None, torch.cat(tids), torch.cat(tprobs))


def soft_labels(top_ids: torch.Tensor, top_probs: torch.Tensor, t2d: torch.Tensor, width: int) -> torch.Tensor:
    """Dense [.., width] label distribution from top-k target probabilities; ids mapped by ``t2d`` (-1: dropped)."""
    idx = t2d[top_ids]
    keep = idx >= 0
    out = torch.zeros(*top_ids.shape[:-1], width + 1)
    out.scatter_add_(-1, torch.where(keep, idx, width), torch.where(keep, top_probs, 0.0))
    return out[..., :width]


def head_losses(head: Eagle3Head, embed, batch: FeatureCache, d2t_ids: torch.Tensor, t2d: torch.Tensor,
                steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-step soft-label cross-entropy and top-1 agreement (draft argmax == target argmax)."""
    with torch.no_grad():
        emb = embed(batch.ids)
    outs = head.unroll(emb, batch.aux, steps)
    losses, agree = [], []
    for j, logits in enumerate(outs, 1):
        n = logits.shape[1]
        p = soft_labels(batch.top_ids[:, j: j + n], batch.top_probs[:, j: j + n], t2d, logits.shape[-1])
        losses.append(-(p * logits.log_softmax(-1)).sum(-1).mean())
        pred = d2t_ids[logits.argmax(-1)]
        agree.append((pred == batch.argmax[:, j: j + n]).float().mean())
    return losses, agree


def train_head(cfg: HeadConfig, target, train_seqs: np.ndarray, valid_sets: dict[str, np.ndarray],
               token_counts: np.ndarray, out: str | Path, log: Callable[[str], None] = print,
               progress: bool = True) -> dict:
    """Train the head on sequences ``train_seqs`` [N, seq_len] (ids); save the vLLM checkpoint into ``out``."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    n_layers = target.config.num_hidden_layers
    aux_ids = tuple(cfg.aux_layer_ids or (2, n_layers // 2, n_layers - 3))
    hidden = target.config.hidden_size
    head = Eagle3Head(hidden, len(aux_ids), cfg)
    draft_ids = draft_vocab_from_counts(token_counts, cfg.draft_vocab)
    coverage = float(token_counts[draft_ids].sum() / token_counts.sum())
    d2t_ids = torch.from_numpy(draft_ids).long()
    t2d = torch.full((target.config.vocab_size,), -1, dtype=torch.long)  # target id -> draft id (-1: none)
    t2d[d2t_ids] = torch.arange(d2t_ids.numel())
    log(f"eagle3 head: {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M parameters, aux layers {aux_ids}, "
        f"draft vocab {cfg.draft_vocab} covering {coverage:.3f} of training-corpus tokens")
    t0 = time.perf_counter()
    cache = build_cache(target, train_seqs, aux_ids, progress=progress)
    valid_caches = {k: build_cache(target, v, aux_ids) for k, v in valid_sets.items()}
    log(f"eagle3: target features of {len(cache)}+{sum(map(len, valid_caches.values()))} sequences "
        f"in {time.perf_counter() - t0:.0f} s")
    embed = target.get_input_embeddings()
    weights = [cfg.step_decay ** i for i in range(cfg.ttt_steps)]

    def loss_fn(batch: FeatureCache) -> tuple[torch.Tensor, list[torch.Tensor]]:
        losses, agree = head_losses(head, embed, batch, d2t_ids, t2d, cfg.ttt_steps)
        return sum(w * x for w, x in zip(weights, losses)) / sum(weights), agree

    history, train_s = train_draft(list(head.parameters()), cfg, cache, rng, loss_fn, "eagle3", log, progress)
    head.eval()
    valid = {name: evaluate_head(head, embed, c, d2t_ids, t2d, cfg.ttt_steps) for name, c in valid_caches.items()}
    log(f"eagle3 teacher-forced agreement per unrolled step (held out): {valid}")
    save_head(head, out, hidden, aux_ids, target.config, draft_ids, cfg)
    metrics = {"config": asdict(cfg) | {"aux_layer_ids": list(aux_ids)}, "train_seconds": round(train_s, 1),
               "train_sequences": len(cache), "parameters": sum(p.numel() for p in head.parameters()),
               "draft_vocab_coverage": round(coverage, 4), "valid_agreement": valid, "history": history}
    (Path(out) / "train_metrics.json").write_text(dumps(metrics, indent=2) + "\n")
    return metrics


def train_draft(params: list[torch.nn.Parameter], cfg: Any, cache: FeatureCache, rng: np.random.Generator,
                loss_fn: Callable[[FeatureCache], tuple[torch.Tensor, Any]], name: str, log: Callable[[str], None],
                progress: bool) -> tuple[list[dict], float]:
    """The draft models' training loop: AdamW (betas 0.9, 0.95, no weight decay), ``cfg.warmup`` steps of
    linear warm-up times a cosine from ``cfg.lr`` to 0.1 of it over ``cfg.steps``; each step ``cfg.batch``
    sequences of ``cache`` drawn with ``rng``, gradients clipped at norm 1. ``loss_fn(batch) -> (loss,
    agreement)``, agreement a scalar tensor or one per unrolled step. Returns the history (every 10th
    step: loss, agreement, seconds) and the training seconds."""
    from tqdm.auto import tqdm

    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    history, t0 = [], time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=name, unit="step", disable=not progress)
    for step in bar:
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        loss, agree = loss_fn(cache.take(torch.from_numpy(rng.integers(0, len(cache), cfg.batch))))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == cfg.steps - 1:
            agree = [round(a.item(), 3) for a in agree] if isinstance(agree, (list, tuple)) else round(agree.item(), 3)
            rec = {"step": step, "loss": round(loss.item(), 4), "agree": agree,
                   "seconds": round(time.perf_counter() - t0, 1)}
            history.append(rec)
            bar.set_postfix(loss=rec["loss"], agree=agree)
            if step % 100 == 0:
                log(f"{name} step {step}: loss {rec['loss']} agreement {agree} ({rec['seconds']} s)")
    return history, time.perf_counter() - t0


@torch.no_grad()
def evaluate_head(head: Eagle3Head, embed, cache: FeatureCache, d2t_ids: torch.Tensor, t2d: torch.Tensor,
                  steps: int, batch: int = 8) -> list[float]:
    """Mean top-1 agreement per unrolled step over a cache (reference tokens fed, own hidden states)."""
    tot = np.zeros(steps)
    for i in range(0, len(cache), batch):
        part = cache.take(slice(i, i + batch))
        _, agree = head_losses(head, embed, part, d2t_ids, t2d, steps)
        tot += np.array([a.item() for a in agree]) * len(part)
    return [round(float(x), 4) for x in tot / max(len(cache), 1)]


def save_head(head: Eagle3Head, out: str | Path, hidden: int, aux_ids: tuple[int, ...],
              target_config, draft_ids: np.ndarray, cfg: HeadConfig) -> None:
    """Write ``model.safetensors`` + ``config.json`` in vLLM's ``LlamaForCausalLMEagle3`` layout (float32)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().float() for k, v in head.state_dict().items()}
    state["d2t"] = torch.from_numpy(draft_ids - np.arange(draft_ids.size)).long()
    t2d = np.zeros(target_config.vocab_size, dtype=bool)
    t2d[draft_ids] = True
    state["t2d"] = torch.from_numpy(t2d)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": hidden, "target_hidden_size": hidden, "intermediate_size": cfg.intermediate,
        "num_hidden_layers": 1, "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": target_config.max_position_embeddings, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False,
        "vocab_size": target_config.vocab_size, "draft_vocab_size": cfg.draft_vocab,
        "bos_token_id": target_config.bos_token_id, "eos_token_id": target_config.eos_token_id,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True},
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(dumps(config, indent=2) + "\n")


def load_head(path: str | Path) -> tuple[Eagle3Head, torch.Tensor, tuple[int, ...]]:
    """Load a saved head back (module, draft->target id map, aux layer ids)."""
    from safetensors.torch import load_file

    path = Path(path)
    conf = json.loads((path / "config.json").read_text())
    aux_ids = tuple(conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    cfg = HeadConfig(draft_vocab=conf["draft_vocab_size"], intermediate=conf["intermediate_size"],
                     heads=conf["num_attention_heads"], kv_heads=conf["num_key_value_heads"],
                     head_dim=conf["head_dim"], aux_layer_ids=aux_ids)
    head = Eagle3Head(conf["hidden_size"], len(aux_ids), cfg, conf["target_hidden_size"])
    state = load_file(str(path / "model.safetensors"))
    d2t = state.pop("d2t")
    state.pop("t2d")
    head.load_state_dict(state)
    head.eval()
    return head, d2t + torch.arange(d2t.numel()), aux_ids
