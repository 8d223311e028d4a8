"""``speclimits book``: execute the book's notebooks on a trace and build the static site."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from speclimits.book.build import build_book
from speclimits.paths import BUILD_DIR, default_trace


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "book",
        help="execute the book's notebooks on a trace and build the static site",
        description=(
            "Convert book/*.py (jupytext percent) to notebooks, execute them with papermill on a trace "
            "(parameters trace, smoke, seed), and build the site with Jupyter Book 1 (warnings are errors). "
            "The site reads offline: MathJax (from the Python package django-static-mathjax) and Vega "
            "(bundled by vl-convert) are served from _static. Without --trace the bundled default trace is used."
        ),
        epilog="example: speclimits book --trace /tmp/my-trace --out /tmp/site",
    )
    p.add_argument("--trace", type=Path, default=None, help="trace directory (default: %s)" % default_trace())
    p.add_argument("--smoke", action="store_true", help="small settings in every notebook (fast; for tests)")
    p.add_argument("--seed", type=int, default=0, help="seed injected into every notebook (default 0)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"output folder; the site lands in OUT/_build/html (default: {BUILD_DIR / 'book'})")
    p.add_argument("--pages", nargs="+", metavar="PAGE", default=None,
                   help="execute only these pages again (e.g. 03_final_model) and reuse the others from the last "
                        "build in --out; for editing one section")
    p.add_argument("--check", action="store_true",
                   help="after the build, open every page in headless Chromium (Debian's chromium, network off) and "
                        "check charts, numbered captions, table widths and the console; screenshots to OUT/screenshots")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="notebooks executed at once (default: one per core, at most 2; 1 = one after another); "
                        "a page waits for the pages it reads (the cost model of section 3; the intro for all)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    index = build_book(args.trace, smoke=args.smoke, out=args.out, seed=args.seed, progress=not args.quiet,
                       pages=args.pages, jobs=args.jobs)
    print(f"book built in {time.perf_counter() - t0:.0f} s: {index}")
    if args.check:
        from speclimits.book.browser import check_site, summary

        reports = check_site(index.parent)
        print(summary(reports))
        bad = sum(bool(r.problems) for r in reports)
        print(f"browser check: {len(reports) - bad} of {len(reports)} pages clean; "
              f"screenshots in {index.parent.parent.parent / 'screenshots'}")
        return 1 if bad else 0
    return 0
