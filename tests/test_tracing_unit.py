"""Tracing harness pieces that need no engine: counting, capture buffer, prompts, rows, CLI guard."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from speclimits.errors import SpeclimitsError
from speclimits.tracing.capture import cumulative_unique, new_experts, u_bar_e_max, unique_per_layer
from speclimits.tracing.oracle_mode import Reference, oracle_rows, plan_requests
from speclimits.tracing.prompts import read_prompts
from speclimits.tracing.records import generation_tables
from speclimits.tracing.sweep import parse_k


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
        u, e = u_bar_e_max(rows, n_exp)
        assert u == pytest.approx(cum[-1].mean()) and e == cum[-1].max()
    # negative ids (never-written buffer rows) are not experts
    assert unique_per_layer(np.array([[[-1, 3]], [[3, 4]]]), 8).tolist() == [2]


def test_new_experts_by_hand():
    prev = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    cur = np.array([[0, 1, 8, 9], [4, 5, 6, 7]])
    assert new_experts(prev, cur) == pytest.approx((2 + 0) / 2)


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
    got = cap.read(3)
    assert got.dtype == np.int16 and got.shape == (3, 3, 2)
    for layer in range(3):
        np.testing.assert_array_equal(got[:, layer], ids[layer].numpy())
    # a smaller later forward overwrites only its rows; the buffer never moves (CUDA-graph safety)
    routers[0].capture_fn(torch.tensor([[7, 7]], dtype=torch.int32))
    assert cap.buffer.data_ptr() == address
    assert cap.read(1)[0, 0].tolist() == [7, 7] and cap.read(2)[1, 0].tolist() == [3, 4]
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


def test_generation_tables_truncation_and_producing_rows():
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
    # producing rows: prefill's last row, then rows 0..2 of round 1, then row 0 of round 2
    assert [int(e[0]) for e in tokens["experts"]] == [6, 1, 2, 3, 1]
    assert tokens["round"].tolist() == [0, 1, 1, 1, 2] and tokens["row"].tolist() == [3, 0, 1, 2, 0]
    assert tokens["new_experts"].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
    assert tokens["context_len"].tolist() == [4, 5, 6, 7, 8]
    # a fully accepted round's u_bar equals the unique experts over its tokens
    full = rounds.index[(rounds["phase"] == "decode") & (rounds["n_emitted"] == rounds["m"])]
    for i in full:
        ex = np.stack(tokens.loc[tokens["round"] == i, "experts"].to_list())
        assert rounds.loc[i, "u_bar"] == len(set(ex.ravel()))
    with pytest.raises(SpeclimitsError, match="saw 6 sampled tokens but vLLM returned 7"):
        generation_tables(steps, output_ids=list(range(7)), generation_id=7, prompt_id="p", K=2, top_k=1)


def test_oracle_rows_from_results():
    ref = Reference("s", prompt_ids=(1, 2, 3), output_ids=(10, 11, 12, 13))  # states 0..2
    plan = plan_requests(ref, k_max=2)
    assert plan[0] == (0, [1, 2, 3], 10, [11, 12])
    assert plan[2] == (2, [1, 2, 3, 10, 11], 12, [13, -1])
    results = {}
    for pos, _, _, chain in plan:
        draft = [t if t >= 0 else 99 for t in chain]
        if pos == 1:
            draft[1] = 77  # second draft wrong
        results[pos] = {"draft_conf": np.array([0.9, 0.8]), "draft_tokens": np.array(draft),
                        "chain_prob": np.array([0.5 + 0.1 * pos, 0.3]),
                        "u_window": np.array([[2, 2], [3, 2], [4, 3]]), "n_sampled_verify": 3}
    df = oracle_rows(ref, 2, results, n_experts=8)
    assert df["pos"].tolist() == [0, 1, 2] and df["context_len"].tolist() == [3, 4, 5]
    assert df["accept_len"].tolist() == [2, 1, 1]  # last state: only one reference token left
    # teacher-forced match prob = step-1 prob at successive states; 0 past the end
    np.testing.assert_allclose(np.stack(df["match_prob"]), [[0.5, 0.6], [0.6, 0.7], [0.7, 0.0]])
    np.testing.assert_allclose(df["u_bar_window"].iloc[0], [2.0, 2.5, 3.5])
    with pytest.raises(SpeclimitsError, match="states \\[1\\]"):
        oracle_rows(ref, 2, {0: results[0], 2: results[2]}, n_experts=8)


def test_import_is_lazy_and_trace_without_vllm_says_how_to_install(tmp_path):
    code = (
        "import sys\n"
        "import speclimits, speclimits.cli, speclimits.tracing.cli, speclimits.tracing.sweep\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'vllm' in m)\n"
        "speclimits.cli.build_parser()\n"
        "sys.modules['vllm'] = None  # behave as if vLLM were not installed\n"
        "rc = speclimits.cli.main(['trace', '--target', 'x', '--prompts', 'p.jsonl', '--out', 'o'])\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "pip install -e '.[trace]'" in proc.stderr
