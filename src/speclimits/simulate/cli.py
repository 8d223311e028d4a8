"""``speclimits simulate``: write a SIMULATED trace with a planted ground truth."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from speclimits.cliutil import parse_assignments
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import read_json
from speclimits.simulate.twin import PRESETS, preset, simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="write a SIMULATED trace with a planted ground truth",
        description=(
            "Generate a trace from the speclimits digital twin of the paper's setting (48 MoE layers x "
            "128 experts, top-8; K sweep; categorical cost with the m=4/5 regime change). Presets: "
            "smoke (seconds, for tests), default (the book's bundled data, ~120k rounds), paper "
            "(~925k decode rounds, as in the paper). meta.json records source=simulator, every "
            "parameter and the planted cost model."
        ),
        epilog="example: speclimits simulate --preset smoke --seed 1 --out /tmp/tr --set n_prompts=20",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="default", help="parameter preset (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed and parameters give the same tables")
    p.add_argument("--out", type=Path, required=True, help="trace directory to write (created if needed)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                   help="override a SimConfig field, e.g. --set n_prompts=20 or --set 'k_values=[1,2,3]' "
                        "or --set cost_model=@file.json (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    overrides = parse_assignments(args.set, "--set")
    for k, v in list(overrides.items()):
        if isinstance(v, str) and v.startswith("@"):
            overrides[k] = read_json(v[1:], f"--set {k}: JSON file", SpeclimitsError)
    cfg = preset(args.preset, **overrides)
    t0 = time.perf_counter()
    tables = simulate(cfg, seed=args.seed, out=args.out, progress=not args.quiet)
    dt = time.perf_counter() - t0
    rounds = tables["rounds"]
    n_dec = int((rounds["phase"] == "decode").sum())
    print(f"wrote SIMULATED trace {args.out}: {n_dec:,} decode rounds, "
          f"{rounds['generation_id'].nunique():,} generations"
          + (f", {len(tables['oracle']):,} oracle states" if "oracle" in tables else "")
          + f" in {dt:.1f} s")
    return 0
