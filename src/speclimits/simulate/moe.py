"""A seeded simulated MoE of the paper's setting that writes SIMULATED traces with a planted truth.

One :class:`SimConfig` drives everything and is written whole into ``meta.json`` (``source:
"simulator"``, ``simulated: true``) with the planted cost model, so a fit can be checked against it.

Generative story
----------------
1. **Prompts.** 14 categories (as in the paper's leave-one-category-out); a prompt length ``P`` and
   a reference continuation of ``N`` tokens, the target's greedy output (the same for every K).
2. **Latent text context.** Segments of code / prose / markup, Latin or Cyrillic; each token's
   context label (``code_format``, ``script_change``, ...) sets its match probability and overlap.
3. **Acceptance.** At state ``n`` draft step ``i`` matches with probability ``q(y_{n+i}) *
   depth_decay**(i-1)`` given the chain so far; ``accept_len[n]`` is drawn once, so every K run
   of a prompt sees the same acceptance pattern, as greedy decoding does.
4. **Routing.** A new position adds ``Binomial(top_k, (1 - rho) * (1 - U / n_experts))`` experts
   to the ``U`` a layer has touched (``rho``: the token's overlap, plus a per-layer offset; after
   the first mismatch plus ``junk_rho_shift``); ``u_bar`` averages ``U`` over layers, ``e_max`` is
   the largest.
5. **Cost.** ``T_T = beta0(m) + alpha(m) * u_bar + c * L`` times Student-t noise whose spread grows
   with ``(u_bar / mean u_bar at m) ** target_noise_u_power``, plus rare spikes; ``T_D = a * K + b``
   plus noise and spikes; a small share of zero timings, as the paper saw.

Tables: ``rounds`` (the K sweep, prefill rounds included), ``oracle`` (dense per-position rows) and
``tokens`` (per-token text, context and new experts; one row more per sequence than the Oracle has
states, see :func:`_token_rows`). Batch mode (:func:`simulate_batch`) also writes ``steps``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits import paper
from speclimits.costmodel import BatchCostModel, CostModel, saturation_curve
from speclimits.errors import SpeclimitsError
from speclimits.trace import new_meta, write_trace
from speclimits import vocabulary as v
from speclimits.vocabulary import CONTEXT_MODES, CONTEXTS, MODES

# ---------------------------------------------------------------------------
# Text contexts and prompt categories
# ---------------------------------------------------------------------------

#: Per context (:data:`speclimits.vocabulary.CONTEXTS`): draft match probability at depth 1,
#: routing overlap rho, token vocabulary; the mode is the vocabulary's.
CONTEXT_PARAMS: dict[str, dict[str, Any]] = {
    v.CODE_FORMAT: dict(q=0.96, rho=0.70, vocab=["    ", "\n", "(", ")", ":", ",", "]", "[", " =", "\n    "]),
    v.CODE_STRUCTURE: dict(q=0.88, rho=0.66,
                           vocab=["def", " return", " if", " for", " in", " class", " else", " import", " while"]),
    v.CODE_VOCAB: dict(q=0.72, rho=0.64,
                       vocab=[" x", " data", "_id", " self", " value", " items", " result", " path", "_cache"]),
    v.PROSE_VOCAB: dict(q=0.66, rho=0.645,
                        vocab=[" the", " model", " expert", " of", " cost", " and", " speed", " token", " is"]),
    v.PROSE_BOUNDARY: dict(q=0.55, rho=0.62, vocab=[".", ",", " The", "\n\n", ";", " However", " In", ":"]),
    v.MARKUP_CONTEXT: dict(q=0.86, rho=0.66, vocab=["$", "\\frac", "{", "}", "<div", "**", "^2", "</p>", "\\sum"]),
    v.MODE_CHANGE: dict(q=0.60, rho=0.62, vocab=[]),
    v.SCRIPT_CHANGE: dict(q=0.15, rho=0.595, vocab=[]),
}
assert tuple(CONTEXT_PARAMS) == CONTEXTS
CYRILLIC_VOCAB = [" модель", " и", " в", " эксперт", " стоимость", " на", " что", ".", " токен", " это"]
CONTEXT_NAMES = list(CONTEXTS)

#: Fourteen prompt categories: mode weights (in :data:`MODES` order: code, prose, markup) and the share
#: of Cyrillic prose.
CATEGORIES: dict[str, tuple[tuple[float, float, float], float]] = {
    "coding": ((0.75, 0.20, 0.05), 0.0),
    "code_review": ((0.50, 0.50, 0.00), 0.0),
    "debugging": ((0.60, 0.40, 0.00), 0.0),
    "sql": ((0.80, 0.20, 0.00), 0.0),
    "shell": ((0.70, 0.30, 0.00), 0.0),
    "html_css": ((0.20, 0.20, 0.60), 0.0),
    "math": ((0.00, 0.60, 0.40), 0.0),
    "writing": ((0.00, 1.00, 0.00), 0.0),
    "qa": ((0.00, 0.95, 0.05), 0.0),
    "summarization": ((0.00, 1.00, 0.00), 0.0),
    "reasoning": ((0.00, 0.80, 0.20), 0.0),
    "translation_ru": ((0.00, 1.00, 0.00), 0.5),
    "code_ru": ((0.55, 0.45, 0.00), 0.6),
    "docs_ru": ((0.30, 0.70, 0.00), 0.7),
}
MODE_CONTEXTS = {
    v.CODE: ([v.CODE_FORMAT, v.CODE_STRUCTURE, v.CODE_VOCAB], [0.45, 0.25, 0.30]),
    v.PROSE: ([v.PROSE_VOCAB, v.PROSE_BOUNDARY], [0.8, 0.2]),
    v.MARKUP: ([v.MARKUP_CONTEXT], [1.0]),
}


#: The planted truth's shape where the appendix gives only a range (simulator choices, not the
#: paper's): where alpha(m) sits in ALPHA_LARGE for m = 5..11 (0 = low end, 1 = high end), beta0's
#: step per m above BETA0_LARGE_START, and beta0(1) below BETA0_SMALL's low end (m = 1 is not in
#: the paper's sweep; alpha(1) := alpha(2)).
LARGE_ALPHA_POSITION = (0.0, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0)
LARGE_BETA0_STEP = 0.05
BETA0_M1_BELOW_SMALL = 0.3
#: Prefill passes (simulator choices; the paper reports decode rounds only): target ``base + per_token * P``
#: and draft ``base + per_token * P`` in ms for a prompt of P tokens.
PREFILL_TARGET_MS = (12.0, 0.04)
PREFILL_DRAFT_MS = (0.8, 0.004)


def paper_cost_model() -> dict[str, Any]:
    """The planted truth of the presets, in cost-model JSON form, from :mod:`speclimits.paper`'s ranges:
    alpha and beta0 span the small regime over m = 2..4 and the large one over m = 5..11 (the shape inside
    a range is :data:`LARGE_ALPHA_POSITION`, :data:`LARGE_BETA0_STEP`; m = 1 planted in the small regime);
    ``c`` the middle of ``paper.C_RANGE`` to two significant figures; the draft line ``paper.DRAFT``'s."""
    (a_lo, a_hi), (b_lo, b_hi) = paper.ALPHA_SMALL, paper.BETA0_SMALL
    small = {1: (b_lo - BETA0_M1_BELOW_SMALL, a_lo), 2: (b_lo, a_lo), 3: ((b_lo + b_hi) / 2, (a_lo + a_hi) / 2),
             4: (b_hi, a_hi)}
    by_m = {str(m): {"beta0": round(b0, 3), "alpha": round(al, 3)} for m, (b0, al) in small.items()}
    lo, hi = paper.ALPHA_LARGE
    for i, pos in enumerate(LARGE_ALPHA_POSITION):
        by_m[str(5 + i)] = {"beta0": round(paper.BETA0_LARGE_START + LARGE_BETA0_STEP * i, 3),
                            "alpha": round(lo + pos * (hi - lo), 3)}
    c = float(f"{sum(paper.C_RANGE) / 2:.2g}")
    return {"target": {"c": c, "by_m": by_m}, "draft": {"a": paper.DRAFT["a"][0], "b": paper.DRAFT["b"][0]},
            "source": "planted truth of the speclimits simulator (paper values from the appendix)"}


@dataclass(frozen=True)
class SimConfig:
    """Every parameter of the simulator (presets are instances; override with ``replace``).
    ``n_prompts`` prompts each run once per K in ``k_values`` (K = 0 on the first ``k0_share`` only);
    the first ``oracle_prompts`` get dense Oracle rows (``k_max`` drafts per state) and token rows."""

    preset: str = "custom"
    # model shape (Qwen3-Coder-30B-A3B: 48 MoE layers, 128 experts, top-8)
    n_layers: int = 48
    n_experts: int = 128
    top_k: int = 8
    # sweep
    k_values: tuple[int, ...] = tuple(range(0, 11))
    k0_share: float = 0.2
    n_prompts: int = 60
    response_median: float = 400.0
    response_sigma: float = 0.45
    response_max: int = 1500
    prompt_median: float = 380.0
    prompt_sigma: float = 0.6
    prompt_max: int = 3000
    # Oracle data
    k_max: int = 10
    oracle_prompts: int = 40
    # text and acceptance
    segment_mean_len: float = 6.0
    script_stickiness: float = 0.8
    q_logit_sd: float = 0.8
    depth_decay: float = 0.97
    conf_slope: float = 1.1
    conf_shift: float = -1.2
    conf_noise_sd: float = 0.7
    context_q: dict[str, float] = field(default_factory=lambda: {k: v["q"] for k, v in CONTEXT_PARAMS.items()})
    # routing
    context_rho: dict[str, float] = field(default_factory=lambda: {k: v["rho"] for k, v in CONTEXT_PARAMS.items()})
    rho_token_sd: float = 0.15
    rho_layer_sd: float = 0.06
    junk_rho_shift: float = 0.0
    # cost truth and noise
    cost_model: dict[str, Any] = field(default_factory=paper_cost_model)
    target_noise_rel: float = 0.004
    target_noise_df: float = 5.0
    target_noise_u_power: float = 2.0
    target_spike_share: float = 0.001
    target_spike_mean_ms: float = 3.0
    draft_noise_rel: float = 0.01
    draft_spike_share: float = 0.0027
    draft_spike_mean_ms: float = 15.0
    zero_target_share: float = 0.0015
    zero_draft_share: float = 0.0015
    kv_block_size: int = 16
    kv_num_blocks: int = 8192
    graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32)

    def __post_init__(self) -> None:  # lists from JSON or --set become tuples
        for name in ("k_values", "graph_buckets"):
            object.__setattr__(self, name, tuple(int(k) for k in getattr(self, name)))

    def truth(self) -> CostModel:
        """The planted cost model."""
        return CostModel.from_dict(self.cost_model, origin="simulator cost_model")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "k_values": list(self.k_values), "graph_buckets": list(self.graph_buckets)}


PRESETS: dict[str, SimConfig] = {
    # a few seconds; what the tests and the smoke book use
    "smoke": SimConfig(preset="smoke", n_prompts=14, response_median=70, response_max=160,
                       prompt_median=200, oracle_prompts=14, k0_share=0.5),
    # the bundled default trace of the book (~120k rounds)
    "default": SimConfig(preset="default"),
    # the paper's scale: ~925k decode rounds over K = 1..10
    "paper": SimConfig(preset="paper", n_prompts=480, response_median=447, response_max=2048,
                       oracle_prompts=120, k0_share=0.1),
}


#: The names of :class:`SimConfig`'s fields (what ``--set`` and a trace's ``simulator`` section may name).
CONFIG_FIELDS = frozenset(f.name for f in fields(SimConfig))


def preset(name: str, **overrides: Any) -> SimConfig:
    """A named preset with optional field overrides (unknown names raise)."""
    if name not in PRESETS:
        raise SpeclimitsError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    bad = sorted(set(overrides) - CONFIG_FIELDS)
    if bad:
        raise SpeclimitsError(f"unknown simulator parameter(s) {bad}; valid: {sorted(CONFIG_FIELDS)}")
    cfg = replace(PRESETS[name], **overrides)
    _check_config(cfg)
    return cfg


def _check_config(cfg: SimConfig) -> None:
    model = cfg.truth()
    needed = sorted({k + 1 for k in cfg.k_values} | set(range(1, cfg.k_max + 2)))
    model.require_ms(needed, origin="simulator cost_model")
    if cfg.k_values and max(cfg.k_values) > cfg.k_max:
        raise SpeclimitsError(f"k_max = {cfg.k_max} must be >= the largest K in k_values ({max(cfg.k_values)})")
    if not 0 < cfg.top_k <= cfg.n_experts:
        raise SpeclimitsError("need 0 < top_k <= n_experts")
    for name in ("context_q", "context_rho"):
        missing = sorted(set(CONTEXT_NAMES) - set(getattr(cfg, name)))
        if missing:
            raise SpeclimitsError(f"{name} lacks contexts {missing}")


# ---------------------------------------------------------------------------
# Reference sequences
# ---------------------------------------------------------------------------


@dataclass
class Reference:
    """One prompt's reference continuation and everything derived from it (arrays of length N)."""

    prompt_id: str
    category: str
    prompt_len: int
    context: np.ndarray  # int codes into CONTEXT_NAMES
    script: np.ndarray  # 0 latin, 1 cyrillic
    q_token: np.ndarray  # depth-1 match probability of each token
    rho_token: np.ndarray  # routing overlap of each token

    @property
    def n(self) -> int:
        return len(self.context)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _make_reference(cfg: SimConfig, rng: np.random.Generator, idx: int, category: str) -> Reference:
    mode_w, cyr = CATEGORIES[category]
    n = int(np.clip(round(rng.lognormal(np.log(cfg.response_median), cfg.response_sigma)), 16, cfg.response_max))
    p_len = int(np.clip(round(rng.lognormal(np.log(cfg.prompt_median), cfg.prompt_sigma)), 8, cfg.prompt_max))
    ctx = np.empty(n, dtype=np.int16)
    script = np.zeros(n, dtype=np.int8)
    pos, prev_mode, prev_script, prose_script = 0, None, 0, int(rng.random() < cyr)
    code = {name: i for i, name in enumerate(CONTEXT_NAMES)}
    while pos < n:
        mode = MODES[rng.choice(3, p=np.asarray(mode_w) / sum(mode_w))]
        seg_len = int(rng.geometric(1.0 / cfg.segment_mean_len))
        names, weights = MODE_CONTEXTS[mode]
        kind = names[rng.choice(len(names), p=weights)]
        if mode == v.PROSE:
            if rng.random() > cfg.script_stickiness:
                prose_script = int(rng.random() < cyr)
            seg_script = prose_script
        else:
            seg_script = 0
        end = min(n, pos + seg_len)
        ctx[pos:end] = code[kind]
        script[pos:end] = seg_script
        if pos > 0 and seg_script != prev_script:
            ctx[pos] = code[v.SCRIPT_CHANGE]
        elif pos > 0 and prev_mode is not None and mode != prev_mode:
            ctx[pos] = code[v.MODE_CHANGE]
        prev_mode, prev_script, pos = mode, seg_script, end
    q_ctx = np.array([cfg.context_q[c] for c in CONTEXT_NAMES])[ctx]
    q_tok = _sigmoid(_logit(q_ctx) + rng.normal(0, cfg.q_logit_sd, n))
    rho_ctx = np.array([cfg.context_rho[c] for c in CONTEXT_NAMES])[ctx]
    rho_tok = np.clip(rho_ctx + rng.normal(0, cfg.rho_token_sd, n), 0.0, 0.98)
    return Reference(f"q{idx:04d}", category, p_len, ctx, script, q_tok, rho_tok)


def _window_data(cfg: SimConfig, ref: Reference, rng: np.random.Generator, layer_off: np.ndarray,
                 layers: bool = False) -> dict[str, np.ndarray]:
    """Per state n: match probs, draft confidence, greedy match length, and window routing
    (``layers``: also ``u_layers``, see :func:`_window_routing`)."""
    n, kmax = ref.n, cfg.k_max
    idx = np.arange(n)[:, None] + np.arange(1, kmax + 1)[None, :]  # y_{n+i}, i = 1..kmax (0-based token n+i-1)
    valid = idx <= n  # token y_{n+i} exists (states n = 0..N-1, tokens y_1..y_N at indices 0..N-1)
    tok = np.clip(idx - 1, 0, n - 1)
    match = np.where(valid, ref.q_token[tok] * cfg.depth_decay ** np.arange(kmax)[None, :], 0.0)
    conf = _sigmoid(cfg.conf_slope * _logit(np.where(valid, match, 0.02)) + cfg.conf_shift
                    + rng.normal(0, cfg.conf_noise_sd, match.shape))
    hits = rng.random(match.shape) < match
    accept_len = np.where(hits.all(axis=1), kmax, np.argmin(hits, axis=1)).astype(np.int16)
    # routing overlap of each window position j = 1..kmax; junk tail after the first mismatch
    rho = ref.rho_token[tok].copy()
    junk = np.arange(1, kmax + 1)[None, :] > accept_len[:, None]
    rho = np.clip(rho + np.where(junk, cfg.junk_rho_shift, 0.0), 0.0, 0.98)
    u_sum, u_max, u_layers = _window_routing(cfg, rho, rng, layer_off, layers=layers)
    out = dict(match=match, conf=conf, accept_len=accept_len, u_bar=u_sum / cfg.n_layers, e_max=u_max)
    if layers:
        out["u_layers"] = u_layers
    return out


def _window_routing(cfg: SimConfig, rho: np.ndarray, rng: np.random.Generator, layer_off: np.ndarray,
                    layers: bool = False):
    """Unique experts per layer over windows of 1..k_max+1 positions, from ``rho`` (states, k_max).
    Returns ``(sum over layers, max over layers, per layer)``, (states, k_max + 1) each; the last uint16
    (states, n_layers, k_max + 1) when ``layers`` is set, else None (same draws either way)."""
    s, kmax = rho.shape
    E, k = cfg.n_experts, cfg.top_k
    u = np.full((s, cfg.n_layers), k, dtype=np.float32)
    u_sum = np.empty((s, kmax + 1), dtype=np.float64)
    u_max = np.empty((s, kmax + 1), dtype=np.float64)
    u_sum[:, 0], u_max[:, 0] = k * cfg.n_layers, k
    u_layers = np.empty((s, cfg.n_layers, kmax + 1), dtype=np.uint16) if layers else None
    if layers:
        u_layers[:, :, 0] = k
    for j in range(kmax):
        p = (1.0 - np.clip(rho[:, j:j + 1] + layer_off[None, :], 0.0, 0.98)) * (1.0 - u / E)
        u += rng.binomial(k, np.clip(p, 0.0, 1.0)).astype(np.float32)
        u_sum[:, j + 1] = u.sum(axis=1)
        u_max[:, j + 1] = u.max(axis=1)
        if layers:
            u_layers[:, :, j + 1] = u
    return u_sum, u_max, u_layers


def _new_experts(cfg: SimConfig, rho_token: np.ndarray, rng: np.random.Generator, layer_off: np.ndarray) -> np.ndarray:
    """Experts per layer at each token not used at the token before (layer average), for tokens of
    overlap ``rho_token`` (n,); (n,)."""
    rho = np.clip(rho_token[:, None] + layer_off[None, :], 0.0, 0.98)
    p = (1.0 - rho) * (1.0 - cfg.top_k / cfg.n_experts)
    return rng.binomial(cfg.top_k, p).mean(axis=1)


# ---------------------------------------------------------------------------
# The K sweep
# ---------------------------------------------------------------------------


def _bucket(cfg: SimConfig, m: np.ndarray) -> np.ndarray:
    buckets = np.asarray(cfg.graph_buckets)
    pos = np.searchsorted(buckets, m)
    over = pos >= len(buckets)
    out = buckets[np.minimum(pos, len(buckets) - 1)]
    return np.where(over, m, out)


def _walk(accept_len: np.ndarray, n_tokens: int, K: int) -> np.ndarray:
    """Rounds of a K run, int64 (rounds, 3): state, accepted, emitted; the prefill (state 0, emits y_1) first."""
    rounds, n = [(0, 0, 1)], 1
    while n < n_tokens:
        a = min(K, int(accept_len[n]), n_tokens - n)
        rounds.append((n, a, min(a + 1, n_tokens - n)))
        n += rounds[-1][2]
    return np.array(rounds, dtype=np.int64)


def _stack_walks(walks: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The walks' rounds one after another: ``run`` (index into ``walks``), ``round``, ``state``, ``acc``,
    ``emit``, (rows,) each."""
    state, acc, emit = np.concatenate(walks).T
    return {"run": np.repeat(np.arange(len(walks)), [len(w) for w in walks]),
            "round": np.concatenate([np.arange(len(w)) for w in walks]), "state": state, "acc": acc, "emit": emit}


def _streams(seed: int, n: int = 5) -> list[np.random.Generator]:
    """Independent streams: references, routing, timing, layer offsets, the prefill tokens' routing and,
    in batch mode, expert ids and step timing (``spawn`` gives the same first children whatever n)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def layer_offsets(cfg: SimConfig, seed: int) -> np.ndarray:
    """The fixed per-layer routing-overlap offsets a run with ``seed`` uses (length ``n_layers``)."""
    return _streams(seed)[3].normal(0.0, cfg.rho_layer_sd, cfg.n_layers)


def expected_new_experts(cfg: SimConfig, seed: int) -> dict[str, float]:
    """Planted truth for the routing study: expected new experts per layer of a reference token, by
    context, for a run with ``seed``: :func:`_new_experts`' mean integrated over the token-level noise
    of ``rho`` and averaged over layers."""
    off = layer_offsets(cfg, seed)
    x = np.linspace(-8.0, 8.0, 3201)
    w = np.exp(-0.5 * x ** 2)
    w /= w.sum()
    out = {}
    for name, rho_c in cfg.context_rho.items():
        rho_tok = np.clip(rho_c + cfg.rho_token_sd * x, 0.0, 0.98)
        rho = np.clip(rho_tok[:, None] + off[None, :], 0.0, 0.98)
        per = cfg.top_k * (1.0 - rho) * (1.0 - cfg.top_k / cfg.n_experts)
        out[name] = float((w[:, None] * per).sum(axis=0).mean())
    return out


def config_from_meta(meta: dict[str, Any]) -> SimConfig:
    """The :class:`SimConfig` recorded in a simulated trace's meta.json."""
    raw = meta.get("simulator")
    if not meta.get("simulated") or not isinstance(raw, dict):
        raise SpeclimitsError("this trace is not simulated (meta.json has no 'simulator' section)")
    return SimConfig(**{k: v for k, v in raw.items() if k in CONFIG_FIELDS})


def _references(cfg: SimConfig, seed: int, progress: bool, layers: bool = False
                ) -> tuple[list[Reference], list[dict[str, np.ndarray]], dict[str, pd.DataFrame]]:
    """The draws both modes share: the prompts' references, their window data (:func:`_window_data`,
    ``layers`` as there; ``accept_len``, ``u_bar``, ``e_max``) and the ``oracle`` and ``tokens`` tables
    of the first ``oracle_prompts`` (no entry when there are none)."""
    rng_ref, rng_route, _, _, rng_prefill = _streams(seed)
    layer_off = layer_offsets(cfg, seed)
    cats = list(CATEGORIES)
    refs = [_make_reference(cfg, rng_ref, i, cats[i % len(cats)]) for i in range(cfg.n_prompts)]
    wins, oracle, tokens = [], [], []
    for i, ref in enumerate(tqdm(refs, desc="references", unit="prompt", disable=not progress)):
        win = _window_data(cfg, ref, rng_route, layer_off, layers=layers)
        wins.append({k: win[k] for k in ("accept_len", "u_bar", "e_max", "u_layers") if k in win})
        if i < cfg.oracle_prompts:
            oracle.append(_oracle_rows(cfg, ref, win))
            tokens.append(_token_rows(cfg, ref, rng_route, layer_off, rng_prefill))
    if not oracle:
        return refs, wins, {}
    return refs, wins, {"oracle": pd.concat(oracle, ignore_index=True), "tokens": pd.concat(tokens, ignore_index=True)}


def _passes(c: dict[str, np.ndarray], prompt_len: np.ndarray, K: Any) -> tuple[np.ndarray, ...]:
    """Per request-round of ``c`` (``prompt``, ``round``, ``state``): the prefill mask, the prompt length P,
    the rows m of the pass (P on the prefill, K + 1 after) and the context length (0 on the prefill)."""
    prefill = c["round"] == 0
    P = prompt_len[c["prompt"]]
    return prefill, P, np.where(prefill, P, K + 1), np.where(prefill, 0, P + c["state"])


def _prefill_experts(cfg: SimConfig, prompt_len: np.ndarray) -> np.ndarray:
    """Unique experts per layer of a prefill: routing over the whole prompt nearly saturates each layer."""
    return saturation_curve(np.maximum(prompt_len * 0.3, 1), cfg.n_experts, cfg.top_k)


def _spikes(rng: np.random.Generator, n: int, share: float, mean_ms: float) -> np.ndarray:
    """Rare timing spikes: exponential with mean ``mean_ms`` on about ``share`` of ``n`` records, else 0."""
    return (rng.random(n) < share) * rng.exponential(mean_ms, n)


def _draft_times(cfg: SimConfig, mean_ms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Drafter times around ``mean_ms`` (n,): relative normal noise plus spikes, at least 0.01 ms."""
    n = len(mean_ms)
    return np.maximum(mean_ms * (1 + rng.normal(0, cfg.draft_noise_rel, n))
                      + _spikes(rng, n, cfg.draft_spike_share, cfg.draft_spike_mean_ms), 0.01)


def _rounds_frame(refs: list[Reference], c: dict[str, np.ndarray], K: Any, m: np.ndarray, ctx: np.ndarray,
                  t_target: np.ndarray, t_draft: np.ndarray, u_bar: np.ndarray, e_max: np.ndarray, kv: np.ndarray,
                  bucket: np.ndarray, **extra: np.ndarray) -> pd.DataFrame:
    """``rounds`` in the contract's column order, then ``extra`` (the batch columns), from the request-rounds
    ``c`` (``gid``, ``prompt``, ``round``, ``acc``, ``emit``) and per-row values, (n,) each (``K`` may be one)."""
    prefill = c["round"] == 0

    def per_prompt(attr: str) -> np.ndarray:
        return np.array([getattr(r, attr) for r in refs], dtype=object)[c["prompt"]]

    return pd.DataFrame({
        "generation_id": c["gid"].astype(np.int64), "prompt_id": per_prompt("prompt_id"),
        "K": np.broadcast_to(K, m.shape).astype(np.int32), "m": m.astype(np.int32),
        "round": c["round"].astype(np.int32), "phase": np.where(prefill, "prefill", "decode").astype(object),
        "t_target_ms": t_target, "t_draft_ms": t_draft, "u_bar": u_bar, "e_max": e_max,
        "context_len": ctx.astype(np.int64), "kv_usage": kv, "graph_bucket": bucket.astype(np.int32),
        "n_draft": np.where(prefill, 0, K).astype(np.int32), "n_accepted": c["acc"].astype(np.int32),
        "n_emitted": c["emit"].astype(np.int32), "category": per_prompt("category"), **extra,
    })


def simulate(cfg: SimConfig, seed: int = 0, out: str | Path | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Generate a trace. Returns the tables; writes them with meta.json when ``out`` is given.

    Independent random streams (spawned from ``seed``) drive references, routing and timing,
    so changing a cost parameter leaves the routing and acceptance draws unchanged.
    """
    _check_config(cfg)
    refs, wins, tables = _references(cfg, seed, progress)
    rng = _streams(seed)[2]
    n_k0 = max(1, round(cfg.k0_share * cfg.n_prompts))  # K = 0 runs on the first k0_share of prompts
    runs = [(p, K) for p in range(cfg.n_prompts) for K in cfg.k_values if K > 0 or p < n_k0]
    walks = [_walk(wins[p]["accept_len"], refs[p].n, K) for p, K in runs]
    c = _stack_walks(walks)
    run_prompt, run_k = np.array(runs, dtype=np.int64).reshape(-1, 2).T
    c["gid"], c["prompt"], K = c["run"], run_prompt[c["run"]], run_k[c["run"]]
    prefill, P, m, L = _passes(c, np.array([r.prompt_len for r in refs]), K)
    # window data of every prompt stacked: row = the prompt's first row + state, column = K
    window_row = np.concatenate([[0], np.cumsum([r.n for r in refs])[:-1]])[c["prompt"]] + c["state"]
    sat = _prefill_experts(cfg, P)
    u_bar = np.where(prefill, np.maximum(sat, cfg.top_k), np.concatenate([w["u_bar"] for w in wins])[window_row, K])
    e_max = np.where(prefill, np.minimum(cfg.n_experts, np.maximum(u_bar, sat + 3)),
                     np.concatenate([w["e_max"] for w in wins])[window_row, K])
    dec, model = ~prefill, cfg.truth()
    t_target = np.empty(len(m))
    mean_t = model.target_ms(m[dec], u_bar[dec], L[dec])
    # heteroscedastic: passes touching more experts than usual for their m are noisier
    u_dec = u_bar[dec]
    u_rel = u_dec / pd.Series(u_dec).groupby(m[dec]).transform("mean").to_numpy()
    noise = (rng.standard_t(cfg.target_noise_df, dec.sum()) * cfg.target_noise_rel * mean_t
             * u_rel ** cfg.target_noise_u_power)
    t_target[dec] = np.maximum(mean_t + noise + _spikes(rng, dec.sum(), cfg.target_spike_share,
                                                        cfg.target_spike_mean_ms), 0.05)
    t_target[prefill] = (PREFILL_TARGET_MS[0]
                         + PREFILL_TARGET_MS[1] * P[prefill] * (1 + rng.normal(0, 0.02, prefill.sum())))
    t_draft = np.zeros(len(m))
    has_draft = dec & (K > 0)
    t_draft[has_draft] = _draft_times(cfg, model.draft_ms(K[has_draft]), rng)
    t_draft[prefill] = PREFILL_DRAFT_MS[0] + PREFILL_DRAFT_MS[1] * P[prefill]
    # zero timings (the paper saw 0.3% of records with one)
    t_target[dec & (rng.random(len(m)) < cfg.zero_target_share)] = 0.0
    t_draft[has_draft & (rng.random(len(m)) < cfg.zero_draft_share)] = 0.0
    kv = np.minimum(np.ceil((L + m) / cfg.kv_block_size) / cfg.kv_num_blocks, 1.0)
    bucket = np.where(prefill, P, _bucket(cfg, m))
    tables = {"rounds": _rounds_frame(refs, c, K, m, L, t_target, t_draft, u_bar, e_max, kv, bucket), **tables}
    if out is not None:
        write_trace(out, make_meta(cfg, seed), **tables)
    return tables


def _oracle_rows(cfg: SimConfig, ref: Reference, win: dict[str, np.ndarray]) -> pd.DataFrame:
    n = ref.n
    return pd.DataFrame({
        "seq_id": ref.prompt_id,
        "pos": np.arange(n, dtype=np.int64),
        "context_len": (ref.prompt_len + np.arange(n)).astype(np.int64),
        "match_prob": list(win["match"].astype(np.float32)),
        "draft_conf": list(win["conf"].astype(np.float32)),
        "accept_len": win["accept_len"].astype(np.int32),
        "u_bar_window": list(win["u_bar"]),
        "category": ref.category,
    })


def _token_text(t: int, context: int, script: int, offsets: dict[str, int], cyr_base: int) -> tuple[str, int]:
    """Synthetic text and id of token ``t`` (0-based reference index; -1 for the prefill's token)."""
    name = CONTEXT_NAMES[context]
    vocab = CONTEXT_PARAMS[name]["vocab"]
    if script == 1 and CONTEXT_MODES[name] != v.CODE:
        j = (t * 7 + context) % len(CYRILLIC_VOCAB)
        return CYRILLIC_VOCAB[j], cyr_base + j
    if vocab:
        j = (t * 7 + context) % len(vocab)
        return vocab[j], offsets[name] + j
    # a transition token: the first token of the new segment's mode
    return (" Ответ" if script == 1 else (" Note" if context == CONTEXT_NAMES.index(v.MODE_CHANGE) else " The"),
            offsets[name])


def _token_rows(cfg: SimConfig, ref: Reference, rng: np.random.Generator, layer_off: np.ndarray,
                rng_prefill: np.random.Generator) -> pd.DataFrame:
    """Per token (the methods page, "Reference kinds and positions"): row ``pos`` is the token the
    context ends with at Oracle state ``pos``. Row 0 is the prefill's token (the first segment's context
    and script; routing from ``rng_prefill``, its own stream, so every other draw is unchanged); rows
    1..N are the reference tokens ``y_1..y_N``. Columns: synthetic text, the planted context label, the
    script, new experts per layer against the previous token, the category and ``reference_kind``."""
    sizes = [max(len(CONTEXT_PARAMS[name]["vocab"]), 1) for name in CONTEXT_NAMES]
    offsets, base = dict(zip(CONTEXT_NAMES, np.cumsum([0] + sizes[:-1]).tolist())), sum(sizes)
    context = np.concatenate([ref.context[:1], ref.context])
    script = np.concatenate([ref.script[:1], ref.script])
    pairs = [_token_text(t, int(c), int(s), offsets, base) for t, c, s in zip(range(-1, ref.n), context, script)]
    return pd.DataFrame({
        "seq_id": ref.prompt_id,
        "pos": np.arange(ref.n + 1, dtype=np.int64),
        "token_id": np.asarray([i for _, i in pairs], dtype=np.int64),
        "text": [t for t, _ in pairs],
        "new_experts": np.concatenate([_new_experts(cfg, ref.rho_token[:1], rng_prefill, layer_off),
                                       _new_experts(cfg, ref.rho_token, rng, layer_off)]),
        "context": np.array(CONTEXT_NAMES, dtype=object)[context],
        "script": np.where(script == 1, v.CYRILLIC, v.LATIN).astype(object),
        "category": ref.category,
        "reference_kind": v.GREEDY,
    })


def make_meta(cfg: SimConfig, seed: int) -> dict[str, Any]:
    """meta.json for a simulated trace: says SIMULATED and carries the config and planted truth."""
    return new_meta(
        source="simulator",
        simulated=True,
        description=(
            "SIMULATED trace from the speclimits simulator. No model was run: timings, routing and "
            "acceptance are drawn from a generative model with a planted ground truth (see 'truth')."
        ),
        models={
            "target": {"name": "simulated MoE (Qwen3-Coder-30B-A3B-like)", "n_layers": cfg.n_layers,
                       "n_experts": cfg.n_experts, "top_k": cfg.top_k},
            "draft": {"name": "simulated EAGLE-3-like draft head"},
        },
        method="simulated",
        hardware="none (simulated)",
        dtype="n/a (simulated)",
        engine=None,
        k_values=list(cfg.k_values),
        seed=int(seed),
        batch_size=1,
        oracle={"k_max": cfg.k_max, "reference": "simulated target greedy output"},
        simulator=cfg.to_dict(),
        truth=cfg.cost_model,
        contexts=CONTEXT_NAMES,
    )


# ---------------------------------------------------------------------------
# Batch mode: b requests share every engine step
# ---------------------------------------------------------------------------

#: The planted per-request terms of the batch truth. **Simulator choices, not the paper's** (the
#: paper is at batch 1): one more request in a step costs the target ``gamma(m) = BATCH_GAMMA_BASE
#: + BATCH_GAMMA_PER_ROW * m`` ms besides its experts and context (its rows through attention,
#: norms, sampling and the step's bookkeeping), and the drafter ``BATCH_A_REQ * k + BATCH_B_REQ``
#: ms for k draft steps.
BATCH_GAMMA_BASE = 0.12
BATCH_GAMMA_PER_ROW = 0.035
BATCH_A_REQ = 0.03
BATCH_B_REQ = 0.06
#: Prompt tokens the simulated scheduler prefills per step (vLLM's ``max_num_batched_tokens``
#: analogue, no chunking): the prompts of a batch that do not fit wait for the next step, which
#: then mixes their prefill with the others' decoding.
BATCH_PREFILL_BUDGET = 2048


@dataclass(frozen=True)
class BatchSim:
    """The batch mode's own parameters (the rest is the :class:`SimConfig`): the batch sizes swept
    (prompts in file order, ``b`` per batch, the last may be smaller), the planted per-request terms and
    the prefill budget (defaults :data:`BATCH_GAMMA_BASE` ... :data:`BATCH_PREFILL_BUDGET`)."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    gamma_base: float = BATCH_GAMMA_BASE
    gamma_per_row: float = BATCH_GAMMA_PER_ROW
    a_req: float = BATCH_A_REQ
    b_req: float = BATCH_B_REQ
    prefill_budget: int = BATCH_PREFILL_BUDGET

    def truth(self, cfg: SimConfig) -> BatchCostModel:
        """The planted :class:`~speclimits.costmodel.BatchCostModel`: ``cfg.truth()`` plus this object's
        per-request terms."""
        base = cfg.truth()
        return BatchCostModel.from_batch1(
            replace(base, source="planted truth of the speclimits simulator, batch mode: batch-1 part from the "
                                 "paper's appendix, per-request terms (gamma, a_req, b_req) simulator choices"),
            n_experts=cfg.n_experts, top_k=cfg.top_k,
            gamma={m: round(self.gamma_base + self.gamma_per_row * m, 6) for m in base.ms},
            a_req=self.a_req, b_req=self.b_req)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "batch_sizes": list(self.batch_sizes)}


def _check_batch(batch: BatchSim) -> tuple[int, ...]:
    sizes = tuple(sorted({int(b) for b in batch.batch_sizes}))
    if not sizes or sizes[0] < 1:
        raise SpeclimitsError(f"batch sizes must be positive integers, got {list(batch.batch_sizes)}")
    if batch.prefill_budget < 1:
        raise SpeclimitsError(f"prefill_budget must be >= 1, got {batch.prefill_budget}")
    return sizes


def _expert_sets(sizes: np.ndarray, n_experts: int, rng: np.random.Generator) -> np.ndarray:
    """Expert ids drawn for each (row, layer): a uniformly random set of ``sizes[row, layer]`` of the
    ``n_experts`` experts (as the window process draws them given the size), packed (uint8 (rows,
    layers, ceil(E / 8)), bit e = expert e): the experts of the ``size`` smallest uniform keys."""
    rows, n_layers = sizes.shape
    out = np.empty((rows, n_layers, (n_experts + 7) // 8), dtype=np.uint8)
    chunk = max(1, 200_000 // max(n_layers * n_experts // 64, 1))
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        keys = rng.random((hi - lo, n_layers, n_experts), dtype=np.float32)
        rank = np.empty(keys.shape, dtype=np.int16)
        np.put_along_axis(rank, np.argsort(keys, axis=-1), np.arange(n_experts, dtype=np.int16)[None, None, :], axis=-1)
        out[lo:hi] = np.packbits(rank < sizes[lo:hi, :, None], axis=-1)
    return out


def _prefill_steps(prompt_len: np.ndarray, budget: int) -> np.ndarray:
    """Step (0-based, within its batch) at which each request of a batch is prefilled: in order,
    as many prompts per step as fit in ``budget`` tokens (at least one per step; decoding
    requests' rows are few and not counted)."""
    out = np.empty(len(prompt_len), dtype=np.int64)
    step, used = 0, 0
    for i, p in enumerate(prompt_len):
        if used and used + p > budget:
            step, used = step + 1, 0
        out[i] = step
        used += int(p)
    return out


def simulate_batch(cfg: SimConfig, batch: BatchSim | None = None, seed: int = 0, out: str | Path | None = None,
                   progress: bool = True) -> dict[str, pd.DataFrame]:
    """Generate a SIMULATED batch trace: every K of ``cfg.k_values`` at every batch size of
    ``batch.batch_sizes``, closed batches of prompts in file order, in the batch-trace contract.

    Tables: ``rounds`` (per request and round, plus ``b``, ``batch_id``, ``step``, ``n_drafted_next``;
    timings are the shared step's), ``steps`` (one row per engine step), and ``oracle`` / ``tokens``
    exactly as :func:`simulate` writes them for the same ``cfg`` and ``seed``.

    * **Requests**: a request's rounds are the batch-1 walk of its reference at K (greedy decoding).
    * **Steps**: prompts are prefilled in order, :attr:`BatchSim.prefill_budget` prompt tokens per step
      (a step that prefills some and decodes others is ``mixed``); then every unfinished request
      verifies K drafts per step.
    * **Routing**: each request-round draws expert ids per layer independently (:func:`_expert_sets`;
      a prefill ``saturation(0.3 P)`` per layer); a step's ``u_bar`` / ``e_max`` are the mean / max over
      layers of the union of its rows' ids.
    * **Cost**: :meth:`BatchSim.truth`'s ``target(n_decode, K + 1, Ū of the decoding rows, their context)``
      times ``1 + target_noise_rel * t(target_noise_df)``, plus spikes and zero timings as in :func:`simulate`,
      plus :data:`PREFILL_TARGET_MS` per prefill token (its base on a prefill-only step; 2% noise); drafter
      ``draft(n_reqs, K)`` likewise, plus :data:`PREFILL_DRAFT_MS`'s per-token term.

    ``batch_sizes == (1,)`` still gives a batch trace; the CLI's ``--batch 1`` writes :func:`simulate`'s.
    """
    batch = batch or BatchSim()
    sizes = _check_batch(batch)
    _check_config(cfg)
    truth = batch.truth(cfg)
    # the first five streams are simulate()'s (same references, routing, Oracle and token rows)
    refs, wins, tables = _references(cfg, seed, progress, layers=True)
    rng_ids, rng_time = _streams(seed, 7)[5:]
    E, L, n = cfg.n_experts, cfg.n_layers, cfg.n_prompts
    prompt_len = np.array([r.prompt_len for r in refs], dtype=np.int64)
    pre_size = np.clip(np.round(_prefill_experts(cfg, prompt_len)), cfg.top_k, E).astype(np.int64)
    prefill_sets = _expert_sets(np.repeat(pre_size[:, None], L, axis=1), E, rng_ids)
    round_parts, step_parts, step_counter = [], [], 0
    bar = tqdm(total=len(cfg.k_values) * len(sizes), desc="batch sweep", unit="(K, b)", disable=not progress)
    for k_index, K in enumerate(cfg.k_values):
        walks = [_walk(w["accept_len"], ref.n, K) for w, ref in zip(wins, refs)]
        n_rounds = np.array([len(w) for w in walks], dtype=np.int64)
        c = _stack_walks(walks)
        c["prompt"] = c["run"]
        u_dec = np.concatenate([w["u_layers"][walk[1:, 0], :, K] for w, walk in zip(wins, walks)])
        sets = np.concatenate([prefill_sets, _expert_sets(u_dec, E, rng_ids)])  # rows: prompts, then decode rounds
        own_u = np.concatenate([np.repeat(pre_size[:, None], L, axis=1), u_dec]).astype(np.float64)
        c["set_row"] = np.where(c["round"] == 0, c["prompt"], n + np.cumsum(c["round"] > 0) - 1)
        for b_index, b in enumerate(sizes):
            gid0 = (b_index * len(cfg.k_values) + k_index) * n
            first_step = np.empty(n, dtype=np.int64)  # engine step of each request's prefill
            for first in range(0, n, b):
                batch_of = slice(first, min(first + b, n))
                first_step[batch_of] = step_counter + _prefill_steps(prompt_len[batch_of], batch.prefill_budget)
                step_counter = int((first_step[batch_of] + n_rounds[batch_of]).max())
            cb = {**c, "gid": gid0 + c["prompt"], "batch_id": gid0 + c["prompt"] // b * b,
                  "step": first_step[c["prompt"]] + c["round"]}
            rr, ss = _batch_tables(cfg, truth, refs, K, b, cb, sets, own_u, prompt_len, rng_time)
            round_parts.append(rr)
            step_parts.append(ss)
            bar.update()
    bar.close()
    rounds = pd.concat(round_parts, ignore_index=True).sort_values(["generation_id", "round"], kind="stable")
    steps = pd.concat(step_parts, ignore_index=True).sort_values(["batch_id", "step"], kind="stable")
    tables = {"rounds": rounds.reset_index(drop=True), "steps": steps.reset_index(drop=True), **tables}
    if out is not None:
        write_trace(out, make_batch_meta(cfg, batch, seed), **tables)
    return tables


def _batch_tables(cfg: SimConfig, truth: BatchCostModel, refs: list[Reference], K: int, b: int,
                  c: dict[str, np.ndarray], sets: np.ndarray, own_u: np.ndarray, prompt_len: np.ndarray,
                  rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rounds and steps of one (K, b) sweep from its request-rounds ``c`` (see :func:`simulate_batch`)."""
    prefill, P, m, ctx = _passes(c, prompt_len, K)
    order = np.lexsort((c["prompt"], c["step"]))
    step_ids, starts = np.unique(c["step"][order], return_index=True)
    step_of_row = np.empty(len(order), dtype=np.int64)
    step_of_row[order] = np.searchsorted(step_ids, c["step"][order])
    n_steps = len(step_ids)

    def per_step(values: np.ndarray) -> np.ndarray:
        return np.bincount(step_of_row, weights=values, minlength=n_steps)

    def union_counts(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The steps of ``rows`` (sorted by step) and, per step and layer, the experts in the union of their sets."""
        at, firsts = np.unique(step_of_row[rows], return_index=True)
        union = np.bitwise_or.reduceat(sets[c["set_row"][rows]], firsts, axis=0)
        return at, np.bitwise_count(union).sum(axis=-1, dtype=np.int64)

    n_reqs = np.bincount(step_of_row, minlength=n_steps)
    n_decode = np.bincount(step_of_row, weights=~prefill, minlength=n_steps).astype(np.int64)
    n_tokens = per_step(m).astype(np.int64)
    m_max = np.maximum.reduceat(m[order], starts).astype(np.int64)
    prompt_rows = per_step(np.where(prefill, P, 0)).astype(np.int64)
    ctx_total = per_step(ctx).astype(np.int64)
    ctx_decode = per_step(np.where(prefill, 0, ctx))
    u_layers = union_counts(order)[1].astype(float)  # (steps, layers): unique experts over all rows of the step
    dec_rows = order[~prefill[order]]
    u_decode = np.zeros(n_steps)
    if dec_rows.size:
        d_steps, d_u = union_counts(dec_rows)
        u_decode[d_steps] = d_u.mean(axis=1)
    phase = np.where(n_decode == n_reqs, "decode", np.where(n_decode == 0, "prefill", "mixed")).astype(object)
    has_dec = n_decode > 0
    # target time of the step
    mean_t = np.zeros(n_steps)
    if has_dec.any():
        mean_t[has_dec] = truth.target_ms(n_decode[has_dec], np.full(has_dec.sum(), K + 1), u_decode[has_dec],
                                          ctx_decode[has_dec])
    noise = rng.standard_t(cfg.target_noise_df, n_steps) * cfg.target_noise_rel
    spikes = _spikes(rng, n_steps, cfg.target_spike_share, cfg.target_spike_mean_ms)
    pre_noise = 1 + rng.normal(0, 0.02, n_steps)
    t_target = np.where(has_dec, np.maximum(mean_t * (1 + noise) + spikes, 0.05), PREFILL_TARGET_MS[0] * pre_noise)
    t_target += PREFILL_TARGET_MS[1] * prompt_rows * pre_noise
    zero_t = has_dec & (rng.random(n_steps) < cfg.zero_target_share)
    t_target[zero_t] = 0.0
    # drafter time of the step
    t_draft = np.zeros(n_steps)
    if K > 0:
        t_draft = (_draft_times(cfg, truth.draft_ms(n_reqs, np.full(n_steps, K)), rng)
                   + PREFILL_DRAFT_MS[1] * prompt_rows)
        t_draft[has_dec & (rng.random(n_steps) < cfg.zero_draft_share)] = 0.0
    kv_blocks = per_step(np.ceil((ctx + m) / cfg.kv_block_size))
    kv = np.minimum(kv_blocks / cfg.kv_num_blocks, 1.0)
    bucket = np.where(phase == "decode", _bucket(cfg, n_tokens), n_tokens)
    first = order[starts]
    steps = pd.DataFrame({
        "batch_id": c["batch_id"][first].astype(np.int64), "b": np.full(n_steps, b, dtype=np.int64),
        "K": np.full(n_steps, K, dtype=np.int64), "step": step_ids.astype(np.int64),
        "n_reqs": n_reqs.astype(np.int64), "n_decode": n_decode, "n_tokens": n_tokens, "m_max": m_max,
        "u_bar": u_layers.mean(axis=1), "e_max": u_layers.max(axis=1), "context_total": ctx_total,
        "t_target_ms": t_target, "t_draft_ms": t_draft, "graph_bucket": bucket.astype(np.int64), "kv_usage": kv,
        "phase": phase, "n_drafted_next": (K * n_reqs).astype(np.int64),
    })
    own = own_u[c["set_row"]]
    rounds = _rounds_frame(refs, c, K, m, ctx, t_target[step_of_row], t_draft[step_of_row], own.mean(axis=1),
                           own.max(axis=1), kv[step_of_row], bucket[step_of_row], b=np.full(len(m), b, dtype=np.int64),
                           batch_id=c["batch_id"].astype(np.int64), step=c["step"].astype(np.int64),
                           n_drafted_next=np.full(len(m), K, dtype=np.int64))
    return rounds, steps


def make_batch_meta(cfg: SimConfig, batch: BatchSim, seed: int) -> dict[str, Any]:
    """meta.json of a simulated batch trace: :func:`make_meta`'s, with the batch sweep, the planted
    :class:`BatchCostModel` as ``truth`` and the batch mode's parameters under ``batch_simulator``."""
    sizes = _check_batch(batch)
    meta = make_meta(cfg, seed)
    meta.update(
        description=(
            "SIMULATED batch trace from the speclimits simulator: b requests share every engine step "
            "(batch sizes " + ", ".join(map(str, sizes)) + "). No model was run: timings, routing and acceptance "
            "are drawn from a generative model with a planted ground truth (see 'truth'; its per-request terms "
            "gamma, a_req, b_req are simulator choices, not the paper's)."),
        batch_sizes=list(sizes),
        batch_size=int(max(sizes)),
        truth=batch.truth(cfg).to_dict(),
        batch_simulator={**batch.to_dict(), "prefill_target_ms": list(PREFILL_TARGET_MS),
                         "prefill_draft_ms": list(PREFILL_DRAFT_MS),
                         "note": "k0_share is not used: every prompt runs at every K and batch size"},
    )
    return meta
