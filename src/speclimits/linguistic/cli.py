"""``speclimits linguistic TRACE``: context labels, k* by context and routing contrasts of a trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.cliutil import add_oracle_arguments
from speclimits.jsonutil import dumps, jsonable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "linguistic",
        help="k* by linguistic context and new experts at script changes / first mismatches",
        description=(
            "Label every reference token of TRACE/tokens.parquet by rules that read only its text, solve the "
            "Oracle on TRACE/oracle.parquet, and report the share of k* >= 4 and of k* = 1 per context and the "
            "new experts per layer at Latin<->Cyrillic changes and at the draft's first mismatch, with 95% "
            "bootstrap intervals over responses (methods page of the book). The headline uses greedy references "
            "(the target's own output, as the paper); teacher-forced references are reported apart, under "
            "by_reference_kind. Simulated traces also get the labeller's agreement with the planted contexts."
        ),
        epilog="example: speclimits linguistic data/traces/sim-default --n-boot 199 --json",
    )
    add_oracle_arguments(p, needs="oracle.parquet and tokens.parquet")
    p.add_argument("--n-boot", type=int, default=999, metavar="B", help="bootstrap replicates (default 999)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--decisions", type=Path, metavar="FILE",
                   help="also write the per-decision table (seq_id, pos, reference_kind, token_pos = pos + 1, the "
                        "predicted token's id and text, its label, k*, ...) as CSV or Parquet by FILE's suffix")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cli)


def run(trace: Path, cost_model: Path | None = None, k_max: int | None = None, n_boot: int = 999,
        seed: int = 0, surrogate: str = "auto", decisions: Path | None = None) -> dict[str, Any]:
    """The command's result as a dict (tables as lists of records); see the module docstring."""
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
    res = setup.solve(k_max=k_max)
    lab = ling.label_trace_tokens(tr.tokens)
    studies = ling.study_by_kind(res, lab, setup.kinds, n_boot=n_boot, seed=seed)
    head = ling.headline(studies)
    dec = pd.concat([st.decisions for st in studies.values()], ignore_index=True)
    out: dict[str, Any] = {"trace": str(trace), "source": tr.source_label, "cost_model": setup.notes[0],
                           "surrogate": setup.surrogate_label, "reference_kinds": setup.notes[2],
                           "oracle_total_ms": res.bounds.oracle_ms, "k_max": res.k_max, "n_decisions": len(dec),
                           "n_responses": int(dec["seq_id"].nunique()),
                           "n_states_without_token": head.decisions.attrs["n_unmatched"], "n_boot": n_boot}
    if tr.oracle is not None and "draft_tokens" in tr.oracle.columns and "token_id" in tr.tokens.columns:
        kinds = dict(zip(setup.inputs.seq_ids.astype(str), setup.kinds))
        out["alignment"] = jsonable(ling.alignment_check(tr.oracle, tr.tokens, kinds))
    if "context" in lab.columns:
        agree = ling.label_agreement(lab)
        out["label_agreement"] = {"accuracy": agree.accuracy, "kappa": agree.kappa,
                                  "script_accuracy": agree.script_accuracy,
                                  "by_context": jsonable(agree.by_context)}
    out["headline_reference_kind"] = head.kind
    out.update(_kind_block(head))
    out["by_reference_kind"] = {kind: _kind_block(st) for kind, st in studies.items()}
    if decisions is not None:
        out["decisions_file"] = str(ling.write_decisions(dec, decisions))
    return out


def _kind_block(st: Any) -> dict[str, Any]:
    """One reference kind's tables as JSON-ready records."""
    return {"n_decisions_kind": len(st.decisions), "n_responses_kind": st.n_responses,
            "k_by_context": jsonable(st.k_by_context), "k_by_fine_label": jsonable(st.k_by_fine_label),
            "routing": jsonable(st.routing), "routing_note": st.note}


def _cli(args: argparse.Namespace) -> int:
    out = run(args.trace, args.cost_model, args.k_max, args.n_boot, args.seed, args.surrogate, args.decisions)
    if args.json:
        print(dumps(out, indent=2, ensure_ascii=False))
        return 0
    print(f"{out['trace']}: {out['source']}")
    print(f"{out['cost_model']}; K_max = {out['k_max']}; {out['n_decisions']:,} decisions over "
          f"{out['n_responses']} responses; {out['reference_kinds']}")
    for row in out.get("alignment", []):
        print(f"alignment ({row['reference_kind']}): first draft token = token row pos + 1 in "
              f"{row['share_row_pos_plus_1']:.1%} of {row['n_states']} states with accept_len >= 1 "
              f"(row pos: {row['share_row_pos']:.1%})")
    if "label_agreement" in out:
        a = out["label_agreement"]
        print(f"labeller vs planted contexts: agreement {a['accuracy']:.3f}, kappa {a['kappa']:.3f}")
    for kind, block in out["by_reference_kind"].items():
        tag = "headline, as the paper" if kind == out["headline_reference_kind"] else "apart, not pooled"
        print(f"\n=== {kind} references ({tag}): {block['n_decisions_kind']:,} decisions, "
              f"{block['n_responses_kind']} responses ===")
        cols = ["context", "n_decisions", "n_responses", "share_long", "long_lo", "long_hi", "share_k1", "k1_lo",
                "k1_hi", "paper_share_long"]
        print("k* by context (share of k* >= 4 and of k* = 1, 95% bootstrap CIs over responses):")
        print(pd.DataFrame(block["k_by_context"]).reindex(columns=cols).round(3).to_string(index=False))
        print("new experts per layer, event step vs the step before (95% CI of the difference):")
        cols = ["contrast", "n_events", "n_responses", "before", "at", "diff", "diff_lo", "diff_hi", "adjusted",
                "paper_diff"]
        print(pd.DataFrame(block["routing"]).reindex(columns=cols).round(3).to_string(index=False))
        if block["routing_note"]:
            print(f"note: {block['routing_note']}")
    if "decisions_file" in out:
        print(f"\nper-decision table written to {out['decisions_file']}")
    return 0
