"""Sampled beside greedy requests on one machine (section 8): the Oracle's bound on each and the engine
benchmark at temperature 0.7. Measured traces and runs only; the machine and regime are read from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.book.present import ci_column, fmt_ci
from speclimits.book.views.control import _speed, regime_of
from speclimits.book.views.control_runs import TWIN_BENCH_DIR, engine_table, is_policy, load_bench_runs
from speclimits.arms import PLAIN, policy_label
from speclimits.jsonutil import read_json
from speclimits.machine import describe
from speclimits.oracle.report import oracle_report
from speclimits.paths import TRACES_DIR, TWIN_TRACE_EPYC_B
from speclimits.trace import read_meta
from speclimits.trace.sampling import Sampling

#: The twin traced at temperature 0.7 (``data/traces/twin-eagle3-t07``), and its greedy counterpart measured on
#: the same machine (AMD EPYC B): the pair the comparison needs, since machines of this kind differ 1.6x in speed.
SAMPLED_TRACE = TRACES_DIR / "twin-eagle3-t07"
GREEDY_TRACE = TWIN_TRACE_EPYC_B
#: The engine benchmark of the policy fitted on the sampled trace.
SAMPLED_BENCH_DIR = TWIN_BENCH_DIR / "t07"
#: The same at temperature 0.7 with the rule whose k = 0 rounds skip the drafter (``throughput:zero-k``).
SKIP_BENCH_DIR = SAMPLED_BENCH_DIR / "skip"
#: Greedy and sampled requests in the same batches, the controller armed with a policy set.
MIXED_BENCH_DIR = TWIN_BENCH_DIR / "mixed"
#: ``benchmarks/bench_serve.py --temperature 0.7``.
SERVE_DIR = SAMPLED_BENCH_DIR / "serve"
#: The same served with ``throughput:zero-k`` (rounds that plan k = 0 skip the drafter).
SERVE_SKIP_DIR = SAMPLED_BENCH_DIR / "serve-skip"
#: ``throughput:zero-k`` served against stock K = 1 and the K the first served runs left out (4, 5, 6).
SERVE_SKIP_K_DIR = SAMPLED_BENCH_DIR / "serve-k46"
#: The mixed workload served (``--greedy-share``), the controller armed with the policy set.
SERVE_MIXED_DIR = MIXED_BENCH_DIR / "serve"


def decoding(meta: dict[str, Any]) -> str:
    """``greedy`` or ``temperature T, top-p P`` from a trace's meta.json."""
    s = Sampling.from_meta(meta)
    return "greedy" if s.greedy else f"temperature {s.temperature:g}, top-p {s.top_p:g}"


def oracle_beside(traces: list[Path], k_max: int = 6) -> tuple[pd.DataFrame, list[str]]:
    """A row per trace (its headline references): plain decoding's ms/token, the best static K and the
    Oracle's bound (k >= 1; k = 0 allowed, and its share of k = 0 states) over plain, and the Oracle model's
    largest error against the measured static-K sweep; and each trace's machine (for the caption)."""
    rows, machines = [], []
    for path in traces:
        rep = oracle_report(path, k_max=k_max, n_boot=0)
        d = rep.to_json()
        head = d["headline"]
        k0 = head.get("with_k0") or {}
        v = d.get("validation") or {}
        meta = read_meta(path)
        machines.append(describe(meta["cpu"]) if "cpu" in meta else "machine not recorded")
        rows.append({"Decoding": decoding(meta), "References": f"{head['n_sequences']} {head['kind']}",
                     "Plain (ms/token)": f"{head['autoregressive_ms'] / head['n_tokens']:.2f}",
                     "Best static K (× plain)": f"{head['best_static_k']} ({head['best_static_speedup']:.3f})",
                     "Accepted / round": f"{head['mean_accepted']:.2f}",
                     "Oracle, k ≥ 1 (× plain)": f"{head['speedup']:.3f}",
                     "Oracle, k = 0 allowed": (f"{k0['speedup']:.3f} (k = 0 in {k0['share_of_states_k0']:.0%})"
                                               if k0 else "–"),
                     "Model vs sweep": (f"{v['max_abs_rel_error']:.1%} (K = {v['worst_k']})" if v else "–")})
    return pd.DataFrame(rows), machines


def sampled_runs(folder: Path = SAMPLED_BENCH_DIR) -> tuple[dict[int, dict[str, Any]], str]:
    """The engine benchmark results in ``folder`` of the policy fitted on :data:`SAMPLED_TRACE` (``{batch:
    result}``, note): :data:`SAMPLED_BENCH_DIR`, :data:`SKIP_BENCH_DIR` or :data:`MIXED_BENCH_DIR`."""
    if not (SAMPLED_TRACE / "meta.json").exists():
        return {}, f"no sampled trace ({SAMPLED_TRACE.name})"
    return load_bench_runs(read_meta(SAMPLED_TRACE), folder)


def sampled_serve(folder: Path = SERVE_DIR) -> tuple[dict[str, Any] | None, str]:
    """The served-load summary at temperature 0.7 in ``folder`` (:data:`SERVE_DIR`, :data:`SERVE_SKIP_DIR`,
    :data:`SERVE_SKIP_K_DIR` or :data:`SERVE_MIXED_DIR`), or (None, why)."""
    path = folder / "summary.json"
    if not path.exists():
        return None, f"no served-load runs at temperature 0.7 ({path.parent})"
    summ = read_json(path, "served-load summary", ValueError)
    summ["file"] = str(path.relative_to(TWIN_BENCH_DIR.parent.parent.parent))
    return summ, f"served-load runs: `{summ['file']}`"


def measured_where(runs: dict[int, dict[str, Any]]) -> str:
    """Caption words for engine runs: ``measured, <regime>, <CPU>; batch 1: 24 blocks; ...``."""
    first = next(iter(runs.values()))
    return (f"measured, {regime_of(first)}, {describe(first['engine']['cpu'])}; "
            + "; ".join(f"batch {b}: {r['config']['blocks']} blocks" for b, r in sorted(runs.items())))


def engine_beside_plain(runs: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Per batch size: the best stock K and each policy, their workload ratio to plain decoding and to the
    best stock K (all blocks' time per token; 95% intervals over blocks) and the mean k drafted."""
    rows = []
    for batch in sorted(runs):
        t = engine_table(runs[batch]).set_index("arm")
        best = runs[batch]["choice"]["best_stock_workload"]
        plain = t.loc[PLAIN, "ms_per_token_pooled"]
        for key in [best, *[x for x in t.index if is_policy(x)]]:
            r = t.loc[[key]]
            rows.append({"Batch": batch, "Arm": policy_label(key),
                         "ms/token": f"{float(r['ms_per_token_pooled'].iloc[0]):.2f}",
                         "× plain": f"{plain / float(r['ms_per_token_pooled'].iloc[0]):.3f}",
                         "× best stock K [95% CI]": ("1" if key == best else ci_column(r, "workload_ratio", 3)[0]),
                         "Mean k": "–" if key == best else f"{float(r['mean_k'].iloc[0]):.2f}"})
    return pd.DataFrame(rows)


def serve_by_kind(summ: dict[str, Any]) -> pd.DataFrame:
    """A mixed served run's greedy and sampled requests apart: per rate and kind, the controller's mean E2E
    latency and speed (> 1: faster; 95% interval over repeats) against plain decoding and the best stock K;
    and per arm the share of greedy texts equal to plain decoding's."""
    rows = []
    for rate in summ["rates"]:
        here = [r for r in summ["rows"] if r["rate"] == rate]
        ctrl = next(r for r in here if is_policy(r["arm"]))
        same = "; ".join(f"{policy_label(r['arm'])} {r['same_text_as_plain']:.0%}" for r in here
                         if r["arm"] != PLAIN and r.get("same_text_as_plain") is not None)
        best = (summ["best_stock"].get(f"{float(rate):g}") or {}).get("mean_e2el_ms")
        for kind, k in (ctrl.get("by_kind") or {}).items():
            def speed(entry: dict[str, Any] | None) -> str:  # a latency ratio (arm / reference) as a speed
                return fmt_ci(*_speed(entry, "mean_e2el_ms"), 3) if entry and entry.get("ratio") else "–"

            rows.append({"rate (req/s)": f"{rate:g}", "requests": f"{kind} ({k['requests']:.0f} per run)",
                         "controller E2E (ms)": f"{k['mean_e2el_ms']:.0f}",
                         "speed vs plain": speed(k.get("e2el_vs_plain")),
                         "speed vs best stock K": f"{speed(k.get('e2el_vs_best_stock'))} ({policy_label(best)})"
                         if best else "–",
                         "greedy texts = plain's": same if kind == "greedy" else ""})
    return pd.DataFrame(rows)
