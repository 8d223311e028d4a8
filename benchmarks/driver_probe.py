"""Probe: what the controller's decisions cost per round, outside vLLM, with the caches cold.

Inside the engine each of the controller's hooks runs right after a forward pass, whose weights and
kernels push the controller's code and data out of the caches; a hook then costs several times what
it costs in a loop (``benchmarks/top1_probe.py`` measures that inside vLLM). This benchmark drives the
policy's side of the rounds (:class:`speclimits.control.driver.RoundDriver`, the code the worker
runs between its forwards) with seeded confidences, and before every call it walks through an array
larger than the per-core L2 cache (``--evict-mb``), so every call starts cold as in the engine. It
prints, per policy and batch size, the median µs per round (begin, every draft step, finish, observe)
and its quartiles over rounds. Use it to compare two versions of the driver or the rules (run it on
each, alone on the machine); the decision time the book reports is measured in the engine
(``speclimits control bench``), which adds the hooks' own bookkeeping and the top-1 probabilities.

Run alone on the machine (it times things)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/driver_probe.py --batch 1 4 8 --rounds 400

Prints the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("static:3", "threshold", "delta-fixed", "delta", "delta-fixed:alone", "ema", "throughput")


def run(policy_path: Path, name: str, batch: int, rounds: int, evict: np.ndarray, seed: int) -> np.ndarray:
    """µs per round for ``rounds`` rounds of ``batch`` requests under policy ``name``."""
    from speclimits.control.driver import RoundDriver
    from speclimits.control.rules import PolicyFit

    fit = PolicyFit.read(policy_path)
    pol = fit.make(name)
    driver = RoundDriver(pol)
    rng = np.random.default_rng(seed)
    k_call = fit.k_max
    rids = [f"r{i}" for i in range(batch)]
    n_out = [0] * batch  # output tokens per request so far
    out = np.empty(rounds)
    sink = 0.0

    def cold() -> float:
        return float(evict[::16].sum())  # one read per cache line of the array

    for r in range(rounds):
        conf = rng.beta(6.0, 1.2, size=(batch, k_call))
        cols = conf.T.tolist()  # what the engine's top-1 gives: a list of floats per step
        spent = 0.0
        sink += cold()
        t0 = time.perf_counter()
        rnd = driver.begin(rids, k_call)
        spent += time.perf_counter() - t0
        for j in range(1, k_call + 1):
            sink += cold()
            t0 = time.perf_counter()
            top1 = cols[j - 1] if driver.wants_confidence(rnd) else None
            done = driver.step(rnd, top1)
            spent += time.perf_counter() - t0
            if done:
                break
        sink += cold()
        t0 = time.perf_counter()
        keep = driver.finish(rnd)
        spent += time.perf_counter() - t0
        accepted = [int(np.argmin(np.append(rng.random(k) < conf[i, :k], False))) for i, k in enumerate(keep)]
        sink += cold()
        t0 = time.perf_counter()
        driver.verified(rids, keep, [15.0] * len(rids), n_out)  # the engine's (one-round-late) observation
        spent += time.perf_counter() - t0
        n_out = [n + a + 1 for n, a in zip(n_out, accepted)]
        out[r] = spent * 1e6
    if sink == 0.5:  # keep the reads
        print(sink)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, default=ROOT / "data" / "control" / "policy.json",
                    help="policy JSON (default: the bundled data/control/policy.json)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="batch sizes")
    ap.add_argument("--rounds", type=int, default=400, help="rounds per policy and batch size")
    ap.add_argument("--evict-mb", type=float, default=8.0, help="array walked before every call (MiB)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    evict = np.ones(int(args.evict_mb * 2**20 / 8))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'policy':<20} {'batch':>5} {'median µs/round':>16} {'q25':>8} {'q75':>8}")
    for b in args.batch:
        for name in args.policies.split(","):
            us = run(args.policy, name, b, args.rounds, evict, args.seed)
            us = us[len(us) // 10:]  # the first rounds warm the allocator and the tables
            q25, q50, q75 = np.percentile(us, [25, 50, 75])
            print(f"{name:<20} {b:>5} {q50:>16.1f} {q25:>8.1f} {q75:>8.1f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
