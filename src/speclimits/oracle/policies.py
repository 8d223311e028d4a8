"""Online policies against the Oracle bound: moved to :mod:`speclimits.control.policies`.

Kept as an import path because the Oracle's book section and tests import from here; the one
implementation (offline evaluation and the engine extension share it) lives in
:mod:`speclimits.control.policies`.
"""

from speclimits.control.policies import (ConfidenceThreshold, DeltaRule, EmaAcceptedLength, FixedActions, Policy,
                                         PolicyComparison, StaticK, UtilityTestAndSet, compare_policies,
                                         draw_accept_lengths, evaluate_exact, fit_calibration, mean_u_bar, rollout,
                                         split_sequences, tune_threshold)

__all__ = [
    "ConfidenceThreshold", "DeltaRule", "EmaAcceptedLength", "FixedActions", "Policy", "PolicyComparison", "StaticK",
    "UtilityTestAndSet", "compare_policies", "draw_accept_lengths", "evaluate_exact", "fit_calibration", "mean_u_bar",
    "rollout", "split_sequences", "tune_threshold",
]
