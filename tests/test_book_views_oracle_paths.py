"""Section 6's setup printout names files relative to the site or the trace, not the build machine."""

from __future__ import annotations

from speclimits.book.views import oracle as view
from speclimits.oracle import prepare_oracle
from speclimits.paths import DEFAULT_TRACE
from speclimits.stats import fit_trace_cost_model


def test_setup_notes_name_no_absolute_path(tmp_path):
    cost_model = fit_trace_cost_model(DEFAULT_TRACE).write(tmp_path / "_static" / "cost_model.json").resolve()
    trace = DEFAULT_TRACE.resolve()
    setup = prepare_oracle(trace, cost_model)
    assert str(cost_model) in setup.notes[0]  # what the Oracle records (and the CLI prints)
    lines = view.relative_paths([*setup.notes], cost_model, trace)
    assert lines[0] == "cost model _static/cost_model.json"
    assert not any(str(tmp_path) in line or str(trace.parent) in line for line in lines)
    fitted = view.relative_paths(prepare_oracle(trace).notes, None, trace)
    assert fitted[0].startswith(f"cost model fitted on {trace.name}/rounds.parquet")
