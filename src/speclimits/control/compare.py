"""Section 6's comparison: policies fitted on a seeded half of the references (:mod:`.fit`), evaluated on the other
half (:mod:`.offline`) beside the Oracle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from speclimits.arms import OFFLINE_POLICY_NAMES, arm, policy_label, static_key
from speclimits.control.fit import fit_policy
from speclimits.control.offline import draw_accept_lengths, rollout, select, surrogate_evaluations
from speclimits.control.rules import PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle import OracleSetup, solve
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.report import ORACLE_POLICY


@dataclass(frozen=True)
class PolicyComparison:
    """Section 6's table: ``policy`` (label), ``name`` (key; empty for the Oracle), ``kind``, ``detail``,
    ``evaluation`` (exact / rollouts / replay), ``time_ms`` (expected, held-out), ``time_se`` (Monte Carlo),
    ``tokens_per_round``, ``speedup`` (vs autoregressive; NaN without m = 1), ``vs_best_static`` and
    ``gain_captured`` ((T_static - T) / (T_static - T_oracle), best static K in hindsight)."""

    table: pd.DataFrame
    fit: PolicyFit = field(repr=False)
    best_static_k_test: int
    best_static_k_train: int
    notes: list[str] = field(default_factory=list)


def compare_policies(setup: OracleSetup, fit: PolicyFit | None = None, names: Sequence[str] | None = None,
                     k_max: int | None = None, test_share: float = 0.5, seed: int = 0, n_rollouts: int = 64,
                     progress: bool = False) -> PolicyComparison:
    """Fit the policies on a seeded half of the references of ``setup`` (**one** reference kind), evaluate them
    on the other half under its surrogate. ``fit``: default :func:`~speclimits.control.fit.fit_policy` as
    section 8 fits (the same number in both sections). ``names``: default every static K and
    :data:`~speclimits.arms.OFFLINE_POLICY_NAMES`; the threshold is also evaluated by rollouts (a check of the
    rollout harness). ``n_rollouts``, ``seed``: the rollouts of the rules with memory (common random numbers)."""
    if fit is None:
        fit = fit_policy(setup, k_max=setup.inputs.k_list if k_max is None else int(k_max), test_share=test_share,
                         seed=seed)
    elif k_max is not None and int(k_max) != fit.k_max:
        raise SpeclimitsError(f"k_max = {k_max} disagrees with the given fit's K_max = {fit.k_max}")
    kk = fit.k_max
    names = [static_key(k) for k in range(1, kk + 1)] + list(OFFLINE_POLICY_NAMES) if names is None else list(names)
    _, test = select(setup, list(fit.test_seq_ids))
    _, train = select(setup, list(fit.train_seq_ids))
    det = setup.deterministic
    evals = surrogate_evaluations(fit, tqdm(names, desc="policies", disable=not progress), test, det, n_rollouts, seed)
    if "threshold" in names and not det:
        pol = fit.make("threshold").bind(test, CostTable.build(test, fit.cost_model, kk))
        evals["threshold (rollouts)"] = (rollout(pol, draw_accept_lengths(test, kk, n_rollouts, seed=seed)), "rollouts")
    oracle_test = solve(test, fit.cost_model, k_max=kk, deterministic=det)
    k_train = solve(train, fit.cost_model, k_max=kk, deterministic=det).bounds.best_static_k
    rows = []
    for name, (ev, how) in evals.items():
        key = name.removesuffix(" (rollouts)")
        detail = "best static K on the training sequences" if key == f"static:{k_train}" else fit.make(key).describe()
        rows.append(dict(policy=policy_label(key) + (" (rollouts)" if key != name else ""), name=key,
                         kind="static" if arm(key).kind == "static" else "online", detail=detail, evaluation=how,
                         time_ms=float(ev["time_ms"].sum()),
                         time_se=float(np.sqrt((ev["time_se"] ** 2).sum())) if how == "rollouts" else 0.0,
                         tokens_per_round=float(test.n_tokens.sum() / ev["rounds"].sum())))
    bd = oracle_test.bounds
    rows.append(dict(policy=ORACLE_POLICY, name="", kind="oracle",
                     detail=f"K_max = {kk}, knows match_prob and counterfactual Ū", evaluation="exact",
                     time_ms=bd.oracle_ms, time_se=0.0, tokens_per_round=bd.tokens_per_round))
    table = pd.DataFrame(rows)
    ar = bd.autoregressive_ms
    table["speedup"] = np.nan if ar is None else ar / table["time_ms"]
    table["vs_best_static"] = bd.best_static_ms / table["time_ms"]
    gap = bd.best_static_ms - bd.oracle_ms
    table["gain_captured"] = (bd.best_static_ms - table["time_ms"]) / gap if gap > 0 else np.nan
    notes = [] if ar is not None else [f"speedup vs autoregressive unavailable: {bd.autoregressive_note}"]
    return PolicyComparison(table=table, fit=fit, best_static_k_test=bd.best_static_k, best_static_k_train=k_train,
                            notes=notes)
