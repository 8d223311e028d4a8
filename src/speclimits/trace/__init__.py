"""The trace format, owned here: schema, reading and writing, filters, validation.

A trace is a directory: ``meta.json`` plus Parquet tables ``rounds``, ``oracle``,
``tokens`` and, for a batch sweep (``speclimits trace --batch``), ``steps`` (each one file or a
directory of parts), and, when the tracing harness wrote it,
its logs (``generations.jsonl``, ``parts.jsonl``, ``shards/``).

========================  ==============================================================
module                    what it owns
========================  ==============================================================
:mod:`.schema`            contract columns, ``SCHEMA_VERSION``, ``META_REQUIRED``
:mod:`.io`                read/write tables and meta, atomic part files, the sweep's logs
:mod:`.filters`           :func:`decode_rounds` / :class:`FilterReport`, :func:`list_column`
:mod:`.validate`          :func:`validate_trace`, and the one ``oracle.parquet`` checker
:mod:`.cli`               ``speclimits validate``
========================  ==============================================================

>>> from speclimits.trace import read_trace, decode_rounds, validate_trace  # doctest: +SKIP
"""

from speclimits.trace.filters import FilterReport, decode_rounds, list_column
from speclimits.trace.io import (
    Trace,
    append_lines,
    columns_table,
    done_generations,
    list_parts,
    new_meta,
    part_name,
    read_generations,
    read_meta,
    read_parts_log,
    read_shard_logs,
    read_table,
    read_trace,
    remove_orphan_parts,
    target_top_k,
    write_meta,
    write_part,
    write_shard_log,
    write_table,
    write_trace,
)
from speclimits.trace.schema import META_REQUIRED, SCHEMA_VERSION, SOURCES, TABLES, Column, column_names
from speclimits.trace.validate import (
    OracleFrame,
    check_oracle_frame,
    find_problems,
    read_oracle_frame,
    validate_trace,
)

__all__ = [
    "Column", "FilterReport", "META_REQUIRED", "OracleFrame", "SCHEMA_VERSION", "SOURCES", "TABLES", "Trace",
    "append_lines", "check_oracle_frame", "column_names", "columns_table", "decode_rounds", "done_generations",
    "find_problems", "list_column", "list_parts", "new_meta", "part_name", "read_generations", "read_meta",
    "read_oracle_frame", "read_parts_log", "read_shard_logs", "read_table", "read_trace", "remove_orphan_parts",
    "target_top_k", "validate_trace", "write_meta", "write_part", "write_shard_log", "write_table", "write_trace",
]
