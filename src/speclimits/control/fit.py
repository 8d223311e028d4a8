"""Fitting the online policies from a trace, and predicting them offline on held-out references.

``speclimits control fit TRACE --out policy.json`` (:func:`fit_policy`) splits the trace's
**greedy** references (the target's own output, as in the paper) into train and test by
``seq_id`` and fits, on the train split only:

* the confidence calibration map: isotonic regression of the observed greedy match on the draft's
  top-1 probability over the draft steps the recorded rounds tested
  (:func:`~speclimits.control.policies.fit_calibration`, via
  :func:`speclimits.oracle.calibration.fit_isotonic`), stored as its thresholds;
* the Ū predictor: mean Ū per verified-row count m over the train prompts' measured decode rounds
  (:func:`~speclimits.control.policies.mean_u_bar`);
* τ of the confidence threshold and λ of the Delta rule: each minimizing the time of the replayed
  real greedy outcomes (``accept_len``) on the train references, priced by the cost model.

The JSON records the split (train/test ``seq_id``), the trace and its meta, the cost model, K_max
and the fitted numbers; :class:`PolicyFit` reads it back and builds the policy objects that both the
offline evaluation (:func:`offline_table`) and the engine extension run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.control.policies import (ConfidenceThreshold, DeltaRule, EmaAcceptedLength, Policy, StaticK,
                                         UtilityTestAndSet, evaluate_exact, fit_calibration, mean_u_bar, RandomK,
                                         split_sequences, tune_threshold)
from speclimits.costmodel import CostModel
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps, read_json
from speclimits.oracle import OracleSetup, prepare_oracle, solve
from speclimits.oracle.inputs import CostTable, OracleInputs

FORMAT = "speclimits-policy/1"
#: Policy names :meth:`PolicyFit.make` understands, besides ``static:K``.
POLICY_NAMES = ("threshold", "delta", "delta-fixed", "ema", "cascade")
#: λ grid of the fit, as multiples of the train Oracle's time per token.
LAMBDA_GRID = np.geomspace(0.25, 4.0, 17)


@dataclass(frozen=True)
class CalibrationMap:
    """A monotone map confidence -> match probability, linear between thresholds, clipped at the ends
    (what a fitted scikit-learn ``IsotonicRegression`` with ``out_of_bounds="clip"`` predicts).

    x, y : (t,) thresholds, x increasing.
    """

    x: tuple[float, ...]
    y: tuple[float, ...]

    @classmethod
    def from_isotonic(cls, iso: Any) -> "CalibrationMap":
        return cls(tuple(float(v) for v in iso.X_thresholds_), tuple(float(v) for v in iso.y_thresholds_))

    def predict(self, conf: Any) -> np.ndarray:
        return np.interp(np.asarray(conf, dtype=float), self.x, self.y)


@dataclass(frozen=True)
class PolicyFit:
    """Fitted policy parameters (the JSON the engine loads). See the module docstring.

    Attributes
    ----------
    k_max : K_max (the engine's ``num_speculative_tokens``).
    tau : confidence threshold τ. lambda_ : Delta rule λ (ms per token); lambda_oracle : the train
        Oracle's time per token it was scaled from.
    u_bar_mean : (k_max + 2,) mean Ū per m (index m; index 0 = index 1).
    calibration : the confidence calibration map.
    cost_model : the cost model the policies price rounds with.
    train_seq_ids, test_seq_ids : the split by reference.
    data : where the fit came from (trace path, meta, surrogate, counts).
    curves : the train-time curves over τ and λ (lists of records).
    """

    k_max: int
    tau: float
    lambda_: float
    lambda_oracle: float
    u_bar_mean: tuple[float, ...]
    calibration: CalibrationMap
    cost_model: CostModel
    train_seq_ids: tuple[str, ...]
    test_seq_ids: tuple[str, ...]
    data: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Any] = field(default_factory=dict)
    prior_tokens: float = 32.0

    # -- policies ---------------------------------------------------------------------------
    def make(self, name: str) -> Policy:
        """The policy called ``name``: ``static:K``, or one of :data:`POLICY_NAMES`; already
        :meth:`~speclimits.control.policies.Policy.setup` with K_max and the cost model."""
        u = np.asarray(self.u_bar_mean)
        if name.startswith("static:"):
            try:
                pol: Policy = StaticK(int(name.split(":", 1)[1]))
            except ValueError:
                raise SpeclimitsError(f"policy {name!r}: expected static:K with an integer K") from None
        elif name == "threshold":
            pol = ConfidenceThreshold(self.tau)
        elif name == "delta":
            pol = DeltaRule(self.lambda_, u, self.calibration, "mean", running_lambda=True,
                            prior_tokens=self.prior_tokens, name="Delta rule, running λ")
        elif name == "delta-fixed":
            pol = DeltaRule(self.lambda_, u, self.calibration, "mean", running_lambda=False, name="Delta rule, fixed λ")
        elif name == "ema":
            pol = EmaAcceptedLength()
        elif name == "cascade":
            pol = UtilityTestAndSet()
        elif name.startswith("random"):
            pol = RandomK(int(name.split(":", 1)[1]) if ":" in name else 0)
        else:
            raise SpeclimitsError(f"unknown policy {name!r}; known: static:K, random:SEED, {', '.join(POLICY_NAMES)}")
        return pol.setup(self.k_max, self.cost_model)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "k_max": self.k_max, "tau": self.tau, "lambda": self.lambda_,
            "lambda_oracle": self.lambda_oracle, "prior_tokens": self.prior_tokens,
            "u_bar_mean": list(self.u_bar_mean),
            "calibration": {"x": list(self.calibration.x), "y": list(self.calibration.y)},
            "cost_model": self.cost_model.to_dict(),
            "split": {"train": list(self.train_seq_ids), "test": list(self.test_seq_ids)},
            "data": self.data, "curves": self.curves,
        }

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "policy JSON") -> "PolicyFit":
        if d.get("format") != FORMAT:
            raise SpeclimitsError(f"{origin}: 'format' must be {FORMAT!r}, got {d.get('format')!r}")
        try:
            return cls(k_max=int(d["k_max"]), tau=float(d["tau"]), lambda_=float(d["lambda"]),
                       lambda_oracle=float(d["lambda_oracle"]), u_bar_mean=tuple(float(v) for v in d["u_bar_mean"]),
                       calibration=CalibrationMap(tuple(d["calibration"]["x"]), tuple(d["calibration"]["y"])),
                       cost_model=CostModel.from_dict(d["cost_model"], origin=f"{origin}: cost_model"),
                       train_seq_ids=tuple(d["split"]["train"]), test_seq_ids=tuple(d["split"]["test"]),
                       data=dict(d.get("data", {})), curves=dict(d.get("curves", {})),
                       prior_tokens=float(d.get("prior_tokens", 32.0)))
        except KeyError as exc:
            raise SpeclimitsError(f"{origin}: missing field {exc}") from None
        except (TypeError, ValueError) as exc:
            raise SpeclimitsError(f"{origin}: bad value ({exc})") from None

    @classmethod
    def read(cls, path: str | Path) -> "PolicyFit":
        d = read_json(path, "policy file", SpeclimitsError,
                      missing_hint=f"write one with `speclimits control fit TRACE --out {path}`")
        return cls.from_dict(d, origin=f"policy file {Path(path)}")


# ---------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------


def greedy_setup(trace: Any, cost_model: CostModel | str | Path | None = None) -> OracleSetup:
    """:func:`speclimits.oracle.prepare_oracle` restricted to the greedy references."""
    return prepare_oracle(trace, cost_model).for_kind("greedy")


def tune_lambda(train: OracleInputs, table: CostTable, fit_args: dict[str, Any], lambda_oracle: float
                ) -> tuple[float, pd.DataFrame]:
    """λ (fixed-λ Delta rule) minimizing the replayed greedy time on the train references."""
    rows = []
    for mult in LAMBDA_GRID:
        pol = DeltaRule(lambda_oracle * mult, running_lambda=False, **fit_args).bind(train, table)
        rows.append((float(lambda_oracle * mult), float(evaluate_exact(pol, deterministic=True)["time_ms"].sum())))
    curve = pd.DataFrame(rows, columns=["lambda", "train_time_ms"])
    return float(curve.loc[curve["train_time_ms"].idxmin(), "lambda"]), curve


def fit_policy(trace: Any, k_max: int = 10, test_share: float = 0.5, seed: int = 0,
               cost_model: CostModel | str | Path | None = None) -> PolicyFit:
    """Fit τ, λ, the calibration map and the Ū predictor on a seeded train split of the greedy references."""
    setup = greedy_setup(trace, cost_model)
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
    tau, tau_curve = tune_threshold(train, table, deterministic=True)
    lam, lam_curve = tune_lambda(train, table, {"u_bar_mean": u_mean, "calibration": calib}, lambda_oracle)
    meta = setup.trace.meta
    data = {"trace": str(setup.trace.path), "simulated": bool(setup.trace.simulated),
            "trace_created": meta.get("created"), "method": meta.get("method"), "models": meta.get("models"),
            "reference_kind": "greedy", "surrogate_for_lambda": setup.surrogate_label, "seed": seed,
            "test_share": test_share, "train_states": int(train.n_states), "notes": list(setup.notes),
            "fitted_on": "train split only: calibration (reached draft steps), Ū per m (train prompts' decode "
                         "rounds), τ and λ (replayed greedy outcomes, priced by the cost model)"}
    return PolicyFit(k_max=int(k_max), tau=tau, lambda_=lam, lambda_oracle=float(lambda_oracle),
                     u_bar_mean=tuple(float(v) for v in u_mean), calibration=calib, cost_model=model,
                     train_seq_ids=tuple(train_ids), test_seq_ids=tuple(str(s) for s in raw.seq_ids[test_idx]),
                     data=data, curves={"tau": tau_curve, "lambda": lam_curve})
