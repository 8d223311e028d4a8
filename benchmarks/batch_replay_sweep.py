"""What the Delta rules can reach at batch > 1, piece by piece: the batch replay over λ, with and without hindsight.

Reads a ``speclimits control bench`` result (``data/control/bench-batch4.json``, ...), prices the fit
with the costs profiled in that run, and replays the held-out greedy references, the run's batches
of them, through the engine's round driver (:func:`speclimits.control.offline.batch_replay`): every
static K, and the Delta rules with λ scaled by each factor of ``--scales``, one piece of a step's
real shape at a time: each request priced alone (``:alone``); one decision for the batch, the drafter
running until the last request stops and each request keeping its best prefix (the default); and that
decision allowed to keep no draft of a request (``:zero-k``, k = 0: one row verified). Offline and
deterministic (no engine, no timing)::

    .venv/bin/python benchmarks/batch_replay_sweep.py data/control/bench-batch4.json data/control/bench-batch8.json

``--hindsight`` replays the same rules a second time with the draft's confidences replaced by the truth
(1 for a drafted token that matches the greedy reference, 0 after the first miss; raw, uncalibrated): what
each piece of the step's price could capture if the rule knew which tokens will match, as the exact Oracle
does. A profile measured before the controller profiled passes of one row per request (runs older than
the ``zero-k`` rule) has no m = 1 pass; it is then estimated from the same run's plain-decoding arm (its
median ms per token times the batch, less the profile's time outside the pass) with ``--estimate-m1``, and
the table says so.

Prints one table per file: predicted ms/token, mean k, wasted draft steps per request per round,
and the speed ratio to the best static K of the replay; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from speclimits.bench.control import block_prompts
from speclimits.control.decompose import bench_references
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import batch_replay, select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import PolicyFit

ROOT = Path(__file__).resolve().parents[1]
RULES = ("delta-fixed", "delta", "delta-fixed:alone", "delta:alone", "delta-fixed:zero-k", "delta:zero-k")


def profile_of(res: dict, estimate_m1: bool = False) -> tuple[EngineProfile, str]:
    """The run's profile, with an m = 1 pass estimated from its plain-decoding arm where it has none and
    ``estimate_m1``; and where the m = 1 pass came from."""
    d = dict(res["profile"])
    if "1" in d["verify_ms"]:
        return EngineProfile.from_dict(d), "profiled"
    if not estimate_m1:
        return EngineProfile.from_dict(d), "none (k = 0 priced as k = 1)"
    plain = [b["ms_per_token"] for b in res["blocks"] if b["arm"] == "plain"]
    if not plain:
        return EngineProfile.from_dict(d), "none (priced as m = 2)"
    one = float(np.median(plain)) * int(d["batch"]) - float(d["other_ms"])
    for key in ("verify_ms", "verify_raw_ms"):
        d[key] = {"1": one, **d[key]}
    return EngineProfile.from_dict(d), "estimated from the plain-decoding arm"


def hindsight(raw):
    """``raw`` with the draft's confidences replaced by the truth: 1 for the tokens before the first miss."""
    j = np.arange(raw.draft_conf.shape[1])[None, :]
    return replace(raw, draft_conf=(j < raw.accept_len[:, None]).astype(raw.draft_conf.dtype))


def sweep(path: Path, scales: list[float], with_hindsight: bool = False, estimate_m1: bool = False,
          trace: Path | None = None) -> pd.DataFrame:
    res = json.loads(path.read_text())
    fit = PolicyFit.from_dict({**res["policy_fit"], "curves": {}}, origin=str(path))
    prof, m1 = profile_of(res, estimate_m1)
    model = prof.cost_model(fit.cost_model, fit.u_bar_mean, fit.k_max)
    priced = replace(fit, cost_model=model, lambda_=fit.engine_lambda(model))
    trace = Path(trace or res["config"].get("trace") or fit.data["trace"])
    if not trace.exists():  # recorded on another checkout: the bundled trace of that name
        trace = ROOT / "data" / "traces" / trace.name
    setup = greedy_setup(trace, fit.cost_model)
    ids = res["prompt_ids"]
    # a prompt whose plain decoding left the trace's reference is not replayed; a run on prompts outside its
    # policy's trace checked none (``--trace``: their references are taken whole, as control decompose does)
    same = bench_references(res)
    raw, _ = select(setup, same, n_states=int(res["config"]["max_tokens"]) - 1)
    index = {str(s): i for i, s in enumerate(raw.seq_ids)}
    groups = [[ids[i] for i in block_prompts(ids, prof.batch, b)] for b in range(int(res["config"]["blocks"]))]
    groups = [[index[x] for x in g] for g in groups if all(x in index for x in g)]
    rows = []
    static = batch_replay(priced, raw, groups, [f"static:{k}" for k in range(1, fit.k_max + 1)], prof)
    for name, r in static.items():
        rows.append({"arm": name, "confidence": "draft", "lambda_scale": None, **r})
    worlds = [("draft", raw, RULES)]
    if with_hindsight:  # raw confidences: a calibration map would blur the truth
        worlds.append(("hindsight", hindsight(raw), [f"{r}:raw-confidence" for r in RULES]))
    for conf, inputs, rules in worlds:
        for s in scales:
            got = batch_replay(replace(priced, lambda_=priced.lambda_ * s), inputs, groups, list(rules), prof)
            rows.extend({"arm": name.replace(":raw-confidence", ""), "confidence": conf, "lambda_scale": s, **r}
                        for name, r in got.items())
    out = pd.DataFrame(rows)
    best = out[out["lambda_scale"].isna()]["ms_per_token"].min()
    out["vs_best_static"] = best / out["ms_per_token"]
    out.attrs.update(batch=prof.batch, m1_pass=m1, m1_pass_ms=prof.pass_ms.get(1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench result JSON files (batch > 1)")
    ap.add_argument("--scales", default="0.5,0.7,1.0,1.4", help="factors on λ (default: 0.5,0.7,1.0,1.4)")
    ap.add_argument("--hindsight", action="store_true",
                    help="also replay the rules knowing which drafted tokens match (the truth for the confidences)")
    ap.add_argument("--estimate-m1", action="store_true",
                    help="a run profiled without passes of one row per request: estimate that pass from the run's "
                         "plain-decoding arm (the replay then prices a batch's tail differently from the run's own "
                         "prediction)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="the trace holding the runs' prompts (default: the one each run's policy was fitted on); "
                         "for runs on prompts no policy saw, a trace of those prompts (data/control/twin/fresh/trace)")
    ap.add_argument("--json", type=Path, default=None, help="write every table here (one entry per file)")
    args = ap.parse_args(argv)
    scales = [float(x) for x in args.scales.split(",") if x]
    out = {}
    for path in args.results:
        table = sweep(path, scales, args.hindsight, args.estimate_m1, args.trace)
        m1_ms = table.attrs["m1_pass_ms"]
        m1 = table.attrs["m1_pass"] + ("" if m1_ms is None else f", {m1_ms:.1f} ms")
        print(f"{path} (batch {table.attrs['batch']}; batch replay, priced with the costs profiled in that run; "
              f"the pass of one row per request: {m1}):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        rows = table.astype(object).where(table.notna(), None).to_dict(orient="records")  # JSON null, not NaN
        out[str(path)] = {**table.attrs, "rows": rows}
    if args.json is not None:
        given = sys.argv[1:] if argv is None else argv
        args.json.write_text(json.dumps({"produced_by": "benchmarks/batch_replay_sweep.py " + " ".join(map(str, given)),
                                         "results": out}, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
