"""``speclimits control fit``; ``bench`` and ``summarize`` are the benchmark's (:mod:`speclimits.bench.cli`), added to
the same ``speclimits control`` command through :func:`actions`."""

from __future__ import annotations

import argparse
import sys

from speclimits.errors import SpeclimitsError

#: ``control fit``'s K_max when none is given (the committed benchmarks' engines run K_max = 6)
DEFAULT_FIT_K_MAX = 6


def actions(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The subcommands of ``speclimits control`` (the command is made on the first call)."""
    p = subparsers.choices.get("control")
    if p is None:
        p = subparsers.add_parser("control", help="adaptive K online: fit policies from a trace, benchmark them in vLLM")
        p.control_actions = p.add_subparsers(dest="control_command", metavar="ACTION")
        p.control_actions.required = True
    return p.control_actions


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = actions(subparsers)
    f = sub.add_parser("fit", help="fit τ, λ, the confidence calibration and the Ū predictor on a train split")
    f.add_argument("trace", help="trace directory with oracle.parquet (the target's own continuations are used: "
                                 "greedy references, or a sampled trace's sampled ones)")
    f.add_argument("--out", required=True, help="policy JSON to write")
    f.add_argument("--k-max", type=int, default=None,
                   help=f"K_max (the engine's num_speculative_tokens), default {DEFAULT_FIT_K_MAX}, or fewer where the "
                        "trace's Oracle data or its cost model covers fewer drafts (said when capped)")
    f.add_argument("--test-share", type=float, default=0.5, help="share of references held out, default 0.5")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--cost-model", default=None, help="cost-model JSON (default: fit on the trace)")
    f.set_defaults(func=run_fit)
    c = sub.add_parser("combine", help="one policy file for greedy and sampled requests: fits by temperature",
                       description="Combine policy fits made at different temperatures (`control fit` on a greedy "
                                   "trace and on traces sampled with `speclimits trace --temperature T`) into one "
                                   "policy set. In the engine each request is decided with the fit whose temperature "
                                   "is nearest its own; the first fit prices what a batch shares (its pass). "
                                   "`control bench --policy` and SPECLIMITS_CONTROL_POLICY (vllm serve) take a set.")
    c.add_argument("fits", nargs="+", metavar="POLICY[@T]",
                   help="policy JSON written by `control fit`; @T gives its temperature where the fit does not record "
                        "it (fits before sampled traces recorded it)")
    c.add_argument("--out", required=True, help="policy-set JSON to write")
    c.set_defaults(func=run_combine)
    d = sub.add_parser("decompose", help="where the Oracle's gain goes: one row per rung, on the held-out references")
    d.add_argument("policy", help="policy JSON written by `control fit` (its split and prices are used)")
    d.add_argument("--trace", default=None,
                   help="trace directory (default: the one the policy was fitted on); for a benchmark on prompts the "
                        "policy never saw, a trace of those prompts (`speclimits trace --k 0,2 --oracle`): the rungs "
                        "are then replayed on the prompts the engine ran")
    d.add_argument("--bench", nargs="*", default=[], help="bench result JSON files: one table per file")
    d.add_argument("--rule", default="delta-fixed",
                   help="the Delta rule whose engine arm is decomposed (delta, delta-fixed; default: delta-fixed); "
                        "every benchmark given must have run it")
    d.add_argument("--out", default=None, help="write PREFIX-batchB.csv per table")
    d.set_defaults(func=run_decompose)


def run_fit(args: argparse.Namespace) -> int:
    # the fit loads the Oracle stack (pandas, scikit-learn, statsmodels): only when the command runs
    from speclimits.control.fit import fit_policy, greedy_setup

    setup = greedy_setup(args.trace, args.cost_model)
    k_max = args.k_max
    if k_max is None:  # the default, capped where the trace covers fewer drafts (an explicit value is checked)
        k_max, why = setup.priced_k_max(DEFAULT_FIT_K_MAX)
        if k_max < DEFAULT_FIT_K_MAX:
            why = why or f"the trace's Oracle data holds drafts of up to {k_max} tokens"
            print(f"speclimits control fit: K_max {k_max}, not the default {DEFAULT_FIT_K_MAX}: {why}", file=sys.stderr)
    fit = fit_policy(setup, k_max=k_max, test_share=args.test_share, seed=args.seed)
    fit.write(args.out)
    print(f"wrote {args.out}: K_max {fit.k_max}, τ = {fit.tau:.4g}, λ = {fit.lambda_:.3f} ms/token "
          f"(train Oracle {fit.lambda_oracle:.3f}); train {len(fit.train_seq_ids)} / test {len(fit.test_seq_ids)} "
          f"{fit.data['reference_kind']} references")
    return 0


def run_combine(args: argparse.Namespace) -> int:
    from speclimits.control.policyset import combine, write_set

    fits = combine(args.fits)
    write_set(fits, args.out)
    print(f"wrote {args.out}: {len(fits.fits)} fits, K_max {fits.k_max}; {fits.describe()}")
    return 0


def run_decompose(args: argparse.Namespace) -> int:
    import json

    from speclimits.control.decompose import gap_decomposition
    from speclimits.control.fit import greedy_setup
    from speclimits.control.rules import PolicyFit

    from speclimits.trace import read_trace

    fit = PolicyFit.read(args.policy)
    trace = read_trace(args.trace or fit.data["trace"])
    print(trace.source_label)
    setup = greedy_setup(trace, fit.cost_model)
    benches = [json.loads(open(b).read()) for b in args.bench]
    batches = [int(b["config"]["batch"]) for b in benches]
    if args.out and len(set(batches)) < len(batches):
        raise SpeclimitsError(f"control decompose: --out writes one PREFIX-batchB.csv per batch size, and the bench "
                              f"files {', '.join(args.bench)} share one (batches {batches}): run one call per file")
    for bench in benches or [None]:
        table = gap_decomposition(fit, setup, rule=args.rule, bench=bench)
        batch = int(table["batch"].iloc[0])
        acc = table.attrs["acceptance"]
        print(f"batch {batch} ({table.attrs['shown']} shown; acceptance model {acc['from']}: "
              f"{' + '.join(acc['features']) or 'intercept only'}):")
        print(table[["rung", "name", "ms_per_token_replay", "speed_replay", "speed_replay_lo", "speed_replay_hi",
                     "share_replay", "share_replay_lo", "share_replay_hi", "loss"]].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
        if args.out:
            table.to_csv(f"{args.out}-batch{batch}.csv", index=False)
    return 0
