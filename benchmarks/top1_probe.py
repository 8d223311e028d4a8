"""Probe: what a draft step's top-1 probability costs inside vLLM, for several ways of computing it.

The rules that read confidences (threshold, Delta) need, after every draft step, each request's top-1
probability ``1 / sum_v exp(x_v - max x)`` over the drafter's logits. Right after the drafter's forward
the code and data of a small torch or numpy call are out of the caches, so a call costs several times
what it costs in a loop (the benchmark's hook times show it). This probe runs the controlled engine
(the bundled pair, the threshold rule, greedy) and, at every draft step, times **one** variant chosen at
random as the first thing done after the forward (the position the controller's call has), then
computes the production form (:func:`speclimits.control.top1op.top1_probability`) whose values the
rule uses, and checks the variant's values against it. Some variants also make the drafter's token
choice (vLLM's ``argmax(-1)``, alone or fused with the top-1), to show what the top-1 costs net of it; every
step also counts whether the probabilities' max index equals the logits' argmax. Prints per batch size
and variant the median and mean µs per call and the largest difference from the production values.
Forms named ``small_*`` read the EAGLE-3 head's own logits (its 4,096-token draft vocabulary, kept by a
hook on its logits processor) instead of the 8,192 target-vocabulary logits vLLM scatters them into;
``cross_entropy_*`` take the top-1 as ``exp(-cross_entropy)`` at the chosen token.

Measured (medians, 1 / 4 / 8 rows): the production form 19.4 / 28.0 / 37.8 µs on the 4,096
draft-vocabulary logits, 21.6 / 36.5 / 61.7 µs on the 8,192 target-vocabulary ones; cross-entropy at
the chosen ids 58 / 79 / 102, numpy 68 / 107 / 155, logsumexp 131 / 229 / 344.

Run alone on the machine (it times things), one OpenMP thread::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/top1_probe.py --batch 1 4 8 --prompts 8 --max-tokens 64

Prints the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def variants():
    """Each variant takes (x: the drafter's logits over the target vocabulary, float32; ids: the drafter's
    token choice (vLLM's argmax, already made); small: the drafter's own logits before they are scattered
    into the target vocabulary (EAGLE-3 heads with a draft vocabulary; else None))."""
    import math

    import torch
    import torch.nn.functional as F

    def softmax_amax(x, ids, small):  # the production form
        return x.softmax(-1).amax(-1).tolist()

    def shifted_exp_sum(x, ids, small):
        return (1.0 / (x - x.amax(-1, keepdim=True)).exp_().sum(-1)).tolist()

    def logsumexp(x, ids, small):
        return (x.amax(-1) - torch.logsumexp(x, -1)).exp().tolist()

    def numpy_form(x, ids, small):
        a = x.numpy()
        m = a.max(axis=1, keepdims=True)
        return (1.0 / np.exp(a - m).sum(axis=1)).tolist()

    def aten_softmax(x, ids, small):
        return torch.ops.aten.amax(torch.ops.aten._softmax(x, -1, False), [-1]).tolist()

    # the top-1 from the token already chosen: -log p(argmax) is the cross-entropy at the argmax
    def cross_entropy_at_ids(x, ids, small):
        return [math.exp(-v) for v in F.cross_entropy(x, ids, reduction="none").tolist()]

    # on the draft vocabulary itself (the target-vocabulary logits are -inf elsewhere: same softmax)
    def small_softmax_amax(x, ids, small):
        return small.softmax(-1).amax(-1).tolist()

    # with the drafter's token choice, which vLLM makes right after (``logits.argmax(-1)``): what the step
    # costs now (vLLM's argmax, then the top-1), the argmax alone, and forms that make both at once
    def argmax_only(x, ids, small):
        x.argmax(-1)
        return None

    def max_only(x, ids, small):
        x.max(-1)
        return None

    def argmax_then_softmax_amax(x, ids, small):
        x.argmax(-1)
        return x.softmax(-1).amax(-1).tolist()

    def softmax_max_ids(x, ids, small):  # ids and top-1 from the probabilities (ids may differ at float32 ties)
        top, _ids = x.softmax(-1).max(-1)
        return top.tolist()

    def max_indices_softmax_amax(x, ids, small):  # ids from the logits' max (first maximum, as argmax), top-1 apart
        x.max(-1)
        return x.softmax(-1).amax(-1).tolist()

    def max_indices_small_softmax(x, ids, small):  # ids from the logits' max, top-1 on the draft vocabulary
        x.max(-1)
        return small.softmax(-1).amax(-1).tolist()

    def max_indices_cross_entropy(x, ids, small):  # ids and the max from the logits, top-1 by the cross-entropy
        _v, i = x.max(-1)
        return [math.exp(-v) for v in F.cross_entropy(x, i, reduction="none").tolist()]

    forms = (softmax_amax, shifted_exp_sum, logsumexp, numpy_form, aten_softmax, cross_entropy_at_ids,
             small_softmax_amax, argmax_only, max_only, argmax_then_softmax_amax, softmax_max_ids,
             max_indices_softmax_amax, max_indices_small_softmax, max_indices_cross_entropy)
    return {f.__name__: f for f in forms}


def _capture_small(worker, box):
    """Runs in the (in-process) worker: keep the EAGLE-3 head's own logits (before vLLM scatters them into
    the target vocabulary) of each draft step in ``box[0]``."""
    lp = worker.model_runner.drafter.model.logits_processor
    orig = lp.forward

    def forward(*args, **kwargs):
        out = orig(*args, **kwargs)
        box[0] = out
        return out

    lp.forward = forward
    worker.speclimits_tokens.own = False  # vLLM makes the token choice: the top-1 is then computed apart, as probed here
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per batch size (the fit's held-out ones)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--policy", default=str(ROOT / "data" / "control" / "policy.json"))
    ap.add_argument("--trace", default=str(ROOT / "data" / "traces" / "measured-eagle3"))
    ap.add_argument("--out", default=None, help="also write the per-call samples as JSON")
    args = ap.parse_args()

    import speclimits.control.top1op as ext  # the module whose top1_probability the controller calls
    from speclimits.bench import engines as ce
    from speclimits.bench.control import trace_generations
    from speclimits.control.rules import PolicyFit

    fit = PolicyFit.read(args.policy)
    recorded = trace_generations(Path(args.trace))
    ids = [recorded[s][0] for s in fit.test_seq_ids if s in recorded][: args.prompts]
    forms = variants()
    production = ext.top1_probability
    samples: dict[str, list[float]] = {}
    worst: dict[str, float] = {}
    ties: dict[int, int] = {}  # rows where the probabilities' max index is not the logits' argmax
    rng = random.Random(0)

    small_box: list = [None]

    def probe(logits, n_rows, ids=None):
        names = [n for n in forms if small_box[0] is not None or "small" not in n]
        name = rng.choice(names)
        x = logits if logits.dtype.is_floating_point and logits.dtype.itemsize == 4 else logits.float()
        t0 = time.perf_counter()
        got = forms[name](x, ids, small_box[0])
        dt = time.perf_counter() - t0
        out = production(logits, n_rows)
        key = f"{n_rows}:{name}"
        samples.setdefault(key, []).append(dt * 1e6)
        if got is not None:
            worst[key] = max(worst.get(key, 0.0), float(np.max(np.abs(np.asarray(got) - np.asarray(out)))))
        ties[n_rows] = ties.get(n_rows, 0) + int((x.softmax(-1).max(-1).indices != x.argmax(-1)).sum())
        return out

    print(f"load average before: {os.getloadavg()}")
    target, draft = str(ROOT / "data" / "models" / "target"), str(ROOT / "data" / "models" / "eagle3")
    for b in args.batch:
        llm = ce.build_llm(target, draft, "eagle3", fit.k_max, batch=b)
        try:
            llm.collective_rpc("speclimits_control_set", args=(fit.to_dict(), "threshold", 0))
            ce.generate(llm, ids[:b], 16)  # warm-up, not probed
            llm.collective_rpc(_capture_small, args=(small_box,))
            ext.top1_probability = probe
            try:
                ce.generate(llm, ids, args.max_tokens)
            finally:
                ext.top1_probability = production
        finally:
            ce.close(llm)
    print(f"load average after: {os.getloadavg()}")
    print(f"{'rows':>4} {'variant':26} {'calls':>6} {'median µs':>10} {'mean µs':>8} {'max |diff|':>10}")
    for key in sorted(samples, key=lambda k: (int(k.split(':')[0]), k)):
        rows, name = key.split(":")
        v = np.asarray(samples[key])
        diff = f"{worst[key]:10.2e}" if key in worst else f"{'–':>10}"
        print(f"{rows:>4} {name:26} {len(v):6d} {np.median(v):10.1f} {v.mean():8.1f} {diff}")
    print("draft steps where the probabilities' max index differs from the logits' argmax: "
          + ", ".join(f"{n} at {b} rows" for b, n in sorted(ties.items())))
    if args.out:
        Path(args.out).write_text(json.dumps({"samples": samples, "max_abs_diff": worst, "id_ties": ties,
                                              "load": os.getloadavg()}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
