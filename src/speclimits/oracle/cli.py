"""``speclimits oracle TRACE``: solve the Oracle on a trace's ``oracle.parquet`` and print the bounds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import jsonable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "oracle",
        help="solve the Oracle (Bellman/SSP bound on adaptive K) on a trace",
        description=(
            "Backward induction over every reference sequence in TRACE/oracle.parquet (DESIGN §2, §4): "
            "V and k* per state, the Oracle's time against autoregressive decoding and every static K. "
            "Without --cost-model the cost model is fitted on TRACE/rounds.parquet. When the cost model has "
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
    p.add_argument("--deterministic", action="store_true",
                   help="transitions from the observed accept_len instead of match_prob")
    p.add_argument("--surrogate", choices=("raw", "calibrated"), default="raw",
                   help="match_prob as recorded (raw, the paper's surrogate; default) or mapped through an "
                        "isotonic fit to the observed greedy matches (calibrated; for a poorly calibrated draft)")
    p.add_argument("--allow-k0", action="store_true", help="let the Oracle take plain autoregressive steps (k = 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    from speclimits.oracle.inputs import default_cost_model, load_inputs
    from speclimits.oracle.solver import solve
    from speclimits.trace import read_trace

    tr = read_trace(args.trace)
    inputs = load_inputs(tr)
    if args.cost_model is not None:
        model, note = CostModel.read(args.cost_model), f"cost model {args.cost_model}"
    else:
        model, note = default_cost_model(tr)
    if args.k_max is not None and args.k_max < 1:
        raise SpeclimitsError(f"--k-max must be >= 1, got {args.k_max}")
    if args.surrogate == "calibrated":
        from speclimits.oracle.calibration import calibrate_match_prob

        inputs, _ = calibrate_match_prob(inputs)
    res = solve(inputs, model, k_max=args.k_max, allow_k0=args.allow_k0, deterministic=args.deterministic,
                alpha_scale=args.alpha_scale)
    if args.json:
        out = res.to_json()
        out["trace"] = str(args.trace)
        out["simulated"] = tr.simulated
        out["cost_model_note"] = note
        out["surrogate"] = "exact greedy (accept_len)" if args.deterministic else args.surrogate
        json.dump(jsonable(out), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(tr.source_label)
        print(note)
        print(res.summary())
    return 0
