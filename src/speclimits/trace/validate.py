"""Check a trace directory against the data contract (:mod:`speclimits.trace.schema`).

Every defect is collected and reported in one message naming the file, the column and the first
offending rows. Zero timings and prefill rounds are *not* defects: fits exclude them through
:func:`speclimits.trace.decode_rounds`, which counts them. ``steps.parquet`` (batch traces) is checked on
its own and against the rounds of the same steps. ``oracle.parquet`` has one checker,
:func:`check_oracle_frame`, used by ``speclimits validate`` and by the Oracle's loader
(:meth:`speclimits.oracle.inputs.OracleInputs.from_frame`) alike; it hands back the stacked list columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import Problem, TraceFormatError
from speclimits.trace.filters import list_lengths, stack_lists
from speclimits.trace.io import read_meta, read_table, target_top_k
from speclimits.trace.sampling import SAMPLING_KEY, sampling_problems
from speclimits.trace.schema import META_REQUIRED, SOURCES, STEP_PHASES, TABLES, Column
from speclimits.vocabulary import REFERENCE_KINDS

MAX_ROWS_SHOWN = 5


class _Collector:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def file(self, file: str, message: str, column: str | None = None) -> None:
        self.problems.append(Problem(file, column, message))

    def rows(self, file: str, column: str, mask: Any, message: str, index: np.ndarray | None = None) -> bool:
        """Record a problem for rows where ``mask`` is true; returns True if any."""
        mask = np.asarray(mask, dtype=bool)
        bad = np.flatnonzero(mask)
        if bad.size == 0:
            return False
        rows = bad[:MAX_ROWS_SHOWN] if index is None else index[bad[:MAX_ROWS_SHOWN]]
        self.problems.append(Problem(file, column, message, tuple(int(r) for r in rows), int(bad.size)))
        return True


def _check_columns(c: _Collector, file: str, df: pd.DataFrame, columns: tuple[Column, ...]) -> list[str]:
    """Presence, type and nulls. Returns the names of columns good enough to check further."""
    ok: list[str] = []
    for col in columns:
        if col.name not in df.columns:
            if col.required:
                c.file(file, "required column is missing", col.name)
            continue
        s = df[col.name]
        kind = col.kind
        if kind == "int":
            if not pd.api.types.is_integer_dtype(s.dtype):
                c.file(file, f"must hold integers, found dtype {s.dtype}", col.name)
                continue
        elif kind == "float":
            if not (pd.api.types.is_float_dtype(s.dtype) or pd.api.types.is_integer_dtype(s.dtype)):
                c.file(file, f"must hold numbers, found dtype {s.dtype}", col.name)
                continue
            vals = s.to_numpy(dtype=float)
            if col.missing_ok:
                if c.rows(file, col.name, np.isinf(vals), "must not be infinite"):
                    continue
            elif c.rows(file, col.name, ~np.isfinite(vals), "must not be NaN or infinite"):
                continue
        elif kind == "str":
            if not (pd.api.types.is_string_dtype(s.dtype) or pd.api.types.is_object_dtype(s.dtype)
                    or isinstance(s.dtype, pd.CategoricalDtype)):
                c.file(file, f"must hold strings, found dtype {s.dtype}", col.name)
                continue
            if col.required and c.rows(file, col.name, s.isna().to_numpy(), "must not be missing"):
                continue
        elif kind.startswith("list"):
            if len(s) and not all(isinstance(v, (list, tuple, np.ndarray)) for v in s.iloc[:100]):
                c.file(file, "must hold lists", col.name)
                continue
        ok.append(col.name)
    return ok


def _experts_range(meta: dict[str, Any]) -> tuple[float | None, float | None]:
    top_k = target_top_k(meta)
    n_experts = ((meta.get("models") or {}).get("target") or {}).get("n_experts")
    return (float(top_k) if top_k else None, float(n_experts) if n_experts else None)


def check_meta(c: _Collector, meta: dict[str, Any]) -> None:
    """Required keys, ``source``, ``k_values``, the ``sampling`` record where there is one (a trace without
    it is greedy: an object with a temperature, a top-p and a seed, :func:`~speclimits.trace.sampling.
    sampling_problems`) and ``batch_sizes``."""
    for key in META_REQUIRED:
        if key not in meta:
            c.file("meta.json", f"required key '{key}' is missing")
    if "source" in meta and meta["source"] not in SOURCES:
        c.file("meta.json", f"'source' must be one of {list(SOURCES)}, got {meta['source']!r}")
    ks = meta.get("k_values")
    if ks is not None and not (isinstance(ks, list) and all(isinstance(k, int) and k >= 0 for k in ks)):
        c.file("meta.json", f"'k_values' must be a list of non-negative integers, got {ks!r}")
    if meta.get("source") == "simulator" and meta.get("simulated") is not True:
        c.file("meta.json", "a simulator trace must say \"simulated\": true")
    rec = meta.get(SAMPLING_KEY)
    if SAMPLING_KEY in meta and not isinstance(rec, dict):
        c.file("meta.json", f"'{SAMPLING_KEY}' must be an object {{temperature, top_p, seed}}, got {rec!r}")
    elif isinstance(rec, dict):
        missing = [k for k in ("temperature", "top_p", "seed") if k not in rec]
        for k in missing:
            c.file("meta.json", f"'{SAMPLING_KEY}.{k}' is missing")
        for field, message in ([] if missing else sampling_problems(rec["temperature"], rec["top_p"], rec["seed"])):
            c.file("meta.json", f"'{SAMPLING_KEY}.{field}' {message}")
    sizes = meta.get("batch_sizes")
    if sizes is not None:
        if not (isinstance(sizes, list) and sizes and all(isinstance(b, int) and b >= 1 for b in sizes)):
            c.file("meta.json", f"'batch_sizes' must be a non-empty list of integers >= 1, got {sizes!r}")
        elif meta.get("batch_size") != max(sizes):
            c.file("meta.json", f"'batch_size' must be the largest of 'batch_sizes' {sizes}, got "
                                f"{meta.get('batch_size')!r}")


def check_rounds(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Every rule on ``rounds.parquet`` whose columns are present and well typed, in this order:
    non-negative timings and a known phase; K >= 0, m = n_draft + 1 (or K + 1) on decode rounds and K
    listed in meta's ``k_values``; 0 <= n_draft <= K, 0 <= n_accepted <= n_draft, 0 <= n_emitted <=
    n_accepted + 1; the routing; KV usage in [0, 1], graph bucket >= 1 (and >= m on decode rounds),
    context length >= 0; within a generation unique rounds, a growing context and one K; and in batch
    traces (``b`` / ``batch_id`` present) b >= 1 and listed in meta's ``batch_sizes``, 0 <= batch_id <=
    generation_id, one b and one batch_id per generation."""
    f = "rounds.parquet"
    ok = set(_check_columns(c, f, df, TABLES["rounds"]))
    if not ok:
        return
    for col in ("t_target_ms", "t_draft_ms"):
        if col in ok:
            c.rows(f, col, df[col].to_numpy(float) < 0, "timings must not be negative")
    phase = df["phase"].astype(str).to_numpy() if "phase" in ok else np.full(len(df), "decode")
    if "phase" in ok:
        c.rows(f, "phase", ~np.isin(phase, ["prefill", "decode"]), "must be 'prefill' or 'decode'")
    decode = phase == "decode"
    if {"m", "K"} <= ok:
        m, k, ks = df["m"].to_numpy(), df["K"].to_numpy(), meta.get("k_values")
        c.rows(f, "K", k < 0, "must be >= 0")
        if "n_draft" in ok:
            # a drafter may propose fewer than K tokens (ngram without a match): the pass then verifies n_draft + 1 rows
            c.rows(f, "m", decode & (m != df["n_draft"].to_numpy() + 1),
                   "must equal n_draft + 1 on decode rounds (K + 1 when all K drafts are proposed)")
        else:
            c.rows(f, "m", decode & (m != k + 1), "must equal K + 1 on decode rounds")
        if isinstance(ks, list) and ks:
            c.rows(f, "K", ~np.isin(k, ks), f"value not listed in meta.json 'k_values' {ks}")
    if {"n_draft", "n_accepted", "n_emitted"} <= ok:
        nd, na, ne = (df[x].to_numpy() for x in ("n_draft", "n_accepted", "n_emitted"))
        c.rows(f, "n_draft", nd < 0, "must be >= 0")
        if "K" in ok:
            c.rows(f, "n_draft", nd > df["K"].to_numpy(), "must not exceed K")
        c.rows(f, "n_accepted", (na < 0) | (na > nd), "accepted must lie in [0, n_draft]")
        c.rows(f, "n_emitted", (ne < 0) | (ne > na + 1), "emitted must lie in [0, n_accepted + 1]")
    _routing(c, f, df, ok, meta)
    if "kv_usage" in ok:
        kv = df["kv_usage"].to_numpy(float)
        c.rows(f, "kv_usage", (kv < 0) | (kv > 1), "must lie in [0, 1]")
    if "graph_bucket" in ok:
        gb = df["graph_bucket"].to_numpy()
        c.rows(f, "graph_bucket", gb < 1, "must be >= 1")
        if "m" in ok:
            c.rows(f, "graph_bucket", decode & (gb < df["m"].to_numpy()), "padded token count must be >= m")
    if "context_len" in ok:
        c.rows(f, "context_len", df["context_len"].to_numpy() < 0, "must be >= 0")
    n = len(df)
    if {"generation_id", "round", "context_len"} <= ok:
        order = np.lexsort((df["round"].to_numpy(), df["generation_id"].to_numpy()))
        g, r, L = (df[x].to_numpy()[order] for x in ("generation_id", "round", "context_len"))
        same = np.zeros(n, dtype=bool)
        same[1:] = g[1:] == g[:-1]
        dup = np.zeros(n, dtype=bool)
        dup[1:] = same[1:] & (r[1:] == r[:-1])
        c.rows(f, "round", dup, "duplicate (generation_id, round)", index=order)
        shrink = np.zeros(n, dtype=bool)
        shrink[1:] = same[1:] & (L[1:] <= L[:-1]) & ~dup[1:]
        c.rows(f, "context_len", shrink, "must grow from round to round within a generation", index=order)
    if {"generation_id", "K"} <= ok and n:
        nk = df.groupby("generation_id", sort=False)["K"].transform("nunique").to_numpy()
        c.rows(f, "K", nk > 1, "one generation must have a single K")
    _listed(c, f, df, ok, "b", 1, meta.get("batch_sizes"), "batch_sizes")
    if "batch_id" in ok:
        bid = df["batch_id"].to_numpy()
        c.rows(f, "batch_id", bid < 0, "must be >= 0")
        if "generation_id" in ok:
            c.rows(f, "batch_id", bid > df["generation_id"].to_numpy(),
                   "must not exceed generation_id (it is the batch's first generation)")
    for col in ("b", "batch_id"):
        if {"generation_id", col} <= ok and n:
            n_values = df.groupby("generation_id", sort=False)[col].transform("nunique").to_numpy()
            c.rows(f, col, n_values > 1, f"one generation must have a single {col}")


def _routing(c: _Collector, f: str, df: pd.DataFrame, ok: set[str], meta: dict[str, Any],
             floor: float | None = None) -> None:
    """top_k <= u_bar <= e_max <= n_experts (bounds from meta.json where it gives them; ``floor``
    stands in for a top_k it does not give)."""
    top_k, hi = _experts_range(meta)
    lo = top_k if top_k is not None else floor
    if "u_bar" in ok:
        u = df["u_bar"].to_numpy(float)
        if lo is not None:
            where = f"top_k = {lo:g} (meta.json models.target.top_k)" if top_k is not None else f"{lo:g}"
            c.rows(f, "u_bar", u < lo - 1e-9, f"must be >= {where}")
        if hi is not None:
            c.rows(f, "u_bar", u > hi + 1e-9, f"must be <= n_experts = {hi:g} (meta.json models.target.n_experts)")
        if "e_max" in ok:
            c.rows(f, "e_max", df["e_max"].to_numpy(float) < u - 1e-6, "must be >= u_bar (a maximum over layers)")
    if "e_max" in ok and hi is not None:
        c.rows(f, "e_max", df["e_max"].to_numpy(float) > hi + 1e-9, f"must be <= n_experts = {hi:g}")


def _listed(c: _Collector, f: str, df: pd.DataFrame, ok: set[str], col: str, minimum: int,
            allowed: Any, key: str) -> None:
    """``col`` >= ``minimum`` and, where meta.json lists ``allowed`` values (under ``key``), one of them."""
    if col in ok:
        values = df[col].to_numpy()
        c.rows(f, col, values < minimum, f"must be >= {minimum}")
        if isinstance(allowed, list) and allowed:
            c.rows(f, col, ~np.isin(values, allowed), f"value not listed in meta.json '{key}' {allowed}")


STEPS_FILE = "steps.parquet"


def check_steps(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Every rule on ``steps.parquet`` (one row per engine step of a batch trace) whose columns
    are present and well typed: counts (n_reqs >= 1, 0 <= n_decode <= n_reqs <= b,
    n_tokens >= n_reqs, 1 <= m_max <= n_tokens), routing (top_k, or 1 when meta.json gives
    no top_k, <= u_bar <= e_max <= n_experts), the phase (a known value that agrees with
    n_decode), non-negative times, counts and context, KV usage in [0, 1], graph bucket >=
    n_tokens, K and b listed in meta.json, and (batch_id, step) unique."""
    f = STEPS_FILE
    ok = set(_check_columns(c, f, df, TABLES["steps"]))
    if not ok:
        return
    col = {name: df[name].to_numpy() for name in ok}
    if "n_reqs" in ok:
        c.rows(f, "n_reqs", col["n_reqs"] < 1, "must be >= 1 (a step has at least one request)")
        if "b" in ok:
            c.rows(f, "n_reqs", col["n_reqs"] > col["b"], "must not exceed b (the batch size)")
        if "n_decode" in ok:
            c.rows(f, "n_decode", (col["n_decode"] < 0) | (col["n_decode"] > col["n_reqs"]),
                   "must lie in [0, n_reqs]")
        if "n_tokens" in ok:
            c.rows(f, "n_tokens", col["n_tokens"] < col["n_reqs"], "must be >= n_reqs (each request has a row)")
    if {"m_max", "n_tokens"} <= ok:
        c.rows(f, "m_max", (col["m_max"] < 1) | (col["m_max"] > col["n_tokens"]), "must lie in [1, n_tokens]")
    _routing(c, f, df, ok, meta, floor=1.0)
    if "phase" in ok:
        phase = df["phase"].astype(str).to_numpy()
        if not c.rows(f, "phase", ~np.isin(phase, STEP_PHASES), "must be 'prefill', 'decode' or 'mixed'") \
                and {"n_decode", "n_reqs"} <= ok:
            nd, nr = col["n_decode"], col["n_reqs"]
            want = np.where(nd == 0, "prefill", np.where(nd == nr, "decode", "mixed"))
            c.rows(f, "phase", phase != want,
                   "must agree with n_decode ('prefill': 0 decoding, 'decode': all n_reqs, else 'mixed')")
    for name in ("t_target_ms", "t_draft_ms"):
        if name in ok:
            c.rows(f, name, col[name].astype(float) < 0, "timings must not be negative")
    for name in ("context_total", "n_drafted_next"):
        if name in ok:
            c.rows(f, name, col[name] < 0, "must be >= 0")
    if "kv_usage" in ok:
        kv = col["kv_usage"].astype(float)
        c.rows(f, "kv_usage", (kv < 0) | (kv > 1), "must lie in [0, 1]")
    if {"graph_bucket", "n_tokens"} <= ok:
        c.rows(f, "graph_bucket", col["graph_bucket"] < col["n_tokens"], "padded token count must be >= n_tokens")
    _listed(c, f, df, ok, "K", 0, meta.get("k_values"), "k_values")
    _listed(c, f, df, ok, "b", 1, meta.get("batch_sizes"), "batch_sizes")
    if {"batch_id", "step"} <= ok:
        c.rows(f, "step", df.duplicated(["batch_id", "step"]).to_numpy(), "duplicate (batch_id, step)")


def check_steps_against_rounds(c: _Collector, steps: pd.DataFrame, rounds: pd.DataFrame) -> None:
    """The rounds of a batch trace and its steps describe the same engine steps: every
    (batch_id, step) of ``rounds`` has a row in ``steps``, and each step's ``n_tokens`` is the
    sum of those rounds' ``m`` and its ``n_reqs`` their count (b and K agree too). Steps of a
    batch without any rounds (parts a killed writer left before their rounds part) are skipped."""
    need_r, need_s = {"batch_id", "step", "m", "b", "K"}, {"batch_id", "step", "n_tokens", "n_reqs", "b", "K"}
    if not (need_r <= set(rounds.columns) and need_s <= set(steps.columns)) or not len(rounds):
        return
    if not all(pd.api.types.is_integer_dtype(df[col].dtype) for df, cols in ((rounds, need_r), (steps, need_s))
               for col in cols):
        return  # type problems are named by the table checks
    if steps.duplicated(["batch_id", "step"]).any():
        return  # named by check_steps; the matching below needs unique keys
    key = ["batch_id", "step"]
    r = rounds[key + ["m", "b", "K"]].reset_index(drop=True)
    s = steps[key + ["n_tokens", "n_reqs", "b", "K"]].reset_index(drop=True)
    s["_row"] = np.arange(len(s))
    found = r.merge(s[key], on=key, how="left", indicator=True)["_merge"].to_numpy() == "both"
    c.rows("rounds.parquet", "step", ~found, "no row in steps.parquet for this (batch_id, step)")
    agg = r.groupby(key, sort=False).agg(m_sum=("m", "sum"), n_rows=("m", "size"), rb=("b", "first"),
                                          rk=("K", "first")).reset_index()
    both = s.merge(agg, on=key, how="left")
    both = both[both["batch_id"].isin(r["batch_id"].unique())]
    has = both["m_sum"].notna().to_numpy()
    rows = both["_row"].to_numpy()
    c.rows(STEPS_FILE, "step", ~has, "no rows in rounds.parquet for this step of a traced batch", index=rows)
    both, rows = both[has], rows[has]
    c.rows(STEPS_FILE, "n_tokens", both["n_tokens"].to_numpy() != both["m_sum"].to_numpy(),
           "must equal the sum of m over the step's rows in rounds.parquet", index=rows)
    c.rows(STEPS_FILE, "n_reqs", both["n_reqs"].to_numpy() != both["n_rows"].to_numpy(),
           "must equal the number of the step's rows in rounds.parquet (one per request)", index=rows)
    for col, other in (("b", "rb"), ("K", "rk")):
        c.rows(STEPS_FILE, col, both[col].to_numpy() != both[other].to_numpy(),
               f"must equal rounds.parquet's {col} of the same step", index=rows)


ORACLE_FILE = "oracle.parquet"
ORACLE_REQUIRED = tuple(c.name for c in TABLES["oracle"] if c.required)


@dataclass(frozen=True, eq=False)
class OracleFrame:
    """An ``oracle.parquet`` table that passed :func:`check_oracle_frame`, as arrays in the table's row order.

    Attributes (n = rows of the table)
    ----------------------------------
    k_max : length of the ``match_prob`` lists.
    seq_id : (n,) str (object array).
    pos, accept_len : (n,) int64.
    context_len : (n,) float64 (integer-valued).
    match_prob, draft_conf : (n, k_max) float64 in [0, 1].
    u_bar_window : (n, k_max + 1) float64, finite, >= 0, non-decreasing along each row.
    category : (n,) str, or None without a ``category`` column.
    accept_prob : (n, k_max) float64 in [0, 1] (a sampled trace's acceptance probabilities), or None
        without an ``accept_prob`` column.
    """

    k_max: int
    seq_id: np.ndarray
    pos: np.ndarray
    context_len: np.ndarray
    accept_len: np.ndarray
    match_prob: np.ndarray
    draft_conf: np.ndarray
    u_bar_window: np.ndarray
    category: np.ndarray | None
    accept_prob: np.ndarray | None = None


def check_oracle_frame(df: pd.DataFrame, *, file: str = ORACLE_FILE, k_max: int | None = None,
                       top_k: float | None = None, n_experts: float | None = None
                       ) -> tuple[OracleFrame | None, list[Problem]]:
    """Check an ``oracle.parquet`` table and stack its list columns.

    The one set of rules for Oracle inputs, applied by ``speclimits validate`` and by the
    Oracle's loader: required columns; at least one row; ``match_prob`` / ``draft_conf`` lists
    of ``k_max`` floats and ``u_bar_window`` lists of ``k_max + 1`` (``k_max`` None: the most
    common ``match_prob`` length), and so ``accept_prob`` where the table has it (a sampled trace);
    probabilities finite and in [0, 1]; ``u_bar_window`` finite,
    >= 0 (>= ``top_k`` and <= ``n_experts`` when given), never decreasing as the window grows;
    ``pos`` and ``context_len`` integers >= 0, ``accept_len`` an integer in 0..k_max;
    ``seq_id`` present; and, per ``seq_id``, ``pos`` = 0..N-1 exactly once (in any row order).

    Returns ``(frame, [])`` when the table is valid, else ``(None, problems)``: every defect
    found, each naming ``file``, the column and the first offending rows (0-based row numbers
    of ``df`` as given).
    """
    c = _Collector()
    missing = [col for col in ORACLE_REQUIRED if col not in df.columns]
    for col in missing:
        c.file(file, "required column is missing", col)
    if missing:
        return None, c.problems
    if len(df) == 0:
        c.file(file, "has no rows")
        return None, c.problems
    lists = _oracle_lists(c, file, df, k_max)
    if lists is None:
        return None, c.problems
    k_max = lists["k_max"]
    for col in ("match_prob", "draft_conf", "accept_prob"):
        if col in lists:
            arr = lists[col]
            c.rows(file, col, ~((arr >= 0) & (arr <= 1)).all(axis=1), "probabilities must be finite and in [0, 1]")
    ubw = lists["u_bar_window"]
    if not c.rows(file, "u_bar_window", ~(np.isfinite(ubw) & (ubw >= 0)).all(axis=1),
                  "values must be finite and >= 0"):
        if top_k is not None:
            c.rows(file, "u_bar_window", (ubw < top_k - 1e-9).any(axis=1),
                   f"entries must be >= top_k = {top_k:g} (meta.json models.target.top_k)")
        if n_experts is not None:
            c.rows(file, "u_bar_window", (ubw > n_experts + 1e-9).any(axis=1),
                   f"entries must be <= n_experts = {n_experts:g} (meta.json models.target.n_experts)")
        c.rows(file, "u_bar_window", (np.diff(ubw, axis=1) < -1e-6).any(axis=1),
               "must not decrease as the window grows (unique experts over more tokens)")
    # pos, context_len, accept_len as floats (NaN where not numeric)
    ints = {col: pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
            for col in ("pos", "context_len", "accept_len")}
    for col in ("pos", "context_len"):
        v = ints[col]
        c.rows(file, col, ~(np.isfinite(v) & (v >= 0) & (v == np.round(v))), "must be an integer >= 0")
    acc = ints["accept_len"]
    c.rows(file, "accept_len", ~(np.isfinite(acc) & (acc >= 0) & (acc <= k_max) & (acc == np.round(acc))),
           f"must be an integer in 0..{k_max}")
    c.rows(file, "seq_id", df["seq_id"].isna().to_numpy(), "must not be missing")
    if "reference_kind" in df.columns:
        _reference_kind(c, file, df)
    if c.problems:
        return None, c.problems
    # per seq_id, pos = 0..N-1 exactly once: name the rows whose pos is out of range or repeats an earlier row's
    seq, pos = df["seq_id"].astype(str).to_numpy(), ints["pos"]
    bad = (pos >= pd.Series(seq).groupby(seq, sort=False).transform("size").to_numpy()) | \
        pd.DataFrame({"s": seq, "p": pos}).duplicated().to_numpy()
    if bad.any():
        c.rows(file, "pos", bad, f"each seq_id must have pos = 0..N-1 exactly once; sequences "
                                 f"{list(pd.unique(seq[bad])[:5])} have gaps or duplicates")
        return None, c.problems
    category = df["category"].astype(str).to_numpy() if "category" in df.columns else None
    frame = OracleFrame(k_max=k_max, seq_id=seq.astype(object), pos=pos.astype(np.int64),
                        context_len=ints["context_len"], accept_len=acc.astype(np.int64),
                        match_prob=lists["match_prob"], draft_conf=lists["draft_conf"], u_bar_window=ubw,
                        category=category, accept_prob=lists.get("accept_prob"))
    return frame, []


def read_oracle_frame(df: pd.DataFrame, origin: str = ORACLE_FILE, **limits: Any) -> OracleFrame:
    """:func:`check_oracle_frame`, raising :class:`TraceFormatError` (``origin`` names the table) on defects.

    ``limits``: ``k_max``, ``top_k``, ``n_experts`` as for :func:`check_oracle_frame`."""
    frame, problems = check_oracle_frame(df, file=origin, **limits)
    if problems:
        raise TraceFormatError(origin, problems)
    return frame


def _oracle_lists(c: _Collector, file: str, df: pd.DataFrame, k_max: int | None) -> dict[str, Any] | None:
    """Lengths of the three list columns; the stacked arrays, or None after recording problems."""
    cols = ("match_prob", "draft_conf", "u_bar_window") + (("accept_prob",) if "accept_prob" in df.columns else ())
    values = {col: df[col].to_numpy() for col in cols}
    lengths = {col: list_lengths(v) for col, v in values.items()}
    if k_max is None:
        known = lengths["match_prob"][lengths["match_prob"] >= 0]
        k_max = int(np.bincount(known).argmax()) if known.size else 0
    if k_max < 1:
        c.file(file, "lists must hold K_max >= 1 floats", "match_prob")
        return None
    widths = {col: k_max + 1 if col == "u_bar_window" else k_max for col in cols}
    for col, width in widths.items():
        c.rows(file, col, lengths[col] != width, f"lists must have length {width} (K_max = {k_max}"
               + (", plus one for m = 1)" if col == "u_bar_window" else ")"))
    if c.problems:
        return None
    out: dict[str, Any] = {col: stack_lists(values[col], width) for col, width in widths.items()}
    out["k_max"] = k_max
    return out


def check_oracle(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """The trace-level checks of ``oracle.parquet``: :func:`check_oracle_frame` with the limits
    meta.json gives (``oracle.k_max``, the target's ``top_k`` and ``n_experts``); then ``context_len``
    = prompt length + ``pos`` within each sequence, how the harness and the simulator record a trace
    (trace files only: the Oracle prices any non-negative context, so in-memory what-if inputs may set
    it freely); and ``accept_prob`` present exactly when the trace is sampled (meta.json's ``sampling``
    with a temperature > 0; its values are checked with the other probabilities)."""
    lo, hi = _experts_range(meta)
    k_max = (meta.get("oracle") or {}).get("k_max")
    frame, problems = check_oracle_frame(df, file=ORACLE_FILE, k_max=None if k_max is None else int(k_max),
                                         top_k=lo, n_experts=hi)
    c.problems.extend(problems)
    if frame is not None:
        seq = df["seq_id"].astype(str).to_numpy()
        offset = pd.Series(df["context_len"].to_numpy() - df["pos"].to_numpy()).groupby(seq, sort=False)
        c.rows(ORACLE_FILE, "context_len", offset.transform("nunique").to_numpy() > 1,
               "must equal prompt length + pos within a sequence")
    rec = meta.get(SAMPLING_KEY)
    try:
        sampled = isinstance(rec, dict) and float(rec.get("temperature", 0)) > 0
    except (TypeError, ValueError):
        sampled = False
    has = "accept_prob" in df.columns
    if sampled and not has:
        c.file(ORACLE_FILE, "required column is missing (meta.json 'sampling' has a temperature > 0: a sampled "
                            "trace records the acceptance probability of each draft)", "accept_prob")
    elif has and not sampled:
        c.file(ORACLE_FILE, "column present in a greedy trace (no 'sampling' record with a temperature > 0 in "
                            "meta.json): the acceptance probabilities belong to sampled traces only", "accept_prob")


def check_tokens(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    f = "tokens.parquet"
    ok = set(_check_columns(c, f, df, TABLES["tokens"]))
    if "new_experts" in ok:
        _, hi = _experts_range(meta)
        ne = df["new_experts"].to_numpy(float)
        c.rows(f, "new_experts", ne < 0, "must be >= 0")
        if hi is not None:
            c.rows(f, "new_experts", ne > hi, f"must be <= n_experts = {hi:g}")
    if "reference_kind" in ok:
        _reference_kind(c, f, df)


def _reference_kind(c: _Collector, f: str, df: pd.DataFrame) -> None:
    c.rows(f, "reference_kind", ~df["reference_kind"].astype(str).isin(REFERENCE_KINDS).to_numpy(),
           f"must be one of {', '.join(REFERENCE_KINDS)}")


def find_problems(path: str | Path) -> list[Problem]:
    """All problems of the trace at ``path`` (an empty list when it is valid)."""
    root = Path(path)
    c = _Collector()
    try:
        meta = read_meta(root)
    except TraceFormatError as exc:
        return exc.problems
    check_meta(c, meta)
    tables: dict[str, pd.DataFrame | None] = {}
    for name, check in (("rounds", check_rounds), ("oracle", check_oracle), ("tokens", check_tokens),
                        ("steps", check_steps)):
        try:
            df = tables[name] = read_table(root, name)
        except TraceFormatError as exc:
            c.problems.extend(exc.problems)
            continue
        if df is None:
            if name == "rounds" and not (root / "oracle.parquet").exists():
                c.file("rounds.parquet", "is missing (a trace needs rounds.parquet or oracle.parquet)")
            continue
        check(c, df, meta)
    _check_batch_tables(c, root, tables.get("rounds"), tables.get("steps"))
    return c.problems


def _check_batch_tables(c: _Collector, root: Path, rounds: pd.DataFrame | None, steps: pd.DataFrame | None) -> None:
    """A batch trace has both its batch columns in rounds and a steps table, and they agree."""
    if rounds is None:
        return
    if steps is None:
        if "batch_id" in rounds.columns and not (root / "steps.parquet").exists():
            c.file(STEPS_FILE, "is missing (rounds.parquet has batch_id: a batch trace needs its steps table)")
        return
    for col in ("b", "batch_id", "step"):
        if col not in rounds.columns:
            c.file("rounds.parquet", "column is missing (the trace has steps.parquet: a batch trace)", col)
    check_steps_against_rounds(c, steps, rounds)


def validate_trace(path: str | Path) -> None:
    """Raise :class:`TraceFormatError` listing every problem; return None when valid."""
    problems = find_problems(path)
    if problems:
        raise TraceFormatError(str(path), problems)
