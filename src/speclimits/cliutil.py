"""Small helpers shared by the subcommands."""

from __future__ import annotations

import json
from typing import Any

from speclimits.errors import SpeclimitsError


def parse_assignments(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """``["n=3", "ks=[1,2]", "name=abc"]`` -> ``{"n": 3, "ks": [1, 2], "name": "abc"}``.

    Each VALUE is read as JSON when it parses, else kept as a string.
    """
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SpeclimitsError(f"{flag} expects NAME=VALUE (VALUE as JSON), got {item!r}")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out
