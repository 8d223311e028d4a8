"""Shared chart settings."""

from __future__ import annotations

import altair as alt

#: Rows above which charts aggregate or sample instead of drawing every point.
MAX_POINTS = 5000

WIDTH = 430
HEIGHT = 260

alt.data_transformers.disable_max_rows()


def tips(*fields: str, fmt: str = ".3f") -> list[alt.Tooltip]:
    """Tooltips of the quantitative ``fields``, each formatted ``fmt``."""
    return [alt.Tooltip(f"{f}:Q", format=fmt) for f in fields]


def sample_rows(df, n: int = MAX_POINTS, seed: int = 0):
    """At most ``n`` rows of ``df`` (a seeded sample), so a chart stays light in the page."""
    return df if len(df) <= n else df.sample(n=n, random_state=seed)
