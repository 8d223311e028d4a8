"""``speclimits oracle TRACE``: solve the Oracle on a trace's ``oracle.parquet`` and print the bounds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclimits.bootstrap import HEADLINE_N_BOOT
from speclimits.errors import SpeclimitsError
from speclimits.cliutil import add_oracle_arguments, parse_batch_sizes
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
            "no m = 1 (the trace has no K = 0 rounds) the autoregressive baseline is reported unavailable. "
            "With --batch B1,B2,... the references are served in closed batches of b consecutive sequences (the "
            "trace's prompt order, as the traced batches) with one joint k per round, priced by a batch cost model "
            "(--batch-cost-model); for each b it prints every static K's ms per token (K = 0 is plain decoding), "
            "the best static K, the best batch-size->K table in hindsight (a coordinate-wise optimum), the "
            "decoupling relaxation's bound that no policy can beat, and at b <= 2 the exact Oracle with the "
            "bound's slack against it (speclimits.oracle.batch). Static K and tables are exact with "
            "--deterministic and at b <= 2, Monte Carlo with 95% intervals otherwise."
        ),
        epilog=("example: speclimits oracle data/traces/sim-default --k-max 6 --json\n"
                "(batch > 1) example: speclimits oracle data/traces/measured-eagle3 --batch 1,2,4,8,16 "
                "--batch-cost-model batch_cost_model.json --k-max 6"),
    )
    add_oracle_arguments(p, needs="oracle.parquet")
    p.add_argument("--alpha-scale", type=float, default=1.0, metavar="X",
                   help="multiply every alpha(m) by X (0 = the α = 0 ablation; default 1)")
    p.add_argument("--deterministic", action="store_true", help="same as --surrogate exact")
    p.add_argument("--allow-k0", action="store_true", help="let the Oracle take plain autoregressive steps (k = 0; with --batch implied when the cost model has m = 1)")
    p.add_argument("--n-boot", type=int, default=HEADLINE_N_BOOT, metavar="B",
                   help=f"cost-model bootstrap replicates for the headline's 95%% intervals (default {HEADLINE_N_BOOT}, "
                        "as in the book; refitted from per-generation sums and re-solved all at once, well under a second on "
                        "the bundled measured trace; 0 = none)")
    p.add_argument("--seed", type=int, default=0,
                   help="bootstrap seed; with --batch the Monte Carlo seed (the best table is searched on this "
                        "seed's draws and reported on seed + 1's) (default 0)")
    p.add_argument("--batch", default=None, metavar="B1,B2,...",
                   help="batch sizes (e.g. 1,2,4,8,16): the bound at batch > 1 instead of the batch-1 report; "
                        "k = 0 (plain decoding) is then allowed whenever the cost model has m = 1, and --n-boot "
                        "is not used")
    p.add_argument("--batch-cost-model", type=Path, default=None, metavar="PATH",
                   help="with --batch: a batch cost-model JSON (the batch-1 format plus its 'batch' section), or a "
                        "batch trace directory whose batch cost model is fitted "
                        "(speclimits.stats.batch.fit_batch_cost_model); default: TRACE itself when it is a batch "
                        "trace (has steps.parquet). Its batch-1 part prices rounds with one request, so --cost-model "
                        "is not combined with it")
    p.add_argument("--n-samples", type=int, default=None, metavar="S",
                   help="with --batch: Monte Carlo closed-batch runs per group for the probabilistic surrogate at "
                        "b > 2 (default 256: speclimits.oracle.batch_tables.DEFAULT_SAMPLES)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def _batch_cost_model(args: argparse.Namespace):
    """The BatchCostModel of ``--batch-cost-model`` (a JSON file or a batch trace directory)."""
    from speclimits.costmodel import BatchCostModel
    from speclimits.trace import read_trace

    path = args.batch_cost_model
    if path is None:
        if not (args.trace / "steps.parquet").exists():
            raise SpeclimitsError(f"--batch needs --batch-cost-model: {args.trace} is not a batch trace (no "
                                  "steps.parquet); pass a batch cost-model JSON or a batch trace directory")
        path = args.trace
    if not path.is_dir():
        return BatchCostModel.read(path)
    from speclimits.stats.batch import fit_batch_cost_model

    return fit_batch_cost_model(read_trace(path))


def _batch_cli(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from speclimits.oracle.batch import batch_bounds
    from speclimits.oracle.batch_problem import headline_references
    from speclimits.oracle.batch_tables import DEFAULT_SAMPLES
    from speclimits.oracle.prepare import prepare_oracle

    if args.cost_model is not None:
        raise SpeclimitsError("--cost-model does not combine with --batch: the batch cost model's batch-1 part "
                              "prices rounds with one request (edit that JSON for a what-if)")
    model = _batch_cost_model(args)
    if args.alpha_scale != 1.0:
        model = replace(model, base=model.base.with_alpha_scale(args.alpha_scale))
    setup = prepare_oracle(args.trace, cost_model=model.base, surrogate="exact" if args.deterministic else args.surrogate)
    batch_trace = args.batch_cost_model if args.batch_cost_model is not None and args.batch_cost_model.is_dir() else None
    setup, order = headline_references(setup, batch_trace)
    result = batch_bounds(setup.inputs, model, args.batch, k_max=args.k_max, deterministic=setup.deterministic,
                          n_samples=args.n_samples or DEFAULT_SAMPLES, seed=args.seed, order=order)
    notes = [f"batch cost model {args.batch_cost_model or args.trace} ({model.base.source or 'no source recorded'}); "
             f"E = {model.n_experts} experts, top-{model.top_k}", *setup.notes[1:]]
    if args.json:
        print(dumps({"trace": str(args.trace), "surrogate": setup.surrogate, "notes": notes, **result.to_json()},
                    indent=2))
    else:
        print("\n".join(notes + [result.summary()]))
    return 0


def _cli(args: argparse.Namespace) -> int:
    # imported when the command runs: the Oracle pulls in statsmodels and scikit-learn, which
    # `speclimits --help` and the other subcommands should not wait for
    from speclimits.oracle.prepare import oracle_data_missing, prepare_oracle
    from speclimits.oracle.report import oracle_report

    for name, least in (("k_max", 1), ("n_boot", 0), ("n_samples", 2)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            raise SpeclimitsError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if args.batch is not None:
        args.batch = parse_batch_sizes(args.batch)
    why = oracle_data_missing(args.trace) if (args.trace / "meta.json").is_file() else None
    if why is not None:  # a trace without Oracle data: one line, before anything is loaded
        raise SpeclimitsError(f"{args.trace}: {why}")
    if args.batch is not None:
        return _batch_cli(args)
    if args.batch_cost_model is not None or args.n_samples is not None:
        raise SpeclimitsError("--batch-cost-model and --n-samples need --batch")
    setup = prepare_oracle(args.trace, args.cost_model, "exact" if args.deterministic else args.surrogate)
    k_max = args.k_max
    if k_max is None:  # the lists' length, capped at the longest draft the cost model prices (said when capped)
        capped, why = setup.priced_k_max()
        if why is not None:
            print(f"speclimits oracle: note: {why}; pass --k-max to choose", file=sys.stderr)
            k_max = capped
    report = oracle_report(args.trace, k_max=k_max, allow_k0=args.allow_k0, alpha_scale=args.alpha_scale,
                           n_boot=args.n_boot, seed=args.seed, setup=setup, progress=sys.stderr.isatty())
    warnings = list(report.warnings)
    if report.interval is not None and report.interval.n_failed:
        warnings.append(f"{report.interval.n_failed} of {args.n_boot} cost-model bootstrap replicates missed every "
                        "generation of a cell the fit needs and are left out of the intervals")
    for warning in warnings:
        print(f"speclimits oracle: warning: {warning}", file=sys.stderr)
    print(dumps(report.to_json(), indent=2) if args.json else report.summary())
    return 0
