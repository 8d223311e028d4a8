"""Oracle inputs: per-state arrays built from ``oracle.parquet`` and round costs from a :class:`CostModel`.

Semantics (the book's methods page, "The Oracle"): state ``pos`` runs 0..N-1 within each ``seq_id``; in that state N - pos
tokens remain and a round's progress is capped at that. The cost of action k is
``a·k + b + beta0(k+1) + alpha(k+1)·u_bar_window[k] + c·context_len`` (k = 0: no draft cost,
m = 1, ``u_bar_window[0]``), and ``P(a >= j) = prod_{i<j} match_prob[i]`` (0-based lists).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from speclimits.costmodel import CostModel
from speclimits.errors import Problem, SpeclimitsError, TraceFormatError
from speclimits.trace.validate import read_oracle_frame

FILE = "oracle.parquet"
#: The per-state arrays of :class:`OracleInputs` (one row per state).
PER_STATE = ("pos", "context_len", "accept_len", "match_prob", "draft_conf", "u_bar_window")


@dataclass(frozen=True, eq=False)
class OracleInputs:
    """Reference sequences as flat per-state arrays, sorted by sequence then ``pos``.

    Attributes
    ----------
    seq_ids : (S,) sequence ids, in the order of the state blocks.
    offsets : (S + 1,) states of sequence s are rows ``offsets[s]:offsets[s + 1]``.
    pos, context_len, accept_len : (n,) per state.
    match_prob, draft_conf : (n, K_list) floats in [0, 1].
    u_bar_window : (n, K_list + 1) Ū for windows m = 1..K_list + 1.
    category : (S,) prompt category per sequence, or None.
    origin : where the arrays came from (used in error messages).
    """

    seq_ids: np.ndarray
    offsets: np.ndarray
    pos: np.ndarray
    context_len: np.ndarray
    accept_len: np.ndarray
    match_prob: np.ndarray
    draft_conf: np.ndarray
    u_bar_window: np.ndarray
    category: np.ndarray | None = None
    origin: str = FILE
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the solver gathers rows with np.take, which copies a non-contiguous array on every call
        for name in PER_STATE:
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name)))

    @property
    def n_states(self) -> int:
        return int(len(self.pos))

    @property
    def n_sequences(self) -> int:
        return int(len(self.seq_ids))

    @property
    def k_list(self) -> int:
        """Length of the ``match_prob`` lists: the largest K_max these inputs support."""
        return int(self.match_prob.shape[1])

    @property
    def n_tokens(self) -> np.ndarray:
        """(S,) reference length N of each sequence."""
        return np.diff(self.offsets)

    @property
    def seq_index(self) -> np.ndarray:
        """(n,) index into ``seq_ids`` of each state."""
        if "seq_index" not in self._cache:
            self._cache["seq_index"] = np.repeat(np.arange(self.n_sequences), self.n_tokens)
        return self._cache["seq_index"]

    @property
    def remaining(self) -> np.ndarray:
        """(n,) tokens still to emit in each state, N - pos (>= 1)."""
        return self.n_tokens[self.seq_index] - self.pos

    def _states(self, rows: np.ndarray, n_tokens: np.ndarray, **changes: Any) -> "OracleInputs":
        """The states ``rows`` (every per-state array gathered) as sequences of ``n_tokens`` states."""
        offsets = np.concatenate([[0], np.cumsum(n_tokens)]).astype(np.int64)
        return replace(self, offsets=offsets, _cache={}, **{n: getattr(self, n)[rows] for n in PER_STATE}, **changes)

    def subset(self, seqs: np.ndarray | list[int]) -> "OracleInputs":
        """The inputs restricted to the sequences with indices ``seqs`` (in that order)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        rows = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in seqs]) if len(seqs) else \
            np.zeros(0, np.int64)
        return self._states(rows, self.n_tokens[seqs], seq_ids=self.seq_ids[seqs],
                            category=None if self.category is None else self.category[seqs])

    def head(self, n_states: int) -> "OracleInputs":
        """The first ``n_states`` states of every sequence (a generation of ``n_states + 1`` tokens, the
        first of which comes from the prefill)."""
        if n_states < 1:
            raise SpeclimitsError(f"n_states must be >= 1, got {n_states}")
        return self._states(self.pos < n_states, np.minimum(self.n_tokens, n_states))

    def to_frame(self) -> pd.DataFrame:
        """Scalar per-state columns: ``seq_id``, ``pos``, ``remaining``, ``context_len``, ``accept_len``."""
        return pd.DataFrame({
            "seq_id": self.seq_ids[self.seq_index], "pos": self.pos, "remaining": self.remaining,
            "context_len": self.context_len, "accept_len": self.accept_len,
        })

    @classmethod
    def from_arrays(cls, n_tokens: Any, match_prob: Any, u_bar_window: Any, context_len: Any = None,
                    accept_len: Any = None, draft_conf: Any = None, seq_ids: Any = None,
                    origin: str = "arrays") -> "OracleInputs":
        """Build from flat arrays (rows: sequence by sequence, pos 0..N-1 within each).

        ``n_tokens`` (S,) gives N per sequence; the other arrays have ``sum(n_tokens)`` rows.
        Missing ``context_len`` defaults to ``pos``, ``draft_conf`` to ``match_prob`` and
        ``accept_len`` to 0. Values are validated as for ``oracle.parquet``.
        """
        n_tok = np.asarray(n_tokens, dtype=np.int64)
        if n_tok.ndim != 1 or (n_tok < 1).any():
            raise TraceFormatError(origin, [Problem(origin, "n_tokens", "every sequence needs N >= 1 tokens")])
        seq = np.repeat(np.arange(len(n_tok)), n_tok)
        offsets = np.concatenate([[0], np.cumsum(n_tok)])
        pos = np.arange(len(seq)) - offsets[seq]
        mp = np.asarray(match_prob, dtype=float)
        ids = np.arange(len(n_tok)).astype(str) if seq_ids is None else np.asarray(seq_ids, dtype=object)
        df = pd.DataFrame({
            "seq_id": ids[seq],
            "pos": pos,
            "context_len": pos if context_len is None else np.asarray(context_len),
            "match_prob": list(mp),
            "draft_conf": list(mp if draft_conf is None else np.asarray(draft_conf, dtype=float)),
            "accept_len": np.zeros(len(seq), np.int64) if accept_len is None else np.asarray(accept_len),
            "u_bar_window": list(np.asarray(u_bar_window, dtype=float)),
        })
        return cls.from_frame(df, origin=origin)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, origin: str = FILE) -> "OracleInputs":
        """Validate an ``oracle.parquet`` table and build the arrays (sorted by ``seq_id``, then ``pos``).
        The rules are ``speclimits validate``'s (:func:`speclimits.trace.validate.check_oracle_frame`):
        every defect is reported at once in a :class:`TraceFormatError` naming the file (``origin``), the
        column and the first offending rows of ``df``."""
        checked = read_oracle_frame(df, origin=origin)
        order = np.lexsort((checked.pos, checked.seq_id.astype(str)))
        ids, starts = np.unique(checked.seq_id[order].astype(str), return_index=True)
        category = None if checked.category is None else checked.category[order][starts]
        return cls(
            seq_ids=ids.astype(object), offsets=np.concatenate([starts, [len(order)]]).astype(np.int64),
            pos=checked.pos[order], context_len=checked.context_len[order], accept_len=checked.accept_len[order],
            match_prob=checked.match_prob[order], draft_conf=checked.draft_conf[order],
            u_bar_window=checked.u_bar_window[order], category=category, origin=origin)


@dataclass(frozen=True, eq=False)
class CostTable:
    """Round costs C(n, k) for k = 0..k_max over the states of ``inputs``, priced by ``model``.

    The formula is :meth:`CostModel.round_ms`; for speed the table keeps it in the equivalent
    linear form ``fixed[k] + slope[k] * u_bar_window[n, k] + c * context_len[n]``
    (:meth:`CostModel.action_terms`). Column 0 (k = 0, a plain autoregressive step at m = 1) is
    NaN when the cost model has no m = 1 (then ``has_k0`` is False).
    """

    inputs: OracleInputs
    model: CostModel
    k_max: int
    has_k0: bool
    beta0: np.ndarray  # (k_max + 2,) indexed by m, NaN where unavailable
    alpha: np.ndarray  # (k_max + 2,) indexed by m
    fixed: np.ndarray  # (k_max + 1,) indexed by k: draft_ms(k) + beta0(k + 1)
    slope: np.ndarray  # (k_max + 1,) indexed by k: alpha(k + 1)

    @classmethod
    def build(cls, inputs: OracleInputs, model: CostModel, k_max: int, origin: str = "cost model") -> "CostTable":
        if not 1 <= k_max <= inputs.k_list:
            raise SpeclimitsError(f"k_max must be in 1..{inputs.k_list} (the length of the match_prob lists in "
                                  f"{inputs.origin}), got {k_max}")
        model.require_ms(range(2, k_max + 2), origin=origin + (f" ({model.source})" if model.source else ""))
        beta0, alpha = model.coefficients_by_m(k_max + 1)
        fixed, slope = model.action_terms(k_max)
        return cls(inputs, model, k_max, bool(np.isfinite(beta0[1])), beta0, alpha, fixed, slope)

    def parts(self, k: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Cost parts in ms: ``draft``, ``target_base`` (beta0), ``target_expert`` (alpha·Ū), ``target_context``.

        With ``k`` = None each part has shape (n, k_max + 1); with ``k`` an (n,) int array of
        actions, shape (n,) (the part at each state's action).
        """
        inp = self.inputs
        ks = np.arange(self.k_max + 1) if k is None else np.asarray(k, dtype=np.int64)
        u = inp.u_bar_window[:, : self.k_max + 1] if k is None else \
            np.take_along_axis(inp.u_bar_window, ks[:, None], axis=1)[:, 0]
        draft = self.model.draft_ms(ks)
        ctx = self.model.c * inp.context_len
        if k is None:
            draft = np.broadcast_to(draft, u.shape)
            ctx = np.broadcast_to(ctx[:, None], u.shape)
        return {
            "draft": np.asarray(draft, dtype=float),
            "target_base": np.broadcast_to(self.beta0[ks + 1], u.shape).astype(float),
            "target_expert": self.alpha[ks + 1] * u,
            "target_context": np.asarray(ctx, dtype=float),
        }

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), k_max + 1) round costs of the given states (same values as ``total()[rows]``)."""
        inp = self.inputs
        return self.model.round_prices(self.k_max, np.take(inp.u_bar_window, rows, axis=0)[:, : self.k_max + 1],
                                       np.take(inp.context_len, rows), terms=(self.fixed, self.slope))

    def total(self) -> np.ndarray:
        """(n, k_max + 1) round cost in ms (column 0 NaN without m = 1)."""
        return self.rows(np.arange(self.inputs.n_states))
