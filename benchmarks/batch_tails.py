"""Which static K is best per round, and which over a whole batch? The batch's tail, replayed.

A benchmark block at batch b runs b requests of the same length to the end; the block's time is the time of its
last request. While every request is live, a round's cost is shared by b; once the fast ones are done, the slow
ones run in rounds that cost almost as much and emit far fewer tokens. A rule that decides round by round (every
rule of :mod:`speclimits.control.rules`), or any estimate of a K's throughput from the rounds it played, sees the
first kind of round; the block's time per token is set by both.

For each benchmark run given, its blocks (the prompts each block ran) are replayed at every static K on the
greedy references of ``--trace`` (a trace of the run's prompts), each step priced as the run profiled it
(:meth:`~speclimits.control.profile.EngineProfile.step_ms`; no prefill, no engine): per K the time per token over
the rounds in which every request of the block was live (*full-batch rounds*), over whole blocks, and the share of
the blocks' time spent after the first request finished (*tail*). Speeds are over the best K of each column.
Offline and deterministic::

    .venv/bin/python benchmarks/batch_tails.py data/control/twin/fresh/amd-epyc-c/b8-all/bench-batch8.json \\
        --trace data/control/twin/fresh/trace --json data/control/twin/fresh/amd-epyc-c/decomposition/batch-tails.json

``--measured TRACE`` also reads a batch trace (``speclimits trace --batch B``, its ``steps.parquet``): the same
split from the engine's own timed steps (target and drafter time of each step; tokens from ``rounds.parquet``),
per K of the trace.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.control.decompose import bench_blocks, bench_references
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import OracleInputs


def replay_static(raw: OracleInputs, groups: list[list[int]], prof: EngineProfile, k: int) -> dict[str, float]:
    """Static ``k`` on each group (one block, run to its last token): ms and tokens in full-batch rounds, in all
    rounds, and the ms after the group's first request finished."""
    full_ms = full_tok = all_ms = all_tok = tail_ms = 0.0
    for g in groups:
        seq = np.asarray(g)
        n = raw.n_tokens[seq].astype(np.int64)
        pos = np.zeros(len(g), dtype=np.int64)
        while (pos < n).any():
            live = np.flatnonzero(pos < n)
            rows = raw.offsets[seq[live]] + pos[live]
            emitted = np.minimum(np.minimum(k, raw.accept_len[rows]) + 1, n[live] - pos[live])
            step = prof.step_ms(float(len(live) * (k + 1)), k)
            all_ms += step
            all_tok += float(emitted.sum())
            if len(live) == len(g):
                full_ms += step
                full_tok += float(emitted.sum())
            else:
                tail_ms += step
            pos[live] += emitted
    return {"full_batch_ms_per_token": full_ms / full_tok, "block_ms_per_token": all_ms / all_tok,
            "tail_share": tail_ms / all_ms}


def run_tails(bench_path: Path, trace: Path) -> pd.DataFrame:
    """Per static K of the run's policy (1..K_max): the three figures and the speeds over each column's best."""
    bench = json.loads(Path(bench_path).read_text())
    fit = PolicyFit.from_dict(bench["policy_fit"], origin=str(bench_path))
    prof = EngineProfile.from_dict(bench["profile"])
    setup = greedy_setup(trace, fit.cost_model)
    raw, _ = select(setup, bench_references(bench), int(bench["config"]["max_tokens"]) - 1)
    groups = bench_blocks(bench, raw.seq_ids)[0]
    rows = [{"K": k, **replay_static(raw, groups, prof, k)} for k in range(1, fit.k_max + 1)]
    t = pd.DataFrame(rows)
    for col, speed in (("full_batch_ms_per_token", "speed_full_batch"), ("block_ms_per_token", "speed_block")):
        t[speed] = t[col].min() / t[col]
    t.attrs = {"batch": prof.batch, "blocks": len(groups)}
    return t


def measured_tails(trace: Path) -> pd.DataFrame:
    """Per K of a batch trace: time per token (target + drafter time of each decoding step over the tokens the step
    emitted) in steps with every request of the batch decoding and in all decoding steps, and the share of the
    decoding time in steps with fewer; the batches and steps counted."""
    from speclimits.trace import read_trace

    tr = read_trace(trace)
    if tr.steps is None:
        raise SpeclimitsError(f"{trace}: no steps.parquet (a batch trace is made with speclimits trace --batch B)")
    emitted = tr.rounds.groupby(["batch_id", "step"])["n_emitted"].sum().rename("emitted").reset_index()
    st = tr.steps.merge(emitted, on=["batch_id", "step"], how="left").fillna({"emitted": 0})
    st = st[st["phase"] != "prefill"].assign(t=lambda d: d["t_target_ms"] + d["t_draft_ms"])
    rows = []
    for (b, k), g in st.groupby(["b", "K"]):
        full = g[g["n_decode"] == b]
        rows.append({"b": int(b), "K": int(k), "batches": int(g["batch_id"].nunique()),
                     "full_batch_steps": len(full), "tail_steps": int(len(g) - len(full)),
                     "full_batch_ms_per_token": full["t"].sum() / full["emitted"].sum(),
                     "block_ms_per_token": g["t"].sum() / g["emitted"].sum(),
                     "tail_share": 1.0 - full["t"].sum() / g["t"].sum()})
    out = pd.DataFrame(rows)
    out.attrs["simulated"] = bool(tr.meta.get("simulated", tr.meta.get("source") == "simulator"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", type=Path, nargs="*", help="benchmark results (batch > 1)")
    ap.add_argument("--trace", type=Path, help="a trace of the runs' prompts (their greedy references)")
    ap.add_argument("--measured", type=Path, help="a batch trace of the same prompts: the split from its timed steps")
    ap.add_argument("--json", type=Path, help="write the tables here")
    args = ap.parse_args(argv)
    if args.bench and args.trace is None:
        ap.error("replaying benchmark runs needs --trace (a trace of their prompts)")
    if not args.bench and args.measured is None:
        ap.error("give benchmark runs (with --trace) or --measured TRACE")
    out: dict[str, Any] = {"produced_by": "benchmarks/batch_tails.py " + " ".join(argv if argv is not None
                                                                                   else sys.argv[1:]), "runs": {}}
    for b in args.bench:
        try:
            t = run_tails(b, args.trace)
        except (SpeclimitsError, KeyError) as exc:
            print(f"batch_tails: {b}: {exc}", file=sys.stderr)
            return 2
        print(f"{b} (batch {t.attrs['batch']}, {t.attrs['blocks']} blocks): per static K")
        print(t.round(3).to_string(index=False))
        out["runs"][str(b)] = {**t.attrs, "rows": t.to_dict(orient="records")}
    if args.measured is not None:
        try:
            m = measured_tails(args.measured)
        except (SpeclimitsError, OSError) as exc:
            print(f"batch_tails: {exc}", file=sys.stderr)
            return 2
        sim = m.attrs["simulated"]
        print(f"{args.measured} ({'SIMULATED: the simulator' if sim else 'measured: the engine'}'s timed steps)")
        print(m.round(3).to_string(index=False))
        out["measured"] = {"trace": str(args.measured), "simulated": sim, "rows": m.to_dict(orient="records")}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
