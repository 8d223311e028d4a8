"""The explicit filters every fit uses, counted and reported, and the list-column reader.

>>> rounds, report = decode_rounds(read_trace("data/traces/sim-default").rounds)  # doctest: +SKIP
>>> print(report)                                                                 # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import Problem, TraceFormatError


@dataclass(frozen=True)
class FilterReport:
    """What :func:`decode_rounds` removed, so every fit can say what it excluded."""

    n_total: int
    n_prefill: int
    n_zero_timing: int
    n_kept: int
    timing: str
    n_no_draft: int = 0

    @property
    def n_candidates(self) -> int:
        """Decode rounds that could have been kept (minus K = 0 rounds for draft fits)."""
        return self.n_total - self.n_prefill - self.n_no_draft

    @property
    def share_zero_timing(self) -> float:
        return self.n_zero_timing / self.n_candidates if self.n_candidates else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_total": self.n_total,
            "n_prefill": self.n_prefill,
            "n_no_draft": self.n_no_draft,
            "n_zero_timing": self.n_zero_timing,
            "share_zero_timing": self.share_zero_timing,
            "n_kept": self.n_kept,
            "timing": self.timing,
        }

    def __str__(self) -> str:
        lines = [f"{self.n_total:,} rounds in the trace",
                 f"  - {self.n_prefill:,} prefill rounds excluded"]
        if self.n_no_draft:
            lines.append(f"  - {self.n_no_draft:,} K=0 rounds excluded (plain decoding: no draft)")
        lines.append(f"  - {self.n_zero_timing:,} decode rounds with a zero {self.timing} timing excluded "
                     f"({100 * self.share_zero_timing:.2f}%)")
        lines.append(f"  = {self.n_kept:,} rounds kept")
        return "\n".join(lines)


TIMING_COLUMNS = {"target": ("t_target_ms",), "draft": ("t_draft_ms",), "both": ("t_target_ms", "t_draft_ms")}


def decode_rounds(rounds: pd.DataFrame, timing: str = "target") -> tuple[pd.DataFrame, FilterReport]:
    """Rounds usable for a fit: decode phase and a non-zero timing; ``(kept rows, fresh 0..n-1 index;
    FilterReport)``. ``timing``: ``"target"`` (drop zero ``t_target_ms``), ``"draft"`` (zero ``t_draft_ms``)
    or ``"both"``; for the last two, K = 0 rounds (no draft, a zero draft time by design) are excluded
    first and counted as ``n_no_draft``."""
    if timing not in TIMING_COLUMNS:
        raise ValueError(f"timing must be one of {sorted(TIMING_COLUMNS)}, got {timing!r}")
    is_decode = rounds["phase"].astype(str).to_numpy() == "decode"
    no_draft = is_decode & (rounds["K"].to_numpy() == 0) if timing != "target" else np.zeros(len(rounds), bool)
    zero = np.zeros(len(rounds), dtype=bool)
    for col in TIMING_COLUMNS[timing]:
        zero |= rounds[col].to_numpy() <= 0
    candidates = is_decode & ~no_draft
    keep = candidates & ~zero
    report = FilterReport(
        n_total=int(len(rounds)),
        n_prefill=int((~is_decode).sum()),
        n_zero_timing=int((candidates & zero).sum()),
        n_kept=int(keep.sum()),
        timing=timing,
        n_no_draft=int(no_draft.sum()),
    )
    return rounds.loc[keep].reset_index(drop=True), report


def list_lengths(values: np.ndarray) -> np.ndarray:
    """(n,) int64 length of each list in ``values`` (an object array); -1 where an entry is None."""
    return np.fromiter((-1 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))


def stack_lists(values: np.ndarray, width: int) -> np.ndarray:
    """Stack ``values`` (n lists, each of length ``width``, already checked) into a float array (n, width)."""
    if len(values) == 0:
        return np.zeros((0, width))
    return np.concatenate([np.asarray(v, dtype=float) for v in values]).reshape(len(values), width)


def list_column(df: pd.DataFrame, column: str, width: int | None = None) -> np.ndarray:
    """Stack a list-valued column into a 2-D float array of shape ``(len(df), width)``.

    Raises :class:`TraceFormatError` naming the first rows whose length differs from ``width``
    (or, when ``width`` is None, from the first row's length).
    """
    values = df[column].to_numpy()
    if len(values) == 0:
        return np.zeros((0, width or 0))
    lengths = list_lengths(values)
    lengths[lengths < 0] = 0
    expected = int(lengths[0]) if width is None else int(width)
    bad = np.flatnonzero(lengths != expected)
    if bad.size:
        raise TraceFormatError(
            "<table>",
            [Problem("table", column, f"lists must have length {expected}", tuple(bad[:5].tolist()), int(bad.size))],
        )
    return stack_lists(values, expected)
