"""Benchmark: adaptive K in vLLM against stock vLLM at every static K and the Oracle (``speclimits control bench``).

Fits the policies on the train split of the bundled trace's greedy references (unless a policy JSON is
given), then runs the command on the held-out references at the batch size asked. The committed figures
(``data/control/bench-batch{1,4,8}.json``) came from, with the machine otherwise idle::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 1 --out data/control/bench-batch1.json -- --blocks 48
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 4 --out data/control/bench-batch4.json -- --blocks 24 \
        --policies threshold,delta,delta-fixed,delta-fixed:alone,ema,cascade,throughput
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --batch 8 --out data/control/bench-batch8.json -- --blocks 16 \
        --policies threshold,delta,delta-fixed,delta-fixed:alone,ema,cascade,throughput

(their ``produced_by`` and ``config`` fields record the exact options). On the memory-bound twin
(``speclimits models twin --source data/models/target --expert-width 1024 --seed 0 --out
_build/models/target-twin-w1024``; results in ``data/control/twin/``)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_control.py --trace data/traces/twin-eagle3 \
        --target _build/models/target-twin-w1024 --batch 1 --out data/control/twin/bench-batch1.json -- --blocks 24

and at batch 4 and 8 with the ``--policies`` list above. Any option of the command can be
passed through after ``--``, e.g. ``-- --blocks 8 --static 1-4``. The tiny setting runs in the test suite
(``tests/test_control_bench.py``).

``--json PATH``: also write, from the result in ``--out``, each online policy's speed ratio to the best
stock K (95% interval in the note), the best stock K's and plain decoding's ms/token, and the Oracle's
offline gain, as figures (no targets; ``benchmarks/_figures.py``, read by ``benchmarks/run_all.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclimits.cli import main

from _figures import Figure, write_figures

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT / "data" / "traces" / "measured-eagle3"))
    ap.add_argument("--target", default=str(ROOT / "data" / "models" / "target"),
                    help="target model folder (default: the bundled one; the twin: _build/models/target-twin-w1024)")
    ap.add_argument("--policy", default=None, help="policy JSON (default: fit one next to --out)")
    ap.add_argument("--k-max", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the headline figures as JSON")
    args, rest = ap.parse_known_args(argv)
    rest = [r for r in rest if r != "--"]
    policy = args.policy or str(Path(args.out).with_name("policy.json"))
    if args.policy is None:
        code = main(["control", "fit", args.trace, "--out", policy, "--k-max", str(args.k_max)])
        if code:
            return code
    code = main(["control", "bench", "--policy", policy, "--trace", args.trace, "--batch", str(args.batch),
                 "--target", args.target,
                 "--draft", str(ROOT / "data" / "models" / "eagle3"), "--out", args.out, *rest])
    if code == 0 and args.json:
        write_figures(args.json, *figures_of(json.loads(Path(args.out).read_text())))
    return code


def figures_of(res: dict) -> tuple[list[Figure], dict]:
    """Headline figures of a ``speclimits control bench`` result, and what to keep beside them."""
    summary = {row["arm"]: row for row in res["summary"]}
    cfg, choice = res["config"], res["choice"]
    best = choice.get("best_stock")
    setting = (f"batch {cfg['batch']}, {cfg['blocks']} blocks, {cfg['max_tokens']} tokens per prompt, "
               f"{len(res['prompt_ids'])} prompts; lossless: {res['lossless']}")
    figures = []
    for policy in cfg["policies"]:
        row = summary.get(policy, {})
        figures.append(Figure(f"control bench, {policy}: speed ratio to the best stock K ({best})",
                              row.get("vs_best_stock"), "x", better="higher",
                              note=f"95% interval {_num(row.get('vs_best_stock_lo'))}.."
                                   f"{_num(row.get('vs_best_stock_hi'))} (paired, over blocks; best K chosen on "
                                   f"{choice.get('best_stock_chosen_on')}); {setting}"))
    for arm, label in ((best, f"best stock K ({best})"), ("plain", "plain decoding")):
        if arm in summary:
            figures.append(Figure(f"control bench, {label}: ms/token", summary[arm]["ms_per_token"], "ms/token",
                                  note="median over blocks"))
    oracle = res.get("oracle") or {}
    if oracle.get("oracle_exact_gain_over_best_static") is not None:
        figures.append(Figure("control bench, Oracle's offline gain over the best static K",
                              oracle["oracle_exact_gain_over_best_static"], "x", better="higher",
                              note=f"exact replay on the {oracle.get('n_sequences')} held-out references, "
                                   "profiled costs"))
    return figures, {"out": cfg["out"], "config": cfg, "choice": choice, "lossless": res["lossless"],
                     "note": res.get("note", "")}


def _num(x) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and x == x else "n/a"


if __name__ == "__main__":
    sys.exit(run())
