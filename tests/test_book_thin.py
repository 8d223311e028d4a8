"""The book and the factor analysis on a user's thin trace (issue 41): what a page cannot show.

Library level (one simulated smoke trace per K grid): the final model names the tables the trace cannot give
(:meth:`FinalModelResults.why_missing`), robustness moves to the largest K present, the Oracle sections cap K_max
at the drafts the cost model prices, and a trace without Oracle data is named. End to end (``book``): the
whole book builds on the K = 0, 2, 4 grid with the "This trace cannot show ..." sentences. ``grid_traces``
(conftest): the thin K grids, a single-K trace and one without Oracle data."""

from __future__ import annotations

import re

import nbformat
import pytest

from speclimits.cli import main

#: K grid -> the final-model tables (attributes) the trace cannot give at all, and the smooth forms
#: left out of a smooth-forms table that is still shown.
GRIDS = {
    "0,2,4": ({"loko", "smooth", "interpolation", "interpolation_paper"}, set()),
    "0-4": (set(), {"hinge"}),
    "0,2,4,6": ({"interpolation", "interpolation_paper"}, {"quadratic", "hinge"}),
    "1-6": (set(), set()),
}
TABLES = ("per_k", "pooled", "pooled_std", "comparison", "mape_by_k", "loko", "smooth", "boundary", "regimes",
          "interpolation", "interpolation_paper", "ladder")


@pytest.fixture(scope="module")
def finals(grid_traces):
    from speclimits.stats import fit_final_model
    from speclimits.trace import read_trace

    return {grid: fit_final_model(read_trace(grid_traces[grid]).rounds, n_boot=19) for grid in GRIDS}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_final_model_says_which_tables_the_grid_cannot_give(grid, finals):
    res = finals[grid]
    missing, forms_left_out = GRIDS[grid]
    for table in TABLES:
        why = res.why_missing(table)
        if table in missing:
            assert why is not None, table
            assert "needs" in why and "this trace: K = " in why, (table, why)
        else:
            assert why is None, (table, why)
    if res.smooth is not None:  # a table that is shown names the forms it leaves out
        within = res.skipped_within("smooth") or ""
        for form in ("linear", "quadratic", "log", "hinge"):
            assert (f"smooth form '{form}" in within) == (form in forms_left_out), form
        assert not [name for name in res.smooth.index if name.split()[0] in forms_left_out]
        assert len(res.smooth) >= 4 - len(forms_left_out)
    with pytest.raises(KeyError):
        res.why_missing("no such table")


def test_why_missing_names_the_prerequisite_that_was_skipped(finals):
    res = finals["0,2,4"]
    # the smooth-forms table is missing because leave-one-K-out is: one reason, the prerequisite's text
    assert res.why_missing("smooth") == res.skipped["leave-one-K-out"]
    assert res.why_missing("loko").startswith("leave-one-K-out needs >= 3 values of K > 0 (this trace: K = 2, 4;")
    both = res.why_missing("loko", "interpolation")
    assert both.startswith("leave-one-K-out: ") and "; interpolation within a regime: " in both


def test_skips_are_declared_by_step_not_matched_by_name():
    from speclimits import paper
    from speclimits.stats.m_split import FIXED_SPLIT
    from speclimits.stats.requirements import STEPS, TABLES, Skips

    assert all(set(steps) <= set(STEPS) for steps in TABLES.values())
    assert FIXED_SPLIT == paper.BOUNDARY_M  # the rows "at the paper's split" are at the paper's split
    with pytest.raises(KeyError):  # a step is a declared key, never the text of a name
        Skips("K = 1").add("pooled model (γ·K)", "pooled model (γ·K)")


@pytest.mark.parametrize("grid, top", [("0,2,4", 4), ("0-4", 4), ("0,2,4,6", 6), ("1-6", 6)])
def test_robustness_and_the_oracle_fall_back_to_the_largest_k_present(grid, top, grid_traces):
    """Robustness runs on the largest K when K = 8 is absent; the Oracle's K_max is capped at the drafts the
    cost model prices."""
    from speclimits.oracle.prepare import priced_k_max
    from speclimits.stats import fit_trace_cost_model
    from speclimits.stats.robustness import robust_k
    from speclimits.trace import read_trace

    rounds = read_trace(grid_traces[grid]).rounds
    k, note = robust_k(rounds, 8)
    assert k == top
    assert "no decode rounds at K = 8" in note and f"the checks run on K = {top}" in note
    assert robust_k(rounds, 2 if grid != "1-6" else 1) == (2 if grid != "1-6" else 1, None)
    model = fit_trace_cost_model(grid_traces[grid])
    k, note = priced_k_max(model, 10)
    assert k == top and f"K_max is {top} here, not 10" in note and "a sweep up to K = 10" in note
    assert priced_k_max(model, top) == (top, None)
    assert priced_k_max(model, 2) == (2, None)


def test_single_k_trace_skips_the_draft_line_and_the_factors_it_cannot_estimate(grid_traces, capsys):
    from speclimits.stats.draft import draft_model_or_reason
    from speclimits.stats.factors import analyze_factors
    from speclimits.trace import read_trace

    rounds = read_trace(grid_traces["0,2"]).rounds
    res, why = draft_model_or_reason(rounds)
    assert res is None and "needs >= 2 values of K > 0" in why and "this trace: K = 2;" in why
    assert draft_model_or_reason(read_trace(grid_traces["0-4"]).rounds)[1] is None

    fac = analyze_factors(rounds)
    assert "m" not in fac.table.index and {"u_bar", "context_len", "kv_usage", "e_max"} <= set(fac.table.index)
    assert fac.skipped["factor m (budget)"].startswith("m varies only with >= 2 values of K > 0")
    assert list(fac.by_k["K"].unique()) == [2]
    # the command writes the rest and names each skipped factor in one line
    assert main(["factors", str(grid_traces["0,2"])]) == 0
    out = capsys.readouterr().out
    assert "Ū (unique experts)" in out and "L (context)" in out
    lines = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert any(line.startswith("skipped factor m (budget): m varies only") for line in lines)
    assert all(len(line.split(": ", 1)) == 2 for line in lines)
    # a full grid skips nothing
    assert analyze_factors(read_trace(grid_traces["1-6"]).rounds).skipped == {}


def test_a_trace_without_oracle_data_is_named(grid_traces):
    from speclimits.oracle.prepare import NO_ORACLE_DATA, oracle_data_missing

    assert oracle_data_missing(grid_traces["no-oracle"]) == NO_ORACLE_DATA
    assert "traced without --oracle" in NO_ORACLE_DATA
    assert oracle_data_missing(grid_traces["0-4"]) is None


def test_cannot_show_is_one_sentence_in_a_note():
    from speclimits.book.present import cannot_show_markdown

    md = cannot_show_markdown("leave-one-$K$-out", "leave-one-K-out needs >= 3 values of K > 0 (this trace: K = 2, 4).")
    assert md == (":::{admonition} Not shown on this trace\n:class: note not-shown\n\nThis trace cannot show "
                  "leave-one-$K$-out: leave-one-K-out needs >= 3 values of K > 0 (this trace: K = 2, 4).\n:::\n")
    # a flag becomes a code span (smart quotes print an en dash for "--" in text, escaped or not), a code
    # span stays as it is, and the hyphens inside words (leave-one-K-out) are left alone
    assert "traced without `--oracle`; `speclimits trace --oracle`; a K-grid, `--k` 0-4." in cannot_show_markdown(
        "x", "traced without --oracle; `speclimits trace --oracle`; a K-grid, --k 0-4")
    with pytest.raises(ValueError):
        cannot_show_markdown("the pooled model", " ")


def test_labels_a_page_could_not_show_land_on_its_note():
    from speclimits.book.build import link_missing_labels
    from speclimits.book.present import FIGURE_KEY, cannot_show_markdown

    def code(source, *outputs):
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = [nbformat.v4.new_output("display_data", data=data, metadata=meta) for data, meta in outputs]
        return cell

    note = {"text/markdown": cannot_show_markdown("the smooth forms", "it needs 3 values of K"), "text/plain": "x"}
    shown = {"text/markdown": ":::{table} A table.\n:name: tbl-x-shown\n\n| a |\n|---|\n| 1 |\n:::\n"}
    chart = ({"text/html": "<div></div>"}, {FIGURE_KEY: {"figure": {"name": "fig-x-shown", "caption": "c"}}})
    nb = nbformat.v4.new_notebook(cells=[
        code('page.table(frame, "tbl-x-early", "never shown, and no note before it")'),
        nbformat.v4.new_markdown_cell("See {numref}`tbl-x-smooth` and {numref}`fig-x-smooth`."),
        code('page.table(t, "tbl-x-shown", "c")\nif page.shows("s", why):\n    page.table(t, "tbl-x-smooth", "c")',
             (shown, {}), (note, {})),
        code('if ok:\n    page.figure(c, "fig-x-smooth", "c")\npage.figure(c, "fig-x-shown", "c")', chart),
        code('page.table(t, f"tbl-x-{k}", "not a literal label")'),
    ])
    assert link_missing_labels(nb) == {"tbl-x-smooth": "2", "fig-x-smooth": "2"}
    text = nb.cells[2].outputs[1]["data"]["text/markdown"]
    assert text.startswith("(tbl-x-smooth)=\n(fig-x-smooth)=\n:::{admonition} Not shown on this trace")
    assert "tbl-x-shown" not in text and "tbl-x-early" not in text


def _page_text(path) -> str:
    """The markdown and text outputs of an executed notebook, whitespace collapsed."""
    nb = nbformat.read(path, as_version=4)
    parts = [o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/markdown", "")
             for cell in nb.cells for o in cell.get("outputs", [])]
    return re.sub(r"\s+", " ", " ".join(parts))


@pytest.mark.book
def test_book_pages_on_a_thin_grid_say_what_they_cannot_show(grid_traces, tmp_path):
    """Sections 3, 5 and 6 executed on a SIMULATED K = 0, 2, 4 trace (no site: the run's one full build is
    the default book; the "not shown" references are rendered in tests/test_sphinx_numref.py)."""
    from speclimits.book import build_book

    pages = build_book(grid_traces["0,2,4"], smoke=True, out=tmp_path / "site", progress=False, site=False,
                       pages=["03_final_model", "05_robustness", "06_oracle"]) / "book"
    assert sorted(p.stem for p in pages.glob("*.ipynb")) == ["03_final_model", "05_robustness", "06_oracle"]
    final = _page_text(pages / "03_final_model.ipynb")
    assert "This trace cannot show leave-one-" in final
    assert "leave-one-K-out needs >= 3 values of K > 0 (this trace: K = 2, 4;" in final
    # the labels of the tables this trace cannot give sit on the note (numbered references point at it)
    assert re.search(r"\(tbl-[\w-]+\)= (\(tbl-[\w-]+\)= )*:::\{admonition\} Not shown on this trace", final)
    assert "This trace cannot show the checks on" in _page_text(pages / "05_robustness.ipynb")
    oracle = _page_text(pages / "06_oracle.ipynb")
    assert "This trace cannot show the bound with drafts of up to" in oracle and "K_max is 4 here, not 10" in oracle
    for page in pages.glob("*.ipynb"):
        assert "Traceback" not in page.read_text(), page.name
