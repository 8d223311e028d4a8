"""Open every page of a built book in headless Chromium, as a reader would, and check it
(``speclimits book --check``): Playwright answers the site's requests from ``html_dir`` and refuses every
other (the site must read offline); every chart must render inside a figure, every figure and table have a
numbered caption, nothing be wider than the column, MathJax typeset, and the console stay clean. A full-page
screenshot of each page goes to ``screenshots/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from speclimits.errors import SpeclimitsError

#: Where Debian's package puts the browser (``apt-get install chromium``).
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
#: Flags that keep Chromium from reaching for the network on its own (updates, sync, lookups).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
VIEWPORT = {"width": 1280, "height": 900}
#: The address the pages are opened at: Playwright answers its requests from the built folder (no server runs).
SITE_URL = "http://book.localhost"

# Runs in the page: what the checks need, gathered in one pass.
_INSPECT = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const column = article.getBoundingClientRect().width;
  const charts = [...article.querySelectorAll('.speclimits-chart')].map((el, i) => ({
    index: i,
    drawn: !!el.querySelector('svg, canvas'),
    error: (el.querySelector('pre, em') || {}).textContent || null,
    inFigure: !!el.closest('figure'),
    drawnWidth: (el.querySelector('svg, canvas') || {getBoundingClientRect: () => ({width: 0})})
                  .getBoundingClientRect().width,
    width: el.getBoundingClientRect().width,
  }));
  const numbered = (cap) => !!(cap && cap.querySelector('.caption-number') &&
                               cap.querySelector('.caption-number').textContent.trim().length > 0);
  const captionText = (cap) => cap ? cap.textContent.trim().replace(/\s+/g, ' ').slice(0, 160) : null;
  const figures = [...article.querySelectorAll('figure')].map((el) => {
    const cap = el.querySelector('figcaption');
    return {id: el.id || null, numbered: numbered(cap), caption: captionText(cap)};
  });
  const tables = [...article.querySelectorAll('table')].map((el) => {
    const cap = el.querySelector('caption');
    const box = el.parentElement;
    return {
      id: el.id || null, numbered: numbered(cap), caption: captionText(cap),
      width: el.getBoundingClientRect().width, column: column,
      overflow: box ? box.scrollWidth - box.clientWidth : 0,
    };
  });
  const wideMath = [...article.querySelectorAll('mjx-container[display="true"]')]
    .map((el) => el.getBoundingClientRect().width).filter((w) => w > column + 1);
  const mathErrors = article.querySelectorAll('mjx-merror').length;
  const math = article.querySelectorAll('mjx-container').length;
  const rawMath = [...article.querySelectorAll('.math')].filter((el) => !el.querySelector('mjx-container')).length;
  return {charts, figures, tables, math, mathErrors, rawMath, column, wideMath,
          title: document.title};
}
"""


@dataclass
class PageReport:
    page: str
    charts: int = 0
    figures: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def find_chromium() -> str:
    """The Chromium binary (``SPECLIMITS_CHROMIUM`` overrides), or a clear error naming the package."""
    found = next((c for c in (os.environ.get("SPECLIMITS_CHROMIUM"), *CHROMIUM_CANDIDATES) if c and Path(c).exists()),
                 None) or shutil.which("chromium")
    if found:
        return found
    raise SpeclimitsError("the browser check needs Chromium: apt-get install chromium (Debian), "
                          "or set SPECLIMITS_CHROMIUM=/path/to/chrome")


def site_pages(html_dir: Path) -> list[str]:
    """The book's pages (relative paths of the HTML files), skipping Sphinx's own search/index pages."""
    skip = {"search.html", "genindex.html", "py-modindex.html"}
    pages = []
    for p in sorted(html_dir.rglob("*.html")):
        if p.name in skip or "_static" in p.parts or "_sources" in p.parts:
            continue
        if p.read_text(errors="replace").lstrip().startswith('<meta http-equiv="Refresh"'):
            continue  # the root index.html only redirects to the first page
        pages.append(p.relative_to(html_dir).as_posix())
    return pages


def _check_page(page, url: str, rel: str, shots: Path | None) -> PageReport:
    report = PageReport(rel)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: console.append(f"request failed: {r.url} ({r.failure})"))
    page.goto(f"{url}/{rel}", wait_until="load")
    # charts are drawn asynchronously by vegaEmbed; MathJax typesets after load
    try:
        page.wait_for_function(
            "() => [...document.querySelectorAll('.speclimits-chart')].every("
            "el => el.querySelector('svg, canvas') || el.querySelector('pre, em'))", timeout=30_000)
    except Exception:  # reported below, per chart
        pass
    with contextlib.suppress(Exception):
        page.wait_for_function("() => !window.MathJax || !MathJax.startup || !MathJax.startup.promise || "
                               "document.querySelectorAll('.math').length === 0 || "
                               "document.querySelectorAll('mjx-container').length > 0", timeout=20_000)
        page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    info = page.evaluate(_INSPECT)
    report.charts = len(info["charts"])
    for chart in info["charts"]:
        if not chart["drawn"]:
            report.problems.append(f"chart {chart['index'] + 1} did not render"
                                   + (f": {chart['error']}" if chart["error"] else ""))
        if chart["drawnWidth"] > info["column"] + 1:
            report.problems.append(f"chart {chart['index'] + 1} is {chart['drawnWidth']:.0f}px wide in a "
                                   f"{info['column']:.0f}px column (clipped)")
        if not chart["inFigure"]:
            report.problems.append(f"chart {chart['index'] + 1} is not inside a numbered figure")
    for fig in info["figures"]:
        report.figures.append(fig["caption"] or "(no caption)")
        if not fig["numbered"]:
            report.problems.append(f"figure {fig['id'] or '?'} has no numbered caption: {fig['caption']!r}")
    for tab in info["tables"]:
        report.tables.append(tab["caption"] or "(no caption)")
        if not tab["numbered"]:
            report.problems.append(f"table {tab['id'] or '?'} has no numbered caption: {tab['caption']!r}")
        if tab["width"] > tab["column"] + 1 or tab["overflow"] > 1:
            report.problems.append(f"table {tab['id'] or '?'} ({(tab['caption'] or '')[:40]!r}) is "
                                   f"{tab['width']:.0f}px wide in a {tab['column']:.0f}px column")
    for width in info["wideMath"]:
        report.problems.append(f"a display equation is {width:.0f}px wide in a {info['column']:.0f}px column")
    if info["mathErrors"]:
        report.problems.append(f"{info['mathErrors']} MathJax errors")
    if info["rawMath"]:
        report.problems.append(f"{info['rawMath']} math blocks left untypeset")
    report.problems += [f"console: {c}" for c in console]
    if shots is not None:
        target = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
        page.screenshot(path=str(target), full_page=True)
        report.screenshot = target
    return report


def check_site(html_dir: str | Path, screenshots: str | Path | None = None) -> list[PageReport]:
    """Check every page of the site in ``html_dir``; screenshots to ``screenshots`` (default: beside it)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SpeclimitsError("the browser check needs Playwright: pip install -e '.[browser]' "
                              "(it drives the system Chromium; no browser is downloaded)") from None
    html_dir = Path(html_dir)
    if not (html_dir / "index.html").exists():
        raise SpeclimitsError(f"{html_dir} has no index.html: build the book first (speclimits book)")
    shots = Path(screenshots) if screenshots else html_dir.parent.parent / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    reports = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), headless=True, args=list(CHROMIUM_ARGS))
        try:
            context = browser.new_context(viewport=VIEWPORT, service_workers="block")

            def from_disk(route) -> None:  # the site's own files from html_dir; any other request fails
                path = html_dir / unquote(urlsplit(route.request.url).path).lstrip("/")
                if route.request.url.startswith(SITE_URL + "/") and path.is_file():
                    route.fulfill(path=path)
                else:
                    route.abort("internetdisconnected")

            context.route("**/*", from_disk)
            for rel in site_pages(html_dir):
                page = context.new_page()
                try:
                    reports.append(_check_page(page, SITE_URL, rel, shots))
                finally:
                    page.close()
        finally:
            browser.close()
    return reports


def summary(reports: list[PageReport]) -> str:
    lines = []
    for r in reports:
        status = "ok" if not r.problems else f"{len(r.problems)} problem(s)"
        lines.append(f"{r.page}: {r.charts} charts, {len(r.figures)} figures, {len(r.tables)} tables — {status}")
        lines += [f"    - {p}" for p in r.problems]
    return "\n".join(lines)
