"""The analysis on the trace a user brings (issue 41): any K grid and sparse m cells through ``speclimits fit``
and ``oracle --cost-model``, the skipped tables named; bad input to ``trace``, ``fit`` and ``oracle`` is one
line and exit code 2, checked before vLLM is imported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclimits.cli import main
from speclimits.costmodel import CostModel
from speclimits.tracing.inputs import parse_k

SMOOTH = {"linear": "smooth form 'linear m (β0 and α linear in m)'", "quadratic": "smooth form 'quadratic m'",
          "log": "smooth form 'log m'", "hinge": "smooth form 'hinge after m = 4 (fixed)'"}
INTERP = "interpolation within a regime"

#: K grid -> the tables ``speclimits fit`` skips on it (every other table is computed).
GRIDS = {
    "0,2,4": {"leave-one-K-out", *SMOOTH.values(), INTERP},
    "0-4": {SMOOTH["hinge"]},
    "0,2,4,6": {SMOOTH["quadratic"], SMOOTH["hinge"], INTERP},
    "1-6": set(),
}


def _fit(trace: Path, out: Path, capsys, *extra: str) -> tuple[dict, str]:
    code = main(["fit", str(trace), "--json", "--n-boot", "49", "--out", str(out), *extra])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out), cap.err


@pytest.mark.parametrize("grid", list(GRIDS))
def test_fit_writes_the_cost_model_and_names_what_it_skips(grid, grid_traces, tmp_path, capsys):
    trace = grid_traces[grid]
    printed, err = _fit(trace, tmp_path / "cm.json", capsys)
    cm = CostModel.read(tmp_path / "cm.json")
    ks = parse_k(grid)
    m_lo = 1 if 0 in ks else min(ks) + 1
    assert cm.ms == list(range(m_lo, max(ks) + 2))  # gaps in the grid are interpolated
    missing = sorted(set(range(m_lo, max(ks) + 2)) - {k + 1 for k in ks})
    assert cm.extra["fit"]["target"].get("interpolated_m", []) == missing
    assert set(printed["skipped"]) == GRIDS[grid]
    assert set(printed["final"]["skipped"]) == GRIDS[grid]
    for name, why in printed["skipped"].items():
        assert "needs" in why and "this trace: K = " in why  # what it needs and what the trace has
        assert f"speclimits fit: skipped {name}: " in err
    final = printed["final"]
    assert final["per_k"] and final["comparison"] is not None and final["pooled"] is not None
    assert (final["leave_one_k_out"] is None) == ("leave-one-K-out" in GRIDS[grid])
    assert printed["draft"] is not None
    # the Oracle accepts the written cost model on the trace's own Oracle data
    assert main(["oracle", str(trace), "--cost-model", str(tmp_path / "cm.json"), "--n-boot", "19", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ms_per_token"] > 0


def test_fit_text_output_lists_the_skipped_tables(grid_traces, tmp_path, capsys):
    assert main(["fit", str(grid_traces["0,2,4"]), "--n-boot", "9", "--out", str(tmp_path / "cm.json")]) == 0
    out = capsys.readouterr().out
    assert "skipped leave-one-K-out: leave-one-K-out needs >= 3 values of K > 0 (this trace: K = 2, 4;" in out
    assert out.rstrip().endswith(f"wrote cost model {tmp_path / 'cm.json'}")


# -- sparse m cells (the shape of an n-gram or draft-model trace) --


def _thin(src: Path, dst: Path, keep: dict[int, tuple[int, int]]) -> Path:
    """Copy ``src`` to ``dst`` keeping, for each K of ``keep`` (K -> (n_gen, n_rounds)), the first n_gen
    generations and their first n_rounds decode rounds."""
    shutil.copytree(src, dst)
    rounds = pd.read_parquet(dst / "rounds.parquet")
    drop = np.zeros(len(rounds), bool)
    for k, (n_gen, n_rounds) in keep.items():
        at_k = rounds["K"].to_numpy() == k
        gens = sorted(rounds.loc[at_k, "generation_id"].unique())[:n_gen]
        kept_gen = at_k & rounds["generation_id"].isin(gens).to_numpy()
        late = (rounds["phase"].astype(str).to_numpy() == "decode") & (rounds["round"].to_numpy() > n_rounds)
        drop |= (at_k & ~kept_gen) | (kept_gen & late)
    rounds.loc[~drop].reset_index(drop=True).to_parquet(dst / "rounds.parquet")
    return dst


@pytest.fixture(scope="module")
def sparse_trace(grid_traces, tmp_path_factory):
    """K = 0..4 with m = 4 and m = 5 thinned to a handful of rounds: 2 generations x 5 rounds at
    K = 3, 1 generation x 3 rounds at K = 4."""
    return _thin(grid_traces["0-4"], tmp_path_factory.mktemp("sparse") / "tr", {3: (2, 5), 4: (1, 3)})


@pytest.fixture(scope="module")
def ngram_like_trace(grid_traces, tmp_path_factory):
    """One K > 0 of mostly m = 1 rounds, as an n-gram sweep: the K = 0 generations copied as K = 4, three of them
    with a few rounds of their prompt's K = 1, 2 and 4 generations (m = 2, 3, 5); the K = 0 generations kept."""
    src = grid_traces["0-4"]
    dst = tmp_path_factory.mktemp("ngram") / "tr"
    shutil.copytree(src, dst)
    rounds = pd.read_parquet(dst / "rounds.parquet")
    base = rounds[rounds["K"] == 0]
    parts = [rounds[rounds["K"] == 0]]
    next_id = int(rounds["generation_id"].max()) + 1
    for i, (gen, rows) in enumerate(base.groupby("generation_id")):
        prompt = rows["prompt_id"].iloc[0]
        new = rows.copy()
        new["K"], new["generation_id"] = 4, next_id
        extra = []
        if i < 3:  # three generations carry the drafted rounds
            for k, n in ((1, 4), (2, 4), (4, 2)):
                src_rows = rounds[(rounds["K"] == k) & (rounds["prompt_id"] == prompt)
                                  & (rounds["phase"].astype(str) == "decode")].head(n).copy()
                src_rows["K"], src_rows["generation_id"] = 4, next_id
                extra.append(src_rows)
        parts.append(pd.concat([new, *extra], ignore_index=True))
        next_id += 1
    out = pd.concat(parts, ignore_index=True)
    out.to_parquet(dst / "rounds.parquet")
    return dst


def test_sparse_cells_are_pooled_and_named(sparse_trace, tmp_path, capsys):
    printed, _ = _fit(sparse_trace, tmp_path / "cm.json", capsys)
    cm = CostModel.read(tmp_path / "cm.json")
    assert cm.ms == [1, 2, 3, 4, 5]
    target = cm.extra["fit"]["target"]
    assert target["pooled_m"] == {"3,4,5": [3, 4, 5]}
    assert cm.alpha[3] == cm.alpha[4] == cm.alpha[5] and cm.beta0[3] == cm.beta0[5]
    notes = " ".join(cm.extra["fit"]["notes"])
    assert "sparse cells pooled: m = 3,4,5" in notes and "m = 5: 3 rounds / 1 generations" in notes
    assert printed["final"]["joint"]["pooling"]["pooled"] == {"3,4,5": [3, 4, 5]}
    assert main(["oracle", str(sparse_trace), "--cost-model", str(tmp_path / "cm.json"), "--n-boot", "49"]) == 0
    capsys.readouterr()


def test_ngram_like_trace_fits_and_its_bootstraps_survive(ngram_like_trace, tmp_path, capsys):
    printed, err = _fit(ngram_like_trace, tmp_path / "cm.json", capsys, "--n-boot", "199")
    cm = CostModel.read(tmp_path / "cm.json")
    assert cm.ms == [1, 2, 3, 4, 5]
    target = cm.extra["fit"]["target"]
    assert target["pooled_m"] == {"2,3,5": [2, 3, 5]} and target["interpolated_m"] == [4]
    notes = " ".join(cm.extra["fit"]["notes"])
    assert "one value of K > 0 (K = 4)" in notes  # the draft line through the origin
    assert cm.b == 0.0 and cm.a > 0
    skipped = printed["skipped"]
    assert {"pooled model (γ·K)", "leave-one-K-out", "comparison (Ū + L, pooled, categorical)",
            "draft-model section"} <= set(skipped)
    assert "needs >= 2 values of K > 0" in skipped["pooled model (γ·K)"]
    # the cluster bootstrap resampled generations within K = 4: replicates that drew none of the
    # three generations with drafts cannot fit the pooled group; they are counted, not raised
    final_notes = " ".join(printed["final"]["notes"])
    assert "resamples missed every generation of a cell" in final_notes
    code = main(["oracle", str(ngram_like_trace), "--cost-model", str(tmp_path / "cm.json"), "--n-boot", "49"])
    assert code == 0
    capsys.readouterr()
    # and the Oracle's own cost-model bootstrap (refit from the trace's rounds) survives as well
    assert main(["oracle", str(ngram_like_trace), "--n-boot", "99", "--json"]) == 0
    cap = capsys.readouterr()
    interval = json.loads(cap.out)["headline"]["interval"]
    assert interval["n_boot"] + interval["n_failed"] == 99
    if interval["n_failed"]:
        assert "bootstrap replicates missed every generation" in cap.err


@pytest.mark.parametrize("from_meta", [True, False])
def test_the_weighted_fit_at_unit_weights_is_the_full_fit(ngram_like_trace, from_meta):
    """Unit weights give the full sample's model under every design rule this trace exercises (sparse m pooled,
    an m interpolated, the m = 1 convention, the draft line through the origin); weight 0 leaves a generation out."""
    from speclimits.stats.costfit import CostMoments, fit_costs
    from speclimits.trace import read_trace

    tr = read_trace(ngram_like_trace)
    mom = CostMoments.of(tr.rounds, tr.top_k if from_meta else None)
    (full,) = fit_costs(mom)
    assert full.extra["fit"]["target"]["pooled_m"] and full.extra["fit"]["target"]["interpolated_m"] == [4]
    assert full.b == 0.0 and not all(full.extra["fit"]["target"]["alpha_identified"].values())
    unit, dropped = fit_costs(mom, np.stack([np.ones(mom.n_generations), np.r_[0.0, np.ones(mom.n_generations - 1)]]))
    for got, want in ((unit, full), (dropped, fit_costs(CostMoments.of(
            tr.rounds[tr.rounds["generation_id"] != tr.rounds["generation_id"].min()], mom.top_k))[0])):
        assert got.ms == want.ms and got.b == want.b == 0.0 and not got.extra
        np.testing.assert_allclose([got.c, got.a, *got.beta0.values(), *got.alpha.values()],
                                   [want.c, want.a, *want.beta0.values(), *want.alpha.values()], rtol=1e-11)


def test_pool_sparse_m_rule_by_hand():
    from speclimits.stats import CellMoments
    from speclimits.stats.costfit import pool_sparse_m

    rng = np.random.default_rng(0)
    rows = []
    for m, n_gen, per_gen in ((1, 6, 30), (2, 6, 10), (3, 2, 5), (4, 1, 4), (6, 2, 20)):
        for g in range(n_gen):
            for _ in range(per_gen):
                rows.append({"generation_id": 100 * m + g, "K": m - 1, "m": m, "t_target_ms": 1.0 + rng.random(),
                             "u_bar": 4 + m * rng.random(), "context_len": 100 + rng.integers(50)})
    mom = CellMoments.from_rounds(pd.DataFrame(rows), base=("u_bar", "context_len"))
    rule = pool_sparse_m(mom)
    # m = 3 (10 rounds) and 4 (4 rounds) are sparse; with m = 6 the group has 54 rounds from 5 generations
    assert rule.groups == ((1,), (2,), (3, 4, 6))
    assert rule.pooled == {"3,4,6": [3, 4, 6]}
    full = pool_sparse_m(mom, min_rounds=1, min_generations=1)
    assert full.groups == ((1,), (2,), (3,), (4,), (6,)) and not full.notes
    # a sparse group at the top joins the one below
    top = pool_sparse_m(mom.subset(mom.cells["m"].to_numpy() <= 4))
    assert top.groups == ((1,), (2, 3, 4))


def test_solve_batch_counts_replicates_that_miss_a_cell():
    from speclimits.stats._ols import failed_replicates, solve_batch

    good = np.array([[2.0, 1.0], [1.0, 3.0]])
    xtx = np.stack([good, np.array([[2.0, 0.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [1.0, 1.0]])])
    xty = np.array([[1.0, 2.0], [1.0, 0.0], [1.0, 1.0]])
    beta = solve_batch(xtx, xty)
    assert np.allclose(beta[0], np.linalg.solve(good, xty[0]))
    assert failed_replicates(beta) == 2


# -- one line for bad input --


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(prefix), err
    return err


def test_oracle_on_a_trace_without_oracle_data(grid_traces, tmp_path, capsys):
    trace = tmp_path / "no-oracle"
    shutil.copytree(grid_traces["1-6"], trace)
    (trace / "oracle.parquet").unlink()
    assert main(["oracle", str(trace)]) == 2
    err = _one_line(capsys, "speclimits oracle: error: ")
    assert "this trace has no Oracle data (traced without --oracle)" in err
    assert main(["fit", str(trace), "--n-boot", "9", "--out", str(tmp_path / "cm.json")]) == 0  # fit still works
    capsys.readouterr()


@pytest.fixture()
def no_vllm(monkeypatch):
    """Fail the test if ``speclimits trace`` reaches the vLLM import."""
    from speclimits.tracing import engine

    def refuse():
        raise AssertionError("the check should have failed before the vLLM import")

    monkeypatch.setattr(engine, "require_vllm", refuse)


def _model_dir(tmp_path: Path, vocab: int = 100) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "vocab_size": vocab}))
    return d


def _prompts(tmp_path: Path, ids: list[int]) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"id": "ok", "prompt_token_ids": [1, 2, 3]}) + "\n"
                 + json.dumps({"id": "far", "prompt_token_ids": ids}) + "\n")
    return p


@pytest.mark.parametrize("case, change, expect", [
    ("missing-target", {"--target": "/no/such/model"}, "--target /no/such/model: no such folder"),
    ("bad-k", {"--k": "3-1"}, "--k expects e.g. '1-10' or '0,1,2,4', got '3-1'"),
    ("bad-batch", {"--batch": "x"}, "--batch expects e.g. '1,2,4,8' or '1-4', got 'x'"),
    ("missing-draft", {"--method": "draft_model", "--draft": "/no/such/head"}, "--draft /no/such/head: no such folder"),
    ("no-draft", {"--method": "eagle3"}, "--method eagle3 needs --draft DIR"),
    ("vocab", {}, "prompt 'far': prompt_token_ids has token id 500 (position 1), beyond the vocabulary"),
    ("no-config", {}, "the folder has no config.json"),
    ("ngram-oracle", {"--oracle": None}, "--oracle reads the draft's probabilities; --method ngram has none"),
])
def test_trace_bad_input_is_one_line_before_vllm(case, change, expect, tmp_path, capsys, no_vllm):
    model = _model_dir(tmp_path)
    prompts = _prompts(tmp_path, [7, 500, 3] if case == "vocab" else [7, 8])
    args = {"--target": str(model), "--prompts": str(prompts), "--out": str(tmp_path / "tr"), "--k": "0,2",
            "--method": "ngram", **change}
    if case == "no-config":
        (model / "config.json").unlink()
    assert main(["trace"] + [v for kv in args.items() for v in kv if v is not None]) == 2
    err = _one_line(capsys, "speclimits trace: error: ")
    assert expect in err
    if case == "vocab":
        assert "vocab_size 100" in err and str(prompts) in err


def test_engine_construction_failure_is_one_line(tmp_path):
    from speclimits.errors import SpeclimitsError
    from speclimits.tracing.engine import build_engine

    model = _model_dir(tmp_path)

    class FakeVllm:
        @staticmethod
        def LLM(**kwargs):  # noqa: N802 - vLLM's name
            raise ValueError("No common block size for 16\n(a long explanation follows)")

    with pytest.raises(SpeclimitsError) as exc:
        build_engine(FakeVllm, {"model": str(model), "speculative_config": {"method": "draft_model",
                                                                            "num_speculative_tokens": 3,
                                                                            "model": "/d"}})
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == (f"vLLM could not build the engine for MixtralForCausalLM ({model}) with draft_model K = 3, "
                   "draft /d: ValueError: No common block size for 16 (inside vLLM)")


def test_an_arm_that_drafted_nothing_is_named(tmp_path):
    from speclimits.tracing.inputs import drafted_nothing

    rounds = pd.DataFrame({"K": [0, 0, 2, 2, 2, 4, 4], "phase": ["prefill", "decode", "prefill", "decode", "decode",
                                                                 "decode", "decode"],
                           "n_draft": [0, 0, 0, 0, 0, 4, 1]})
    rounds.to_parquet(tmp_path / "rounds.parquet")
    warnings = drafted_nothing(tmp_path, "ngram")
    assert len(warnings) == 1
    assert warnings[0].startswith("K = 2 (ngram) drafted nothing in 2 decode rounds")
    assert "prompt_lookup_min" in warnings[0]


@pytest.mark.parametrize("command", ["fit", "oracle", "factors"])
def test_help_prints_percent_signs_once(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "%%" not in out and "95%" in out
    if command == "fit":  # the minimum sweep
        out = " ".join(out.split())
        assert "leave-one-K-out and the linear and log-m forms need >= 3" in out
        assert "is pooled with its neighbour" in out


def test_one_default_dtype_for_every_engine_command():
    import inspect

    from speclimits.cli import build_parser
    from speclimits.bench import engines as control_engine
    from speclimits.tracing.sweep import SweepConfig
    from speclimits.vocabulary import DEFAULT_DTYPE

    assert DEFAULT_DTYPE == "float32"
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    # left unset, --dtype resolves to the default wherever the CPU's engine can run it (test_machine.py)
    assert sub.choices["trace"].get_default("dtype") is None
    assert SweepConfig.__dataclass_fields__["dtype"].default == DEFAULT_DTYPE
    for name, fn in inspect.getmembers(control_engine, inspect.isfunction):
        param = inspect.signature(fn).parameters.get("dtype")
        if param is not None and fn.__module__ == control_engine.__name__:
            assert param.default == DEFAULT_DTYPE, name


@pytest.mark.parametrize("path, source, during, expect", [
    ("site-packages/vllm/_custom_ops.py",
     "def f():\n    raise RuntimeError('Unsupported CPU attention configuration: head_dim=16\\nmore')\n",
     "the K sweep", "RuntimeError: Unsupported CPU attention configuration: head_dim=16 (inside vLLM)"),
    ("site-packages/vllm/attention.py", "def f(seq_lens=()):\n    assert seq_lens\n",
     "the Oracle pass (--oracle-batch 64)",
     "AssertionError: no message; raised at vllm/attention.py:2 in f (inside vLLM)"),
])
def test_an_error_inside_vllm_while_running_is_one_line(tmp_path, path, source, during, expect):
    """An error raised in vLLM's code (innermost frame under a ``/vllm/`` path) becomes one line naming
    where; one raised in speclimits' own code keeps its traceback (None)."""
    from speclimits.tracing.engine import vllm_failure

    model = _model_dir(tmp_path)
    namespace: dict = {}
    exec(compile(source, str(tmp_path / path), "exec"), namespace)  # code whose frames say they are vLLM's
    try:
        namespace["f"]()
    except (RuntimeError, AssertionError) as exc:
        failure = vllm_failure(exc, model, during)
    assert str(failure) == f"vLLM failed running MixtralForCausalLM ({model}) during {during}: {expect}"
    try:
        raise KeyError("ours")
    except KeyError as exc:
        assert vllm_failure(exc, model, during) is None
