"""Read and write trace directories: tables, ``meta.json``, part files and the sweep's logs.

Whole tables (:func:`write_trace`) are single Parquet files. The tracing harness writes each table
as a directory of *parts* (:func:`write_part`), one per group of finished generations, with two
JSON-lines logs beside them (``generations.jsonl``, ``parts.jsonl``); a distributed sweep writes each
job's log lines as one file under ``shards/``. Every file is written atomically (dot-prefixed temp
file, then ``os.replace``) and readers skip dot/underscore files, so a killed writer leaves no
half-written file that counts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
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
from speclimits.jsonutil import dumps, jsonable
from speclimits.machine import describe as describe_cpu
from speclimits.trace.schema import FLOAT_COLUMNS, SCHEMA_VERSION, STRING_COLUMNS, TABLES


def _table_path(root: Path, name: str) -> Path:
    return root / f"{name}.parquet"


def read_table(root: str | Path, name: str) -> pd.DataFrame | None:
    """Read table ``name`` of the trace at ``root`` (a file or a directory of parts); ``None`` when absent."""
    path = _table_path(Path(root), name)
    if not path.exists():
        return None
    try:
        table = pads.dataset(str(path), format="parquet").to_table() if path.is_dir() else pq.read_table(str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceFormatError(str(root), [Problem(path.name, None, f"cannot be read as Parquet: {exc}")]) from None
    return table.to_pandas()  # list columns come back as object arrays of arrays


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


def target_top_k(meta: dict[str, Any]) -> int | None:
    """The target's experts per token (``meta.json``'s ``models.target.top_k``), None when not recorded.

    It is the constant Ū of an m = 1 pass: the cost-model fit's convention for alpha(1) and the
    validator's lower bound on ``u_bar`` use it."""
    top_k = ((meta.get("models") or {}).get("target") or {}).get("top_k")
    return int(top_k) if top_k is not None else None


@dataclass
class Trace:
    """A trace directory: ``meta`` plus lazily loaded tables (pandas DataFrames).

    ``rounds`` has the columns of :data:`speclimits.trace.schema.ROUNDS_COLUMNS`; ``oracle``,
    ``tokens`` and ``steps`` (:data:`~speclimits.trace.schema.STEPS_COLUMNS`, batch traces only)
    are ``None`` when the trace has no such table.
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

    @cached_property
    def steps(self) -> pd.DataFrame | None:
        return read_table(self.path, "steps")

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes the trace ran: ``meta.json``'s ``batch_sizes``, else ``[batch_size]``
        (a batch-1 trace records ``batch_size`` = 1 only)."""
        sizes = self.meta.get("batch_sizes")
        return [int(b) for b in sizes] if sizes else [int(self.meta.get("batch_size", 1))]

    @property
    def top_k(self) -> int | None:
        """The target's experts per token, from ``meta.json`` (:func:`target_top_k`)."""
        return target_top_k(self.meta)

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
        cpu = m.get("cpu") or {}
        threads = (m.get("env") or {}).get("OMP_NUM_THREADS")
        where = (f"{describe_cpu(cpu)}" + (f", OMP_NUM_THREADS={threads}" if threads else "") if cpu
                 else f"{m.get('hardware', '?')}; instruction-set flags not recorded")
        return (
            f"measured with {engine.get('name', 'vllm')} {engine.get('version', '')} "
            f"on {where}, method {m.get('method', '?')}"
        ).replace("  ", " ")


def read_trace(path: str | Path) -> Trace:
    """Open the trace directory at ``path``; tables are read when first used (check a trace first with
    :func:`speclimits.trace.validate_trace`, ``speclimits validate``)."""
    root = Path(path)
    return Trace(root, read_meta(root))


def new_meta(**fields: Any) -> dict[str, Any]:
    """A meta.json dict with the schema version and creation time filled in."""
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    meta.update(fields)
    return meta


def _atomic_write(path: Path, data: bytes | pa.Table) -> None:
    """Write ``data`` (bytes, or a table as zstd Parquet) to a dot-prefixed temp file, then rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        if isinstance(data, pa.Table):
            pq.write_table(data, fh, compression="zstd")
        else:
            fh.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_meta(path: str | Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (sorted keys, so equal metas give equal bytes)."""
    text = dumps(meta, indent=2, sort_keys=True) + "\n"
    _atomic_write(Path(path) / "meta.json", text.encode())


def write_table(path: str | Path, name: str, df: pd.DataFrame | pa.Table) -> Path:
    """Write table ``name`` as one Parquet file, atomically; contract columns first, in contract order."""
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; expected one of {sorted(TABLES)}")
    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    order = [c.name for c in TABLES[name] if c.name in table.column_names]
    target = _table_path(Path(path), name)
    _atomic_write(target, table.select(order + [c for c in table.column_names if c not in order]))
    return target


def write_trace(path: str | Path, meta: dict[str, Any], **tables: pd.DataFrame | pa.Table | None) -> Path:
    """Write a whole trace: ``meta.json`` and each table given (``rounds=``, ``oracle=``, ``tokens=``,
    ``steps=``)."""
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
# Part files: a table written as a directory of parts, one per batch of generations
# ---------------------------------------------------------------------------

#: Name prefix of the sweep's part files (rounds and tokens); the Oracle pass uses ``part-s``.
PART_PREFIX = "part-"


def part_name(gid: int) -> str:
    """Name of the serial sweep's part that starts with generation ``gid``: ``part-g{gid:06d}``."""
    return f"part-g{gid:06d}"


def write_part(root: str | Path, table: str, name: str, df: pd.DataFrame | pa.Table) -> Path:
    """Write ``root/<table>.parquet/<name>.parquet`` atomically (dot-temp file + rename)."""
    arrow = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    target = _table_path(Path(root), table) / f"{name}.parquet"
    _atomic_write(target, arrow)
    return target


def _parts(folder: Path, suffix: str) -> dict[str, Path]:
    return {p.stem: p for p in folder.glob(f"{PART_PREFIX}*.{suffix}")} if folder.is_dir() else {}


def list_parts(root: str | Path, table: str) -> dict[str, Path]:
    """The sweep's part files of ``table`` (``part-*.parquet``) by name (file stem)."""
    return _parts(_table_path(Path(root), table), "parquet")


def done_generations(root: str | Path) -> set[int]:
    """Generation ids in the rounds parts (finished generations)."""
    out: set[int] = set()
    for path in list_parts(root, "rounds").values():
        ids = pq.read_table(path, columns=["generation_id"]).column("generation_id").to_numpy()
        out.update(int(g) for g in np.unique(ids))
    return out


def remove_orphan_parts(root: str | Path) -> list[Path]:
    """Delete token and step parts and shard logs without their rounds part (a writer killed mid-part).

    Returns the deleted paths. The rounds part is written last, so its presence is what marks a
    part's generations done; everything written before it is re-written by the retry.
    """
    rounds = list_parts(root, "rounds")
    orphans = [p for table in ("tokens", "steps") for name, p in list_parts(root, table).items()
               if name not in rounds]
    orphans += [p for name, p in _parts(Path(root) / SHARDS_DIR, "json").items() if name not in rounds]
    for p in orphans:
        p.unlink()
    return orphans


def columns_table(chunks: list[dict[str, np.ndarray]], categories: list[str | None] | None) -> pa.Table:
    """One Arrow table from per-generation column dicts (:func:`~speclimits.tracing.records.generation_columns`).

    ``categories``: one per chunk (the ``category`` column; None: no such column). Strings are
    ``large_string`` and ``experts`` ``list<int16>``, as ``pa.Table.from_pandas`` writes them
    (:data:`~speclimits.trace.schema.STRING_COLUMNS`, :data:`~speclimits.trace.schema.FLOAT_COLUMNS`)."""
    names = list(chunks[0])
    arrays = {}
    for name in names:
        values = np.concatenate([c[name] for c in chunks])
        if name == "experts":
            width = values.shape[1] if values.ndim == 2 else 0
            offsets = np.arange(len(values) + 1, dtype=np.int32) * width
            # a row of -1 ids: routing not recorded (a generation's last token), written as null
            missing = (values < 0).all(axis=1) if width else np.zeros(len(values), dtype=bool)
            arrays[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1), pa.int16()),
                                                    mask=pa.array(missing) if missing.any() else None)
        elif name in STRING_COLUMNS:
            arrays[name] = pa.array(values.tolist(), pa.large_string())
        elif name in FLOAT_COLUMNS:
            arrays[name] = pa.array(values.astype(np.float64))
        else:
            arrays[name] = pa.array(values.astype(np.int64))
    if categories is not None:
        cat = [c for chunk, c in zip(chunks, categories) for _ in range(len(chunk[names[0]]))]
        arrays["category"] = pa.array(cat, pa.large_string())
    return pa.table(arrays)


# ---------------------------------------------------------------------------
# The sweep's logs: generations.jsonl, parts.jsonl and (distributed sweeps) shards/*.json
# ---------------------------------------------------------------------------

GENERATIONS_LOG = "generations.jsonl"
PARTS_LOG = "parts.jsonl"
SHARDS_DIR = "shards"


def append_lines(path: str | Path, entries: Iterable[dict[str, Any]]) -> None:
    """Append JSON lines to ``path`` and fsync once."""
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl_by(path: str | Path, key: str, cast: Any) -> dict:
    """Entries of a JSONL log keyed by ``cast(entry[key])`` (the last line wins; a torn line is skipped)."""
    out: dict = {}
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[cast(entry[key])] = entry
    return out


def write_shard_log(root: str | Path, name: str, part: dict[str, Any], generations: list[dict[str, Any]]) -> Path:
    """Write the log lines of one distributed job atomically: ``shards/<name>.json`` holding
    ``{"part": <parts.jsonl entry>, "generations": [<generations.jsonl entries>]}``.

    One file per job (not appends to shared logs), so workers on several machines never write
    the same file and a retried job simply replaces its own."""
    return _write_json(Path(root) / SHARDS_DIR / f"{name}.json", {"part": part, "generations": generations})


#: Where the Oracle pass of a sampled trace keeps the references it sampled (one JSON file each).
REFERENCES_DIR = "references"


def write_reference(root: str | Path, name: str, entry: dict[str, Any]) -> Path:
    """Write one sampled reference of the Oracle pass atomically as ``references/<name>.json``
    (``entry``: ``seq_id``, ``prompt_id``, ``sample``, ``seed``, ``output_token_ids``, ...)."""
    return _write_json(Path(root) / REFERENCES_DIR / f"{name}.json", entry)


def _write_json(target: Path, obj: Any) -> Path:
    _atomic_write(target, (json.dumps(jsonable(obj), sort_keys=True) + "\n").encode())
    return target


def read_references(root: str | Path) -> dict[str, dict[str, Any]]:
    """The sampled references on disk (:func:`write_reference`), by name; empty when there are none."""
    return {name: json.loads(p.read_text(encoding="utf-8"))
            for name, p in sorted(_parts(Path(root) / REFERENCES_DIR, "json").items())}


def read_shard_logs(root: str | Path) -> dict[str, dict[str, Any]]:
    """The shard logs whose rounds part is on disk, by part name (orphans are ignored)."""
    on_disk = list_parts(root, "rounds")
    return {name: json.loads(path.read_text(encoding="utf-8"))
            for name, path in sorted(_parts(Path(root) / SHARDS_DIR, "json").items()) if name in on_disk}


def read_parts_log(root: str | Path) -> dict[str, dict[str, Any]]:
    """Part entries by part name: ``parts.jsonl`` plus the shard logs of finished shards."""
    out = read_jsonl_by(Path(root) / PARTS_LOG, "part", str)
    out.update({name: shard["part"] for name, shard in read_shard_logs(root).items()})
    return out


def read_generations(root: str | Path) -> dict[int, dict[str, Any]]:
    """Generation entries by generation id: ``generations.jsonl`` plus the shard logs of finished shards."""
    out = read_jsonl_by(Path(root) / GENERATIONS_LOG, "generation_id", int)
    for shard in read_shard_logs(root).values():
        out.update({int(g["generation_id"]): g for g in shard["generations"]})
    return out
