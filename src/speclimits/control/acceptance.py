"""The acceptance model: P(draft at position j matches | the drafts before it matched), from what the engine
knows when it decides (issue 57, deliverable 2).

A logistic regression (scikit-learn; evaluated in µs per draft step: :class:`~speclimits.control.rules.AcceptanceModel`)
on features of a greedy round from a state of ``oracle.parquet``, at draft step j (1-based):

- ``conf``, ``logit_conf``: the draft's top-1 probability and its log-odds;
- ``position``: j; ``log_prod_before``: the log of the product of the top-1 probabilities of steps 1..j-1;
- ``history``: of the draft steps the request's last 3 rounds *it has seen* reached, the share that matched,
  along the K_max greedy walk of its reference (the engine observes each round one round late); the engine
  computes it from the rule's own rounds, cut at their k (:meth:`~speclimits.control.rules.DeltaRule.engine_history`);
- ``u_bar_prev``: Ū of the last seen round's pass (the engine counts no experts); ``log_context``: log context length.

The engine's model chooses among :data:`ENGINE_FEATURES` only (the last two are for the study: on the twin's
trace ``u_bar_prev`` lowered the held-out log loss by 0.0004 nats per step). Label: step j matched, on the steps
a round reached (:func:`~speclimits.oracle.calibration.reached_steps`), as ``fit_calibration`` fits. The draft's
entropy, its top-1/top-2 margin and the target's top-1 probability are recorded by Oracle mode since commit 1eb1618
but not read by the engine: ``benchmarks/acceptance_features.py`` found that the margin lowers the held-out log
loss by 0.015 nats per step on the twin yet makes the rules no faster (``data/control/twin/features/README.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score
from sklearn.model_selection import GroupKFold

from speclimits.control.rules import ENGINE_FEATURES, HISTORY_ROUNDS, AcceptanceModel, CalibrationMap, PolicyFit
from speclimits.oracle.calibration import reached_steps
from speclimits.oracle.inputs import OracleInputs
from speclimits.trace.sampling import seq_prompt

#: The candidate features, in the order the forward selection tries them on a tie.
FEATURES = ("logit_conf", "conf", "position", "log_prod_before", "history", "u_bar_prev", "log_context")
_EPS = 1e-6


def _walk_features(inputs: OracleInputs, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(n,) ``history`` and ``u_bar_prev`` of every state (NaN before the request has seen a round)."""
    hist, u_prev = np.full(inputs.n_states, np.nan), np.full(inputs.n_states, np.nan)
    for s in range(inputs.n_sequences):
        off, n = int(inputs.offsets[s]), int(inputs.n_tokens[s])
        starts, acc, pos = [], [], 0
        while pos < n:
            a = min(int(inputs.accept_len[off + pos]), k_max)
            starts.append(pos)
            acc.append(a)
            pos += a + 1
        ends, acc = np.array(starts) + np.array(acc) + 1, np.array(acc, dtype=float)
        seen = np.searchsorted(ends, inputs.pos[off:off + n] - inputs.pos[off], side="right") - 1
        c_acc = np.concatenate([[0.0], np.cumsum(acc)])
        c_reached = np.concatenate([[0.0], np.cumsum(np.minimum(acc + 1, k_max))])
        lo = np.maximum(seen - HISTORY_ROUNDS, 0)
        ok = seen > 0
        sk, lk = seen[ok], lo[ok]
        hist[off:off + n][ok] = (c_acc[sk] - c_acc[lk]) / (c_reached[sk] - c_reached[lk])
        last = np.array(starts)[np.maximum(seen - 1, 0)] + off
        u_prev[off:off + n][ok] = inputs.u_bar_window[last[ok], min(k_max, inputs.u_bar_window.shape[1] - 1)]
    return hist, u_prev


def acceptance_frame(inputs: OracleInputs, k_max: int, reached_only: bool = True) -> pd.DataFrame:
    """One row per (state, draft step j <= k_max): ``state``, ``seq_id`` (the group of the folds), ``matched``
    (bool) and the :data:`FEATURES`. ``reached_only``: only the steps a greedy round reached (the labelled rows),
    else every step (the rule's inputs, :func:`match_probabilities`)."""
    conf = np.clip(inputs.draft_conf[:, :k_max].astype(float), _EPS, 1 - _EPS)
    n = inputs.n_states
    hist, u_prev = _walk_features(inputs, k_max)
    reached, matched = reached_steps(inputs, k_max)
    keep = reached if reached_only else np.ones_like(reached)
    state, step = np.nonzero(keep)
    log_before = np.concatenate([np.zeros((n, 1)), np.cumsum(np.log(conf), axis=1)[:, :-1]], axis=1)
    c = conf[state, step]
    return pd.DataFrame({
        "state": state, "seq_id": inputs.seq_ids[inputs.seq_index[state]], "matched": matched[state, step],
        "logit_conf": np.log(c / (1 - c)), "conf": c, "position": step + 1.0,
        "log_prod_before": log_before[state, step], "history": hist[state], "u_bar_prev": u_prev[state],
        "log_context": np.log(np.maximum(inputs.context_len[state].astype(float), 1.0))})


def predict(model: AcceptanceModel, frame: pd.DataFrame) -> np.ndarray:
    """(rows,) the model's match probability on the rows of an :func:`acceptance_frame`."""
    if not model.features:
        return np.full(len(frame), 1.0 / (1.0 + np.exp(-model.intercept)))
    x = frame[list(model.features)].to_numpy(dtype=float)
    x = np.where(np.isnan(x), np.asarray(model.fill)[None, :], x)
    return 1.0 / (1.0 + np.exp(-(model.intercept + x @ np.asarray(model.coef))))


def _fit_lr(frame: pd.DataFrame, features: list[str], k_max: int) -> AcceptanceModel:
    y = frame["matched"].to_numpy(dtype=int)
    fill = tuple(float(np.nanmean(frame[f])) if frame[f].notna().any() else 0.0 for f in features)
    if not features or len(np.unique(y)) < 2:
        rate = float(np.clip(y.mean(), _EPS, 1 - _EPS))
        return AcceptanceModel((), (), float(np.log(rate / (1 - rate))), (), k_max)
    x = frame[features].to_numpy(dtype=float)
    x = np.where(np.isnan(x), np.asarray(fill)[None, :], x)
    lr = LogisticRegression(C=1e4, max_iter=2000).fit(x, y)
    return AcceptanceModel(tuple(features), tuple(float(v) for v in lr.coef_[0]), float(lr.intercept_[0]), fill,
                           k_max)


def grouped_folds(frame: pd.DataFrame, n_splits: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, held-out rows) per fold, grouped by prompt (:class:`~sklearn.model_selection.GroupKFold`):
    a generation's rows are all in one fold, and so are a sampled trace's references of one prompt
    (:func:`~speclimits.trace.sampling.seq_prompt`)."""
    groups = frame["seq_id"].astype(str).map(seq_prompt).to_numpy()
    return list(GroupKFold(n_splits=min(n_splits, len(np.unique(groups)))).split(frame, groups=groups))


def fit_acceptance(frame: pd.DataFrame, k_max: int, candidates: Any = ENGINE_FEATURES, n_splits: int = 5,
                   min_gain: float = 1e-4) -> AcceptanceModel:
    """Forward selection by held-out log loss over :func:`grouped_folds`, then the model refitted on every row.

    From the intercept alone, each step adds the candidate with the least held-out log loss (folds weighted by
    rows); it is kept only if it lowers the loss by more than ``min_gain`` (nats per draft step) **and** by more
    than the standard error of its paired per-fold gains (on the twin's trace the second rule dropped
    ``position``, 0.0011 ± 0.0012 nats, which lowered the rule's replayed share of the Oracle's gain).
    ``k_max``: the policy's K_max (the ``history`` walk); ``candidates``: by default
    :data:`~speclimits.control.rules.ENGINE_FEATURES`.
    """
    folds = grouped_folds(frame, n_splits)
    y, weights = frame["matched"].to_numpy(dtype=int), np.array([len(te) for _, te in folds]) / len(frame)

    def fold_losses(features: list[str]) -> np.ndarray:
        return np.array([log_loss(y[te], predict(_fit_lr(frame.iloc[tr], features, k_max), frame.iloc[te]),
                                  labels=[0, 1]) for tr, te in folds])

    chosen, best, left = [], fold_losses([]), list(candidates)
    steps = [("(intercept)", float(weights @ best))]
    while left:
        losses, f = min(((fold_losses(chosen + [f]), f) for f in left), key=lambda t: (weights @ t[0], t[1]))
        gain = best - losses
        se = gain.std(ddof=1) / np.sqrt(len(gain)) if len(gain) > 1 else 0.0
        if weights @ gain <= max(min_gain, se):
            break
        chosen.append(f)
        left.remove(f)
        best = losses
        steps.append((f, float(weights @ losses)))
    m = _fit_lr(frame, chosen, k_max)
    return AcceptanceModel(m.features, m.coef, m.intercept, m.fill, k_max, tuple(steps))


def metrics(matched: Any, p: Any) -> dict[str, float]:
    """Held-out ``auc``, ``log_loss``, ``brier`` and ``n`` of probabilities ``p`` for 0/1 outcomes ``matched``."""
    y, p = np.asarray(matched, dtype=int), np.asarray(p, dtype=float)
    return {"auc": float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else np.nan,
            "log_loss": float(log_loss(y, np.clip(p, _EPS, 1 - _EPS), labels=[0, 1])),
            "brier": float(brier_score_loss(y, p)), "n": int(len(y))}


def compare_acceptance(fit: PolicyFit, train: OracleInputs, test: OracleInputs, n_bins: int = 10
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The confidence-only calibration and the acceptance model (the fit's, else fitted on ``train``) on ``test``:
    ``(scores, reliability)``, scores per model (``model``, ``features``, :func:`metrics`), reliability per model,
    ``position`` and bin of the prediction (``n_bins`` on [0, 1]): ``mean_predicted``, ``observed``, ``n``."""
    model = fit.acceptance or fit_acceptance(acceptance_frame(train, fit.k_max), fit.k_max)
    frame = acceptance_frame(test, fit.k_max)
    preds = {"confidence only (isotonic)": np.interp(frame["conf"], fit.calibration.x, fit.calibration.y),
             "acceptance model": predict(model, frame)}
    scores, rel = [], []
    for name, p in preds.items():
        scores.append({"model": name, "features": "conf" if name.startswith("conf") else " + ".join(model.features),
                       **metrics(frame["matched"], p)})
        b = pd.DataFrame({"position": frame["position"].astype(int), "bin": np.minimum((p * n_bins).astype(int),
                          n_bins - 1), "p": p, "y": frame["matched"].astype(float)})
        g = b.groupby(["position", "bin"]).agg(mean_predicted=("p", "mean"), observed=("y", "mean"), n=("y", "size"))
        rel.append(g.reset_index().assign(model=name))
    return pd.DataFrame(scores), pd.concat(rel, ignore_index=True)[["model", "position", "bin", "mean_predicted",
                                                                      "observed", "n"]]
