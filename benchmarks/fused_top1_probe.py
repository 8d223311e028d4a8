"""Probe: one compiled call for a draft step's top-1 probabilities and token ids, against the torch calls the controller makes.

The rules that read the draft's confidence pay, after every draft step, four torch dispatches: a softmax
and a max over the EAGLE-3 head's logits, an ``index_select`` to the target's ids and a ``tolist`` of the
top-1 (:class:`speclimits.control.extension.ControlWorkerExtension`'s greedy hook). Right after the
drafter's forward each dispatch runs with its code and data out of the caches. This probe compiles one
C++ function (``torch.utils.cpp_extension.load_inline``: the row's first maximum, its target id and
``1 / sum(exp(x - max))``, returned as a tensor of ids and a Python list) and times both forms on the same
random logits of the head's width, with an array larger than the per-core L2 cache read before every
call, as the forward does in the engine. It checks that the ids are equal and the probabilities agree to
1e-5 (the compiled exponential is vectorised, not bit-equal to torch's), and prints the median µs of each
per batch size and the median per-call ratio. Nothing here is used by the engine: it measures what a
compiled step would save before one is built.

Needs a C++ compiler and ninja (``.venv/bin/python -m pip install ninja``); the first run compiles (about
50 s here), later runs reuse torch's extension cache. Run alone on the machine (it times things)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fused_top1_probe.py --batch 1 4 8

Prints the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

// ids (target vocabulary) and top-1 probabilities of each row of x (float32, contiguous, rows x V)
std::tuple<torch::Tensor, std::vector<double>> top1_ids(torch::Tensor x, torch::Tensor targets) {
  const int64_t n = x.size(0), V = x.size(1);
  const float* p = x.data_ptr<float>();
  const int64_t* tg = targets.data_ptr<int64_t>();
  auto ids = torch::empty({n}, torch::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  std::vector<double> top(n);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = p + r * V;
    float m = row[0];
    int64_t a = 0;
    for (int64_t v = 1; v < V; ++v) {
      if (row[v] > m) { m = row[v]; a = v; }  // the first maximum, as torch's max
    }
    float s = 0.f;
    #pragma omp simd reduction(+:s)
    for (int64_t v = 0; v < V; ++v) s += expf(row[v] - m);
    top[r] = 1.0f / s;
    out[r] = tg[a];
  }
  return std::make_tuple(ids, top);
}
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="rows (requests) per draft step")
    ap.add_argument("--vocab", type=int, default=4096, help="the head's logits per row (the bundled head: 4,096)")
    ap.add_argument("--calls", type=int, default=400, help="timed calls per form and batch size")
    ap.add_argument("--evict-mb", type=float, default=8.0, help="array read before every call (MiB)")
    args = ap.parse_args(argv)
    import torch
    from torch.utils.cpp_extension import load_inline

    if shutil.which("ninja") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ninja")):
        raise SystemExit("fused_top1_probe: needs ninja to compile (.venv/bin/python -m pip install ninja)")
    t0 = time.time()
    mod = load_inline("speclimits_top1_probe", cpp_sources=SOURCE, functions=["top1_ids"],
                      extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"])
    print(f"compiled (or loaded from torch's cache) in {time.time() - t0:.1f} s")
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
            ids2, top2 = mod.top1_ids(x, targets)
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
