"""Every value the book sets beside ours, in one place, each with where it comes from.

The preprint (arXiv 2609.22156) is available to us as its abstract and appendix only
(kept outside this repository). Values are quoted as the appendix states them: a number, a range
``(low, high)``, or a string where the paper gives only a bound; ``None`` means the appendix
reports nothing comparable. The comment above each constant names its appendix part. Numbers
that only third-party summaries attribute to the paper are kept apart, in
:data:`THIRD_PARTY`, and are never shown as the paper's own.
"""

from __future__ import annotations

from typing import Any

from speclimits.vocabulary import CODE_FORMAT, MODE_CHANGE, PROSE_VOCAB, SCRIPT_CHANGE

#: Table A2 (factor analysis, pooled over K = 1..10): standalone R² and the paired RMSE
#: reduction (ms) of ``Ū + factor`` against ``Ū`` alone, as mean ± 95% half-width.
FACTORS: dict[str, dict[str, Any]] = {
    "u_bar": {"r2": "strongest single factor", "drmse": None},
    "m": {"r2": "≈0.52", "drmse": "0.014 ± 0.003"},
    "context_len": {"r2": "weak alone", "drmse": "0.146 ± 0.008"},
    "kv_usage": {"r2": "≈ as L", "drmse": None},
    "graph_bucket": {"r2": None, "drmse": None},
    "e_max": {"r2": None, "drmse": None},
}

#: Standardized associations within K (H3): {K: (β*_Ū, β*_L)}; CI half-width ≤ 0.004.
STANDARDIZED_BY_K = {1: (0.20, 0.96), 10: (0.93, 0.31)}

#: Final model (Eq. 4), per-K fits.
ALPHA_SMALL = (0.078, 0.084)  # ms/expert, m <= 4
ALPHA_LARGE = (0.264, 0.268)  # ms/expert, m >= 5
BETA0_SMALL = (7.3, 10.5)  # ms, grows over m = 2..4
BETA0_LARGE_START = 4.7  # ms at m = 5
C_RANGE = (1.098e-3, 1.107e-3)  # ms/token across the per-K fits
BOUNDARY_M = 4  # last m of the small regime (split m = 4 / 5, chosen by eye)

#: The appendix's bandwidth estimate of α at m >= 5 (final model, choice of parameters): 48 layers of a
#: 9.4 MB expert, about 0.45 GB per unit of Ū, read at 2 TB/s (A100 80GB), gives about 0.23 ms.
BANDWIDTH_ESTIMATE = {"layers": 48, "expert_mb": 9.4, "gb_per_expert": 0.45, "tb_per_s": 2.0, "alpha_ms": 0.23}

#: Pooled linear model T = β0 + α Ū + c L + γ K: estimate (clustered SE).
POOLED = {"const": (5.971, 0.035), "u_bar": (0.2528, 0.0014), "context_len": (1.09e-3, 0.02e-3),
          "K": (-0.081, 0.004)}
POOLED_STD = {"K": -0.13, "u_bar": 0.99, "context_len": 0.26}
POOLED_R2 = (0.856, 0.861)  # Ū + L -> + γK
POOLED_DRMSE = "0.011 ± 0.003 ms (1.6%)"
CATEGORICAL_MAPE_RATIO = 12.0  # CV MAPE of Ū + L over that of the categorical form
POOLED_MAPE_BY_K = {1: 7.2, 3: 12.7}  # %; 0.6-4.1% at K >= 5
POOLED_MAPE_LARGE = (0.6, 4.1)

#: Leave-one-K-out (pooled form) and interpolation vs transfer.
LOKO_MEAN = 5.2
LOKO_PEAKS = {1: 12.7, 3: 15.1}
WITHIN_K_MAPE = (0.26, 0.59)
INTERP_WITHIN = (0.26, 0.65)
TRANSFER_ACROSS = (8.8, 15.5)

#: Specification ladder: CV MAPE (%) and R².
LADDER = {
    "Ū": ("5.6", "0.788"),
    "Ū + L": ("4.4", "0.856"),
    "+ linear m": ("≥ 4.3", None),
    "+ m·L": ("≥ 4.3", None),
    "+ m·Ū": ("≥ 4.3", None),
    "+ E_max": ("≥ 4.3", None),
    "categorical (Eq. 4)": ("0.37", "0.999"),
}

#: Draft model T_D = a K + b.
DRAFT = {"a": (0.459, 0.001), "b": (0.073, 0.003), "mean_dev_pct": 0.5, "cv_medape_pct": 0.8, "r2": 0.61,
         "tail_share_pct": 0.27, "zero_share_pct": 0.3}

#: Robustness on K = 8.
ROBUST_ALPHA = (0.2642, 0.2650)
ROBUST_C = (1.100e-3, 1.105e-3)
BP_P = 1e-28  # Breusch–Pagan p-value
CORR_U_L = 0.03  # corr(Ū, L), factor analysis


def fmt_range(r: tuple[float, float], scale: float = 1.0, digits: int = 3) -> str:
    return f"{r[0] * scale:.{digits}f}–{r[1] * scale:.{digits}f}"


# ---------------------------------------------------------------------------
# The Oracle's α = 0 ablation (appendix, "α = 0 ablation": the four cases C1–C4)
# ---------------------------------------------------------------------------

#: Boundaries k* -> k*+1 at which the appendix's four cases sit.
CASE_BOUNDARIES = ("4->5", "6->7", "7->8")
#: Range of the added token's match probability over the four cases.
CASE_MATCH_RANGE = (0.8418, 0.9845)

# ---------------------------------------------------------------------------
# Linguistic study (appendix, second part)
# ---------------------------------------------------------------------------

#: Share of k* >= 4 and of k* = 1, with 95% cluster-bootstrap CIs by response.
K_BY_CONTEXT: dict[str, dict[str, float]] = {
    CODE_FORMAT: {"share_long": 0.718, "long_lo": 0.614, "long_hi": 0.818, "n_decisions": 455, "n_responses": 22},
    PROSE_VOCAB: {"share_long": 0.193, "long_lo": 0.119, "long_hi": 0.276, "n_decisions": 4383,
                    "n_responses": 30},
    SCRIPT_CHANGE: {"share_long": 0.045, "long_lo": 0.010, "long_hi": 0.100, "n_decisions": 68, "n_responses": 8,
                      "share_k1": 0.937, "k1_lo": 0.867, "k1_hi": 0.990},
    MODE_CHANGE: {"share_long": 0.697},
}
#: New experts per layer at the event step and the step before; 95% interval of the difference.
ROUTING: dict[str, dict[str, float]] = {
    SCRIPT_CHANGE: {"before": 2.66, "at": 3.12, "diff": 0.46, "diff_lo": 0.26, "diff_hi": 0.66},
    "first_mismatch": {"before": 3.30, "at": 3.31, "diff": 0.01, "diff_lo": -0.05, "diff_hi": 0.07},
}
#: Ratio of the characteristic α levels between the regimes (appendix, final model).
ALPHA_LEVEL_RATIO = 3.2
#: "Other smooth parameterizations" of m: leave-one-K-out MAPE range (%), exploratory in the appendix.
SMOOTH_PARAMETERIZATIONS_MAPE = (6.5, 7.4)

# ---------------------------------------------------------------------------
# Not the paper's: third-party summaries, unverified (not the appendix)
# ---------------------------------------------------------------------------

#: Values summaries attribute to the paper's main text, which we do not have. Shown, if at all,
#: only with their label. The "≈2.34× Oracle plateau" of some summaries is MoE-SpeQ's
#: (arXiv 2511.14102), another paper: it is deliberately absent here.
THIRD_PARTY: dict[str, dict[str, Any]] = {
    "mean_accepted_plateau": {"value": 2.1, "label": "third-party, unverified",
                              "note": "mean accepted length saturates around 2.1 tokens"},
    "oracle_draft_len": {"value": 2.8, "label": "third-party, unverified",
                         "note": "the Oracle limits drafts to about 2.8 tokens"},
}
