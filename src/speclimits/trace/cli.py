"""``speclimits validate``: check a trace directory against the data contract."""

from __future__ import annotations

import argparse
from pathlib import Path

from speclimits.trace.filters import decode_rounds
from speclimits.trace.io import read_trace
from speclimits.trace.validate import validate_trace


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check a trace directory against the data contract",
        description=(
            "Check meta.json and the Parquet tables of a trace: required columns and types, "
            "no negative or NaN timings, m = n_draft+1 (= K+1) on decode rounds, n_draft <= K, accepted <= drafted, "
            "emitted <= accepted+1, u_bar within [top_k, n_experts], context growing within a "
            "generation, list columns of the right length, probabilities in [0, 1], pos = 0..N-1 once per "
            "sequence (the same oracle.parquet rules the Oracle's loader applies). "
            "Zero timings and prefill rounds are not errors; they are counted and reported. "
            "Exit code 0 when valid, 2 with one message naming file, column and rows otherwise."
        ),
    )
    p.add_argument("trace", type=Path, help="trace directory (meta.json + rounds.parquet [+ oracle.parquet])")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    validate_trace(args.trace)
    tr = read_trace(args.trace)
    print(f"{args.trace}: valid ({tr.source_label})")
    if (args.trace / "rounds.parquet").exists():
        _, rep = decode_rounds(tr.rounds, timing="target")
        _, rep_d = decode_rounds(tr.rounds, timing="draft")
        print("  rounds (target-time fits): " + str(rep).replace("\n", "\n    "))
        print(f"  draft timing: {rep_d.n_zero_timing:,} decode rounds with a zero t_draft_ms "
              f"({100 * rep_d.share_zero_timing:.2f}%)")
    if tr.oracle is not None:
        print(f"  oracle: {len(tr.oracle):,} states over {tr.oracle['seq_id'].nunique():,} sequences")
    if tr.tokens is not None:
        print(f"  tokens: {len(tr.tokens):,} rows")
    return 0
