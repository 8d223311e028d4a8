"""Read and write trace directories, and the explicit filters every fit uses.

>>> tr = read_trace("data/traces/sim-default")           # doctest: +SKIP
>>> rounds, report = decode_rounds(tr.rounds, timing="target")  # doctest: +SKIP
>>> print(report)                                         # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from speclimits.errors import Problem, TraceFormatError
from speclimits.jsonutil import jsonable
from speclimits.schema import SCHEMA_VERSION, TABLES


def _table_path(root: Path, name: str) -> Path:
    return root / f"{name}.parquet"


def read_table(root: str | Path, name: str) -> pd.DataFrame | None:
    """Read table ``name`` of the trace at ``root``; ``None`` when absent.

    ``<name>.parquet`` may be a file or a directory of part files (files starting with
    ``.`` or ``_`` are ignored, so half-written parts never count).
    """
    path = _table_path(Path(root), name)
    if not path.exists():
        return None
    try:
        if path.is_dir():
            dataset = pads.dataset(str(path), format="parquet")
            table = dataset.to_table()
        else:
            table = pq.read_table(str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceFormatError(str(root), [Problem(path.name, None, f"cannot be read as Parquet: {exc}")]) from None
    df = table.to_pandas()
    # list columns come back as numpy object arrays of arrays; keep them that way
    return df


def read_meta(root: str | Path) -> dict[str, Any]:
    """Parse ``meta.json``; a missing or broken file raises :class:`TraceFormatError`."""
    path = Path(root) / "meta.json"
    if not Path(root).is_dir():
        raise TraceFormatError(str(root), [Problem(str(root), None, "is not a directory")])
    if not path.exists():
        raise TraceFormatError(str(root), [Problem("meta.json", None, "is missing")])
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceFormatError(str(root), [Problem("meta.json", None, f"is not valid JSON: {exc}")]) from None
    if not isinstance(meta, dict):
        raise TraceFormatError(str(root), [Problem("meta.json", None, "must hold a JSON object")])
    return meta


@dataclass
class Trace:
    """A trace directory: ``meta`` plus lazily loaded tables (pandas DataFrames).

    ``rounds`` has the columns of :data:`speclimits.schema.ROUNDS_COLUMNS`; ``oracle`` and
    ``tokens`` are ``None`` when the trace has no such table.
    """

    path: Path
    meta: dict[str, Any] = field(repr=False)

    @cached_property
    def rounds(self) -> pd.DataFrame:
        df = read_table(self.path, "rounds")
        if df is None:
            raise TraceFormatError(str(self.path), [Problem("rounds.parquet", None, "is missing")])
        return df

    @cached_property
    def oracle(self) -> pd.DataFrame | None:
        return read_table(self.path, "oracle")

    @cached_property
    def tokens(self) -> pd.DataFrame | None:
        return read_table(self.path, "tokens")

    @property
    def simulated(self) -> bool:
        """True when the data come from the simulator, not from a measured engine."""
        return self.meta.get("source") == "simulator"

    @property
    def source_label(self) -> str:
        """A short phrase for captions: 'simulated (preset paper, seed 0)' or 'measured (vLLM 0.32.0 …)'."""
        m = self.meta
        if self.simulated:
            sim = m.get("simulator", {})
            return f"SIMULATED data (speclimits simulator, preset '{sim.get('preset', '?')}', seed {m.get('seed')})"
        engine = m.get("engine") or {}
        return (
            f"measured with {engine.get('name', 'vllm')} {engine.get('version', '')} "
            f"on {m.get('hardware', '?')}, method {m.get('method', '?')}"
        ).replace("  ", " ")


def read_trace(path: str | Path, validate: bool = False) -> Trace:
    """Open the trace directory at ``path``.

    Parameters
    ----------
    path : a directory with ``meta.json`` and ``rounds.parquet``.
    validate : run :func:`speclimits.validate.validate_trace` first (raises on defects).
    """
    root = Path(path)
    if validate:
        from speclimits.validate import validate_trace

        validate_trace(root)
    return Trace(root, read_meta(root))


def new_meta(**fields: Any) -> dict[str, Any]:
    """A meta.json dict with the schema version and creation time filled in."""
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    meta.update(fields)
    return meta


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_meta(path: str | Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (sorted keys, so equal metas give equal bytes)."""
    text = json.dumps(jsonable(meta), indent=2, sort_keys=True) + "\n"
    _atomic_write_bytes(Path(path) / "meta.json", text.encode())


def write_table(path: str | Path, name: str, df: pd.DataFrame | pa.Table) -> Path:
    """Write table ``name`` as one Parquet file, atomically (temp file + rename).

    Columns are written in contract order first, then any extra columns.
    """
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; expected one of {sorted(TABLES)}")
    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    order = [c.name for c in TABLES[name] if c.name in table.column_names]
    order += [c for c in table.column_names if c not in order]
    table = table.select(order)
    target = _table_path(Path(path), name)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    pq.write_table(table, tmp, compression="zstd")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def write_trace(path: str | Path, meta: dict[str, Any], **tables: pd.DataFrame | pa.Table | None) -> Path:
    """Write a whole trace: ``meta.json`` and each table given (``rounds=``, ``oracle=``, ``tokens=``)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, df in tables.items():
        if df is None:
            continue
        write_table(root, name, df)
        counts[name] = int(len(df) if not isinstance(df, pa.Table) else df.num_rows)
    meta = dict(meta)
    meta.setdefault("tables", {}).update(counts)
    write_meta(root, meta)
    return root


# ---------------------------------------------------------------------------
# Filters: explicit, counted, reported.
# ---------------------------------------------------------------------------


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
    """Rounds usable for a fit: decode phase and a non-zero timing.

    For ``timing="draft"`` (and ``"both"``) rounds with K = 0 (plain decoding: no draft, so a
    zero draft time by design) are excluded first and counted as ``n_no_draft``.

    Parameters
    ----------
    rounds : the ``rounds`` table.
    timing : ``"target"`` (drop zero ``t_target_ms``), ``"draft"`` (zero ``t_draft_ms``) or ``"both"``.

    Returns
    -------
    (kept rows with a fresh 0..n-1 index, FilterReport)
    """
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


def list_column(df: pd.DataFrame, column: str, width: int | None = None) -> np.ndarray:
    """Stack a list-valued column into a 2-D float array of shape ``(len(df), width)``.

    Raises :class:`TraceFormatError` naming the first rows whose length differs from ``width``
    (or, when ``width`` is None, from the first row's length).
    """
    values = df[column].to_numpy()
    if len(values) == 0:
        return np.zeros((0, width or 0))
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    expected = int(lengths[0]) if width is None else int(width)
    bad = np.flatnonzero(lengths != expected)
    if bad.size:
        raise TraceFormatError(
            "<table>",
            [Problem("table", column, f"lists must have length {expected}", tuple(bad[:5].tolist()), int(bad.size))],
        )
    return np.concatenate([np.asarray(v, dtype=float) for v in values]).reshape(len(values), expected)
