"""Benchmark: the simulator's paper preset (target: <= 60 s and <= 4 GB on the 2-core machine).

Runs `speclimits simulate --preset paper` in a child process and reports wall time, peak
resident memory of that process, and the table sizes.

    .venv/bin/python benchmarks/bench_simulate.py [--seed 0] [--json PATH]

``--json PATH``: also write the wall time, peak memory and trace size as figures
(``benchmarks/_figures.py``; read by ``benchmarks/run_all.py``).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _figures import Figure, write_figures

#: Targets on the 2-core machine.
TARGET_WALL_S = 60.0
TARGET_PEAK_GIB = 4.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the headline figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "speclimits.cli", "simulate", "--preset", args.preset,
                        "--seed", str(args.seed), "--out", str(out), "--quiet"], check=True)
        wall = time.perf_counter() - t0
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        from speclimits.trace.io import read_table

        rounds = read_table(out, "rounds")
        dec = rounds[rounds["phase"] == "decode"]
        size_mb = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    print(f"preset {args.preset}, seed {args.seed}")
    print(f"decode rounds K>=1: {int((dec['K'] > 0).sum()):,}   K=0 (plain decoding): {int((dec['K'] == 0).sum()):,}")
    print(f"wall time:   {wall:6.1f} s   (target <= 60 s; ratio {wall / 60:.2f})")
    print(f"peak memory: {peak_kb / 2**20:6.2f} GiB (target <= 4 GiB; ratio {peak_kb / 2**20 / 4:.2f})")
    print(f"trace size:  {size_mb:6.1f} MiB")
    if args.json:
        run = f"preset {args.preset}, seed {args.seed}, child process"
        write_figures(args.json, [
            Figure(f"simulate --preset {args.preset}: wall time", wall, "s", TARGET_WALL_S, note=run),
            Figure(f"simulate --preset {args.preset}: peak memory", peak_kb / 2**20, "GiB", TARGET_PEAK_GIB,
                   note="peak RSS of the child (RUSAGE_CHILDREN)"),
            Figure(f"simulate --preset {args.preset}: trace size", size_mb, "MiB"),
        ], extra={"preset": args.preset, "seed": args.seed, "decode_rounds_k_ge_1": int((dec["K"] > 0).sum()),
                  "decode_rounds_k0": int((dec["K"] == 0).sum())})


if __name__ == "__main__":
    main()
