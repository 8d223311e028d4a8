"""Planted routing, the per-m fit of the per-expert cost, and benchmarks/bench_expert_cost.py on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclimits.planted import fit_expert_cost, planted_layers, planted_topk_ids, regime_step, u_bar_grid, u_bar_range
from speclimits.tracing.capture import unique_per_layer

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench_expert_cost as bench  # noqa: E402


@pytest.mark.parametrize("m,top_k,n_experts", [(1, 8, 128), (2, 8, 128), (5, 8, 128), (11, 8, 128), (11, 8, 64),
                                               (3, 4, 6), (7, 1, 5)])
def test_planted_routing_has_exactly_the_asked_unique_experts(m, top_k, n_experts):
    rng = np.random.default_rng(m * 100 + top_k)
    lo, hi = u_bar_range(m, top_k, n_experts)
    assert (lo, hi) == (top_k, min(m * top_k, n_experts))
    for u in range(lo, hi + 1):
        ids = planted_topk_ids(m, top_k, n_experts, u, rng)
        assert ids.shape == (m, top_k) and ids.dtype == np.int64
        assert np.unique(ids).size == u
        assert all(np.unique(row).size == top_k for row in ids)  # distinct experts per token
        assert ids.min() >= 0 and ids.max() < n_experts
    layers = planted_layers(6, m, top_k, n_experts, hi, rng)
    assert layers.shape == (6, m, top_k)
    assert (unique_per_layer(layers.swapaxes(0, 1)) == hi).all()


def test_planted_routing_draws_different_experts_and_spreads_them():
    rng = np.random.default_rng(0)
    unions = {tuple(np.unique(planted_topk_ids(4, 8, 128, 20, rng))) for _ in range(20)}
    assert len(unions) > 15  # which experts is random
    ids = planted_topk_ids(4, 8, 128, 32, rng)  # the full range: every token brings 8 of its own
    assert np.unique(ids).size == 32


@pytest.mark.parametrize("m,top_k,n_experts,u,match", [
    *[(m, 8, 128, u, "outside its range") for m, u in [(1, 7), (1, 9), (2, 17), (3, 0), (20, 129)]],
    (2, 9, 8, 9, "top_k"), (0, 8, 128, 8, "at least 1")])
def test_planted_routing_refuses_an_impossible_u_bar_or_shape(m, top_k, n_experts, u, match):
    with pytest.raises(ValueError, match=match):
        planted_topk_ids(m, top_k, n_experts, u, np.random.default_rng(0))


def test_u_bar_grid_keeps_both_ends():
    assert u_bar_grid(1, 8, 128) == [8]
    assert u_bar_grid(3, 8, 128) == list(range(8, 25))
    grid = u_bar_grid(11, 8, 128, points=5)
    assert grid[0] == 8 and grid[-1] == 88 and len(grid) == 5


def test_fit_is_exact_on_a_noiseless_line_and_names_what_it_cannot_fit():
    rows = [{"m": m, "u_bar": u, "t_ms": 2.0 + 0.1 * m + (0.05 if m < 5 else 0.2) * u}
            for m in range(1, 7) for u in u_bar_grid(m, 8, 128) for _ in range(2)]
    fit = fit_expert_cost(pd.DataFrame(rows)).set_index("m")
    assert np.isnan(fit.loc[1, "alpha"]) and "not identified" in fit.loc[1, "note"]
    assert fit.loc[1, "t_mean"] == pytest.approx(2.1 + 0.05 * 8)
    assert np.allclose(fit.loc[2:4, "alpha"], 0.05) and np.allclose(fit.loc[5:, "alpha"], 0.2)
    assert np.allclose(fit.loc[2:, "beta0"], 2.0 + 0.1 * fit.loc[2:].index)
    step = regime_step(fit.reset_index())
    assert step["step"] and step["largest_jump_at"] == "4/5"
    assert step["ratio_large_to_small"] == pytest.approx(4.0)


def test_the_synthetic_timer_recovers_the_planted_per_expert_cost():
    doc = bench.main(["--smoke", "--synthetic-alpha", "0.05", "--synthetic-noise", "0.02", "--repeats", "4",
                      "--quiet"])
    by_m = {r["m"]: r for r in doc["analysis"]["by_m"]}
    assert np.isnan(by_m[1]["alpha"])
    for m in range(2, 12):
        r = by_m[m]
        assert r["alpha_lo"] < 0.05 < r["alpha_hi"], m  # 95% intervals: all ten may hold it at this seed
        assert abs(r["alpha"] - 0.05) < 0.01
        assert r["beta0"] == pytest.approx(bench.SYNTH_BETA0 + bench.SYNTH_BETA0_SLOPE * m, abs=0.1)
    assert not doc["measured"] and doc["analysis"]["step"]["step"] is False


def test_the_small_cpu_run_completes_and_writes_a_well_formed_json(tmp_path):
    out, figs = tmp_path / "cpu.json", tmp_path / "figures.json"
    bench.main(["--smoke", "--m", "1-5", "--u-points", "3", "--repeats", "3", "--copy-mb", "16", "--out", str(out),
                "--json", str(figs), "--quiet"])
    doc = json.loads(out.read_text())
    assert doc["measured"] and doc["kind"] == "expert_cost" and doc["run"]["path"] == "gather"
    assert doc["machine"]["cpu"]["model"] and doc["machine"]["torch"] and doc["date_utc"].endswith("Z")
    assert "measured" in doc["regime"] and doc["regime"].startswith("CPU")
    n_configs = len(bench.configs(doc["shape"], doc["m"], doc["u_points"]))
    assert len(doc["samples"]) == 3 * n_configs and all(s["t_ms"] > 0 for s in doc["samples"])
    assert [r["m"] for r in doc["analysis"]["by_m"]] == [1, 2, 3, 4, 5]
    assert doc["analysis"]["by_m"][0]["alpha"] is None  # NaN written as null
    assert doc["floor"]["bytes_per_expert"] == 3 * 256 * 128 * 4 and doc["floor"]["ms_per_expert_all_layers"] > 0
    assert json.loads(figs.read_text())["figures"]
    again = bench.main(["--refit", str(out), "--out", str(tmp_path / "refit.json"), "--quiet"])
    assert again["analysis"]["by_m"][2]["alpha"] == pytest.approx(doc["analysis"]["by_m"][2]["alpha"])


def _dense_reference(stack, x, ids, weights):
    """Every routed (token, expert) pair one at a time, straight from the weights."""
    import torch

    x = x.clone()
    inter = stack.inter
    for layer in range(ids.shape[0]):
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j, e in enumerate(ids[layer, t]):
                w13, w2 = stack.w13[layer][e], stack.w2[layer][e]
                gate, up = w13[:inter] @ x[t], w13[inter:] @ x[t]
                y[t] += float(weights[t, j]) * (w2 @ (torch.nn.functional.silu(gate) * up))
        x = x + y
    return x


@pytest.mark.parametrize("path", ["gather", "grouped"])
def test_the_fused_paths_equal_a_dense_reference(path):
    import torch

    if path == "grouped" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    shape = {"hidden": 16, "inter": 8, "n_experts": 6, "top_k": 2, "n_layers": 3}
    stack = bench.MoEStack(shape, 3, torch.float32, "cpu", seed=1)
    rng = np.random.default_rng(2)
    for m, u in [(1, 2), (3, 4), (4, 6)]:
        ids = planted_layers(3, m, 2, 6, u, rng)
        weights = bench.routing_weights(m, 2, rng)
        x = torch.randn(m, 16, generator=torch.Generator().manual_seed(m))
        route = stack.to_device(stack.routing_arrays(ids, weights, path))
        got = stack.forward(x, route, path)
        torch.testing.assert_close(got, _dense_reference(stack, x, ids, weights), rtol=1e-5, atol=1e-5)
        if path == "gather":
            assert route["experts"].shape == (3, u)  # only the routed experts are read


def test_moe_shape_reads_config_spellings():
    shape = bench.moe_shape(bench.QWEN3_30B_A3B)
    assert (shape["hidden"], shape["inter"], shape["n_experts"], shape["top_k"], shape["n_layers"]) == (
        2048, 768, 128, 8, 48)
    assert bench.bytes_per_expert(shape, 2) == 9_437_184  # the paper's 9.4 MB
    deepseek = bench.moe_shape({"hidden_size": 7168, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                                "num_experts_per_tok": 8, "num_hidden_layers": 61, "first_k_dense_replace": 3})
    assert deepseek["n_experts"] == 256 and deepseek["n_layers"] == 58


def test_the_book_view_reads_runs_and_says_whether_a_gpu_run_exists(tmp_path):
    from speclimits.book.views import expert_cost as view

    bench.main(["--smoke", "--synthetic-alpha", "0.05", "--repeats", "3", "--out", str(tmp_path / "a.json"),
                "--quiet"])
    (tmp_path / "other.json").write_text('{"kind": "something else"}')
    runs = view.load_runs(tmp_path)
    assert [r["file"] for r in runs] == ["a.json"]
    table = view.alpha_table(runs)
    assert list(table["m"]) == list(range(1, 12))
    assert table.loc[0, "α by experiment (ms/expert)"] == view.MISSING  # m = 1: not identified
    assert table.loc[1, "α by experiment (ms/expert)"].startswith("0.0")
    assert table.loc[1, "Paper α, regression (ms/expert)"] == "0.078–0.084"
    assert table.loc[5, "Paper α, regression (ms/expert)"] == "0.264–0.268"
    assert table.loc[5, "α / paper"] == view.MISSING  # not the paper's shape
    step = view.step_table(runs)
    assert step.loc[0, "Step at 4/5"] == "no"
    assert "No GPU run is committed" in view.summary(runs)
    gpu = json.loads((tmp_path / "a.json").read_text())
    gpu["machine"]["device"], gpu["regime"] = "cuda", "GPU NVIDIA H200, Qwen3-30B-A3B shape, measured"
    (tmp_path / "b.json").write_text(json.dumps(gpu))
    runs = view.load_runs(tmp_path)
    assert len(runs) == 2 and "No GPU run" not in view.summary(runs)
    assert view.run_label(runs[1]).startswith("GPU NVIDIA H200")
    assert "nothing measured" in view.summary(view.load_runs(tmp_path / "empty"))


def test_the_committed_cpu_run_is_labelled_measured_with_its_machine():
    from speclimits.book.views import expert_cost as view

    runs = {r["file"]: r for r in view.load_runs()}
    cpu = runs["cpu-small.json"]
    assert cpu["measured"] and cpu["regime"].startswith("CPU ") and cpu["regime"].endswith("measured")
    assert cpu["machine"]["cpu"]["model"] in cpu["regime"]
    assert len(view.alpha_table([cpu])) == 11
