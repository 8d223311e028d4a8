"""``speclimits oracle TRACE``: solve the Oracle on a trace's ``oracle.parquet`` and print the bounds."""

from __future__ import annotations

import argparse
import sys

from speclimits.bootstrap import HEADLINE_N_BOOT
from speclimits.errors import SpeclimitsError
from speclimits.cliutil import add_oracle_arguments
from speclimits.jsonutil import dumps


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "oracle",
        help="solve the Oracle (Bellman/SSP bound on adaptive K) on a trace",
        description=(
            "Backward induction over every reference sequence in TRACE/oracle.parquet (the book's methods page): "
            "V and k* per state, the Oracle's time against autoregressive decoding and every static K. "
            "Without --cost-model the cost model is fitted on TRACE/rounds.parquet (the same fit the book's "
            "section 3 writes). The defaults are the book's. When the cost model has "
            "no m = 1 (the trace has no K = 0 rounds) the autoregressive baseline is reported unavailable."
        ),
        epilog="example: speclimits oracle data/traces/sim-default --k-max 6 --json",
    )
    add_oracle_arguments(p, needs="oracle.parquet")
    p.add_argument("--alpha-scale", type=float, default=1.0, metavar="X",
                   help="multiply every alpha(m) by X (0 = the α = 0 ablation; default 1)")
    p.add_argument("--deterministic", action="store_true", help="same as --surrogate exact")
    p.add_argument("--allow-k0", action="store_true", help="let the Oracle take plain autoregressive steps (k = 0)")
    p.add_argument("--n-boot", type=int, default=HEADLINE_N_BOOT, metavar="B",
                   help=f"cost-model bootstrap replicates for the headline's 95%% intervals (default {HEADLINE_N_BOOT}, "
                        "as in the book; refitted from per-generation sums and re-solved all at once, well under a second on "
                        "the bundled measured trace; 0 = none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    # imported when the command runs: the Oracle pulls in statsmodels and scikit-learn, which
    # `speclimits --help` and the other subcommands should not wait for
    from speclimits.oracle.report import oracle_report

    if args.k_max is not None and args.k_max < 1:
        raise SpeclimitsError(f"--k-max must be >= 1, got {args.k_max}")
    if args.n_boot < 0:
        raise SpeclimitsError(f"--n-boot must be >= 0, got {args.n_boot}")
    report = oracle_report(args.trace, args.cost_model, "exact" if args.deterministic else args.surrogate,
                           k_max=args.k_max, allow_k0=args.allow_k0, alpha_scale=args.alpha_scale,
                           n_boot=args.n_boot, seed=args.seed, progress=sys.stderr.isatty())
    for warning in report.warnings:
        print(f"speclimits oracle: warning: {warning}", file=sys.stderr)
    if args.json:
        print(dumps(report.to_json(), indent=2))
    else:
        print(report.summary())
    return 0
