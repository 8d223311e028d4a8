"""Probe: the compiled top-1 of a draft step (:mod:`speclimits.control.top1op`) against the torch calls it replaces.

The rules that read the draft's confidence need, after every draft step, the top-1 probability of each
row of the EAGLE-3 head's logits and the token ids mapped to the target's vocabulary. In torch that is four
dispatches (softmax, max, ``index_select``, ``tolist``); the controller makes them in one compiled call
(``top1op.top1``). Right after the drafter's forward each call runs with its code and data out of the
caches, so this probe reads an array larger than the per-core L2 cache before every call, as the forward
does in the engine, times both forms on the same random logits of the head's width, checks that the ids
are equal and the probabilities agree to 1e-5, and prints the median µs of each per batch size and the
median per-call ratio.

Measured before the op was built into the engine (21:28 UTC, nothing else running, the same C++ then
compiled here): 12.4 / 29.7 / 52.0 µs against 41.7 / 73.4 / 112.6 µs at 1 / 4 / 8 rows. The first run
builds the op if it is not in torch's extension cache (about 40 s). Run alone on the machine (it times
things)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fused_top1_probe.py --batch 1 4 8

Prints the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="rows (requests) per draft step")
    ap.add_argument("--vocab", type=int, default=4096, help="the head's logits per row (the bundled head: 4,096)")
    ap.add_argument("--calls", type=int, default=400, help="timed calls per form and batch size")
    ap.add_argument("--evict-mb", type=float, default=8.0, help="array read before every call (MiB)")
    args = ap.parse_args(argv)
    import torch

    from speclimits.control import top1op

    t0 = time.time()
    mod = top1op.load()
    if mod is None:
        raise SystemExit(f"fused_top1_probe: the compiled top-1 is not usable here ({top1op.status()['reason']})")
    print(f"built or loaded from torch's cache in {time.time() - t0:.1f} s")
    torch.set_num_threads(1)
    evict = np.ones(int(args.evict_mb * 2**20 / 8))
    targets = torch.arange(args.vocab) * 2 + 1  # increasing target ids, as the head's are
    gen = torch.Generator().manual_seed(0)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    sink = 0.0
    for b in args.batch:
        t_torch, t_fused = np.empty(args.calls), np.empty(args.calls)
        for i in range(args.calls):
            x = torch.randn(b, args.vocab, generator=gen) * 3.0
            sink += float(evict[::16].sum())
            t = time.perf_counter()
            top, idx = x.softmax(-1).max(-1)
            ids = targets.index_select(0, idx)
            top1 = top.tolist()
            t_torch[i] = time.perf_counter() - t
            sink += float(evict[::16].sum())
            t = time.perf_counter()
            ids2, top2 = mod.top1(x, targets)
            t_fused[i] = time.perf_counter() - t
            if not torch.equal(ids, ids2) or not np.allclose(top1, top2, rtol=1e-5, atol=0.0):
                raise SystemExit(f"batch {b}, call {i}: the compiled form disagrees with torch's")
        print(f"batch {b}: softmax + max + index_select + tolist {1e6 * np.median(t_torch):.1f} µs, one compiled "
              f"call {1e6 * np.median(t_fused):.1f} µs (medians of {args.calls}, cold); per-call ratio "
              f"{np.median(t_fused / t_torch):.3f}; ids equal, top-1 within 1e-5")
    if sink == 0.5:
        print(sink)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
