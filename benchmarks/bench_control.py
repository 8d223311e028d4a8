"""Benchmark: adaptive K in vLLM against stock vLLM at every static K and the Oracle (``speclimits control bench``).

Fits the policies on the train split of the bundled trace's greedy references (unless a policy JSON is
given), then runs the command on the held-out references at the batch size asked. The committed figures
(``data/control/bench-batch{1,4,8}.json``) came from, with the machine otherwise idle::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 1 --out data/control/bench-batch1.json -- --blocks 32
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 4 --out data/control/bench-batch4.json -- --blocks 16
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 8 --out data/control/bench-batch8.json -- --blocks 12

(their ``produced_by`` and ``config`` fields record the exact options). Any option of the command can be
passed through after ``--``, e.g. ``-- --blocks 8 --static 1-4``. The tiny setting runs in the test suite
(``tests/test_control_bench.py``).
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
    args, rest = ap.parse_known_args(argv)
    rest = [r for r in rest if r != "--"]
    policy = args.policy or str(Path(args.out).with_name("policy.json"))
    if args.policy is None:
        code = main(["control", "fit", args.trace, "--out", policy, "--k-max", str(args.k_max)])
        if code:
            return code
    return main(["control", "bench", "--policy", policy, "--trace", args.trace, "--batch", str(args.batch),
                 "--target", str(ROOT / "data" / "models" / "target"),
                 "--draft", str(ROOT / "data" / "models" / "eagle3"), "--out", args.out, *rest])


if __name__ == "__main__":
    sys.exit(run())
