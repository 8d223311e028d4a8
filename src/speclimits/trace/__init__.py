"""The trace format, owned here: the contract columns (:mod:`.schema`), reading and writing tables,
meta and the sweep's logs (:mod:`.io`), the fit filters (:mod:`.filters`), validation (:mod:`.validate`,
``speclimits validate``). A trace is a directory: ``meta.json``, Parquet tables ``rounds``, ``oracle``,
``tokens`` and (batch sweeps) ``steps``, each one file or a directory of parts, and the harness's logs.
"""

from speclimits.trace.filters import FilterReport, decode_rounds, list_column
from speclimits.trace.io import (Trace, append_lines, columns_table, done_generations, list_parts, new_meta, part_name,
                                 read_generations, read_meta, read_parts_log, read_shard_logs, read_table, read_trace,
                                 remove_orphan_parts, target_top_k, write_meta, write_part, write_shard_log,
                                 write_table, write_trace)
from speclimits.trace.schema import META_REQUIRED, SCHEMA_VERSION, SOURCES, TABLES, Column
from speclimits.trace.validate import OracleFrame, check_oracle_frame, find_problems, read_oracle_frame, validate_trace

__all__ = [
    "Column", "FilterReport", "META_REQUIRED", "OracleFrame", "SCHEMA_VERSION", "SOURCES", "TABLES", "Trace",
    "append_lines", "check_oracle_frame", "columns_table", "decode_rounds", "done_generations",
    "find_problems", "list_column", "list_parts", "new_meta", "part_name", "read_generations", "read_meta",
    "read_oracle_frame", "read_parts_log", "read_shard_logs", "read_table", "read_trace", "remove_orphan_parts",
    "target_top_k", "validate_trace", "write_meta", "write_part", "write_shard_log", "write_table", "write_trace",
]
