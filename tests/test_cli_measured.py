"""Every analysis command on the bundled measured trace (the book's default; ``fit`` and ``factors`` on it:
test_stats_cli_book.py), and the one route: ``speclimits oracle``, ``speclimits linguistic`` and a
cost-model JSON hand-off solve the same Oracle."""

from __future__ import annotations

import json

import pytest

from speclimits.cli import main
from speclimits.paths import default_trace

MEASURED = default_trace()


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def measured():
    from speclimits.trace import read_trace

    tr = read_trace(MEASURED)
    assert not tr.simulated, "the book's default trace is a measurement"
    return tr


def test_validate_measured(capsys, measured):
    assert main(["validate", str(MEASURED)]) == 0
    assert "valid" in capsys.readouterr().out.lower()


def test_oracle_and_linguistic_solve_the_same_oracle(capsys, tmp_path, measured):
    from speclimits.oracle import prepare_oracle
    from speclimits.stats import fit_trace_cost_model

    oracle = run_json(capsys, "oracle", str(MEASURED), "--n-boot", "0", "--json")
    ling = run_json(capsys, "linguistic", str(MEASURED), "--n-boot", "9", "--json")
    assert oracle["surrogate"] == ling["surrogate"] == "calibrated q"  # auto on a measured trace
    assert ling["oracle_total_ms"] == pytest.approx(oracle["all_references"]["oracle_ms"], rel=1e-12)
    # the top level is the book's headline: greedy references
    assert oracle["headline_kind"] == "greedy" and oracle["best_static_k"] == oracle["headline"]["best_static_k"]
    assert oracle["speedup"] == pytest.approx(oracle["by_kind"]["greedy"]["speedup"])
    # the hand-off: the fit written as JSON and read back gives the same Oracle as fitting again
    path = fit_trace_cost_model(measured).write(tmp_path / "cm.json")
    handed = run_json(capsys, "oracle", str(MEASURED), "--n-boot", "0", "--cost-model", str(path), "--json")
    assert handed["oracle_ms"] == pytest.approx(oracle["oracle_ms"], rel=1e-9)
    # and the library route the book uses
    res = prepare_oracle(measured, path).solve()
    assert res.bounds.oracle_ms == pytest.approx(oracle["all_references"]["oracle_ms"], rel=1e-9)
    # the surrogates differ on this trace: raw q understates greedy acceptance (calibration gap > 0)
    raw = run_json(capsys, "oracle", str(MEASURED), "--n-boot", "0", "--surrogate", "raw", "--json")
    exact = run_json(capsys, "oracle", str(MEASURED), "--n-boot", "0", "--surrogate", "exact", "--json")
    assert raw["oracle_ms"] > oracle["oracle_ms"] > exact["oracle_ms"]
