"""The sampling parameters of a trace: what ``speclimits trace --temperature/--top-p/--seed`` runs and records.

A trace made without ``--temperature`` (or with ``--temperature 0``) is **greedy**, as every trace made
before sampling existed: its meta.json has no ``sampling`` record. A sampled trace (temperature T > 0)
records ``meta["sampling"]``::

    {"temperature": T, "top_p": P, "seed": S, "request_seeds": "<the rule below, in words>"}

Every request of a sampled trace carries its own seed, derived from S and what the request is
(:meth:`Sampling.request_seed`): a prompt's sweep generations (every K, every batch size) share
sample 0's seed; the Oracle pass's further sampled references of the prompt are samples 1, 2, ...; its
per-state requests have seeds of their own. So a sampled trace is reproducible from its meta.json.

:func:`sampling_problems` is the one range rule, used on the command line's flags (before any engine
is built) and by ``speclimits validate`` on the record. This module imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

#: The meta.json key of the record.
SAMPLING_KEY = "sampling"
#: Sampled references per prompt of the Oracle pass when ``--oracle-samples`` is not given (T > 0).
DEFAULT_ORACLE_SAMPLES = 2
#: How :meth:`Sampling.request_seed` derives a request's seed, in words (recorded in meta.json).
REQUEST_SEED_RULE = ("the first 8 bytes of sha256('{seed}:{key}:{index}'), big-endian, mod 2**31; key = the prompt id "
                     "and index = the sample for a prompt's generations (sample 0: its sweep generation at every K "
                     "and batch size; 1, 2, ...: the Oracle pass's further references); key = 'oracle:' + seq_id and "
                     "index = pos for an Oracle state's request")
#: The command-line flag of each field (messages name the flag on the command line).
FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "seed": "--seed"}


def sample_seq_id(prompt_id: str, sample: int) -> str:
    """The ``seq_id`` of a prompt's sampled reference ``sample``: the prompt id for sample 0 (its sweep
    generation, as in a greedy trace), ``"<prompt id>#<sample>"`` for the others."""
    return str(prompt_id) if sample == 0 else f"{prompt_id}#{sample}"


def seq_prompt(seq_id: str) -> str:
    """The prompt id of a reference ``seq_id`` (:func:`sample_seq_id` undone; a greedy trace's ids as they are)."""
    head, sep, tail = str(seq_id).rpartition("#")
    return head if sep and tail.isdigit() else str(seq_id)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def sampling_problems(temperature: Any, top_p: Any, seed: Any) -> list[tuple[str, str]]:
    """``(field, message)`` for each value out of its range: a temperature that is not a finite number
    >= 0, a top-p outside (0, 1], a seed that is not an integer. Empty when all are valid."""
    out = []
    if not (_is_number(temperature) and math.isfinite(temperature) and temperature >= 0):
        out.append(("temperature", f"must be a finite number >= 0 (0: greedy), got {temperature!r}"))
    if not (_is_number(top_p) and math.isfinite(top_p) and 0 < top_p <= 1):
        out.append(("top_p", f"must be a number in (0, 1], got {top_p!r}"))
    if not (isinstance(seed, int) and not isinstance(seed, bool)):
        out.append(("seed", f"must be an integer, got {seed!r}"))
    return out


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of a trace's requests. ``temperature == 0``: greedy (``top_p`` has no effect)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def record(self) -> dict[str, Any]:
        """meta.json's ``sampling`` record (written for sampled traces only)."""
        return {"temperature": float(self.temperature), "top_p": float(self.top_p), "seed": int(self.seed),
                "request_seeds": REQUEST_SEED_RULE}

    def request_seed(self, key: str, index: int = 0) -> int:
        """The seed of one request (see :data:`REQUEST_SEED_RULE`): stable across runs, machines and Python
        versions, in [0, 2**31)."""
        digest = hashlib.sha256(f"{int(self.seed)}:{key}:{int(index)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % (2 ** 31)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "Sampling":
        """The sampling of a trace from its meta.json (no record: greedy, with the trace's seed)."""
        rec = meta.get(SAMPLING_KEY)
        if not rec:
            return cls(0.0, 1.0, int(meta.get("seed") or 0))
        return cls(float(rec["temperature"]), float(rec["top_p"]), int(rec["seed"]))
