"""Sphinx extension used by the book build: drop the script entries that reference a CDN (Jupyter
Book 1 always loads ``sphinx_thebe``, whose script names thebe on a CDN; this book offers no live
kernel), so the built site neither fetches nor names remote code.
"""

from __future__ import annotations

from typing import Any

CDN_MARKERS = ("unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com")
DROP_FILES = ("sphinx-thebe.js",)


def _remote(script: Any) -> bool:
    name = str(getattr(script, "filename", script) or "")
    body = str(getattr(script, "attributes", {}).get("body", ""))
    return any(m in name or m in body for m in CDN_MARKERS) or any(name.endswith(f) for f in DROP_FILES)


def _strip(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    scripts = context.get("script_files")
    if scripts:
        context["script_files"] = [s for s in scripts if not _remote(s)]


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _strip, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
