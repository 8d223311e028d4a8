"""Batch traces (``speclimits trace --batch``): plans, step rows and the validator without vLLM; then (``vllm``)
one batch sweep of the tiny MoE (K 0 and 3, b 1 and 2, the target as its own draft) against batch 1, vLLM's
counters, an interrupted and resumed run and (``ray``) the same sweep on Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclimits.errors import SpeclimitsError
from speclimits.paths import DATA_DIR
from speclimits.trace import find_problems, new_meta, read_generations, read_parts_log, read_trace, validate_trace
from speclimits.trace import write_table, write_trace
from speclimits.tracing.capture import unique_per_layer
from speclimits.tracing.prompts import Prompt
from speclimits.tracing.records import generation_columns, step_columns, steps_by_request
from speclimits.tracing.sweep import SweepConfig, SweepPlan
from test_validate import assert_defect_named

PROMPTS = DATA_DIR / "prompts" / "smoke.jsonl"

# -- plans, ids, step rows (no vLLM) --


def _plan(tmp_path, n_prompts=5, k_values=(0, 2), batch_sizes=(1, 2), done=()):
    prompts = [Prompt(f"p{i}", token_ids=(1, 2, 3)) for i in range(n_prompts)]
    cfg = SweepConfig(target="t", prompts="-", out=str(tmp_path / "tr"), k_values=list(k_values),
                      batch_sizes=list(batch_sizes))
    plan = SweepPlan(cfg, prompts, tmp_path / "tr", {"max_tokens": 128}, list(k_values), None, [], list(batch_sizes))
    plan.todo = [(ki, K, pi, bi) for bi in range(len(batch_sizes)) for ki, K in enumerate(k_values)
                 for pi in range(n_prompts) if plan.gid(ki, pi, bi) not in set(done)]
    return plan


def test_batches_ids_and_jobs(tmp_path):
    from speclimits.tracing.ray_sweep import plan_jobs

    plan = _plan(tmp_path)
    assert plan.batch_sweep and plan.n_total == 2 * 2 * 5
    # gid = (b_index * n_K + k_index) * n_prompts + prompt_index
    assert plan.gid(1, 3, 0) == 8 and plan.gid(0, 0, 1) == 10 and plan.gid(1, 4, 1) == 19
    batches = plan.batches()
    # run order: K, then b, then file order; b = 2 groups prompts (0,1), (2,3), (4) (the last smaller)
    assert [(bt.K, bt.b, bt.prompts) for bt in batches[:8]] == [
        (0, 1, (0,)), (0, 1, (1,)), (0, 1, (2,)), (0, 1, (3,)), (0, 1, (4,)), (0, 2, (0, 1)), (0, 2, (2, 3)),
        (0, 2, (4,))]
    assert [bt.batch_id for bt in batches if bt.b == 2] == [10, 12, 14, 15, 17, 19]
    assert sorted(g for bt in batches for g in bt.gids) == list(range(20))
    # jobs hold whole batches of one (b, K): shard size 3 -> 3 batches of 1, or 1 batch of 2
    jobs = plan_jobs(plan, 3)
    for job in jobs:
        assert [bt.b for bt in job.batches()] == [job.b] * len(job.sizes)
        assert all(bt.gids[0] == bt.batch_id for bt in job.batches())
    two = [j for j in jobs if j.b == 2]
    assert [j.sizes for j in two] == [(2,), (2,), (1,)] * 2 and two[0].name.startswith("part-b002-k000-g000010-")
    assert sorted(g for j in jobs for g in j.gids) == list(range(20))
    # a batch partly on disk cannot come from the sweep: refused, not run again in part
    plan = _plan(tmp_path, done=(10,))
    with pytest.raises(SpeclimitsError, match="batch 10 .b=2, K=0. has 1 of its 2 generations on disk"):
        plan.batches()
    assert len(_plan(tmp_path, done=(10, 11)).batches()) == 15
    # a batch-1 plan keeps the batch-1 ids, jobs and names
    cfg1 = SweepConfig(target="t", prompts="-", out=str(tmp_path / "tr"), k_values=[0, 2])
    p1 = SweepPlan(cfg1, plan.prompts, tmp_path / "tr", {}, [0, 2], None, [(ki, K, pi) for ki, K in enumerate([0, 2])
                                                                          for pi in range(5)])
    assert not p1.batch_sweep and [bt.gids for bt in p1.batches()] == [(g,) for g in range(10)]
    assert all(j.name.startswith("part-k") and j.sizes == () for j in plan_jobs(p1, 2))
    assert "batch_sizes" not in cfg1.settings("x") and plan.cfg.settings("x")["batch_sizes"] == [1, 2]


def _records(rng, n_req=2, K=2, n_layers=2, n_experts=8, top_k=2, prompt_lens=(5, 4), max_tokens=6):
    """Step records of one batch as the worker extension drains them (routing rows with distinct experts)."""
    def rows(m):
        return np.stack([[rng.choice(n_experts, top_k, replace=False) for _ in range(n_layers)]
                         for _ in range(m)]).astype(np.int16)

    state = [{"out": 0, "ctx": 0} for _ in range(n_req)]
    records, step = [], 100
    while any(s["out"] < max_tokens for s in state):
        step += 1
        reqs, offset, routing = [], 0, []
        for i, s in enumerate(state):
            if s["out"] >= max_tokens:
                continue
            prefill = s["out"] == 0
            m = prompt_lens[i] if prefill else K + 1
            n_s = 1 if prefill else int(rng.integers(1, K + 2))
            r_rows = rows(m)
            routing.append(r_rows)
            r = dict(req_id=f"{i}-abcdefgh", n_sched=m, n_spec=0 if prefill else K, context_len=s["ctx"],
                     n_prompt=prompt_lens[i], n_out_before=s["out"], row_offset=offset, n_sampled=n_s,
                     sampled=[int(t) for t in rng.integers(2, 500, size=n_s)], n_drafted=K)
            if prefill:
                r.update(u_layers=unique_per_layer(r_rows, n_experts), routing=r_rows[-2:], routing_from=m - 2)
            else:
                r.update(routing=r_rows, routing_from=0)
            reqs.append(r)
            offset += m
            s["ctx"] += m if prefill else n_s
            s["out"] += n_s
        all_rows = np.concatenate(routing)
        records.append(dict(step=step, t_target_ms=2.0, t_draft_ms=1.0, graph_bucket=offset, num_tokens=offset,
                            kv_usage=0.1, u_layers_step=unique_per_layer(all_rows, n_experts), reqs=reqs))
    return records


def test_step_columns_count_every_row_of_the_step():
    rng = np.random.default_rng(3)
    records = _records(rng)
    steps = step_columns(records, batch_id=7, b=2, K=2, top_k=2)
    assert list(steps) == ["batch_id", "b", "K", "step", "n_reqs", "n_decode", "n_tokens", "m_max", "u_bar", "e_max",
                           "context_total", "t_target_ms", "t_draft_ms", "graph_bucket", "kv_usage", "phase",
                           "n_drafted_next"]
    assert steps["phase"][0] == "prefill" and steps["n_tokens"][0] == 9 and steps["m_max"][0] == 5
    assert set(steps["phase"][1:]) <= {"decode"} and (steps["n_decode"][1:] == steps["n_reqs"][1:]).all()
    for i, rec in enumerate(records):
        rows = [r["routing"] if not r["n_out_before"] == 0 else None for r in rec["reqs"]]
        if all(x is not None for x in rows):  # decode steps keep every row: recount the union by hand
            union = np.concatenate(rows)
            per_layer = [len(set(union[:, la].ravel().tolist())) for la in range(2)]
            assert steps["u_bar"][i] == np.mean(per_layer) and steps["e_max"][i] == max(per_layer)
        assert steps["context_total"][i] == sum(r["context_len"] for r in rec["reqs"])
        assert steps["n_drafted_next"][i] == 2 * len(rec["reqs"])
    # at K = 0 the draft columns are zero, as in the rounds; without routing Ū is top_k
    k0 = step_columns([dict(records[1], u_layers_step=np.zeros(0))], batch_id=0, b=2, K=0, top_k=2)
    assert k0["t_draft_ms"][0] == 0 and k0["n_drafted_next"][0] == 0 and k0["u_bar"][0] == 2


# -- validation of a batch trace (synthetic, no vLLM) --


def _write_batch_trace(root: Path) -> Path:
    """Two batches of b = 2 at K = 2 (4 generations), from synthetic step records."""
    rng = np.random.default_rng(0)
    rounds, steps = [], []
    for batch_id in (0, 2):
        records = _records(rng)
        by_req = steps_by_request(records)
        for i, rid in enumerate(sorted(by_req)):
            out = [t for _, r in by_req[rid] for t in r["sampled"]][:6]
            cols, _, _ = generation_columns(by_req[rid], output_ids=out, generation_id=batch_id + i,
                                            prompt_id=f"p{batch_id + i}", K=2, top_k=2, with_tokens=False)
            df = pd.DataFrame(cols)
            df["b"], df["batch_id"] = 2, batch_id
            rounds.append(df)
        steps.append(pd.DataFrame(step_columns(records, batch_id=batch_id, b=2, K=2, top_k=2)))
    meta = new_meta(source="vllm", simulated=False, method="draft_model", hardware="test", dtype="float32",
                    k_values=[2], seed=0, batch_size=2, batch_sizes=[2],
                    models={"target": {"n_layers": 2, "n_experts": 8, "top_k": 2}})
    return write_trace(root, meta, rounds=pd.concat(rounds, ignore_index=True),
                       steps=pd.concat(steps, ignore_index=True))


@pytest.fixture()
def batch_trace(tmp_path):
    return _write_batch_trace(tmp_path / "batch")


def _set(col, value, row=3):
    """Set ``df.loc[row, col]`` to ``value`` (a callable: ``value(df)``, read before the change)."""
    def mutate(df):
        new = value(df) if callable(value) else value
        if isinstance(new, float) and not pd.api.types.is_float_dtype(df[col].dtype):
            df[col] = df[col].astype(float)
        df.loc[row, col] = new
        return df, row
    return mutate


def _phase_disagrees(df):
    row = int(np.flatnonzero((df["phase"] == "decode").to_numpy())[0])
    df.loc[row, "phase"] = "mixed"
    return df, row


STEP_DEFECTS = [
    (lambda df: (df.drop(columns=["n_reqs"]), None), "n_reqs", "required column is missing"),
    (lambda df: (df.assign(n_decode=df["n_decode"].astype(float)), None), "n_decode", "must hold integers"),
    (_set("n_reqs", 0), "n_reqs", "must be >= 1"),
    (_set("n_reqs", 3), "n_reqs", "must not exceed b"),
    (_set("n_decode", 5), "n_decode", "must lie in [0, n_reqs]"),
    (_set("n_tokens", 1), "n_tokens", "must be >= n_reqs"),
    (_set("u_bar", 9.0), "u_bar", "must be <= n_experts = 8"),
    (_set("u_bar", 1.5), "u_bar", "must be >= top_k = 2"),
    (_set("e_max", 2.0), "e_max", "must be >= u_bar"),
    (_set("phase", "warmup"), "phase", "must be 'prefill', 'decode' or 'mixed'"),
    (_phase_disagrees, "phase", "must agree with n_decode"),
    (_set("t_target_ms", -1.0), "t_target_ms", "timings must not be negative"),
    (_set("t_draft_ms", float("nan")), "t_draft_ms", "must not be NaN"),
    (_set("kv_usage", 1.5), "kv_usage", "must lie in [0, 1]"),
    (_set("b", 4), "b", "value not listed in meta.json 'batch_sizes' [2]"),
    (_set("step", lambda df: df.loc[3, "step"], row=4), "step", "duplicate (batch_id, step)"),
    (_set("n_tokens", lambda df: df.loc[3, "n_tokens"] + 1), "n_tokens",
     "must equal the sum of m over the step's rows in rounds.parquet"),
]


def test_synthetic_batch_trace_is_valid(batch_trace):
    validate_trace(batch_trace)
    tr = read_trace(batch_trace)
    assert tr.batch_sizes == [2] and len(tr.steps) > 4 and set(tr.steps["batch_id"]) == {0, 2}


@pytest.mark.parametrize("mutate, column, message", STEP_DEFECTS, ids=[d[2][:30] for d in STEP_DEFECTS])
def test_step_defects_are_named(batch_trace, mutate, column, message):
    assert_defect_named(batch_trace, "steps", mutate, column, message)


def test_rounds_and_steps_must_describe_the_same_steps(batch_trace):
    tr = read_trace(batch_trace)
    steps, rounds = tr.steps, tr.rounds
    # a step of the rounds without its steps row: the rounds' rows are named
    lost = steps.iloc[5]
    write_table(batch_trace, "steps", steps.drop(index=5))
    want = np.flatnonzero(((rounds["batch_id"] == lost["batch_id"]) & (rounds["step"] == lost["step"])).to_numpy())
    text = "\n".join(str(p) for p in find_problems(batch_trace))
    assert "rounds.parquet, column 'step': no row in steps.parquet for this (batch_id, step)" in text
    assert f"first at row {', '.join(str(r) for r in want)}" in text, text
    # a batch trace without its steps table; rounds without the batch columns beside a steps table
    (batch_trace / "steps.parquet").unlink()
    assert [str(p) for p in find_problems(batch_trace)] == [
        "steps.parquet: is missing (rounds.parquet has batch_id: a batch trace needs its steps table)"]
    write_table(batch_trace, "steps", steps)
    write_table(batch_trace, "rounds", rounds.drop(columns=["batch_id"]))
    assert "rounds.parquet, column 'batch_id': column is missing (the trace has steps.parquet: a batch trace)" in \
        [str(p) for p in find_problems(batch_trace)]
    # the rounds' own batch columns: one batch_id per generation, no larger than its generation id
    bad = rounds.copy()
    bad.loc[2, "batch_id"] = 5
    write_table(batch_trace, "rounds", bad)
    text = "\n".join(str(p) for p in find_problems(batch_trace))
    assert "rounds.parquet, column 'batch_id': must not exceed generation_id" in text and "first at row 2" in text
    assert "rounds.parquet, column 'batch_id': one generation must have a single batch_id" in text


# -- the real engine (vLLM CPU), tiny config-only MoE --

#: the batch sweep of the engine tests: K 0 and 3, batch sizes 1 and 2, 3 prompts, 12 tokens, the target
#: as its own draft (every draft accepted)
SWEEP = dict(method="draft_model", prompts=str(PROMPTS), k_values=[0, 3], batch_sizes=[1, 2], max_tokens=12,
             load_format="dummy", tokens="all", progress=False, limit=3)


def _cfg(tiny, out, **kw):
    return SweepConfig(target=str(tiny), draft=str(tiny), out=str(out), **{**SWEEP, **kw})


@pytest.fixture(scope="module")
def batch_sweep(tiny_moe, tmp_path_factory):
    from speclimits.tracing.sweep import run_sweep

    out = tmp_path_factory.mktemp("batch") / "trace"
    run_sweep(_cfg(tiny_moe, out))
    return out


def _rounds_by_gid(root: Path, cols=("round", "phase", "m", "n_draft", "n_accepted", "n_emitted", "context_len",
                                     "n_sampled", "u_bar", "e_max")) -> dict[int, list]:
    r = read_trace(root).rounds.sort_values(["generation_id", "round"])
    return {int(g): d[list(cols)].to_numpy().tolist() for g, d in r.groupby("generation_id")}


def _steps_structure(root: Path) -> pd.DataFrame:
    """Steps without times, the engine's step counter made relative to the batch's first step."""
    s = read_trace(root).steps.sort_values(["batch_id", "step"]).reset_index(drop=True)
    s["step"] = s["step"] - s.groupby("batch_id")["step"].transform("min")
    return s.drop(columns=["t_target_ms", "t_draft_ms", "kv_usage"])


def _assert_same_sweep(root: Path, want: Path) -> None:
    """The same generation ids, batch ids, token ids, rounds and steps, apart from times and step counters."""
    assert _rounds_by_gid(root) == _rounds_by_gid(want)
    pd.testing.assert_frame_equal(_steps_structure(root), _steps_structure(want))
    a, b = read_generations(root), read_generations(want)
    assert {g: (e["output_token_ids"], e["batch_id"]) for g, e in a.items()} == \
        {g: (e["output_token_ids"], e["batch_id"]) for g, e in b.items()}


@pytest.mark.vllm
def test_batch_sweep_is_valid_and_checked_against_vllm(batch_sweep):
    validate_trace(batch_sweep)
    tr = read_trace(batch_sweep)
    meta, r, s = tr.meta, tr.rounds, tr.steps
    assert meta["batch_sizes"] == [1, 2] and meta["batch_size"] == 2 and meta["complete"]
    assert meta["engine"]["settings"]["max_num_seqs"] == 2  # one engine per K, for every b
    checks = meta["checks"]
    assert checks["counters_match"] and checks["emitted_match"] and not checks["token_mismatch_generations"]
    assert not checks["counters_mismatch_parts"] and checks["counters_mismatch_batches"] == []
    assert checks["by_b_K"]["2"]["3"]["vllm_drafted"] == int(r.loc[(r["b"] == 2) & (r["K"] == 3), "n_draft"].sum()) > 0
    # ids: gid = (b_index * n_K + k_index) * n_prompts + prompt_index; batch_id = the batch's first gid
    gens = read_generations(batch_sweep)
    assert sorted(gens) == list(range(12))
    assert [(gens[g]["b"], gens[g]["K"], gens[g]["prompt_id"], gens[g]["batch_id"]) for g in (2, 5, 7, 10, 11)] == [
        (1, 0, "rand1", 2), (1, 3, "rand1", 5), (2, 0, "rand0", 6), (2, 3, "rand0", 9), (2, 3, "rand1", 11)]
    assert r.groupby("generation_id")["batch_id"].first().to_dict() == {g: gens[g]["batch_id"] for g in gens}
    # each part holds whole batches of one (b, K), and vLLM's engine-wide counter deltas over them
    for part in read_parts_log(batch_sweep).values():
        rows = r[r["generation_id"].isin(part["generation_ids"])]
        assert set(rows["b"]) == {part["b"]} and set(rows["K"]) == {part["K"]}
        assert set(r.loc[r["batch_id"].isin(rows["batch_id"]), "generation_id"]) == set(part["generation_ids"])
        assert (int(rows["n_draft"].sum()), int(rows["n_accepted"].sum())) == (part["vllm"]["drafted"],
                                                                              part["vllm"]["accepted"])
    # the two requests of a batch share its steps: one prefill step, then decode steps of both
    b2 = s[(s["b"] == 2) & (s["batch_id"] == 9)].sort_values("step")
    assert b2["phase"].iloc[0] == "prefill" and b2["n_reqs"].iloc[0] == 2 and (b2["n_reqs"] == 2).all()
    assert (b2["phase"].iloc[1:] == "decode").all() and (b2["n_tokens"].iloc[1:] == 2 * 4).all()
    assert (b2["m_max"].iloc[1:] == 4).all() and (b2["n_drafted_next"] == 6).all()


@pytest.mark.vllm
def test_batched_requests_decode_as_at_batch_one_and_steps_match_rounds(batch_sweep):
    tr = read_trace(batch_sweep)
    gens = read_generations(batch_sweep)
    # greedy: each request's output equals its batch-1 output (the tiny model's kernels allow it here), and
    # every generation's sampled tokens equal vLLM's own output
    out = {(g["b"], g["K"], g["prompt_id"]): g["output_token_ids"] for g in gens.values()}
    assert all(g["tokens_match"] for g in gens.values())
    for (b, K, pid), ids in out.items():
        assert ids == out[(1, 0, pid)], (b, K, pid)
    # the rounds of a request at b = 2 are its rounds at b = 1 (Ū included: it counts the request's own
    # rows), apart from the shared step's times
    r = tr.rounds
    keep = ["round", "phase", "m", "n_draft", "n_accepted", "n_emitted", "context_len", "u_bar", "e_max"]
    for pid in ("rep", "rand0", "rand1"):
        for K in (0, 3):
            one = r[(r["b"] == 1) & (r["K"] == K) & (r["prompt_id"] == pid)].sort_values("round")[keep]
            two = r[(r["b"] == 2) & (r["K"] == K) & (r["prompt_id"] == pid)].sort_values("round")[keep]
            pd.testing.assert_frame_equal(one.reset_index(drop=True), two.reset_index(drop=True))
    # steps: n_tokens = sum of the rounds' m, n_reqs their count, context_total their sum
    s = tr.steps.set_index(["batch_id", "step"]).sort_index()
    agg = r.groupby(["batch_id", "step"]).agg(m=("m", "sum"), n=("m", "size"), L=("context_len", "sum"))
    assert agg.index.equals(s.index)
    assert (agg["m"] == s["n_tokens"]).all() and (agg["n"] == s["n_reqs"]).all() and (agg["L"] == s["context_total"]).all()
    # Ū of a step is over ALL its rows: recount it from the tokens' routing where every row produced a token
    # (K = 0 decode steps: one row per request; the row that produced token r is token r - 1's reading row)
    t = tr.tokens
    reading = t.set_index(["generation_id", "pos"])["experts"]
    dec = r[(r["K"] == 0) & (r["b"] == 2) & (r["phase"] == "decode")]
    n_checked = 0
    for (bid, step), rows in dec.groupby(["batch_id", "step"]):
        if len(rows) < 2 or (rows["n_emitted"] != 1).any():
            continue
        ex = np.stack([reading.loc[(g, int(t.loc[(t["generation_id"] == g) & (t["round"] == rd), "pos"].iloc[0]) - 1)]
                       for g, rd in zip(rows["generation_id"], rows["round"])]).reshape(-1, 2, 4)
        per_layer = [len(set(ex[:, la].ravel().tolist())) for la in range(2)]
        assert s.loc[(bid, step), "u_bar"] == pytest.approx(np.mean(per_layer))
        assert s.loc[(bid, step), "e_max"] == max(per_layer)
        assert s.loc[(bid, step), "u_bar"] >= rows["u_bar"].max()
        n_checked += 1
    assert n_checked >= 10


@pytest.mark.vllm
def test_batch_one_writes_the_batch_one_trace(tiny_moe, batch_sweep, tmp_path, capsys):
    from speclimits.cli import main

    out = tmp_path / "b1"
    rc = main(["trace", "--target", str(tiny_moe), "--draft", str(tiny_moe), "--method", "draft_model", "--k", "3",
               "--batch", "1", "--prompts", str(PROMPTS), "--limit", "3", "--max-tokens", "12", "--load-format",
               "dummy", "--tokens", "all", "--out", str(out), "--quiet"])
    assert rc == 0 and "batch sizes" not in capsys.readouterr().out
    validate_trace(out)
    tr = read_trace(out)
    # the files, columns, settings and generation ids of a batch-1 trace: no steps, no batch columns
    assert sorted(p.name for p in out.iterdir()) == ["generations.jsonl", "meta.json", "parts.jsonl",
                                                     "rounds.parquet", "tokens.parquet"]
    assert sorted(p.name for p in (out / "rounds.parquet").iterdir()) == ["part-g000000.parquet"]
    measured = read_trace(DATA_DIR / "traces" / "measured-eagle3")
    assert list(tr.rounds.columns) == list(measured.rounds.columns) == [
        "generation_id", "prompt_id", "K", "m", "round", "phase", "t_target_ms", "t_draft_ms", "u_bar", "e_max",
        "context_len", "kv_usage", "graph_bucket", "n_draft", "n_accepted", "n_emitted", "n_sampled", "prompt_len",
        "step", "n_drafted_next", "category"]
    assert list(tr.tokens.columns) == ["seq_id", "pos", "token_id", "text", "new_experts", "experts",
                                       "generation_id", "K", "round", "row", "context_len", "reference_kind",
                                       "category"]
    assert tr.steps is None and tr.batch_sizes == [1]
    assert tr.meta["batch_size"] == 1 and "batch_sizes" not in tr.meta and "by_b_K" not in tr.meta["checks"]
    assert sorted(tr.meta["sweep"]) == sorted(measured.meta["sweep"])
    assert tr.meta["engine"]["settings"]["max_num_seqs"] == 1
    gens = read_generations(out)
    assert sorted(gens) == [0, 1, 2] and all("b" not in g and "batch_id" not in g for g in gens.values())
    assert sorted(json.loads(next(iter((out / "parts.jsonl").open())))) == ["K", "check", "generation_ids", "part",
                                                                            "trace", "vllm"]
    # and its rounds are those of the batch sweep's b = 1, K = 3 generations (gids 3..5 there)
    ours = _rounds_by_gid(out)
    theirs = _rounds_by_gid(batch_sweep)
    assert ours == {g - 3: theirs[g] for g in (3, 4, 5)}


@pytest.mark.vllm
def test_interrupted_batch_sweep_resumes_to_the_same_trace(tiny_moe, batch_sweep, tmp_path, monkeypatch, vllm_mod):
    from speclimits.trace import done_generations
    from speclimits.tracing import sweep

    out = tmp_path / "trace"
    # generate() calls: K=0 b=1 x3, b=2 x2, K=3 b=1 x3, b=2 x2. Killed in the last (batch 11); batch 9 was
    # finished but only buffered (flush_every=3): dropped, since vLLM's counters include the killed batch's drafts
    cfg = _cfg(tiny_moe, out, flush_every=3, flush_seconds=60)
    real = vllm_mod.LLM.generate
    calls = {"n": 0}

    def dying(self, prompts, params=None, *args, **kwargs):
        if params is not None and params.max_tokens == 12:  # not the warm-up
            if calls["n"] == 9:
                raise KeyboardInterrupt
            calls["n"] += 1
        return real(self, prompts, params, *args, **kwargs)

    monkeypatch.setattr(vllm_mod.LLM, "generate", dying)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(cfg)
    monkeypatch.setattr(vllm_mod.LLM, "generate", real)
    validate_trace(out)  # a killed batch sweep is a valid partial trace
    assert done_generations(out) == set(range(9))
    assert set(read_trace(out).steps["batch_id"]) == {0, 1, 2, 3, 4, 5, 6, 8}
    cfg.resume = True
    with pytest.raises(SpeclimitsError, match="batch_sizes"):
        sweep.run_sweep(_cfg(tiny_moe, out, batch_sizes=[1, 4], resume=True))
    meta = sweep.run_sweep(cfg)
    assert meta["complete"] and meta["checks"]["counters_match"] and not meta["checks"]["counters_mismatch_parts"]
    validate_trace(out)
    _assert_same_sweep(out, batch_sweep)


# -- Ray, in a loopback-only network namespace --


@pytest.mark.vllm
@pytest.mark.ray
def test_ray_batch_sweep_equals_the_serial_one(batch_sweep, tmp_path):
    from loopback import ray_scenario

    ray_scenario(tmp_path, "dist", "--batch", "1,2", "--max-tokens", "12", "--shard-size", "2")  # SWEEP, on Ray
    dist = tmp_path / "dist"
    validate_trace(dist)
    meta = read_trace(dist).meta
    assert meta["complete"] and meta["checks"]["counters_match"] and meta["batch_sizes"] == [1, 2]
    # jobs of whole batches of one (b, K): per K, b = 1 in jobs of 2 and 1 prompts, b = 2 in two jobs of a batch
    dist_meta = meta["distributed"]
    assert dist_meta["runs"][-1]["jobs"] == 8 and all(s["b"] in (1, 2) for s in dist_meta["shards"].values())
    _assert_same_sweep(dist, batch_sweep)
