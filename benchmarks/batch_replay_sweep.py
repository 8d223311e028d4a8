"""Why the Delta rules do not beat the best static K at batch > 1: the batch replay over λ.

Reads a ``speclimits control bench`` result (``data/control/bench-batch4.json``, ...), prices the fit
with the costs profiled in that run, and replays the held-out greedy references, the run's batches
of them, through the engine's round driver (:func:`speclimits.control.offline.batch_replay`): every
static K, and the Delta rules (one decision per batch, and each request alone) with λ scaled by each
factor of ``--scales``. Offline and deterministic (no engine, no timing: it runs in a second)::

    .venv/bin/python benchmarks/batch_replay_sweep.py data/control/bench-batch4.json data/control/bench-batch8.json

Prints one table per file: predicted ms/token, mean k, wasted draft steps per request per round,
and the speed ratio to the best static K of the replay.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd

from speclimits.control.bench import block_prompts
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import batch_replay, select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import PolicyFit

ROOT = Path(__file__).resolve().parents[1]
RULES = ("delta-fixed", "delta", "delta-fixed:alone", "delta:alone")


def sweep(path: Path, scales: list[float]) -> pd.DataFrame:
    res = json.loads(path.read_text())
    fit = PolicyFit.from_dict({**res["policy_fit"], "curves": {}}, origin=str(path))
    prof = EngineProfile.from_dict(res["profile"])
    model = prof.cost_model(fit.cost_model, fit.u_bar_mean, fit.k_max)
    priced = replace(fit, cost_model=model, lambda_=fit.engine_lambda(model))
    trace = Path(res["config"].get("trace") or fit.data["trace"])
    if not trace.exists():  # recorded on another checkout: the bundled trace of that name
        trace = ROOT / "data" / "traces" / trace.name
    setup = greedy_setup(trace, fit.cost_model)
    ids, parted = res["prompt_ids"], res["reference_parts_at"]
    same = [i for i in ids if parted.get(i, 0) is None]
    raw, _ = select(setup, same, n_states=int(res["config"]["max_tokens"]) - 1)
    index = {str(s): i for i, s in enumerate(raw.seq_ids)}
    groups = [[ids[i] for i in block_prompts(ids, prof.batch, b)] for b in range(int(res["config"]["blocks"]))]
    groups = [[index[x] for x in g] for g in groups if all(x in index for x in g)]
    rows = []
    static = batch_replay(priced, raw, groups, [f"static:{k}" for k in range(1, fit.k_max + 1)], prof)
    for name, r in static.items():
        rows.append({"arm": name, "lambda_scale": None, **r})
    for s in scales:
        got = batch_replay(replace(priced, lambda_=priced.lambda_ * s), raw, groups, list(RULES), prof)
        rows.extend({"arm": name, "lambda_scale": s, **r} for name, r in got.items())
    out = pd.DataFrame(rows)
    best = out[out["lambda_scale"].isna()]["ms_per_token"].min()
    out["vs_best_static"] = best / out["ms_per_token"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench result JSON files (batch > 1)")
    ap.add_argument("--scales", default="0.5,0.7,1.0,1.4", help="factors on λ (default: 0.5,0.7,1.0,1.4)")
    args = ap.parse_args(argv)
    scales = [float(x) for x in args.scales.split(",") if x]
    for path in args.results:
        table = sweep(path, scales)
        print(f"{path} (batch replay, priced with the costs profiled in that run):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
