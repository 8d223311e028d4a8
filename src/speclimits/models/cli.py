"""``speclimits train-models``: build the corpus and train the project's small models."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

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
    _register_models(subparsers)


def _twin_handler(args: argparse.Namespace) -> int:
    from speclimits.models.twin import build_twin, cache_verdict, default_twin_dir, relative_path

    out = args.out or default_twin_dir(args.expert_width)
    command = (f"speclimits models twin --source {relative_path(args.source)} --expert-width {args.expert_width} "
               f"--seed {args.seed}")
    recipe = build_twin(args.source, out, args.expert_width, args.seed, command=command)
    print(f"wrote {out}: experts {recipe['expert_width_source']} -> {recipe['expert_width']} units "
          f"({recipe['expert_bytes_stored'] / 1024:.0f} KiB per expert as stored, {recipe['stored_dtype']}); "
          f"weights sha256 {recipe['weights_sha256'][:12]}")
    print(cache_verdict(recipe["experts_params_total"]))  # float32: what the project's traces run
    return 0


def _register_models(subparsers) -> None:
    from speclimits.models.twin import DEFAULT_EXPERT_WIDTH
    from speclimits.paths import TARGET_MODEL

    p = subparsers.add_parser(
        "models", help="derived models: the memory-bound twin of the target",
        description="Models derived from the trained ones.")
    sub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    sub.required = True
    t = sub.add_parser(
        "twin", help="widen every expert of an MoE target without changing its function (seconds, deterministic)",
        description=(
            "Write a memory-bound twin of an MoE target: every expert's gate and up projections get extra rows "
            "(random values), its down projection as many zero columns, so each expert's output is unchanged "
            "while the bytes a pass streams per routed expert grow with the width. Greedy outputs, routing "
            "and an EAGLE-3 head's acceptance stay those of the source; only the cost of a verification pass "
            "changes. The recipe (source hash, width, seed, weights hash) is written to twin.json in the output "
            "folder, and a trace of the twin copies it into its meta.json."))
    t.add_argument("--source", type=Path, default=TARGET_MODEL, help="the MoE target folder (default data/models/target)")
    t.add_argument("--expert-width", type=int, default=DEFAULT_EXPERT_WIDTH, metavar="N",
                   help=f"intermediate units per expert in the twin (default {DEFAULT_EXPERT_WIDTH}, chosen by "
                        "measurement: see scripts/make_regime.sh)")
    t.add_argument("--seed", type=int, default=0, help="seeds the values of the extra rows (default 0)")
    t.add_argument("--out", type=Path, default=None,
                   help="output folder (default _build/models/target-twin-wN)")
    t.set_defaults(func=_twin_handler)
