"""``speclimits control bench``: plain decoding, static K and each policy in alternating blocks, in vLLM.

One engine build (the installed vLLM), one prompt set, two engines per block: a plain one (no
speculation) and a speculative one with ``num_speculative_tokens = K_max`` and the control
extension, in which every static K and every policy is an arm (static K runs as a policy: the
drafter stops at step K). Blocks repeat the arms in a rotated order, so that slow drift of the
shared machine spreads over all arms. Per arm and block: wall and CPU time (``time.process_time``,
the engine runs in this process), output tokens, vLLM's spec-decode counters, the controller's
rounds, early exits and decision time.

Beside the measurement, for prompts that the trace's Oracle data covers (its greedy references),
the offline prediction of every arm (:func:`speclimits.control.offline.offline_table`, truncated
to the generated length) and the Oracle's two bounds, so that the share of each Oracle's gain over
the best static K captured is given offline and in the engine. Greedy outputs of every arm are
compared token for token with plain decoding (``lossless``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.control import engine as ce
from speclimits.control.fit import greedy_setup
from speclimits.control.rules import PolicyFit
from speclimits.control.offline import gain_share, offline_table, u_prediction_error
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps
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
    target: str = "data/models/target"
    draft: str = "data/models/eagle3"
    method: str = "eagle3"
    load_format: str = "auto"
    prompts: str | None = None
    ids: str = "test"
    limit: int | None = None
    batch: int = 1
    max_tokens: int = 128
    blocks: int = 3
    static: list[int] = field(default_factory=lambda: list(range(1, 7)))
    policies: list[str] = field(default_factory=lambda: ["threshold", "delta", "delta-fixed", "ema", "cascade"])
    seed: int = 0
    max_model_len: int = 1024

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BenchConfig":
        return cls(policy=args.policy, out=args.out, trace=args.trace, target=args.target, draft=args.draft,
                   method=args.method, load_format=args.load_format, prompts=args.prompts, ids=args.ids,
                   limit=args.limit, batch=args.batch, max_tokens=args.max_tokens, blocks=args.blocks,
                   static=parse_static(args.static), policies=[p for p in args.policies.split(",") if p],
                   seed=args.seed)


def parse_static(spec: str) -> list[int]:
    """``"1-6"`` or ``"1,2,4"`` -> sorted K values (>= 1)."""
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                out.update(range(int(lo), int(hi) + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise SpeclimitsError(f"--static: expected e.g. 1-6 or 1,2,4, got {spec!r}") from None
    if not out or min(out) < 1:
        raise SpeclimitsError(f"--static: K values must be >= 1, got {spec!r}")
    return sorted(out)


def vllm_counters(llm: Any) -> dict[str, int]:
    """vLLM's cumulative spec-decode counters (``vllm bench`` field names)."""
    out = dict.fromkeys(VLLM_COUNTERS.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in VLLM_COUNTERS:
            out[VLLM_COUNTERS[metric.name]] = int(metric.value)
    return out


def choose_prompts(cfg: BenchConfig, fit: PolicyFit, trace: Path) -> list[Any]:
    """The prompts to run: the fit's test references (``ids="test"``), ``"all"``, or listed ids."""
    path = Path(cfg.prompts) if cfg.prompts else trace / "prompts.jsonl"
    prompts = read_prompts(path)
    if cfg.ids == "all":
        chosen = prompts
    else:
        want = list(fit.test_seq_ids) if cfg.ids == "test" else [s for s in cfg.ids.split(",") if s]
        by_id = {p.id: p for p in prompts}
        missing = [w for w in want if w not in by_id]
        if missing:
            raise SpeclimitsError(f"{path}: no prompts with ids {missing[:5]} (--ids {cfg.ids})")
        chosen = [by_id[w] for w in want]
    train = set(fit.train_seq_ids) & {p.id for p in chosen}
    if train:
        raise SpeclimitsError(f"prompts {sorted(train)[:5]} were used to fit {cfg.policy}: benchmark held-out ones")
    return chosen[: cfg.limit] if cfg.limit else chosen


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def run_arm(llm: Any, ids: list[list[int]], max_tokens: int, arm: str, policy: dict[str, Any] | None
            ) -> tuple[dict[str, Any], list[list[int]]]:
    """One arm on every prompt: timings, counters, controller records; and the outputs."""
    if policy is not None:
        llm.collective_rpc("speclimits_control_set", args=(policy, arm))
    before = vllm_counters(llm)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = ce.generate(llm, ids, max_tokens)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = vllm_counters(llm)
    n_out = sum(len(o) for o in outs)
    row: dict[str, Any] = {"arm": arm, "duration_s": wall, "cpu_s": cpu, "total_output_tokens": n_out,
                           "ms_per_token": wall * 1e3 / n_out, "cpu_ms_per_token": cpu * 1e3 / n_out,
                           "output_throughput": n_out / wall}
    row.update({k: after[k] - before[k] for k in after})
    if policy is not None:
        d = llm.collective_rpc("speclimits_control_drain")[0]
        ks = np.array([r["k"] for r in d["rounds"]])
        drafted = np.array([r["drafted"] for r in d["rounds"]])
        row.update(decide_us=d["decide_us"], drafting_calls=d["n_rounds"], early_exits=d["early_exits"],
                   mean_k=float(ks.mean()) if ks.size else None,
                   wasted_draft_steps=float((drafted - ks).sum() / max(len(ks), 1)),
                   k_histogram=np.bincount(ks, minlength=2).tolist() if ks.size else [])
    return row, outs


def warm(llm: Any, ids: list[list[int]], policy: dict[str, Any] | None) -> None:
    if policy is not None:
        llm.collective_rpc("speclimits_control_set", args=(policy, "static:1"))
    ce.generate(llm, ids[:1], 8)
    if policy is not None:
        llm.collective_rpc("speclimits_control_drain")


def measure(cfg: BenchConfig, fit: PolicyFit, prompt_ids: list[list[int]], progress: Any = print
            ) -> tuple[pd.DataFrame, bool, list[list[int]]]:
    """Alternating blocks; returns (one row per arm per block, lossless, plain outputs)."""
    spec_arms = [f"static:{k}" for k in cfg.static if k <= fit.k_max] + list(cfg.policies)
    policy = fit.to_dict()
    rows, plain_out, lossless = [], None, True
    kw = dict(batch=cfg.batch, load_format=cfg.load_format, max_model_len=cfg.max_model_len, seed=cfg.seed)
    for block in range(cfg.blocks):
        llm = ce.build_llm(cfg.target, None, cfg.method, 0, **kw)
        try:
            warm(llm, prompt_ids, None)
            row, outs = run_arm(llm, prompt_ids, cfg.max_tokens, "plain", None)
        finally:
            ce.close(llm)
        rows.append({**row, "block": block})
        plain_out = outs if plain_out is None else plain_out
        lossless &= outs == plain_out
        llm = ce.build_llm(cfg.target, cfg.draft, cfg.method, fit.k_max, **kw)
        try:
            warm(llm, prompt_ids, policy)
            shift = block % len(spec_arms)
            for arm in spec_arms[shift:] + spec_arms[:shift]:
                row, outs = run_arm(llm, prompt_ids, cfg.max_tokens, arm, policy)
                row["lossless"] = outs == plain_out
                lossless &= row["lossless"]
                rows.append({**row, "block": block})
                progress(f"block {block}: {arm:>12s} {row['ms_per_token']:.3f} ms/token, lossless {row['lossless']}")
        finally:
            ce.close(llm)
    return pd.DataFrame(rows), bool(lossless), plain_out


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------


def summarize(blocks: pd.DataFrame, offline: pd.DataFrame | None, bounds: dict[str, Any] | None) -> pd.DataFrame:
    """One row per arm: median ms/token and tok/s over blocks with min/max, CPU ms/token, ratios to
    plain and to the best static K (hindsight, this run), acceptance length, decision overhead, and the
    share of each Oracle's gain captured in the engine beside the offline prediction."""
    g = blocks.groupby("arm", sort=False)
    out = pd.DataFrame({
        "ms_per_token": g["ms_per_token"].median(), "ms_per_token_min": g["ms_per_token"].min(),
        "ms_per_token_max": g["ms_per_token"].max(), "output_throughput": g["output_throughput"].median(),
        "cpu_ms_per_token": g["cpu_ms_per_token"].median(), "blocks": g.size()})
    sums = g[["spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"]].sum()
    out = out.join(sums)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["spec_decode_acceptance_length"] = 1 + out["spec_decode_accepted_tokens"] / out["spec_decode_num_drafts"]
    if "decide_us" in blocks:
        per = g[["decide_us", "drafting_calls", "duration_s", "wasted_draft_steps", "mean_k"]].sum(min_count=1)
        out["decision_us_per_round"] = per["decide_us"] / per["drafting_calls"]
        out["round_ms"] = per["duration_s"] * 1e3 / per["drafting_calls"]
        out["wasted_draft_steps_per_request_round"] = g["wasted_draft_steps"].mean()
        out["mean_k"] = g["mean_k"].mean()
    static = [a for a in out.index if a.startswith("static:")]
    best = min(static, key=lambda a: out.loc[a, "ms_per_token"])
    out["speedup_vs_plain"] = out.loc["plain", "ms_per_token"] / out["ms_per_token"] if "plain" in out.index else np.nan
    out["vs_best_static"] = out.loc[best, "ms_per_token"] / out["ms_per_token"]
    out["best_static"] = out.index == best
    # per-block shares give the spread
    if bounds is not None:
        for key, gain in (("exact", bounds["oracle_exact_gain_over_best_static"]),
                          ("surrogate", bounds["oracle_surrogate_gain_over_best_static"])):
            t_oracle = out.loc[best, "ms_per_token"] / gain
            out[f"engine_share_{key}"] = gain_share(out["ms_per_token"], out.loc[best, "ms_per_token"], t_oracle)
            per_block = blocks.pivot_table(index="block", columns="arm", values="ms_per_token")
            shares = gain_share(per_block, per_block[best].to_numpy()[:, None], per_block[best].to_numpy()[:, None]
                                / gain)
            out[f"engine_share_{key}_min"] = pd.DataFrame(shares, columns=per_block.columns).min()
            out[f"engine_share_{key}_max"] = pd.DataFrame(shares, columns=per_block.columns).max()
    if offline is not None:
        off = offline.set_index("policy")
        for col in ("replay_ms_per_token", "replay_tokens_per_round", "share_exact", "share_exact_lo",
                    "share_exact_hi", "share_surrogate", "share_surrogate_lo", "share_surrogate_hi"):
            out[f"offline_{col}"] = off[col].reindex(out.index)
        # what the engine spends per round beyond the cost model's T_D + T_T (scheduler, sampling, Python)
        out["unmodelled_ms_per_round"] = (out["ms_per_token"] - out["offline_replay_ms_per_token"]) * \
            out["spec_decode_acceptance_length"]
    return out.reset_index()


def refresh_summary(path: str | Path) -> dict[str, Any]:
    """Recompute the summary of a benchmark JSON from its recorded blocks, offline table and bounds
    (after a change to :func:`summarize`; the measurements are not touched) and write it back."""
    p = Path(path)
    res = json.loads(p.read_text())
    blocks = pd.DataFrame(res["blocks"])
    offline = pd.DataFrame(res["offline"]) if res.get("offline") else None
    summary = summarize(blocks, offline, res.get("oracle"))
    if res.get("u_bar_prediction_error") is None and offline is not None:
        fit = PolicyFit.from_dict({**res["policy_fit"], "curves": {}})
        setup = greedy_setup(fit.data["trace"], fit.cost_model)
        res["u_bar_prediction_error"] = u_prediction_error(fit, setup, res["prompt_ids"],
                                                           n_states=res["config"]["max_tokens"] - 1)
    res["summary"] = summary
    res["summary_text"] = summary_text(summary, BenchConfig(**res["config"]), res.get("oracle"), res["lossless"])
    p.write_text(dumps(res, indent=1) + "\n")
    return json.loads(p.read_text())


def summary_text(summary: pd.DataFrame, cfg: BenchConfig, bounds: dict[str, Any] | None, lossless: bool) -> str:
    cols = ["arm", "ms_per_token", "ms_per_token_min", "ms_per_token_max", "cpu_ms_per_token", "speedup_vs_plain",
            "vs_best_static", "spec_decode_acceptance_length"]
    cols += [c for c in ("engine_share_exact", "offline_share_exact", "engine_share_surrogate",
                         "offline_share_surrogate", "decision_us_per_round", "round_ms") if c in summary]
    lines = [f"batch {cfg.batch}, {cfg.blocks} blocks, {cfg.max_tokens} tokens per prompt; lossless: {lossless}",
             summary[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    if bounds is not None:
        lines.append(f"Oracle gain over best static K (offline, same prompts): exact greedy "
                     f"{bounds['oracle_exact_gain_over_best_static']:.3f}x, surrogate "
                     f"{bounds['oracle_surrogate_gain_over_best_static']:.3f}x")
    return "\n".join(lines)


def run_benchmark(cfg: BenchConfig, progress: Any = print) -> dict[str, Any]:
    """Run the benchmark, write ``cfg.out`` (JSON) and return what it holds."""
    fit = PolicyFit.read(cfg.policy)
    trace = Path(cfg.trace or fit.data.get("trace", ""))
    prompts = choose_prompts(cfg, fit, trace)
    recorded = trace_generations(trace)
    tokenizer = None if all(p.id in recorded for p in prompts) else load_tokenizer(cfg.target)
    ids = [recorded[p.id][0] if p.id in recorded else tokenize(p, tokenizer, chat_template=True) for p in prompts]
    blocks, lossless, plain = measure(cfg, fit, ids, progress)
    same_as_trace = {p.id: recorded[p.id][1][: cfg.max_tokens] == out for p, out in zip(prompts, plain)
                     if p.id in recorded}
    offline = bounds = u_error = None
    note = ""
    covered = [p.id for p in prompts]
    try:
        setup = greedy_setup(trace, fit.cost_model)
        names = [a for a in blocks["arm"].unique() if a != "plain"]
        offline, bounds = offline_table(fit, setup, covered, names, n_states=cfg.max_tokens - 1, seed=cfg.seed)
        u_error = u_prediction_error(fit, setup, covered, n_states=cfg.max_tokens - 1)
    except (SpeclimitsError, OSError) as exc:
        note = f"no offline prediction / Oracle bounds: {exc}"
    summary = summarize(blocks, offline, bounds)
    result = {
        "label": "measured (real vLLM engine on this machine; not simulated)",
        "produced_by": " ".join(sys.argv),
        "config": asdict(cfg), "lossless": lossless, "prompt_ids": covered, "note": note,
        "plain_equals_trace_reference": same_as_trace,
        "engine": engine_info(), "policy_fit": {k: v for k, v in fit.to_dict().items() if k != "curves"},
        "summary": summary, "blocks": blocks, "offline": offline, "u_bar_prediction_error": u_error,
        "oracle": None if bounds is None else {k: v for k, v in bounds.items() if k != "k_star_exact"},
    }
    result["summary_text"] = summary_text(summary, cfg, bounds, lossless)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(dumps(result, indent=1) + "\n")
    return result


def trace_generations(trace: Path) -> dict[str, tuple[list[int], list[int]]]:
    """``{prompt_id: (prompt token ids, output token ids)}`` of the trace's K = 0 generations (the
    greedy references the Oracle data follows); empty when the trace has no ``generations.jsonl``."""
    path = trace / "generations.jsonl"
    out: dict[str, tuple[list[int], list[int]]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            g = json.loads(line)
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
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")}}


def decompose(cfg: BenchConfig, fit: PolicyFit, prompt_ids: list[list[int]], arms: list[str],
              references: list[list[int]] | None = None) -> pd.DataFrame:
    """Where a round's wall time goes, per arm, with the tracer on the controlled engine: per engine step
    the target forward (``t_target_ms``), the whole drafter call (``t_draft_ms``) and the rest of the
    step (scheduler, input preparation, sampling, Python: ``other_ms``), medians over decode steps; and
    what the cost model predicts for the same arm's mean k (``model_ms``). ``k`` is the mean k verified."""
    llm = ce.build_llm(cfg.target, cfg.draft, cfg.method, fit.k_max, batch=cfg.batch, load_format=cfg.load_format,
                       max_model_len=cfg.max_model_len, seed=cfg.seed)
    rows = []
    try:
        llm.collective_rpc("speclimits_install", args=({"kv_usage": False},))
        policy = fit.to_dict()
        warm(llm, prompt_ids, policy)
        for arm in arms:
            llm.collective_rpc("speclimits_control_set", args=(policy, arm))
            llm.collective_rpc("speclimits_drain")
            t0 = time.perf_counter()
            outs = ce.generate(llm, prompt_ids, cfg.max_tokens)
            wall = time.perf_counter() - t0
            recs = [r for r in llm.collective_rpc("speclimits_drain")[0] if all(q["n_out_before"] > 0 for q in r["reqs"])]
            llm.collective_rpc("speclimits_control_drain")
            tt = np.array([r["t_target_ms"] for r in recs])
            td = np.array([r["t_draft_ms"] for r in recs])
            k = float(np.mean([q["n_spec"] for r in recs for q in r["reqs"]]))
            n_steps = len(recs)
            step_ms = wall * 1e3 / max(n_steps, 1)
            model = float(fit.cost_model.round_ms(int(round(k)), fit.u_bar_mean[int(round(k)) + 1], 100))
            rows.append({"arm": arm, "k": k, "steps": n_steps, "step_wall_ms": step_ms,
                         "t_target_ms": float(np.median(tt)), "t_draft_ms": float(np.median(td)),
                         "other_ms": step_ms - float(tt.mean() + td.mean()), "model_ms": model,
                         "tokens": sum(len(o) for o in outs),
                         "equals_trace_reference": None if references is None else
                         all(r[: cfg.max_tokens] == o for r, o in zip(references, outs))})
    finally:
        ce.close(llm)
    return pd.DataFrame(rows)
