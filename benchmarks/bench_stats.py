"""Benchmark of the cost-model statistics (a script, not a test).

1. Cluster bootstrap on one K from per-generation sufficient statistics against refitting
   statsmodels OLS on the resampled rows in a loop (same multinomial weights): both timings, the
   ratio, and the largest difference of the estimates.
2. Wall time of each statistics section's fit on the trace, and of its new parts: the regime
   rule with its nested folds, and the final model's bootstrap intervals (999 against 49 resamples).

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_stats.py TRACE [--k 8] [--n-boot 999] [--n-loop N]
(--n-loop: how many of the resamples the statsmodels loop refits; default all).
``--json PATH``: also write the timings, the speed-up and the largest difference as figures (no
targets; ``benchmarks/_figures.py``, read by ``benchmarks/run_all.py``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import statsmodels.api as sm

from speclimits.bootstrap import draw_counts
from speclimits import stats
from speclimits.stats import CellMoments, Design
from speclimits.trace import decode_rounds, read_trace

from _figures import Figure, write_figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--n-boot", type=int, default=999)
    ap.add_argument("--n-loop", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the headline figures as JSON")
    args = ap.parse_args()

    t0 = time.perf_counter()
    tr = read_trace(args.trace)
    rounds = tr.rounds
    print(f"trace {args.trace}: {len(rounds):,} rows ({tr.source_label}); read in {time.perf_counter() - t0:.2f} s")
    dec, _ = decode_rounds(rounds)
    dk = dec[dec["K"] == args.k].reset_index(drop=True)
    design = Design.linear("u_bar", "context_len")

    t0 = time.perf_counter()
    mom = CellMoments.from_rounds(dk)
    w = draw_counts(mom.n_clusters, args.n_boot, seed=0)
    boot = stats.cluster_bootstrap(mom, design, w)
    t_fast = time.perf_counter() - t0
    print(f"K = {args.k}: {len(dk):,} rounds, {mom.n_clusters} generations")
    print(f"sufficient-statistics bootstrap, {args.n_boot} resamples (moments included): {t_fast:.3f} s")

    n_loop = args.n_boot if args.n_loop is None else min(args.n_loop, args.n_boot)
    gens = mom.cells["generation_id"].to_numpy()  # cluster code order
    codes = mom.cells["cluster"].to_numpy()
    order = np.argsort(codes)
    gen_of_cluster = gens[order]
    rows_of = {g: np.flatnonzero(dk["generation_id"].to_numpy() == g) for g in gen_of_cluster}
    x_all = sm.add_constant(dk[["u_bar", "context_len"]].to_numpy(float))
    y_all = dk["t_target_ms"].to_numpy(float)
    t0 = time.perf_counter()
    max_diff = 0.0
    for b in range(n_loop):
        idx = np.concatenate([np.tile(rows_of[g], int(c)) for g, c in zip(gen_of_cluster, w[b]) if c > 0])
        params = sm.OLS(y_all[idx], x_all[idx]).fit().params
        max_diff = max(max_diff, float(np.max(np.abs(params - boot.iloc[b].to_numpy()))))
    t_loop = time.perf_counter() - t0
    t_loop_all = t_loop * args.n_boot / n_loop
    print(f"statsmodels OLS refit loop, {n_loop} resamples: {t_loop:.2f} s"
          + (f" (x{args.n_boot / n_loop:.1f} -> {t_loop_all:.1f} s for {args.n_boot})" if n_loop < args.n_boot else ""))
    print(f"speed-up: {t_loop_all / t_fast:.0f}x; largest |difference| of estimates: {max_diff:.2e}")

    figures = [
        Figure(f"sufficient-statistics bootstrap, K = {args.k}, {args.n_boot} resamples", t_fast, "s",
               note=f"{len(dk):,} rounds, {mom.n_clusters} generations; moments included"),
        Figure(f"statsmodels OLS refit loop, {args.n_boot} resamples", t_loop_all, "s",
               note=f"{n_loop} refitted, extrapolated" if n_loop < args.n_boot else ""),
        Figure("speed-up, refit loop / sufficient statistics", t_loop_all / t_fast, "x", better="higher"),
        Figure("largest |difference| of the estimates", max_diff, ""),
    ]
    final_mom = CellMoments.from_rounds(dec[dec["K"] >= 1].reset_index(drop=True))
    for name, fn in (("factors", lambda: stats.analyze_factors(rounds)),
                     ("regime rule (one-SE + nested folds)", lambda: stats.detect_boundary(final_mom)),
                     ("final model, 49 boot", lambda: stats.fit_final_model(rounds, n_boot=49)),
                     ("final model, %d boot" % args.n_boot, lambda: stats.fit_final_model(rounds, n_boot=args.n_boot)),
                     ("draft model", lambda: stats.fit_draft_model(rounds)),
                     ("robustness (K=%d, %d boot)" % (args.k, args.n_boot),
                      lambda: stats.robustness_checks(rounds, k=args.k, n_boot=args.n_boot)),
                     ("fit_cost_model", lambda: stats.fit_cost_model(rounds))):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        print(f"{name:38s} {dt:6.2f} s")
        figures.append(Figure(f"section fit: {name}", dt, "s"))
    if args.json:
        write_figures(args.json, figures, extra={"trace": args.trace, "k": args.k, "n_boot": args.n_boot,
                                                 "n_loop": n_loop, "rows": len(rounds)})


if __name__ == "__main__":
    main()
