"""The book's presentation layer: interval cells, MyST tables, figure promotion, key results, cell tags."""

from __future__ import annotations

import json

import jupytext
import nbformat
import pandas as pd
import pytest

from speclimits.book import present
from speclimits.book.build import promote_figures
from speclimits.errors import SpeclimitsError
from speclimits.paths import BOOK_DIR


def test_number_and_interval_cells_round_to_what_the_interval_supports():
    # half-width 0.036 -> three decimals; 0.24 -> two; 2.4 -> one
    assert present.fmt_ci(0.15603, 0.11981, 0.19225) == "0.156 [0.120; 0.192]"
    assert present.fmt_ci(8.1568, 7.9168, 8.3969) == "8.16 [7.92; 8.40]"
    assert present.fmt_ci(41.23, 38.8, 43.6) == "41.2 [38.8; 43.6]"
    assert present.fmt_ci(2.57, 2.42, 2.69, unit="%") == "2.57 [2.42; 2.69] %"
    # no interval: three significant digits; missing: a dash
    assert present.fmt_ci(0.0123456) == "0.0123"
    assert present.fmt_ci(float("nan"), 1, 2) == "–"
    assert present.fmt_num(25439) == "25\u2009439"
    # est ± 1.96 se (scaled); columns x, x_lo, x_hi (a missing one reads as NaN)
    assert present.se_ci(1.0e-3, 0.1e-3, scale=1e3) == "1.00 [0.80; 1.20]"
    frame = pd.DataFrame({"x": [0.15603, 2.0], "x_lo": [0.11981, 1.0], "x_hi": [0.19225, 3.0]})
    assert present.ci_column(frame, "x") == ["0.156 [0.120; 0.192]", "2.0 [1.0; 3.0]"]
    assert present.ci_column(frame, "y") == ["–", "–"]
    # an estimate with its standard error; p-values as a reader scans them
    assert present.fmt_se(0.70501, 0.0033) == "0.7050 (0.0033)" and present.fmt_se(0.851, 0.0136) == "0.851 (0.014)"
    assert [present.fmt_p(p) for p in (0.0, 1.6e-30, 0.393)] == ["< 1e-300", "1.6e-30", "0.39"]
    # with_ci puts estimate and bounds in one cell, in place of the estimate
    frame = pd.DataFrame({"K": [1, 2], "alpha": [0.156, 0.138], "alpha_lower": [0.120, 0.119],
                          "alpha_upper": [0.192, 0.156], "n": [10, 20]})
    out = present.with_ci(frame, "alpha", "alpha_lower", "alpha_upper", "α (ms/expert)")
    assert list(out.columns) == ["K", "α (ms/expert)", "n"]
    assert out["α (ms/expert)"].tolist() == ["0.156 [0.120; 0.192]", "0.138 [0.119; 0.156]"]
    scaled = present.with_ci(frame, "alpha", "alpha_lower", "alpha_upper", scale=1e3)
    assert scaled["alpha"].iloc[0] == "156 [120; 192]"


def test_table_markdown_is_a_numbered_myst_table_without_index(tmp_path):
    frame = pd.DataFrame({"Model": ["a|b", "c"], "R2": [0.61234, 0.5]}, index=[7, 8])
    md = present.table_markdown(frame, "tbl-x-fit", "Two fits.", decimals={"R2": 2},
                                download="tables/tbl-x-fit.csv", data_label="Data: measured trace `t`.")
    lines = md.splitlines()
    assert lines[0].startswith(":::{table} Two fits. Data: measured trace `t`. Full table: {download}")
    # no label: the caption as written; a caption that names its data keeps it instead of the label
    assert present.table_markdown(frame, "tbl-x-fit", "Two fits.").splitlines()[0] == ":::{table} Two fits."
    assert present.table_markdown(frame, "tbl-x-fit", "Two fits. Data: other.",
                                  data_label="Data: t.").splitlines()[0] == ":::{table} Two fits. Data: other."
    assert lines[1] == ":name: tbl-x-fit"
    assert "| Model | R2 |" in lines
    assert "| a\\|b | 0.61 |" in lines  # pipes escaped, numbers rounded, index 7/8 gone
    assert not any(line.startswith("| 7") for line in lines)
    assert lines[-1] == ":::"
    # numbers written as text (intervals) are right-aligned like numbers; words stay left
    mixed = pd.DataFrame({"Quantity": ["a", "b"], "Ours": ["0.156 [0.120; 0.192]", "–"], "n": [1, 2],
                          "Paper": ["0.37 %", "not in the appendix"]})
    assert present.markdown_table(mixed).splitlines()[1] == "|:---|---:|---:|:---|"
    # an interval, an arrow and a slash stay on one line when the page renders the cell
    md = present.markdown_table(pd.DataFrame({"x": ["0.81 [0.32; 1.25]", "2.66 → 3.12", "1.66 / 1.65"]}))
    assert md.splitlines()[2:] == ["| 0.81 [0.32;\u00a01.25] |", "| 2.66\u00a0→\u00a03.12 |", "| 1.66\u00a0/\u00a01.65 |"]


@pytest.mark.parametrize("name", ["fig-ok", "tbl_bad", "Tbl-x", "tbl-", None])
def test_labels_and_captions_are_checked(name):
    with pytest.raises(ValueError, match="tbl-" if name == "fig-ok" else "caption" if name is None else None):
        present.table_markdown(pd.DataFrame({"a": [1]}), name or "tbl-ok", "  " if name is None else "caption")


def _code_cell(outputs):
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def _rich(meta=None):
    return {"output_type": "display_data", "data": {"text/html": "<div></div>"}, "metadata": meta or {}}


def test_marked_outputs_become_numbered_figures_and_a_crowded_cell_is_refused():
    mark = {present.FIGURE_KEY: {"figure": {"name": "fig-a-b", "caption": "What it shows."}}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [_code_cell([_rich(mark), {"output_type": "stream", "name": "stdout", "text": "hi"}]),
                _code_cell([_rich()])]
    assert promote_figures(nb, "p") == 1
    assert nb.cells[0].metadata["mystnb"]["figure"] == {"name": "fig-a-b", "caption": "What it shows."}
    assert "mystnb" not in nb.cells[1].metadata
    nb.cells = [_code_cell([_rich(mark), _rich()])]
    with pytest.raises(SpeclimitsError, match="exactly one output"):
        promote_figures(nb, "p")


def test_key_results_are_written_and_gathered_with_section_links(tmp_path):
    box = present.Page(results_dir=tmp_path).key_results("sec-demo", "demo")
    assert box.results_dir == tmp_path
    box.fill([present.Result.of("speedup", 1.234, 1.1, 1.4, paper=1.5, unit="×", ref="fig-demo-x"),
              present.Result("regime", "none", "m ≤ 4")])
    doc = json.loads((tmp_path / "sec-demo.json").read_text())
    assert doc["rows"][0]["ours"] == "1.23 [1.10; 1.40] ×" and doc["rows"][0]["paper"] == "1.5 ×"
    gathered = present.gathered_results(tmp_path, ["sec-missing", "sec-demo"])
    assert gathered["Section"].tolist() == ["{ref}`sec-demo`", ""]
    assert gathered["Quantity"].iloc[0] == "speedup ({numref}`fig-demo-x`)"
    assert present.gathered_results(None, ["sec-demo"]) is None
    with pytest.raises(ValueError):
        present.KeyResults("sec-demo", "demo").fill([])
    # without a results folder the box only displays: nothing is written anywhere
    present.KeyResults("sec-other", "other").fill([present.Result("x", "1")])
    assert not (tmp_path / "sec-other.json").exists()


def test_a_page_names_its_trace_in_every_caption_and_pages_do_not_share_it(smoke_trace, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    page, other = present.Page(), present.Page()
    tr = page.load(smoke_trace)
    assert page.data_label == present.data_label_for(tr) and "SIMULATED" in page.data_label
    assert other.data_label is None  # a second page keeps its own (no module state)
    page.table(pd.DataFrame({"a": [1]}), "tbl-x-a", "One row.")
    other.table(pd.DataFrame({"a": [1]}), "tbl-x-b", "One row.")
    assert shown[0].text.startswith(f":::{{table}} One row. {page.data_label}\n")
    assert shown[1].text.startswith(":::{table} One row.\n")
    assert page.use(tr) is tr


VISIBILITY = {"remove-cell", "remove-input", "hide-input"}


@pytest.mark.parametrize("path", sorted(BOOK_DIR.glob("*.py")), ids=lambda p: p.name)
def test_every_code_cell_says_how_it_is_shown(path):
    """Setup cells removed, analysis folded: each code cell carries a visibility tag."""
    nb = jupytext.read(path)
    untagged = [i for i, cell in enumerate(nb.cells)
                if cell.cell_type == "code" and not VISIBILITY & set(cell.metadata.get("tags", []))]
    assert not untagged, f"{path.name}: code cells {untagged} have none of {sorted(VISIBILITY)}"
