"""The `factors` and `fit` commands, and the four statistics notebooks executed with smoke parameters."""

from __future__ import annotations

import json

import pytest

from conftest import executed_notebook_text
from speclimits import paths
from speclimits.cli import main
from speclimits.costmodel import CostModel

MEASURED = paths.TRACES_DIR / "measured-eagle3"

NOTEBOOKS = ("02_factors", "03_final_model", "04_draft_model", "05_robustness")


def test_fit_json_and_out_agree(smoke_trace, tmp_path, capsys):
    out = tmp_path / "cost_model.json"
    assert main(["fit", str(smoke_trace), "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"cost_model", "final", "draft"} <= set(printed)
    written = json.loads(out.read_text())
    assert written["target"] == printed["cost_model"]["target"]
    cm = CostModel.read(out)
    truth = CostModel.from_dict(json.loads((smoke_trace / "meta.json").read_text())["truth"])
    assert cm.ms == truth.ms  # the smoke trace has K = 0 rounds, so m = 1 is there
    assert abs(cm.alpha[8] - truth.alpha[8]) < 0.01
    assert cm.alpha[1] == cm.alpha[2]
    assert printed["final"]["boundary"]["split"] == 4  # the smoke preset plants the paper's boundary
    assert "alpha(1) := alpha(2)" in " ".join(written["fit"]["notes"])


def test_fit_out_writes_the_bytes_of_the_one_trace_route(smoke_trace, tmp_path, monkeypatch, capsys):
    """``speclimits fit --out`` and :func:`speclimits.stats.fit_trace_cost_model` (section 3's and the
    Oracle's route) write the same bytes, however the trace's path is spelled."""
    from speclimits.stats import fit_trace_cost_model
    from speclimits.trace import read_trace

    monkeypatch.chdir(smoke_trace.parent)
    assert main(["fit", f"./{smoke_trace.name}/", "--n-boot", "9", "--out", str(tmp_path / "cli.json")]) == 0
    capsys.readouterr()
    book = fit_trace_cost_model(read_trace(smoke_trace.resolve())).write(tmp_path / "book.json")
    assert (tmp_path / "cli.json").read_bytes() == book.read_bytes()
    assert str(smoke_trace.parent) not in book.read_text()  # no machine path in the JSON


@pytest.mark.book
def test_book_cost_model_is_what_fit_out_writes(default_book, tmp_path, capsys):
    assert main(["fit", str(paths.default_trace()), "--n-boot", "9", "--out", str(tmp_path / "cli.json")]) == 0
    capsys.readouterr()
    built = default_book / "source" / "_static" / "cost_model.json"  # written by section 3 in the build
    assert built.read_bytes() == (tmp_path / "cli.json").read_bytes()


def test_fit_and_factors_on_the_bundled_measured_trace(tmp_path, capsys):
    """The book's default trace: no regime is declared (the CV curve is flat), the paper-split rows are
    there, both Breusch–Pagan versions are reported, and the cost model (printed and written) is the fit's."""
    assert main(["fit", str(MEASURED), "--json", "--robustness-k", "8", "--out", str(tmp_path / "cm.json")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "cm.json").read_text())["target"] == d["cost_model"]["target"]
    b = d["final"]["boundary"]
    assert b["split"] is None and b["argmin_split"] == 10  # the plain argmin would have said 10
    bases = {r["basis"] for r in d["final"]["regimes"]}
    assert bases == {"rule: no regime", "paper split m ≤ 4 | m ≥ 5"}
    versions = {(r["scope"], r["version"]) for r in d["robustness"]["breusch_pagan"]}
    assert len(versions) == 4
    cm = CostModel.from_dict(d["cost_model"])
    assert cm.ms == list(range(1, 12))
    assert cm.alpha[8] == pytest.approx(0.1502368, abs=1e-6)  # unchanged by the statistics rework
    assert cm.c == pytest.approx(1.4564996e-3, rel=1e-6)
    assert main(["factors", str(MEASURED), "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["n_generations"] == 440 and f["k_values"] == list(range(1, 11))
    assert [r["factor"] for r in f["table_a2"]] == ["u_bar", "m", "context_len", "kv_usage", "graph_bucket", "e_max"]


def test_fit_text_and_bad_trace(smoke_trace, tmp_path, capsys):
    assert main(["fit", str(smoke_trace), "--robustness-k", "8"]) == 0
    text = capsys.readouterr().out
    assert "Regime boundary" in text and "Robustness on K = 8" in text
    assert main(["fit", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


#: What each section must show (issue: rule stated, paper-split rows, both BP tests, intervals).
SHOWN = {
    "02_factors": ["What the intervals cover"],
    "03_final_model": ["one-standard-error", "paper split m ≤ 4 | m ≥ 5", "rule: m ≤ 4 | m > 4", "α level ratio",
                       "SE by prompt", "CV MAPE (%) [95% CI]", "Other smooth parameterizations", "bootstrap resamples: 99"],
    "04_draft_model": ["zero draft times included", "zero draft times excluded (reported)"],
    "05_robustness": ["classic (Breusch–Pagan 1979)", "studentized (Koenker 1981)", "pooled over K, categorical Eq. 4",
                      "sandwich clustered by generation", "RLM covariance, not clustered", "p (bins, Wald)",
                      "run halves ordered by"],
}


@pytest.mark.book
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_with_smoke_parameters(name, simulated_pages):
    text = executed_notebook_text(simulated_pages, name)
    assert "SIMULATED" in text
    assert "Traceback" not in text
    for needle in SHOWN[name]:
        assert needle in text, f"{name}: {needle!r} not shown"
