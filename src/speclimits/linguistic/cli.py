"""``speclimits linguistic TRACE``: context labels, k* by context and routing contrasts of a trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.cliutil import add_oracle_arguments
from speclimits.jsonutil import jsonable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "linguistic",
        help="k* by linguistic context and new experts at script changes / first mismatches",
        description=(
            "Label every reference token of TRACE/tokens.parquet by rules that read only its text, solve the "
            "Oracle on TRACE/oracle.parquet, and report the share of k* >= 4 and of k* = 1 per context and the "
            "new experts per layer at Latin<->Cyrillic changes and at the draft's first mismatch, with 95% "
            "bootstrap intervals over responses (methods page of the book). Simulated traces also get the labeller's agreement "
            "with the planted contexts."
        ),
        epilog="example: speclimits linguistic data/traces/sim-default --n-boot 199 --json",
    )
    add_oracle_arguments(p, needs="oracle.parquet and tokens.parquet")
    p.add_argument("--n-boot", type=int, default=999, metavar="B", help="bootstrap replicates (default 999)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def run(trace: Path, cost_model: Path | None = None, k_max: int | None = None, n_boot: int = 999,
        seed: int = 0, surrogate: str = "auto") -> dict[str, Any]:
    """The command's result as a dict (tables as lists of records)."""
    # imported when the command runs: the study pulls in statsmodels and scikit-learn, which
    # `speclimits --help` and the other subcommands should not wait for
    from speclimits import linguistic as ling
    from speclimits.errors import Problem, TraceFormatError
    from speclimits.oracle.prepare import prepare_oracle
    from speclimits.trace import read_trace

    tr = read_trace(trace)
    if tr.tokens is None:
        raise TraceFormatError(str(trace), [Problem("tokens.parquet", None, "is missing: the linguistic study "
                                                                            "needs the token text")])
    setup = prepare_oracle(tr, cost_model, surrogate)
    note = setup.notes[0]
    res = setup.solve(k_max=k_max)
    lab = ling.label_trace_tokens(tr.tokens)
    dec = ling.decision_table(res, lab)
    out: dict[str, Any] = {"trace": str(trace), "source": tr.source_label, "cost_model": note,
                           "surrogate": setup.surrogate_label, "oracle_total_ms": res.bounds.oracle_ms, "k_max": res.k_max,
                           "n_decisions": len(dec), "n_responses": int(dec["seq_id"].nunique()),
                           "n_states_without_token": dec.attrs["n_unmatched"], "n_boot": n_boot}
    if "context" in lab.columns:
        agree = ling.label_agreement(lab)
        out["label_agreement"] = {"accuracy": agree.accuracy, "kappa": agree.kappa,
                                  "script_accuracy": agree.script_accuracy,
                                  "by_context": jsonable(agree.by_context)}
    out["k_by_context"] = jsonable(ling.k_by_context(dec, by="label", n_boot=n_boot, seed=seed))
    out["k_by_fine_label"] = jsonable(ling.k_by_context(dec, by="label_fine", n_boot=n_boot, seed=seed))
    contrasts = [ling.script_change_contrast(lab), ling.first_mismatch_contrast(res, lab, source="reference"),
                 ling.first_mismatch_contrast(res, source="window")]
    out["routing"] = jsonable(ling.routing_table(contrasts, n_boot=n_boot, seed=seed))
    return out


def _cli(args: argparse.Namespace) -> int:
    out = run(args.trace, args.cost_model, args.k_max, args.n_boot, args.seed, args.surrogate)
    if args.json:
        print(json.dumps(jsonable(out), indent=2, ensure_ascii=False))
        return 0
    print(f"{out['trace']}: {out['source']}")
    print(f"{out['cost_model']}; K_max = {out['k_max']}; {out['n_decisions']:,} decisions over "
          f"{out['n_responses']} responses")
    if "label_agreement" in out:
        a = out["label_agreement"]
        print(f"labeller vs planted contexts: agreement {a['accuracy']:.3f}, kappa {a['kappa']:.3f}")
    cols = ["context", "n_decisions", "n_responses", "share_long", "long_lo", "long_hi", "share_k1", "k1_lo",
            "k1_hi", "paper_share_long"]
    print("\nk* by context (share of k* >= 4 and of k* = 1, 95% bootstrap CIs over responses):")
    print(pd.DataFrame(out["k_by_context"])[cols].round(3).to_string(index=False))
    print("\nnew experts per layer, event step vs the step before (95% CI of the difference):")
    cols = ["contrast", "n_events", "n_responses", "before", "at", "diff", "diff_lo", "diff_hi", "adjusted",
            "paper_diff"]
    print(pd.DataFrame(out["routing"])[cols].round(3).to_string(index=False))
    return 0
