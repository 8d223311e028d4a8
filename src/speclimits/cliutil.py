"""Small helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from speclimits.errors import SpeclimitsError
from speclimits.vocabulary import SURROGATES


def parse_int_list(spec: str, flag: str, example: str, noun: str, minimum: int) -> list[int]:
    """``"1-10"``, ``"0,1,2,4"`` or ``"0,2-4"`` -> the sorted unique integers, each >= ``minimum`` (every
    command's K and batch-size lists); a bad spec raises one line naming ``flag`` and an ``example``."""
    out: set[int] = set()
    try:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise SpeclimitsError(f"{flag} expects e.g. {example}, got {spec!r}") from None
    if not out or min(out) < minimum:
        raise SpeclimitsError(f"{flag} needs at least one {noun} >= {minimum}, got {spec!r}")
    return sorted(out)


def parse_positive_floats(spec: str, flag: str, example: str, noun: str) -> list[float]:
    """``"0.5,1,2,4"`` -> the sorted unique positive finite numbers of a list option; a bad spec raises one
    line naming ``flag`` and an ``example``."""
    import math

    try:
        out = {float(part) for part in str(spec).split(",") if part.strip()}
    except ValueError:
        raise SpeclimitsError(f"{flag} expects e.g. {example}, got {spec!r}") from None
    if not out or any(not (math.isfinite(q) and q > 0) for q in out):
        raise SpeclimitsError(f"{flag} needs positive finite {noun}, got {spec!r}")
    return sorted(out)


def parse_batch_sizes(spec: str, flag: str = "--batch") -> list[int]:
    """``"1,2,4,8"`` or ``"1-4"`` -> the sorted unique batch sizes (>= 1) of a ``--batch`` option."""
    return parse_int_list(spec, flag, "'1,2,4,8' or '1-4'", "batch size", 1)


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


def add_oracle_arguments(p: argparse.ArgumentParser, needs: str = "oracle.parquet") -> None:
    """The arguments every command that solves the Oracle shares, with the book's defaults:
    ``TRACE``, ``--cost-model``, ``--k-max`` and ``--surrogate``."""
    p.add_argument("trace", type=Path, metavar="TRACE", help=f"trace directory with {needs}")
    p.add_argument("--cost-model", type=Path, metavar="JSON",
                   help="cost-model JSON (default: fit on the trace's rounds, the fit the book's section 3 writes)")
    p.add_argument("--k-max", type=int, default=None, metavar="N",
                   help="largest draft length (default: the length of the match_prob lists)")
    p.add_argument("--surrogate", choices=SURROGATES, default="auto",
                   help="transition probabilities: raw (match_prob as recorded), calibrated (isotonic maps per draft "
                        "position, cross-fitted by sequence, of the observed greedy matches), exact (the observed "
                        "greedy match length: the hindsight bound), or auto (default, as in the book: calibrated "
                        "when the trace shows a calibration gap, raw otherwise)")
