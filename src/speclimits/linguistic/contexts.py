"""The Oracle's k* by linguistic context (appendix: "K by context"; the book's methods page).

One **decision** is one Oracle state of one response: the Oracle chooses k* there, and the
decision is labelled with the context of the token the draft's first step predicts: row
``pos + 1`` of ``tokens.parquet`` for state ``pos`` (the one join,
:func:`speclimits.linguistic.align.state_tokens`; the methods page, "Reference kinds and
positions").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.bootstrap import cluster_sums, ratio_bootstrap
from speclimits.errors import SpeclimitsError
from speclimits.linguistic.align import require_convention, state_tokens
from speclimits.vocabulary import CONTEXTS, FINE_LABELS, GREEDY
from speclimits.oracle.solver import OracleResult

#: "Long draft" threshold of the appendix: k* >= 4.
K_LONG = 4


def modal_advancement(survival: np.ndarray, k: np.ndarray, remaining: np.ndarray | None = None) -> np.ndarray:
    """a_mode: the most likely number of accepted drafts under P(a | n, k).

    Parameters
    ----------
    survival : (n, k_max) ``P(a >= j)`` for j = 1..k_max (e.g. :attr:`OracleResult.survival`).
    k : (n,) the action (draft length) in each state.
    remaining : (n,) tokens left; accepted drafts beyond ``remaining - 1`` add no progress, so
        their probability is folded onto ``remaining - 1``. None: no cap.

    ``P(a = j) = S_j - S_{j+1}`` for j < k and ``P(a = k) = S_k`` (``S_0 = 1``). Ties go to the
    smaller a. Returns (n,) ints.
    """
    surv = np.asarray(survival, dtype=float)
    n, k_max = surv.shape
    k = np.asarray(k, dtype=np.int64)
    s = np.concatenate([np.ones((n, 1)), surv, np.zeros((n, 1))], axis=1)  # S_0 .. S_{k_max + 1}
    j = np.arange(k_max + 1)
    s_next = np.where(j[None, :] < k[:, None], s[:, 1:k_max + 2], 0.0)
    p = np.where(j[None, :] <= k[:, None], s[:, :k_max + 1] - s_next, 0.0)
    if remaining is not None:
        cap = np.minimum(np.asarray(remaining, dtype=np.int64) - 1, k)
        above = j[None, :] > cap[:, None]
        folded = np.where(above, p, 0.0).sum(axis=1)
        p = np.where(above, 0.0, p)
        p[np.arange(n), cap] += folded
    return np.argmax(p, axis=1)


#: Token columns a decision carries when the tokens table has them.
DECISION_TOKEN_COLUMNS = ("token_id", "text", "label", "label_mode", "label_fine", "label_script", "context", "script",
                          "new_experts", "target_token_id", "target_agrees")


def decision_table(result: OracleResult, labelled: pd.DataFrame, kinds: np.ndarray | None = None) -> pd.DataFrame:
    """One row per Oracle state with its k* and the labels of the token its first draft predicts.

    Parameters
    ----------
    result : the solved Oracle.
    labelled : :func:`~speclimits.linguistic.labels.label_trace_tokens` output (``seq_id``, ``pos``,
        ``text``, ``label``, ``label_mode``, ``label_fine``, ``label_script``; ``token_id``,
        planted ``context`` / ``script``, ``new_experts``, ``target_token_id`` and
        ``target_agrees`` are carried when present).
    kinds : (S,) reference kind of each sequence of ``result.inputs.seq_ids``
        (:attr:`~speclimits.oracle.OracleSetup.kinds`); None: ``reference_kind`` is ``"greedy"``.

    Returns the states that have a token row (the others are counted in ``attrs["n_unmatched"]``):
    the Oracle's frame (``seq_id``, ``pos``, ``k_star``, ...) with ``reference_kind``, ``match_prob_1``
    (the draft's first-step match probability), ``a_mode`` (under k*), ``token_pos`` (= pos + 1) and
    the token columns.
    """
    if "label" not in labelled.columns:
        raise SpeclimitsError("decision_table needs labelled tokens: call label_trace_tokens(tr.tokens) first")
    frame = result.to_frame()
    frame["seq_id"] = frame["seq_id"].astype(str)
    inp = result.inputs
    require_convention(frame, labelled)
    if kinds is not None and len(kinds) != len(inp.seq_ids):
        raise SpeclimitsError(f"decision_table: {len(kinds)} reference kinds for {len(inp.seq_ids)} sequences")
    kind_of = dict(zip(inp.seq_ids.astype(str), kinds)) if kinds is not None else {}
    frame["reference_kind"] = np.array([str(kind_of.get(x, GREEDY)) for x in frame["seq_id"]], dtype=object)
    frame["match_prob_1"] = inp.match_prob[:, 0]
    frame["a_mode"] = modal_advancement(result.survival, result.k_star, inp.remaining)
    keep = [c for c in DECISION_TOKEN_COLUMNS if c in labelled.columns]
    tok = state_tokens(frame, labelled, step=1, columns=keep)
    out = pd.concat([frame, tok], axis=1)
    matched = out.pop("has_token").to_numpy(dtype=bool)
    out = out[matched].reset_index(drop=True)
    if "label" in out.columns and isinstance(labelled["label"].dtype, pd.CategoricalDtype):
        out["label"] = pd.Categorical(out["label"], categories=labelled["label"].cat.categories)
    out.attrs["n_unmatched"] = int((~matched).sum())
    out.attrs["k_max"] = result.k_max
    return out


def write_decisions(decisions: pd.DataFrame, path: str | Path) -> Path:
    """Write the per-decision table (the columns a reader needs to check the join: ``token_pos`` = pos + 1,
    the predicted token, its labels, k*, ...) as CSV (``.csv``) or Parquet (``.parquet`` / ``.pq``)."""
    path = Path(path)
    cols = [c for c in ("seq_id", "pos", "reference_kind", "token_pos", "token_id", "text", "label", "label_fine",
                        "k_star", "accept_len", "match_prob_1", "target_token_id", "target_agrees")
            if c in decisions.columns]
    table = decisions[cols].astype({"label": str} if "label" in cols else {})
    if path.suffix.lower() == ".csv":
        table.to_csv(path, index=False)
    elif path.suffix.lower() in (".parquet", ".pq"):
        table.to_parquet(path, index=False)
    else:
        raise SpeclimitsError(f"--decisions {path}: the suffix must be .csv or .parquet, got {path.suffix!r}")
    return path


def k_by_context(decisions: pd.DataFrame, by: str = "label", k_long: int = K_LONG, n_boot: int = 999,
                 seed: int = 0, level: float = 0.95, cluster: str = "seq_id") -> pd.DataFrame:
    """Share of k* >= ``k_long`` and of k* = 1 per context, with response-clustered bootstrap CIs.

    Parameters
    ----------
    decisions : :func:`decision_table` output (needs ``by``, ``k_star`` and ``cluster``).
    by : the grouping column: ``label`` (rule-based context), ``context`` (planted, simulator),
        ``label_fine`` (fine labels; rows without one are left out).
    n_boot, seed, level : bootstrap replicates (responses resampled within each context), seed and
        interval level.

    Returns one row per context (shares with their interval, counts, mean k*) and, grouped by
    ``label`` or ``context``, the appendix's values beside them (``paper_*``; NaN where it reports none).
    """
    for col in (by, "k_star", cluster):
        if col not in decisions.columns:
            raise SpeclimitsError(f"k_by_context: the decision table has no column {col!r}")
    df = decisions[[by, "k_star", cluster]].copy()
    df[by] = df[by].astype(str)
    df = df[df[by] != ""]
    df["long"] = (df["k_star"] >= k_long).astype(float)
    df["k1"] = (df["k_star"] == 1).astype(float)
    order = list(CONTEXTS) if by in ("label", "context") else list(FINE_LABELS) if by == "label_fine" else []
    groups = [g for g in order if g in set(df[by])] + sorted(set(df[by]) - set(order))
    seeds = np.random.SeedSequence(seed).spawn(max(len(groups), 1))
    rows = []
    for g, ss in zip(groups, seeds):
        sub = df[df[by] == g]
        sums = cluster_sums(sub, cluster, ["long", "k1", "k_star"])
        est, lo, hi = ratio_bootstrap(sums[["long", "k1"]].to_numpy(), np.repeat(sums[["n"]].to_numpy(), 2, axis=1),
                                      n_boot, np.random.default_rng(ss), level)
        rows.append({"context": g, "n_decisions": len(sub), "n_responses": len(sums), "share_long": est[0],
                     "long_lo": lo[0], "long_hi": hi[0], "share_k1": est[1], "k1_lo": lo[1], "k1_hi": hi[1],
                     "mean_k_star": float(sub["k_star"].mean())})
    out = pd.DataFrame(rows, columns=["context", "n_decisions", "n_responses", "share_long", "long_lo", "long_hi",
                                      "share_k1", "k1_lo", "k1_hi", "mean_k_star"])
    if by in ("label", "context"):
        for key in ("share_long", "long_lo", "long_hi", "n_decisions", "n_responses", "share_k1"):
            out[f"paper_{key}"] = [paper.K_BY_CONTEXT.get(c, {}).get(key, np.nan) for c in out["context"]]
    out.attrs.update(k_long=k_long, n_boot=n_boot, level=level, by=by,
                     n_responses_total=int(decisions[cluster].nunique()))
    return out


def k_star_shares(decisions: pd.DataFrame, by: str = "label") -> pd.DataFrame:
    """Long table of the k* distribution per context: ``context``, ``k_star``, ``n``, ``share``."""
    df = decisions[[by, "k_star"]].astype({by: str})
    df = df[df[by] != ""]
    out = df.value_counts().rename("n").reset_index().rename(columns={by: "context"})
    out["share"] = out["n"] / out.groupby("context")["n"].transform("sum")
    return out.sort_values(["context", "k_star"]).reset_index(drop=True)
