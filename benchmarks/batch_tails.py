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

``--plan`` replays a rule that plans for the tail (:func:`tail_weights`): the Delta rule with each request's λ
scaled by ``s · (R / R_max)^γ``, R a request's rounds still to go (its tokens left over its tokens per round so
far, with a prior of 2 rounds at 2 tokens) and R_max the batch's largest, so the request that will end the block
is priced at ``s·λ`` and the ones ahead of it draft less. Everything it reads the engine knows when it decides
(a request's max_tokens, its output so far). Per rule: unweighted; (γ, s) chosen on the policy's train
references (groups of b, three seeded shuffles, the run's profile) and run on the run's blocks; and the best
(γ, s) of the grid on the run's blocks (hindsight: the planner's bound). ``true``: the rule fed the true match
probabilities (the decomposition's third rung), the bound of this planner with perfect per-position information.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from speclimits.control.decompose import bench_blocks, bench_references, true_probabilities
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import batch_replay, select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import OracleInputs
from speclimits.paths import REPO_ROOT


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


#: the planner's grid: γ, how steeply a request's value falls with its lead; s, the factor on the last request's λ
PLAN_GAMMAS = (1.0, 2.0, 3.0)
PLAN_SCALES = (0.8, 1.0, 1.3, 1.7, 2.2)
#: the rules replayed with it (the engine's Delta rules); "true" is delta-fixed fed the true match probabilities
PLAN_RULES = ("delta", "delta-fixed", "delta:acceptance", "delta-fixed:acceptance", "true")
PRIOR_ROUNDS, PRIOR_RATE = 2.0, 2.0


def tail_weights(gamma: float, scale: float) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """``weigh(left, done, rounds)`` for :func:`~speclimits.control.offline.batch_replay`: per live request
    ``scale · (R / max R)^gamma``, ``R = left / rate`` its rounds to go, ``rate`` its tokens per round so far
    (prior: :data:`PRIOR_ROUNDS` rounds at :data:`PRIOR_RATE` tokens)."""
    def weigh(left: np.ndarray, done: np.ndarray, rounds: np.ndarray) -> np.ndarray:
        to_go = left / ((done + PRIOR_ROUNDS * PRIOR_RATE) / (rounds + PRIOR_ROUNDS))
        return scale * (to_go / to_go.max()) ** gamma
    return weigh


def _ms(priced: PolicyFit, raw: OracleInputs, truth: OracleInputs, groups: list[list[int]], prof: EngineProfile,
        rule: str, grid: list[tuple[float, float]]) -> np.ndarray:
    """The rule's ms per token at each (γ, s) of ``grid`` (None: unweighted)."""
    name, inputs = ("delta-fixed:raw-confidence", truth) if rule == "true" else (rule, raw)
    return np.array([batch_replay(priced, inputs, groups, [name], prof, None if g is None else tail_weights(g, sc))
                     [name]["ms_per_token"] for g, sc in grid])


def plan_study(bench_path: Path, trace: Path, seed: int = 0, rules: tuple[str, ...] = PLAN_RULES) -> pd.DataFrame:
    """Per rule of ``rules``: its speed over the best static K on the run's blocks unweighted, with the
    (γ, s) chosen on the train references, and with the best (γ, s) on the blocks (hindsight)."""
    bench = json.loads(Path(bench_path).read_text())
    fit = PolicyFit.from_dict(bench["policy_fit"], origin=str(bench_path))
    prof = EngineProfile.from_dict(bench["profile"])
    priced = prof.priced(fit)
    n_states = int(bench["config"]["max_tokens"]) - 1
    raw, sur = select(greedy_setup(trace, fit.cost_model), bench_references(bench), n_states)
    groups = bench_blocks(bench, raw.seq_ids)[0]
    policy_trace = Path(bench["config"]["trace"])  # the trace the policy was fitted on (its train references)
    if not policy_trace.is_absolute() and not policy_trace.exists():
        policy_trace = REPO_ROOT / policy_trace
    train_raw, train_sur = select(greedy_setup(policy_trace, fit.cost_model),
                                  [str(s) for s in fit.train_seq_ids], n_states)
    rng, b, train_groups = np.random.default_rng(seed), prof.batch, []
    for _ in range(3):
        perm = rng.permutation(train_raw.n_sequences).tolist()
        train_groups += [perm[i:i + b] for i in range(0, len(perm) - b + 1, b)]
    grid = [(None, None)] + [(g, sc) for g in PLAN_GAMMAS for sc in PLAN_SCALES]
    rows = []
    train_truth, truth = true_probabilities(train_raw, train_sur), true_probabilities(raw, sur)
    static = batch_replay(priced, raw, groups, [f"static:{k}" for k in range(1, priced.k_max + 1)], prof)
    best = min(r["ms_per_token"] for r in static.values())  # the best static K's ms per token on the blocks
    for rule in rules:
        tr_ms = _ms(priced, train_raw, train_truth, train_groups, prof, rule, grid)
        ms = _ms(priced, raw, truth, groups, prof, rule, grid)
        pick, hind = 1 + int(np.argmin(tr_ms[1:])), 1 + int(np.argmin(ms[1:]))
        rows.append({"rule": rule, "unweighted": best / ms[0], "train_gamma": grid[pick][0],
                     "train_scale": grid[pick][1], "train_chosen": best / ms[pick], "hindsight_gamma": grid[hind][0],
                     "hindsight_scale": grid[hind][1], "hindsight": best / ms[hind],
                     "train_gain": float(tr_ms[0] / tr_ms[pick])})
    t = pd.DataFrame(rows)
    t.attrs = {"batch": b, "blocks": len(groups), "train_references": train_raw.n_sequences,
               "train_groups": len(train_groups), "cpu": bench.get("engine", {}).get("cpu", {})}
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
    ap.add_argument("--plan", action="store_true",
                    help="also replay the Delta rules with the tail planner's weights (minutes per run)")
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
            p = plan_study(b, args.trace) if args.plan else None
        except (SpeclimitsError, KeyError, OSError) as exc:
            print(f"batch_tails: {b}: {exc}", file=sys.stderr)
            return 2
        print(f"{b} (batch {t.attrs['batch']}, {t.attrs['blocks']} blocks): per static K")
        print(t.round(3).to_string(index=False))
        out["runs"][str(b)] = {**t.attrs, "rows": t.to_dict(orient="records")}
        if p is not None:
            print(f"  a rule that plans for the tail (γ, s chosen on {p.attrs['train_references']} train references "
                  f"in {p.attrs['train_groups']} groups, or in hindsight on the blocks); speed over the best static K")
            print(p.round(3).to_string(index=False))
            out.setdefault("plan", {})[str(b)] = {**p.attrs, "rows": p.to_dict(orient="records")}
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
