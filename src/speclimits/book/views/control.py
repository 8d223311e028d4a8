"""Reader tables of the online-control section (8): the offline prediction, the engine benchmarks
(:mod:`.control_runs`) and served load, the verdicts and key results. Intervals: 95% bootstrap over
references (offline shares) and over paired blocks (engine ratios); ms/token carries the IQR over blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits import arms
from speclimits.arms import POLICY_LABELS
from speclimits.arms import policy_label as arm_name  # "stock:2" -> "stock vLLM, K = 2" (Arm.label)
from speclimits.book.present import Result, ci_column, fmt_ci
from speclimits.book.views.control_runs import (BENCH_DIR, TWIN_BENCH_DIR, engine_table, is_policy, load_bench_runs)
from speclimits.jsonutil import read_json
from speclimits.paths import BUNDLED_TRACE, REPO_ROOT, TWIN_TRACE
from speclimits.trace import read_meta


def offline(table: pd.DataFrame) -> pd.DataFrame:
    """The offline prediction per policy: replayed and surrogate ms/token, and the share of each
    Oracle's gain over the best static K captured, with its 95% interval over references."""
    return pd.DataFrame({
        "Policy": [arm_name(p) for p in table["policy"]],
        "Replay (ms/token)": table["replay_ms_per_token"].to_numpy(),
        "Replay tokens per round": table["replay_tokens_per_round"].to_numpy(),
        "Surrogate (ms/token)": table["surrogate_ms_per_token"].to_numpy(),
        "Share captured, exact Oracle [95% CI]": ci_column(table, "share_exact"),
        "Share captured, surrogate Oracle [95% CI]": ci_column(table, "share_surrogate"),
    })


def engine(table: pd.DataFrame) -> pd.DataFrame:
    """One benchmark result (:func:`~.control_runs.engine_table`) for the reader, a row per arm: ms/token,
    the paired speed ratio to the best stock K (held-out blocks), the workload ratio (all blocks), the pooled
    ms/token beside the offline prediction and its error (also rescaled to the run's price level), the mean k
    and the decision time's share of a round (net of vLLM's argmax where the controller chooses the draft's
    tokens; the gross beside it)."""
    nan = pd.Series(np.nan, index=table.index)
    pooled = table.get("ms_per_token_pooled", nan).astype(float)
    pred = [("–" if not np.isfinite(p) else (f"{m:.2f} / " if np.isfinite(m) else "") + f"{p:.2f} ({100 * e:+.0f}%"
             + (f"; {100 * r:+.0f}% rescaled" if np.isfinite(r) else "") + ")")
            for m, p, e, r in zip(pooled, table.get("predicted_ms_per_token", nan).astype(float),
                                  table.get("prediction_error", nan).astype(float),
                                  table.get("prediction_error_rescaled", nan).astype(float))]
    gross = table.get("decision_gross_share", table.get("decision_share", nan)).astype(float)
    dec = ["–" if not np.isfinite(v) else f"{100 * v:.2f}%" + (f" ({100 * g:.2f}% gross)" if abs(g - v) > 1e-6 else "")
           for v, g in zip(table.get("decision_share", nan).astype(float), gross)]
    return pd.DataFrame({
        "Arm": [arm_name(a) for a in table["arm"]],
        "ms/token [IQR]": ci_column(table, "ms_per_token", 2),
        "Speed vs best stock K [95% CI]": ci_column(table, "vs_best_stock", 3),
        "Workload ratio, all blocks [95% CI]": ci_column(table, "workload_ratio", 3),
        "Pooled / predicted ms/token (error)": pred,
        "Mean k; deciding (% of round)": [
            d if not np.isfinite(k) else f"{k:.2f}" + ("" if d == "–" else f"; {d}")
            for k, d in zip(table.get("mean_k", nan).astype(float), dec)],
    })


def side_of_one(lo: Any, hi: Any) -> str:
    """Where a 95% interval lies against 1: ``"above"``, ``"below"`` or ``"holds 1"``."""
    return "above" if float(lo) > 1 else "below" if float(hi) < 1 else "holds 1"


def _paired(t: pd.DataFrame, arm: str, result: dict[str, Any]) -> str:
    """``arm``'s paired speed ratio to the best stock K [95% CI] in ``t`` (indexed by arm), and that K."""
    return f"{ci_column(t.loc[[arm]], 'vs_best_stock', 3)[0]} (K = {result['choice']['best_stock'].split(':')[-1]})"


def replication(tables: dict[int, pd.DataFrame], runs: dict[int, dict[str, Any]],
                again: dict[int, pd.DataFrame], runs_again: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Each policy's :func:`_paired` ratio in the main run and in a second run of the same command (each
    against its own best stock K), for the batch sizes both have; "replicated" where both intervals lie
    on the same side of 1 or both hold it. Empty without a second run."""
    rows = []
    for batch in sorted(set(tables) & set(again)):
        a, b = tables[batch].set_index("arm"), again[batch].set_index("arm")
        for arm in [x for x in a.index if is_policy(x) and x in b.index]:
            sides = tuple(side_of_one(t.loc[arm, "vs_best_stock_lo"], t.loc[arm, "vs_best_stock_hi"]) for t in (a, b))
            rows.append({"Batch": batch, "Policy": arm_name(arm),
                         "Main run [95% CI] (best stock K)": _paired(a, arm, runs[batch]),
                         "Second run [95% CI] (best stock K)": _paired(b, arm, runs_again[batch]),
                         "Interval vs 1 (main / second)": " / ".join(sides),
                         "Replicated": "yes" if sides[0] == sides[1] else "no"})
    return pd.DataFrame(rows)


def unseen(runs: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Per batch size and policy of benchmark results on prompts no policy was fitted or tuned on: the
    :func:`_paired` ratio, the workload ratio [95% CI], the cross-fitted one (against the stock K chosen on the
    other half of the blocks; "–" in a result summarized before it) and the mean k drafted; ``Below 1``: "yes"
    where the workload interval lies under 1."""
    rows = []
    for batch in sorted(runs):
        t = engine_table(runs[batch]).set_index("arm")
        for key in [x for x in t.index if is_policy(x)]:
            r = t.loc[[key]]
            rows.append({"Batch": batch, "Policy": arm_name(key), "Paired [95% CI]": _paired(t, key, runs[batch]),
                         "Workload [95% CI]": ci_column(r, "workload_ratio", 3)[0],
                         "Cross-fitted [95% CI]": (ci_column(r, "crossfit_ratio", 3)[0] if "crossfit_ratio" in r
                                                   else "–"),
                         "Mean k": f"{float(r['mean_k'].iloc[0]):.2f}",
                         "Below 1": "yes" if float(r["workload_ratio_hi"].iloc[0]) < 1 else "no"})
    return pd.DataFrame(rows)


@dataclass
class EngineBest:
    """The fastest policy of one benchmark result against the best stock static K."""

    batch: int
    policy: str  # the arm's key
    best_static: str  # the best stock arm's key (chosen on the other half of the blocks)
    speed: float  # paired speed ratio, best stock K's time over the policy's (> 1: the policy is faster)
    speed_lo: float  # its 95% bootstrap interval over the held-out blocks
    speed_hi: float
    share: float  # share of the exact Oracle's gain captured in the engine, with the interval mapped
    share_lo: float
    share_hi: float
    oracle_gain: float  # exact Oracle over the best static K on the same references (offline, profiled costs)
    n_policies: int
    n_faster: int  # policies whose interval lies above 1
    n_slower: int  # policies whose interval lies below 1
    #: the best stock arm over all blocks where it differs from ``best_static`` (the half-split's choice),
    #: with the policy's paired ratio to it over all blocks and its interval; else None
    all_static: str | None = None
    all_speed: float = np.nan
    all_speed_lo: float = np.nan
    all_speed_hi: float = np.nan
    #: the workload ratio (all blocks' time per token of the best stock K over all of them, over the
    #: policy's) with its paired interval, and that stock K; NaN where the result has none
    workload_static: str | None = None
    workload: float = np.nan
    workload_lo: float = np.nan
    workload_hi: float = np.nan

    @property
    def verdict(self) -> str:
        return {"above": "faster than", "below": "slower than",
                "holds 1": "not distinguishable from"}[side_of_one(self.speed_lo, self.speed_hi)]


def engine_best(table: pd.DataFrame, result: dict[str, Any]) -> EngineBest:
    """The policy with the highest paired speed ratio to the best stock K in one benchmark result."""
    s = table.set_index("arm")
    pols = [a for a in s.index if is_policy(a)]
    if not pols:
        raise ValueError(f"{result.get('file', 'benchmark')}: no policy arms")
    best = s.loc[pols, "vs_best_stock"].astype(float).idxmax()
    r = s.loc[best]
    chosen, overall = str(result["choice"]["best_stock"]), result["choice"].get("best_stock_all_blocks")
    col = f"vs_stock_{str(overall).split(':')[-1]}"
    other = {}
    if overall and overall != chosen and col in s:
        other = {"all_static": str(overall), "all_speed": float(r[col]), "all_speed_lo": float(r[f"{col}_lo"]),
                 "all_speed_hi": float(r[f"{col}_hi"])}
    if "workload_ratio" in s:
        other.update(workload_static=result["choice"]["best_stock_workload"],
                     workload=float(r["workload_ratio"]), workload_lo=float(r["workload_ratio_lo"]),
                     workload_hi=float(r["workload_ratio_hi"]))
    return EngineBest(**other,
        batch=int(result["config"]["batch"]), policy=best, best_static=chosen,
        speed=float(r["vs_best_stock"]), speed_lo=float(r["vs_best_stock_lo"]), speed_hi=float(r["vs_best_stock_hi"]),
        share=float(r["engine_share_exact"]), share_lo=float(r["engine_share_exact_lo"]),
        share_hi=float(r["engine_share_exact_hi"]),
        oracle_gain=float((result.get("oracle") or {}).get("oracle_exact_gain_over_best_static", np.nan)),
        n_policies=len(pols), n_faster=int((s.loc[pols, "vs_best_stock_lo"].astype(float) > 1).sum()),
        n_slower=int((s.loc[pols, "vs_best_stock_hi"].astype(float) < 1).sum()))


def offline_best(table: pd.DataFrame) -> dict[str, Any]:
    """The policy that captures the largest share of the exact Oracle's gain offline (replay)."""
    static = table[table["policy"].astype(str).str.startswith("static:")]
    pols = table[table["policy"].isin(list(POLICY_LABELS))]
    best = pols.loc[pols["share_exact"].astype(float).idxmax()]
    ref = static.loc[static["replay_ms_per_token"].astype(float).idxmin()]
    return {"policy": best["policy"], "best_static": ref["policy"], "share": best["share_exact"],
            "share_lo": best["share_exact_lo"], "share_hi": best["share_exact_hi"],
            "speed": float(ref["replay_ms_per_token"]) / float(best["replay_ms_per_token"]),
            "n_policies": len(pols), "n_faster": int((pols["share_exact"].astype(float) > 0).sum())}


def verdict(runs: dict[int, dict[str, Any]], tables: dict[int, pd.DataFrame], offline_table: pd.DataFrame,
            bounds: dict[str, Any]) -> str:
    """The section's answer (Markdown): offline, then per measured batch size, was the best policy faster
    than, slower than or not distinguishable from the best stock static K (95% interval)?"""
    off = offline_best(offline_table)
    text = ("**Offline** (replay on the held-out references, the trace's cost model), "
            + (f"{off['n_faster']} of {off['n_policies']} policies beat" if off["n_faster"] else "no policy beat")
            + f" the best static K ({arm_name(off['best_static'])}); the best, {arm_name(off['policy'])}, captures "
            f"{fmt_ci(off['share'], off['share_lo'], off['share_hi'])} of the exact Oracle's gain "
            f"(the Oracle is {bounds['oracle_exact_gain_over_best_static']:.3f}× faster than the best static K there). ")
    if not runs:
        return text + "**In the engine**: no measured benchmark for this trace, so nothing is claimed about it."
    parts = []
    for batch in sorted(runs):
        b = engine_best(tables[batch], runs[batch])
        parts.append(f"**batch {b.batch}**: the best policy, {arm_name(b.policy)}, was {b.verdict} "
                     f"{arm_name(b.best_static)} ({fmt_ci(b.speed, b.speed_lo, b.speed_hi)}× its speed; "
                     f"{b.n_faster} of {b.n_policies} policies faster and {b.n_slower} slower with the interval "
                     f"clear of 1"
                     + (f"; against {arm_name(b.all_static)}, the best stock K over all blocks: "
                        f"{fmt_ci(b.all_speed, b.all_speed_lo, b.all_speed_hi)}×" if b.all_static else "")
                     + (f"; workload ratio to {arm_name(b.workload_static)}, all blocks: "
                        f"{fmt_ci(b.workload, b.workload_lo, b.workload_hi)}×"
                        if b.workload_static and np.isfinite(b.workload) else "") + ")")
    return text + "**In the engine**, against stock vLLM: " + "; ".join(parts) + "."


def key_rows(runs: dict[int, dict[str, Any]], tables: dict[int, pd.DataFrame], offline_table: pd.DataFrame,
             bounds: dict[str, Any], refs: dict[int, str] | None = None, offline_ref: str | None = None
             ) -> list[Result]:
    """Headline rows: per measured batch, the best policy's paired speed ratio to the best stock K, its
    workload ratio and share of the Oracle's gain; the Oracle's bound. Without a benchmark, the offline
    prediction's best policy instead. The paper has no online policy: no paper column."""
    refs = refs or {}
    rows = []
    if runs:
        best = [engine_best(tables[b], runs[b]) for b in sorted(runs)]
        for b in best:
            rows.append(Result.of(f"batch {b.batch}, engine: best policy ({arm_name(b.policy)}) over "
                                  f"{arm_name(b.best_static)}, paired speed ratio ({b.verdict} it)",
                                  b.speed, b.speed_lo, b.speed_hi, decimals=3, ref=refs.get(b.batch)))
        for b in best:
            if b.workload_static and np.isfinite(b.workload):
                rows.append(Result.of(f"batch {b.batch}, engine: its workload ratio to {arm_name(b.workload_static)} "
                                      "(all blocks' time per token)", b.workload, b.workload_lo, b.workload_hi,
                                      decimals=3, ref=refs.get(b.batch)))
        for b in best:
            rows.append(Result.of(f"batch {b.batch}, engine: its share of the exact Oracle's gain",
                                  b.share, b.share_lo, b.share_hi, decimals=2, ref=refs.get(b.batch)))
        if np.isfinite(best[0].oracle_gain):
            rows.append(Result.of("Oracle's bound over the best static K, same references (exact greedy, "
                                  "profiled costs)", best[0].oracle_gain, decimals=3, ref=refs.get(best[0].batch)))
        return rows
    off = offline_best(offline_table)
    return [
        Result.of(f"offline: best policy ({arm_name(off['policy'])}) over {arm_name(off['best_static'])}, "
                  "replayed speed ratio" + ("" if off["n_faster"] else "; no policy beat the best static K"),
                  off["speed"], decimals=3, ref=offline_ref),
        Result.of("offline: its share of the exact Oracle's gain", off["share"], off["share_lo"], off["share_hi"],
                  ref=offline_ref),
        Result.of("Oracle's bound over the best static K (exact greedy, offline)",
                  bounds["oracle_exact_gain_over_best_static"], decimals=3, ref=offline_ref),
    ]


def bench_runs(trace, sub: str = "") -> tuple[dict, str]:
    """The engine benchmark results fitted on ``trace``, from ``data/control/<sub>`` (the bundled pair's) or
    ``data/control/twin/<sub>`` (the memory-bound twin's). On the twin's trace without results of its own,
    the bundled pair's (first runs only), with a note that says so."""
    note = ""
    for folder in (BENCH_DIR / sub, TWIN_BENCH_DIR / sub):
        runs, note = load_bench_runs(trace.meta, folder)
        if runs:
            return runs, note
    if not sub and Path(str(trace.path)).name == TWIN_TRACE.name and (BUNDLED_TRACE / "meta.json").exists():
        runs, note = load_bench_runs(read_meta(BUNDLED_TRACE), BENCH_DIR / sub)
        note = ("The controller has not been measured in the engine on the memory-bound twin yet: the engine "
                f"tables below are the bundled (cache-resident) pair's, `{BUNDLED_TRACE.name}`. " + note)
    return runs, note


def regime_of(result: dict[str, Any]) -> str:
    """The regime a benchmark result was measured in, from its target: the memory-bound twin (``speclimits
    models twin``) or the bundled pair as trained (cache-resident on this CPU)."""
    target = Path(str(result.get("config", {}).get("target", "")))
    twin = "twin" in target.name or (target / "twin.json").exists()
    return "memory-bound twin" if twin else "cache-resident pair"


def regime_contrast(runs: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]], label: str,
                    other_label: str) -> pd.DataFrame:
    """The best policy against the best stock static K per batch size in two sets of benchmark results
    (e.g. the two regimes'): the best stock K (chosen on the even blocks / by all blocks' time per token),
    the paired and workload ratios and the share of the exact Oracle's gain, with 95% intervals."""
    def k_of(key: str | None) -> str:
        return str(arms.arm(key).k) if key else "–"

    rows = []
    for name, results in ((label, runs), (other_label, other)):
        for batch in sorted(results):
            b = engine_best(engine_table(results[batch]), results[batch])
            rows.append({"Regime": name, "Batch": batch,
                         "Best stock K (even / workload)": f"{k_of(b.best_static)} / {k_of(b.workload_static)}",
                         "Best policy": arm_name(b.policy),
                         "Paired [95% CI]": fmt_ci(b.speed, b.speed_lo, b.speed_hi, 3),
                         "Workload [95% CI]": fmt_ci(b.workload, b.workload_lo, b.workload_hi, 3),
                         "Share of exact Oracle's gain, engine [95% CI]": fmt_ci(b.share, b.share_lo, b.share_hi, 2)})
    return pd.DataFrame(rows)


# -- Served load (benchmarks/bench_serve.py) -------------------------------------------------------

#: the served-load metrics shown, as (summary key, label); each turned into a speed (> 1: the arm is faster)
SERVE_METRICS = (("mean_e2el_ms", "E2E latency"), ("mean_tpot_ms", "TPOT"), ("output_throughput", "throughput"))


def serve_summary(trace) -> tuple[dict[str, Any] | None, str]:
    """The served-load ``summary.json`` (``benchmarks/bench_serve.py``) run on ``trace``'s prompts, from
    ``data/control/twin/serve/`` or ``data/control/serve/``; (None, why) when there is none."""
    name = Path(str(trace.path)).name
    for folder in (TWIN_BENCH_DIR / "serve", BENCH_DIR / "serve"):
        path = folder / "summary.json"
        if path.exists():
            summ = read_json(path, "served-load summary", ValueError)
            if Path(str(summ["config"]["trace"])).name == name:
                summ["file"] = str(path.relative_to(BENCH_DIR.parent.parent))
                return summ, f"served-load runs: `{summ['file']}`"
    return None, f"no served-load runs on {name}'s prompts (data/control/twin/serve/, data/control/serve/)"


def _speed(entry: dict[str, Any], metric: str) -> tuple[float, float, float]:
    """(ratio, lo, hi) of a summary ratio turned into a speed (> 1: faster): times are inverted."""
    r, lo, hi = (float("nan") if entry.get(k) is None else float(entry[k]) for k in ("ratio", "lo", "hi"))
    return (r, lo, hi) if metric == "output_throughput" else (1 / r, 1 / hi, 1 / lo)


def serve_long(summ: dict[str, Any]) -> pd.DataFrame:
    """One row per (rate, metric, reference) for the controller (the one policy arm): its speed against the
    best stock K at that rate and against plain decoding, with 95% intervals over repeats."""
    rows = pd.DataFrame(summ["rows"])
    arm = next(a for a in rows["arm"] if arms.arm(a).kind == "policy")
    out = []
    for r in rows[rows["arm"] == arm].itertuples():
        for metric, label in SERVE_METRICS:
            for ref, key in (("best stock K", "vs_best_stock"), ("plain decoding", "vs_plain")):
                s, lo, hi = _speed(getattr(r, key)[metric], metric)
                best = (next(v for k, v in summ["best_stock"].items() if np.isclose(float(k), r.rate))[metric]
                        if ref == "best stock K" else "plain")  # the stock K best at this rate
                out.append({"rate": float(r.rate), "metric": label, "against": ref, "reference": arm_name(best),
                            "speed": s, "lo": lo, "hi": hi, "concurrency": float(r.mean_concurrency)})
    return pd.DataFrame(out)


def serve_verdicts(summ: dict[str, Any]) -> pd.DataFrame:
    """Per rate, the aims of issue 43 on the served load, judged on the mean E2E latency (what a request
    waits, queueing included): the controller at least as fast as the best stock K at that rate (speed >= 1)
    and at least 0.95x plain decoding; each with its 95% interval over repeats."""
    long = serve_long(summ)
    e2e = long[long["metric"] == "E2E latency"]
    out = []
    for rate, g in e2e.groupby("rate"):
        st, pl = (g[g["against"] == ref].iloc[0] for ref in ("best stock K", "plain decoding"))
        out.append({"rate": rate, "concurrency": st["concurrency"], "best_stock": st["reference"],
                    "vs_stock": st["speed"], "vs_stock_lo": st["lo"], "vs_stock_hi": st["hi"],
                    "vs_plain": pl["speed"], "vs_plain_lo": pl["lo"], "vs_plain_hi": pl["hi"],
                    "stock_met": bool(st["speed"] >= 1.0), "plain_met": bool(pl["speed"] >= 0.95)})
    return pd.DataFrame(out)


def serve_table(summ: dict[str, Any]) -> pd.DataFrame:
    """The served-load table: per rate, the controller's mean concurrency, its speed against the best stock K
    (E2E latency, TPOT, output throughput) and against plain decoding (E2E), and the verdict."""
    cell = {(r.rate, r.metric, r.against): fmt_ci(r.speed, r.lo, r.hi, 3) for r in serve_long(summ).itertuples()}
    return pd.DataFrame([{"rate (req/s), concurrency": f"{v.rate:g}, {v.concurrency:.1f}",
                          "E2E vs best stock K": f"{cell[v.rate, 'E2E latency', 'best stock K']} ({v.best_stock})",
                          "TPOT vs best stock K": cell[v.rate, "TPOT", "best stock K"],
                          "throughput vs best stock K": cell[v.rate, "throughput", "best stock K"],
                          "E2E vs plain": cell[v.rate, "E2E latency", "plain decoding"],
                          "aims (≥ stock, ≥ 0.95× plain)": f"{'met' if v.stock_met else 'missed'}, "
                                                           f"{'met' if v.plain_met else 'missed'}"}
                         for v in serve_verdicts(summ).itertuples()])


def serve_caption(summ: dict[str, Any]) -> str:
    """What a served-load table measured: server, machine, regime, arms, repeats, requests and file."""
    from speclimits.machine import describe

    cfg = summ["config"]
    temp = float(cfg.get("temperature") or 0.0)
    return (f"Measured inside `vllm serve`{f' at temperature {temp:g}' if temp else ''} (vLLM {summ['vllm']}) on "
            f"{describe(summ['machine']['cpu'])}, {regime_of({'config': {'target': cfg['target']}})}: the controller "
            f"({arm_name(cfg['policy_name'])}) against the best stock static K at each rate (stock K = {cfg['k']}) and "
            f"plain decoding; {cfg['repeats']} repeats × {cfg['requests']} requests of {cfg['tokens']} tokens per "
            f"rate, Poisson arrivals, at most {cfg['max_num_seqs']} requests at once (`{summ['file']}`).")


def serve_verdict(summ: dict[str, Any]) -> str:
    """Markdown: per load point, was the controller at least as fast as the best stock K and 0.95x plain?"""
    ver, cfg = serve_verdicts(summ), summ["config"]
    parts = [f"{r.rate:g} req/s (concurrency {r.concurrency:.1f}): {fmt_ci(r.vs_stock, r.vs_stock_lo, r.vs_stock_hi, 3)}× "
             f"{r.best_stock} ({'met' if r.stock_met else 'missed'}, interval {side_of_one(r.vs_stock_lo, r.vs_stock_hi).removesuffix(' 1')} 1), "
             f"{fmt_ci(r.vs_plain, r.vs_plain_lo, r.vs_plain_hi, 3)}× plain decoding ({'met' if r.plain_met else 'missed'})"
             for r in ver.itertuples()]
    n_ok = int((ver["stock_met"] & ver["plain_met"]).sum())
    n_clear = int((ver["vs_stock_lo"] > 1).sum())
    return (f"**Under served load** ({cfg['policy_name']} inside `vllm serve`, {cfg['repeats']} repeats of "
            f"{cfg['requests']} requests per rate; speed in mean end-to-end latency, 95% interval over repeats): "
            + "; ".join(parts) + f". Both aims met (point estimates) at {n_ok} of {len(ver)} request rates; faster than "
            f"the best stock K with the interval above 1 at {n_clear}.")


def serve_key_rows(summ: dict[str, Any] | None, ref: str = "tbl-control-served") -> list[Result]:
    """Headline rows of the served load: per request rate, the controller's speed in mean E2E latency against
    the best stock K at that rate (95% interval over repeats)."""
    if summ is None:
        return []
    return [Result.of(f"served, {r.rate:g} req/s (concurrency {r.concurrency:.1f}): controller over {r.best_stock}, "
                      "speed in mean E2E latency", r.vs_stock, r.vs_stock_lo, r.vs_stock_hi, decimals=3, ref=ref)
            for r in serve_verdicts(summ).itertuples()]


# -- The batch rule, piece by piece (benchmarks/batch_replay_sweep.py --hindsight) -----------------

#: the pieces of a step's price, in the order they are added, as (rule key, label)
BATCH_PIECES = (("delta-fixed:alone", "each request priced alone"),
                ("delta-fixed", "one decision for the batch (drafter to the last stop, each its best prefix)"),
                ("delta-fixed:zero-k", "and k = 0 allowed"),
                ("delta:zero-k", "the same, running λ"))


def batch_pieces(trace) -> tuple[pd.DataFrame | None, str]:
    """The batch replay of each piece of the batch decision (``batch-rule-offline.json`` beside the trace's
    engine runs), with the draft's confidences and with hindsight: per piece and batch size, the best speed
    ratio to the best static K over the λ scales tried (at λ as fitted in parentheses); (None, why) without."""
    runs, _ = bench_runs(trace)
    if not runs:
        return None, "no engine runs for this trace, so no batch replay of the batch rule's pieces"
    twin = regime_of(next(iter(runs.values()))) == "memory-bound twin"
    path = (TWIN_BENCH_DIR if twin else BENCH_DIR) / "batch-rule-offline.json"
    if not path.exists():
        return None, f"no batch replay of the batch rule's pieces for this trace's engine runs ({path.name})"
    data = read_json(path, "batch replay", ValueError)
    cols: dict[str, dict[str, str]] = {}
    for res in data["results"].values():
        rows = pd.DataFrame(res["rows"])
        for conf, label in (("draft", "confidences"), ("hindsight", "hindsight")):
            col = f"batch {res['batch']}, {label}"
            cols[col] = {}
            for key, _ in BATCH_PIECES:
                g = rows[(rows["arm"] == key) & (rows["confidence"] == conf)]
                if g.empty:
                    continue
                at = g[np.isclose(g["lambda_scale"].astype(float), 1.0)]["vs_best_static"]
                cols[col][key] = f"{g['vs_best_static'].max():.3f}" + (f" ({at.iloc[0]:.3f})" if len(at) else "")
    table = pd.DataFrame({"piece": [label for _, label in BATCH_PIECES],
                          **{c: [v.get(k, "–") for k, _ in BATCH_PIECES] for c, v in cols.items()}})
    return table, str(path.relative_to(BENCH_DIR.parent.parent))


#: The runs on the unseen prompts that section 8 decomposes, per batch size (one machine's newest, all running the
#: running-λ Delta rule), and the trace of those prompts that prices their rungs (``data/control/twin/fresh/``).
FRESH_DECOMPOSED = {1: "amd-epyc-c/bench-batch1.json", 4: "amd-epyc-c/overhead/bench-batch4.json",
                    8: "amd-epyc-c/b8/bench-batch8.json"}
FRESH_TRACE = "trace"


def unseen_gaps(trace, rule: str = "delta", n_rollouts: int = 64, n_boot: int = 999, seed: int = 0
                ) -> tuple[dict[int, pd.DataFrame], dict[int, dict[str, Any]], str]:
    """The gap decomposition of the benchmarks on unseen prompts (:data:`FRESH_DECOMPOSED`), its rungs replayed
    on a trace of those prompts: ``(tables by batch, results by batch, note)``; empty with a note off the twin's
    trace or where a file is missing. The policy is each result's own (``policy_fit``)."""
    from speclimits.control.decompose import gap_decomposition
    from speclimits.control.fit import greedy_setup
    from speclimits.control.rules import PolicyFit
    from speclimits.trace import read_trace

    folder = TWIN_BENCH_DIR / "fresh"
    if Path(str(trace.path)).name != TWIN_TRACE.name:
        return {}, {}, "the runs on unseen prompts are the memory-bound twin's: no decomposition of them here"
    missing = [str(folder / f) for f in [FRESH_TRACE, *FRESH_DECOMPOSED.values()] if not (folder / f).exists()]
    if missing:
        return {}, {}, f"no decomposition of the runs on unseen prompts: missing {', '.join(missing)}"
    fresh = read_trace(folder / FRESH_TRACE)
    gaps, runs = {}, {}
    for batch, name in sorted(FRESH_DECOMPOSED.items()):
        res = dict(read_json(folder / name, "benchmark result", ValueError), file=f"fresh/{name}")
        fit = PolicyFit.from_dict(res["policy_fit"], origin=str(folder / name))
        gaps[batch] = gap_decomposition(fit, greedy_setup(fresh, fit.cost_model), rule=rule, bench=res,
                                        n_rollouts=n_rollouts, n_boot=n_boot, seed=seed)
        runs[batch] = res
    return gaps, runs, ""


def acceptance_scores(trace, run: dict[str, Any], unseen: Any = TWIN_BENCH_DIR / "fresh" / FRESH_TRACE
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """How well the policy that ``run`` (a benchmark result) ran predicts which drafts match: its acceptance model
    and the confidence-only calibration (:func:`speclimits.control.acceptance.compare_acceptance`), both fitted on
    the policy's train references of ``trace``, scored on its held-out references and on the unseen prompts'
    trace ``unseen`` (default ``data/control/twin/fresh/trace``; None or absent: none). Returns ``(scores, bias)``: per set and model AUC,
    log loss, Brier and steps; per set, model and draft step the mean predicted minus the observed match rate."""
    from speclimits.control.acceptance import compare_acceptance
    from speclimits.control.fit import greedy_setup
    from speclimits.control.offline import select
    from speclimits.control.rules import PolicyFit
    from speclimits.trace import read_trace

    fit = PolicyFit.from_dict(run["policy_fit"], origin=str(run.get("file", "benchmark result")))
    setup = greedy_setup(trace, fit.cost_model)
    train = select(setup, [str(x) for x in fit.train_seq_ids])[0]
    sets = {"held-out references": select(setup, [str(x) for x in fit.test_seq_ids])[0]}
    if unseen is not None and (Path(unseen) / "meta.json").exists():
        sets["unseen prompts"] = greedy_setup(read_trace(unseen), fit.cost_model).raw_inputs
    scores, bias = [], []
    for name, test in sets.items():
        sc, rel = compare_acceptance(fit, train, test)
        scores.append(sc.assign(set=name))
        w = rel.assign(err=rel["n"] * (rel["mean_predicted"] - rel["observed"]))
        g = w.groupby(["model", "position"], sort=False)[["err", "n"]].sum().reset_index()
        bias.append(g.assign(bias=g["err"] / g["n"], set=name)[["set", "model", "position", "bias", "n"]])
    out = pd.concat(scores, ignore_index=True)
    out = pd.DataFrame({"Steps of": out["set"], "Model": out["model"], "Features": out["features"],
                        "AUC": out["auc"].round(3), "Log loss": out["log_loss"].round(3),
                        "Brier": out["brier"].round(3), "Steps": out["n"].astype(int)})
    return out, pd.concat(bias, ignore_index=True)


#: ``benchmarks/acceptance_features.py``'s output on the twin (the features the engine does not read)
FEATURE_STUDY = TWIN_BENCH_DIR / "features" / "study.json"


def feature_study(path: Any = FEATURE_STUDY) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The acceptance-feature study (``benchmarks/acceptance_features.py``): per model its held-out and
    unseen-prompt AUC and log loss; per replay the selected model's rule over the engine model's, paired, with
    its interval, for each Delta rule. A missing or broken file raises ``ValueError`` naming it."""
    d = read_json(path, "feature study", ValueError)
    unseen = d.get("unseen", {})
    rows = []
    for name, m in d["held_out_scores"].items():
        u = unseen.get("scores", {}).get(name, {})
        rows.append({"Model": name, "AUC, held-out": round(m["auc"], 3), "Log loss, held-out": round(m["log_loss"], 4),
                     "AUC, unseen": round(u.get("auc", np.nan), 3), "Log loss, unseen": round(u.get("log_loss", np.nan), 4)})
    replays = {f"batch 1, held-out references ({d['references']['held_out']})": d["batch1_held_out"]}
    if unseen:
        replays[f"batch 1, unseen prompts ({unseen['references']})"] = unseen["batch1"]
        for file, r in unseen.get("runs", {}).items():
            replays[f"batch {r['batch']}, unseen, `{str(file).removeprefix('data/control/twin/')}`"] = r
    ratios = []
    for label, r in replays.items():
        row = {"Replay": label}
        for rule in ("delta", "delta-fixed"):
            x = r.get(f"{rule}: selected over engine's model")
            row[arm_name(rule)] = fmt_ci(x["ratio"], x["lo"], x["hi"], decimals=3) if x else "–"
        ratios.append(row)
    return pd.DataFrame(rows), pd.DataFrame(ratios)


#: ``benchmarks/batch_tails.py``'s output on the unseen prompts (replayed runs and the measured batch trace)
BATCH_TAILS = TWIN_BENCH_DIR / "fresh" / "amd-epyc-c" / "decomposition" / "batch-tails.json"


def batch_tails(path: Any = BATCH_TAILS) -> pd.DataFrame:
    """The batch's tail per static K: measured (the batch trace's timed steps) beside the replay of the benchmark
    run at the same batch size whose K are the trace's (the first such run): the share of decoding time after the
    batch's first request finished, and each K's time per token over K = 2's, per full-batch step and per block."""
    d = read_json(path, "batch-tail split", ValueError)
    meas = pd.DataFrame(d["measured"]["rows"]).set_index("K")
    b = int(meas["b"].iloc[0])
    run = next((r for r in d["runs"].values() if int(r["batch"]) == b), None)
    rep = pd.DataFrame(run["rows"]).set_index("K") if run else None

    def rel(t: pd.DataFrame, col: str) -> pd.Series:
        return t[col] / t.loc[2, col] if 2 in t.index else t[col] * np.nan

    out = pd.DataFrame({"K": meas.index,
                        "Tail % (measured)": (100 * meas["tail_share"]).round(1).to_numpy(),
                        "Tail % (replay)": [round(100 * rep["tail_share"].get(k, np.nan), 1) if rep is not None
                                               else np.nan for k in meas.index],
                        "Time/token vs K = 2, full steps": rel(meas, "full_batch_ms_per_token").round(3).to_numpy(),
                        "Time/token vs K = 2, batches": rel(meas, "block_ms_per_token").round(3).to_numpy()})
    trace = d["measured"]["trace"]
    meta = read_meta(REPO_ROOT / trace)
    out.attrs = {"batch": b, "batches": int(meas["batches"].iloc[0]), "trace": trace, "cpu": meta.get("cpu", {}),
                 "simulated": bool(d["measured"].get("simulated", meta.get("simulated", False)))}
    return out


def tail_plan(path: Any = BATCH_TAILS) -> pd.DataFrame:
    """``batch_tails.py --plan``: per replayed run (its batch size and the CPU its profile was measured on) and
    Delta rule, the speed over the best static K unweighted, with the tail planner's (γ, s) chosen on the train
    references, and with the best (γ, s) in hindsight; empty where the file has no planner replay."""
    d = read_json(path, "batch-tail split", ValueError)
    rows = []
    for run, v in d.get("plan", {}).items():
        cpu = v.get("cpu") or {}
        where = cpu.get("model", "?") + (f", family {cpu['family']} model {cpu['model_id']}" if "family" in cpu
                                         else f", L1d {cpu.get('cache_kib', {}).get('L1d', '?')} KiB")
        for r in v["rows"]:
            rule = "Delta rule, fixed λ, true match probabilities" if r["rule"] == "true" else arm_name(r["rule"])
            rows.append({"Batch": int(v["batch"]), "Profile measured on": where, "Run": run.split("fresh/")[-1],
                         "Rule": rule, "Per round (today)": round(r["unweighted"], 3),
                         "Tail planner, (γ, s) from train": round(r["train_chosen"], 3),
                         "Tail planner, best (γ, s) in hindsight": round(r["hindsight"], 3)})
    out = pd.DataFrame(rows)
    out.attrs = {"produced_by": d.get("produced_by", "")}
    return out


def decomposition(gaps: dict[int, pd.DataFrame], full: bool = False, column: str = "share") -> pd.DataFrame:
    """:func:`speclimits.control.decompose.gap_decomposition` per batch size in one table: per rung, the loss
    from the rung above and the share of the exact Oracle's gain over the best static K (replay world), or with
    ``column="speed"`` the speed over the best static K; ``full``: both per batch size (the download)."""
    if column not in ("share", "speed"):
        raise ValueError("column must be 'share' or 'speed'")
    first = next(iter(gaps.values()))
    out = pd.DataFrame({"rung": [f"{r}. {n}" for r, n in zip(first["rung"], first["name"])],
                        "lost from the rung above": first["loss"].replace("", "–").fillna("–")})
    for batch, gap in sorted(gaps.items()):
        if full:
            out[f"batch {batch}: speed"] = ci_column(gap, "speed_replay", 3)
            out[f"batch {batch}: share"] = ci_column(gap, "share_replay", 3)
        else:
            out[f"batch {batch}"] = ci_column(gap, f"{column}_replay", 3)
    return out
