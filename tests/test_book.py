"""The book: every section is in the toc, and a smoke build executes them all and reads offline."""

from __future__ import annotations

import re

import pytest

from speclimits.book import toc_files
from speclimits.paths import BOOK_DIR, REPO_ROOT


def test_every_notebook_is_in_the_toc_and_follows_the_house_layout():
    pages = toc_files()
    assert {f"book/{p.stem}" for p in BOOK_DIR.glob("*.py")} == set(pages)
    for page in pages:
        assert (REPO_ROOT / f"{page}.py").exists()
    for path in BOOK_DIR.glob("*.py"):
        text = path.read_text()
        assert text.count('\n# # ') == 1, f"{path.name}: exactly one H1"
        assert 'tags=["parameters", "remove-cell"]' in text, f"{path.name}: a parameters cell"
        assert "\ndef " not in text and "\nclass " not in text, f"{path.name}: logic belongs in src/"
        assert "version_report" in text, f"{path.name}: ends with the version record"


@pytest.mark.book
def test_default_build_executes_every_section_offline(default_book):
    html_dir = default_book / "_build" / "html"
    index = html_dir / "index.html"
    assert index.exists()
    for page in toc_files():
        html = (html_dir / f"{page}.html").read_text()
        assert "Traceback" not in html, page
    intro = (html_dir / "book" / "intro.html").read_text()
    # measured data, with the beyond-the-paper rows that are simulated labelled so
    assert re.search(r"Trace directory:\s+twin-eagle3", intro) and "(SIMULATED, paper scale)" in intro
    assert (html_dir / "_static" / "vega-offline.js").exists()
    assert (html_dir / "_static" / "mathjax" / "tex-chtml.js").exists()
    for page in html_dir.rglob("*.html"):
        text = page.read_text()
        at = text.find("https://")
        assert at < 0, f"{page.name} references a remote URL: ...{text[max(0, at - 300):at + 100]}"
