"""K sweeps on the real vLLM engine, written as they run, resumable.

The files are owned by :mod:`speclimits.trace.io` (:mod:`speclimits.tracing.ray_sweep` runs the same jobs on
Ray, one part per job, its log lines in ``shards/<name>.json``). One engine per K (K = 0: plain decoding),
greedy, or sampled at the sweep's temperature and top-p with a seed per request
(:mod:`speclimits.trace.sampling`). Finished generations are buffered and written every ``flush_every``
generations or ``flush_seconds`` seconds and at the end of each K (and b), as one *part* named after its
first generation id, each file atomic, in this order: ``tokens.parquet`` (when tokens are kept),
``steps.parquet`` (batch sweeps), ``generations.jsonl``, ``parts.jsonl`` (a part's generation ids and
vLLM's counter deltas over them), ``rounds.parquet`` last: a generation is done once its rounds are on
disk, so a killed sweep is a valid partial trace and ``resume=True`` runs only the generations without
rounds. Generation ids are fixed by position: ``gid = (b_index * n_K + k_index) * n_prompts + prompt_index``.

Batch sweeps (``--batch 1,2,4,8``): batch j of size b holds prompts ``j*b .. (j+1)*b - 1`` in file order,
submitted together in one ``generate()`` (``max_num_seqs`` = the largest b); ``batch_id`` is the gid of its
first generation; parts hold whole batches of one (b, K). With ``batch_sizes = [1]`` (the default) the trace
is the batch-1 trace: no ``b`` / ``batch_id`` columns, no ``steps`` table, no ``batch_sizes`` in meta.json.

Cross-check: vLLM's cumulative counters (``get_metrics()``, ~5 ms a read) are read after the warm-up and at
every flush, so each part's drafted / accepted totals are checked exactly against the counter deltas over
the same generations. ``check_counters="generation"`` reads them after every generation (every batch in a
batch sweep, the counters being engine-wide) and records the delta (``vllm``, or ``vllm_batch``).

Columns: those of :mod:`speclimits.trace.schema` plus :data:`~speclimits.tracing.records.ROUND_COLUMNS` /
``TOKEN_COLUMNS`` (conventions there; ``step`` restarts with each engine: only its order and differences
within a batch mean anything). By default only each prompt's reference generation (the smallest K, at the smallest batch size) keeps its
tokens; ``tokens="all"`` keeps every K (and b), ``"none"`` none. The Oracle pass
(:mod:`speclimits.tracing.oracle_mode`) then rewrites the reference rows.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from speclimits.errors import SpeclimitsError
from speclimits.vocabulary import DEFAULT_DTYPE
from speclimits.machine import cpu_info
from speclimits.trace.io import (GENERATIONS_LOG, PARTS_LOG, append_lines, columns_table, done_generations,
                                 list_parts, new_meta, part_name, read_generations, read_meta, read_parts_log,
                                 remove_orphan_parts, target_top_k, write_meta, write_part, write_shard_log)
from speclimits.trace.sampling import Sampling
from speclimits.tracing import engine as eng
from speclimits.tracing.prompts import Prompt, read_prompts, tokenize
from speclimits.tracing.inputs import check_sampling_values, model_config
from speclimits.tracing.records import generation_columns, step_columns, steps_by_request

#: Settings that must match for ``resume`` to continue a trace.
RESUME_KEYS = ("target", "draft", "method", "k_values", "prompts_sha256", "max_tokens", "seed", "dtype",
               "load_format", "tokens", "ignore_eos", "chat_template", "limit", "spec_extra", "batch_sizes",
               "plant_routing", "sampling")


@dataclass
class SweepConfig:
    """Everything a sweep needs; ``speclimits trace`` builds one from its flags."""

    target: str
    prompts: str
    out: str
    method: str = "draft_model"
    draft: str | None = None
    k_values: list[int] = field(default_factory=lambda: [1, 2, 3])
    max_tokens: int = 128
    seed: int = 0
    dtype: str = DEFAULT_DTYPE
    load_format: str = "auto"
    tokens: str = "ref"
    ignore_eos: bool = False
    chat_template: bool = True
    limit: int | None = None
    resume: bool = False
    progress: bool = True
    block_size: int | None = None
    max_model_len: int | None = None
    spec_extra: dict[str, Any] = field(default_factory=dict)
    engine_extra: dict[str, Any] = field(default_factory=dict)
    flush_every: int = 32  # write a part after this many buffered generations, or once the oldest is
    flush_seconds: float = 5.0  # this many seconds old (and at the end of each K)
    check_counters: str = "part"  # or "generation": vLLM's counters after every generation (batch)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # --batch; [1]: the batch-1 trace
    plant_routing: int | None = None  # --plant-routing SEED: the designed experiment (speclimits_install)
    dtype_choice: dict[str, Any] | None = None  # machine.DtypeChoice.record(), kept in meta.json
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    oracle_samples: int | None = None  # --oracle-samples; None: the default at T > 0

    @property
    def sampling(self) -> Sampling:
        return Sampling(float(self.temperature), float(self.top_p), int(self.seed))

    def sampling_params(self, key: str, index: int = 0, **overrides: Any) -> Any:
        """vLLM ``SamplingParams`` of one request of a sampled sweep, seeded by :meth:`Sampling.request_seed`."""
        from vllm import SamplingParams  # vllm is heavy and optional: imported when an engine runs

        s = self.sampling
        kw: dict[str, Any] = {"max_tokens": self.max_tokens, "ignore_eos": self.ignore_eos, **overrides}
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, seed=s.request_seed(key, index), **kw)

    def install_options(self, K: int) -> dict[str, Any]:
        """Options of ``speclimits_install`` on the engine of ``K``."""
        out: dict[str, Any] = {"sampled": True} if not self.sampling.greedy else {}
        if self.plant_routing is not None:
            out["plant_routing"] = {"seed": int(self.plant_routing) * 1000 + int(K)}
        return out

    @property
    def sizes(self) -> list[int]:
        """The batch sizes, sorted and unique."""
        return sorted(set(int(b) for b in self.batch_sizes))

    @property
    def batch_sweep(self) -> bool:
        """A sweep over batch sizes (any other than 1): ``b`` / ``batch_id`` columns, a ``steps`` table.
        (Every sweep submits its generations in :class:`Batch` groups; a batch-1 sweep's hold one each.)"""
        return self.sizes != [1]

    def settings(self, prompts_sha: str) -> dict[str, Any]:
        out = {
            "target": str(self.target), "draft": None if self.draft is None else str(self.draft),
            "method": self.method, "k_values": list(self.k_values), "prompts": str(self.prompts),
            "prompts_sha256": prompts_sha, "max_tokens": self.max_tokens, "seed": self.seed, "dtype": self.dtype,
            "load_format": self.load_format, "tokens": self.tokens, "ignore_eos": self.ignore_eos,
            "chat_template": self.chat_template, "limit": self.limit, "spec_extra": dict(self.spec_extra),
        }
        # only a designed experiment, a batch sweep, a sampled sweep record these
        if self.plant_routing is not None:
            out["plant_routing"] = int(self.plant_routing)
        if self.batch_sweep:
            out["batch_sizes"] = self.sizes
        if not self.sampling.greedy:
            out["sampling"] = self.sampling.record()
        return out


def _check_resume(root: Path, settings: dict[str, Any]) -> dict[str, Any]:
    meta = read_meta(root)
    old = meta.get("sweep") or {}
    diff = [k for k in RESUME_KEYS if old.get(k) != settings.get(k)]
    if diff:
        shown = "; ".join(f"{k}: trace has {old.get(k)!r}, now {settings.get(k)!r}" for k in diff)
        raise SpeclimitsError(f"--resume: {root} was traced with other settings ({shown}); use a new --out")
    return meta


@dataclass(frozen=True)
class Batch:
    """Generations submitted together in one ``generate()``: ``prompts`` (indices, in file order) at batch
    size ``b`` (the ``b_index``-th of the sweep) and K (the ``k_index``-th)."""

    b_index: int
    b: int
    k_index: int
    K: int
    prompts: tuple[int, ...]
    gids: tuple[int, ...]

    @property
    def batch_id(self) -> int:
        return self.gids[0]


@dataclass
class SweepPlan:
    """What a sweep (serial or distributed) still has to do.

    ``todo``: the generations without rounds on disk, ``(k_index, K, prompt_index, b_index)`` (b_index 0
    when left out). ``meta``: the trace's meta.json when resuming, else None (written once the first
    engine reports the model's shape)."""

    cfg: SweepConfig
    prompts: list[Prompt]
    root: Path
    settings: dict[str, Any]
    k_values: list[int]
    meta: dict[str, Any] | None
    todo: list[tuple[int, ...]]
    batch_sizes: list[int] = field(default_factory=lambda: [1])

    @property
    def batch_sweep(self) -> bool:
        """A sweep over batch sizes (:attr:`SweepConfig.batch_sweep`)."""
        return self.batch_sizes != [1]

    @property
    def n_total(self) -> int:
        return len(self.batch_sizes) * len(self.k_values) * len(self.prompts)

    def gid(self, k_index: int, prompt_index: int, b_index: int = 0) -> int:
        """``(b_index * n_K + k_index) * n_prompts + prompt_index`` (batch-1: ``k_index * n_prompts + prompt_index``)."""
        return (b_index * len(self.k_values) + k_index) * len(self.prompts) + prompt_index

    def keep_tokens(self, K: int, b_index: int = 0) -> bool:
        return self.cfg.tokens == "all" or (self.cfg.tokens == "ref" and K == self.k_values[0] and b_index == 0)

    def batches(self) -> list[Batch]:
        """The batches of ``todo`` in run order: K by K, then by batch size, then in file order. A batch
        with only some of its generations on disk cannot come from the sweep: it is refused."""
        left = {(t[3] if len(t) > 3 else 0, t[0], t[2]) for t in self.todo}
        n_p = len(self.prompts)
        out = []
        for ki, K in enumerate(self.k_values):
            for bi, b in enumerate(self.batch_sizes):
                for start in range(0, n_p, b):
                    members = tuple(range(start, min(start + b, n_p)))
                    here = [pi for pi in members if (bi, ki, pi) in left]
                    if not here:
                        continue
                    if len(here) != len(members):
                        raise SpeclimitsError(
                            f"batch {self.gid(ki, start, bi)} (b={b}, K={K}) has {len(members) - len(here)} of its "
                            f"{len(members)} generations on disk; a sweep writes whole batches: remove its parts "
                            f"from {self.root} or trace into a new --out")
                    out.append(Batch(bi, b, ki, K, members, tuple(self.gid(ki, pi, bi) for pi in members)))
        return out

    @property
    def with_category(self) -> bool:
        return any(p.category is not None for p in self.prompts)


def _check_config(cfg: SweepConfig, k_values: list[int], batch_sizes: list[int]) -> None:
    if cfg.tokens not in ("ref", "all", "none"):
        raise SpeclimitsError(f"tokens must be 'ref', 'all' or 'none', got {cfg.tokens!r}")
    if cfg.max_tokens < 1:
        raise SpeclimitsError(f"--max-tokens must be >= 1, got {cfg.max_tokens}")
    if cfg.method != "ngram" and any(k > 0 for k in k_values) and cfg.draft is None:
        raise SpeclimitsError(f"--method {cfg.method} needs --draft DIR")
    if cfg.check_counters not in ("part", "generation"):
        raise SpeclimitsError(f"check_counters must be 'part' or 'generation', got {cfg.check_counters!r}")
    if not batch_sizes or min(batch_sizes) < 1:
        raise SpeclimitsError(f"--batch needs batch sizes >= 1, got {cfg.batch_sizes!r}")
    check_sampling_values(cfg.temperature, cfg.top_p, cfg.seed)
    if cfg.flush_every < 1 or cfg.flush_seconds < 0:
        raise SpeclimitsError(f"flush_every must be >= 1 and flush_seconds >= 0, got {cfg.flush_every}, "
                              f"{cfg.flush_seconds}")


def plan_sweep(cfg: SweepConfig) -> SweepPlan:
    """Check the settings and the output folder (``--resume`` rules), delete what a killed writer left
    without its rounds part, and list the work left."""
    k_values = sorted(set(int(k) for k in cfg.k_values))
    batch_sizes = cfg.sizes
    _check_config(cfg, k_values, batch_sizes)
    prompts = read_prompts(cfg.prompts, limit=cfg.limit)
    root = Path(cfg.out)
    settings = cfg.settings(hashlib.sha256(Path(cfg.prompts).read_bytes()).hexdigest())
    meta = None
    if (root / "meta.json").exists():
        if not cfg.resume:
            raise SpeclimitsError(f"{root} already holds a trace; pass --resume to finish it or choose a new --out")
        meta = _check_resume(root, settings)
    elif root.exists() and any(root.iterdir()):
        raise SpeclimitsError(f"{root} exists and is not a trace directory; choose a new --out")
    if root.is_dir():
        remove_orphan_parts(root)
    done = done_generations(root)
    plan = SweepPlan(cfg, prompts, root, settings, k_values, meta, [], batch_sizes)
    plan.todo = [(ki, K, pi, bi) for bi in range(len(batch_sizes)) for ki, K in enumerate(k_values)
                 for pi in range(len(prompts)) if plan.gid(ki, pi, bi) not in done]
    return plan


class EngineHolder:
    """One traced engine at a time, kept while K stays the same (vLLM fixes ``num_speculative_tokens``
    per engine); ``max_num_seqs`` = the largest batch size. ``prompt_ids(i)``: prompt ``i`` tokenized."""

    def __init__(self, cfg: SweepConfig, prompts: list[Prompt], k_values: list[int]) -> None:
        self.cfg, self.prompts, self.k_values = cfg, prompts, k_values
        self.K: int | None = None
        self.llm: Any = None
        self.info: dict[str, Any] = {}
        self.kwargs: dict[str, Any] = {}
        self.tokenizer: Any = None
        self.builds = 0
        self._ids: dict[int, list[int]] = {}

    def ensure(self, K: int, warmup_prompt: int) -> Any:
        if self.llm is not None and self.K == K:
            return self.llm
        self.close()
        self.kwargs = sweep_engine_kwargs(self.cfg, K, self.prompts, self.k_values, batch=max(self.cfg.sizes))
        self.llm, self.info = eng.make_llm(self.kwargs, self.cfg.install_options(K))
        self.K = K
        self.builds += 1
        if self.tokenizer is None and not self.kwargs["skip_tokenizer_init"]:
            self.tokenizer = self.llm.get_tokenizer()
        _warmup(self.llm, self.prompt_ids(warmup_prompt), self.cfg)
        return self.llm

    def prompt_ids(self, i: int) -> list[int]:
        if i not in self._ids:
            self._ids[i] = tokenize(self.prompts[i], self.tokenizer, self.cfg.chat_template)
        return self._ids[i]

    def close(self) -> None:
        if self.llm is not None:
            eng.close_llm(self.llm)
        self.llm, self.K = None, None


def ensure_meta(plan: SweepPlan, info: dict[str, Any], kwargs: dict[str, Any], vllm_version: str) -> dict[str, Any]:
    """The trace's meta.json: the resumed one, or a new one written from the engine's model info."""
    if plan.meta is None:
        plan.meta = initial_meta(plan.cfg, plan.settings, vllm_version, info, kwargs)
        plan.root.mkdir(parents=True, exist_ok=True)
        write_meta(plan.root, plan.meta)
    return plan.meta


def run_sweep(cfg: SweepConfig) -> dict[str, Any]:
    """Run (or finish, with ``cfg.resume``) the sweep in this process; returns the final meta dict."""
    plan = plan_sweep(cfg)
    vllm = eng.require_vllm()
    batches = plan.batches()
    bar = tqdm(total=plan.n_total, initial=plan.n_total - len(plan.todo), desc="trace", unit="gen",
               disable=not cfg.progress)
    holder = EngineHolder(cfg, plan.prompts, plan.k_values)
    try:
        for ki, K in enumerate(plan.k_values):
            mine = [bt for bt in batches if bt.k_index == ki]
            if not mine:
                continue
            bar.set_postfix_str(f"K={K}: building engine")
            llm = holder.ensure(K, warmup_prompt=mine[0].prompts[0])  # one engine per K, for every b
            meta = ensure_meta(plan, holder.info, holder.kwargs, getattr(vllm, "__version__", "?"))
            for bi in range(len(plan.batch_sizes)):
                group = [bt for bt in mine if bt.b_index == bi]
                if group:  # one writer per (b, K): a part holds whole batches of one batch size
                    run_batches(plan, holder, llm, K, group, top_k=int(target_top_k(meta)), bar=bar)
    finally:
        holder.close()
        bar.close()
    meta = plan.meta if plan.meta is not None else read_meta(plan.root)  # None: everything was already done
    return finalize_meta(plan.root, meta)


def run_batches(plan: SweepPlan, holder: EngineHolder, llm: Any, K: int, batches: list[Batch], *,
                top_k: int, bar: Any = None, shard: str | None = None,
                worker: dict[str, Any] | None = None) -> None:
    """Run ``batches`` (all of one batch size) on ``llm`` (K), each in one ``generate()``, and write them
    (:class:`GenerationWriter`)."""
    if len({bt.b for bt in batches}) > 1:
        raise SpeclimitsError("internal: run_batches got batches of several batch sizes")
    b = batches[0].b if (batches and plan.batch_sweep) else None
    writer = GenerationWriter(llm, plan.root, plan.cfg, K, top_k=top_k, tokenizer=holder.tokenizer,
                              with_category=plan.with_category, shard=shard, worker=worker, b=b)
    try:
        for bt in batches:
            if bar is not None:
                bar.set_postfix_str(f"b={bt.b} K={K} batch {bt.batch_id}, {writer.pending} unwritten" if b is not None
                                    else f"K={K} prompt {plan.prompts[bt.prompts[0]].id}, {writer.pending} unwritten")
            writer.run_batch([plan.prompts[pi] for pi in bt.prompts], [holder.prompt_ids(pi) for pi in bt.prompts],
                             list(bt.gids), keep_tokens=plan.keep_tokens(K, bt.b_index))
            if bar is not None:
                bar.update(len(bt.gids))
        writer.flush()
    finally:
        writer.close()


def sweep_engine_kwargs(cfg: SweepConfig, K: int, prompts: list[Prompt], k_values: list[int],
                        batch: int = 1, prefix_caching: bool = False, extra_len: int = 0) -> dict[str, Any]:
    longest = max((len(p.token_ids) if p.token_ids is not None else 4 * len(p.text or "") + 64) for p in prompts)
    max_len = cfg.max_model_len or (longest + cfg.max_tokens + max(k_values) + extra_len + 8)
    model_cfg = model_config(cfg.target)
    limit = model_cfg.get("max_position_embeddings")
    if cfg.max_model_len is None and limit:
        max_len = min(max_len, int(limit))
    return eng.engine_kwargs(target=cfg.target, draft=cfg.draft, method=cfg.method, K=K, seed=cfg.seed,
                             dtype=cfg.dtype, load_format=cfg.load_format, max_model_len=int(max_len),
                             max_num_seqs=batch, prefix_caching=prefix_caching, block_size=cfg.block_size,
                             spec_extra=cfg.spec_extra, extra=cfg.engine_extra)


def initial_meta(cfg: SweepConfig, settings: dict[str, Any], vllm_version: str, info: dict[str, Any],
                 kwargs: dict[str, Any]) -> dict[str, Any]:
    """meta.json of a new vLLM trace (``complete`` False until :func:`finalize_meta`)."""
    target_cfg = model_config(cfg.target)
    models: dict[str, Any] = {
        "target": {"path": str(cfg.target), "architecture": (target_cfg.get("architectures") or ["?"])[0],
                   "n_layers": info["n_layers"], "n_experts": info["n_experts"], "top_k": info["top_k"],
                   "load_format": cfg.load_format},
    }
    if cfg.method == "ngram":
        models["draft"] = {"method": "ngram", **cfg.spec_extra}
    elif cfg.draft is not None:
        draft_cfg = model_config(cfg.draft)
        models["draft"] = {"path": str(cfg.draft), "architecture": (draft_cfg.get("architectures") or ["?"])[0]}
    conventions = ("round = engine step (target pass + drafter call of that step); tokens.experts/new_experts = "
                   "routing of the pass that reads the token (round/row: the pass that produced it); see "
                   "speclimits.tracing.records and speclimits.trace.reference_tokens")
    extra: dict[str, Any] = {}
    if cfg.batch_sweep:
        extra["batch_sizes"] = cfg.sizes
        conventions += ("; steps = one row per engine step of a batch (all its requests), rounds of a batch "
                        "repeat the step's times")
    if not cfg.sampling.greedy:
        extra["sampling"] = cfg.sampling.record()
    if cfg.plant_routing is not None:
        extra["planted_routing"] = {
            "seed": int(cfg.plant_routing),
            "design": ("designed experiment: on every target pass of n tokens the router's expert ids are replaced "
                       "by a planted routing with the same number of unique experts U in every MoE layer, U drawn "
                       "uniformly from top_k..min(n*top_k, E) per pass; u_bar is the planted U; outputs are not "
                       "the model's (only pass costs are meaningful)"),
        }
    engine = {"name": "vllm", "version": vllm_version, "torch": info.get("torch"), "device": info.get("device"),
              "runner": "V1", "attention": info.get("attention"),
              "settings": {k: v for k, v in kwargs.items() if k not in ("model", "speculative_config")},
              **({"fixes": info["fixes"]} if info.get("fixes") else {})}
    # cpu: the model and the instruction-set flags that change kernels (speclimits.machine)
    return new_meta(source="vllm", simulated=False, models=models, method=cfg.method, hardware=eng.hardware(),
                    cpu=cpu_info(), dtype=info["dtype"],
                    **({"dtype_choice": cfg.dtype_choice} if cfg.dtype_choice is not None else {}),
                    k_values=sorted(set(int(k) for k in cfg.k_values)), seed=cfg.seed, engine=engine, sweep=settings,
                    batch_size=max(cfg.sizes), greedy=cfg.sampling.greedy, complete=False,
                    env={k: os.environ.get(k) for k in eng.CPU_ENV_DEFAULTS}, conventions=conventions, **extra)


def _warmup(llm: Any, prompt_ids: list[int], cfg: SweepConfig) -> None:
    """One short untraced generation (ngram JIT, first-call allocations, the sampling path)."""
    from vllm import SamplingParams  # vllm is heavy and optional: imported when an engine runs
    from vllm.inputs import TokensPrompt

    if cfg.sampling.greedy:
        params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
    else:
        params = cfg.sampling_params("warmup", max_tokens=8, ignore_eos=False, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False)
    llm.collective_rpc("speclimits_drain")


class GenerationWriter:
    """Runs traced generations on one engine (one K) and writes them in buffered parts.

    Create it after the warm-up (it reads vLLM's counters as the baseline). :meth:`run_batch` runs one
    batch (with ``b`` given, a batch sweep's: ``b`` / ``batch_id`` columns and step rows); buffers are
    flushed between batches only. :meth:`close` (always call it) flushes unless a generation was
    interrupted (vLLM's counters would then include its partial drafts): then the buffered generations
    are dropped and a resumed sweep runs them again. With ``shard`` (a distributed job's part name)
    everything is buffered until :meth:`flush`, which writes the one part under that name and its log
    lines as ``shards/<shard>.json`` (``worker``: where it ran) instead of appending to the shared logs.
    """

    def __init__(self, llm: Any, root: Path, cfg: SweepConfig, K: int, *, top_k: int, tokenizer: Any = None,
                 with_category: bool = False, shard: str | None = None,
                 worker: dict[str, Any] | None = None, b: int | None = None) -> None:
        from vllm import SamplingParams  # vllm is heavy and optional: imported when an engine runs

        self.llm, self.root, self.cfg, self.K, self.top_k = llm, Path(root), cfg, K, top_k
        self.tokenizer = tokenizer
        self.with_category = with_category
        self.params = SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos,
                                     detokenize=tokenizer is not None, seed=cfg.seed)
        self.sampled = not cfg.sampling.greedy
        self.per_generation = cfg.check_counters == "generation"
        self.b = b  # None: the batch-1 trace (no batch columns, no steps)
        self._reset()
        self._interrupted = False
        self.shard, self.worker = shard, worker
        self._c0 = eng.spec_counters(llm)

    def _reset(self) -> None:
        self._pending: list[dict[str, Any]] = []
        self._steps: list[dict[str, np.ndarray]] = []  # step columns of the buffered batches
        self._since: float | None = None  # when the oldest buffered generation finished
        self._vllm = {"drafted": 0, "accepted": 0}  # counter deltas of the buffered generations

    def sync_counters(self, count: bool = True) -> dict[str, int]:
        """Read vLLM's counters; add the delta since the last read to the buffered generations'
        (``count=False``: ignore it). Returns the delta."""
        c1 = eng.spec_counters(self.llm)
        delta = {k: c1[k] - self._c0[k] for k in self._vllm}  # the token counts the trace checks
        self._c0 = c1
        if count:
            for k in delta:
                self._vllm[k] += delta[k]
        return delta

    def run_batch(self, prompts: list[Prompt], prompt_ids: list[list[int]], gids: list[int], *,
                  keep_tokens: bool) -> None:
        """Generate for the prompts of one batch, submitted together; check each request against vLLM's
        output and buffer its rows. ``wall_s`` is the batch's wall time, ``tokens_per_s`` a request's own
        output tokens over it."""
        from vllm.inputs import TokensPrompt  # vllm is heavy and optional

        llm = self.llm
        llm.collective_rpc("speclimits_drain")  # drop anything left over
        self._interrupted = True  # until this batch is buffered (see close)
        # a sampled sweep: each request its own seed (a prompt's sample 0, the same at every K and b)
        params = [self.cfg.sampling_params(p.id, 0, detokenize=self.tokenizer is not None) for p in prompts] \
            if self.sampled else self.params
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids], params,
                            use_tqdm=False)
        wall = time.perf_counter() - t0
        records = llm.collective_rpc("speclimits_drain")[0]
        by_request = steps_by_request(records)
        tok = self.tokenizer
        decode = (lambda t: tok.decode([t])) if tok is not None else None
        batch_id = gids[0]
        if self.b is not None and set(by_request) != {out.request_id for out in outs}:
            raise SpeclimitsError(f"batch {batch_id}: the tracer saw requests {sorted(by_request)} but vLLM returned "
                                  f"{sorted(out.request_id for out in outs)}")
        done = []
        for prompt, ids, gid, out in zip(prompts, prompt_ids, gids, outs):
            output_ids = list(out.outputs[0].token_ids)
            rounds, tokens, check = generation_columns(
                by_request.get(out.request_id, []), output_ids=output_ids, generation_id=gid, prompt_id=prompt.id,
                K=self.K, top_k=self.top_k, decode=decode, with_tokens=keep_tokens)
            entry = {
                "generation_id": gid, "prompt_id": prompt.id, "K": self.K, "category": prompt.category,
                "prompt_len": len(ids), "prompt_token_ids": list(ids), "output_token_ids": output_ids,
                "finish_reason": out.outputs[0].finish_reason, "n_rounds": int(len(rounds["round"])), "wall_s": wall,
                "tokens_per_s": len(output_ids) / wall if wall > 0 else None,
                "trace": {k: check[k] for k in ("drafted", "accepted", "emitted", "output_len")},
                "tokens_match": check["tokens_match"],
            }
            if self.sampled:
                entry["seed"] = self.cfg.sampling.request_seed(prompt.id, 0)
            if self.b is not None:
                entry.update(b=self.b, batch_id=batch_id)
                for cols in (rounds, tokens):
                    if cols is not None:
                        n = len(cols["generation_id"])
                        cols["b"] = np.full(n, self.b, dtype=np.int64)
                        cols["batch_id"] = np.full(n, batch_id, dtype=np.int64)
            done.append({"entry": entry, "rounds": rounds, "tokens": tokens, "category": prompt.category})
        if self.per_generation:  # vLLM's counters are engine-wide: per batch is what they can tell
            delta = self.sync_counters()
            for p in done:
                p["entry"]["vllm" if self.b is None else "vllm_batch"] = delta
        self._pending.extend(done)
        if self.b is not None:
            self._steps.append(step_columns(records, batch_id=batch_id, b=self.b, K=self.K, top_k=self.top_k))
        self._interrupted = False  # vLLM's counters again cover exactly the buffered generations
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self.shard is None and (len(self._pending) >= self.cfg.flush_every
                                   or now - self._since >= self.cfg.flush_seconds):
            self.flush()

    def flush(self) -> str | None:
        """Write the buffered generations as one part; returns its name (None when nothing was buffered)."""
        if not self._pending:
            return None
        if self._interrupted:
            raise SpeclimitsError("internal: flush after an interrupted generation would mis-count vLLM's counters")
        pending = self._pending
        if not self.per_generation:
            self.sync_counters()
        name = self.shard or part_name(pending[0]["entry"]["generation_id"])
        cats = [p["category"] for p in pending] if self.with_category else None
        with_tokens = [p for p in pending if p["tokens"] is not None]
        # order matters: the rounds part comes last, its presence marks the generations done
        if with_tokens:
            write_part(self.root, "tokens", name,
                       columns_table([p["tokens"] for p in with_tokens],
                                     [p["category"] for p in with_tokens] if cats is not None else None))
        if self._steps:
            write_part(self.root, "steps", name, columns_table(self._steps, None))
        part = {
            "part": name, "K": self.K, "generation_ids": [p["entry"]["generation_id"] for p in pending],
            "trace": {k: sum(p["entry"]["trace"][k] for p in pending) for k in ("drafted", "accepted")},
            "vllm": dict(self._vllm), "check": self.cfg.check_counters,
        }
        if self.b is not None:
            part["b"] = self.b
        if self.shard is None:
            append_lines(self.root / GENERATIONS_LOG, [p["entry"] for p in pending])
            append_lines(self.root / PARTS_LOG, [part])
        else:
            part["worker"] = self.worker
            write_shard_log(self.root, name, part, [p["entry"] for p in pending])
        write_part(self.root, "rounds", name, columns_table([p["rounds"] for p in pending], cats))
        self._reset()
        return name

    @property
    def pending(self) -> int:
        """Generations buffered and not yet written."""
        return len(self._pending)

    def close(self) -> None:
        """Flush what is buffered when that is exact; otherwise drop it (a resume runs it again)."""
        if self._interrupted:
            self._reset()
            return
        self.flush()


def finalize_meta(root: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Summarise ``generations.jsonl`` and ``parts.jsonl`` into meta.json: completeness and the cross-checks
    by K (trace totals over the done generations, vLLM's counter deltas over the parts on disk, which hold
    exactly those); in a batch sweep also by b and K (``by_b_K``) and per batch (``counters_mismatch_batches``)."""
    gens = read_generations(root)
    done = done_generations(root)
    on_disk = set(list_parts(root, "rounds"))
    parts = {name: p for name, p in read_parts_log(root).items() if name in on_disk}
    batch_sweep = bool(meta.get("batch_sizes"))
    n_b = len(meta.get("batch_sizes") or [1])
    n_expected = n_b * len(meta.get("k_values", [])) * _n_prompts(meta)
    by_k: dict[str, dict[str, int]] = {}
    by_b_k: dict[str, dict[str, dict[str, int]]] = {}

    def new_stats() -> dict[str, int]:
        return {"generations": 0, "drafted": 0, "accepted": 0, "vllm_drafted": 0, "vllm_accepted": 0, "emitted": 0,
                "output_tokens": 0}

    def stats(K: Any, b: Any = None) -> list[dict[str, int]]:
        out = [by_k.setdefault(str(K), new_stats())]
        if batch_sweep:
            out.append(by_b_k.setdefault(str(b), {}).setdefault(str(K), new_stats()))
        return out

    mismatched, unchecked, per_gen_mismatch = [], [], []
    covered: set[int] = set()
    for part in parts.values():
        for s in stats(part["K"], part.get("b")):
            s["vllm_drafted"] += int(part["vllm"]["drafted"])
            s["vllm_accepted"] += int(part["vllm"]["accepted"])
        covered.update(int(g) for g in part["generation_ids"])
    per_batch: dict[int, dict[str, Any]] = {}  # batch sweeps checked after every batch
    for gid in sorted(done):
        g = gens.get(gid)
        if g is None:
            continue
        for s in stats(g["K"], g.get("b")):
            s["generations"] += 1
            s["drafted"] += g["trace"]["drafted"]
            s["accepted"] += g["trace"]["accepted"]
            s["emitted"] += g["trace"]["emitted"]
            s["output_tokens"] += g["trace"]["output_len"]
        if "vllm_batch" in g:
            pb = per_batch.setdefault(int(g["batch_id"]), {"vllm": g["vllm_batch"], "drafted": 0, "accepted": 0})
            pb["drafted"] += g["trace"]["drafted"]
            pb["accepted"] += g["trace"]["accepted"]
        if "vllm" in g and _differs(g["vllm"], g["trace"]):
            per_gen_mismatch.append(gid)
        if gid not in covered:  # written by an older harness: one line per generation with its own counters
            if "vllm" in g:
                s["vllm_drafted"] += g["vllm"]["drafted"]
                s["vllm_accepted"] += g["vllm"]["accepted"]
            else:
                unchecked.append(gid)
        if not g.get("tokens_match", False):
            mismatched.append(gid)
    meta = dict(meta)
    batch_checks: dict[str, Any] = {}
    if batch_sweep:
        batch_checks = {"by_b_K": by_b_k, "counters_mismatch_batches": sorted(
            bid for bid, pb in per_batch.items() if _differs(pb, pb["vllm"]))}
    meta["checks"] = {"by_K": by_k, **batch_checks, "token_mismatch_generations": mismatched,
                      "counters_match": not unchecked and not batch_checks.get("counters_mismatch_batches") and all(
                          s["drafted"] == s["vllm_drafted"] and s["accepted"] == s["vllm_accepted"]
                          for s in by_k.values()),
                      "counters_unchecked_generations": unchecked,
                      "counters_mismatch_parts": sorted(n for n, p in parts.items() if _differs(p["trace"], p["vllm"])),
                      "counters_mismatch_generations": per_gen_mismatch,
                      "emitted_match": all(s["emitted"] == s["output_tokens"] for s in by_k.values())}
    meta["complete"] = bool(n_expected) and len(done) >= n_expected
    meta["generations_done"] = len(done)
    write_meta(root, meta)
    return meta


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["drafted"], a["accepted"]) != (b["drafted"], b["accepted"])


def _n_prompts(meta: dict[str, Any]) -> int:
    sweep = meta.get("sweep") or {}
    try:
        return len(read_prompts(sweep["prompts"], limit=sweep.get("limit")))
    except (KeyError, SpeclimitsError):
        return 0
