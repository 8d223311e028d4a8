"""One JSON cleaner for every command and file the package writes.

:func:`jsonable` turns DataFrames (records), Series (dicts), numpy arrays and scalars, paths
and objects with ``to_dict()`` into plain JSON values; NaN and infinities become ``null``
(JSON has no NaN, and ``json.dumps`` would otherwise write the invalid token ``NaN``).
:func:`dumps` is ``json.dumps`` over :func:`jsonable`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy of ``obj`` (see the module docstring for what is converted)."""
    # pandas is looked up, not imported: a process that never imported it (the vLLM worker's policy
    # reader) holds no DataFrame, and stays free of it
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(obj, pd.DataFrame):
        frame = obj if isinstance(obj.index, pd.RangeIndex) else obj.reset_index()
        return [jsonable(r) for r in frame.to_dict(orient="records")]
    if pd is not None and isinstance(obj, pd.Series):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, Path):
        return str(obj)
    if pd is not None and (obj is pd.NA or obj is pd.NaT):
        return None
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return jsonable(obj.to_dict())
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(jsonable(obj), **kwargs)``; strict (``allow_nan=False``): a NaN left over is a bug."""
    kwargs.setdefault("allow_nan", False)
    return json.dumps(jsonable(obj), **kwargs)


def read_json(path: str | Path, what: str, error: type[Exception], missing_hint: str = "") -> Any:
    """Parse the JSON file ``path``; a missing or broken file raises ``error`` with one message
    naming ``what`` and the path (``missing_hint`` is added when the file does not exist)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise error(f"{what} {p}: file not found{' (' + missing_hint + ')' if missing_hint else ''}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} {p}: not valid JSON: {exc}") from None
