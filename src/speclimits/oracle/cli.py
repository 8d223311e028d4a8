"""``speclimits oracle TRACE``: solve the Oracle on a trace's ``oracle.parquet`` and print the bounds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import jsonable


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
    p.add_argument("trace", type=Path, metavar="TRACE", help="trace directory with oracle.parquet")
    p.add_argument("--cost-model", type=Path, metavar="JSON", help="cost-model JSON (default: fit on the trace)")
    p.add_argument("--k-max", type=int, default=None, metavar="N",
                   help="largest draft length (default: the length of the match_prob lists)")
    p.add_argument("--alpha-scale", type=float, default=1.0, metavar="X",
                   help="multiply every alpha(m) by X (0 = the α = 0 ablation; default 1)")
    p.add_argument("--surrogate", choices=("auto", "raw", "calibrated", "exact"), default="auto",
                   help="transition probabilities: raw (match_prob as recorded), calibrated (isotonic fit of the "
                        "observed greedy matches on match_prob), exact (the observed greedy match length: the "
                        "hindsight bound), or auto (default, as in the book: calibrated on a measured trace, raw on "
                        "a simulated one)")
    p.add_argument("--deterministic", action="store_true", help="same as --surrogate exact")
    p.add_argument("--allow-k0", action="store_true", help="let the Oracle take plain autoregressive steps (k = 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    # imported when the command runs: the Oracle pulls in statsmodels and scikit-learn, which
    # `speclimits --help` and the other subcommands should not wait for
    from speclimits.oracle.prepare import prepare_oracle

    if args.k_max is not None and args.k_max < 1:
        raise SpeclimitsError(f"--k-max must be >= 1, got {args.k_max}")
    setup = prepare_oracle(args.trace, args.cost_model, "exact" if args.deterministic else args.surrogate)
    res = setup.solve(k_max=args.k_max, allow_k0=args.allow_k0, alpha_scale=args.alpha_scale)
    if args.json:
        out = res.to_json()
        out["trace"] = str(args.trace)
        out["simulated"] = setup.trace.simulated
        out["cost_model_note"] = setup.notes[0]
        out["surrogate"] = setup.surrogate_label
        out["notes"] = list(setup.notes)
        json.dump(jsonable(out), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(setup.trace.source_label)
        print("\n".join(setup.notes))
        print(res.summary())
    return 0
