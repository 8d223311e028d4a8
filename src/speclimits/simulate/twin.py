"""A seeded "digital twin" of the paper's setting that writes traces with a planted truth.

Everything the simulator does is driven by one :class:`SimConfig`, written whole into the
trace's ``meta.json`` (``source: "simulator"``, ``simulated: true``) together with the planted
cost model, so a fit on the trace can be checked against the truth that produced it.

Generative story
----------------
1. **Prompts.** Each prompt has a category (14, as in the paper's leave-one-category-out), a
   prompt length ``P`` and a reference continuation of ``N`` tokens: the target's greedy
   output, which at greedy decoding is the same for every K.
2. **Latent text context.** The continuation is a chain of segments (code / prose / markup,
   Latin or Cyrillic script). Each token carries one context label (``code_format``,
   ``prose_vocab``, ``script_change``, ...), which sets its draft match probability and its
   routing overlap with the preceding tokens.
3. **Acceptance.** At state ``n`` the draft's step ``i`` matches ``y_{n+i}`` with probability
   ``q_{n,i} = q(y_{n+i}) * depth_decay**(i-1)`` given the chain matched so far; the greedy
   match length ``accept_len[n]`` is drawn once from these, so every K run of the prompt sees
   the same acceptance pattern, as greedy decoding does.
4. **Routing.** Per MoE layer a token routes to ``top_k`` of ``n_experts`` experts. A new
   position adds ``Binomial(top_k, (1 - rho) * (1 - U / n_experts))`` experts to the ``U``
   already touched in that layer, where ``rho`` is the token's overlap with its neighbours
   (context-dependent, plus a fixed per-layer offset). ``u_bar`` averages ``U`` over layers,
   ``e_max`` is the largest. The window ``[y_n, d_1..d_k]`` uses the reference token's overlap
   for matched drafts and, after the first mismatch (the junk tail), the same overlap plus
   ``junk_rho_shift``.
5. **Cost.** ``T_T = beta0(m) + alpha(m) * u_bar + c * L + noise`` (noise multiplicative,
   Student-t, with a spread that grows with ``(u_bar / mean u_bar at m) ** target_noise_u_power``,
   plus rare spikes); ``T_D = a * K + b + noise`` with rare
   large spikes; a small share of records gets a zero timing, as the paper saw.

Tables written: ``rounds.parquet`` (the K sweep, prefill rounds included), ``oracle.parquet``
(dense per-position data for the Oracle) and ``tokens.parquet`` (per-token text, latent
context and new experts per layer, for the routing and linguistic studies; one row more per
sequence than the Oracle has states: row ``pos`` is the token the context ends with at state
``pos``, as in the vLLM harness, see :func:`_token_rows`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits import paper
from speclimits.costmodel import CostModel
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


def paper_cost_model() -> dict[str, Any]:
    """The planted truth of the ``paper`` preset, in cost-model JSON form, read from :mod:`speclimits.paper`.

    ``alpha(m)`` spans :data:`~speclimits.paper.ALPHA_SMALL` over m = 2..4 and
    :data:`~speclimits.paper.ALPHA_LARGE` over m = 5..11; ``beta0`` spans
    :data:`~speclimits.paper.BETA0_SMALL` over m = 2..4 then drops to
    :data:`~speclimits.paper.BETA0_LARGE_START`; ``c`` is the middle of
    :data:`~speclimits.paper.C_RANGE` to two significant figures (1.1e-3 ms/token); the draft line
    is :data:`~speclimits.paper.DRAFT`'s ``a`` and ``b``. Where the appendix gives only a range, the
    shape inside it is this module's (:data:`LARGE_ALPHA_POSITION`, :data:`LARGE_BETA0_STEP`);
    m = 1 (plain decoding, K = 0) is not in the paper and is planted in the small regime.
    """
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
    """Every parameter of the simulator. Presets are instances; override with ``replace``.

    Sizes
        ``n_prompts`` prompts; each runs once per K in ``k_values`` (K = 0 is plain decoding,
        run on the first ``k0_share`` of prompts); ``oracle_prompts`` of them get dense
        Oracle rows (``k_max`` drafts per state) and token rows.
    """

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

    def truth(self) -> CostModel:
        """The planted cost model."""
        return CostModel.from_dict(self.cost_model, origin="simulator cost_model")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["k_values"] = list(self.k_values)
        out["graph_buckets"] = list(self.graph_buckets)
        return out


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


def preset(name: str, **overrides: Any) -> SimConfig:
    """A named preset with optional field overrides (unknown names raise)."""
    if name not in PRESETS:
        raise SpeclimitsError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    valid = {f.name for f in fields(SimConfig)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise SpeclimitsError(f"unknown simulator parameter(s) {bad}; valid: {sorted(valid)}")
    if "k_values" in overrides:
        overrides["k_values"] = tuple(int(k) for k in overrides["k_values"])
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


def _window_data(cfg: SimConfig, ref: Reference, rng: np.random.Generator, layer_off: np.ndarray) -> dict[str, np.ndarray]:
    """Per state n: match probs, draft confidence, greedy match length, and window routing."""
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
    u_sum, u_max = _window_routing(cfg, rho, rng, layer_off)
    return dict(match=match, conf=conf, accept_len=accept_len, u_bar=u_sum / cfg.n_layers, e_max=u_max)


def _window_routing(cfg: SimConfig, rho: np.ndarray, rng: np.random.Generator, layer_off: np.ndarray):
    """Unique experts per layer over windows of 1..k_max+1 positions.

    ``rho`` has shape (states, k_max): the overlap of window positions 1..k_max. Returns
    ``(sum over layers, max over layers)``, each (states, k_max + 1).
    """
    s, kmax = rho.shape
    E, k = cfg.n_experts, cfg.top_k
    u = np.full((s, cfg.n_layers), k, dtype=np.float32)
    u_sum = np.empty((s, kmax + 1), dtype=np.float64)
    u_max = np.empty((s, kmax + 1), dtype=np.float64)
    u_sum[:, 0], u_max[:, 0] = k * cfg.n_layers, k
    for j in range(kmax):
        p = (1.0 - np.clip(rho[:, j:j + 1] + layer_off[None, :], 0.0, 0.98)) * (1.0 - u / E)
        u += rng.binomial(k, np.clip(p, 0.0, 1.0)).astype(np.float32)
        u_sum[:, j + 1] = u.sum(axis=1)
        u_max[:, j + 1] = u.max(axis=1)
    return u_sum, u_max


def _new_experts(cfg: SimConfig, ref: Reference, rng: np.random.Generator, layer_off: np.ndarray) -> np.ndarray:
    """Experts per layer at token n not used at token n-1 (layer average), length N."""
    rho = np.clip(ref.rho_token[:, None] + layer_off[None, :], 0.0, 0.98)
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


def _walk(accept_len: np.ndarray, n_tokens: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """States visited by a K run after the prefill (which emits y_1): (state, accepted, emitted)."""
    states, acc, emit = [], [], []
    n = 1
    while n < n_tokens:
        a = min(K, int(accept_len[n]), n_tokens - n)
        e = min(a + 1, n_tokens - n)
        states.append(n)
        acc.append(a)
        emit.append(e)
        n += e
    return np.asarray(states, dtype=np.int64), np.asarray(acc, dtype=np.int64), np.asarray(emit, dtype=np.int64)


def _streams(seed: int) -> list[np.random.Generator]:
    """The simulator's independent random streams: references, routing, timing, layer offsets and
    the prefill tokens' routing (row 0 of ``tokens``). The fifth was added after the first four:
    ``SeedSequence.spawn`` gives the same first children whatever the count, so the others did
    not change."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]


def layer_offsets(cfg: SimConfig, seed: int) -> np.ndarray:
    """The fixed per-layer routing-overlap offsets a run with ``seed`` uses (length ``n_layers``)."""
    return _streams(seed)[3].normal(0.0, cfg.rho_layer_sd, cfg.n_layers)


def expected_new_experts(cfg: SimConfig, seed: int) -> dict[str, float]:
    """Planted truth for the routing study: expected new experts per layer of a reference token
    (against the previous token), by context, for a run with ``seed``.

    Integrates ``top_k * (1 - clip(rho_token + off_l)) * (1 - top_k / n_experts)`` over the
    token-level noise ``rho_token ~ clip(N(rho_context, rho_token_sd), 0, 0.98)`` and averages
    over layers, exactly as :func:`_new_experts` draws it.
    """
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
    valid = {f.name for f in fields(SimConfig)}
    kwargs = {k: v for k, v in raw.items() if k in valid}
    for key in ("k_values", "graph_buckets"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    return SimConfig(**kwargs)


def simulate(cfg: SimConfig, seed: int = 0, out: str | Path | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Generate a trace. Returns the tables; writes them with meta.json when ``out`` is given.

    Independent random streams (spawned from ``seed``) drive references, routing and timing,
    so changing a cost parameter leaves the routing and acceptance draws unchanged.
    """
    _check_config(cfg)
    rng_ref, rng_route, rng_time, _, rng_prefill = _streams(seed)
    layer_off = layer_offsets(cfg, seed)
    cats = list(CATEGORIES)
    refs = [_make_reference(cfg, rng_ref, i, cats[i % len(cats)]) for i in range(cfg.n_prompts)]

    model = cfg.truth()
    rows: dict[str, list[np.ndarray]] = {k: [] for k in (
        "generation_id", "prompt", "K", "round", "state", "n_draft", "n_accepted", "n_emitted", "u_bar", "e_max",
        "prefill")}
    oracle_parts, token_parts = [], []
    gen_id = 0
    bar = tqdm(refs, desc="simulate", unit="prompt", disable=not progress)
    for p_idx, ref in enumerate(bar):
        win = _window_data(cfg, ref, rng_route, layer_off)
        for K in cfg.k_values:
            if K == 0 and p_idx >= max(1, round(cfg.k0_share * cfg.n_prompts)):
                continue
            states, acc, emit = _walk(win["accept_len"], ref.n, K)
            r = len(states)
            rows["generation_id"].append(np.full(r + 1, gen_id))
            rows["prompt"].append(np.full(r + 1, p_idx))
            rows["K"].append(np.full(r + 1, K))
            rows["round"].append(np.arange(r + 1))
            rows["state"].append(np.concatenate([[0], states]))
            rows["n_draft"].append(np.concatenate([[0], np.full(r, K)]))
            rows["n_accepted"].append(np.concatenate([[0], acc]))
            rows["n_emitted"].append(np.concatenate([[1], emit]))
            rows["u_bar"].append(np.concatenate([[np.nan], win["u_bar"][states, K]]))
            rows["e_max"].append(np.concatenate([[np.nan], win["e_max"][states, K]]))
            prefill = np.zeros(r + 1, dtype=bool)
            prefill[0] = True
            rows["prefill"].append(prefill)
            gen_id += 1
        if p_idx < cfg.oracle_prompts:
            oracle_parts.append(_oracle_rows(cfg, ref, win))
            token_parts.append(_token_rows(cfg, ref, rng_route, layer_off, rng_prefill))

    cols = {k: np.concatenate(v) for k, v in rows.items()}
    rounds = _finish_rounds(cfg, refs, cols, model, rng_time)
    tables = {"rounds": rounds}
    if oracle_parts:
        tables["oracle"] = pd.concat(oracle_parts, ignore_index=True)
        tables["tokens"] = pd.concat(token_parts, ignore_index=True)
    if out is not None:
        write_trace(out, make_meta(cfg, seed), **tables)
    return tables


def _finish_rounds(cfg: SimConfig, refs: list[Reference], cols: dict[str, np.ndarray], model: CostModel,
                   rng: np.random.Generator) -> pd.DataFrame:
    n = len(cols["K"])
    prefill = cols["prefill"]
    K = cols["K"]
    prompt_len = np.array([r.prompt_len for r in refs])[cols["prompt"]]
    L = np.where(prefill, 0, prompt_len + cols["state"])
    m = np.where(prefill, prompt_len, K + 1)
    # prefill: routing over the whole prompt nearly saturates each layer
    sat = cfg.n_experts * (1 - (1 - cfg.top_k / cfg.n_experts) ** np.maximum(prompt_len * 0.3, 1))
    u_bar = np.where(prefill, np.maximum(sat, cfg.top_k), cols["u_bar"])
    e_max = np.where(prefill, np.minimum(cfg.n_experts, np.maximum(u_bar, sat + 3)), cols["e_max"])
    dec = ~prefill
    t_target = np.empty(n)
    mean_t = model.target_ms(m[dec], u_bar[dec], L[dec])
    # heteroscedastic: passes touching more experts than usual for their m are noisier
    u_dec = u_bar[dec]
    u_rel = u_dec / pd.Series(u_dec).groupby(m[dec]).transform("mean").to_numpy()
    noise = (rng.standard_t(cfg.target_noise_df, dec.sum()) * cfg.target_noise_rel * mean_t
             * u_rel ** cfg.target_noise_u_power)
    spikes = (rng.random(dec.sum()) < cfg.target_spike_share) * rng.exponential(cfg.target_spike_mean_ms, dec.sum())
    t_target[dec] = np.maximum(mean_t + noise + spikes, 0.05)
    t_target[prefill] = 12.0 + 0.04 * prompt_len[prefill] * (1 + rng.normal(0, 0.02, prefill.sum()))
    t_draft = np.zeros(n)
    has_draft = dec & (K > 0)
    mean_d = model.draft_ms(K[has_draft])
    nd = has_draft.sum()
    t_draft[has_draft] = np.maximum(
        mean_d * (1 + rng.normal(0, cfg.draft_noise_rel, nd))
        + (rng.random(nd) < cfg.draft_spike_share) * rng.exponential(cfg.draft_spike_mean_ms, nd), 0.01)
    t_draft[prefill] = 0.8 + 0.004 * prompt_len[prefill]
    # zero timings (the paper saw 0.3% of records with one)
    t_target[dec & (rng.random(n) < cfg.zero_target_share)] = 0.0
    t_draft[has_draft & (rng.random(n) < cfg.zero_draft_share)] = 0.0
    kv = np.ceil((L + np.where(prefill, prompt_len, m)) / cfg.kv_block_size) / cfg.kv_num_blocks
    bucket = np.where(prefill, prompt_len, _bucket(cfg, m))
    return pd.DataFrame({
        "generation_id": cols["generation_id"].astype(np.int64),
        "prompt_id": np.array([r.prompt_id for r in refs], dtype=object)[cols["prompt"]],
        "K": K.astype(np.int32),
        "m": m.astype(np.int32),
        "round": cols["round"].astype(np.int32),
        "phase": np.where(prefill, "prefill", "decode").astype(object),
        "t_target_ms": t_target,
        "t_draft_ms": t_draft,
        "u_bar": u_bar,
        "e_max": e_max,
        "context_len": L.astype(np.int64),
        "kv_usage": np.minimum(kv, 1.0),
        "graph_bucket": bucket.astype(np.int32),
        "n_draft": cols["n_draft"].astype(np.int32),
        "n_accepted": cols["n_accepted"].astype(np.int32),
        "n_emitted": cols["n_emitted"].astype(np.int32),
        "category": np.array([r.category for r in refs], dtype=object)[cols["prompt"]],
    })


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
    context ends with at Oracle state ``pos``, so state ``pos`` drafts row ``pos + 1`` first.

    Row 0 is the token the simulated prefill emitted before state 0 (it continues the first
    segment: same planted context and script as the first reference token; its routing is drawn
    from ``rng_prefill``, a stream of its own, so that every other draw is unchanged); rows
    1..N are the reference tokens ``y_1..y_N`` that states 0..N-1 draft. Columns: synthetic text
    from the context's vocabulary, the planted context label, the script, the new experts per
    layer against the previous token, the category and ``reference_kind`` (``greedy``).
    """
    offsets = {}
    base = 0
    for name in CONTEXT_NAMES:
        offsets[name] = base
        base += max(len(CONTEXT_PARAMS[name]["vocab"]), 1)
    context = np.concatenate([ref.context[:1], ref.context])
    script = np.concatenate([ref.script[:1], ref.script])
    pairs = [_token_text(t, int(c), int(s), offsets, base) for t, c, s in zip(range(-1, ref.n), context, script)]
    rho0 = np.clip(ref.rho_token[0] + layer_off, 0.0, 0.98)
    first = rng_prefill.binomial(cfg.top_k, (1.0 - rho0) * (1.0 - cfg.top_k / cfg.n_experts)).mean()
    return pd.DataFrame({
        "seq_id": ref.prompt_id,
        "pos": np.arange(ref.n + 1, dtype=np.int64),
        "token_id": np.asarray([i for _, i in pairs], dtype=np.int64),
        "text": [t for t, _ in pairs],
        "new_experts": np.concatenate([[first], _new_experts(cfg, ref, rng, layer_off)]),
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
            "SIMULATED trace from the speclimits digital twin. No model was run: timings, routing and "
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
