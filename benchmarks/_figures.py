"""The figures a benchmark reports, as one record each, and the JSON file ``--json PATH`` writes.

Every ``benchmarks/bench_*.py`` prints what it measures and, given ``--json PATH``, also writes its
headline figures here; ``benchmarks/run_all.py`` reads them back into one table. A figure has a
value, a unit, and optionally a target and a direction: ``better="lower"`` (a time: met when
value <= target) or ``"higher"`` (a speed ratio: met when value >= target). Its ``ratio`` is
value / target for lower-is-better and target / value for higher-is-better, so that a ratio
<= 1 always means the target is met. No target: no ratio.

Standard library only (numpy scalars are accepted as values), so that every script can import it.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

BETTER = ("lower", "higher")


@dataclass
class Figure:
    """One reported number: ``name``, ``value`` in ``unit``; ``target`` (None: no target) and whether
    ``better`` is ``"lower"`` or ``"higher"``; a free ``note`` (how it was measured, its spread)."""

    name: str
    value: float | None
    unit: str = ""
    target: float | None = None
    better: str = "lower"
    note: str = ""

    def __post_init__(self) -> None:
        if self.better not in BETTER:
            raise ValueError(f"Figure {self.name!r}: better must be one of {BETTER}, not {self.better!r}")
        self.value = _number(self.value)
        self.target = _number(self.target)

    @property
    def ratio(self) -> float | None:
        """value / target (lower is better) or target / value (higher is better); <= 1: met.
        None without a target or a value; inf where the division has no finite answer and the
        target is missed (a higher-is-better value <= 0, a positive time against a target of 0)."""
        v, t = self.value, self.target
        if v is None or t is None:
            return None
        if self.better == "lower":
            if t == 0:
                return 0.0 if v <= 0 else math.inf
            return v / t
        if v <= 0:
            return math.inf
        return t / v

    @property
    def met(self) -> bool | None:
        """ratio <= 1; None without a ratio."""
        r = self.ratio
        return None if r is None else bool(r <= 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        r = self.ratio
        d["ratio"] = None if r is None or not math.isfinite(r) else r
        d["met"] = self.met
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Figure":
        return cls(name=d["name"], value=d.get("value"), unit=d.get("unit", ""), target=d.get("target"),
                   better=d.get("better", "lower"), note=d.get("note", ""))


def _number(x: Any) -> float | None:
    """A float, or None for None / NaN (JSON has no NaN); bools become 1.0 / 0.0."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def write_figures(path: str | Path, figures: Iterable[Figure], extra: dict[str, Any] | None = None) -> Path:
    """Write ``{"script", "argv", "written_at", "python", "figures": [...], "extra": {...}}`` to ``path``."""
    path = Path(path)
    doc = {"script": Path(sys.argv[0]).name, "argv": sys.argv[1:],
           "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
           "figures": [f.to_dict() for f in figures], "extra": extra or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")
    return path


def read_figures(path: str | Path) -> tuple[list[Figure], dict[str, Any]]:
    """The figures and the whole document of a file :func:`write_figures` wrote."""
    doc = json.loads(Path(path).read_text())
    return [Figure.from_dict(d) for d in doc.get("figures", [])], doc


def _clean(x: Any) -> Any:
    """JSON-ready: numpy scalars and arrays as Python numbers and lists, paths as strings, NaN and
    infinities as None (what the scripts put in ``extra``)."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return _clean(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
