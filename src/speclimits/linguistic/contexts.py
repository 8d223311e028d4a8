"""The Oracle's k* by linguistic context (appendix: "K by context"; the book's methods page).

One **decision** is one Oracle state n of one response: the Oracle chooses k*(n) there, and
the decision is labelled with the context of the continuation token the draft's first step
targets. In ``oracle.parquet`` terms, state ``pos = n`` drafts ``y_{n+1}``, which is row
``pos = n`` of ``tokens.parquet`` (0-based token positions; see ``_window_data`` in
:mod:`speclimits.simulate`, where step i of state n targets token index ``n + i - 1``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.bootstrap import cluster_sums, ratio_bootstrap
from speclimits.errors import SpeclimitsError
from speclimits.vocabulary import CONTEXTS, FINE_LABELS
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


def decision_table(result: OracleResult, labelled: pd.DataFrame) -> pd.DataFrame:
    """One row per Oracle state with its k* and the labels of its continuation token.

    Parameters
    ----------
    result : the solved Oracle.
    labelled : :func:`~speclimits.linguistic.labels.label_trace_tokens` output (``seq_id``, ``pos``,
        ``text``, ``label``, ``label_mode``, ``label_fine``, ``label_script``; planted ``context``
        / ``script`` and ``new_experts`` are carried when present).

    Returns the states that have a token row (the others are counted in ``attrs["n_unmatched"]``):
    ``seq_id``, ``pos``, ``remaining``, ``k_star``, ``accept_len``, ``match_prob_1`` (the draft's
    first-step match probability), ``a_mode`` (under k*), ``expected_accept``, the token columns,
    and ``category`` when known.
    """
    frame = result.to_frame()
    frame["seq_id"] = frame["seq_id"].astype(str)
    inp = result.inputs
    frame["match_prob_1"] = inp.match_prob[:, 0]
    frame["a_mode"] = modal_advancement(result.survival, result.k_star, inp.remaining)
    keep = [c for c in ("seq_id", "pos", "text", "label", "label_mode", "label_fine", "label_script", "context",
                        "script", "new_experts") if c in labelled.columns]
    if "label" not in keep:
        raise SpeclimitsError("decision_table needs labelled tokens: call label_trace_tokens(tr.tokens) first")
    tok = labelled[keep].copy()
    tok["seq_id"] = tok["seq_id"].astype(str)
    out = frame.merge(tok, on=["seq_id", "pos"], how="left", validate="one_to_one", indicator=True)
    matched = (out["_merge"] == "both").to_numpy()
    out = out[matched].drop(columns="_merge").reset_index(drop=True)
    out.attrs["n_unmatched"] = int((~matched).sum())
    out.attrs["k_max"] = result.k_max
    return out


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

    Returns one row per context: ``context``, ``n_decisions``, ``n_responses``, ``share_long``,
    ``long_lo``, ``long_hi``, ``share_k1``, ``k1_lo``, ``k1_hi``, ``mean_k_star``, and, for the
    contexts the appendix reports, ``paper_share_long``, ``paper_long_lo``, ``paper_long_hi``,
    ``paper_n_decisions``, ``paper_n_responses``, ``paper_share_k1``.
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
