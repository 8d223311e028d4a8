"""Sphinx extension used by the book build: numbered references that read each target page once.

Sphinx 7.4's standard domain unpickles the target page's whole doctree (which embeds Vega specs) for every
``{numref}``; this override reads each page's doctree once per build for numref resolution only (every
other caller gets a fresh one), and resolves a reference to what a page could not show to its note.
"""

from __future__ import annotations

from typing import Any

from sphinx.domains.std import StandardDomain

from speclimits.book.present import NOT_SHOWN_CLASS


class NumrefOnceDomain(StandardDomain):
    """The standard domain; numbered references look their target pages up in a per-build copy."""

    def _resolve_numref_xref(self, env: Any, *args: Any, **kwargs: Any) -> Any:
        copies: dict[str, Any] = self.__dict__.setdefault("_numref_doctrees", {})
        load = env.get_doctree

        def read_once(docname: str) -> Any:
            if docname not in copies:
                copies[docname] = load(docname)
            return copies[docname]

        # shadow the method for this call only (the parent only inspects the doctree it reads)
        env.get_doctree = read_once
        try:
            resolved = super()._resolve_numref_xref(env, *args, **kwargs)
            return resolved if resolved is not None else self._not_shown(env, *args, **kwargs)
        finally:
            del env.get_doctree

    def _not_shown(self, env: Any, fromdocname: str, builder: Any, typ: str, target: str, node: Any,
                   contnode: Any) -> Any:
        """A reference to a label on a "cannot show" note (class :data:`NOT_SHOWN_CLASS`, put there by
        :func:`speclimits.book.build.link_missing_labels`) reads "Table (not shown on this trace)" (or
        "Fig. ...") and links to the note; None (Sphinx's undefined-label warning) for any other."""
        docname, labelid = self.anonlabels.get(target, ("", ""))
        if not docname:
            return None
        target_node = env.get_doctree(docname).ids.get(labelid)
        if target_node is None or NOT_SHOWN_CLASS not in target_node.get("classes", []):
            return None
        kind = "Fig." if target.startswith("fig-") else "Table"
        return self.build_reference_node(fromdocname, builder, docname, labelid,
                                         f"{kind} (not shown on this trace)", "numref")


def _forget(app: Any, *args: Any) -> None:
    """Drop the copies when the pages are read again (a rebuild in the same process) or at the end."""
    domain = app.env.domains.get("std") if app.env is not None else None
    if domain is not None:
        domain.__dict__.pop("_numref_doctrees", None)


def setup(app: Any) -> dict[str, Any]:
    app.add_domain(NumrefOnceDomain, override=True)
    app.connect("env-updated", _forget)
    app.connect("build-finished", _forget)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
