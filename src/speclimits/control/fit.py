"""Fitting the online policies from a trace: ``speclimits control fit TRACE --out policy.json``.

:func:`fit_policy` splits the trace's **greedy** references into train and test by ``seq_id`` and fits on the
train split only: the calibration, the acceptance model, the Ū predictor (:func:`mean_u_bar`), τ and λ (each
minimizing the replayed greedy time of the train references). The policy JSON records split, trace and numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from speclimits.control.acceptance import acceptance_frame, fit_acceptance
from speclimits.control.offline import evaluate_exact
from speclimits.control.rules import CalibrationMap, ConfidenceThreshold, DeltaRule, Policy, PolicyFit, StaticK
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.oracle import OracleSetup, prepare_oracle, solve
from speclimits.oracle.calibration import fit_isotonic, reached_steps
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.trace.sampling import Sampling, seq_prompt

#: τ grid of the fit
TAU_GRID = np.unique(np.concatenate([np.geomspace(1e-3, 0.98, 36), [0.0, 1.0]]))
#: λ grid of the fit, as multiples of the train Oracle's time per token
LAMBDA_GRID = np.geomspace(0.25, 4.0, 17)


def greedy_setup(trace: Any, cost_model: CostModel | str | Path | None = None) -> OracleSetup:
    """:func:`speclimits.oracle.prepare_oracle` restricted to the target's own continuations: the greedy
    references, or in a sampled trace the sampled ones (:attr:`OracleSetup.headline_kind`)."""
    setup = prepare_oracle(trace, cost_model)
    return setup.for_kind(setup.headline_kind)


def tune(rule: Callable[[float], Policy], grid: Any, train: OracleInputs, table: CostTable, column: str
         ) -> tuple[float, pd.DataFrame]:
    """The value of ``grid`` whose ``rule(value)`` takes the least replayed greedy time on the train references,
    and the curve (``column``, ``train_time_ms``)."""
    times = [float(evaluate_exact(rule(x).bind(train, table), deterministic=True)["time_ms"].sum()) for x in grid]
    curve = pd.DataFrame({column: [float(x) for x in grid], "train_time_ms": times})
    return float(curve.loc[curve["train_time_ms"].idxmin(), column]), curve


def fit_policy(source: Any, k_max: int = 10, test_share: float = 0.5, seed: int = 0,
               cost_model: CostModel | str | Path | None = None) -> PolicyFit:
    """Fit τ, λ (tuned with the calibration, as the engine runs), the calibration, the acceptance model and the
    Ū predictor on a seeded train split of ``source``: a trace, or an :class:`~speclimits.oracle.OracleSetup` of
    one reference kind."""
    if isinstance(source, OracleSetup):
        if cost_model is not None:
            raise SpeclimitsError("fit_policy: an OracleSetup brings its own cost model; do not pass cost_model too")
        if len(source.kind_counts()) != 1:
            raise SpeclimitsError(f"fit_policy: the setup holds several reference kinds {source.kind_counts()}; "
                                  "fit one at a time (OracleSetup.for_kind)")
        setup = source
    else:
        setup = greedy_setup(source, cost_model)
    kind = next(iter(setup.kind_counts()))
    raw, model = setup.raw_inputs, setup.model
    if not 1 <= k_max <= raw.k_list:
        raise SpeclimitsError(f"--k-max must be in 1..{raw.k_list} (the trace's Oracle lists), got {k_max}")
    train_idx, test_idx = split_sequences(raw, test_share, seed)
    train = raw.subset(train_idx)
    table = CostTable.build(train, model, k_max)
    lambda_oracle = solve(setup.inputs.subset(train_idx), model, k_max=k_max,
                          deterministic=setup.deterministic).ms_per_token
    rounds = setup.trace.rounds
    train_ids = [str(s) for s in train.seq_ids]
    u_mean = mean_u_bar(train, k_max, rounds[rounds["prompt_id"].astype(str).isin(train_ids)])
    calib = CalibrationMap.from_isotonic(fit_calibration(train, k_max))
    acceptance = fit_acceptance(acceptance_frame(train, k_max), k_max)
    tau, tau_curve = tune(ConfidenceThreshold, TAU_GRID, train, table, "tau")
    lam, lam_curve = tune(lambda lam: DeltaRule(lam, u_mean, calib, running_lambda=False), lambda_oracle * LAMBDA_GRID,
                          train, table, "lambda")
    tpr = static_tokens_per_round(train, table, k_max)
    best_static_per_token = float(np.nanmin(model.mean_round_prices(k_max, u_mean)[1:] / tpr))
    meta = setup.trace.meta
    sampling = Sampling.from_meta(meta)
    data = {"trace": str(setup.trace.path), "simulated": bool(setup.trace.simulated),
            "trace_created": meta.get("created"), "method": meta.get("method"), "models": meta.get("models"),
            "reference_kind": kind, "surrogate_for_lambda": setup.surrogate_label, "seed": seed,
            # the requests' sampling: a set of fits picks one per request by it (:mod:`speclimits.control.policyset`)
            "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p if not sampling.greedy else 1.0},
            "test_share": test_share, "train_states": int(train.n_states), "notes": list(setup.notes),
            "fitted_on": "train split only: calibration and acceptance model (reached draft steps), Ū per m (train "
                         "prompts' decode rounds), τ and λ (replayed greedy outcomes, priced by the cost model)"}
    return PolicyFit(k_max=int(k_max), tau=tau, lambda_=lam, lambda_oracle=float(lambda_oracle),
                     u_bar_mean=tuple(float(v) for v in u_mean), calibration=calib, cost_model=model,
                     train_seq_ids=tuple(train_ids), test_seq_ids=tuple(str(s) for s in raw.seq_ids[test_idx]),
                     data=data, curves={"tau": tau_curve, "lambda": lam_curve},
                     tokens_per_round=tuple(float(v) for v in tpr), lambda_ratio=lam / best_static_per_token,
                     acceptance=acceptance)


def static_tokens_per_round(inputs: OracleInputs, table: CostTable, k_max: int) -> np.ndarray:
    """(k_max,) tokens per round of static K = 1..k_max on the replayed greedy outcomes of ``inputs``."""
    out = []
    for k in range(1, k_max + 1):
        ev = evaluate_exact(StaticK(k).bind(inputs, table), deterministic=True)
        out.append(float(inputs.n_tokens.sum() / ev["rounds"].sum()))
    return np.array(out)


def split_sequences(inputs: OracleInputs, test_share: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of sequence indices into (train, test) by prompt, both non-empty (a sampled trace's references
    of one prompt, :func:`~speclimits.trace.sampling.seq_prompt`, fall on one side together)."""
    prompts, of_seq = np.unique([seq_prompt(s) for s in inputs.seq_ids], return_inverse=True)
    if prompts.size < 2:
        raise SpeclimitsError("a train/test split needs references of at least 2 prompts")
    if prompts.size == inputs.n_sequences:  # one reference per prompt: by sequence, in the order they come
        of_seq = np.arange(inputs.n_sequences)
    perm = np.random.default_rng(seed).permutation(prompts.size)
    n_test = int(np.clip(round(test_share * prompts.size), 1, prompts.size - 1))
    test = np.isin(of_seq, perm[:n_test])
    return np.flatnonzero(~test), np.flatnonzero(test)


def fit_calibration(inputs: OracleInputs, k_max: int) -> IsotonicRegression:
    """Monotone map draft confidence -> P(step matches | chain matched so far), on the steps each state's round
    tested (:func:`~speclimits.oracle.calibration.reached_steps`)."""
    reached, matched = reached_steps(inputs, k_max)
    return fit_isotonic(inputs.draft_conf[:, :k_max][reached], matched[reached])


def mean_u_bar(inputs: OracleInputs, k_max: int, rounds: pd.DataFrame | None = None) -> np.ndarray:
    """(k_max + 2,) mean Ū per m (index 0 = index 1): from the trace's decode rounds where they have that m (what
    the engine measured), else from the Oracle rows' windows."""
    out = np.full(k_max + 2, np.nan)
    out[1:] = inputs.u_bar_window[:, : k_max + 1].mean(axis=0)
    if rounds is not None and len(rounds):
        dec = rounds[(rounds["phase"].astype(str) == "decode") & np.isfinite(rounds["u_bar"])]
        for m, v in dec.groupby("m")["u_bar"].mean().items():
            if 1 <= int(m) <= k_max + 1:
                out[int(m)] = float(v)
    out[0] = out[1]
    return out
