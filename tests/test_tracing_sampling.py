"""Sampled traces without an engine: the flags' one-line refusals, the seeds, the meta.json record, the
oracle.parquet columns and their checks, and the token rows of sampled references."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from speclimits.cli import main
from speclimits.paths import DATA_DIR
from speclimits.trace import find_problems
from speclimits.trace.sampling import REQUEST_SEED_RULE, Sampling, sampling_problems

PROMPTS = DATA_DIR / "prompts" / "smoke.jsonl"


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A model folder that passes the checks made before vLLM is imported (which then must not be)."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 512}))
    monkeypatch.setattr("speclimits.tracing.engine.require_vllm_findable", lambda: None)

    def no_engine(*a, **k):
        raise AssertionError("an engine was asked for")

    monkeypatch.setattr("speclimits.tracing.engine.require_vllm", no_engine)
    return folder


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0"),
    (["--temperature", "0.7", "--top-p", "0"], "--top-p must be a number in (0, 1]"),
    (["--temperature", "0.7", "--top-p", "1.5"], "--top-p must be a number in (0, 1]"),
    (["--oracle-samples", "3"], "--oracle-samples 3 needs --temperature > 0"),
    (["--temperature", "0.7", "--oracle-samples", "0"], "--oracle-samples must be >= 1"),
    (["--temperature", "0.7", "--oracle-samples", "2", "--no-oracle"], "give --oracle as well"),
    (["--temperature", "0.7", "--spec-arg", 'draft_sample_method="probabilistic"'], "draft_sample_method"),
])
def test_sampling_flags_refused_in_one_line_before_any_engine(model, tmp_path, capsys, flags, says):
    oracle = [] if "--no-oracle" in flags else ["--oracle"]
    flags = [f for f in flags if f != "--no-oracle"]
    argv = ["trace", "--target", str(model), "--draft", str(model), "--method", "draft_model", "--k", "0,2",
            "--prompts", str(PROMPTS), "--out", str(tmp_path / "t"), *oracle, *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("flag, value", [("--seed", "1.5"), ("--temperature", "warm"), ("--top-p", "x")])
def test_values_that_are_not_numbers_are_refused_by_argparse_naming_the_flag(model, tmp_path, capsys, flag, value):
    argv = ["trace", "--target", str(model), "--prompts", str(PROMPTS), "--out", str(tmp_path / "t"), flag, value]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}: invalid" in last and repr(value) in last


def test_sampling_rule_and_seeds():
    assert sampling_problems(0.0, 1.0, 0) == [] and sampling_problems(0.7, 0.9, -3) == []
    assert [f for f, _ in sampling_problems(-1, 0.0, 1.5)] == ["temperature", "top_p", "seed"]
    assert [f for f, _ in sampling_problems(True, 1, True)] == ["temperature", "seed"]
    s = Sampling(0.7, 0.9, 0)
    assert not s.greedy and Sampling().greedy
    # seeds are stable across runs and machines (sha256), distinct per prompt and sample, in [0, 2**31)
    assert s.request_seed("rand0", 0) == Sampling(1.0, 1.0, 0).request_seed("rand0", 0) == 1199303762
    seeds = {s.request_seed(p, j) for p in ("rand0", "rand1", "rep") for j in range(3)}
    assert len(seeds) == 9 and all(0 <= x < 2 ** 31 for x in seeds)
    assert Sampling(0.7, 0.9, 1).request_seed("rand0", 0) != s.request_seed("rand0", 0)
    rec = s.record()
    assert rec == {"temperature": 0.7, "top_p": 0.9, "seed": 0, "request_seeds": REQUEST_SEED_RULE}
    assert Sampling.from_meta({"sampling": rec, "seed": 5}) == s
    assert Sampling.from_meta({"seed": 5}) == Sampling(0, 1, 5)


def test_greedy_settings_are_those_of_every_trace_before():
    """Without the flags a sweep's settings (meta.json's ``sweep``, the resume keys) hold no sampling."""
    from speclimits.tracing.sweep import SweepConfig

    greedy = SweepConfig(target="t", prompts="p", out="o").settings("sha")
    assert "sampling" not in greedy
    sampled = SweepConfig(target="t", prompts="p", out="o", temperature=0.7, top_p=0.95, seed=3).settings("sha")
    assert sampled["sampling"] == Sampling(0.7, 0.95, 3).record()
    assert {k: v for k, v in sampled.items() if k != "sampling"} == {**greedy, "seed": 3}


def _sampled_copy(smoke_trace, tmp_path, accept_prob=True, temperature=0.7):
    """The smoke simulated trace made to look sampled: a sampling record and an accept_prob column."""
    out = tmp_path / "tr"
    shutil.copytree(smoke_trace, out)
    meta = json.loads((out / "meta.json").read_text())
    meta["sampling"] = Sampling(temperature, 1.0, 0).record()
    (out / "meta.json").write_text(json.dumps(meta))
    if accept_prob:
        df = pd.read_parquet(out / "oracle.parquet")
        df["accept_prob"] = [np.asarray(m, dtype=float) * 0.9 for m in df["match_prob"]]
        _write_oracle(out, df)
    return out


def _write_oracle(root, df):
    path = root / "oracle.parquet"
    if path.is_dir():
        shutil.rmtree(path)
    df.to_parquet(path)


def _problems(path):
    return [(p.column, p.message) for p in find_problems(path)]


def test_validate_reads_the_sampling_record_and_accept_prob(smoke_trace, tmp_path):
    assert (smoke_trace / "oracle.parquet").exists() and find_problems(smoke_trace) == []
    good = _sampled_copy(smoke_trace, tmp_path / "good")
    assert find_problems(good) == []
    # a sampled trace needs accept_prob; a greedy one must not have it
    missing = _sampled_copy(smoke_trace, tmp_path / "missing", accept_prob=False)
    assert any(c == "accept_prob" and "required column is missing" in m for c, m in _problems(missing))
    greedy = _sampled_copy(smoke_trace, tmp_path / "greedy", temperature=0.0)
    assert any(c == "accept_prob" and "greedy trace" in m for c, m in _problems(greedy))
    # values in [0, 1], lists of K_max
    df = pd.read_parquet(good / "oracle.parquet")
    values = [np.array(a, dtype=float) for a in df["accept_prob"]]
    values[3][1] = 1.5
    _write_oracle(good, df.assign(accept_prob=values))
    assert ("accept_prob", "probabilities must be finite and in [0, 1]") in _problems(good)
    _write_oracle(good, df.assign(accept_prob=[a[:-1] for a in values]))
    assert any(c == "accept_prob" and "lists must have length" in m for c, m in _problems(good))
    # the record's types and ranges
    meta = json.loads((good / "meta.json").read_text())
    for rec, says in (({"temperature": -1, "top_p": 1.0, "seed": 0}, "'sampling.temperature' must be"),
                      ({"temperature": 0.7, "top_p": 0, "seed": 0}, "'sampling.top_p' must be"),
                      ({"temperature": 0.7, "top_p": 1.0, "seed": "0"}, "'sampling.seed' must be an integer"),
                      ({"temperature": 0.7, "top_p": 1.0}, "'sampling.seed' is missing"),
                      ("hot", "must be an object")):
        (good / "meta.json").write_text(json.dumps({**meta, "sampling": rec}))
        assert any(says in m for _, m in _problems(good)), (rec, _problems(good))


def test_token_rows_of_sampled_references():
    """A prompt's sweep generation is 'sampled', its further references get rows without routing after it,
    row 0's target choice is unknown (no greedy generation), and a second pass gives the same table."""
    from speclimits.trace.reference_tokens import reference_tokens

    n = 4
    tokens = pd.DataFrame({"seq_id": "p", "pos": np.arange(n), "token_id": [5, 6, 7, 8], "text": "",
                           "new_experts": [1.0, 2.0, 0.5, np.nan], "experts": [np.array([1, 2], np.int16)] * 3 + [None],
                           "generation_id": 0, "K": 0, "round": np.arange(n), "row": 0,
                           "context_len": 3 + np.arange(n)})
    oracle = pd.DataFrame({"seq_id": ["p"] * 3 + ["p#1"] * 3, "pos": [0, 1, 2] * 2,
                           "forced": [False, True, False, True, False, False]})
    sampled = {"p#1": ("p", [5, 9, 9, 4])}
    out = reference_tokens(tokens, oracle, {}, {}, sampled=sampled, kind="sampled")
    assert out["seq_id"].tolist() == ["p"] * 4 + ["p#1"] * 4 and set(out["reference_kind"]) == {"sampled"}
    extra = out[out["seq_id"] == "p#1"]
    assert extra["token_id"].tolist() == [5, 9, 9, 4] and extra["generation_id"].isna().all()
    assert extra["context_len"].tolist() == [3, 4, 5, 6] and extra["new_experts"].isna().all()
    assert out["target_token_id"].isna()[out["pos"] == 0].all()  # unknown without a greedy generation
    assert out.loc[out["seq_id"] == "p", "target_agrees"].tolist()[:3] == [True, False, True]
    assert pd.isna(out.loc[(out["seq_id"] == "p") & (out["pos"] == 3), "target_agrees"]).all()  # not greedy
    again = reference_tokens(out, oracle, {}, {}, sampled=sampled, kind="sampled")
    pd.testing.assert_frame_equal(again.drop(columns="experts"), out.drop(columns="experts"))


def test_the_oracle_reads_accept_prob_as_the_match_probability_of_a_sampled_trace(smoke_trace, tmp_path):
    from speclimits.oracle.prepare import load_inputs, prepare_oracle

    greedy, sampled = load_inputs(smoke_trace), load_inputs(_sampled_copy(smoke_trace, tmp_path))
    np.testing.assert_allclose(sampled.match_prob, 0.9 * greedy.match_prob)  # _sampled_copy's accept_prob
    np.testing.assert_array_equal(sampled.draft_conf, greedy.draft_conf)
    np.testing.assert_array_equal(sampled.accept_len, greedy.accept_len)
    setup = prepare_oracle(tmp_path / "tr", surrogate="raw")
    np.testing.assert_allclose(setup.inputs.match_prob, sampled.match_prob)
