"""Reading the committed benchmark results and setting them beside the offline prediction (book section 8).

The benchmark JSON files live in :data:`BENCH_DIR` (``data/control/bench-*.json``, written by
``speclimits control bench``; measured, see their ``label`` and ``produced_by``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.paths import DATA_DIR

#: Where the committed benchmark results live.
BENCH_DIR = DATA_DIR / "control"

#: Arms shown as policies (the rest are plain decoding and static K).
POLICY_LABELS = {"threshold": "confidence threshold", "delta": "Delta rule, running λ",
                 "delta-fixed": "Delta rule, fixed λ", "ema": "EMA of accepted length (SGLang-style)",
                 "cascade": "utility test-and-set (Cascade-style)"}


def load_bench_runs(trace_meta: dict[str, Any], folder: Path = BENCH_DIR) -> tuple[dict[int, dict[str, Any]], str]:
    """``({batch: result}, note)``: the benchmark results in ``folder`` that were fitted on the trace
    with ``trace_meta`` (same ``created`` stamp); the note says what was found or why nothing was."""
    files = sorted(Path(folder).glob("bench-*.json"))
    if not files:
        return {}, f"no benchmark results in {folder} (run benchmarks/bench_control.py)"
    runs, other = {}, []
    for f in files:
        res = json.loads(f.read_text())
        created = (res.get("policy_fit", {}).get("data", {}) or {}).get("trace_created")
        if created != trace_meta.get("created"):
            other.append(f.name)
            continue
        runs[int(res["config"]["batch"])] = {**res, "file": f.name}
    note = f"benchmark results: {', '.join(r['file'] for r in runs.values()) or 'none for this trace'}"
    if other:
        note += f"; {', '.join(other)} measured on another trace (not shown)"
    return runs, note


def engine_vs_offline(result: dict[str, Any]) -> pd.DataFrame:
    """Per arm of one benchmark result: measured ms/token (median, min, max over blocks), the share of the
    exact-greedy and surrogate Oracle's gain captured in the engine (min/max over blocks) and offline
    (95% interval over references), the acceptance length measured and predicted by the replay."""
    s = pd.DataFrame(result["summary"])
    cols = ["arm", "ms_per_token", "ms_per_token_min", "ms_per_token_max", "cpu_ms_per_token", "speedup_vs_plain",
            "vs_best_static", "spec_decode_acceptance_length", "offline_replay_tokens_per_round",
            "engine_share_exact", "engine_share_exact_min", "engine_share_exact_max", "offline_share_exact",
            "offline_share_exact_lo", "offline_share_exact_hi", "engine_share_surrogate", "offline_share_surrogate",
            "decision_us_per_round", "round_ms"]
    s = s[[c for c in cols if c in s.columns]].copy()
    s.insert(1, "policy", s["arm"].map(lambda a: POLICY_LABELS.get(a, a)))
    return s


def share_long(table: pd.DataFrame, batch: int) -> pd.DataFrame:
    """Long form for the figure: ``policy``, ``where`` (offline / engine), ``share``, ``lo``, ``hi``, ``batch``."""
    pol = table[table["arm"].isin(list(POLICY_LABELS))]
    off = pd.DataFrame({"policy": pol["policy"], "where": "offline (replay)", "share": pol["offline_share_exact"],
                        "lo": pol["offline_share_exact_lo"], "hi": pol["offline_share_exact_hi"]})
    eng = pd.DataFrame({"policy": pol["policy"], "where": "engine (measured)", "share": pol["engine_share_exact"],
                        "lo": pol["engine_share_exact_min"], "hi": pol["engine_share_exact_max"]})
    out = pd.concat([off, eng], ignore_index=True)
    out["batch"] = batch
    return out


def gap_lines(result: dict[str, Any]) -> list[str]:
    """The measured figures behind the gap between offline prediction and engine, one line each."""
    s = pd.DataFrame(result["summary"]).set_index("arm")
    pol = s.loc[[a for a in s.index if a in POLICY_LABELS]]
    static = s.loc[[a for a in s.index if a.startswith("static:")]]
    best = pol["engine_share_exact"].idxmax()
    acc = ", ".join(f"{a.split(':')[1]}: {r.spec_decode_acceptance_length:.3f}/{r.offline_replay_tokens_per_round:.3f}"
                    for a, r in static.iterrows())
    return [
        f"best policy in the engine: {POLICY_LABELS[best]}, share {s.loc[best, 'engine_share_exact']:+.2f} "
        f"(offline {s.loc[best, 'offline_share_exact']:+.2f}); best static K in the engine: "
        f"{s.index[s['best_static']][0]}",
        f"acceptance length, engine/replay, by static K: {acc}",
        f"decision overhead: {pol['decision_us_per_round'].min():.0f}-{pol['decision_us_per_round'].max():.0f} µs per "
        f"drafting call for the policies, against calls of {pol['round_ms'].min():.1f}-{pol['round_ms'].max():.1f} ms",
        f"draft steps run past a request's own k (early-exit granularity): "
        f"{pol['wasted_draft_steps_per_request_round'].min():.2f}-"
        f"{pol['wasted_draft_steps_per_request_round'].max():.2f} per request per round",
    ]
