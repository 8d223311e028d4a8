"""What each table of the final-model section needs of a sweep: one dict, read by the fit
(:mod:`speclimits.stats.final`), its comparisons (:mod:`speclimits.stats.comparisons`) and the draft
model (:mod:`speclimits.stats.draft`), so that none of them imports another for it."""

from __future__ import annotations

#: What each table of the final-model section needs (a sweep's K > 0 rounds; in an EAGLE-style
#: sweep every round at K verifies m = K + 1 rows). The cost model itself (Eq. 4 per m present, the
#: draft line) needs only rounds at some m whose Ū varies. A table a trace cannot give is skipped
#: with this text (``FinalModelResults.skipped``); ``speclimits fit --help``, the README and the
#: methods page quote the same list (:data:`MINIMUM_SWEEP`).
REQUIREMENTS = {
    "per_k": "a per-K fit needs rounds at that K whose Ū and L vary",
    "per_k_cv": "per-K cross-validation needs >= 5 generations at that K (GroupKFold(5) by generation)",
    "cross_validation": "the cross-validated tables need >= 5 generations with K > 0 (GroupKFold(5) by generation)",
    "categorical_cv": ("the categorical model's cross-validation needs every m (or pooled group of m) in the "
                       "training rounds of each GroupKFold fold: >= 2 generations per m spread over the folds"),
    "pooled": "the pooled model with γ·K needs >= 2 values of K > 0",
    "comparison": ("the comparison of Ū + L, the pooled model and the categorical model needs >= 2 values of "
                   "K > 0 and >= 5 generations"),
    "mape_by_k": "MAPE by K needs the pooled model and the categorical cross-validation (>= 2 values of K > 0)",
    "leave_one_k_out": "leave-one-K-out needs >= 3 values of K > 0",
    "smooth:linear m (β0 and α linear in m)": "leave-one-K-out of the linear form in m needs >= 3 values of K > 0",
    "smooth:quadratic m": "leave-one-K-out of the quadratic form in m needs >= 4 values of K > 0",
    "smooth:log m": "leave-one-K-out of the log-m form needs >= 3 values of K > 0",
    "smooth:hinge": ("leave-one-K-out of the hinge after m = 4 needs rounds on both sides of the hinge in every "
                     "training set: >= 2 values of K <= 2 and >= 2 values of K >= 4 (e.g. K = 1..5)"),
    "boundary": ("the regime boundary needs >= 2 values of m among the K > 0 rounds and every m in the "
                 "training rounds of each fold (nested GroupKFold(5))"),
    "regimes": "the regime rows need per-K fits (and two regimes: values of K on both sides of the split)",
    "interpolation": "interpolation within a regime needs three consecutive values of K > 0 (m - 1, m, m + 1)",
    "ladder": "a specification-ladder row needs its columns to vary and >= 5 generations",
    "draft": "the draft line needs >= 2 values of K > 0 with non-zero draft times and >= 5 generations for its CV",
}
