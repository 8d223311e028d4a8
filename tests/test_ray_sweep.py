"""Distributed K sweeps on Ray: job planning and queue rules (no Ray), then the real thing (``ray`` and
``vllm``), each Ray session in a loopback-only network namespace (tests/loopback.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclimits.errors import SpeclimitsError
from speclimits.trace import (done_generations, read_generations, read_parts_log, read_trace, remove_orphan_parts,
                              validate_trace, write_part, write_shard_log)
from speclimits.tracing.prompts import Prompt
from speclimits.tracing.ray_sweep import Job, JobQueue, SweepWorker, default_shard_size, plan_jobs
from speclimits.tracing.sweep import SweepConfig, SweepPlan


def _plan(tmp_path, n_prompts=5, k_values=(0, 2, 3), done=()):
    prompts = [Prompt(f"p{i}", token_ids=(1, 2, 3)) for i in range(n_prompts)]
    cfg = SweepConfig(target="t", prompts="-", out=str(tmp_path / "tr"), k_values=list(k_values))
    todo = [(ki, K, pi) for ki, K in enumerate(k_values) for pi in range(n_prompts)
            if ki * n_prompts + pi not in set(done)]
    return SweepPlan(cfg, prompts, tmp_path / "tr", {"max_tokens": 128}, list(k_values), None, todo)


def test_jobs_cover_every_generation_once_with_stable_distinct_names(tmp_path):
    plan = _plan(tmp_path, done=(1, 7))
    jobs = plan_jobs(plan, shard_size=2)
    gids = [g for j in jobs for g in j.gids]
    assert sorted(gids) == [g for g in range(15) if g not in (1, 7)]  # each left generation exactly once
    assert all(len(j.gids) <= 2 and len({plan.k_values[j.k_index]}) == 1 for j in jobs)
    assert all(j.gids == tuple(j.k_index * 5 + p for p in j.prompts) for j in jobs)
    assert len({j.name for j in jobs}) == len(jobs)
    assert plan_jobs(plan, shard_size=2) == jobs  # the same specification gives the same names
    other = _plan(tmp_path, done=(1, 7))
    other.settings = {"max_tokens": 64}
    assert {j.name for j in plan_jobs(other, 2)}.isdisjoint(j.name for j in jobs)
    assert jobs[0].name.startswith("part-k000-g000000-")
    with pytest.raises(SpeclimitsError, match="--shard-size"):
        plan_jobs(plan, 0)
    assert default_shard_size(40, 2) == 5 and default_shard_size(3, 2) == 1 and default_shard_size(1000, 2) == 16


def test_queue_keeps_engines_then_spreads_over_fresh_k():
    jobs = [Job(ki, K, (p,), (ki * 3 + p,), f"j{K}{p}") for ki, K in enumerate((0, 2, 3)) for p in range(3)]
    q = JobQueue(jobs)
    a = q.next_for(None, set())
    b = q.next_for(None, {a.K})
    assert (a.K, b.K) == (0, 2)  # the second worker starts on a K nobody holds
    assert q.next_for(0, {2}).K == 0 and q.next_for(0, {2}).K == 0  # same K: no rebuild
    assert q.next_for(0, {2}).K == 3  # K = 0 exhausted: a fresh K rather than joining K = 2
    q.give_back(a)
    assert q.next_for(2, {3}) is not None and q.pending[0] is a  # a returned job goes first ...
    assert q.next_for(None, {2, 3}) is a  # ... and is taken by the next worker without a same-K job
    while q.next_for(3, set()) is not None:
        pass
    assert len(q) == 0 and q.next_for(0, set()) is None


def test_shard_logs_count_only_with_their_rounds_part(tmp_path):
    root = tmp_path / "tr"
    rounds = pd.DataFrame({"generation_id": [0, 0, 1], "round": [0, 1, 0]})
    entry = {"part": "part-a", "K": 2, "generation_ids": [0], "vllm": {"drafted": 4, "accepted": 3},
             "trace": {"drafted": 4, "accepted": 3}, "worker": {"pid": 11}}
    write_part(root, "tokens", "part-a", rounds.iloc[:2])
    write_shard_log(root, "part-a", entry, [{"generation_id": 0, "K": 2}])
    write_part(root, "rounds", "part-a", rounds.iloc[:2])
    # a job killed after its tokens part and its log, before its rounds part
    write_part(root, "tokens", "part-b", rounds.iloc[2:])
    write_shard_log(root, "part-b", dict(entry, part="part-b", generation_ids=[1]), [{"generation_id": 1, "K": 9}])
    (root / "shards" / ".part-c.json.tmp").write_text("{half")  # a torn temporary file
    (root / "rounds.parquet" / ".part-c.parquet.tmp").write_bytes(b"half")
    assert done_generations(root) == {0}
    assert set(read_generations(root)) == {0} and set(read_parts_log(root)) == {"part-a"}
    assert read_parts_log(root)["part-a"]["worker"] == {"pid": 11}
    removed = sorted(p.name for p in remove_orphan_parts(root))
    assert removed == ["part-b.json", "part-b.parquet"]
    assert (root / "shards" / "part-a.json").exists() and (root / "tokens.parquet" / "part-a.parquet").exists()


def test_retried_job_with_its_shard_on_disk_is_skipped(tmp_path):
    plan = _plan(tmp_path, n_prompts=2, k_values=(2,))
    job = plan_jobs(plan, 2)[0]
    write_part(plan.root, "rounds", job.name, pd.DataFrame({"generation_id": [0, 1]}))
    worker = SweepWorker(dict(plan.cfg.__dict__), plan.prompts, plan.k_values)
    try:
        got = worker.run_job(job, 2)  # no engine exists: building one would fail on target 't'
    finally:
        worker.close()
    assert got["skipped"] and worker.usage()["engine_builds"] == 0 and worker.holder.llm is None


# -- Ray + vLLM, in a loopback-only namespace --


@pytest.fixture(scope="module")
def ray_runs(tmp_path_factory):
    from loopback import ray_scenario

    work = tmp_path_factory.mktemp("ray")
    return work, {s: ray_scenario(work, s, *(["--oracle-k-max", "3"] if s in ("serial", "dist") else []))
                  for s in ("serial", "dist", "kill", "resume")}


def _by_generation(root: Path) -> dict[int, dict]:
    """Per generation: output tokens, and the rounds' (n_draft, n_accepted, n_emitted, m, context_len)."""
    tr = read_trace(root)
    gens = read_generations(root)
    r = tr.rounds.sort_values(["generation_id", "round"])
    out = {}
    for gid, g in r.groupby("generation_id"):
        out[int(gid)] = {"tokens": gens[int(gid)]["output_token_ids"], "prompt": gens[int(gid)]["prompt_id"],
                         "rounds": g[["round", "phase", "n_draft", "n_accepted", "n_emitted", "m",
                                      "context_len"]].to_numpy().tolist()}
    return out


def _token_table(root: Path) -> pd.DataFrame:
    t = read_trace(root).tokens.sort_values(["generation_id", "pos"]).reset_index(drop=True)
    t["experts"] = [None if e is None else tuple(e) for e in t["experts"]]
    return t


@pytest.mark.vllm
@pytest.mark.ray
def test_two_workers_equal_the_serial_sweep(ray_runs):
    work, results = ray_runs
    serial = _by_generation(work / "serial")
    assert len(serial) == 6
    for scenario in ("dist", "kill", "resume"):
        root = work / scenario
        validate_trace(root)
        meta = read_trace(root).meta
        assert meta["complete"] and meta["checks"]["counters_match"] and meta["checks"]["emitted_match"]
        assert not meta["checks"]["token_mismatch_generations"]
        # same tokens, same accepted counts, same rounds per generation
        assert _by_generation(root) == serial, scenario
        # (the serial and dist traces also ran the Oracle pass, which adds the target's choice to the tokens)
        mine = _token_table(root)
        pd.testing.assert_frame_equal(mine, _token_table(work / "serial")[list(mine.columns)], check_dtype=False)
        r = read_trace(root).rounds
        assert not r.duplicated(["generation_id", "round"]).any()
        assert sorted(r["generation_id"].unique()) == list(range(6))
        # where each shard ran; one part per job, its counters checked against vLLM's
        dist = meta["distributed"]
        assert dist["workers"] == 2 and set(dist["shards"]) == set(read_parts_log(root))
        assert all(s["where"]["pid"] > 0 for s in dist["shards"].values())
    dist = read_trace(work / "dist").meta["distributed"]
    # two workers, each owning one engine: the queue starts them on K = 0 and K = 3; a worker that
    # runs out of its K joins the other (one rebuild), so at most 3 engines for 2 K values
    pids = {s["where"]["pid"] for s in dist["shards"].values()}
    assert len(pids) == 2
    builds = [u["engine_builds"] for u in dist["runs"][-1]["usage"]]
    assert len(builds) == 2 and min(builds) == 1 and sum(builds) <= 3
    started = [e[2]["K"] for e in results["kill"]["events"] if e[1] == "started"]
    assert sorted(started[:2]) == [0, 3]


@pytest.mark.vllm
@pytest.mark.ray
def test_oracle_pass_on_the_workers_equals_the_serial_pass(ray_runs):
    from tokens_layout import layout_failures

    work, results = ray_runs
    serial, dist = read_trace(work / "serial"), read_trace(work / "dist")
    keys = ["seq_id", "pos"]
    a = serial.oracle.sort_values(keys).reset_index(drop=True)
    b = dist.oracle.sort_values(keys).reset_index(drop=True)
    assert len(a) == 3 * 19 and list(a.columns) == list(b.columns)
    for col in a.columns:  # ints and ids exactly, the draft's probabilities to float rounding
        if a[col].dtype == object and col != "seq_id":
            np.testing.assert_allclose(np.stack(a[col]).astype(float), np.stack(b[col]).astype(float), rtol=1e-5,
                                       err_msg=col)
        elif pd.api.types.is_float_dtype(a[col]):
            np.testing.assert_allclose(a[col], b[col], rtol=1e-5, err_msg=col)
        else:
            assert a[col].tolist() == b[col].tolist(), col
    # the same meta, apart from where it ran; the parts are those of the serial pass
    od, os_ = dist.meta["oracle"], serial.meta["oracle"]
    assert {k: v for k, v in od.items() if k != "distributed"} == os_
    assert sorted(p.name for p in (work / "dist" / "oracle.parquet").iterdir()) == \
        sorted(p.name for p in (work / "serial" / "oracle.parquet").iterdir())
    # shards of one reference on two workers, each with one Oracle engine
    d = od["distributed"]
    assert d["workers"] == 2 and [r["jobs"] for r in d["runs"]] == [3, 0] and len(d["shards"]) == 3
    assert len({s["where"]["pid"] for s in d["shards"].values()}) == 2 and len(d["runs"][0]["usage"]) == 2
    # run again with every part on disk: nothing is dispatched
    assert results["dist"]["oracle_rerun"] == {"jobs": 0, "events": []}
    # and the tokens are rewritten in the documented layout by the driver, as by the serial pass
    pd.testing.assert_frame_equal(_token_table(work / "dist"), _token_table(work / "serial"))
    ref = serial.tokens[serial.tokens["K"] == 0]
    assert layout_failures(serial.oracle, ref, {}, min_states=5) == []


@pytest.mark.vllm
@pytest.mark.ray
def test_killed_worker_is_replaced_and_the_trace_is_complete(ray_runs):
    work, results = ray_runs
    kinds = [e[1] for e in results["kill"]["events"]]
    assert results["kill"]["killed_pids"] and "died" in kinds
    run = read_trace(work / "kill").meta["distributed"]["runs"][-1]
    assert run["worker_restarts"] == 1 and run["retried_jobs"] >= 1
    shards = read_trace(work / "kill").meta["distributed"]["shards"]
    assert results["kill"]["killed_pids"][0] not in {s["where"]["pid"] for s in shards.values()} or \
        any(s.get("attempts", 1) > 1 for s in shards.values())
    # without retries the first run fails; --resume then finishes it, skipping the shards on disk
    assert results["resume"]["first_run"].startswith("failed")
    runs = read_trace(work / "resume").meta["distributed"]["runs"]
    assert len(runs) == 2 and runs[0]["status"].startswith("failed") and runs[1]["status"] == "complete"
    assert 0 < runs[1]["jobs"] < 6 and runs[1]["retried_jobs"] == 0 and runs[0]["jobs"] + runs[1]["jobs"] <= 6
