"""``speclimits linguistic`` and the book section 07 executed with smoke parameters."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from conftest import executed_notebook_text
from speclimits.cli import main
from speclimits.costmodel import CostModel
from speclimits.trace import read_trace


def test_cli_json_and_text(smoke_trace, tmp_path, capsys):
    tr = read_trace(smoke_trace)
    cm = tmp_path / "truth.json"
    CostModel.from_dict(tr.meta["truth"]).write(cm)
    assert main(["linguistic", str(smoke_trace), "--cost-model", str(cm), "--n-boot", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_decisions"] == len(tr.oracle) and out["n_states_without_token"] == 0
    assert out["n_responses"] == tr.oracle["seq_id"].nunique()
    ctx = {r["context"]: r for r in out["k_by_context"]}
    assert sum(r["n_decisions"] for r in out["k_by_context"]) == out["n_decisions"]
    assert ctx["code_format"]["share_long"] > ctx["script_change"]["share_long"]
    assert ctx["code_format"]["paper_share_long"] == 0.718 and ctx["code_vocab"]["paper_share_long"] is None
    assert [r["contrast"] for r in out["routing"]] == ["script_change", "first_mismatch_reference",
                                                       "first_mismatch_window"]
    assert 0.8 < out["label_agreement"]["accuracy"] <= 1
    # a simulated trace has greedy references only: the headline is the one kind, shown once more apart
    assert out["headline_reference_kind"] == "greedy" and list(out["by_reference_kind"]) == ["greedy"]
    assert out["by_reference_kind"]["greedy"]["k_by_context"] == out["k_by_context"]
    dec_file = tmp_path / "decisions.csv"
    assert main(["linguistic", str(smoke_trace), "--cost-model", str(cm), "--n-boot", "20",
                 "--decisions", str(dec_file)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "k* by context" in text and "script_change" in text and str(dec_file) in text
    dec = pd.read_csv(dec_file)
    assert len(dec) == len(tr.oracle) and (dec["token_pos"] == dec["pos"] + 1).all()
    tok = tr.tokens.assign(seq_id=tr.tokens["seq_id"].astype(str)).set_index(["seq_id", "pos"])
    keys = list(zip(dec["seq_id"].astype(str), dec["pos"] + 1))
    assert (tok.loc[keys, "token_id"].to_numpy() == dec["token_id"].to_numpy()).all()
    assert main(["linguistic", str(smoke_trace), "--n-boot", "5", "--decisions", str(tmp_path / "d.xlsx")]) == 2
    assert "suffix" in capsys.readouterr().err


def test_cli_errors_name_the_missing_table(smoke_trace, tmp_path, capsys):
    no_tokens = tmp_path / "no_tokens"
    shutil.copytree(smoke_trace, no_tokens)
    (no_tokens / "tokens.parquet").unlink()
    assert main(["linguistic", str(no_tokens), "--n-boot", "10"]) == 2
    assert "tokens.parquet" in capsys.readouterr().err
    bad = tmp_path / "no_text"
    shutil.copytree(smoke_trace, bad)
    tok = pd.read_parquet(bad / "tokens.parquet").drop(columns="text")
    tok.to_parquet(bad / "tokens.parquet")
    assert main(["linguistic", str(bad), "--n-boot", "10"]) == 2
    assert "'text'" in capsys.readouterr().err


@pytest.mark.book
def test_linguistic_notebook_executes_with_smoke_parameters(simulated_pages):
    text = executed_notebook_text(simulated_pages, "07_linguistic")
    assert "SIMULATED" in text and "Traceback" not in text
    # the k*-by-context shares (table and the comparison with the paper), the planted routing
    # difference and the labeller's agreement are shown
    assert "tbl-ling-k-by-context" in text and "k* ≥ 4 at code formatting" in text
    assert "planted difference" in text and "agreement" in text
