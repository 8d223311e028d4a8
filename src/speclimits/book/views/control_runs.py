"""Arithmetic on the committed engine benchmarks (``data/control/bench-*.json``, written by
``speclimits control bench``), set beside the Oracle and the offline prediction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.control.offline import gain_share
from speclimits.arms import arm, offline_key, policy_label
from speclimits.jsonutil import read_json
from speclimits.paths import DATA_DIR

#: Where the committed benchmark results live: the bundled (cache-resident) pair's, and the memory-bound
#: twin's (``speclimits models twin``; fitted on ``data/traces/twin-eagle3``).
BENCH_DIR = DATA_DIR / "control"
TWIN_BENCH_DIR = BENCH_DIR / "twin"


def load_bench_runs(trace_meta: dict[str, Any], folder: Path = BENCH_DIR) -> tuple[dict[int, dict[str, Any]], str]:
    """``({batch: result}, note)``: the benchmark results in ``folder`` that were fitted on the trace
    with ``trace_meta`` (same ``created`` stamp); the note says what was found or why nothing was."""
    files = sorted(Path(folder).glob("bench-*.json"))
    if not files:
        return {}, f"no benchmark results in {folder} (run benchmarks/bench_control.py)"
    runs, other = {}, []
    for f in files:
        res = read_json(f, "benchmark result", ValueError)
        created = (res.get("policy_fit", {}).get("data", {}) or {}).get("trace_created")
        if created != trace_meta.get("created") or "choice" not in res:
            other.append(f.name)
            continue
        runs[int(res["config"]["batch"])] = {**res, "file": f.name}
    note = f"benchmark results: {', '.join(r['file'] for r in runs.values()) or 'none for this trace'}"
    if other:
        note += f"; {', '.join(other)} measured on another trace or by an older benchmark (not shown)"
    return runs, note


def is_policy(key: str) -> bool:
    """An arm run by a rule (not plain decoding, stock vLLM or a static K)."""
    return arm(key).kind == "policy"


def engine_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per arm of one benchmark result: its summary, the share of each Oracle's gain over the best
    static K captured in the engine, ``(1 - 1/r) / (1 - 1/G)`` for the speed ratio r to the best stock K (its
    interval mapped alike) and the Oracle's offline gain G on the same references, and the arm's offline share."""
    s = pd.DataFrame(result["summary"]).copy()
    bounds = result.get("oracle") or {}
    for key in ("exact", "surrogate"):
        gain = bounds.get(f"oracle_{key}_gain_over_best_static", np.nan)
        for suffix in ("", "_lo", "_hi"):
            r = s.get(f"vs_best_stock{suffix}", pd.Series(np.nan, index=s.index)).astype(float)
            r = r.to_numpy()
            s[f"engine_share_{key}{suffix}"] = gain_share(1.0, r, r / gain) if np.isfinite(gain) else np.nan
    off = pd.DataFrame(result.get("offline") or [])
    if len(off):
        off = off.set_index("policy")
        key = s["arm"].map(offline_key)
        for col in ("share_exact", "share_exact_lo", "share_exact_hi", "share_surrogate", "replay_tokens_per_round"):
            s[f"offline_{col}"] = key.map(off[col]) if col in off else np.nan
    return s


def share_long(table: pd.DataFrame, batch: int) -> pd.DataFrame:
    """Long form for the figure: ``policy`` (its label), ``where`` (offline / engine), ``share``, ``lo``, ``hi``,
    ``batch``."""
    pol = table[table["arm"].map(is_policy)]
    names = pol["arm"].map(policy_label)
    frames = [pd.DataFrame({"policy": names, "where": "engine (measured)", "share": pol["engine_share_exact"],
                            "lo": pol["engine_share_exact_lo"], "hi": pol["engine_share_exact_hi"]})]
    if "offline_share_exact" in pol:
        frames.insert(0, pd.DataFrame({"policy": names, "where": "offline (replay)", "share": pol["offline_share_exact"],
                                       "lo": pol["offline_share_exact_lo"], "hi": pol["offline_share_exact_hi"]}))
    out = pd.concat(frames, ignore_index=True)
    out["batch"] = batch
    return out


def extension_overhead(table: pd.DataFrame) -> pd.DataFrame:
    """The extension at static K against stock vLLM at the same K: ``k``, ``ratio`` (stock time / extension
    time, paired; < 1: the extension is slower) and its 95% interval."""
    s = table.set_index("arm")
    rows = []
    for key in s.index:
        a = arm(key)
        if a.kind == "static" and f"vs_stock_{a.k}" in s:
            k = a.k
            rows.append({"k": k, "ratio": s.loc[key, f"vs_stock_{k}"], "lo": s.loc[key, f"vs_stock_{k}_lo"],
                         "hi": s.loc[key, f"vs_stock_{k}_hi"]})
    return pd.DataFrame(rows, columns=["k", "ratio", "lo", "hi"])


def prediction_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Arms with an offline prediction: measured (median and pooled) and predicted ms/token, the relative
    error, and where the run measured its price level the rescaled prediction and its error."""
    cols = ["arm", "ms_per_token", "ms_per_token_pooled", "predicted_ms_per_token", "prediction_error",
            "price_level", "predicted_ms_per_token_rescaled", "prediction_error_rescaled"]
    if "predicted_ms_per_token" not in table:
        return pd.DataFrame(columns=cols)
    t = table[np.isfinite(table["predicted_ms_per_token"].astype(float))]
    return t[[c for c in cols if c in t]].reset_index(drop=True)


def gap_lines(result: dict[str, Any]) -> list[str]:
    """The measured figures behind the comparison, one line each (profile, extension cost, decision time,
    prediction error, load)."""
    t = engine_table(result)
    lines = []
    prof = result.get("profile") or {}
    if prof:
        v = prof["verify_ms"]
        lines.append(f"profiled at start ({prof['n_steps']} steps, batch {prof['batch']}): verification "
                     + ", ".join(f"m={m} {v[m]:.2f}" for m in sorted(v, key=int)) + " ms; drafter "
                     f"{prof['draft_ms0']:.2f} + {prof['draft_ms1']:.2f}·j ms; outside both {prof['other_ms']:.2f} ms")
    pol = t[t["arm"].map(is_policy)]
    if "decision_share" in t and len(pol):
        worst = pol.loc[pol["decision_share"].astype(float).idxmax()]
        line = (f"decision time: {pol['decision_us_per_round'].min():.0f}-{pol['decision_us_per_round'].max():.0f}"
                f" µs per round for the policies, {100 * pol['decision_share'].min():.2f}-"
                f"{100 * pol['decision_share'].max():.2f}% of a round (most: {worst['arm']})")
        if "decision_gross_share" in pol and (pol["decision_gross_share"] - pol["decision_share"]).abs().max() > 1e-6:
            line += (f"; net of vLLM's argmax where the controller makes the token choice (the confidence rules), "
                     f"{100 * pol['decision_gross_share'].min():.2f}-{100 * pol['decision_gross_share'].max():.2f}% gross")
        lines.append(line)
    over = extension_overhead(t)
    if len(over):
        lines.append("extension at static K vs stock vLLM at the same K (speed ratio [95% CI]): " + ", ".join(
            f"K={r.k}: {r.ratio:.3f} [{r.lo:.3f}; {r.hi:.3f}]" for r in over.itertuples()))
    pe = prediction_errors(t)
    if len(pe):
        worst = pe.loc[pe["prediction_error"].abs().idxmax()]
        lines.append(f"prediction (replay priced with the profiled costs) vs engine: |error| median "
                     f"{100 * pe['prediction_error'].abs().median():.1f}%, worst {worst['arm']} "
                     f"{100 * worst['prediction_error']:+.1f}%, {int((pe['prediction_error'].abs() <= 0.05).sum())} of "
                     f"{len(pe)} within 5%")
        if "prediction_error_rescaled" in pe and pe["prediction_error_rescaled"].notna().any():
            err = pe["prediction_error_rescaled"].astype(float)
            w2 = pe.loc[err.abs().idxmax()]
            lines.append(f"the same prediction at the run's measured price level ({pe['price_level'].min():.2f}-"
                         f"{pe['price_level'].max():.2f}): |error| median {100 * err.abs().median():.1f}%, worst "
                         f"{w2['arm']} {100 * w2['prediction_error_rescaled']:+.1f}%, {int((err.abs() <= 0.05).sum())} "
                         f"of {len(pe)} within 5%")
    if "price_scale" in t and len(pol):
        lines.append(f"price refresh: measured/priced round time {pol['price_scale'].min():.3f}-"
                     f"{pol['price_scale'].max():.3f} (median per arm)")
    if "load1_max" in t:
        lines.append(f"1-minute load average: at most {t['load1_max'].max():.2f}")
    return lines
