"""The simulator's batch mode: the batch-trace contract, the planted truth, independent routing of
the requests of a step (a counted union of expert ids), determinism, and the CLI."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from speclimits import paper
from speclimits.cli import main
from speclimits.costmodel import BatchCostModel, CostModel, union_unique
from speclimits.errors import SpeclimitsError
from speclimits.simulate import BatchSim, moe, paper_cost_model, preset, simulate, simulate_batch
from speclimits.trace import read_trace, validate_trace

SIZES = (1, 2, 4, 8)
SIZE = dict(n_prompts=20, k_values=(0, 1, 3, 6))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    cfg = preset("smoke", **SIZE)
    out = tmp_path_factory.mktemp("simb") / "t"
    tables = simulate_batch(cfg, BatchSim(batch_sizes=SIZES), seed=3, out=out, progress=False)
    return cfg, tables, out


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.glob("*.parquet"))}


def test_same_seed_same_bytes(sim, tmp_path):
    cfg, _, out = sim
    simulate_batch(cfg, BatchSim(batch_sizes=SIZES), seed=3, out=tmp_path / "again", progress=False)
    assert _digest(tmp_path / "again") == _digest(out)
    simulate_batch(cfg, BatchSim(batch_sizes=SIZES), seed=4, out=tmp_path / "other", progress=False)
    assert _digest(tmp_path / "other")["steps.parquet"] != _digest(out)["steps.parquet"]


def test_contract_columns_ids_and_validation(sim):
    cfg, tables, out = sim
    rounds, steps = tables["rounds"], tables["steps"]
    validate_trace(out)
    expected = ["batch_id", "b", "K", "step", "n_reqs", "n_decode", "n_tokens", "m_max", "u_bar", "e_max",
                "context_total", "t_target_ms", "t_draft_ms", "graph_bucket", "kv_usage", "phase", "n_drafted_next"]
    assert list(steps.columns) == expected
    assert {"b", "batch_id", "step", "n_drafted_next"} <= set(rounds.columns)
    assert not steps.duplicated(["batch_id", "step"]).any()
    assert set(steps["phase"]) <= {"prefill", "decode", "mixed"}
    # generation ids: (b_index * n_K + k_index) * n_prompts + prompt_index; batch_id = first generation
    n_k, n_p = len(SIZE["k_values"]), SIZE["n_prompts"]
    gen = rounds.drop_duplicates("generation_id")
    b_index = gen["b"].map({b: i for i, b in enumerate(SIZES)})
    k_index = gen["K"].map({k: i for i, k in enumerate(SIZE["k_values"])})
    prompt = gen["prompt_id"].str.slice(1).astype(int)
    assert ((b_index * n_k + k_index) * n_p + prompt == gen["generation_id"]).all()
    assert ((gen["batch_id"] - (b_index * n_k + k_index) * n_p) == prompt // gen["b"] * gen["b"]).all()
    assert len(gen) == len(SIZES) * n_k * n_p
    # per step: requests, rows, context and phase agree with the rounds
    agg = rounds.groupby(["batch_id", "step"]).agg(n=("m", "size"), rows=("m", "sum"), m_max=("m", "max"),
                                                   ctx=("context_len", "sum"),
                                                   n_dec=("phase", lambda p: int((p == "decode").sum())))
    s = steps.set_index(["batch_id", "step"]).loc[agg.index]
    assert (s["n_reqs"] == agg["n"]).all() and (s["n_tokens"] == agg["rows"]).all()
    assert (s["m_max"] == agg["m_max"]).all() and (s["context_total"] == agg["ctx"]).all()
    assert (s["n_decode"] == agg["n_dec"]).all()
    assert (s["n_drafted_next"] == s["K"] * s["n_reqs"]).all()
    # the rounds carry their step's times
    joined = rounds.merge(steps[["batch_id", "step", "t_target_ms", "t_draft_ms"]], on=["batch_id", "step"],
                          suffixes=("", "_step"), how="left")
    assert np.array_equal(joined["t_target_ms"], joined["t_target_ms_step"])
    assert (steps.loc[steps["K"] == 0, "t_draft_ms"] == 0).all()
    # a closed batch: every request emits its whole reference, whatever b and K
    emitted = rounds.groupby(["prompt_id", "b", "K"])["n_emitted"].sum().unstack(["b", "K"])
    assert (emitted.nunique(axis=1) == 1).all()
    # requests of a batch are never more than b, and the batch shrinks as they finish
    assert (steps["n_reqs"] <= steps["b"]).all()
    assert steps.loc[steps["b"] == 8, "n_reqs"].nunique() > 4


def test_step_union_is_counted_from_the_requests_expert_ids(sim):
    """A step's Ū is at least its largest request's own Ū and at most their sum (and E); at b = 1 it
    is the request's own; prefill steps touch most experts."""
    cfg, tables, _ = sim
    rounds, steps = tables["rounds"], tables["steps"]
    agg = rounds.groupby(["batch_id", "step"])["u_bar"].agg(["max", "sum"])
    s = steps.set_index(["batch_id", "step"]).loc[agg.index]
    assert (s["u_bar"] >= agg["max"] - 1e-9).all()
    assert (s["u_bar"] <= np.minimum(agg["sum"], cfg.n_experts) + 1e-9).all()
    one = s["b"] == 1
    assert np.allclose(s.loc[one, "u_bar"], agg.loc[one.to_numpy(), "max"])
    assert steps.loc[steps["phase"] == "prefill", "u_bar"].median() > 0.9 * cfg.n_experts  # prompts nearly saturate
    assert (s["e_max"] >= s["u_bar"]).all() and (s["e_max"] <= cfg.n_experts).all()
    # K = 0 at b = 1: one token, top_k experts in every layer
    plain = steps[(steps["b"] == 1) & (steps["K"] == 0) & (steps["phase"] == "decode")]
    assert (plain["u_bar"] == cfg.top_k).all()


def test_expert_sets_route_independently():
    """The ids drawn per (row, layer) are sets of exactly the planned size, and the union of
    independent sets matches union_unique layer by layer within sampling error."""
    rng = np.random.default_rng(0)
    E, L = 128, 48
    sizes = rng.integers(8, 60, size=(16, L))
    packed = moe._expert_sets(sizes, E, rng)
    assert packed.shape == (16, L, 16) and np.array_equal(np.bitwise_count(packed).sum(axis=-1), sizes)
    draws = np.stack([np.bitwise_count(np.bitwise_or.reduce(moe._expert_sets(sizes, E, rng), axis=0)).sum(axis=-1)
                      for _ in range(200)])  # (200, L): the union of the 16 requests per layer
    expected = union_unique(sizes, E, axis=0)
    z = (draws.mean(axis=0) - expected) / (draws.std(axis=0, ddof=1) / np.sqrt(len(draws)) + 1e-12)
    assert np.abs(z).max() < 4.5 and abs(z.mean()) < 0.5


def test_planted_truth_and_step_times(sim):
    cfg, tables, out = sim
    truth = BatchSim().truth(cfg)
    # the batch-1 part is the simulator's paper truth
    base = CostModel.from_dict(paper_cost_model())
    assert (truth.base.beta0, truth.base.alpha, truth.base.c, truth.base.a, truth.base.b) == (
        base.beta0, base.alpha, base.c, base.a, base.b)
    assert (truth.base.a, truth.base.b) == (paper.DRAFT["a"][0], paper.DRAFT["b"][0])
    # the per-request terms are the module's planted constants
    assert truth.gamma == {m: pytest.approx(moe.BATCH_GAMMA_BASE + moe.BATCH_GAMMA_PER_ROW * m) for m in base.ms}
    assert (truth.a_req, truth.b_req) == (moe.BATCH_A_REQ, moe.BATCH_B_REQ)
    assert (truth.n_experts, truth.top_k) == (128, 8) == (cfg.n_experts, cfg.top_k)
    assert cfg.n_layers == 48
    # and the trace says so
    tr = read_trace(out)
    assert tr.simulated and tr.meta["simulated"] is True and "SIMULATED" in tr.meta["description"]
    assert BatchCostModel.from_dict(tr.meta["truth"]) == truth
    assert tr.meta["batch_sizes"] == list(SIZES) and tr.meta["batch_size"] == max(SIZES)
    assert tr.meta["batch_simulator"]["gamma_base"] == moe.BATCH_GAMMA_BASE
    assert "not the paper" in tr.meta["description"]
    # on decode steps the target and drafter times are the planted model's times noise (median relative
    # residual near 0, spread as configured)
    steps = tables["steps"]
    dec = steps[(steps["phase"] == "decode") & (steps["t_target_ms"] > 0)]
    mean = truth.target_ms(dec["n_reqs"], dec["K"] + 1, dec["u_bar"], dec["context_total"])
    rel = (dec["t_target_ms"] - mean) / mean
    assert abs(np.median(rel)) < 1e-3 and np.median(np.abs(rel)) < 5 * cfg.target_noise_rel
    drf = dec[(dec["K"] > 0) & (dec["t_draft_ms"] > 0)]
    rel_d = (drf["t_draft_ms"] - truth.draft_ms(drf["n_reqs"], drf["K"])) / truth.draft_ms(drf["n_reqs"], drf["K"])
    assert abs(np.median(rel_d)) < 2e-3
    # the per-request terms matter: at b = 8 a step costs more than its batch-1 part says
    big = dec[dec["n_reqs"] == 8]
    batch1 = truth.base.target_ms(big["K"] + 1, big["u_bar"], big["context_total"])
    assert (big["t_target_ms"] > batch1).mean() > 0.99


def test_oracle_and_tokens_tables_are_the_batch1_simulators(sim):
    cfg, tables, _ = sim
    one = simulate(cfg, seed=3, progress=False)
    pd.testing.assert_frame_equal(tables["oracle"], one["oracle"])
    pd.testing.assert_frame_equal(tables["tokens"], one["tokens"])
    # the request rounds at b = 1 walk the same states as the batch-1 trace (its K = 0 runs cover
    # k0_share of the prompts; the batch mode runs every prompt at every K)
    r = tables["rounds"]
    mine = r[(r["b"] == 1) & (r["K"] == 3)].reset_index(drop=True)
    theirs = one["rounds"][one["rounds"]["K"] == 3].reset_index(drop=True)
    for col in ("prompt_id", "round", "m", "n_accepted", "n_emitted", "context_len", "phase"):
        assert mine[col].tolist() == theirs[col].tolist(), col
    dec = mine["phase"] == "decode"
    assert np.allclose(mine.loc[dec, "u_bar"], theirs.loc[dec, "u_bar"])  # the same windows' own Ū


def test_prefill_budget_makes_mixed_steps():
    cfg = preset("smoke", n_prompts=16, k_values=(0, 2))
    few = simulate_batch(cfg, BatchSim(batch_sizes=(16,), prefill_budget=600), seed=1, progress=False)["steps"]
    many = simulate_batch(cfg, BatchSim(batch_sizes=(16,), prefill_budget=10**6), seed=1, progress=False)["steps"]
    assert (few["phase"] == "mixed").sum() > 0 and (many["phase"] == "mixed").sum() == 0
    assert (many["phase"] == "prefill").sum() == 2  # one prefill step per K
    with pytest.raises(SpeclimitsError, match="positive"):
        simulate_batch(cfg, BatchSim(batch_sizes=(0, 2)), progress=False)


def test_cli_batch_mode(tmp_path, capsys):
    out = tmp_path / "tr"
    assert main(["simulate", "--preset", "smoke", "--quiet", "--set", "n_prompts=8", "--set", "k_values=[0,2]",
                 "--batch", "1,2,4", "--out", str(out)]) == 0
    assert "SIMULATED batch trace" in capsys.readouterr().out
    tr = read_trace(out)
    assert tr.meta["batch_sizes"] == [1, 2, 4] and (out / "steps.parquet").exists()
    validate_trace(out)
    # --batch 1 is today's batch-1 trace
    one = tmp_path / "one"
    assert main(["simulate", "--preset", "smoke", "--quiet", "--set", "n_prompts=8", "--batch", "1",
                 "--out", str(one)]) == 0
    assert not (one / "steps.parquet").exists() and read_trace(one).meta["batch_size"] == 1
    assert main(["simulate", "--preset", "smoke", "--batch", "0,2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--batch needs at least one batch size >= 1" in err and len(err.strip().splitlines()) == 1
