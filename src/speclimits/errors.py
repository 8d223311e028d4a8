"""Typed exceptions. The command line turns these into one message and exit code 2."""

from __future__ import annotations

from dataclasses import dataclass, field


class SpeclimitsError(Exception):
    """Base class for every error speclimits raises on purpose (bad input, bad files)."""


@dataclass(frozen=True)
class Problem:
    """One defect found in a trace.

    Attributes
    ----------
    file : the table or file name, e.g. ``rounds.parquet`` or ``meta.json``.
    column : the offending column (``None`` for file-level problems).
    message : what is wrong, in words.
    rows : up to a few 0-based row numbers where it happens (empty for file-level problems).
    n_rows : how many rows are affected in total.
    """

    file: str
    column: str | None
    message: str
    rows: tuple[int, ...] = field(default_factory=tuple)
    n_rows: int = 0

    def __str__(self) -> str:
        where = self.file if self.column is None else f"{self.file}, column '{self.column}'"
        text = f"{where}: {self.message}"
        if self.n_rows:
            shown = ", ".join(str(r) for r in self.rows)
            more = f" (and {self.n_rows - len(self.rows)} more)" if self.n_rows > len(self.rows) else ""
            text += f" [{self.n_rows} row(s); first at row {shown}{more}]"
        return text


class TraceFormatError(SpeclimitsError):
    """A trace directory does not meet the data contract.

    ``problems`` lists every defect found; ``str(err)`` is one readable message.
    """

    def __init__(self, path: str, problems: list[Problem]):
        self.path = str(path)
        self.problems = list(problems)
        lines = [f"trace {self.path} is not valid ({len(self.problems)} problem(s)):"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class CostModelError(SpeclimitsError):
    """A cost-model JSON is missing a field, has a wrong type, or lacks a needed m."""
