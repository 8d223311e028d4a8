"""Section 3's panel on the per-expert cost measured by experiment (``benchmarks/bench_expert_cost.py``,
a JSON per run under ``data/expert_cost/``): α(m) beside the paper's and the bandwidth floor, the step at m = 4/5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits import paper, paths
from speclimits.book.present import finite, fmt_ci, fmt_fixed

#: An empty cell (the book's tables read it as empty, so number columns stay right-aligned).
MISSING = "–"


def load_runs(folder: str | Path | None = None) -> list[dict[str, Any]]:
    """Every result file of the benchmark in ``folder`` (default ``data/expert_cost``), by file name;
    files of another kind and runs without a fit are left out. Each dict gets ``file`` (the name)."""
    folder = Path(folder) if folder is not None else paths.EXPERT_COST_DIR
    runs = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("kind") == "expert_cost" and doc.get("analysis"):
            runs.append(doc | {"file": path.name})
    return runs


def run_label(run: dict[str, Any]) -> str:
    """``"CPU AMD EPYC, small shape, measured (gather)"``: the run's regime and the MoE path that ran."""
    return f"{run['regime']} ({run['run']['path']})"


def alpha_table_compact(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """:func:`alpha_table` narrowed to fit a page: α and β0 with intervals, α over the floor and over the
    paper's α (the floor and the paper's values are in the full table)."""
    full = alpha_table(runs)
    return full[["Run", "m", "α by experiment (ms/expert)", "β₀ (ms)", "α / floor", "α / paper"]].rename(
        columns={"α by experiment (ms/expert)": "α (ms/expert)"})


def alpha_table(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run and m: α(m) and β0(m) by experiment with 95% intervals (HC3), over all the model's MoE
    layers; the bandwidth floor (one expert's bytes × layers / the measured copy bandwidth) and α over it; the
    paper's regression α (A100, by regime; the paper's shape only) and α over its midpoint."""
    rows = []
    for run in runs:
        floor = run["floor"].get("ms_per_expert_all_layers")
        for r in run["analysis"]["by_m"]:
            lo, hi = r.get("paper_alpha_lo"), r.get("paper_alpha_hi")
            rows.append({
                "Run": run_label(run), "m": int(r["m"]),
                "α by experiment (ms/expert)": fmt_ci(r["alpha_all_layers"], r["alpha_lo_all_layers"],
                                                      r["alpha_hi_all_layers"], 4),
                "β₀ (ms)": fmt_ci(r["beta0_all_layers"], r["beta0_lo_all_layers"], r["beta0_hi_all_layers"], 3),
                "Bandwidth floor (ms/expert)": fmt_fixed(floor, 4),
                "α / floor": fmt_fixed(r.get("ratio_to_floor"), 2),
                "Paper α, regression (ms/expert)": f"{lo:.3f}–{hi:.3f}" if finite(lo) else MISSING,
                "α / paper": fmt_fixed(r.get("ratio_to_paper"), 2),
            })
    return pd.DataFrame(rows)


def step_table(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: mean α over m ≤ 4 and m ≥ 5 and their ratio, the jump α(5) − α(4) [95% CI], where
    the largest adjacent jump is, and whether a step at 4/5 appears with the routing held fixed."""
    rows = []
    for run in runs:
        s = run["analysis"]["step"]
        rows.append({
            "Run": run_label(run),
            "Mean α, m ≤ 4 (ms/expert)": fmt_fixed(s.get("alpha_small_mean"), 4),
            "Mean α, m ≥ 5 (ms/expert)": fmt_fixed(s.get("alpha_large_mean"), 4),
            "Ratio (paper ≈ 3.2)": fmt_fixed(s.get("ratio_large_to_small"), 2),
            "α(5) − α(4) (ms)": fmt_ci(s.get("jump"), s.get("jump_lo"), s.get("jump_hi"), 4),
            "Largest jump at m": s.get("largest_jump_at") or MISSING,
            "Step at 4/5": MISSING if s.get("step") is None else ("yes" if s["step"] else "no"),
        })
    return pd.DataFrame(rows)


def summary(runs: list[dict[str, Any]]) -> str:
    """The runs the panel rests on (device, shape, path, passes, date) and, without a GPU run, that the
    paper's regime is not measured here."""
    if not runs:
        return ("No run of `benchmarks/bench_expert_cost.py` is committed under `data/expert_cost/`: "
                "nothing measured by experiment yet.")
    lines = []
    for run in runs:
        sh = run["shape"]
        copy = run["floor"].get("copy_gb_per_s")
        lines.append(f"- `{run['file']}`: {run_label(run)}; {sh['hidden']}/{sh['inter']}, {sh['n_experts']} experts, "
                     f"top-{sh['top_k']}, {run['layers_used']} of {sh['n_layers']} layers, {run['dtype']}; "
                     f"{len(run['samples'])} passes ({run['run'].get('repeats_done', run['repeats'])} repeats), "
                     f"{run['date_utc']}; copy bandwidth {fmt_fixed(copy, 1)} GB/s.")
    if not any(str(r.get("machine", {}).get("device", "")).startswith("cuda") for r in runs):
        est = paper.BANDWIDTH_ESTIMATE
        lines.append(f"\nNo GPU run is committed yet (no GPU was available to the session that built the "
                     f"benchmark), so the paper's memory-bound regime is not measured here: the paper's own "
                     f"bandwidth estimate is {est['layers']} layers × {est['expert_mb']:g} MB at "
                     f"{est['tb_per_s']:g} TB/s ≈ {est['alpha_ms']} ms per expert. The prepared GPU command is in `data/expert_cost/README.md`.")
    return "\n".join(lines)
