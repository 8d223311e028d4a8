"""Probe: the batch Delta rule's decisions of one round, this code against an earlier revision, paired.

At batch > 1 the Delta rules decide once for the batch: after every draft step
:meth:`~speclimits.control.rules.DeltaRule.engine_batch_more` searches the longer rounds, and when the
batch stops :meth:`~speclimits.control.rules.DeltaRule.batch_select` says what each request keeps.
This probe loads ``src/speclimits/control/rules.py`` as it was at ``--against`` (``git show``, into a
module of its own) beside the current one, and for each seeded round (confidences drawn per request and
step) runs both rules' decisions step by step, in an order that alternates from round to round, with the
caches cleared before every call (an array larger than the per-core L2 cache is read first, as the
drafter's forward does in the engine). It checks that both take the same decisions (steps drafted and
tokens kept) and prints, per batch size, the median µs per round of each and the geometric mean of
the per-round ratio (current / earlier) with a 95% bootstrap interval over rounds. Paired rounds
cancel the machine's drift, which medians of separate runs do not.

Run alone on the machine (it times things)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/batch_stop_probe.py --against 955393d --batch 4 8

Prints the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RULES = "src/speclimits/control/rules.py"


def load_rules_at(rev: str, folder: Path):
    """The rules module as it was at git revision ``rev``, imported under a name of its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{RULES}"], check=True, capture_output=True,
                         text=True).stdout
    path = folder / "rules_earlier.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("rules_earlier", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rules_earlier"] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def one_round(pol, conf: np.ndarray, lams: list[float], k: int, cold) -> tuple[float, int, list[int]]:
    """µs of the batch decisions of one round (cold before each call), steps drafted, tokens kept."""
    b = conf.shape[0]
    # the keep when the batch stops now: batch_select with last = j since c0386d3, engine_batch_keep before
    keep_now = getattr(pol, "engine_batch_keep", None) or (lambda p, lam: pol.batch_select(p, lam, len(p[0]))[1])
    prods: list[list[float]] = [[] for _ in range(b)]
    prod = [1.0] * b
    spent = 0.0
    for j in range(1, k + 1):
        for i in range(b):
            prod[i] *= float(conf[i, j - 1])
            prods[i].append(prod[i])
        cold()
        t0 = time.perf_counter()
        more = pol.engine_batch_more(j, prods, lams, k)
        keep = None if more else keep_now(prods, lams)
        spent += time.perf_counter() - t0
        if not more:
            return spent * 1e6, j, keep
    raise AssertionError("the batch rule never stops at K_max")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="git revision whose rules.py is the reference")
    ap.add_argument("--policy", type=Path, default=ROOT / "data" / "control" / "policy.json",
                    help="policy JSON (default: the bundled data/control/policy.json)")
    ap.add_argument("--name", default="delta-fixed", help="policy name (a Delta rule deciding for the batch)")
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8], help="batch sizes")
    ap.add_argument("--rounds", type=int, default=600, help="rounds per batch size")
    ap.add_argument("--evict-mb", type=float, default=8.0, help="array read before every call (MiB)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    from speclimits.control.rules import PolicyFit

    evict = np.ones(int(args.evict_mb * 2**20 / 8))

    def cold() -> float:
        return float(evict[::16].sum())  # one read per cache line

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        earlier = load_rules_at(args.against, Path(tmp))
        for b in args.batch:
            old = earlier.PolicyFit.read(args.policy).make(args.name)
            new = PolicyFit.read(args.policy).make(args.name)
            if not getattr(new, "shared", False):
                raise SystemExit(f"{args.name}: not a rule that decides for the batch")
            rng = np.random.default_rng(args.seed)
            us = np.empty((args.rounds, 2))
            for r in range(args.rounds):
                conf = rng.beta(6.0, 1.2, size=(b, new.k_max))
                lams = (new.lambda0 * rng.uniform(0.8, 1.25, size=b)).tolist()
                out = {}
                for which in ((0, 1) if r % 2 else (1, 0)):
                    out[which] = one_round(old if which == 0 else new, conf, lams, new.k_max, cold)
                if out[0][1:] != out[1][1:]:
                    raise SystemExit(f"batch {b}, round {r}: the decisions differ: earlier {out[0][1:]}, now {out[1][1:]}")
                us[r] = out[0][0], out[1][0]
            lr = np.log(us[:, 1] / us[:, 0])
            boot = np.random.default_rng(0).integers(0, len(lr), size=(2000, len(lr)))
            lo, hi = np.exp(np.percentile(lr[boot].mean(axis=1), [2.5, 97.5]))
            print(f"batch {b}: {args.rounds} rounds, same decisions; µs per round (median) {args.against} "
                  f"{np.median(us[:, 0]):.1f}, now {np.median(us[:, 1]):.1f}; now / {args.against} "
                  f"{np.exp(lr.mean()):.3f} [{lo:.3f}; {hi:.3f}]")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
