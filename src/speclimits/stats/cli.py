"""``speclimits factors`` and ``speclimits fit``; the statistics modules are imported when a command runs,
so ``speclimits --help`` does not pay for scipy/statsmodels/scikit-learn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclimits.jsonutil import dumps
from speclimits.vocabulary import MINIMUM_SWEEP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "factors",
        help="factor analysis of target time (Table A2) and standardized associations by K",
        description=(
            "Six candidate factors (Ū, m, L, KV usage, graph bucket, E_max): GroupKFold(5) by generation, "
            "out-of-sample R² and RMSE (mean, 95% t-interval over folds), paired RMSE reduction of Ū + factor "
            "over Ū alone; standardized β* of Ū and L within each K; factor correlations. Decode rounds with "
            "K >= 1 and a non-zero target time. A factor the trace cannot score (constant on its rounds: m on a sweep "
            "with one K > 0) or a K whose associations cannot be fitted is skipped with one line saying why; the "
            "rest is still written."
        ),
        epilog="example: speclimits factors data/traces/sim-default --json",
    )
    p.add_argument("trace", type=Path, help="trace directory")
    p.add_argument("--json", action="store_true", help="print all results as JSON instead of text tables")
    p.set_defaults(func=_factors)

    p = sub.add_parser(
        "fit",
        help="fit the cost model (target Eq. 4 per m + draft line) and the final-model comparisons",
        description=(
            "Per-K OLS T_T ~ Ū + L with SEs clustered by generation; the joint categorical model (free beta0(m), "
            "alpha(m), shared c; m = 1 from K = 0 rounds with alpha(1) := alpha(2)); pooled model with γK; "
            "regime boundary by the one-SE rule against no split, kept only if every nested outer fold agrees; "
            "regime rows at that split and at the paper's m <= 4 | m >= 5; specification ladder; 95% "
            "cluster-bootstrap intervals on the headline cells; draft line T_D = a·K + b. "
            "--out writes the cost-model JSON the Oracle reads, before any comparison runs. "
            "MINIMUM SWEEP. " + MINIMUM_SWEEP + " "
            "With --batch (a batch trace: speclimits trace/simulate --batch): the batch cost model instead, "
            "target = beta0(m) + gamma(m)·(n-1) + alpha(m)·Ū_step + c·L_total and drafter a·k + b + "
            "(n-1)·(a_req·k + b_req), OLS on the uniform decode steps (every request decoding at the same m) with "
            "SEs clustered by batch; it prints the coefficients with 95% intervals, the validation of ms per "
            "emitted token per (b, K) (cross-fitted by batch; prefill and mixed steps counted as measured; the "
            "worst error named), Ū of a step against independent routing and the saturation curve, and per K the "
            "b at which speculation stops beating plain decoding; --out writes the batch cost-model JSON "
            "(speclimits.stats.batch)."
        ),
        epilog=("example: speclimits fit data/traces/sim-default --out cost_model.json\n"
                "(batch > 1) example: speclimits fit --batch /tmp/tr-batch --out batch-cost.json"),
    )
    p.add_argument("trace", type=Path, help="trace directory")
    p.add_argument("--json", action="store_true",
                   help="print all results as JSON (the cost model under the key 'cost_model')")
    p.add_argument("--out", type=Path, default=None, help="write the cost-model JSON here")
    p.add_argument("--robustness-k", type=int, default=None, metavar="K",
                   help="also run the robustness checks on this K")
    p.add_argument("--n-boot", type=int, default=999, metavar="B",
                   help="cluster-bootstrap resamples for the intervals (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    p.add_argument("--batch", action="store_true",
                   help="TRACE is a batch trace: fit the batch cost model (--out writes its JSON) and print its "
                        "validation by (b, K); --robustness-k, --n-boot and --seed do not apply")
    p.add_argument("--folds", type=int, default=2, metavar="F",
                   help="with --batch: folds of batches for the cross-fitted validation (default: %(default)s)")
    p.set_defaults(func=_fit)


def _factors(args: argparse.Namespace) -> int:
    from speclimits.stats.factors import analyze_factors  # heavy: see the module docstring
    from speclimits.trace import read_trace

    tr = read_trace(args.trace)
    res = analyze_factors(tr.rounds)
    if args.json:
        print(dumps({"trace": str(args.trace), "source": tr.source_label, **res.to_dict()}, indent=1))
        for line in res.skipped_lines():  # the text summary ends with them
            print(f"speclimits factors: {line}", file=sys.stderr)
    else:
        print(f"{args.trace}: {tr.source_label}")
        print(res.summary())
    return 0


def _fit_batch(args: argparse.Namespace) -> int:
    from speclimits.stats import batch as sb  # heavy: see the module docstring
    from speclimits.trace import read_trace

    tr = read_trace(args.trace)
    model = sb.fit_batch_cost_model(tr)
    validation = sb.validate_by_batch_k(tr, model=model, folds=args.folds)
    union = sb.step_union_table(tr)
    frontier = sb.speedup_frontier(validation)
    if args.out is not None:
        model.write(args.out)
    if args.json:
        print(dumps({"trace": str(args.trace), "source": tr.source_label, "batch_cost_model": model.to_dict(),
                     "validation": validation, "worst": validation.attrs["worst"], "union": union.to_dict(),
                     "frontier": frontier}, indent=1))
        if args.out is not None:
            print(f"wrote batch cost model {args.out}", file=sys.stderr)
        return 0
    print(f"{args.trace}: {tr.source_label}\n{sb.model_summary(model)}")
    for block in (sb.validation_summary(validation), union.summary(),
                  "Where speculation stops paying (measured ms per token at K against K = 0, per b):\n"
                  + frontier.to_string(index=False, float_format=lambda v: f"{v:.4g}")):
        print(f"\n{block}")
    if args.out is not None:
        print(f"\nwrote batch cost model {args.out}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    if args.batch:
        return _fit_batch(args)
    from speclimits.errors import SpeclimitsError
    from speclimits.stats.draft import draft_model_or_reason  # heavy: see the module docstring
    from speclimits.stats.costfit import fit_trace_cost_model
    from speclimits.stats.final import fit_final_model
    from speclimits.trace import read_trace

    tr = read_trace(args.trace)
    rounds = tr.rounds
    # the cost model first, written before any comparison runs: a user who only wants it gets it
    cost = fit_trace_cost_model(tr)
    if args.out is not None:
        cost.write(args.out)
    skipped: dict[str, str] = {}
    try:
        final = fit_final_model(rounds, n_boot=args.n_boot, seed=args.seed)
        skipped.update(final.skipped)
    except SpeclimitsError as exc:
        final = None
        skipped["final-model section"] = str(exc)
    draft, why = draft_model_or_reason(rounds)
    if draft is None:
        skipped["draft-model section"] = why
    robust = None
    if args.robustness_k is not None:
        from speclimits.stats.robustness import robustness_checks  # only when asked for

        try:
            robust = robustness_checks(rounds, k=args.robustness_k, n_boot=args.n_boot, seed=args.seed)
        except SpeclimitsError as exc:
            skipped[f"robustness checks at K = {args.robustness_k}"] = str(exc)
    lines = [f"skipped {name}: {why}" for name, why in skipped.items()]
    if args.json:
        out = {"trace": str(args.trace), "source": tr.source_label, "cost_model": cost.to_dict(),
               "final": None if final is None else final.to_dict(),
               "draft": None if draft is None else draft.to_dict()}
        if robust is not None:
            out["robustness"] = robust.to_dict()
        out["skipped"] = skipped
        print(dumps(out, indent=1))
        for line in lines:
            print(f"speclimits fit: {line}", file=sys.stderr)
        if args.out is not None:
            print(f"wrote cost model {args.out}", file=sys.stderr)
    else:
        print(f"{args.trace}: {tr.source_label}")
        print(_cost_summary(cost) if final is None else f"{final.summary()}\n\n{final.joint.summary()}")
        for part in (draft, robust):
            if part is not None:
                print(f"\n{part.summary()}")
        rest = [line for line in lines if final is None or line not in final.skipped_lines()]
        if rest:
            print("\n" + "\n".join(rest))
        if args.out is not None:
            print(f"\nwrote cost model {args.out}")
    return 0


def _cost_summary(cost) -> str:
    """The cost model as text (when the final-model section, which prints the joint fit, is skipped)."""
    import pandas as pd

    by_m = pd.DataFrame({"beta0": pd.Series(cost.beta0), "alpha": pd.Series(cost.alpha)}).rename_axis("m")
    return ("Cost model: target beta0(m) + alpha(m)·Ū + c·L, draft a·K + b\n"
            + by_m.to_string(float_format=lambda v: f"{v:.5g}")
            + f"\nc = {cost.c:.4e} ms/token, a = {cost.a:.4g} ms/step, b = {cost.b:.4g} ms"
            + "".join(f"\nnote: {n}" for n in cost.extra.get("fit", {}).get("notes", [])))
