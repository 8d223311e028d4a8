"""Benchmark: adaptive K in vLLM against plain decoding, static K and the Oracle (``speclimits control bench``).

Fits the policies on the train split of the bundled trace's greedy references (unless a policy JSON is
given), then runs the command on the held-out references, at the batch size asked. The committed
figures (``data/control/bench-batch1.json``, ``bench-batch4.json``) came from::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 1 --out data/control/bench-batch1.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 4 --out data/control/bench-batch4.json

(their ``produced_by`` and ``config`` fields record the exact options); ``data/control/decompose-batch1.json``
from ``--batch 1 --decompose --policy data/control/policy.json --out data/control/decompose-batch1.json``. Any option of the command can be
passed through after ``--``, e.g. ``-- --blocks 5 --static 1-4``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclimits.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT / "data" / "traces" / "measured-eagle3"))
    ap.add_argument("--policy", default=None, help="policy JSON (default: fit one next to --out)")
    ap.add_argument("--k-max", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--decompose", action="store_true",
                    help="instead: trace the controlled engine and split a round's wall time (target forward, "
                         "drafter, the rest) for static:1, static:4 and the Delta rule, 2 held-out prompts")
    args, rest = ap.parse_known_args(argv)
    if args.decompose:
        return run_decompose(args)
    rest = [r for r in rest if r != "--"]
    policy = args.policy or str(Path(args.out).with_name("policy.json"))
    if args.policy is None:
        code = main(["control", "fit", args.trace, "--out", policy, "--k-max", str(args.k_max)])
        if code:
            return code
    return main(["control", "bench", "--policy", policy, "--trace", args.trace, "--batch", str(args.batch),
                 "--target", str(ROOT / "data" / "models" / "target"), "--draft", str(ROOT / "data" / "models" /
                                                                                     "eagle3"),
                 "--out", args.out, *rest])


def run_decompose(args: argparse.Namespace) -> int:
    from speclimits.control.bench import BenchConfig, choose_prompts, decompose, trace_generations
    from speclimits.control.rules import PolicyFit
    from speclimits.jsonutil import dumps

    policy = args.policy or str(Path(args.out).with_name("policy.json"))
    fit = PolicyFit.read(policy)
    cfg = BenchConfig(policy=policy, out=args.out, trace=args.trace, batch=args.batch, max_tokens=64, limit=2,
                      target=str(ROOT / "data" / "models" / "target"), draft=str(ROOT / "data" / "models" / "eagle3"))
    recorded = trace_generations(Path(args.trace))
    chosen = choose_prompts(cfg, fit, Path(args.trace))
    ids = [recorded[p.id][0] for p in chosen]
    table = decompose(cfg, fit, ids, ["static:1", "static:4", "delta"], [recorded[p.id][1] for p in chosen])
    print(table.round(3).to_string(index=False))
    Path(args.out).write_text(dumps({"label": "measured (tracer on the controlled engine)", "config": vars(args),
                                     "prompts": len(ids), "max_tokens": 64, "table": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run())
