"""Benchmark and calibration of the linguistic study.

Timing: the rule-based labeller (tokens per second), the matrix-product cluster bootstrap of
:func:`speclimits.linguistic.k_by_context` against a plain loop that resamples responses and
recomputes the shares with pandas (same replicates, ratio of times), and the routing contrasts.

Calibration: over ``--seeds`` simulated traces of the ``default`` preset (K = 1 rounds only), how
often the 95% response-clustered percentile interval of the script-change contrast covers the
planted difference (few responses per trace carry script changes, so under-coverage is expected).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_linguistic.py [--seeds 20] [--n-boot 999] [--json PATH]

``--json PATH``: also write the timings and the coverage as figures (no targets; ``benchmarks/_figures.py``,
read by ``benchmarks/run_all.py``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from speclimits import linguistic as ling
from speclimits.bootstrap import draw_counts
from speclimits.oracle import OracleInputs, solve
from speclimits.simulate import make_meta, preset, simulate

from _figures import Figure, write_figures


def _loop_bootstrap(dec: pd.DataFrame, n_boot: int, seed: int) -> dict[str, tuple[float, float]]:
    """The plain way: per context, draw responses, concatenate their decisions, recompute the share."""
    out = {}
    for i, (ctx, sub) in enumerate(dec.groupby("label", observed=True)):
        by_resp = {s: g["k_star"].to_numpy() for s, g in sub.groupby("seq_id")}
        keys = list(by_resp)
        w = draw_counts(len(keys), n_boot, np.random.default_rng(seed + i))
        reps = []
        for row in w:
            ks = np.concatenate([np.repeat(by_resp[k][None, :], int(c), axis=0).ravel() for k, c in zip(keys, row)
                                 if c > 0])
            reps.append((ks >= 4).mean())
        out[ctx] = tuple(np.quantile(reps, [0.025, 0.975]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--n-boot", type=int, default=999)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the headline figures as JSON")
    args = ap.parse_args()

    cfg = preset("default", k_values=[1])
    t = simulate(cfg, seed=0, progress=False)
    res = solve(OracleInputs.from_frame(t["oracle"]), cfg.truth(), k_max=10)
    t0 = time.perf_counter()
    lab = ling.label_trace_tokens(t["tokens"])
    t_label = time.perf_counter() - t0
    print(f"labeller: {len(lab):,} tokens in {t_label:.2f} s ({len(lab) / t_label:,.0f} tokens/s)")
    dec = ling.decision_table(res, lab)
    t0 = time.perf_counter()
    tab = ling.k_by_context(dec, n_boot=args.n_boot, seed=0)
    t_mat = time.perf_counter() - t0
    t0 = time.perf_counter()
    _loop_bootstrap(dec, args.n_boot, seed=0)
    t_loop = time.perf_counter() - t0
    print(f"k_by_context, {args.n_boot} replicates x {len(tab)} contexts: matrix product {t_mat:.3f} s, "
          f"resampling loop {t_loop:.2f} s (x{t_loop / t_mat:.0f})")
    t0 = time.perf_counter()
    cs = [ling.script_change_contrast(lab), ling.first_mismatch_contrast(res, lab, source="reference"),
          ling.first_mismatch_contrast(res, source="window")]
    ling.routing_table(cs, n_boot=args.n_boot)
    t_routing = time.perf_counter() - t0
    print(f"routing contrasts (3, {args.n_boot} replicates): {t_routing:.2f} s")

    hits, resp = [], []
    t0 = time.perf_counter()
    for seed in range(100, 100 + args.seeds):
        tt = simulate(cfg, seed=seed, progress=False)
        c = ling.script_change_contrast(ling.label_trace_tokens(tt["tokens"]))
        if c.n_events < 5:
            continue
        s = c.summary(n_boot=args.n_boot, seed=0)
        truth = ling.planted_contrast(c, make_meta(cfg, seed))
        hits.append(s["diff_lo"] <= truth <= s["diff_hi"])
        resp.append(c.n_responses)
    print(f"calibration: the 95% interval of the script-change contrast covers the planted difference in "
          f"{np.mean(hits):.2f} of {len(hits)} traces (median {np.median(resp):.0f} responses with script "
          f"changes; {time.perf_counter() - t0:.0f} s)")
    if args.json:
        write_figures(args.json, [
            Figure("labeller throughput", len(lab) / t_label, "tokens/s", better="higher",
                   note=f"{len(lab):,} tokens, default preset (K = 1)"),
            Figure(f"k_by_context bootstrap, {args.n_boot} replicates x {len(tab)} contexts", t_mat, "s",
                   note="matrix product"),
            Figure(f"resampling loop, same {args.n_boot} replicates", t_loop, "s"),
            Figure("speed-up, resampling loop / matrix product", t_loop / t_mat, "x", better="higher"),
            Figure(f"routing contrasts (3, {args.n_boot} replicates)", t_routing, "s"),
            Figure("script-change interval coverage of the planted difference", np.mean(hits) if hits else None, "",
                   better="higher", note=f"{len(hits)} of {args.seeds} simulated traces with >= 5 events; nominal "
                                         "0.95, under-coverage expected (few responses per trace)"),
        ], extra={"seeds": args.seeds, "n_boot": args.n_boot, "traces_used": len(hits),
                  "median_responses": float(np.median(resp)) if resp else None})


if __name__ == "__main__":
    main()
