"""``speclimits train-models``: build the corpus and train the project's small models."""

from __future__ import annotations

import argparse
import os

from speclimits.paths import MODELS_DIR
from speclimits.models.pipeline import STAGES, train_models
from speclimits.models.pipeline import __doc__ as PIPELINE_DOC


def _handler(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    stages = args.stages.split(",") if args.stages else None
    train_models(args.out, args.scratch, seed=args.seed, smoke=args.smoke, stages=stages, force=args.force,
                 progress=not args.quiet, threads=args.threads)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train-models", help="build the corpus and train the tokenizer, MoE target, EAGLE-3 head and dense draft",
        description=PIPELINE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(MODELS_DIR), help="output folder for models and metadata (default data/models)")
    p.add_argument("--scratch", default=None, help="scratch folder (default: $TMPDIR/speclimits-models-scratch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", default=None, help=f"comma-separated subset of: {','.join(STAGES)}")
    p.add_argument("--force", action="store_true", help="redo stages already recorded in meta.json")
    p.add_argument("--smoke", action="store_true", help="tiny corpus and models (tests; minutes)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_handler)
