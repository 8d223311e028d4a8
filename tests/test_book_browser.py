"""The built book in headless Chromium, offline: the checker on a handmade site with one defect of each kind,
then the default build. Skipped without Chromium or Playwright unless SPECLIMITS_REQUIRE_BROWSER_TESTS=1."""

from __future__ import annotations

import os

import pytest

from speclimits.book import toc_files

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser_ready():
    from speclimits.errors import SpeclimitsError

    reason = None
    try:
        import playwright  # noqa: F401
    except ImportError:
        reason = "Playwright is not installed (pip install -e '.[browser]')"
    if reason is None:
        from speclimits.book.browser import find_chromium
        try:
            find_chromium()
        except SpeclimitsError as exc:
            reason = str(exc)
    if reason:
        if os.environ.get("SPECLIMITS_REQUIRE_BROWSER_TESTS") == "1":
            pytest.fail(f"browser tests are required here but cannot run: {reason}")
        pytest.skip(reason)


PAGE = """<!DOCTYPE html><html><head><title>{title}</title></head><body>
<article class="bd-article" style="width: 700px">{body}</article></body></html>"""

GOOD = """
<figure id="fig-a"><div class="speclimits-chart"><svg width="10" height="10"></svg></div>
<figcaption><p><span class="caption-number">Fig. 1.1 </span>A chart.</p></figcaption></figure>
<div><table id="tbl-a"><caption><span class="caption-number">Table 1.1 </span>A table.</caption>
<tr><td>1</td></tr></table></div>
"""

BAD = """
<div><table id="tbl-bare"><tr><td>no caption</td></tr></table></div>
<div><table id="tbl-wide" style="width: 1200px"><caption><span class="caption-number">Table 2.2 </span>Wide.</caption>
<tr><td>x</td></tr></table></div>
<figure id="fig-b"><div class="speclimits-chart"><pre>Error: bad spec</pre></div><figcaption><p>Unnumbered.</p></figcaption></figure>
<div class="speclimits-chart"><svg width="10" height="10"></svg></div>
<figure id="fig-wide"><div class="speclimits-chart"><svg width="900" height="10"></svg></div>
<figcaption><p><span class="caption-number">Fig. 2.3 </span>Too wide.</p></figcaption></figure>
<img src="http://example.com/remote.png">
<script>console.error("boom");</script>
"""


def test_the_checker_reports_each_kind_of_defect(browser_ready, tmp_path):
    from speclimits.book.browser import check_site

    site = tmp_path / "html"
    site.mkdir()
    (site / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=good.html" />')
    (site / "good.html").write_text(PAGE.format(title="good", body=GOOD))
    (site / "bad.html").write_text(PAGE.format(title="bad", body=BAD))
    reports = {r.page: r for r in check_site(site, tmp_path / "shots")}
    assert set(reports) == {"good.html", "bad.html"}  # the redirecting index is not a page
    assert reports["good.html"].problems == []
    assert reports["good.html"].figures == ["Fig. 1.1 A chart."]
    problems = "\n".join(reports["bad.html"].problems)
    assert "table tbl-bare has no numbered caption" in problems
    assert "tbl-wide" in problems and "px wide in a 700px column" in problems
    assert "chart 1 did not render: Error: bad spec" in problems
    assert "chart 2 is not inside a numbered figure" in problems
    assert "figure fig-b has no numbered caption" in problems
    assert "chart 3 is 900px wide in a 700px column" in problems
    assert "console: boom" in problems
    assert "request failed: http://example.com/remote.png" in problems  # the network is off
    assert (tmp_path / "shots" / "bad.png").stat().st_size > 0


def _assert_reads_well(html_dir, shots):
    from speclimits.book.browser import check_site, summary

    reports = check_site(html_dir, shots)
    assert [r for r in reports if r.problems] == [], summary(reports)
    pages = {r.page: r for r in reports}
    assert set(pages) == {f"{p}.html" for p in toc_files()}
    for page in toc_files():
        if page.split("/")[-1][:2].isdigit():  # the numbered sections
            r = pages[f"{page}.html"]
            assert r.figures and r.tables, f"{page}: {len(r.figures)} figures, {len(r.tables)} tables"
        assert pages[f"{page}.html"].screenshot.exists()
    return pages


@pytest.mark.book
def test_default_build_reads_well_in_a_browser(browser_ready, default_book):
    """The book as `speclimits book` builds it (bundled measured trace), with smoke settings."""
    pages = _assert_reads_well(default_book / "_build" / "html", default_book / "screenshots")
    intro = pages["book/intro.html"]
    assert any("Key results of every section" in t for t in intro.tables)
