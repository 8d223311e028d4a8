"""Read what an altair chart encodes: its fields by channel and the rows it plots (for chart tests)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def encodings(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """Every ``(channel, field)`` encoded anywhere in a Vega-Lite spec (layers, facets, concats)."""
    out: set[tuple[str, str]] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for channel, enc in (node.get("encoding") or {}).items():
                for e in enc if isinstance(enc, list) else [enc]:
                    if isinstance(e, dict) and "field" in e:
                        out.add((channel, e["field"]))
            for key in ("layer", "hconcat", "vconcat", "concat"):
                for child in node.get(key, []):
                    walk(child)
            if "spec" in node:
                walk(node["spec"])
            if "facet" in node and isinstance(node["facet"], dict):
                for channel, e in node["facet"].items():
                    if isinstance(e, dict) and "field" in e:
                        out.add((channel, e["field"]))

    walk(spec)
    return out


def dataset_with(spec: dict[str, Any], *columns: str) -> pd.DataFrame:
    """The first inline dataset of a spec that has all ``columns``."""
    frames = [pd.DataFrame(rows) for rows in (spec.get("datasets") or {}).values()]
    found = [d for d in frames if set(columns) <= set(d.columns)]
    assert found, f"no dataset with columns {columns}; have {[list(d.columns) for d in frames]}"
    return found[0]
