"""Cost-model statistics: factor analysis, the final target model (Eq. 4), the draft model, robustness
checks, and the cost-model fit the Oracle reads; OLS on decode rounds with SEs clustered by generation,
GroupKFold(5) by generation out of sample. Results carry ``to_dict()`` (``--json``) and ``summary()`` (text).
"""

from speclimits.stats._ols import (CellMoments, ClusterSums, CVResult, Design, OLSResults, cluster_bootstrap,
                                   cross_validate, fit_ols, group_folds, t_interval)
from speclimits.stats.boundary import BoundaryResults, detect_boundary
from speclimits.stats.draft import DraftResults, fit_draft_model
from speclimits.stats.factors import FactorResults, analyze_factors
from speclimits.stats.costfit import JointResults, fit_cost_model, fit_joint, fit_trace_cost_model
from speclimits.stats.final import FinalModelResults, fit_final_model
from speclimits.stats.robustness import RobustnessResults, robustness_checks

__all__ = [
    "BoundaryResults", "CVResult", "CellMoments", "ClusterSums", "Design", "DraftResults", "FactorResults", "FinalModelResults",
    "JointResults", "OLSResults", "RobustnessResults", "analyze_factors", "cluster_bootstrap",
    "cross_validate", "detect_boundary", "fit_cost_model", "fit_draft_model", "fit_final_model",
    "fit_joint", "fit_ols", "fit_trace_cost_model", "group_folds", "robustness_checks", "t_interval",
]
