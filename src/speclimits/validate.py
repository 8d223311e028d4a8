"""Check a trace directory against the data contract (DESIGN §4).

Every defect is collected, not just the first, and reported in one message that names the
file, the column and the first offending rows. Zero timings and prefill rounds are *not*
defects: fits exclude them through :func:`speclimits.trace.decode_rounds`, which counts them.

Command line: ``speclimits validate TRACE`` (exit 0 when valid, 2 with the message otherwise).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.errors import Problem, TraceFormatError
from speclimits.schema import META_REQUIRED, SOURCES, TABLES, Column
from speclimits.trace import read_meta, read_table

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


def _lists(c: _Collector, file: str, df: pd.DataFrame, column: str, width: int) -> np.ndarray | None:
    values = df[column].to_numpy()
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    if c.rows(file, column, lengths != width, f"lists must have length {width}"):
        return None
    if not len(values):
        return np.zeros((0, width))
    arr = np.concatenate([np.asarray(v, dtype=float) for v in values]).reshape(len(values), width)
    if c.rows(file, column, ~np.isfinite(arr).all(axis=1), "list entries must not be NaN or infinite"):
        return None
    return arr


def _experts_range(meta: dict[str, Any]) -> tuple[float | None, float | None]:
    target = (meta.get("models") or {}).get("target") or {}
    top_k = target.get("top_k")
    n_experts = target.get("n_experts")
    return (float(top_k) if top_k else None, float(n_experts) if n_experts else None)


def check_meta(c: _Collector, meta: dict[str, Any]) -> None:
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


def check_rounds(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    f = "rounds.parquet"
    ok = set(_check_columns(c, f, df, TABLES["rounds"]))
    if not ok:
        return
    n = len(df)
    if {"t_target_ms"} <= ok:
        c.rows(f, "t_target_ms", df["t_target_ms"].to_numpy(float) < 0, "timings must not be negative")
    if {"t_draft_ms"} <= ok:
        c.rows(f, "t_draft_ms", df["t_draft_ms"].to_numpy(float) < 0, "timings must not be negative")
    phase = df["phase"].astype(str).to_numpy() if "phase" in ok else np.full(n, "decode")
    if "phase" in ok:
        c.rows(f, "phase", ~np.isin(phase, ["prefill", "decode"]), "must be 'prefill' or 'decode'")
    decode = phase == "decode"
    if {"m", "K"} <= ok:
        m, k = df["m"].to_numpy(), df["K"].to_numpy()
        c.rows(f, "K", k < 0, "must be >= 0")
        if "n_draft" in ok:
            # a drafter may propose fewer than K tokens (ngram without a match): the pass then
            # verifies n_draft + 1 rows; with every draft proposed this is m = K + 1
            c.rows(f, "m", decode & (m != df["n_draft"].to_numpy() + 1),
                   "must equal n_draft + 1 on decode rounds (K + 1 when all K drafts are proposed)")
        else:
            c.rows(f, "m", decode & (m != k + 1), "must equal K + 1 on decode rounds")
        ks = meta.get("k_values")
        if isinstance(ks, list) and ks:
            c.rows(f, "K", ~np.isin(k, ks), f"value not listed in meta.json 'k_values' {ks}")
    if {"n_draft", "n_accepted", "n_emitted"} <= ok:
        nd, na, ne = (df[x].to_numpy() for x in ("n_draft", "n_accepted", "n_emitted"))
        c.rows(f, "n_draft", nd < 0, "must be >= 0")
        if "K" in ok:
            c.rows(f, "n_draft", nd > df["K"].to_numpy(), "must not exceed K")
        c.rows(f, "n_accepted", (na < 0) | (na > nd), "accepted must lie in [0, n_draft]")
        c.rows(f, "n_emitted", (ne < 0) | (ne > na + 1), "emitted must lie in [0, n_accepted + 1]")
    lo, hi = _experts_range(meta)
    if "u_bar" in ok:
        u = df["u_bar"].to_numpy(float)
        if lo is not None:
            c.rows(f, "u_bar", u < lo - 1e-9, f"must be >= top_k = {lo:g} (meta.json models.target.top_k)")
        if hi is not None:
            c.rows(f, "u_bar", u > hi + 1e-9, f"must be <= n_experts = {hi:g} (meta.json models.target.n_experts)")
        if "e_max" in ok:
            c.rows(f, "e_max", df["e_max"].to_numpy(float) < u - 1e-6, "must be >= u_bar (a maximum over layers)")
    if "e_max" in ok and hi is not None:
        c.rows(f, "e_max", df["e_max"].to_numpy(float) > hi + 1e-9, f"must be <= n_experts = {hi:g}")
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
    if {"generation_id", "round", "context_len"} <= ok:
        order = np.lexsort((df["round"].to_numpy(), df["generation_id"].to_numpy()))
        g = df["generation_id"].to_numpy()[order]
        r = df["round"].to_numpy()[order]
        L = df["context_len"].to_numpy()[order]
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


def check_oracle(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    f = "oracle.parquet"
    ok = set(_check_columns(c, f, df, TABLES["oracle"]))
    if "match_prob" not in ok or not len(df):
        return
    first = df["match_prob"].iloc[0]
    k_max = int(meta.get("oracle", {}).get("k_max", len(first) if first is not None else 0))
    arrays = {}
    for col, width in (("match_prob", k_max), ("draft_conf", k_max), ("u_bar_window", k_max + 1)):
        if col in ok:
            arrays[col] = _lists(c, f, df, col, width)
    for col in ("match_prob", "draft_conf"):
        arr = arrays.get(col)
        if arr is not None:
            c.rows(f, col, ((arr < 0) | (arr > 1)).any(axis=1), "probabilities must lie in [0, 1]")
    ubw = arrays.get("u_bar_window")
    if ubw is not None:
        lo, hi = _experts_range(meta)
        if lo is not None:
            c.rows(f, "u_bar_window", (ubw < lo - 1e-9).any(axis=1), f"entries must be >= top_k = {lo:g}")
        if hi is not None:
            c.rows(f, "u_bar_window", (ubw > hi + 1e-9).any(axis=1), f"entries must be <= n_experts = {hi:g}")
        c.rows(f, "u_bar_window", (np.diff(ubw, axis=1) < -1e-6).any(axis=1),
               "must not decrease as the window grows (unique experts over more tokens)")
    if "accept_len" in ok:
        al = df["accept_len"].to_numpy()
        c.rows(f, "accept_len", (al < 0) | (al > k_max), f"must lie in [0, K_max = {k_max}]")
    if {"seq_id", "pos"} <= ok:
        pos = df["pos"].to_numpy()
        seq = df["seq_id"].astype(str)
        start = seq.groupby(seq, sort=False).cumcount().to_numpy()
        # positions must run 0..N-1 in order within each sequence
        c.rows(f, "pos", pos != start, "must run 0..N-1 in order within each seq_id")
        if "context_len" in ok:
            L = df["context_len"].to_numpy()
            p0 = pd.Series(L - pos).groupby(seq.to_numpy(), sort=False).transform("nunique").to_numpy()
            c.rows(f, "context_len", p0 > 1, "must equal prompt length + pos within a sequence")


def check_tokens(c: _Collector, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    f = "tokens.parquet"
    ok = set(_check_columns(c, f, df, TABLES["tokens"]))
    if "new_experts" in ok:
        _, hi = _experts_range(meta)
        ne = df["new_experts"].to_numpy(float)
        c.rows(f, "new_experts", ne < 0, "must be >= 0")
        if hi is not None:
            c.rows(f, "new_experts", ne > hi, f"must be <= n_experts = {hi:g}")


def find_problems(path: str | Path) -> list[Problem]:
    """All problems of the trace at ``path`` (an empty list when it is valid)."""
    root = Path(path)
    c = _Collector()
    try:
        meta = read_meta(root)
    except TraceFormatError as exc:
        return exc.problems
    check_meta(c, meta)
    for name, check in (("rounds", check_rounds), ("oracle", check_oracle), ("tokens", check_tokens)):
        try:
            df = read_table(root, name)
        except TraceFormatError as exc:
            c.problems.extend(exc.problems)
            continue
        if df is None:
            if name == "rounds" and not (root / "oracle.parquet").exists():
                c.file("rounds.parquet", "is missing (a trace needs rounds.parquet or oracle.parquet)")
            continue
        check(c, df, meta)
    return c.problems


def validate_trace(path: str | Path) -> None:
    """Raise :class:`TraceFormatError` listing every problem; return None when valid."""
    problems = find_problems(path)
    if problems:
        raise TraceFormatError(str(path), problems)


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check a trace directory against the data contract",
        description=(
            "Check meta.json and the Parquet tables of a trace: required columns and types, "
            "no negative or NaN timings, m = n_draft+1 (= K+1) on decode rounds, n_draft <= K, accepted <= drafted, "
            "emitted <= accepted+1, u_bar within [top_k, n_experts], context growing within a "
            "generation, list columns of the right length, probabilities in [0, 1]. "
            "Zero timings and prefill rounds are not errors; they are counted and reported. "
            "Exit code 0 when valid, 2 with one message naming file, column and rows otherwise."
        ),
    )
    p.add_argument("trace", type=Path, help="trace directory (meta.json + rounds.parquet [+ oracle.parquet])")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    from speclimits.trace import decode_rounds, read_trace

    validate_trace(args.trace)
    tr = read_trace(args.trace)
    print(f"{args.trace}: valid ({tr.source_label})")
    if (args.trace / "rounds.parquet").exists():
        _, rep = decode_rounds(tr.rounds, timing="target")
        _, rep_d = decode_rounds(tr.rounds, timing="draft")
        print("  rounds (target-time fits): " + str(rep).replace("\n", "\n    "))
        print(f"  draft timing: {rep_d.n_zero_timing:,} decode rounds with a zero t_draft_ms "
              f"({100 * rep_d.share_zero_timing:.2f}%)")
    if tr.oracle is not None:
        print(f"  oracle: {len(tr.oracle):,} states over {tr.oracle['seq_id'].nunique():,} sequences")
    if tr.tokens is not None:
        print(f"  tokens: {len(tr.tokens):,} rows")
    return 0
