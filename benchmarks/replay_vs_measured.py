"""How far the offline replay's price of each stock K is from its measurement, with and without the prefill.

A ``speclimits control bench`` result predicts each arm by replaying the greedy references through the round
driver, each step priced with the costs profiled in that run (:func:`speclimits.control.offline.batch_replay`):
decoding steps only. Its measured time per token also holds the prompts' prefill. This replays every stock K of
the run on its own blocks and sets the measured pooled ms/token beside the replay, and beside the replay plus each
block's prefill as the trace timed it (the first round of the trace's plain-decoding generation of each prompt,
batch 1)::

    .venv/bin/python benchmarks/replay_vs_measured.py data/control/twin/fresh/amd-epyc-c/b8-all/bench-batch8.json \\
        --trace data/control/twin/fresh/trace

Offline and deterministic (no engine, no timing).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from speclimits.control.decompose import bench_blocks, bench_references
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import batch_replay, select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import PolicyFit
from speclimits.trace import read_trace


def prefill_ms(trace: Path) -> pd.Series:
    """Per prompt id, the trace's prefill: the target's time in round 0 of its plain-decoding (K = 0) generation."""
    rounds = pd.concat([pd.read_parquet(f, columns=["prompt_id", "K", "round", "t_target_ms"])
                        for f in sorted(glob.glob(str(Path(trace) / "rounds.parquet" / "*.parquet")))])
    first = rounds[(rounds["K"] == 0) & (rounds["round"] == 0)]
    if first.empty:
        raise SystemExit(f"{trace}: no plain-decoding (K = 0) prefill rounds to price the prefill with")
    return first.groupby("prompt_id")["t_target_ms"].mean()


def compare(path: Path, trace: Path | None = None) -> pd.DataFrame:
    res = json.loads(path.read_text())
    fit = PolicyFit.from_dict({**res["policy_fit"], "curves": {}}, origin=str(path))
    prof = EngineProfile.from_dict(res["profile"])
    trace = Path(trace or res["config"]["trace"])
    setup = greedy_setup(read_trace(trace), fit.cost_model)
    ids = bench_references(res)
    raw, _ = select(setup, ids, n_states=int(res["config"]["max_tokens"]) - 1)
    groups, names = bench_blocks(res, raw.seq_ids)
    pre = prefill_ms(trace)
    tokens = float(sum(raw.n_tokens[g].sum() for g in groups))
    prefill = float(sum(pre.reindex(g).sum() for g in names)) / tokens
    measured = {r["arm"]: r.get("ms_per_token_pooled", r["ms_per_token"]) for r in res["summary"]}
    ks = sorted(int(a.split(":")[1]) for a in measured if a.startswith("stock:"))
    rep = batch_replay(prof.priced(fit), raw, groups, [f"static:{k}" for k in ks], prof)
    rows = []
    for k in ks:
        r, m = rep[f"static:{k}"]["ms_per_token"], float(measured[f"stock:{k}"])
        rows.append({"arm": f"stock:{k}", "measured": m, "replay": r, "replay_error": r / m - 1,
                     "replay_plus_prefill": r + prefill, "with_prefill_error": (r + prefill) / m - 1})
    out = pd.DataFrame(rows)
    out.attrs.update(batch=prof.batch, blocks=len(groups), prefill_ms_per_token=prefill,
                     prefill_ms_per_prompt=float(pre.reindex(sum(names, [])).mean()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench result JSON files")
    ap.add_argument("--trace", type=Path, default=None,
                    help="trace holding the runs' prompts (default: each run's); for runs on prompts no policy saw, a "
                         "trace of them (data/control/twin/fresh/trace)")
    ap.add_argument("--json", type=Path, default=None, help="write every table here")
    args = ap.parse_args(argv)
    out = {}
    for path in args.results:
        t = compare(path, args.trace)
        print(f"{path} (batch {t.attrs['batch']}, {t.attrs['blocks']} blocks; prefill {t.attrs['prefill_ms_per_prompt']:.1f} "
              f"ms per prompt, {t.attrs['prefill_ms_per_token']:.3f} ms per output token): ms/token")
        print(t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        out[str(path)] = {**t.attrs, "rows": t.to_dict(orient="records")}
    if args.json:
        args.json.write_text(json.dumps({"produced_by": " ".join(["benchmarks/replay_vs_measured.py", *sys.argv[1:]]),
                                         "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
