"""Tracing harness pieces that need no engine: counting, capture buffer, prompts, rows, CLI guard."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from speclimits.errors import SpeclimitsError
from speclimits.tracing.capture import cumulative_unique, to_numpy, unique_per_layer
from speclimits.tracing.oracle_mode import Reference, oracle_rows, plan_requests
from speclimits.tracing.prompts import read_prompts
from speclimits.tracing.records import generation_columns
from speclimits.tracing.inputs import parse_k


def _brute_cumulative(rows: np.ndarray) -> np.ndarray:
    m, n_layers, _ = rows.shape
    out = np.zeros((m, n_layers), dtype=int)
    for layer in range(n_layers):
        seen: set[int] = set()
        for j in range(m):
            seen |= {int(e) for e in rows[j, layer] if e >= 0}
            out[j, layer] = len(seen)
    return out


def test_unique_counts_match_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(20):
        m, n_layers, top_k, n_exp = rng.integers(1, 12), rng.integers(1, 6), rng.integers(1, 5), rng.integers(5, 40)
        rows = np.stack([[rng.choice(n_exp, top_k, replace=False) for _ in range(n_layers)] for _ in range(m)])
        cum = cumulative_unique(rows, n_exp)
        np.testing.assert_array_equal(cum, _brute_cumulative(rows))
        np.testing.assert_array_equal(unique_per_layer(rows, n_exp), cum[-1])
        groups = rng.integers(0, 3, size=m)  # rows counted per group in one scatter
        np.testing.assert_array_equal(unique_per_layer(rows, n_exp, groups, 3),
                                      [_brute_cumulative(rows[groups == g])[-1] if (groups == g).any()
                                       else np.zeros(n_layers) for g in range(3)])
    # negative ids (never-written buffer rows) are not experts
    assert unique_per_layer(np.array([[[-1, 3]], [[3, 4]]]), 8).tolist() == [2]


def _read(cap, n_rows):
    return to_numpy(cap.snapshot(n_rows))


def test_static_buffer_capture_on_cpu_tensors():
    torch = pytest.importorskip("torch")
    from speclimits.tracing.capture import RoutingCapture

    class Router:
        def __init__(self):
            self.capture_fn = None

        def set_capture_fn(self, fn):
            self.capture_fn = fn

    routers = [Router(), Router(), Router()]
    cap = RoutingCapture(n_layers=3, top_k=2, max_tokens=8)
    address = cap.buffer.data_ptr()
    cap.bind(routers)
    ids = [torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int64) + 10 * layer for layer in range(3)]
    for layer, router in enumerate(routers):
        router.capture_fn(ids[layer])
    got = _read(cap, 3)
    assert got.dtype == np.int16 and got.shape == (3, 3, 2)
    for layer in range(3):
        np.testing.assert_array_equal(got[:, layer], ids[layer].numpy())
    # a smaller later forward overwrites only its rows; the buffer never moves (CUDA-graph safety)
    routers[0].capture_fn(torch.tensor([[7, 7]], dtype=torch.int32))
    assert cap.buffer.data_ptr() == address
    assert _read(cap, 1)[0, 0].tolist() == [7, 7] and _read(cap, 2)[1, 0].tolist() == [3, 4]
    with pytest.raises(SpeclimitsError, match="static buffer"):
        routers[1].capture_fn(torch.zeros((9, 2), dtype=torch.int64))
    cap.unbind()
    assert all(r.capture_fn is None for r in routers)


def test_parse_k():
    assert parse_k("1-4") == [1, 2, 3, 4]
    assert parse_k("0,2-3,3") == [0, 2, 3]
    for bad in ("", "a", "3-1", "-1"):
        with pytest.raises(SpeclimitsError):
            parse_k(bad)


def test_read_prompts_formats_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([
        "# comment",
        json.dumps({"id": "a", "prompt": "hello", "category": "x"}),
        json.dumps({"prompt_token_ids": [1, 2, 3]}),
        json.dumps({"question_id": 81, "category": "writing", "turns": ["first turn", "second"]}),
    ]))
    ps = read_prompts(f)
    assert [p.id for p in ps] == ["a", "3", "81"]
    assert ps[0].text == "hello" and ps[0].category == "x" and not ps[0].chat
    assert ps[1].token_ids == (1, 2, 3)
    assert ps[2].text == "first turn" and ps[2].chat and ps[2].category == "writing"
    f.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n" + json.dumps({"id": "a", "prompt": "y"}))
    with pytest.raises(SpeclimitsError, match="line 2: duplicate prompt id 'a'"):
        read_prompts(f)
    f.write_text('{"id": "z", "nothing": 1}')
    with pytest.raises(SpeclimitsError, match="line 1: needs 'prompt'"):
        read_prompts(f)


def _rec(step, reqs, t=1.0, td=0.5):
    return {"step": step, "t_target_ms": t, "t_draft_ms": td, "graph_bucket": sum(r["n_sched"] for r in reqs),
            "num_tokens": sum(r["n_sched"] for r in reqs), "kv_usage": 0.1, "reqs": reqs}


def _req(n_sched, n_spec, ctx, n_out, sampled, routing, routing_from=0, n_prompt=4):
    u = np.array([len(set(routing[:, layer].ravel())) for layer in range(routing.shape[1])])
    return {"req_id": "0-abcdefgh", "n_sched": n_sched, "n_spec": n_spec, "context_len": ctx, "n_prompt": n_prompt,
            "n_out_before": n_out, "row_offset": 0, "n_sampled": len(sampled), "sampled": sampled, "n_drafted": 2,
            "u_layers": u, "routing": routing, "routing_from": routing_from}


def generation_tables(steps, **kw):
    """:func:`generation_columns` as the DataFrames a sweep writes (through :func:`columns_table`)."""
    from speclimits.trace import columns_table

    rounds, tokens, check = generation_columns(steps, **kw)
    return columns_table([rounds], None).to_pandas(), columns_table([tokens], None).to_pandas(), check


def test_generation_tables_truncation_and_reading_rows():
    # 1 layer, top-1, experts chosen so each row is identifiable
    prefill_rows = np.array([[[5]], [[6]]])  # the last 2 of 4 prompt rows
    dec1 = np.array([[[1]], [[2]], [[3]]])  # K=2, all accepted: 3 tokens
    dec2 = np.array([[[1]], [[4]], [[4]]])  # first draft accepted, second rejected, then cut by max_tokens
    steps = [
        (_rec(1, []), _req(4, 0, 0, 0, [10], prefill_rows, routing_from=2)),
        (_rec(2, []), _req(3, 2, 4, 1, [11, 12, 13], dec1)),
        (_rec(3, []), _req(3, 2, 7, 4, [14, 15], dec2)),
    ]
    for rec, r in steps:
        rec["reqs"] = [r]
    # vLLM stopped after 5 tokens: the last round sampled 2 but emitted 1
    rounds, tokens, check = generation_tables(steps, output_ids=[10, 11, 12, 13, 14], generation_id=7,
                                              prompt_id="p", K=2, top_k=1)
    assert rounds["phase"].tolist() == ["prefill", "decode", "decode"]
    assert rounds["m"].tolist() == [4, 3, 3]
    assert rounds["n_accepted"].tolist() == [0, 2, 1]
    assert rounds["n_emitted"].tolist() == [1, 3, 1]
    assert rounds["n_sampled"].tolist() == [1, 3, 2]
    assert check == {"drafted": 4, "accepted": 3, "emitted": 5, "output_len": 5, "tokens_match": True}
    assert tokens["token_id"].tolist() == [10, 11, 12, 13, 14]
    # the tokens were produced by the prefill's last row, rows 0..2 of round 1 and row 0 of round 2
    assert tokens["round"].tolist() == [0, 1, 1, 1, 2] and tokens["row"].tolist() == [3, 0, 1, 2, 0]
    # routing on the reading rows: token r is read by the row that produced token r + 1 (10 is read by row 0
    # of round 1, ..., 13 by row 0 of round 2); the last token's reading row emitted nothing: no routing
    assert [None if e is None else int(e[0]) for e in tokens["experts"]] == [1, 2, 3, 1, None]
    # new experts of a reading row against the previous token's reading row (token 10's: the prefill's last row)
    np.testing.assert_array_equal(tokens["new_experts"], [1.0, 1.0, 1.0, 1.0, np.nan])
    assert tokens["context_len"].tolist() == [4, 5, 6, 7, 8]
    assert set(tokens["reference_kind"]) == {"greedy"}
    # a fully accepted round's u_bar equals the unique experts over the tokens its rows read: the token
    # before its first one and all but its last one
    full = rounds.index[(rounds["phase"] == "decode") & (rounds["n_emitted"] == rounds["m"])]
    assert len(full) == 1
    for i in full:
        pos = tokens.loc[tokens["round"] == i, "pos"].to_numpy() - 1
        ex = np.stack(tokens.set_index("pos").loc[pos, "experts"].to_list())
        assert rounds.loc[i, "u_bar"] == len(set(ex.ravel()))
    with pytest.raises(SpeclimitsError, match="saw 6 sampled tokens but vLLM returned 7"):
        generation_tables(steps, output_ids=list(range(7)), generation_id=7, prompt_id="p", K=2, top_k=1)


def _steps(seed: int, K: int = 2, n_layers: int = 2, top_k: int = 2, n_exp: int = 8):
    """Random step records of one generation: a 5-row prefill, then decode rounds of K+1 rows."""
    rng = np.random.default_rng(seed)

    def rows(m):
        return np.stack([[rng.choice(n_exp, top_k, replace=False) for _ in range(n_layers)] for _ in range(m)])

    pre = rows(5)
    steps = [(_rec(1, []), _req(5, 0, 0, 0, [int(rng.integers(500))], pre[3:], routing_from=3, n_prompt=5))]
    steps[0][1]["u_layers"] = np.array([len(set(pre[:, layer].ravel())) for layer in range(n_layers)])
    ctx, n_out = 5, 1
    for step in range(2, 7):
        n_s = int(rng.integers(1, K + 2))
        r = _req(K + 1, K, ctx, n_out, [int(t) for t in rng.integers(500, size=n_s)], rows(K + 1), n_prompt=5)
        steps.append((_rec(step, []), r))
        ctx, n_out = ctx + n_s, n_out + n_s
    for rec, r in steps:
        rec["reqs"] = [r]
    return steps


def test_worker_counts_or_driver_counts_give_the_same_rows():
    # decode entries without u_layers are counted by the driver, vectorised over the generation
    steps = _steps(0)
    out = [t for _, r in steps for t in r["sampled"]]
    a = generation_tables(steps, output_ids=out, generation_id=1, prompt_id="p", K=2, top_k=2)
    for _, r in steps[1:]:
        r.pop("u_layers")
    b = generation_tables(steps, output_ids=out, generation_id=1, prompt_id="p", K=2, top_k=2)
    pd.testing.assert_frame_equal(a[0], b[0])
    # and the counts are right: brute force over each decode round's rows
    for i, (_, r) in enumerate(steps[1:], start=1):
        per_layer = [len(set(r["routing"][:, layer].ravel().tolist())) for layer in range(2)]
        assert b[0].loc[i, "u_bar"] == np.mean(per_layer) and b[0].loc[i, "e_max"] == max(per_layer)
    # new_experts by brute force over consecutive reading rows; the reading row before token 0's is the
    # prefill's last row (which reads the last prompt token); the last token has no reading row
    ex = b[1]["experts"].to_list()
    assert ex[-1] is None and all(e is not None for e in ex[:-1])
    ex = np.stack(ex[:-1]).reshape(-1, 2, 2)
    prev = np.concatenate([steps[0][1]["routing"][-1][None], ex[:-1]])
    brute = [np.mean([len(set(ex[j, la]) - set(prev[j, la])) for la in range(2)]) for j in range(len(ex))]
    np.testing.assert_allclose(b[1]["new_experts"][:-1], brute)
    assert np.isnan(b[1]["new_experts"].iloc[-1])


def test_buffered_parts_bookkeeping(tmp_path):
    from speclimits.trace import (append_lines, columns_table, done_generations, part_name, read_table,
                                  remove_orphan_parts, write_part)
    from speclimits.tracing.sweep import finalize_meta

    cols, entries = [], []
    for gid in (0, 1, 2):
        steps = _steps(gid)
        out = [t for _, r in steps for t in r["sampled"]][:-1]  # vLLM stopped one token early
        rounds, tokens, check = generation_columns(steps, output_ids=out, generation_id=gid, prompt_id=f"p{gid}",
                                                   K=2, top_k=2)
        cols.append((rounds, tokens))
        entries.append({"generation_id": gid, "K": 2, "trace": {k: check[k] for k in
                                                                ("drafted", "accepted", "emitted", "output_len")},
                        "tokens_match": check["tokens_match"]})
    root = tmp_path / "tr"
    # a part of gids 0-1 on disk; gid 2's flush died after its tokens part and log lines
    write_part(root, "tokens", part_name(0), columns_table([c[1] for c in cols[:2]], ["c", "c"]))
    write_part(root, "rounds", part_name(0), columns_table([c[0] for c in cols[:2]], ["c", "c"]))
    write_part(root, "tokens", part_name(2), columns_table([cols[2][1]], ["c"]))
    append_lines(root / "generations.jsonl", entries)
    drafted = sum(e["trace"]["drafted"] for e in entries[:2])
    accepted = sum(e["trace"]["accepted"] for e in entries[:2])
    append_lines(root / "parts.jsonl", [
        {"part": part_name(0), "K": 2, "generation_ids": [0, 1], "vllm": {"drafted": -1, "accepted": 0}},  # stale
        {"part": part_name(0), "K": 2, "generation_ids": [0, 1], "vllm": {"drafted": drafted, "accepted": accepted},
         "trace": {"drafted": drafted, "accepted": accepted}},
        {"part": part_name(2), "K": 2, "generation_ids": [2], "vllm": {"drafted": 99, "accepted": 99},
         "trace": {"drafted": 0, "accepted": 0}}])
    assert done_generations(root) == {0, 1}
    assert [p.name for p in remove_orphan_parts(root)] == [f"{part_name(2)}.parquet"]
    # read back: each generation's last token has no reading row (null experts), the others int16 ids
    experts = read_table(root, "tokens")["experts"].to_list()
    assert sum(e is None for e in experts) == 2 and all(e.dtype == np.int16 for e in experts if e is not None)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt_token_ids": [1, 2]}) for i in range(3)))
    meta = finalize_meta(root, {"k_values": [2], "sweep": {"prompts": str(prompts)}})
    # the part on disk counts (its last log line); the orphan's line does not
    assert meta["checks"]["counters_match"] and meta["generations_done"] == 2 and not meta["complete"]
    assert meta["checks"]["by_K"]["2"]["vllm_drafted"] == drafted > 0
    append_lines(root / "parts.jsonl", [{"part": part_name(0), "K": 2, "generation_ids": [0, 1],
                                         "vllm": {"drafted": drafted + 1, "accepted": accepted},
                                         "trace": {"drafted": drafted, "accepted": accepted}}])
    checks = finalize_meta(root, {"k_values": [2], "sweep": {"prompts": str(prompts)}})["checks"]
    assert not checks["counters_match"] and checks["counters_mismatch_parts"] == [part_name(0)]


@pytest.mark.parametrize("sampled", [False, True])
def test_oracle_rows_from_results(sampled):
    from speclimits.tracing.oracle_mode import TARGET_SAMPLED

    kw = dict(category="code", source=TARGET_SAMPLED, prompt_id="p", sample=1, seed=7) if sampled else {}
    ref = Reference("p#1" if sampled else "s", prompt_ids=(1, 2, 3), output_ids=(10, 11, 12, 13), **kw)  # states 0..2
    assert ref.kind == ("sampled" if sampled else "greedy") and not ref.unsampled
    assert Reference("p#2", (1,), (), source=TARGET_SAMPLED).unsampled
    plan = plan_requests(ref, k_max=2)
    assert plan[0] == (0, [1, 2, 3], 10, [11, 12])
    assert plan[2] == (2, [1, 2, 3, 10, 11], 12, [13, -1])
    results = {}
    for pos, _, _, chain in plan:
        draft = [t if t >= 0 else 99 for t in chain]
        if pos == 1 and not sampled:
            draft[1] = 77  # second draft wrong
        results[pos] = {"draft_conf": np.array([0.9, 0.8]), "draft_tokens": np.array(draft),
                        "chain_prob": np.array([0.5 + 0.1 * pos, 0.3]), "accept_prob": np.array([0.4 + 0.1 * pos, 0.25]),
                        "u_window": np.array([[2, 2], [3, 2], [4, 3]]), "n_sampled_verify": 3}
    df = oracle_rows(ref, 2, results, sampled=sampled)
    assert df["pos"].tolist() == [0, 1, 2] and df["context_len"].tolist() == [3, 4, 5]
    assert df["accept_len"].tolist() == ([2, 2, 1] if sampled else [2, 1, 1])  # last state: one token left
    # teacher-forced match prob = step-1 prob at successive states; 0 past the end
    np.testing.assert_allclose(np.stack(df["match_prob"]), [[0.5, 0.6], [0.6, 0.7], [0.7, 0.0]])
    np.testing.assert_allclose(df["u_bar_window"].iloc[0], [2.0, 2.5, 3.5])
    assert set(df["reference_kind"]) == {ref.kind} and ("accept_prob" in df.columns) == sampled
    assert "target_conf" not in df.columns  # the acceptance study's features: only where every state has them
    for pos in results:
        results[pos].update(draft_conf2=np.array([0.05, 0.1]), draft_entropy=np.array([0.4, 0.7]), target_conf=0.2 * pos)
    feats = oracle_rows(ref, 2, results, sampled=sampled)
    np.testing.assert_allclose(np.stack(feats["draft_entropy"]), [[0.4, 0.7]] * 3)
    assert feats["target_conf"].tolist() == [0.0, 0.2, 0.4] and np.stack(feats["draft_conf2"]).shape == (3, 2)
    if sampled:  # accept_prob 0 past the end, as match_prob; which reference of which prompt
        np.testing.assert_allclose(np.stack(df["accept_prob"]), [[0.4, 0.25], [0.5, 0.25], [0.6, 0.0]])
        assert set(df["prompt_id"]) == {"p"} and set(df["sample"]) == {1} and df["sample"].dtype == np.int64
        results[1] = {k: v for k, v in results[1].items() if k != "accept_prob"}
    else:
        results.pop(1)
    with pytest.raises(SpeclimitsError, match="states \\[1\\]"):
        oracle_rows(ref, 2, results, sampled=sampled)


@pytest.mark.parametrize("missing, flags, hint", [("vllm", [], "pip install -e '.[trace]'"),
                                                   ("ray", ["--method", "ngram", "--workers", "2"], "pip install -e '.[ray]'")])
def test_import_is_lazy_and_trace_without_vllm_or_ray_says_how_to_install(tmp_path, missing, flags, hint):
    (tmp_path / "x").mkdir()  # inputs that pass the checks made before any engine or Ray is asked for
    (tmp_path / "x" / "config.json").write_text('{"vocab_size": 16}')
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt_token_ids": [1, 2]}\n')
    code = (
        "import sys\n"
        "import speclimits, speclimits.cli, speclimits.tracing.cli, speclimits.tracing.sweep\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'vllm' in m)\n"
        f"sys.modules[{missing!r}] = None  # behave as if it were not installed\n"
        f"sys.exit(speclimits.cli.main(['trace', '--target', 'x', '--prompts', 'p.jsonl', '--out', 'o', *{flags!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and hint in lines[0], proc.stderr


def test_extension_wraps_the_runner_and_uninstall_restores_it():
    """The extension's wrappers replace the runner's five methods and the drafter's compute_logits,
    time the draft proposal, and speclimits_uninstall puts every original back (no vLLM needed)."""
    from types import SimpleNamespace

    from speclimits.tracing.extension import TracingWorkerExtension

    class Runner:
        def execute_model(self, sched):
            return sched  # a result (not None): no sampling follows this step

        def _model_forward(self, *a):
            return "forward"

        def _sample(self, *a):
            return "sampled"

        def propose_draft_token_ids(self, *a):
            time.sleep(0.002)
            return [[1, 2], [3]]

        def sample_tokens(self, *a):
            return "tokens"

    class DraftModel:
        def compute_logits(self, x):
            return x

    runner = Runner()
    runner.drafter = SimpleNamespace(model=DraftModel())
    ext = TracingWorkerExtension()
    ext.model_runner = runner
    wrapped = ["execute_model", "_model_forward", "_sample", "propose_draft_token_ids", "sample_tokens"]
    ext.speclimits_hook(runner)
    assert ext._speclimits_step is None
    assert [n for n in runner.__dict__ if n != "drafter"] == wrapped  # in this order
    assert "compute_logits" in runner.drafter.model.__dict__
    assert runner.execute_model("done") == "done" and ext._speclimits_step is None  # no sampling follows: no step
    assert runner.execute_model(None) is None  # sampling follows: the step stays open
    step = ext._speclimits_step
    assert step is not None and step.drafted is None and not step.reqs
    assert runner.propose_draft_token_ids() == [[1, 2], [3]]
    assert step.drafted == [2, 1] and step.t_draft >= 2.0  # ms, the proposal's sleep
    assert runner.sample_tokens() == "tokens" and ext._speclimits_step is None  # closed
    assert ext.speclimits_drain() == []  # no target forward ran in the step: nothing recorded
    assert runner.drafter.model.compute_logits(5) == 5
    ext.speclimits_uninstall()
    assert not any(name in runner.__dict__ for name in wrapped)
    assert "compute_logits" not in runner.drafter.model.__dict__
