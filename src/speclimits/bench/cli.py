"""``speclimits control bench`` and ``summarize``: the engine benchmark of the controller's policies
(:mod:`speclimits.bench.control`), registered under ``speclimits control``."""

from __future__ import annotations

import argparse
import sys

from speclimits.control.cli import actions
from speclimits.control.profile import PROFILE_ROUNDS
from speclimits.paths import EAGLE3_MODEL, TARGET_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` and ``summarize`` to ``speclimits control``."""
    sub = actions(subparsers)
    b = sub.add_parser("bench", help="every policy against stock vLLM at every static K, finely interleaved blocks, "
                                     "paired ratios")
    b.add_argument("--policy", required=True, help="policy JSON from `speclimits control fit`, or a policy set by temperature from `speclimits control combine`")
    b.add_argument("--trace", default=None, help="trace whose Oracle data covers the prompts (default: the fit's)")
    b.add_argument("--target", default=str(TARGET_MODEL), help="target model folder (default: the bundled one)")
    b.add_argument("--draft", default=str(EAGLE3_MODEL), help="EAGLE-3 head folder (default: the bundled one)")
    b.add_argument("--method", default="eagle3")
    b.add_argument("--load-format", default="auto")
    b.add_argument("--prompts", default=None, help="prompt JSONL (default: the trace's prompts.jsonl)")
    b.add_argument("--ids", default="test", help="'test' (the fit's held-out references) or comma-separated ids")
    b.add_argument("--limit", type=int, default=None, help="first N prompts only")
    b.add_argument("--batch", default="1", metavar="B,B,...",
                   help="max_num_seqs (requests in flight), e.g. 4; a list (1,4,8 or 1-4) runs one benchmark per "
                        "batch size, each written to OUT with -batchB before its suffix")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--blocks", type=int, default=16,
                   help="blocks (one prompt, or one batch of prompts, each; every arm runs every block), default 16")
    b.add_argument("--static", default="1-6", help="stock vLLM engines with num_speculative_tokens = K, e.g. 1-6")
    b.add_argument("--ext-static", default="2,3,4",
                   help="static K run inside the control extension (its overhead against stock), '' for none")
    b.add_argument("--profile-rounds", type=int, default=PROFILE_ROUNDS,
                   help=f"rounds the controller profiles this machine's costs before the arms run, default {PROFILE_ROUNDS}")
    b.add_argument("--policies", default="threshold,delta,delta-fixed,ema,cascade,throughput")
    b.add_argument("--out", required=True, help="JSON to write")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--temperature", type=float, default=0.0,
                   help="sample every request at this temperature (default 0: greedy); each request of a block gets "
                        "a seed, the same in every arm; on CPU every engine runs with vLLM's rejection sampler repaired "
                        "(vllm#55005). The policy and trace should be sampled at the same temperature")
    b.add_argument("--top-p", type=float, default=1.0, help="top-p of sampled requests (default 1)")
    b.add_argument("--greedy-share", type=float, default=0.0,
                   help="a mixed workload: this share of the requests greedy, the rest sampled at --temperature, in "
                        "the same batches (default 0); give --policy a policy set (`speclimits control combine`) so "
                        "that each request is decided by a fit of its own temperature")
    b.set_defaults(func=run_bench)
    r = sub.add_parser("summarize", help="recompute benchmark files' summaries from their stored blocks (nothing is run)",
                       description="Recompute the summary of each benchmark JSON from the blocks and the offline "
                                   "table it stores, with the run's bootstrap seed and size, and write it back (or to "
                                   "--out). For when the summary's definitions change; no engine runs.")
    r.add_argument("files", nargs="+", help="benchmark JSON files written by `speclimits control bench`")
    r.add_argument("--out", default=None, help="write here instead of over the file (one input file only)")
    r.set_defaults(func=run_summarize)


def run_bench(args: argparse.Namespace) -> int:
    # the benchmark pulls in the engine helpers and, when it runs, vLLM: only when the command runs
    from speclimits.bench.control import BenchConfig, run_benchmark
    from speclimits.cliutil import parse_batch_sizes

    for cfg in BenchConfig.per_batch(args, parse_batch_sizes(args.batch)):
        result = run_benchmark(cfg)
        print(result["summary_text"])
        print(f"wrote {cfg.out}")
    return 0


def run_summarize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from speclimits.bench.control import resummarize
    from speclimits.errors import SpeclimitsError
    from speclimits.jsonutil import dumps, read_json

    if args.out and len(args.files) != 1:
        raise SpeclimitsError("--out takes one input file; without it every file is rewritten in place")
    for name in args.files:
        result = read_json(name, "benchmark file", SpeclimitsError)
        for key in ("config", "blocks", "lossless"):
            if key not in result:
                raise SpeclimitsError(f"{name}: not a `speclimits control bench` result (no {key!r})")
        out = resummarize(result, by=" ".join(["speclimits", *sys.argv[1:]]) if sys.argv else "")
        dest = Path(args.out or name)
        dest.write_text(dumps(out, indent=1) + "\n")
        print(out["summary_text"])
        print(f"wrote {dest}")
    return 0
