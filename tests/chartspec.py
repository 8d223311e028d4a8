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


def datasets(spec: dict[str, Any]) -> list[pd.DataFrame]:
    """The inline datasets of a spec, as DataFrames, in the order the spec lists them."""
    return [pd.DataFrame(rows) for rows in (spec.get("datasets") or {}).values()]


def dataset_with(spec: dict[str, Any], *columns: str) -> pd.DataFrame:
    """The one inline dataset that has all ``columns``."""
    found = [d for d in datasets(spec) if set(columns) <= set(d.columns)]
    assert len(found) >= 1, f"no dataset with columns {columns}; have {[list(d.columns) for d in datasets(spec)]}"
    return found[0]
