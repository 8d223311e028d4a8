"""The book's numref extension: same HTML as Sphinx's own domain, each target page read once."""

from __future__ import annotations

from pathlib import Path

import pytest

sphinx_app = pytest.importorskip("sphinx.application")

PAGES = {
    "index": ".. toctree::\n\n   a\n   b\n\nTop\n===\n\nSee :numref:`fig-a` and :numref:`tbl-b` and :numref:`fig-b`.\n",
    "a": "Page A\n======\n\n.. _fig-a:\n\n.. figure:: pic.png\n\n   The first figure.\n\n"
         "Again :numref:`fig-b`, :numref:`tbl-b`, :numref:`fig-a`.\n",
    "b": "Page B\n======\n\n.. _fig-b:\n\n.. figure:: pic.png\n\n   The second figure.\n\n"
         ".. _tbl-b:\n\n.. table:: A table\n\n   ===  ===\n   x    y\n   ===  ===\n   1    2\n   ===  ===\n\n"
         "Back to :numref:`fig-a`, :numref:`fig-a`, :numref:`fig-b`.\n",
}


def _build(tmp: Path, extensions: list[str], pages: dict[str, str] = PAGES) -> tuple[dict[str, str], dict[str, int]]:
    src, out = tmp / "src", tmp / "out"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(f"extensions = {extensions!r}\nnumfig = True\nnumfig_secnum_depth = 1\n")
    for name, text in pages.items():
        (src / f"{name}.rst").write_text(text)
    (src / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    app = sphinx_app.Sphinx(str(src), str(src), str(out), str(tmp / "doctrees"), "html", status=None,
                            warning=None, freshenv=True)
    loads: dict[str, int] = {}
    original = type(app.env).get_doctree

    def counting(env, docname):
        loads[docname] = loads.get(docname, 0) + 1
        return original(env, docname)

    type(app.env).get_doctree = counting
    try:
        app.build()
    finally:
        type(app.env).get_doctree = original
    return {n: (out / f"{n}.html").read_text() for n in pages}, loads


def test_same_html_and_each_target_page_read_once_for_numrefs(tmp_path):
    plain, plain_loads = _build(tmp_path / "plain", [])
    once, once_loads = _build(tmp_path / "once", ["speclimits.sphinx_numref"])
    assert once == plain
    # the references resolved to numbers (a broken resolution would leave the label or nothing)
    assert "Fig. 1" in plain["index"] and "Fig. 2" in plain["a"] and "Table 1" in plain["b"]
    # Sphinx's own domain reads b's doctree for each of the 5 references to b's targets and once more
    # to write b (a: 4 references); with the extension b is read once for numrefs and once to write it
    assert plain_loads["b"] == 6 and plain_loads["a"] == 5
    assert once_loads["b"] == 2 and once_loads["a"] == 2


def test_a_reference_to_a_table_not_shown_reads_so_and_links_to_the_note(tmp_path):
    """A label on a "cannot show" note (class not-shown) resolves to "Table/Fig. (not shown on this trace)";
    another unnumbered label still warns (undefined), as in Sphinx."""
    pages = {"index": ".. toctree::\n\n   c\n\nTop\n===\n\nSee :numref:`tbl-c` and :numref:`fig-c`.\n",
             "c": "Page C\n======\n\n.. _tbl-c:\n.. _fig-c:\n\n.. note::\n   :class: not-shown\n\n"
                  "   This trace cannot show it.\n\nAlso :numref:`tbl-c`.\n"}
    html, _ = _build(tmp_path, ["speclimits.sphinx_numref"], pages)
    index, c = html["index"], html["c"]
    assert "Table (not shown on this trace)" in index and "Fig. (not shown on this trace)" in index
    assert 'href="c.html#tbl-c"' in index and "Table (not shown on this trace)" in c
