"""``speclimits simulate``: write a SIMULATED trace with a planted ground truth."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from speclimits.cliutil import parse_assignments, parse_batch_sizes
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import read_json
from speclimits.simulate.moe import PRESETS, BatchSim, preset, simulate, simulate_batch


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="write a SIMULATED trace with a planted ground truth",
        description=(
            "Generate a trace from the speclimits simulator of the paper's setting (48 MoE layers x "
            "128 experts, top-8; K sweep; categorical cost with the m=4/5 regime change). Presets: "
            "smoke (seconds, for tests), default (the book's bundled data, ~120k rounds), paper "
            "(~925k decode rounds, as in the paper). meta.json records source=simulator, every "
            "parameter and the planted cost model. --batch 1,2,4,8,16 writes a batch trace instead: requests "
            "share engine steps, each routing independently (a step's unique experts are the union of its "
            "requests' sampled expert ids per layer), step times from a planted batch cost model (batch-1 part "
            "from the paper's appendix, per-request terms gamma, a_req, b_req simulator choices)."
        ),
        epilog="example: speclimits simulate --preset smoke --seed 1 --out /tmp/tr --set n_prompts=20\n"
               "example: speclimits simulate --preset smoke --batch 1,2,4,8,16 --out /tmp/tr-batch",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="default", help="parameter preset (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed and parameters give the same tables")
    p.add_argument("--out", type=Path, required=True, help="trace directory to write (created if needed)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                   help="override a SimConfig field, e.g. --set n_prompts=20 or --set 'k_values=[1,2,3]' "
                        "or --set cost_model=@file.json (repeatable)")
    p.add_argument("--batch", default=None, metavar="B,B,...",
                   help="batch sizes to sweep, e.g. 1,2,4,8,16: writes a SIMULATED batch trace (prompts in closed "
                        "batches of b, every K at every b; rounds with b and batch_id, a steps table, the planted "
                        "batch cost model in meta.json; see speclimits.simulate.moe.simulate_batch). "
                        "Default, or --batch 1: the batch-1 trace")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    overrides = parse_assignments(args.set, "--set")
    for k, v in list(overrides.items()):
        if isinstance(v, str) and v.startswith("@"):
            overrides[k] = read_json(v[1:], f"--set {k}: JSON file", SpeclimitsError)
    if args.batch is not None:
        args.batch = tuple(parse_batch_sizes(args.batch))
    cfg = preset(args.preset, **overrides)
    t0 = time.perf_counter()
    if args.batch is not None and set(args.batch) != {1}:
        tables = simulate_batch(cfg, BatchSim(batch_sizes=args.batch), seed=args.seed, out=args.out,
                                progress=not args.quiet)
        steps = tables["steps"]
        print(f"wrote SIMULATED batch trace {args.out}: batch sizes {sorted(set(args.batch))}, "
              f"{len(steps):,} engine steps ({int((steps['phase'] == 'decode').sum()):,} decode), "
              f"{len(tables['rounds']):,} request rounds, {tables['rounds']['generation_id'].nunique():,} generations "
              f"in {time.perf_counter() - t0:.1f} s")
        return 0
    tables = simulate(cfg, seed=args.seed, out=args.out, progress=not args.quiet)
    dt = time.perf_counter() - t0
    rounds = tables["rounds"]
    n_dec = int((rounds["phase"] == "decode").sum())
    print(f"wrote SIMULATED trace {args.out}: {n_dec:,} decode rounds, "
          f"{rounds['generation_id'].nunique():,} generations"
          + (f", {len(tables['oracle']):,} oracle states" if "oracle" in tables else "")
          + f" in {dt:.1f} s")
    return 0
