"""Reader-facing tables of the online-control section (book section 8).

The offline prediction (:func:`speclimits.control.offline.offline_table`) and the measured engine
benchmark (:func:`speclimits.control.report.engine_vs_offline` on ``data/control/bench-*.json``) as
small frames with readable headers, estimates and their intervals in one cell; the headline
sentence (did any policy beat the best static K in the engine?) and the key-results rows.

Intervals: offline shares carry 95% bootstrap intervals over references; engine figures carry the
range (min; max) over the benchmark's alternating blocks, the only spread it records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.book.present import Result, fmt_ci, fmt_num
from speclimits.control.report import POLICY_LABELS, share_long


#: Short names of the policies for table cells (the page's list of policies says what each is).
SHORT_NAMES = {"threshold": "confidence threshold", "delta": "Delta rule, running λ",
               "delta-fixed": "Delta rule, fixed λ", "ema": "SGLang-style EMA", "cascade": "Cascade-style"}


def arm_name(arm: str) -> str:
    """``static:2`` -> ``static K = 2``, a policy's key -> its short name, ``plain`` -> ``plain decoding``."""
    arm = str(arm)
    if arm.startswith("static:"):
        return f"static K = {arm.split(':', 1)[1]}"
    if arm == "plain":
        return "plain decoding"
    return SHORT_NAMES.get(arm, POLICY_LABELS.get(arm, arm))


def offline(table: pd.DataFrame) -> pd.DataFrame:
    """The offline prediction per policy: replayed and surrogate ms/token, and the share of each
    Oracle's gain over the best static K captured, with its 95% interval over references."""
    return pd.DataFrame({
        "Policy": [arm_name(p) for p in table["policy"]],
        "Replay (ms/token)": table["replay_ms_per_token"].to_numpy(),
        "Replay tokens per round": table["replay_tokens_per_round"].to_numpy(),
        "Surrogate (ms/token)": table["surrogate_ms_per_token"].to_numpy(),
        "Share captured, exact Oracle [95% CI]": [fmt_ci(e, lo, hi) for e, lo, hi in zip(
            table["share_exact"], table["share_exact_lo"], table["share_exact_hi"])],
        "Share captured, surrogate Oracle [95% CI]": [fmt_ci(e, lo, hi) for e, lo, hi in zip(
            table["share_surrogate"], table["share_surrogate_lo"], table["share_surrogate_hi"])],
    })


def _range(est: Any, lo: Any, hi: Any, decimals: int) -> str:
    return fmt_ci(est, lo, hi, decimals=decimals)


def engine(table: pd.DataFrame) -> pd.DataFrame:
    """One benchmark result (:func:`~speclimits.control.report.engine_vs_offline`) for the reader:
    measured ms/token [min; max over blocks], speed against plain decoding and the best static K,
    acceptance length measured and replayed, and the share of the exact Oracle's gain captured in
    the engine [min; max over blocks] (the offline share is in the figure and the full table)."""
    acc = [("–" if pd.isna(e) else f"{e:.2f} / {r:.2f}")
           for e, r in zip(table["spec_decode_acceptance_length"], table["offline_replay_tokens_per_round"])]
    return pd.DataFrame({
        "Arm": [arm_name(a) for a in table["arm"]],
        "ms/token [min; max]": [_range(e, lo, hi, 1) for e, lo, hi in zip(
            table["ms_per_token"], table["ms_per_token_min"], table["ms_per_token_max"])],
        "Speed vs plain": table["speedup_vs_plain"].to_numpy(),
        "Speed vs best static K": table["vs_best_static"].to_numpy(),
        "Acceptance length, engine / replay": acc,
        "Share of the Oracle's gain captured [min; max]": [_range(e, lo, hi, 2) for e, lo, hi in zip(
            table["engine_share_exact"], table["engine_share_exact_min"], table["engine_share_exact_max"])],
    })


def share_frame(tables: dict[int, pd.DataFrame], batch: int) -> pd.DataFrame:
    """:func:`~speclimits.control.report.share_long` of one batch's table, with the policies' short
    names (the figure's labels then leave room for the plot in the content column)."""
    table = tables[batch]
    return share_long(table.assign(policy=table["arm"].map(arm_name)), batch)


@dataclass
class EngineBest:
    """The fastest policy of one benchmark result against its best static K."""

    batch: int
    policy: str  # the arm's key
    best_static: str  # the best static arm's key
    ms_per_token: float
    static_ms_per_token: float
    speed: float  # best static's ms/token over the policy's (> 1: the policy is faster)
    speed_lo: float  # min and max over blocks of the same ratio, block by block
    speed_hi: float
    share: float  # share of the exact Oracle's gain captured in the engine
    share_lo: float
    share_hi: float
    oracle_gain: float  # exact Oracle over the best static K on the same prompts (offline, cost model)
    n_policies: int
    n_faster: int  # policies whose median ms/token beats the best static K's

    @property
    def beat(self) -> bool:
        return self.n_faster > 0


def engine_best(result: dict[str, Any]) -> EngineBest:
    """The fastest policy in one benchmark result, with the per-block range of its speed ratio."""
    s = pd.DataFrame(result["summary"]).set_index("arm")
    pols = [a for a in s.index if a in POLICY_LABELS]
    if not pols:
        raise ValueError(f"{result.get('file', 'benchmark')}: no policy arms")
    static = s.index[s["best_static"].astype(bool)][0]
    best = s.loc[pols, "ms_per_token"].astype(float).idxmin()
    blocks = pd.DataFrame(result.get("blocks") or [])
    ratios = np.array([np.nan])
    if len(blocks) and {"arm", "block", "ms_per_token"} <= set(blocks.columns):
        per = blocks.pivot_table(index="block", columns="arm", values="ms_per_token")
        if static in per.columns and best in per.columns:
            ratios = (per[static] / per[best]).dropna().to_numpy()
    t_pol, t_static = float(s.loc[best, "ms_per_token"]), float(s.loc[static, "ms_per_token"])
    return EngineBest(
        batch=int(result["config"]["batch"]), policy=best, best_static=static, ms_per_token=t_pol,
        static_ms_per_token=t_static, speed=t_static / t_pol,
        speed_lo=float(np.min(ratios)) if len(ratios) else np.nan,
        speed_hi=float(np.max(ratios)) if len(ratios) else np.nan,
        share=float(s.loc[best, "engine_share_exact"]), share_lo=float(s.loc[best, "engine_share_exact_min"]),
        share_hi=float(s.loc[best, "engine_share_exact_max"]),
        oracle_gain=float((result.get("oracle") or {}).get("oracle_exact_gain_over_best_static", np.nan)),
        n_policies=len(pols), n_faster=int((s.loc[pols, "ms_per_token"].astype(float) < t_static).sum()))


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


def verdict(runs: dict[int, dict[str, Any]], offline_table: pd.DataFrame, bounds: dict[str, Any]) -> str:
    """The section's answer in two or three sentences (Markdown): did a policy beat the best static K?"""
    off = offline_best(offline_table)
    text = ("**Offline** (replay on the held-out references), "
            + (f"{off['n_faster']} of {off['n_policies']} policies beat" if off["n_faster"] else "no policy beat")
            + f" the best static K ({arm_name(off['best_static'])}); the best, {arm_name(off['policy'])}, captures "
            f"{fmt_ci(off['share'], off['share_lo'], off['share_hi'])} of the exact Oracle's gain "
            f"(the Oracle is {bounds['oracle_exact_gain_over_best_static']:.3f}× faster than the best static K there). ")
    if not runs:
        return text + "**In the engine**: no measured benchmark for this trace, so nothing is claimed about it."
    best = [engine_best(r) for _, r in sorted(runs.items())]
    parts = [f"at batch {b.batch} the fastest, {arm_name(b.policy)}, ran at {b.speed:.3f}× the speed of "
             f"{arm_name(b.best_static)} (per-block range {fmt_num(b.speed_lo, 2)}–{fmt_num(b.speed_hi, 2)}; "
             f"{b.n_faster} of {b.n_policies} policies faster)" for b in best]
    if not any(b.beat for b in best):
        head = "**In the engine no policy beat the best static K**: "
    else:
        head = "**In the engine** " + ", ".join(f"{b.n_faster} of {b.n_policies} policies beat the best static K "
                                                f"at batch {b.batch}" for b in best) + ": "
    oracle = best[0].oracle_gain
    return (text + head + "; ".join(parts) + ". " +
            (f"The Oracle's bound on the same prompts is {oracle:.3f}× the best static K (exact greedy, priced by "
             "the cost model)." if np.isfinite(oracle) else ""))


def key_rows(runs: dict[int, dict[str, Any]], offline_table: pd.DataFrame, bounds: dict[str, Any],
             refs: dict[int, str] | None = None, offline_ref: str | None = None) -> list[Result]:
    """Headline rows: per measured batch, the fastest policy's speed against the best static K and
    its share of the Oracle's gain (ranges over blocks); the Oracle's bound. Without a benchmark,
    the offline prediction's best policy instead. The paper has no online policy: no paper column."""
    refs = refs or {}
    rows = []
    if runs:
        best = [engine_best(r) for _, r in sorted(runs.items())]
        for b in best:
            rows.append(Result.of(f"batch {b.batch}, engine: fastest policy ({arm_name(b.policy)}) over "
                                  f"{arm_name(b.best_static)}, speed ratio (range over blocks)"
                                  + ("" if b.beat else "; no policy beat the best static K"),
                                  b.speed, b.speed_lo, b.speed_hi, decimals=3, ref=refs.get(b.batch)))
        for b in best:
            rows.append(Result.of(f"batch {b.batch}, engine: its share of the Oracle's gain (range over blocks)",
                                  b.share, b.share_lo, b.share_hi, decimals=2, ref=refs.get(b.batch)))
        if np.isfinite(best[0].oracle_gain):
            rows.append(Result.of("Oracle's bound over the best static K, same prompts (exact greedy, offline)",
                                  best[0].oracle_gain, decimals=3, ref=refs.get(best[0].batch)))
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
